//! CUDA entry points of the C API. Always declared; a library built without feature
//! `cuda` answers `KVE_ERR_NOT_BUILT_WITH_CUDA` from each (before any other check).
//!
//! With feature `cuda` they validate the host-side descriptors exactly like the host
//! functions (null, dtype, alignment, extents/strides against `len`, sizes) and enqueue
//! the launchers of `cuda/kvevict_cuda.h` (`crate::cuda`) on the caller's stream. Every
//! pointer inside a descriptor and every buffer argument is a DEVICE pointer; the
//! descriptor structs themselves are host memory. Nothing synchronises; errors from
//! kernels surface on the stream (`cudaGetLastError` / the next sync). A launcher that
//! rejects its arguments or fails to launch gives `KVE_ERR_CUDA`.
//!
//! The launchers' own names are `kve_cuda_<stage>` (an internal interface); these are
//! the public, stable ones with status codes and `kve_tensor` descriptors.

use super::kve_tensor;
use super::params::kve_select_params;
use super::score::kve_layer_inputs;
use super::select::kve_model_scores;
use core::ffi::c_void;

#[cfg(not(any(feature = "cuda", feature = "cuda-mock")))]
use super::KVE_ERR_NOT_BUILT_WITH_CUDA as STUB;

/// Number of CUDA devices the library can use; 0 (and `KVE_OK`) when there is no device
/// or driver. Writes only `*count`.
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_get_device_count(count: *mut i32) -> i32 {
    #[cfg(any(feature = "cuda", feature = "cuda-mock"))]
    {
        imp::device_count(count)
    }
    #[cfg(not(any(feature = "cuda", feature = "cuda-mock")))]
    {
        let _ = count;
        STUB
    }
}

/// Device workspace bytes of `kve_cuda_score_layer` (shape as in
/// `kve_score_workspace_size`). Writes only `*out_bytes` (host memory).
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
    #[cfg(any(feature = "cuda", feature = "cuda-mock"))]
    {
        imp::score_workspace_size(params, hq, hkv, n, dk, dv, out_bytes)
    }
    #[cfg(not(any(feature = "cuda", feature = "cuda-mock")))]
    {
        let _ = (params, hq, hkv, n, dk, dv, out_bytes);
        STUB
    }
}

/// `kve_score_layer` on the device, enqueued on `stream` (a `cudaStream_t`, NULL = the
/// legacy default stream). Tensors of `inputs`, `out` (`Hkv*P` floats, `[Hkv][P]`) and
/// the workspace are device memory. Supported on the device so far: the SnapKV scorer
/// (any pooling, GQA reduction and reduce-before-pool), `dk <= 256`; other scorers give
/// `KVE_ERR_INVALID_ARGUMENT`. Unlike the host path, NaN/Inf are not detected.
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
    #[cfg(any(feature = "cuda", feature = "cuda-mock"))]
    {
        imp::score_layer(
            params,
            inputs,
            out,
            out_len,
            workspace,
            workspace_bytes,
            stream,
        )
    }
    #[cfg(not(any(feature = "cuda", feature = "cuda-mock")))]
    {
        let _ = (
            params,
            inputs,
            out,
            out_len,
            workspace,
            workspace_bytes,
            stream,
        );
        STUB
    }
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
    #[cfg(any(feature = "cuda", feature = "cuda-mock"))]
    {
        imp::select_workspace_size(params, layers, hkv, n, window, out_bytes)
    }
    #[cfg(not(any(feature = "cuda", feature = "cuda-mock")))]
    {
        let _ = (params, layers, hkv, n, window, out_bytes);
        STUB
    }
}

/// Selection on the device from device scores (`scores->scores` is a device pointer).
/// Output per unit `u = l*hkv + kh`: `counts[u]` (int32, `layers*hkv` entries) kept
/// PREFIX positions, ascending, in `idx[u*idx_ld ..]` (int32, `idx_ld >= P`); the window
/// is always kept and not listed. Supported: `KVE_ALLOCATOR_UNIFORM` and
/// `KVE_ALLOCATOR_GLOBAL` at head granularity without post pooling; others give
/// `KVE_ERR_INVALID_ARGUMENT`. Ties: the later position first, as on the host.
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
    #[cfg(any(feature = "cuda", feature = "cuda-mock"))]
    {
        imp::select_model(
            params,
            scores,
            counts,
            counts_len,
            idx,
            idx_ld,
            idx_len,
            workspace,
            workspace_bytes,
            stream,
        )
    }
    #[cfg(not(any(feature = "cuda", feature = "cuda-mock")))]
    {
        let _ = (
            params,
            scores,
            counts,
            counts_len,
            idx,
            idx_ld,
            idx_len,
            workspace,
            workspace_bytes,
            stream,
        );
        STUB
    }
}

