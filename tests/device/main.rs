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

#[path = "../paged_common/mod.rs"]
mod paged_common;

use conformance::*;
use half::{bf16, f16};
use kvevict::cuda::*;
use kvevict::Pool;
use std::ffi::c_void;
use std::ptr::{null, null_mut};

/// A device workspace for `kvevict::device::score_layer` of `cfg` on `[hq, hkv, n, dk, dv]`
/// (its length the size asked for, in bytes).
fn score_workspace(cfg: &kvevict::ScoreConfig, [hq, hkv, n, dk, dv]: [usize; 5]) -> DBuf<u8> {
    let shape =
        kvevict::LayerShape::from_dims(hq as u64, hkv as u64, n as u64, dk as u64, dv as u64)
            .expect("shape");
    let wsb = kvevict::device::score_workspace_size(cfg, &shape).expect("workspace");
    DBuf::new(wsb)
}

/// `kvevict::device::score_layer` of `cfg` over `inputs` on `stream`, into all of `out`
/// with all of the workspace `ws`.
///
/// # Safety
/// `inputs` describe device memory of their declared extents.
unsafe fn score_layer_into(
    cfg: &kvevict::ScoreConfig,
    inputs: &kvevict::device::score::LayerInputs,
    out: &DBuf<f32>,
    ws: &DBuf<u8>,
    stream: *mut c_void,
) -> kvevict::Result<()> {
    let (o, w) = (out.len() as u64, ws.len() as u64);
    // SAFETY: `out` and `ws` are device buffers of the lengths passed; `inputs` per the
    // contract.
    unsafe { kvevict::device::score_layer(cfg, inputs, out.ptr(), o, ws.vptr(), w, stream) }
}

/// `kve_cuda_window` of `q` over `k` (window `w`) asking for no output, without a workspace,
/// on the default stream: its status (the arguments' check alone).
///
/// # Safety
/// The descriptors' data is device memory of their extents, or refused before any access.
unsafe fn window_without_outputs(q: &KveCudaView, k: &KveCudaView, w: i64) -> i32 {
    let none = null_mut::<f32>();
    // SAFETY: no output is asked for: nothing is written, nor read but the descriptors'
    // data (the caller's contract).
    unsafe {
        kve_cuda_window(
            q,
            k,
            w,
            none,
            none,
            none,
            none,
            0,
            null(),
            null_mut(),
            0,
            null_mut(),
        )
    }
}

/// A layer's device tensors with its Gram (device floats), nothing cached.
fn gram_inputs(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    gram: &DBuf<f32>,
) -> kvevict::device::score::LayerInputs {
    kvevict::device::score::LayerInputs {
        queries: Some(q.device()),
        keys: Some(k.device()),
        values: Some(v.device()),
        gram: kvevict::device::Floats {
            ptr: gram.ptr(),
            len: gram.len() as u64,
        },
        value_forms: kvevict::device::Floats::NONE,
        value_l1: kvevict::device::Floats::NONE,
        row_lse: kvevict::device::Floats::NONE,
    }
}

/// `kve_cuda_select` of one row a group, no layer sums, over the device scores `sd` (`rows`
/// rows of `n`, row stride `ld`): `k[r]` (device) or `k_all` of each row. The kept counts and
/// lists (row stride `n`), on the device.
fn select_rows(
    sd: &DBuf<f32>,
    (ld, n, rows): (usize, usize, usize),
    k: Option<&DBuf<i64>>,
    k_all: usize,
    what: &str,
) -> (DBuf<i32>, DBuf<i32>) {
    // SAFETY: a pure host function.
    let wsb = unsafe { kve_cuda_select_workspace_size(rows as i64) };
    let ws = DBuf::<u8>::new(wsb);
    let (counts, idx) = lists_of(rows, n, -1);
    ck(
        // SAFETY: device buffers of the declared sizes.
        unsafe {
            kve_cuda_select(
                sd.ptr(),
                ld as i64,
                n as i64,
                rows as i64,
                1,
                k.map_or(null(), |b| b.ptr()),
                k_all as i64,
                null(),
                1,
                counts.ptr(),
                idx.ptr(),
                n as i64,
                ws.vptr(),
                wsb,
                null_mut(),
            )
        },
        what,
    );
    (counts, idx)
}

mod baselines;
mod budgets;
mod combine;
mod compact;
mod evictor;
mod graphs;
mod lava;
mod paged;
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
