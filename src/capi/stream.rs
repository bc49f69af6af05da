//! Scoring from any query stream (`crate::stream`): size the state, start it, feed query
//! chunks with their positions, finish into scores `[Hkv][N]` for every key.

use super::params::{extensible, read_ext, write_ext};
use super::{
    answer_size, arg, check_alias, kve_tensor, out_param, span_ptr, to_status, to_usize, tri, Buf,
    Span, Tensor, KVE_MAX_HEADS, KVE_OK,
};
use crate::config::{GqaReduce, Pool, PoolKind};
use crate::error::{Error, Result};
use crate::stream::{StreamScoreConfig, StreamShape, StreamStat, StreamValues};
use core::ffi::c_void;

/// How `kve_stream_scores` turns a stream's statistics into scores. Fill with
/// `kve_stream_score_params_init` (max attention, GQA max, no pooling), then adjust.
/// Per query head: `stat`, then the pool; then the GQA reduction; then the post-pool.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct kve_stream_score_params {
    /// `sizeof(kve_stream_score_params)` as the caller compiled it (set by the init).
    pub struct_size: u32,
    /// `KVE_STREAM_STAT_*`.
    pub stat: u32,
    /// `KVE_GQA_*`: how the query heads of a KV group combine (after `pool`).
    pub gqa: u32,
    /// `KVE_POOL_*` along tokens per query head (LaProx: on the attention term).
    pub pool_kind: u32,
    /// Its kernel: odd for avg/max (<= 4095), 1..4096 for forward.
    pub pool_kernel: u32,
    /// Its decay (forward pooling), in (0, 1].
    pub pool_decay: f32,
    /// `KVE_POOL_*` per KV head after the GQA reduction.
    pub post_pool_kind: u32,
    pub post_pool_kernel: u32,
    pub post_pool_decay: f32,
    /// Must be 0.
    pub reserved: u32,
}

/// `sizeof(kve_stream_score_params)` of the first release.
pub const KVE_STREAM_SCORE_PARAMS_V1_SIZE: u32 = 40;
extensible!(kve_stream_score_params: [KVE_STREAM_SCORE_PARAMS_V1_SIZE]);

const DEFAULT_PARAMS: kve_stream_score_params = kve_stream_score_params {
    struct_size: KVE_STREAM_SCORE_PARAMS_V1_SIZE,
    stat: StreamStat::Max as u32,
    gqa: GqaReduce::Max as u32,
    pool_kind: PoolKind::None as u32,
    pool_kernel: 1,
    pool_decay: 1.0,
    post_pool_kind: PoolKind::None as u32,
    post_pool_kernel: 1,
    post_pool_decay: 1.0,
    reserved: 0,
};

/// Fill `params` with the defaults (max attention, GQA max, no pooling) and its
/// `struct_size` (pass `sizeof(kve_stream_score_params)`). Writes only `params`.
#[no_mangle]
pub unsafe extern "C" fn kve_stream_score_params_init(
    params: *mut kve_stream_score_params,
    struct_size: u32,
) -> i32 {
    // SAFETY: the caller passes NULL or `struct_size` writable bytes; write_ext checks the rest.
    to_status(unsafe {
        write_ext(
            params,
            struct_size,
            KVE_STREAM_SCORE_PARAMS_V1_SIZE,
            DEFAULT_PARAMS,
        )
    })
}

/// # Safety
/// `p` is NULL or points to the caller's `kve_stream_score_params`.
unsafe fn stream_config(p: *const kve_stream_score_params) -> Result<StreamScoreConfig> {
    // SAFETY: NULL or the caller's params; read_ext checks NULL, alignment, struct_size.
    let p = unsafe { read_ext(p, KVE_STREAM_SCORE_PARAMS_V1_SIZE, DEFAULT_PARAMS)? };
    if p.reserved != 0 {
        return Err(Error::InvalidArgument);
    }
    let cfg = StreamScoreConfig {
        stat: StreamStat::from_u32(p.stat)?,
        gqa: GqaReduce::from_u32(p.gqa)?,
        pool: Pool {
            kind: PoolKind::from_u32(p.pool_kind)?,
            kernel: p.pool_kernel,
            decay: p.pool_decay,
        },
        post_pool: Pool {
            kind: PoolKind::from_u32(p.post_pool_kind)?,
            kernel: p.post_pool_kernel,
            decay: p.post_pool_decay,
        },
    };
    cfg.validate()?;
    Ok(cfg)
}