/// Device workspace bytes of `kve_cuda_compact_in_place` for a view and the largest
/// count of any list. Writes only `*out_bytes`.
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_compact_in_place_workspace_size(
    kv: *const kve_tensor,
    max_keep: u64,
    out_bytes: *mut u64,
) -> i32 {
    #[cfg(any(feature = "cuda", feature = "cuda-mock"))]
    {
        imp::compact_workspace_size(kv, max_keep, out_bytes)
    }
    #[cfg(not(any(feature = "cuda", feature = "cuda-mock")))]
    {
        let _ = (kv, max_keep, out_bytes);
        STUB
    }
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
    #[cfg(any(feature = "cuda", feature = "cuda-mock"))]
    {
        imp::compact_in_place(
            kv,
            kept,
            kept_ld,
            counts,
            max_keep,
            workspace,
            workspace_bytes,
            stream,
        )
    }
    #[cfg(not(any(feature = "cuda", feature = "cuda-mock")))]
    {
        let _ = (
            kv,
            kept,
            kept_ld,
            counts,
            max_keep,
            workspace,
            workspace_bytes,
            stream,
        );
        STUB
    }
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
    #[cfg(any(feature = "cuda", feature = "cuda-mock"))]
    {
        imp::compact_varlen(src, kept, kept_ld, counts, dst, cu_seqlens, stream)
    }
    #[cfg(not(any(feature = "cuda", feature = "cuda-mock")))]
    {
        let _ = (src, kept, kept_ld, counts, dst, cu_seqlens, stream);
        STUB
    }
}

#[cfg(any(feature = "cuda", feature = "cuda-mock"))]
mod imp {
    use super::super::params::{read_ext, score_config, select_config};
    use super::super::score::{kve_layer_inputs, KVE_LAYER_INPUTS_V1_SIZE, NO_INPUTS};
    use super::super::{
        arg, kve_tensor, out_param, status_of, tri, Tensor, KVE_ERR_CUDA, KVE_ERR_INVALID_ARGUMENT,
        KVE_MAX_HEADS, KVE_OK,
    };
    use super::*;
    use crate::config::{AllocatorKind, Granularity, Normalize, PoolKind, ScorerKind};
    use crate::cuda as cu;
    use crate::error::{Error, Result};
    use core::ffi::c_int;

    const ALIGN: usize = 256;

    fn i64_of(v: u64) -> Result<i64> {
        i64::try_from(v).map_err(|_| Error::Overflow)
    }

    fn cuda(st: c_int) -> i32 {
        if st == 0 {
            KVE_OK
        } else {
            KVE_ERR_CUDA
        }
    }

    /// Host-side checks of a device tensor, then the launcher's descriptor.
    fn view(t: &kve_tensor) -> Result<cu::KveCudaView> {
        Tensor::new(t)?;
        Ok(cu::KveCudaView {
            data: t.data as *mut c_void,
            dtype: t.dtype as i32,
            reserved: 0,
            stride_head: i64_of(t.stride[0])?,
            stride_token: i64_of(t.stride[1])?,
            stride_dim: i64_of(t.stride[2])?,
            heads: i64_of(t.extent[0])?,
            tokens: i64_of(t.extent[1])?,
            dim: i64_of(t.extent[2])?,
        })
    }

    fn up(x: usize) -> Result<usize> {
        x.checked_add(ALIGN - 1)
            .map(|v| v & !(ALIGN - 1))
            .ok_or(Error::Overflow)
    }

    fn write<T>(p: *mut T, v: T) -> Result<()> {
        let b = out_param(p)?;
        // SAFETY: checked non-NULL and aligned.
        unsafe { b.slice_mut()[0] = v };
        Ok(())
    }

    pub unsafe fn device_count(count: *mut i32) -> i32 {
        let out = tri!(out_param(count));
        let mut c: c_int = 0;
        let st = cu::kve_cuda_device_count(&mut c);
        let v = if st == 0 { c } else { 0 };
        out.slice_mut()[0] = v;
        KVE_OK
    }

