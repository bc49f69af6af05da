//! CUDA entry points of the C API. Always declared; a library built without feature
//! `cuda` answers `KVE_ERR_NOT_BUILT_WITH_CUDA` from each (before any other check).
//!
//! With feature `cuda` they validate the host-side descriptors exactly like the host
//! functions (null, dtype, alignment, extents/strides against `len`, sizes) and enqueue
//! the launchers of `cuda/kvevict_cuda.h` (`crate::cuda`) on the caller's stream through
//! the device pipeline (`crate::device`); this file only converts arguments. Every
//! pointer inside a descriptor and every buffer argument is a DEVICE pointer; the
//! descriptor structs themselves are host memory. Nothing synchronises; errors from
//! kernels surface on the stream (`cudaGetLastError` / the next sync). A launcher that
//! rejects its arguments or fails to launch gives `KVE_ERR_CUDA`.
//!
//! The launchers' own names are `kve_cuda_<stage>` (an internal interface); these are
//! the public, stable ones with status codes and `kve_tensor` descriptors.

#![cfg_attr(not(feature = "cuda"), allow(unused_variables))]

use super::kve_tensor;
use super::params::kve_select_params;
use super::score::kve_layer_inputs;
use super::select::kve_model_scores;
use core::ffi::c_void;

/// The body of a `kve_cuda_*` entry point: `$body` with feature `cuda` (or `cuda-emu`);
/// without, `KVE_ERR_NOT_BUILT_WITH_CUDA` (the arguments unused: this module and its
/// children allow `unused_variables` in that build).
macro_rules! cuda_only {
    ($body:block) => {{
        #[cfg(feature = "cuda")]
        $body
        #[cfg(not(feature = "cuda"))]
        {
            $crate::capi::KVE_ERR_NOT_BUILT_WITH_CUDA
        }
    }};
}

#[cfg(feature = "cuda")]
use {
    super::params::{read_ext, score_config, select_config},
    super::score::{KVE_LAYER_INPUTS_V1_SIZE, NO_INPUTS},
    super::{arg, to_status, tri},
    crate::device::{self, Floats},
    crate::error::Error,
    crate::score::LayerShape,
    crate::shape::ModelShape,
    imp::{tensor, write},
};

/// Number of CUDA devices the library can use; 0 (and `KVE_OK`) when there is no device
/// or driver. A library built without CUDA writes `*count = 0` (when `count` is non-NULL
/// and aligned) and returns `KVE_ERR_NOT_BUILT_WITH_CUDA`: the one status that comes
/// with an output, so that a caller that only reads the count sees no device. Writes only
/// `*count`.
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_get_device_count(count: *mut i32) -> i32 {
    #[cfg(feature = "cuda")]
    {
        // SAFETY: `count` is NULL or the caller's host `int32_t`; device_count checks it.
        unsafe { imp::device_count(count) }
    }
    #[cfg(not(feature = "cuda"))]
    {
        if let Ok(mut out) = super::out_param(count) {
            // SAFETY: out_param checked non-NULL and aligned; one element.
            unsafe { out.slice_mut()[0] = 0 };
        }
        super::KVE_ERR_NOT_BUILT_WITH_CUDA
    }
}

/// Device workspace bytes of `kve_cuda_score_layer` (shape as in
/// `kve_score_workspace_size`; enough for LaProx with the Gram, whatever the dtype).
/// Writes only `*out_bytes` (host memory).
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_score_workspace_size(
    params: *const super::params::kve_score_params,
    hq: u64,
    hkv: u64,
    n: u64,
    dk: u64,
    dv: u64,
    out_bytes: *mut u64,
) -> i32 {
    cuda_only!({
        // SAFETY: `params` is NULL or the caller's struct of `struct_size` bytes (checked).
        let bytes = unsafe { score_config(params) }.and_then(|cfg| {
            let shape = LayerShape::from_dims(hq, hkv, n, dk, dv)?;
            device::score_workspace_size(&cfg, &shape)
        });
        // SAFETY: a host out-parameter, checked before it is written.
        unsafe { write(out_bytes, bytes.map(|b| b as u64)) }
    })
}