fn shape(hq: u64, hkv: u64, n: u64, dk: u64) -> Result<StreamShape> {
    if hq > KVE_MAX_HEADS || hkv > KVE_MAX_HEADS {
        return Err(Error::InvalidArgument);
    }
    Ok(StreamShape {
        hq: to_usize(hq)?,
        hkv: to_usize(hkv)?,
        n: to_usize(n)?,
        dk: to_usize(dk)?,
    })
}

fn write_u64(out: &mut Buf<u64>, v: u64) {
    // SAFETY: out_param checked non-NULL and aligned; one element.
    unsafe { out.slice_mut()[0] = v };
}

/// The state buffer: `bytes` bytes at `p`, 8-byte aligned.
fn state_buf(p: *const c_void, bytes: u64) -> Result<Buf<u8>> {
    let b = Buf::new(p as *const u8, bytes)?;
    if b.len() > 0 && (p as usize) % 8 != 0 {
        return Err(Error::Misaligned);
    }
    Ok(b)
}

/// Bytes of a stream state for a layer of `hq` query heads, `hkv` KV heads, `n` cached
/// tokens and key dim `dk` (`dk <= 1024`, `hq` a multiple of `hkv`). Writes only
/// `*out_bytes`. One rule for `state_bytes` in every stream call (init, feed, count,
/// stats, scores): fewer than this size for the state's shape is
/// `KVE_ERR_INVALID_ARGUMENT` (the buffer is not a state of that shape).
#[no_mangle]
pub unsafe extern "C" fn kve_stream_state_size(
    hq: u64,
    hkv: u64,
    n: u64,
    dk: u64,
    out_bytes: *mut u64,
) -> i32 {
    answer_size(out_bytes, || {
        crate::stream_state_size(&shape(hq, hkv, n, dk)?)
    })
}

/// Start an empty stream in `state` (8-byte aligned, `state_bytes` at least
/// `kve_stream_state_size`, else `KVE_ERR_INVALID_ARGUMENT` as every stream call). The state is plain bytes (no pointers): it may be copied,
/// saved and restored. Writes only `state`.
#[no_mangle]
pub unsafe extern "C" fn kve_stream_init(
    state: *mut c_void,
    state_bytes: u64,
    hq: u64,
    hkv: u64,
    n: u64,
    dk: u64,
) -> i32 {
    let sh = tri!(shape(hq, hkv, n, dk));
    let mut st = tri!(state_buf(state, state_bytes));
    // SAFETY: state_buf checked the state (non-NULL, 8-aligned, sized); the only buffer.
    to_status(crate::stream_init(&sh, unsafe { st.slice_mut() }))
}

/// Workspace bytes `kve_stream_feed` needs for chunks of up to `chunk` queries. Writes
/// only `*out_bytes`.
#[no_mangle]
pub unsafe extern "C" fn kve_stream_feed_workspace_size(
    hq: u64,
    hkv: u64,
    n: u64,
    dk: u64,
    chunk: u64,
    out_bytes: *mut u64,
) -> i32 {
    answer_size(out_bytes, || {
        crate::stream_feed_workspace_size(&shape(hq, hkv, n, dk)?, to_usize(chunk)?)
    })
}