    /// (window ws, mean buffer bytes, pooled buffer bytes)
    fn score_parts(hq: usize, hkv: usize, n: usize, w: usize) -> Result<(usize, usize, usize)> {
        let p = n - w.min(n);
        let win = unsafe {
            cu::kve_cuda_window_workspace_size(hq as i64, w.min(n) as i64, n as i64, hkv as i64)
        };
        let rows = hq
            .checked_mul(p)
            .and_then(|x| x.checked_mul(4))
            .ok_or(Error::Overflow)?;
        Ok((up(win)?, up(rows)?, up(rows)?))
    }

    pub unsafe fn score_workspace_size(
        params: *const super::super::params::kve_score_params,
        hq: u64,
        hkv: u64,
        n: u64,
        _dk: u64,
        _dv: u64,
        out_bytes: *mut u64,
    ) -> i32 {
        let cfg = tri!(score_config(params));
        if hq > KVE_MAX_HEADS || hkv > KVE_MAX_HEADS || n > crate::error::MAX_TOKENS as u64 {
            return KVE_ERR_INVALID_ARGUMENT;
        }
        let (a, b, c) = tri!(score_parts(
            hq as usize,
            hkv as usize,
            n as usize,
            cfg.window as usize
        ));
        let total = tri!(a
            .checked_add(b)
            .and_then(|x| x.checked_add(c))
            .ok_or(Error::Overflow));
        tri!(write(out_bytes, total as u64));
        KVE_OK
    }

    pub unsafe fn score_layer(
        params: *const super::super::params::kve_score_params,
        inputs: *const kve_layer_inputs,
        out: *mut f32,
        out_len: u64,
        workspace: *mut c_void,
        workspace_bytes: u64,
        stream: *mut c_void,
    ) -> i32 {
        let cfg = tri!(score_config(params));
        if cfg.scorer != ScorerKind::SnapKv {
            return KVE_ERR_INVALID_ARGUMENT;
        }
        let d = tri!(read_ext(inputs, KVE_LAYER_INPUTS_V1_SIZE, NO_INPUTS));
        if d.queries.data.is_null() || d.keys.data.is_null() || out.is_null() || workspace.is_null()
        {
            return status_of(Error::NullPointer);
        }
        let q = tri!(view(&d.queries));
        let k = tri!(view(&d.keys));
        if q.dtype != k.dtype || q.dim != k.dim || k.heads == 0 || q.heads % k.heads != 0 {
            return status_of(Error::ShapeMismatch);
        }
        let (hq, hkv, n) = (q.heads as usize, k.heads as usize, k.tokens as usize);
        let w = (cfg.window as usize).min(n);
        if (q.tokens as usize) < w {
            return KVE_ERR_INVALID_ARGUMENT;
        }
        let p = n - w;
        if (out_len as u128) < (hkv as u128) * (p as u128) {
            return status_of(Error::OutputTooSmall);
        }
        let (a, b, c) = tri!(score_parts(hq, hkv, n, w));
        if (workspace_bytes as u128) < (a + b + c) as u128 {
            return status_of(Error::WorkspaceTooSmall);
        }
        if (out as usize) % 4 != 0 || (workspace as usize) % ALIGN != 0 {
            return status_of(Error::Misaligned);
        }
        if p == 0 {
            return KVE_OK;
        }
        // window rows are the last w of the queries supplied
        let mut qv = q;
        let skip = (q.tokens as usize - w) as i64;
        let esz: i64 = if q.dtype == 0 { 4 } else { 2 };
        qv.data = (q.data as *mut u8).offset((skip * q.stride_token * esz) as isize) as *mut c_void;
        qv.tokens = w as i64;
        let ws = workspace as *mut u8;
        let (mean, pooled) = (ws.add(a) as *mut f32, ws.add(a + b) as *mut f32);
        let gqa = cfg.gqa as c_int;
        let (mode, kern, decay) = match cfg.pool.kind {
            PoolKind::None => (cu::KVE_CUDA_POOL_AVG, 1, 1.0),
            PoolKind::Avg => (cu::KVE_CUDA_POOL_AVG, cfg.pool.kernel as c_int, 1.0),
            PoolKind::Max => (cu::KVE_CUDA_POOL_MAX, cfg.pool.kernel as c_int, 1.0),
            PoolKind::Forward => (
                cu::KVE_CUDA_POOL_FORWARD,
                cfg.pool.kernel as c_int,
                cfg.pool.decay,
            ),
        };
        let (pi, wv) = (p as i64, w as i64);
        if cfg.reduce_before_pool {
            let st = cu::kve_cuda_window(
                &qv,
                &k,
                wv,
                core::ptr::null_mut(),
                core::ptr::null_mut(),
                core::ptr::null_mut(),
                mean,
                gqa,
                ws as *mut c_void,
                a,
                stream,
            );
            if st != 0 {
                return KVE_ERR_CUDA;
            }
            return cuda(cu::kve_cuda_pool(
                mean, pi, out, pi, hkv as i64, pi, mode, kern, decay, stream,
            ));
        }
        let st = cu::kve_cuda_window(
            &qv,
            &k,
            wv,
            mean,
            core::ptr::null_mut(),
            core::ptr::null_mut(),
            core::ptr::null_mut(),
            gqa,
            ws as *mut c_void,
            a,
            stream,
        );
        if st != 0 {
            return KVE_ERR_CUDA;
        }
        let st = cu::kve_cuda_pool(
            mean, pi, pooled, pi, hq as i64, pi, mode, kern, decay, stream,
        );
        if st != 0 {
            return KVE_ERR_CUDA;
        }
        cuda(cu::kve_cuda_head_reduce(
            pooled,
            core::ptr::null(),
            0,
            core::ptr::null(),
            pi,
            out,
            pi,
            hq as i64,
            hkv as i64,
            pi,
            gqa,
            stream,
        ))
    }

