#![cfg(feature = "cuda")]
//! The CUDA launchers layer (`cuda/kvevict_cuda.h`, `kvevict::cuda`): one conformance suite,
//! one module per kernel family (cuda/<family>.cu). The same cases run on the kernels
//! (feature `cuda`: on a GPU, or on the CPU emulator with `cuda-emu`; without a device each
//! test prints "skipped: no CUDA device" and passes). Each launcher is checked against one
//! f64 reference (tests/reference, or a few lines built from its primitives) within the
//! kernels' tolerance. Outputs start poisoned (NaN) or
//! canary-filled, so an element not written shows; refused arguments return 1 and leave
//! every output as it was. Each launcher's edges (ties, NaN, empty and in-place calls,
//! refusals) are here too. The C API's device entry points (`kve_cuda_*` of
//! include/kvevict.h) are tests/capi_cuda/'s.
//!
//! Helpers (device buffers, data, dtypes, layouts, tolerances): `tests/conformance`.
//! Seeds: `KVEVICT_TEST_SEED` (default 1). One test binary (modules, not targets: one link).
#![allow(clippy::needless_range_loop)]

#[path = "../reference/mod.rs"]
mod reference;
#[macro_use]
#[path = "../conformance/mod.rs"]
mod conformance;

use conformance::*;
use half::{bf16, f16};
use kvevict::cuda::*;
use kvevict::Pool;
use std::ffi::c_void;
use std::ptr::{null, null_mut};

mod baselines;
mod budgets;
mod combine;
mod compact;
mod evictor;
mod graphs;
mod lava;
mod pipelines;
mod pool;
mod refusals;
mod select;
mod shard;
mod stats;
mod stream;
mod uniqueness;
mod vonorm;
mod window;