/// Feed `c` queries into the stream: `queries` `[Hq, c, dk]` (post-RoPE), `positions[c]`
/// (`>= 0`, non-decreasing within the chunk and after every position fed before),
/// `keys` `[Hkv, N, dk]` with the shape the state was started for. A query at position
/// `p` sees keys `i <= min(p, N-1)`, softmax over them in f32 (design §2, scale 1/sqrt(dk)).
/// `row_lse` (NULL, 0 when absent): exactly `Hq*c` floats `[Hq][c]`, each row's natural-log
/// log-sum-exp over its visible keys (flash attention's `softmax_lse`); K is then read
/// once instead of twice. Errors, with the state unchanged: positions going backwards or
/// negative → `KVE_ERR_INVALID_ARGUMENT`; a state not started, or shorter than its shape's
/// `kve_stream_state_size` → `KVE_ERR_INVALID_ARGUMENT`; queries or keys of another shape
/// → `KVE_ERR_SHAPE_MISMATCH`; NaN/Inf in the queries, the
/// visible keys or `row_lse` → `KVE_ERR_NON_FINITE`. Writes `state` and the workspace.
#[no_mangle]
pub unsafe extern "C" fn kve_stream_feed(
    state: *mut c_void,
    state_bytes: u64,
    queries: *const kve_tensor,
    positions: *const i64,
    positions_len: u64,
    keys: *const kve_tensor,
    row_lse: *const f32,
    row_lse_len: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
) -> i32 {
    let mut st = tri!(state_buf(state, state_bytes));
    // SAFETY: NULL or the caller's `kve_tensor`; from_ptr checks NULL and alignment.
    let q = tri!(unsafe { Tensor::from_ptr(queries) });
    // SAFETY: NULL or the caller's `kve_tensor`; from_ptr checks NULL and alignment.
    let k = tri!(unsafe { Tensor::from_ptr(keys) });
    let pos = tri!(Buf::new(positions, positions_len));
    let lse = if row_lse.is_null() && row_lse_len == 0 {
        None
    } else {
        Some(tri!(Buf::new(row_lse, row_lse_len)))
    };
    let mut ws = tri!(Buf::new(workspace as *const u8, workspace_bytes));
    tri!(check_alias(
        &[st.span, ws.span],
        &[
            q.span,
            k.span,
            pos.span,
            lse.as_ref().map_or(Span::EMPTY, |b| b.span),
            span_ptr(queries),
            span_ptr(keys),
        ],
    ));
    // SAFETY: Tensor::new checked the queries; check_alias: no output overlaps them.
    let qv = tri!(unsafe { q.view() });
    // SAFETY: Tensor::new checked the keys; check_alias: no output overlaps them.
    let kv = tri!(unsafe { k.view() });
    // SAFETY: Buf::new checked the lists; check_alias: no output overlaps them.
    let (pos, lse) = unsafe { (pos.slice(), lse.as_ref().map(|b| b.slice())) };
    // SAFETY: state_buf / Buf::new checked both; check_alias: they overlap no input nor each other.
    let (st, ws) = unsafe { (st.slice_mut(), ws.slice_mut()) };
    to_status(crate::stream_feed(st, &qv, pos, &kv, lse, ws))
}

/// Queries fed into `state` so far. A buffer that is not a started state, or is shorter
/// than its shape's `kve_stream_state_size` → `KVE_ERR_INVALID_ARGUMENT`. Writes only
/// `*out_count`.
#[no_mangle]
pub unsafe extern "C" fn kve_stream_query_count(
    state: *const c_void,
    state_bytes: u64,
    out_count: *mut u64,
) -> i32 {
    let mut out = tri!(out_param(out_count));
    let st = tri!(state_buf(state, state_bytes));
    tri!(check_alias(&[out.span], &[st.span]));
    // SAFETY: state_buf checked the state; check_alias: `out_count` does not overlap it.
    let c = tri!(crate::stream_query_count(unsafe { st.slice() }));
    write_u64(&mut out, c);
    KVE_OK
}

/// Workspace bytes `kve_stream_scores` needs. Writes only `*out_bytes`.
#[no_mangle]
pub unsafe extern "C" fn kve_stream_scores_workspace_size(
    hq: u64,
    hkv: u64,
    n: u64,
    dk: u64,
    out_bytes: *mut u64,
) -> i32 {
    answer_size(out_bytes, || {
        crate::stream_scores_workspace_size(&shape(hq, hkv, n, dk)?)
    })
}