    /// (select ws, layer sums + entropies, layer-stats ws)
    fn select_parts(layers: u64, hkv: u64, p: u64) -> Result<(usize, usize, usize)> {
        let units = layers * hkv;
        let sel = unsafe {
            cu::kve_cuda_select_workspace_size(1)
                .max(cu::kve_cuda_select_workspace_size(units as i64))
        };
        let sums = (layers as usize).checked_mul(16).ok_or(Error::Overflow)?;
        let count = hkv.checked_mul(p).ok_or(Error::Overflow)?;
        let stats =
            unsafe { cu::kve_cuda_layer_stats_workspace_size(layers as i64, i64_of(count)?) };
        Ok((up(sel)?, up(sums)?, up(stats)?))
    }

    pub unsafe fn select_workspace_size(
        params: *const kve_select_params,
        layers: u64,
        hkv: u64,
        n: u64,
        window: u64,
        out_bytes: *mut u64,
    ) -> i32 {
        let _ = tri!(select_config(params));
        if layers == 0 || hkv == 0 || n == 0 || n > crate::error::MAX_TOKENS as u64 {
            return KVE_ERR_INVALID_ARGUMENT;
        }
        if layers
            .checked_mul(hkv)
            .map_or(true, |u| u > u32::MAX as u64 / 2)
        {
            return status_of(Error::Overflow);
        }
        let (a, b, stats) = tri!(select_parts(layers, hkv, n - window.min(n)));
        let total = tri!(a
            .checked_add(b)
            .and_then(|x| x.checked_add(stats))
            .ok_or(Error::Overflow));
        tri!(write(out_bytes, total as u64));
        KVE_OK
    }

