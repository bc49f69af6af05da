//! The CPU kernels, below the math of `src/math/`: hot-loop building blocks written once over
//! the 8-lane [`Simd`](portable::numerics::Simd) trait (`portable/`: the trait, its portable
//! build, the exp, the lane order of sums), that trait on x86 (`x86/`: AVX2, and the AVX-512
//! kernels built with Rust >= 1.89) and on AArch64 (`arm/`: NEON), and what the window pass
//! computes per KV group (`colstats`). Nothing here imports the math above it; the crate root
//! re-exports each module under its old name (`crate::numerics`, `crate::lanes`, …).

#[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
pub(crate) mod arm;
pub(crate) mod colstats;
pub(crate) mod portable;
#[cfg(all(feature = "std", target_arch = "x86_64"))]
pub(crate) mod x86;