/// Finish the stream into `out[kh*N + i]`, one score per KV head and key, for all `N`
/// keys (the stream has no window: select with window 0; larger = keep). `out_len` at
/// least `hkv*N`. LaProx's value term (`KVE_STREAM_STAT_LAPROX` only, ignored otherwise):
/// `value_forms` `[Hkv][g][N]` from `kve_compute_value_forms` with `cross = 0`, or
/// `values` `[Hkv, N, dv]` (NULL for absent) with `gram` from `kve_compute_gram` with
/// `cross = 0`; `value_forms` beside `values` or `gram` is `KVE_ERR_INVALID_ARGUMENT`
/// (one value term, never one ignored, as `kve_layer_inputs`). `KVE_STREAM_STAT_MEAN`, `_MEAN_VISIBLE` and `_LAPROX` on a stream that has
/// seen no query give `KVE_ERR_INVALID_ARGUMENT`. Reads `state`; writes `out` (only on
/// success) and the workspace.
#[no_mangle]
pub unsafe extern "C" fn kve_stream_scores(
    state: *const c_void,
    state_bytes: u64,
    params: *const kve_stream_score_params,
    values: *const kve_tensor,
    gram: *const f32,
    gram_len: u64,
    value_forms: *const f32,
    value_forms_len: u64,
    out: *mut f32,
    out_len: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
) -> i32 {
    // SAFETY: NULL or the caller's params; stream_config checks NULL, alignment, struct_size.
    let cfg = tri!(unsafe { stream_config(params) });
    let st = tri!(state_buf(state, state_bytes));
    let v = if values.is_null() {
        None
    } else {
        // SAFETY: non-NULL here, the caller's `kve_tensor`; `arg` checks alignment.
        tri!(Tensor::optional(tri!(unsafe { arg(values) })))
    };
    let opt = |p: *const f32, len: u64| -> Result<Option<Buf<f32>>> {
        if p.is_null() && len == 0 {
            Ok(None)
        } else {
            Buf::new(p, len).map(Some)
        }
    };
    let g = tri!(opt(gram, gram_len));
    let f = tri!(opt(value_forms, value_forms_len));
    let mut o = tri!(Buf::new(out, out_len));
    let mut ws = tri!(Buf::new(workspace as *const u8, workspace_bytes));
    let sp = |b: &Option<Buf<f32>>| b.as_ref().map_or(Span::EMPTY, |b| b.span);
    tri!(check_alias(
        &[o.span, ws.span],
        &[
            st.span,
            Tensor::span(&v),
            sp(&g),
            sp(&f),
            span_ptr(params),
            if values.is_null() {
                Span::EMPTY
            } else {
                span_ptr(values)
            },
        ],
    ));
    let sv = StreamValues {
        // SAFETY: Buf::new checked the buffer; check_alias: no output overlaps it.
        value_forms: f.as_ref().map(|b| unsafe { b.slice() }),
        values: match &v {
            // SAFETY: Tensor::new checked the tensor; check_alias: no output overlaps it.
            Some(t) => Some(tri!(unsafe { t.view() })),
            None => None,
        },
        // SAFETY: Buf::new checked the buffer; check_alias: no output overlaps it.
        gram: g.as_ref().map(|b| unsafe { b.slice() }),
    };
    // SAFETY: state_buf checked the state; check_alias: no output overlaps it.
    let st = unsafe { st.slice() };
    // SAFETY: Buf::new checked both; check_alias: they overlap no input nor each other.
    let (o, ws) = unsafe { (o.slice_mut(), ws.slice_mut()) };
    to_status(crate::stream_scores(st, &cfg, &sv, o, ws))
}

/// Copy the raw statistics of `state` out, for callers that finish them their own way:
/// `out_max`, `out_sum`, `out_sq` (`len` floats each, at least `Hq*N`; `[Hq][N]`:
/// `max_j A`, `Σ_j A`, `Σ_j A²` per query head and key) and `out_seen` (`seen_len` u64, at
/// least `N`: how many fed queries had key `i` as their last visible key, so that
/// `Σ_{i' >= i} seen[i']` queries saw key `i`). Writes the first `Hq*N` (`N`) elements of
/// each, only on success.
#[no_mangle]
pub unsafe extern "C" fn kve_stream_stats(
    state: *const c_void,
    state_bytes: u64,
    out_max: *mut f32,
    out_sum: *mut f32,
    out_sq: *mut f32,
    len: u64,
    out_seen: *mut u64,
    seen_len: u64,
) -> i32 {
    let st = tri!(state_buf(state, state_bytes));
    let mut outs = [
        tri!(Buf::new(out_max, len)),
        tri!(Buf::new(out_sum, len)),
        tri!(Buf::new(out_sq, len)),
    ];
    let mut seen = tri!(Buf::new(out_seen, seen_len));
    tri!(check_alias(
        &[outs[0].span, outs[1].span, outs[2].span, seen.span],
        &[st.span]
    ));
    // SAFETY: state_buf checked the state; check_alias: no output overlaps it.
    let s = tri!(crate::stream_stats(unsafe { st.slice() }));
    let (hn, n) = (s.max.len(), s.seen.len());
    if outs.iter().any(|b| b.len() < hn) || seen.len() < n {
        return super::KVE_ERR_OUTPUT_TOO_SMALL;
    }
    for (b, src) in outs.iter_mut().zip([s.max, s.sum, s.sq]) {
        // SAFETY: Buf::new checked it (len >= hn above); check_alias: it overlaps no other buffer.
        let b = unsafe { b.slice_mut() };
        b[..hn].copy_from_slice(src);
    }
    // SAFETY: Buf::new checked it (len >= n above); check_alias: it overlaps no other buffer.
    let seen = unsafe { seen.slice_mut() };
    seen[..n].copy_from_slice(s.seen);
    KVE_OK
}