    pub unsafe fn select_model(
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
        let cfg = tri!(select_config(params));
        let m = tri!(arg(scores));
        if cfg.granularity != Granularity::Head || !cfg.post_pool.is_identity() {
            return KVE_ERR_INVALID_ARGUMENT;
        }
        if m.scores.is_null() || counts.is_null() || idx.is_null() || workspace.is_null() {
            return status_of(Error::NullPointer);
        }
        if m.layers == 0 || m.hkv == 0 || m.n == 0 || m.n > crate::error::MAX_TOKENS as u64 {
            return KVE_ERR_INVALID_ARGUMENT;
        }
        let units = tri!(m
            .layers
            .checked_mul(m.hkv)
            .filter(|&u| u <= u32::MAX as u64 / 2)
            .ok_or(Error::Overflow));
        let p = m.n - m.window.min(m.n);
        if (m.len as u128) < units as u128 * p as u128 {
            return status_of(Error::ShapeMismatch);
        }
        if idx_ld < p || counts_len < units || (idx_len as u128) < units as u128 * idx_ld as u128 {
            return status_of(Error::OutputTooSmall);
        }
        let (a, b, stats) = tri!(select_parts(m.layers, m.hkv, p));
        if (workspace_bytes as u128) < (a + b + stats) as u128 {
            return status_of(Error::WorkspaceTooSmall);
        }
        let ws = workspace as *mut u8;
        let k = cfg.budget.min(p) as i64;
        let (pi, hkv, layers) = (p as i64, m.hkv as i64, m.layers as i64);
        match cfg.allocator {
            AllocatorKind::Uniform => cuda(cu::kve_cuda_select(
                m.scores,
                pi,
                pi,
                units as i64,
                1,
                core::ptr::null(),
                k,
                core::ptr::null(),
                hkv,
                counts,
                idx,
                idx_ld as i64,
                ws as *mut c_void,
                a,
                stream,
            )),
            AllocatorKind::Global => {
                let sums = ws.add(a) as *mut f64;
                let mut layer_sum: *const f64 = core::ptr::null();
                if cfg.normalize == Normalize::LayerSum {
                    let st = cu::kve_cuda_layer_stats(
                        m.scores,
                        hkv * pi,
                        hkv * pi,
                        layers,
                        sums,
                        sums.add(m.layers as usize),
                        ws.add(a + b) as *mut c_void,
                        stats,
                        stream,
                    );
                    if st != 0 {
                        return KVE_ERR_CUDA;
                    }
                    layer_sum = sums;
                }
                cuda(cu::kve_cuda_select(
                    m.scores,
                    pi,
                    pi,
                    1,
                    units as i64,
                    core::ptr::null(),
                    (units as i64).saturating_mul(k),
                    layer_sum,
                    hkv,
                    counts,
                    idx,
                    idx_ld as i64,
                    ws as *mut c_void,
                    a,
                    stream,
                ))
            }
            _ => KVE_ERR_INVALID_ARGUMENT,
        }
    }

    pub unsafe fn compact_workspace_size(
        kv: *const kve_tensor,
        max_keep: u64,
        out_bytes: *mut u64,
    ) -> i32 {
        let v = tri!(view(tri!(arg(kv))));
        let mk = tri!(i64_of(max_keep));
        let b = cu::kve_cuda_compact_workspace_size(&v, mk);
        tri!(write(out_bytes, b as u64));
        KVE_OK
    }

    pub unsafe fn compact_in_place(
        kv: *const kve_tensor,
        kept: *const i32,
        kept_ld: u64,
        counts: *const i32,
        max_keep: u64,
        workspace: *mut c_void,
        workspace_bytes: u64,
        stream: *mut c_void,
    ) -> i32 {
        let v = tri!(view(tri!(arg(kv))));
        if kept.is_null() || counts.is_null() {
            return status_of(Error::NullPointer);
        }
        if crate::view::layout_overlaps(
            [v.heads as usize, v.tokens as usize, v.dim as usize],
            [
                v.stride_head as usize,
                v.stride_token as usize,
                v.stride_dim as usize,
            ],
        ) {
            return status_of(Error::Aliasing);
        }
        let mk = tri!(i64_of(max_keep));
        let need = cu::kve_cuda_compact_workspace_size(&v, mk);
        if (workspace_bytes as u128) < need as u128 {
            return status_of(Error::WorkspaceTooSmall);
        }
        cuda(cu::kve_cuda_compact(
            &v,
            kept,
            tri!(i64_of(kept_ld)),
            counts,
            mk,
            workspace,
            workspace_bytes as usize,
            stream,
        ))
    }

    pub unsafe fn compact_varlen(
        src: *const kve_tensor,
        kept: *const i32,
        kept_ld: u64,
        counts: *const i32,
        dst: *mut c_void,
        cu_seqlens: *mut i32,
        stream: *mut c_void,
    ) -> i32 {
        let v = tri!(view(tri!(arg(src))));
        if kept.is_null() || counts.is_null() || dst.is_null() || cu_seqlens.is_null() {
            return status_of(Error::NullPointer);
        }
        cuda(cu::kve_cuda_compact_varlen(
            &v,
            kept,
            tri!(i64_of(kept_ld)),
            counts,
            dst,
            cu_seqlens,
            stream,
        ))
    }
}
