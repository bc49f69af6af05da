//! Errors of the core. The C layer maps each to a stable status code.

/// Why a call was rejected. Nothing was written to caller buffers when one is returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// A required pointer or slice was null / missing.
    NullPointer,
    /// A size, count or parameter is out of its documented range.
    InvalidArgument,
    /// A size computation overflowed (`usize`, or the 2^31 token limit).
    Overflow,
    /// A view's strides and extents reach past the buffer it declares.
    OutOfBounds,
    /// A pointer is not aligned for its dtype.
    Misaligned,
    /// An unknown dtype, scorer, pool, allocator, ... value.
    BadEnum,
    /// NaN or infinity in an input (or a score it produced).
    NonFinite,
    /// An output buffer is smaller than its size query says.
    OutputTooSmall,
    /// The workspace is smaller than its size query says.
    WorkspaceTooSmall,
    /// Two buffers that must be distinct overlap.
    Aliasing,
    /// Shapes of the inputs disagree with each other.
    ShapeMismatch,
    /// A CUDA launcher refused its arguments or failed to launch (device paths only).
    Cuda,
}

impl Error {
    /// A short, stable description.
    pub const fn message(self) -> &'static str {
        match self {
            Error::NullPointer => "a required pointer is null",
            Error::InvalidArgument => "an argument is out of its valid range",
            Error::Overflow => "a size computation overflows",
            Error::OutOfBounds => "a view reaches past the end of its buffer",
            Error::Misaligned => "a pointer is misaligned for its dtype",
            Error::BadEnum => "an enumeration value is unknown",
            Error::NonFinite => "NaN or infinity in an input or a result",
            Error::OutputTooSmall => "an output buffer is too small",
            Error::WorkspaceTooSmall => "the workspace is too small",
            Error::Aliasing => "input and output buffers overlap",
            Error::ShapeMismatch => "input shapes disagree",
            Error::Cuda => "a CUDA call failed (see cudaGetLastError)",
        }
    }
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.message())
    }
}

#[cfg(feature = "std")]
impl std::error::Error for Error {}

pub type Result<T> = core::result::Result<T, Error>;

/// Largest token count the library accepts (positions are stored as u32, ties use 31 bits).
pub const MAX_TOKENS: usize = 1 << 31;

/// Most (layer, KV head) units a model may have: unit indices stay below 2^31 and their
/// offsets (`units + 1` entries) are addressable.
pub const MAX_UNITS: usize = 1 << 31;

/// Most layers a model may have (size queries loop over layers; real models have < 1000).
pub const MAX_LAYERS: usize = 1 << 20;

#[inline]
pub(crate) fn mul(a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b).ok_or(Error::Overflow)
}
#[inline]
pub(crate) fn add(a: usize, b: usize) -> Result<usize> {
    a.checked_add(b).ok_or(Error::Overflow)
}
