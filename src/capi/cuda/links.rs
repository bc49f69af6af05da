//! Value links on the device (`crate::device::links`): the C entry points. Always declared;
//! without feature `cuda` (or `cuda-emu`) each answers `KVE_ERR_NOT_BUILT_WITH_CUDA`.

use super::super::kve_tensor;
use super::super::params::kve_select_params;
use super::super::select::kve_model_scores;
use core::ffi::c_void;

#[cfg(feature = "cuda")]
use {
    super::super::{arg, to_status, tri},
    super::imp::{tensor, write},
    crate::device,
};

/// Device workspace bytes of `kve_cuda_accumulate_value_links` for `hkv` heads of `n`
/// tokens: `hkv` in 1 .. 65535, `n` in 1 .. 2^31 (else `KVE_ERR_INVALID_ARGUMENT`).
/// Writes only `*out_bytes` (host memory).
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_value_links_workspace_size(
    hkv: u64,
    n: u64,
    out_bytes: *mut u64,
) -> i32 {
    cuda_only!({
        let b = device::value_links_workspace_size(hkv, n).map(|b| b as u64);
        // SAFETY: a host out-parameter, checked before it is written.
        unsafe { write(out_bytes, b) }
    })
}

/// `kve_accumulate_value_links` on the device, enqueued on `stream`: adds `sum over the
/// Hkv heads of cos(v[h, i], v[h, i-1])` to `links[i]`, `1 <= i < N`, for one layer's
/// `values` `[Hkv, N, dv]` (f32/f16/bf16, any strides, V transposed included). `links`
/// (`links_len >= N` floats, zeroed before the first layer) and the workspace
/// (`kve_cuda_value_links_workspace_size` bytes, 256-byte aligned) are device memory; the
/// descriptor is host memory. The host's operation order, so the sums are the host's bits
/// on an AVX2 + FMA host. Checked before anything is enqueued as on the host (pointers,
/// dtype, extents and strides, `links_len`, workspace, aliasing); `Hkv <= 65535` (else
/// `KVE_ERR_INVALID_ARGUMENT`). Unlike the host path NaN/Inf are not detected: a
/// non-finite value or squared norm makes its token's and the next token's link NaN.
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_accumulate_value_links(
    values: *const kve_tensor,
    links: *mut f32,
    links_len: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
    stream: *mut c_void,
) -> i32 {
    cuda_only!({
        // SAFETY: a host descriptor (NULL and alignment checked).
        let v = tri!(tensor(tri!(unsafe { arg(values) })));
        // SAFETY: the tensor's data, `links` and the workspace are device memory of the
        // declared sizes (this function's contract); checked before the launch.
        to_status(unsafe {
            device::accumulate_value_links(&v, links, links_len, workspace, workspace_bytes, stream)
        })
    })
}

/// `kve_cuda_select_model` whose forward post-pool carries each continuation on through
/// linked positions, as `kve_select_model_linked`: `i` continues `i - 1` when
/// `links[i] / (layers * hkv)` exceeds `link_threshold`. `links`: exactly `n` floats of
/// device memory, the sums of `kve_cuda_accumulate_value_links` over every layer (else
/// `KVE_ERR_SHAPE_MISMATCH`). The post-pool must be `KVE_POOL_FORWARD` with decay 1 and
/// the threshold finite (else `KVE_ERR_INVALID_ARGUMENT`). Same workspace
/// (`kve_cuda_select_model_workspace_size`) and outputs as `kve_cuda_select_model`;
/// nothing enqueued on error. Unlike the host path, non-finite links are not detected
/// (they are device memory): a NaN sum links nothing.
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_select_model_linked(
    params: *const kve_select_params,
    scores: *const kve_model_scores,
    links: *const f32,
    links_len: u64,
    link_threshold: f32,
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
        let links = Some((links, links_len, link_threshold));
        let lists = (counts, counts_len, idx, idx_ld, idx_len);
        let ws = (workspace, workspace_bytes);
        // SAFETY: the caller's pointers, passed on; `select_model` checks them.
        to_status(unsafe { super::imp::select_model(params, scores, links, lists, ws, stream) })
    })
}
