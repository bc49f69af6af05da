//! What the window pass (`math/window.rs`) computes for one KV group: which column
//! statistics a scorer needs ([`Needs`]) and where they go ([`Stats`]). Among the kernels, so
//! that the window pass and its AVX-512 part (`softmax512`) both take them from below,
//! without importing each other.

/// Which statistics a scorer needs.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Needs {
    pub sum: bool,
    pub sq: bool,
    pub cross: bool,
}

/// Per-group outputs, each `[rows][P]` row-major; `cross` rows are pairs `a < b` in order.
pub(crate) struct Stats<'s> {
    pub sum: &'s mut [f32],
    pub sq: &'s mut [f32],
    pub cross: &'s mut [f32],
}
