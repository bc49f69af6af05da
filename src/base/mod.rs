//! The nouns every layer shares: the configuration (`config`: scorers, presets, pooling,
//! selection), the one status table (`error`), element types and strided views checked at
//! construction (`dtype`, `view`), byte ranges for the aliasing rule (`span`), the one
//! workspace carver (`workspace`) and the one check of a model's dimensions (`shape`).
//! No math; the crate root re-exports each module under its own name (`kvevict::view`, …).

pub mod config;
pub mod dtype;
pub mod error;
pub mod shape;
pub(crate) mod span;
pub mod view;
pub mod workspace;