/// `kve_score_layer` on the device, enqueued on `stream` (a `cudaStream_t`, NULL = the
/// legacy default stream): every scorer, pooling, GQA mode and placement of the host
/// path, f32/f16/bf16 in any strided layout — one dtype for the queries, keys and values
/// (the host path mixes them; here another is `KVE_ERR_SHAPE_MISMATCH`). Tensors of `inputs` and its `gram`,
/// `value_forms`, `value_l1` and `row_lse` arrays, `out` (`Hkv*P` floats, `[Hkv][P]`)
/// and the workspace (256-byte aligned, `kve_cuda_score_workspace_size` bytes) are
/// device memory; the structs themselves are host memory. LaProx's `gram` is the f32
/// output of `kve_compute_gram` copied to the device (for f16/bf16 values it is split
/// into a high and a low part in the values' dtype, in the workspace, so the tensor
/// cores see an f32-accurate G); or pass `value_forms` (`kve_compute_value_forms`, on
/// the device). With `row_lse` the window pass reads K once.
///
/// Limits of the kernels: `dk <= 256`; `dv <= 256` when the Gram is given; `g <= 128`
/// (`g <= 16` for the exact and mean-attn LaProx GQA modes); at most 65535 heads;
/// `window <= 2^24`; uniqueness: `N <= 65535·64`; otherwise `KVE_ERR_INVALID_ARGUMENT`. A few
/// shapes also need more shared memory than sm_86/89's 99 KiB (f32 with `dk > 128` and
/// `g > 24`, 16-bit with `dk > 128` and `g > 96`; the exact LaProx GQA modes with f32,
/// `dk > 128` and `g > 8`; `cuda/kvevict_cuda.h` has the table): the launch is then
/// refused with `KVE_ERR_CUDA`, nothing enqueued.
/// Everything the host can check (pointers, dtypes, extents and strides against `len`,
/// lengths, alignment, workspace size) is checked before anything is enqueued, with the
/// host path's status codes. Unlike the host path, NaN/Inf are not detected. Nothing
/// synchronises; kernel faults surface on the stream (`KVE_ERR_CUDA` when a launch is
/// refused).
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_score_layer(
    params: *const super::params::kve_score_params,
    inputs: *const kve_layer_inputs,
    out: *mut f32,
    out_len: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
    stream: *mut c_void,
) -> i32 {
    cuda_only!({
        // SAFETY: host structs the caller passes, read within their checked `struct_size`.
        let (cfg, li) = tri!(unsafe { layer_args(params, inputs) });
        // SAFETY: the tensors, `out` and the workspace are device memory of the declared
        // sizes (this function's contract); the pipeline checks them before any launch.
        to_status(unsafe {
            device::score_layer(&cfg, &li, out, out_len, workspace, workspace_bytes, stream)
        })
    })
}

/// Device workspace bytes of `kve_cuda_select_model`. Writes only `*out_bytes`.
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_select_model_workspace_size(
    params: *const kve_select_params,
    layers: u64,
    hkv: u64,
    n: u64,
    window: u64,
    out_bytes: *mut u64,
) -> i32 {
    cuda_only!({
        // SAFETY: `params` is NULL or the caller's struct of `struct_size` bytes (checked).
        let bytes = unsafe { select_config(params) }.and_then(|cfg| {
            let shape = ModelShape::new(layers, hkv, n, window)?;
            device::select_workspace_size(&cfg, &shape)
        });
        // SAFETY: a host out-parameter, checked before it is written.
        unsafe { write(out_bytes, bytes.map(|b| b as u64)) }
    })
}

/// `kve_select_model` on the device from device scores (`scores->scores` is a device
/// pointer): every allocator (uniform, ada, pyramid, lava, global), granularity (head,
/// layer, token), normalisation and post pooling, with the same keys and tie rule as
/// the host, so the kept sets are the host's. Layer budgets (PyramidKV, LAVa's
/// entropies) are computed on the device: no host round trip, capturable in a graph.
/// Output per unit `u = l*hkv + kh`, as the host's lists: `counts[u]` (int32,
/// `layers*hkv` entries) kept positions in `idx[u*idx_ld ..]` (int32, `N <= idx_ld <=
/// 2^31-1`), ascending — the chosen prefix tokens, then the whole window — so the lists
/// go straight to `kve_cuda_compact_in_place` (`max_keep`: the largest count; `N`
/// always suffices). With a shared granularity every head of a layer (layer)
/// or of the model (token) gets the same list. `counts`, `idx` and the
/// workspace (`kve_cuda_select_model_workspace_size` bytes, 256-byte aligned) are
/// device memory.
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_select_model(
    params: *const kve_select_params,
    scores: *const kve_model_scores,
    counts: *mut i32,
    counts_len: u64,
    idx: *mut i32,
    idx_ld: u64,
    idx_len: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
    stream: *mut c_void,
) -> i32 {
    cuda_only!({
        let lists = (counts, counts_len, idx, idx_ld, idx_len);
        let ws = (workspace, workspace_bytes);
        // SAFETY: the caller's pointers, passed on; `select_model` checks them.
        to_status(unsafe { imp::select_model(params, scores, None, lists, ws, stream) })
    })
}

