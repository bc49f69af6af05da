//! The kernels below the math: the CPU's (`cpu/`). The device's are CUDA sources in `cuda/`,
//! launched from `src/cuda.rs` and `src/device/`.

pub(crate) mod cpu;
