//! x86_64: the 8-lane [`Simd`](crate::numerics::Simd) trait on AVX2 + FMA + F16C (`avx2`), and,
//! built with Rust >= 1.89 (`kvevict_avx512`), the AVX-512 kernels: 16-lane vector operations
//! (`simd512`), the window pass's Q·Kᵀ (`gemm512`) and softmax passes (`softmax512`), squares
//! and logits in the lane order on 16 lanes (`lanes512`, `tova512`).

pub(crate) mod avx2;
#[cfg(kvevict_avx512)]
pub(crate) mod gemm512;
#[cfg(kvevict_avx512)]
pub(crate) mod lanes512;
#[cfg(kvevict_avx512)]
pub(crate) mod simd512;
#[cfg(kvevict_avx512)]
pub(crate) mod softmax512;
#[cfg(kvevict_avx512)]
pub(crate) mod tova512;