/// Device workspace bytes of `kve_cuda_compact_in_place` for a view and the largest
/// count of any list. Writes only `*out_bytes`.
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_compact_in_place_workspace_size(
    kv: *const kve_tensor,
    max_keep: u64,
    out_bytes: *mut u64,
) -> i32 {
    cuda_only!({
        // SAFETY: a host descriptor (NULL and alignment checked).
        let v = tri!(tensor(tri!(unsafe { arg(kv) })));
        let b = tri!(device::compact_workspace_size(&v.view, max_keep));
        // SAFETY: a host out-parameter, checked before it is written.
        unsafe { write(out_bytes, Ok(b as u64)) }
    })
}

/// In-place compaction on the device: for each head `h` of `kv`, rows
/// `kept[h*kept_ld + t]` (`t < counts[h]`, ascending) move to token `t`. `kept_ld = 0`:
/// one list shared by every head. `counts[h] <= max_keep`. Lists as written by
/// `kve_cuda_select_model` (device memory). Works for every layout.
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_compact_in_place(
    kv: *const kve_tensor,
    kept: *const i32,
    kept_ld: u64,
    counts: *const i32,
    max_keep: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
    stream: *mut c_void,
) -> i32 {
    cuda_only!({
        // SAFETY: a host descriptor (NULL and alignment checked).
        let v = tri!(tensor(tri!(unsafe { arg(kv) })));
        // SAFETY: the view, lists and workspace are device memory (this function's contract).
        to_status(unsafe {
            device::compact_in_place(
                &v.view,
                kept,
                kept_ld,
                counts,
                max_keep,
                workspace,
                workspace_bytes,
                stream,
            )
        })
    })
}

/// Varlen compaction on the device: kept rows of every head of `src`, head after head,
/// into `dst` (contiguous rows of `src`'s dtype and dim, `Σ counts` rows) and
/// `cu_seqlens[0..=heads]` (int32, device).
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_compact_to_varlen(
    src: *const kve_tensor,
    kept: *const i32,
    kept_ld: u64,
    counts: *const i32,
    dst: *mut c_void,
    cu_seqlens: *mut i32,
    stream: *mut c_void,
) -> i32 {
    cuda_only!({
        // SAFETY: a host descriptor (NULL and alignment checked).
        let v = tri!(tensor(tri!(unsafe { arg(src) })));
        // SAFETY: the view, lists and outputs are device memory (this function's contract).
        to_status(unsafe {
            device::compact_varlen(&v.view, kept, kept_ld, counts, dst, cu_seqlens, stream)
        })
    })
}

/// The score parameters and the device pipeline's inputs of a layer: every given tensor
/// checked, as on the host.
///
/// # Safety
/// `params` and `inputs` are NULL or the caller's host structs of their `struct_size`.
#[cfg(feature = "cuda")]
unsafe fn layer_args(
    params: *const super::params::kve_score_params,
    inputs: *const kve_layer_inputs,
) -> crate::error::Result<(crate::ScoreConfig, device::LayerInputs)> {
    // SAFETY: this function's contract; both read within their checked `struct_size`.
    let cfg = unsafe { score_config(params)? };
    // SAFETY: as above.
    let d = unsafe { read_ext(inputs, KVE_LAYER_INPUTS_V1_SIZE, NO_INPUTS)? };
    if d.reserved != 0 {
        return Err(Error::InvalidArgument);
    }
    let floats = |ptr, len| Floats { ptr, len };
    let opt = |t: &kve_tensor| {
        if t.data.is_null() {
            Ok(None)
        } else {
            tensor(t).map(Some)
        }
    };
    let li = device::LayerInputs {
        queries: opt(&d.queries)?,
        keys: opt(&d.keys)?,
        values: opt(&d.values)?,
        gram: floats(d.gram, d.gram_len),
        value_forms: floats(d.value_forms, d.value_forms_len),
        value_l1: floats(d.value_l1, d.value_l1_len),
        row_lse: floats(d.row_lse, d.row_lse_len),
    };
    Ok((cfg, li))
}

#[cfg(feature = "cuda")]
mod imp;

mod links;
pub use links::*;
mod compact_batch;
pub use compact_batch::*;

mod gram;
pub use gram::*;

mod evictor;
pub use evictor::*;
