//! AArch64: the 8-lane [`Simd`](crate::numerics::Simd) trait on NEON (`neon`).

pub(crate) mod neon;
