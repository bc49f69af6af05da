//! Test double of the CUDA launchers (feature `cuda-mock`, never with `cuda`): every
//! function of the `extern "C"` block of `src/cuda.rs`, same name and signature, as plain
//! Rust over HOST memory, so the CUDA entry points of the C API run (and are tested) on
//! machines without a GPU.
//!
//! Conventions (those of `cuda/kvevict_cuda.h`, the specification):
//!  - "device pointers" are host pointers; streams are ignored; the work is done before
//!    the call returns.
//!  - 0 on success; 1 (`cudaErrorInvalidValue`) for the invalid arguments the header and
//!    the kernels in `cuda/*.cu` reject, and then NOTHING is written (the mock validates
//!    everything it reads before its first write). The mock is stricter than the kernels
//!    only where they would touch memory out of bounds: compaction lists with positions
//!    outside `0..tokens` are rejected instead of being undefined behaviour (forced /
//!    first-stage positions outside their row are skipped, as the kernels skip them).
//!  - Workspace sizes are the kernels' own formulas, and launchers that take a workspace
//!    require it (non-null, large enough) exactly like the kernels. The mock does not need
//!    the workspace but overwrites it with a pattern, as the kernels overwrite it, so a
//!    caller whose workspace overlaps an input is caught.
//!  - Launch-grid limits of the kernels (65535 heads / rows / layers where the kernel puts
//!    them in a grid dimension, `g <= 64` for laprox_exact) are enforced too.
//!
//! Arithmetic: the mock reproduces the CPU core (`src/`) rather than the kernels, because
//! the C API's CUDA entry points are tested against the host C API:
//!  - window runs the core's own window passes (`crate::window::row_stats` /
//!    `column_stats`: same logits, softmax, f64 denominators, lane sums), so its outputs are
//!    bit-identical to the core's statistics; with `row_lse` it uses the core's
//!    `A = exp(z - lse)` path. Non-finite Q / K (which the kernels do not detect) give NaN
//!    in that group's outputs.
//!  - stream_feed runs the core's `stream::accumulate` (bit-identical to a host stream
//!    state's statistics); it rejects negative or decreasing positions, which the kernels
//!    (reading them on the device) cannot check.
//!  - pool calls `crate::pool::pool`; vonorm the core's `gram::quad_forms`; layer_stats the
//!    core's `layer_entropy`; layer_budgets the core's `pyramid_budget` / `lava_budgets` /
//!    ada floor; select / shard build the core's 128-bit keys (`make_key` order).
//!  - GQA mean is `sum · (1/g as f32)` (the core's `reduce_rows`), where the kernels
//!    divide by g; laprox mean-attn terms are summed as the core's laprox.rs does.
//!  - vonorm_factor accumulates `||v L||²` in f64 (the core has no factor form).
//!  - token_reduce: `Σ_l Σ_r s · (1/sums[l]) as f32` in f32, sequential in (l, r): the
//!    core's token granularity (factor 1 where `sums[l] <= 0`, as the core's `norm`).
//!  - select / shard: NaN keys rank lowest (the kernels' `float_key`), the core rejects NaN.

#![allow(clippy::missing_safety_doc)] // the contract of every launcher: src/cuda.rs, cuda/kvevict_cuda.h

use super::*;
use crate::numerics::float_key;
use crate::view::{DType, View};
use crate::window::{self, Needs, Stats};
use crate::workspace::WorkspaceSize;
use core::ffi::{c_int, c_void};
use std::vec;
use std::vec::Vec;

/// `cudaErrorInvalidValue`.
const INVALID: c_int = 1;
/// What the mock writes over a workspace.
const WS_PATTERN: u8 = 0xA5;

// ------------------------------------------------------------------ helpers --

/// Element size of a dtype code; 0 when unknown.
fn dtype_size(dt: i32) -> usize {
    match dt {
        KVE_CUDA_F32 => 4,
        KVE_CUDA_F16 | KVE_CUDA_BF16 => 2,
        _ => 0,
    }
}

fn dtype_of(dt: i32) -> Option<DType> {
    match dt {
        KVE_CUDA_F32 => Some(DType::F32),
        KVE_CUDA_F16 => Some(DType::F16),
        KVE_CUDA_BF16 => Some(DType::BF16),
        _ => None,
    }
}

/// The kernels' `view_ok`: a descriptor pointer, known dtype, reserved 0, non-negative
/// extents and strides, data when non-empty, offsets that fit. Returns a copy.
pub(super) unsafe fn view_ok(v: *const KveCudaView) -> Option<KveCudaView> {
    // SAFETY: a non-null descriptor pointer is readable (launcher contract); null is rejected
    // first.
    unsafe {
        if v.is_null() {
            return None;
        }
        let v = *v;
        if dtype_size(v.dtype) == 0 || v.reserved != 0 {
            return None;
        }
        if v.heads < 0 || v.tokens < 0 || v.dim < 0 {
            return None;
        }
        if v.stride_head < 0 || v.stride_token < 0 || v.stride_dim < 0 {
            return None;
        }
        if v.heads == 0 || v.tokens == 0 || v.dim == 0 {
            return Some(v);
        }
        if v.data.is_null() {
            return None;
        }
        let span = (v.heads - 1) as f64 * v.stride_head as f64
            + (v.tokens - 1) as f64 * v.stride_token as f64
            + (v.dim - 1) as f64 * v.stride_dim as f64;
        if span < 9.0e18 && last_elem(&v).is_some() {
            Some(v)
        } else {
            None
        }
    }
}

/// Highest element offset of a non-empty view (checked).
fn last_elem(v: &KveCudaView) -> Option<usize> {
    let part = |e: i64, s: i64| (e as usize - 1).checked_mul(s as usize);
    part(v.heads, v.stride_head)?
        .checked_add(part(v.tokens, v.stride_token)?)?
        .checked_add(part(v.dim, v.stride_dim)?)
}

/// The core's [`View`] over a validated, non-empty descriptor.
unsafe fn core_view<'a>(v: &KveCudaView) -> Option<View<'a>> {
    let len = last_elem(v)?.checked_add(1)?;
    let dtype = dtype_of(v.dtype)?;
    let extent = [v.heads as usize, v.tokens as usize, v.dim as usize];
    let stride = [
        v.stride_head as usize,
        v.stride_token as usize,
        v.stride_dim as usize,
    ];
    // SAFETY: `v` was validated by `view_ok`: `data` holds `last_elem + 1` elements of its dtype.
    unsafe { View::from_raw(v.data as *const u8, len, dtype, extent, stride) }.ok()
}

/// Element `(h, t, d)` of a validated view as f32.
#[inline]
pub(super) unsafe fn get(v: &KveCudaView, h: usize, t: usize, d: usize) -> f32 {
    // SAFETY: `v` was validated by `view_ok` and `(h, t, d)` is inside its extents (caller), so
    // `off <= last_elem`.
    unsafe {
        let off =
            h * v.stride_head as usize + t * v.stride_token as usize + d * v.stride_dim as usize;
        match v.dtype {
            KVE_CUDA_F32 => *(v.data as *const f32).add(off),
            KVE_CUDA_F16 => (*(v.data as *const half::f16).add(off)).to_f32(),
            _ => (*(v.data as *const half::bf16).add(off)).to_f32(),
        }
    }
}

/// Byte address of element `(h, t, d)` of a validated view.
#[inline]
fn elem_addr(v: &KveCudaView, h: usize, t: usize, d: usize) -> *mut u8 {
    let off = h * v.stride_head as usize + t * v.stride_token as usize + d * v.stride_dim as usize;
    (v.data as *mut u8).wrapping_add(off * dtype_size(v.dtype))
}

/// Element `i` of an array of the given dtype as f32.
#[inline]
unsafe fn get_typed(p: *const c_void, dtype: i32, i: usize) -> f32 {
    // SAFETY: the caller passes an array of `dtype` with more than `i` elements.
    unsafe {
        match dtype {
            KVE_CUDA_F32 => *(p as *const f32).add(i),
            KVE_CUDA_F16 => (*(p as *const half::f16).add(i)).to_f32(),
            _ => (*(p as *const half::bf16).add(i)).to_f32(),
        }
    }
}

/// Overwrite the first `bytes` of a workspace, as a kernel would use it.
pub(super) unsafe fn scribble(ws: *mut c_void, bytes: usize) {
    if bytes > 0 {
        // SAFETY: the caller checked that `ws` holds at least `bytes` bytes.
        unsafe { core::ptr::write_bytes(ws as *mut u8, WS_PATTERN, bytes) };
    }
}

/// The kernels' `float_key`, NaN ranking lowest (the core's for every non-NaN).
#[inline]
fn fkey(x: f32) -> u32 {
    if x.is_nan() {
        0
    } else {
        float_key(x)
    }
}

/// The core's 128-bit selection key (`crate::select::make_key`, not forced).
#[inline]
fn key128(x: f32, position: usize, unit: u32) -> u128 {
    ((fkey(x) as u128) << 64) | ((position as u128 & 0xffff_ffff) << 32) | (!unit) as u128
}

/// `(float)(1 / sum)` (1 when the sum is <= 0), the core's layer normalisation factor.
#[inline]
fn norm_factor(sum: f64) -> f32 {
    if sum > 0.0 {
        (1.0 / sum) as f32
    } else {
        1.0
    }
}

/// Scale of row `r` for select / shard: `norm_factor(layer_sum[r / rpl])` or none.
#[inline]
unsafe fn row_scale(layer_sum: *const f64, rpl: usize, r: usize) -> Option<f32> {
    if layer_sum.is_null() {
        None
    } else {
        // SAFETY: a non-null `layer_sum` holds one f64 per layer and `r / rpl` < layers
        // (launcher contract).
        Some(norm_factor(unsafe { *layer_sum.add(r / rpl) }))
    }
}

#[inline]
fn scaled(x: f32, sc: Option<f32>) -> f32 {
    match sc {
        Some(s) => x * s,
        None => x,
    }
}

// ------------------------------------------------------------------- device --

/// The mock reports one device.
pub unsafe fn kve_cuda_device_count(out: *mut c_int) -> c_int {
    if !out.is_null() {
        // SAFETY: a non-null `out` points to one writable int (launcher contract).
        unsafe { *out = 1 };
    }
    0
}

// ------------------------------------------------------------------- window --

const WIN_TK: i64 = 64;
const WIN_MAXG_CROSS: i64 = 16;

fn pass1_splits(n: i64, hkv: i64) -> i64 {
    let ntiles = (n + WIN_TK - 1) / WIN_TK;
    let want = ((1024 + hkv - 1) / hkv).max(1);
    if ntiles < want {
        ntiles.max(1)
    } else {
        want
    }
}

/// The kernel's formula: `(Hq·w·splits + Hq·w)` float2.
pub unsafe fn kve_cuda_window_workspace_size(hq: i64, w: i64, n: i64, hkv: i64) -> usize {
    if hq <= 0 || w <= 0 || n <= 0 || hkv <= 0 {
        return 0;
    }
    let nsplit = pass1_splits(n, hkv);
    hq.checked_mul(w)
        .and_then(|r| r.checked_mul(nsplit + 1))
        .and_then(|e| (e as u64).checked_mul(8))
        .and_then(|b| usize::try_from(b).ok())
        .unwrap_or(usize::MAX)
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn kve_cuda_window(
    q: *const KveCudaView,
    k: *const KveCudaView,
    w: i64,
    out_mean: *mut f32,
    out_l2: *mut f32,
    out_cross: *mut f32,
    out_group: *mut f32,
    gqa_op: c_int,
    row_lse: *const f32,
    ws: *mut c_void,
    ws_bytes: usize,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (each non-null pointer
    // covers the extents it passes; host memory under the mock), and the checks below reject null
    // and out-of-range arguments before the first access.
    unsafe {
        let (Some(qd), Some(kd)) = (view_ok(q), view_ok(k)) else {
            return INVALID;
        };
        if qd.dtype != kd.dtype {
            return INVALID;
        }
        let (hq, hkv, n, dk) = (qd.heads, kd.heads, kd.tokens, kd.dim);
        if hkv <= 0 || hq <= 0 || hq % hkv != 0 {
            return INVALID;
        }
        let g = hq / hkv;
        if w < 1 || w > n || qd.tokens != w || qd.dim != dk {
            return INVALID;
        }
        if !(1..=256).contains(&dk) {
            return INVALID;
        }
        if !(KVE_CUDA_GQA_MEAN..=KVE_CUDA_GQA_SUM).contains(&gqa_op) {
            return INVALID;
        }
        if !out_cross.is_null() && g > WIN_MAXG_CROSS {
            return INVALID;
        }
        if g > 128 || w > 1 << 24 || n > 1 << 40 {
            return INVALID;
        }
        let p = n - w;
        if p == 0
            || (out_mean.is_null()
                && out_l2.is_null()
                && out_cross.is_null()
                && out_group.is_null())
        {
            return 0;
        }
        let need = kve_cuda_window_workspace_size(hq, w, n, hkv);
        if ws.is_null() || ws_bytes < need {
            return INVALID;
        }
        let (Some(qv), Some(kv)) = (core_view(&qd), core_view(&kd)) else {
            return INVALID;
        };
        let (hkv, g, w, p, dk) = (
            hkv as usize,
            g as usize,
            w as usize,
            p as usize,
            dk as usize,
        );
        let mut sz = WorkspaceSize::new();
        if window::scratch_size(&mut sz, g, w, dk).is_err() {
            return INVALID;
        }
        scribble(ws, need);

        let want_sum = !out_mean.is_null() || !out_group.is_null();
        let want_sq = !out_l2.is_null() || !out_cross.is_null();
        let nd = Needs {
            sum: want_sum,
            sq: want_sq,
            cross: !out_cross.is_null() && g > 1,
        };
        let npairs = g * (g - 1) / 2;
        let np = g + npairs;
        let mut scratch = vec![0u8; sz.total()];
        let mut rmax = vec![0f32; g * w];
        let mut rsum = vec![0f64; g * w];
        let mut sum = vec![0f32; if nd.sum { g * p } else { 0 }];
        let mut sq = vec![0f32; if nd.sq { g * p } else { 0 }];
        let mut cross = vec![0f32; if nd.cross { npairs * p } else { 0 }];
        let inv_w = 1.0 / w as f32;
        let inv_g = 1.0 / g as f32;
        for kh in 0..hkv {
            sum.fill(0.0);
            sq.fill(0.0);
            cross.fill(0.0);
            let ok = if !row_lse.is_null() {
                // the caller's row statistics: A = exp(z - lse), denominators 1 (the core's path)
                for (r, m) in rmax.iter_mut().enumerate() {
                    *m = *row_lse.add(kh * g * w + r);
                }
                rsum.fill(1.0);
                true
            } else {
                window::row_stats(&qv, &kv, kh, g, w, &mut scratch, &mut rmax, &mut rsum).is_ok()
            };
            let ok = ok && {
                let mut st = Stats {
                    sum: &mut sum,
                    sq: &mut sq,
                    cross: &mut cross,
                };
                window::column_stats(&qv, &kv, kh, g, w, &rmax, &rsum, nd, &mut scratch, &mut st)
                    .is_ok()
            };
            if !ok {
                // NaN/Inf in Q or K: the kernels do not detect it; their outputs are garbage
                sum.fill(f32::NAN);
                sq.fill(f32::NAN);
                cross.fill(f32::NAN);
            }
            for i in 0..p {
                let mut red = 0f32;
                for a in 0..g {
                    let h = kh * g + a;
                    if nd.sum {
                        let mean = sum[a * p + i] * inv_w;
                        if !out_mean.is_null() {
                            *out_mean.add(h * p + i) = mean;
                        }
                        // the core's reduce_rows: row 0, then max / sum, mean times 1/g
                        red = if a == 0 {
                            mean
                        } else if gqa_op == KVE_CUDA_GQA_MAX {
                            red.max(mean)
                        } else {
                            red + mean
                        };
                    }
                    if !out_l2.is_null() {
                        *out_l2.add(h * p + i) = libm::sqrtf(sq[a * p + i].max(0.0));
                    }
                }
                if !out_group.is_null() {
                    *out_group.add(kh * p + i) = if gqa_op == KVE_CUDA_GQA_MEAN {
                        red * inv_g
                    } else {
                        red
                    };
                }
                if !out_cross.is_null() {
                    for blk in 0..np {
                        let v = if blk < g {
                            sq[blk * p + i]
                        } else {
                            cross[(blk - g) * p + i]
                        };
                        *out_cross.add((kh * np + blk) * p + i) = v;
                    }
                }
            }
        }
        0
    }
}

// -------------------------------------------------------------- lava_factor --

pub unsafe fn kve_cuda_lava_factor(
    v: *const KveCudaView,
    prefix: i64,
    out: *mut f32,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (each non-null pointer
    // covers the extents it passes; host memory under the mock), and the checks below reject null
    // and out-of-range arguments before the first access.
    unsafe {
        let Some(vd) = view_ok(v) else {
            return INVALID;
        };
        if out.is_null() || prefix < 0 || prefix > vd.tokens || vd.heads <= 0 || vd.heads > 65535 {
            return INVALID;
        }
        for hk in 0..vd.heads as usize {
            // the core's head_factors: f32 L1 norm per token, max from 0
            let mut m = 0f32;
            for t in 0..prefix as usize {
                let mut l1 = 0f32;
                for d in 0..vd.dim as usize {
                    l1 += get(&vd, hk, t, d).abs();
                }
                m = m.max(l1);
            }
            *out.add(hk) = m;
        }
        0
    }
}

// ------------------------------------------------------------------- vonorm --

/// Shared checks of vonorm / vonorm_factor: `(view, hkv, dv, n_tokens, grams per head)`,
/// or `Err(status)`; `Ok(None)` when there is nothing to do.
#[allow(clippy::type_complexity)]
unsafe fn vonorm_args(
    v: *const KveCudaView,
    n_tokens: i64,
    hi: *const c_void,
    n_gram: i64,
    out: *mut f32,
) -> Result<Option<(KveCudaView, usize, usize, usize, usize)>, c_int> {
    // SAFETY: `view_ok` reads a descriptor pointer the launcher's caller vouches for.
    let vd = unsafe { view_ok(v) }.ok_or(INVALID)?;
    let hkv = vd.heads;
    if hkv <= 0 || vd.dim < 1 || vd.dim > 256 {
        return Err(INVALID);
    }
    if n_tokens < 0 || n_tokens > vd.tokens {
        return Err(INVALID);
    }
    if n_gram <= 0 || n_gram % hkv != 0 || hkv > 65535 {
        return Err(INVALID);
    }
    if n_tokens == 0 {
        return Ok(None);
    }
    if hi.is_null() || out.is_null() {
        return Err(INVALID);
    }
    Ok(Some((
        vd,
        hkv as usize,
        vd.dim as usize,
        n_tokens as usize,
        (n_gram / hkv) as usize,
    )))
}

/// Block `m` (`[dv][dv]`) of hi (+ lo) in `v`'s dtype, as f32 `hi + lo`.
unsafe fn block_f32(
    hi: *const c_void,
    lo: *const c_void,
    dtype: i32,
    m: usize,
    dv: usize,
    out: &mut [f32],
) {
    // SAFETY: the caller checked that `hi` (and a non-null `lo`) hold `m + 1` blocks of `dv·dv`
    // elements.
    unsafe {
        let base = m * dv * dv;
        for (e, o) in out.iter_mut().enumerate() {
            let mut x = get_typed(hi, dtype, base + e);
            if !lo.is_null() {
                x += get_typed(lo, dtype, base + e);
            }
            *o = x;
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn kve_cuda_vonorm(
    v: *const KveCudaView,
    n_tokens: i64,
    gram_hi: *const c_void,
    gram_lo: *const c_void,
    n_gram: i64,
    take_sqrt: c_int,
    out: *mut f32,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (each non-null pointer
    // covers the extents it passes; host memory under the mock), and the checks below reject null
    // and out-of-range arguments before the first access.
    unsafe {
        let (vd, hkv, dv, nt, gpk) = match vonorm_args(v, n_tokens, gram_hi, n_gram, out) {
            Err(e) => return e,
            Ok(None) => return 0,
            Ok(Some(a)) => a,
        };
        let Some(view) = core_view(&vd) else {
            return INVALID;
        };
        let mut gb = vec![0f32; dv * dv];
        let mut dst = vec![0f32; nt];
        for kh in 0..hkv {
            for mm in 0..gpk {
                let m = kh * gpk + mm;
                block_f32(gram_hi, gram_lo, vd.dtype, m, dv, &mut gb);
                // the core's quadratic forms (src/gram.rs), f32 accumulation
                crate::gram::quad_forms(&view, kh, &gb, 0, nt, &mut dst);
                for (i, &q) in dst.iter().enumerate() {
                    *out.add(m * nt + i) = if take_sqrt != 0 {
                        libm::sqrtf(q.max(0.0))
                    } else {
                        q
                    };
                }
            }
        }
        0
    }
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn kve_cuda_vonorm_factor(
    v: *const KveCudaView,
    n_tokens: i64,
    factor_hi: *const c_void,
    factor_lo: *const c_void,
    n_gram: i64,
    take_sqrt: c_int,
    out: *mut f32,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (each non-null pointer
    // covers the extents it passes; host memory under the mock), and the checks below reject null
    // and out-of-range arguments before the first access.
    unsafe {
        let (vd, hkv, dv, nt, gpk) = match vonorm_args(v, n_tokens, factor_hi, n_gram, out) {
            Err(e) => return e,
            Ok(None) => return 0,
            Ok(Some(a)) => a,
        };
        let mut lb = vec![0f32; dv * dv];
        let mut row = vec![0f64; dv];
        for kh in 0..hkv {
            for mm in 0..gpk {
                let m = kh * gpk + mm;
                block_f32(factor_hi, factor_lo, vd.dtype, m, dv, &mut lb);
                for i in 0..nt {
                    for (d, r) in row.iter_mut().enumerate() {
                        *r = get(&vd, kh, i, d) as f64;
                    }
                    // ||v L||², L lower triangular (entries above the diagonal ignored), f64
                    let mut q = 0f64;
                    for c in 0..dv {
                        let mut x = 0f64;
                        for r in c..dv {
                            x += row[r] * lb[r * dv + c] as f64;
                        }
                        q += x * x;
                    }
                    let q = q as f32;
                    *out.add(m * nt + i) = if take_sqrt != 0 {
                        libm::sqrtf(q.max(0.0))
                    } else {
                        q
                    };
                }
            }
        }
        0
    }
}

/// Host code in the real library too: the port of cuda/vonorm.cu's Cholesky.
pub unsafe fn kve_cuda_gram_factor(g: *const f32, n_gram: i64, dv: i64, l_out: *mut f32) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (each non-null pointer
    // covers the extents it passes; host memory under the mock), and the checks below reject null
    // and out-of-range arguments before the first access.
    unsafe {
        if n_gram < 0 || !(1..=4096).contains(&dv) {
            return INVALID;
        }
        if n_gram == 0 {
            return 0;
        }
        if g.is_null() || l_out.is_null() {
            return INVALID;
        }
        let (ng, dv) = (n_gram as usize, dv as usize);
        let bs = dv * dv;
        // all blocks first: nothing is written when one is rejected
        let mut all = vec![0f32; ng * bs];
        let mut a = vec![0f64; bs];
        let mut l = vec![0f64; bs];
        for m in 0..ng {
            for (i, x) in a.iter_mut().enumerate() {
                *x = *g.add(m * bs + i) as f64;
                if !x.is_finite() {
                    return INVALID;
                }
            }
            let mut maxd = 0f64;
            for i in 0..dv {
                maxd = maxd.max(a[i * dv + i].abs());
            }
            let unit = if maxd > 0.0 { maxd } else { 1.0 };
            let tol = 1e-7 * unit;
            l.fill(0.0);
            for j in 0..dv {
                let mut d = a[j * dv + j];
                for k in 0..j {
                    d -= l[j * dv + k] * l[j * dv + k];
                }
                if d < -1e-3 * unit {
                    return INVALID;
                }
                if d <= tol {
                    continue; // zero column
                }
                let ljj = libm::sqrt(d);
                l[j * dv + j] = ljj;
                for i in j + 1..dv {
                    let mut s = 0.5 * (a[i * dv + j] + a[j * dv + i]);
                    for k in 0..j {
                        s -= l[i * dv + k] * l[j * dv + k];
                    }
                    l[i * dv + j] = s / ljj;
                }
            }
            for (o, &x) in all[m * bs..(m + 1) * bs].iter_mut().zip(l.iter()) {
                *o = x as f32;
            }
        }
        core::ptr::copy_nonoverlapping(all.as_ptr(), l_out, ng * bs);
        0
    }
}

pub unsafe fn kve_cuda_gram_split(
    g: *const f32,
    n: i64,
    dtype: c_int,
    hi: *mut c_void,
    lo: *mut c_void,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (each non-null pointer
    // covers the extents it passes; host memory under the mock), and the checks below reject null
    // and out-of-range arguments before the first access.
    unsafe {
        if n < 0 || dtype_size(dtype) == 0 {
            return INVALID;
        }
        if n == 0 {
            return 0;
        }
        if g.is_null() || hi.is_null() {
            return INVALID;
        }
        for i in 0..n as usize {
            let x = *g.add(i);
            match dtype {
                KVE_CUDA_F32 => {
                    *(hi as *mut f32).add(i) = x;
                    if !lo.is_null() {
                        // the kernel's x - f32(hi): 0 (NaN for an infinite entry)
                        *(lo as *mut f32).add(i) = x - *(hi as *const f32).add(i);
                    }
                }
                KVE_CUDA_F16 => {
                    let h = half::f16::from_f32(x);
                    *(hi as *mut half::f16).add(i) = h;
                    if !lo.is_null() {
                        *(lo as *mut half::f16).add(i) = half::f16::from_f32(x - h.to_f32());
                    }
                }
                _ => {
                    let h = half::bf16::from_f32(x);
                    *(hi as *mut half::bf16).add(i) = h;
                    if !lo.is_null() {
                        *(lo as *mut half::bf16).add(i) = half::bf16::from_f32(x - h.to_f32());
                    }
                }
            }
        }
        0
    }
}

// --------------------------------------------------------------------- pool --

#[allow(clippy::too_many_arguments)]
pub unsafe fn kve_cuda_pool(
    input: *const f32,
    ld_in: i64,
    out: *mut f32,
    ld_out: i64,
    rows: i64,
    n: i64,
    mode: c_int,
    k: c_int,
    decay: f32,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (each non-null pointer
    // covers the extents it passes; host memory under the mock), and the checks below reject null
    // and out-of-range arguments before the first access.
    unsafe {
        if rows < 0 || n < 0 || !(1..=4096).contains(&k) {
            return INVALID;
        }
        if !(KVE_CUDA_POOL_AVG..=KVE_CUDA_POOL_FORWARD).contains(&mode) {
            return INVALID;
        }
        if mode != KVE_CUDA_POOL_FORWARD && k % 2 == 0 {
            return INVALID;
        }
        if rows == 0 || n == 0 {
            return 0;
        }
        if input.is_null() || out.is_null() || ld_in < n || ld_out < n || rows > 65535 {
            return INVALID;
        }
        let kind = match mode {
            KVE_CUDA_POOL_AVG => crate::config::PoolKind::Avg,
            KVE_CUDA_POOL_MAX => crate::config::PoolKind::Max,
            _ => crate::config::PoolKind::Forward,
        };
        let cfg = crate::config::Pool {
            kind,
            kernel: k as u32,
            decay,
        };
        let n = n as usize;
        let mut src = vec![0f32; n];
        let mut dst = vec![0f32; n];
        for r in 0..rows as usize {
            core::ptr::copy(input.add(r * ld_in as usize), src.as_mut_ptr(), n);
            crate::pool::pool(&cfg, &src, &mut dst);
            core::ptr::copy(dst.as_ptr(), out.add(r * ld_out as usize), n);
        }
        0
    }
}

// -------------------------------------------------------------- head_reduce --

#[allow(clippy::too_many_arguments)]
pub unsafe fn kve_cuda_head_reduce(
    a: *const f32,
    ld_a: i64,
    b: *const f32,
    ld_b: i64,
    b_mode: c_int,
    scale: *const f32,
    out: *mut f32,
    ld_out: i64,
    hq: i64,
    hkv: i64,
    n: i64,
    gqa_op: c_int,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (each non-null pointer
    // covers the extents it passes; host memory under the mock), and the checks below reject null
    // and out-of-range arguments before the first access.
    unsafe {
        if hq <= 0 || hkv <= 0 || hq % hkv != 0 || n < 0 || hkv > 65535 {
            return INVALID;
        }
        if !(0..=2).contains(&b_mode) || !(KVE_CUDA_GQA_MEAN..=KVE_CUDA_GQA_SUM).contains(&gqa_op) {
            return INVALID;
        }
        if n == 0 {
            return 0;
        }
        if a.is_null() || out.is_null() || ld_a < n || ld_out < n {
            return INVALID;
        }
        if b_mode != 0 && (b.is_null() || ld_b < n) {
            return INVALID;
        }
        // in place only element for element (one head per group, same row stride)
        if core::ptr::eq(out, a) && (hkv != hq || ld_out != ld_a) {
            return INVALID;
        }
        let (hkv, g, n) = (hkv as usize, (hq / hkv) as usize, n as usize);
        let (ld_a, ld_b, ld_out) = (ld_a as usize, ld_b as usize, ld_out as usize);
        let inv_g = 1.0 / g as f32;
        for hk in 0..hkv {
            let sc = if scale.is_null() { 1.0 } else { *scale.add(hk) };
            for i in 0..n {
                let mut red = 0f32;
                for hh in 0..g {
                    let h = hk * g + hh;
                    let mut x = *a.add(h * ld_a + i);
                    match b_mode {
                        1 => x *= libm::sqrtf((*b.add(h * ld_b + i)).max(0.0)),
                        2 => x *= *b.add(h * ld_b + i),
                        _ => {}
                    }
                    if !scale.is_null() {
                        x *= sc;
                    }
                    // the core's reduce_rows order: the first head, then max / sum
                    red = if hh == 0 {
                        x
                    } else if gqa_op == KVE_CUDA_GQA_MAX {
                        red.max(x)
                    } else {
                        red + x
                    };
                }
                *out.add(hk * ld_out + i) = if gqa_op == KVE_CUDA_GQA_MEAN {
                    red * inv_g
                } else {
                    red
                };
            }
        }
        0
    }
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn kve_cuda_head_reduce_all(
    a: *const f32,
    ld_a: i64,
    out: *mut f32,
    ld_out: i64,
    hq: i64,
    reps: i64,
    n: i64,
    gqa_op: c_int,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (each non-null pointer
    // covers the extents it passes; host memory under the mock), and the checks below reject null
    // and out-of-range arguments before the first access.
    unsafe {
        if hq <= 0 || hq > i32::MAX as i64 || reps <= 0 || n < 0 {
            return INVALID;
        }
        if !(KVE_CUDA_GQA_MEAN..=KVE_CUDA_GQA_SUM).contains(&gqa_op) {
            return INVALID;
        }
        if n == 0 {
            return 0;
        }
        if a.is_null() || out.is_null() || ld_a < n || ld_out < n {
            return INVALID;
        }
        if core::ptr::eq(out, a) && ld_out != ld_a {
            return INVALID;
        }
        let (g, n, ld_a, ld_out) = (hq as usize, n as usize, ld_a as usize, ld_out as usize);
        let inv_g = 1.0 / g as f32;
        for i in 0..n {
            // the core's reduce_rows order, as kve_cuda_head_reduce
            let mut red = *a.add(i);
            for h in 1..g {
                let x = *a.add(h * ld_a + i);
                red = if gqa_op == KVE_CUDA_GQA_MAX {
                    red.max(x)
                } else {
                    red + x
                };
            }
            let r = if gqa_op == KVE_CUDA_GQA_MEAN {
                red * inv_g
            } else {
                red
            };
            for k in 0..reps as usize {
                *out.add(k * ld_out + i) = r;
            }
        }
        0
    }
}

// ------------------------------------------------------------- laprox_exact --

#[allow(clippy::too_many_arguments)]
pub unsafe fn kve_cuda_laprox_exact(
    cross: *const f32,
    ld_cross: i64,
    qv: *const f32,
    ld_qv: i64,
    out: *mut f32,
    ld_out: i64,
    hkv: i64,
    g: i64,
    n: i64,
    mode: c_int,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (each non-null pointer
    // covers the extents it passes; host memory under the mock), and the checks below reject null
    // and out-of-range arguments before the first access.
    unsafe {
        if hkv <= 0 || hkv > 65535 || g <= 0 || g > 64 || n < 0 {
            return INVALID;
        }
        if !(KVE_CUDA_LAPROX_EXACT..=KVE_CUDA_LAPROX_VALUE_TERM).contains(&mode) {
            return INVALID;
        }
        if n == 0 {
            return 0;
        }
        let use_cross = mode != KVE_CUDA_LAPROX_VALUE_TERM;
        let use_qv = mode != KVE_CUDA_LAPROX_ATTN_TERM;
        if out.is_null() || ld_out < n {
            return INVALID;
        }
        if use_cross && (cross.is_null() || ld_cross < n) {
            return INVALID;
        }
        if use_qv && (qv.is_null() || ld_qv < n) {
            return INVALID;
        }
        let (hkv, g, n) = (hkv as usize, g as usize, n as usize);
        let (ldc, ldq, ldo) = (ld_cross as usize, ld_qv as usize, ld_out as usize);
        let np = g * (g + 1) / 2;
        let inv = g as f32;
        for hk in 0..hkv {
            let c = |p: usize, i: usize| *cross.add((hk * np + p) * ldc + i);
            let q = |p: usize, i: usize| *qv.add((hk * np + p) * ldq + i);
            for i in 0..n {
                let v = match mode {
                    KVE_CUDA_LAPROX_EXACT => {
                        // the core's exact mode: Σ_k w·C·Q over the blocks, diagonal first
                        let mut s = 0f32;
                        for p in 0..np {
                            let w = if p < g { 1.0f32 } else { 2.0 };
                            s += w * c(p, i) * q(p, i);
                        }
                        libm::sqrtf(s.max(0.0))
                    }
                    _ => {
                        // the core's mean-attn: Σ_a C_aa, then + 2·C_ab; mean of sqrt(Q_aa)
                        let att = if use_cross {
                            let mut s = 0f32;
                            for p in 0..g {
                                s += c(p, i);
                            }
                            for p in g..np {
                                s += 2.0 * c(p, i);
                            }
                            libm::sqrtf(s.max(0.0))
                        } else {
                            0.0
                        };
                        let val = if use_qv {
                            let mut s = 0f32;
                            for p in 0..g {
                                s += libm::sqrtf(q(p, i).max(0.0)) / inv;
                            }
                            s
                        } else {
                            0.0
                        };
                        match mode {
                            KVE_CUDA_LAPROX_MEAN_ATTN => val * att,
                            KVE_CUDA_LAPROX_ATTN_TERM => att,
                            _ => val,
                        }
                    }
                };
                *out.add(hk * ldo + i) = v;
            }
        }
        0
    }
}

// -------------------------------------------------------------- layer_stats --

const LS_PER_BLOCK: i64 = 8192;
const LS_MAX_BLOCKS: i64 = 1024;

/// The kernel's formula: `layers · blocks(count)` double2.
pub unsafe fn kve_cuda_layer_stats_workspace_size(layers: i64, count: i64) -> usize {
    if layers <= 0 {
        return 0;
    }
    let nb = ((count.max(0) + LS_PER_BLOCK - 1) / LS_PER_BLOCK).clamp(1, LS_MAX_BLOCKS);
    layers
        .checked_mul(nb * 16)
        .and_then(|b| usize::try_from(b).ok())
        .unwrap_or(usize::MAX)
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn kve_cuda_layer_stats(
    scores: *const f32,
    layer_stride: i64,
    count: i64,
    layers: i64,
    sums: *mut f64,
    entropy: *mut f64,
    ws: *mut c_void,
    ws_bytes: usize,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (each non-null pointer
    // covers the extents it passes; host memory under the mock), and the checks below reject null
    // and out-of-range arguments before the first access.
    unsafe {
        if layers < 0 || count < 0 || layers > 65535 {
            return INVALID;
        }
        if layers == 0 || (sums.is_null() && entropy.is_null()) {
            return 0;
        }
        if (count > 0 && scores.is_null()) || (layers > 1 && layer_stride < count) {
            return INVALID;
        }
        let need = kve_cuda_layer_stats_workspace_size(layers, count);
        if ws.is_null() || ws_bytes < need {
            return INVALID;
        }
        scribble(ws, need);
        let (layers, count) = (layers as usize, count as usize);
        let mut s_out = vec![0f64; layers];
        let mut e_out = vec![0f64; layers];
        for l in 0..layers {
            let s: &[f32] = if count == 0 {
                &[]
            } else {
                core::slice::from_raw_parts(scores.add(l * layer_stride as usize), count)
            };
            // the core's sums (select_model) and entropy (layer_entropy), same order
            s_out[l] = s.iter().map(|&x| (x as f64).abs()).sum();
            e_out[l] = crate::budget::layer_entropy(s);
        }
        if !sums.is_null() {
            core::ptr::copy(s_out.as_ptr(), sums, layers);
        }
        if !entropy.is_null() {
            core::ptr::copy(e_out.as_ptr(), entropy, layers);
        }
        0
    }
}

// ------------------------------------------------------------- token_reduce --

pub unsafe fn kve_cuda_token_reduce(
    scores: *const f32,
    sums: *const f64,
    layers: i64,
    rows_per_layer: i64,
    n: i64,
    out: *mut f32,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (each non-null pointer
    // covers the extents it passes; host memory under the mock), and the checks below reject null
    // and out-of-range arguments before the first access.
    unsafe {
        if layers < 0 || rows_per_layer < 0 || n < 0 {
            return INVALID;
        }
        if n == 0 {
            return 0;
        }
        if out.is_null() || (layers > 0 && rows_per_layer > 0 && scores.is_null()) {
            return INVALID;
        }
        let (layers, rpl, n) = (layers as usize, rows_per_layer as usize, n as usize);
        let mut acc = vec![0f32; n];
        for l in 0..layers {
            let f = if sums.is_null() {
                1.0
            } else {
                norm_factor(*sums.add(l))
            };
            for r in 0..rpl {
                let row = scores.add((l * rpl + r) * n);
                for (i, o) in acc.iter_mut().enumerate() {
                    *o += *row.add(i) * f;
                }
            }
        }
        core::ptr::copy(acc.as_ptr(), out, n);
        0
    }
}

// ------------------------------------------------------------------- select --

const SEL_BINS: usize = 2048;
const SEL_STATE_BYTES: usize = 40;

/// The kernel's formula: per group a 40-byte state (256-byte aligned in all) and a
/// 2048-bin histogram.
pub unsafe fn kve_cuda_select_workspace_size(n_groups: i64) -> usize {
    if n_groups <= 0 {
        return 0;
    }
    let g = n_groups as usize;
    g.checked_mul(SEL_STATE_BYTES)
        .and_then(|s| s.checked_add(255))
        .map(|s| s / 256 * 256)
        .and_then(|s| s.checked_add(g.checked_mul(SEL_BINS * 4)?))
        .unwrap_or(usize::MAX)
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn kve_cuda_select(
    scores: *const f32,
    ld: i64,
    n: i64,
    n_groups: i64,
    rows_per_group: i64,
    k: *const i64,
    k_all: i64,
    layer_sum: *const f64,
    rows_per_layer: i64,
    counts: *mut i32,
    idx: *mut i32,
    idx_ld: i64,
    ws: *mut c_void,
    ws_bytes: usize,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (each non-null pointer
    // covers the extents it passes; host memory under the mock), and the checks below reject null
    // and out-of-range arguments before the first access.
    unsafe {
        const I31: i64 = (1 << 31) - 1;
        if n < 0 || n_groups < 0 || rows_per_group < 0 || n > I31 {
            return INVALID;
        }
        let Some(rows) = n_groups.checked_mul(rows_per_group) else {
            return INVALID;
        };
        if rows == 0 {
            return 0;
        }
        if counts.is_null() || rows > I31 {
            return INVALID;
        }
        if rows_per_group.checked_mul(n).map_or(true, |e| e >= 1 << 32) {
            return INVALID;
        }
        let rows = rows as usize;
        if n == 0 {
            core::ptr::write_bytes(counts, 0, rows);
            return 0;
        }
        if scores.is_null() || idx.is_null() || ld < n || idx_ld < n {
            return INVALID;
        }
        if !layer_sum.is_null() && rows_per_layer <= 0 {
            return INVALID;
        }
        let need = kve_cuda_select_workspace_size(n_groups);
        if ws.is_null() || ws_bytes < need {
            return INVALID;
        }
        scribble(ws, need);
        let (n, ld, idx_ld) = (n as usize, ld as usize, idx_ld as usize);
        let rpg = rows_per_group as usize;
        let rpl = rows_per_layer.max(1) as usize;
        let mut keys: Vec<u128> = Vec::with_capacity(rpg * n);
        let mut sorted: Vec<u128> = Vec::with_capacity(rpg * n);
        for grp in 0..n_groups as usize {
            let kk = if k.is_null() { k_all } else { *k.add(grp) };
            let total = rpg * n;
            keys.clear();
            for r in grp * rpg..(grp + 1) * rpg {
                let sc = row_scale(layer_sum, rpl, r);
                let row = scores.add(r * ld);
                for i in 0..n {
                    // unique keys: score, then the later position, then the lower row
                    keys.push(key128(scaled(*row.add(i), sc), i, r as u32));
                }
            }
            // keep keys >= the kk-th largest (none / all at the ends)
            let thr = if kk <= 0 {
                None
            } else if kk as u64 >= total as u64 {
                Some(0u128)
            } else {
                sorted.clear();
                sorted.extend_from_slice(&keys);
                let (_, t, _) = sorted.select_nth_unstable_by(kk as usize - 1, |a, b| b.cmp(a));
                Some(*t)
            };
            for (rr, r) in (grp * rpg..(grp + 1) * rpg).enumerate() {
                let mut c = 0usize;
                if let Some(t) = thr {
                    for i in 0..n {
                        if keys[rr * n + i] >= t {
                            *idx.add(r * idx_ld + c) = i as i32;
                            c += 1;
                        }
                    }
                }
                *counts.add(r) = c as i32;
            }
        }
        0
    }
}

// -------------------------------------------------------------------- shard --

const SH_SPACE: u32 = 104;

/// The kernels' `sh_args` checks; `rows_per_layer` replaced by 1 without sums.
#[allow(clippy::too_many_arguments)]
unsafe fn shard_args(
    scores: *const f32,
    ld: i64,
    n: i64,
    rows: i64,
    unit0: i64,
    layer_sum: *const f64,
    rows_per_layer: i64,
) -> bool {
    if n < 0 || rows < 0 || unit0 < 0 || n > (1 << 31) - 1 {
        return false;
    }
    if rows > 0 && n > 0 && (scores.is_null() || ld < n) {
        return false;
    }
    if unit0.checked_add(rows).map_or(true, |e| e > 1 << 32) {
        return false;
    }
    layer_sum.is_null() || rows_per_layer > 0
}

/// Key of candidate `i` of row `r` (global unit `unit0 + r`): the core's prepare().
#[inline]
unsafe fn shard_key(
    scores: *const f32,
    ld: usize,
    r: usize,
    i: usize,
    unit0: usize,
    sc: Option<f32>,
) -> u128 {
    // SAFETY: the caller validated `scores` (`ld` apart, `r`, `i` inside) and `layer_sum` as in
    // `shard_args`.
    unsafe { key128(scaled(*scores.add(r * ld + i), sc), i, (unit0 + r) as u32) }
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn kve_cuda_shard_count(
    scores: *const f32,
    ld: i64,
    n: i64,
    rows: i64,
    unit0: i64,
    layer_sum: *const f64,
    rows_per_layer: i64,
    prefix_hi: u64,
    prefix_lo: u64,
    bits: u32,
    hist: *mut u64,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (each non-null pointer
    // covers the extents it passes; host memory under the mock), and the checks below reject null
    // and out-of-range arguments before the first access.
    unsafe {
        if !shard_args(scores, ld, n, rows, unit0, layer_sum, rows_per_layer) {
            return INVALID;
        }
        if bits % 8 != 0 || bits >= SH_SPACE {
            return INVALID;
        }
        let prefix = ((prefix_hi as u128) << 64) | prefix_lo as u128;
        if (bits == 0 && prefix != 0) || (bits > 0 && prefix >> bits != 0) {
            return INVALID;
        }
        if rows == 0 || n == 0 {
            return 0;
        }
        if hist.is_null() {
            return INVALID;
        }
        let rpl = rows_per_layer.max(1) as usize;
        let shift = SH_SPACE - bits - 8;
        let mut h = [0u64; 256];
        for r in 0..rows as usize {
            let sc = row_scale(layer_sum, rpl, r);
            for i in 0..n as usize {
                let key = shard_key(scores, ld as usize, r, i, unit0 as usize, sc);
                if bits == 0 || key >> (shift + 8) == prefix {
                    let b = &mut h[((key >> shift) & 0xff) as usize];
                    *b = b.saturating_add(1);
                }
            }
        }
        for (d, &c) in h.iter().enumerate() {
            *hist.add(d) = (*hist.add(d)).saturating_add(c);
        }
        0
    }
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn kve_cuda_shard_select(
    scores: *const f32,
    ld: i64,
    n: i64,
    rows: i64,
    unit0: i64,
    layer_sum: *const f64,
    rows_per_layer: i64,
    threshold_hi: u64,
    threshold_lo: u64,
    counts: *mut i32,
    idx: *mut i32,
    idx_ld: i64,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (each non-null pointer
    // covers the extents it passes; host memory under the mock), and the checks below reject null
    // and out-of-range arguments before the first access.
    unsafe {
        if !shard_args(scores, ld, n, rows, unit0, layer_sum, rows_per_layer) {
            return INVALID;
        }
        if rows == 0 {
            return 0;
        }
        if counts.is_null() || (n > 0 && (idx.is_null() || idx_ld < n)) || rows > 0x7fff_ffff {
            return INVALID;
        }
        let thr = ((threshold_hi as u128) << 64) | threshold_lo as u128;
        let rpl = rows_per_layer.max(1) as usize;
        for r in 0..rows as usize {
            let sc = row_scale(layer_sum, rpl, r);
            let mut c = 0usize;
            for i in 0..n as usize {
                if shard_key(scores, ld as usize, r, i, unit0 as usize, sc) >= thr {
                    *idx.add(r * idx_ld as usize + c) = i as i32;
                    c += 1;
                }
            }
            *counts.add(r) = c as i32;
        }
        0
    }
}

// ------------------------------------------------------------------ compact --

/// The kernel's formula: `heads · max_keep · dim` elements.
pub unsafe fn kve_cuda_compact_workspace_size(x: *const KveCudaView, max_keep: i64) -> usize {
    if x.is_null() {
        return 0;
    }
    // SAFETY: a non-null `x` points to a descriptor (launcher contract).
    let x = unsafe { *x };
    if max_keep <= 0 || x.heads <= 0 || x.dim <= 0 {
        return 0;
    }
    let es = dtype_size(x.dtype) as i64;
    x.heads
        .checked_mul(max_keep)
        .and_then(|e| e.checked_mul(x.dim))
        .and_then(|e| e.checked_mul(es))
        .and_then(|b| usize::try_from(b).ok())
        .unwrap_or(usize::MAX)
}

/// `counts[h]` (or `counts[0]` with a shared list) clamped to `[0, cap]`, as the kernels.
#[inline]
unsafe fn head_count(counts: *const i32, kept_ld: i64, h: usize, cap: i64) -> usize {
    // SAFETY: `counts` holds one int per head and `h` < heads (caller).
    unsafe {
        let c = *counts.add(if kept_ld != 0 { h } else { 0 }) as i64;
        c.clamp(0, cap) as usize
    }
}

/// Every listed position of every head inside `0..tokens` (the mock's extra check).
unsafe fn lists_in_range(
    kept: *const i32,
    kept_ld: i64,
    counts: *const i32,
    heads: usize,
    cap: i64,
    tokens: i64,
) -> bool {
    // SAFETY: `counts` holds `heads` ints and `kept` `heads` lists `kept_ld` apart (launcher
    // contract), each read within its count, itself capped at `cap`.
    unsafe {
        for h in 0..heads {
            let base = if kept_ld != 0 {
                h * kept_ld as usize
            } else {
                0
            };
            for t in 0..head_count(counts, kept_ld, h, cap) {
                let s = *kept.add(base + t) as i64;
                if s < 0 || s >= tokens {
                    return false;
                }
            }
        }
        true
    }
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn kve_cuda_compact(
    x: *const KveCudaView,
    kept: *const i32,
    kept_ld: i64,
    counts: *const i32,
    max_keep: i64,
    ws: *mut c_void,
    ws_bytes: usize,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (each non-null pointer
    // covers the extents it passes; host memory under the mock), and the checks below reject null
    // and out-of-range arguments before the first access.
    unsafe {
        let Some(xd) = view_ok(x) else {
            return INVALID;
        };
        if kept_ld < 0 || max_keep < 0 {
            return INVALID;
        }
        let max_keep = max_keep.min(xd.tokens);
        if xd.heads == 0 || xd.dim == 0 || max_keep == 0 {
            return 0;
        }
        if kept.is_null() || counts.is_null() {
            return INVALID;
        }
        if kept_ld != 0 && kept_ld < max_keep {
            return INVALID;
        }
        let need = kve_cuda_compact_workspace_size(&xd, max_keep);
        if ws.is_null() || ws_bytes < need {
            return INVALID;
        }
        let heads = xd.heads as usize;
        if !lists_in_range(kept, kept_ld, counts, heads, max_keep, xd.tokens) {
            return INVALID;
        }
        scribble(ws, need);
        let es = dtype_size(xd.dtype);
        let dim = xd.dim as usize;
        // gather every kept row, then scatter: row t := old row kept[t]
        let mut stage: Vec<u8> = Vec::new();
        for h in 0..heads {
            let base = if kept_ld != 0 {
                h * kept_ld as usize
            } else {
                0
            };
            let c = head_count(counts, kept_ld, h, max_keep);
            stage.clear();
            for t in 0..c {
                let s = *kept.add(base + t) as usize;
                for d in 0..dim {
                    let p = elem_addr(&xd, h, s, d);
                    stage.extend_from_slice(core::slice::from_raw_parts(p, es));
                }
            }
            for t in 0..c {
                for d in 0..dim {
                    let p = elem_addr(&xd, h, t, d);
                    core::ptr::copy_nonoverlapping(stage.as_ptr().add((t * dim + d) * es), p, es);
                }
            }
        }
        0
    }
}

/// Items per launch pair of the kernels (`CP_MAX`): the workspace is the largest pair's.
const COMPACT_BATCH: usize = 32;

/// One item's staging bytes (0: nothing to move), as the kernels' `check_item`.
unsafe fn item_bytes(it: &KveCudaCompactItem, max_keep: i64) -> usize {
    let mk = max_keep.min(it.x.tokens);
    if mk <= 0 {
        return 0;
    }
    // SAFETY: a descriptor by reference.
    unsafe { kve_cuda_compact_workspace_size(&it.x, mk) }
}

pub unsafe fn kve_cuda_compact_batch_workspace_size(
    items: *const KveCudaCompactItem,
    n_items: i64,
    max_keep: i64,
) -> usize {
    if items.is_null() || n_items <= 0 || max_keep <= 0 {
        return 0;
    }
    // SAFETY: `items` holds `n_items` descriptors (launcher contract).
    let items = unsafe { core::slice::from_raw_parts(items, n_items as usize) };
    let (mut most, mut sum, mut in_pair) = (0usize, 0usize, 0usize);
    for it in items {
        // SAFETY: a descriptor of the caller's.
        let b = unsafe { item_bytes(it, max_keep) };
        if b == 0 {
            continue;
        }
        if in_pair == COMPACT_BATCH {
            (sum, in_pair) = (0, 0);
        }
        sum = sum.saturating_add(b.saturating_add(255) / 256 * 256);
        in_pair += 1;
        most = most.max(sum);
    }
    most
}

/// Every item as `kve_cuda_compact` (each checked before any is moved).
pub unsafe fn kve_cuda_compact_batch(
    items: *const KveCudaCompactItem,
    n_items: i64,
    max_keep: i64,
    ws: *mut c_void,
    ws_bytes: usize,
    _stream: *mut c_void,
) -> c_int {
    if n_items < 0 || max_keep < 0 || (n_items > 0 && items.is_null()) {
        return INVALID;
    }
    if n_items == 0 {
        return 0;
    }
    // SAFETY: the caller keeps kvevict_cuda.h's contract (`items` holds `n_items`
    // descriptors; each list and tensor the extents it declares; host memory under the mock).
    unsafe {
        let items = core::slice::from_raw_parts(items, n_items as usize);
        let mut any = false;
        for it in items {
            let Some(xd) = view_ok(&it.x) else {
                return INVALID;
            };
            if it.kept_ld < 0 {
                return INVALID;
            }
            let mk = max_keep.min(xd.tokens);
            if xd.heads == 0 || xd.dim == 0 || mk == 0 {
                continue;
            }
            if it.kept.is_null() || it.counts.is_null() || (it.kept_ld != 0 && it.kept_ld < mk) {
                return INVALID;
            }
            let heads = xd.heads as usize;
            if !lists_in_range(it.kept, it.kept_ld, it.counts, heads, mk, xd.tokens) {
                return INVALID;
            }
            any = true;
        }
        if !any {
            return 0;
        }
        let need = kve_cuda_compact_batch_workspace_size(items.as_ptr(), n_items, max_keep);
        if ws.is_null() || ws_bytes < need || (ws as usize) % 16 != 0 {
            return INVALID;
        }
        scribble(ws, need);
        for it in items {
            let b = item_bytes(it, max_keep);
            if b == 0 {
                continue;
            }
            // checked above: each succeeds (its staging is its own; the mock needs none)
            let rc = kve_cuda_compact(
                &it.x, it.kept, it.kept_ld, it.counts, max_keep, ws, b, _stream,
            );
            debug_assert_eq!(rc, 0);
        }
        0
    }
}

pub unsafe fn kve_cuda_compact_varlen(
    src: *const KveCudaView,
    kept: *const i32,
    kept_ld: i64,
    counts: *const i32,
    dst: *mut c_void,
    cu_seqlens: *mut i32,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (each non-null pointer
    // covers the extents it passes; host memory under the mock), and the checks below reject null
    // and out-of-range arguments before the first access.
    unsafe {
        let Some(sd) = view_ok(src) else {
            return INVALID;
        };
        if kept_ld < 0 {
            return INVALID;
        }
        if sd.heads == 0 {
            return 0;
        }
        if kept.is_null() || counts.is_null() || cu_seqlens.is_null() {
            return INVALID;
        }
        if kept_ld != 0 && kept_ld < sd.tokens {
            return INVALID;
        }
        if sd
            .heads
            .checked_mul(sd.tokens)
            .map_or(true, |e| e >= 1 << 31)
        {
            return INVALID;
        }
        let copies = sd.dim > 0 && sd.tokens > 0;
        if copies && dst.is_null() {
            return INVALID; // refused before anything is written, as the kernel does
        }
        let heads = sd.heads as usize;
        if copies && !lists_in_range(kept, kept_ld, counts, heads, sd.tokens, sd.tokens) {
            return INVALID;
        }
        let mut acc = 0i64;
        *cu_seqlens = 0;
        for h in 0..heads {
            acc += head_count(counts, kept_ld, h, sd.tokens) as i64;
            *cu_seqlens.add(h + 1) = acc as i32;
        }
        if !copies {
            return 0;
        }
        let es = dtype_size(sd.dtype);
        let dim = sd.dim as usize;
        let mut row = 0usize;
        for h in 0..heads {
            let base = if kept_ld != 0 {
                h * kept_ld as usize
            } else {
                0
            };
            for t in 0..head_count(counts, kept_ld, h, sd.tokens) {
                let s = *kept.add(base + t) as usize;
                for d in 0..dim {
                    core::ptr::copy_nonoverlapping(
                        elem_addr(&sd, h, s, d),
                        (dst as *mut u8).add((row * dim + d) * es),
                        es,
                    );
                }
                row += 1;
            }
        }
        0
    }
}

// ---------------------------------------------------------------- baselines --

pub unsafe fn kve_cuda_knorm(
    k: *const KveCudaView,
    prefix: i64,
    out: *mut f32,
    ld_out: i64,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (each non-null pointer
    // covers the extents it passes; host memory under the mock), and the checks below reject null
    // and out-of-range arguments before the first access.
    unsafe {
        let Some(kd) = view_ok(k) else {
            return INVALID;
        };
        if prefix < 0 || prefix > kd.tokens || kd.heads > 65535 {
            return INVALID;
        }
        if prefix == 0 || kd.heads == 0 {
            return 0;
        }
        if out.is_null() || ld_out < prefix {
            return INVALID;
        }
        for h in 0..kd.heads as usize {
            for i in 0..prefix as usize {
                // the core's knorm: f32 sums of squares in its lane order (crate::lanes:
                // lane d % 16 by FMA, then the halving tree), then -sqrt
                let mut s = [0f32; 16];
                for d in 0..kd.dim as usize {
                    let x = get(&kd, h, i, d);
                    s[d % 16] = crate::lanes::fma1(x, x, s[d % 16]);
                }
                *out.add(h * ld_out as usize + i) = -libm::sqrtf(crate::lanes::tree16(s));
            }
        }
        0
    }
}

pub unsafe fn kve_cuda_score_power(
    scores: *mut f32,
    rows: i64,
    n: i64,
    ld: i64,
    power: c_int,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (`scores` covers
    // `rows` rows of `ld`, host memory under the mock); the checks below reject null and
    // out-of-range arguments before the first access.
    unsafe {
        if rows < 0 || n < 0 || !(1..=crate::config::MAX_SCORE_POWER as c_int).contains(&power) {
            return INVALID;
        }
        if rows == 0 || n == 0 {
            return 0;
        }
        if scores.is_null() || ld < n {
            return INVALID;
        }
        for r in 0..rows as usize {
            let row = core::slice::from_raw_parts_mut(scores.add(r * ld as usize), n as usize);
            crate::score::power::raise(power as u32, row);
        }
        0
    }
}

pub unsafe fn kve_cuda_sink_scores(
    out: *mut f32,
    rows: i64,
    n: i64,
    ld: i64,
    sinks: i64,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (each non-null pointer
    // covers the extents it passes; host memory under the mock), and the checks below reject null
    // and out-of-range arguments before the first access.
    unsafe {
        if rows < 0 || n < 0 {
            return INVALID;
        }
        if rows == 0 || n == 0 {
            return 0;
        }
        if out.is_null() || ld < n {
            return INVALID;
        }
        for r in 0..rows as usize {
            for i in 0..n as usize {
                *out.add(r * ld as usize + i) = if (i as i64) < sinks { 1.0 } else { 0.0 };
            }
        }
        0
    }
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn kve_cuda_critical_combine(
    base: *const f32,
    ld_base: i64,
    value_l1: *const f32,
    ld_l1: i64,
    counts: *const i32,
    idx: *const i32,
    idx_ld: i64,
    rows: i64,
    n: i64,
    out: *mut f32,
    ld_out: i64,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (each non-null pointer
    // covers the extents it passes; host memory under the mock), and the checks below reject null
    // and out-of-range arguments before the first access.
    unsafe {
        if rows < 0 || n < 0 {
            return INVALID;
        }
        if rows == 0 || n == 0 {
            return 0;
        }
        if base.is_null()
            || value_l1.is_null()
            || out.is_null()
            || counts.is_null()
            || idx.is_null()
        {
            return INVALID;
        }
        if ld_base < n || ld_l1 < n || ld_out < n || idx_ld < 0 {
            return INVALID;
        }
        // in place only element for element
        if (core::ptr::eq(out, base) && ld_out != ld_base) || core::ptr::eq(out, value_l1) {
            return INVALID;
        }
        let (rows, n) = (rows as usize, n as usize);
        let (lb, ll, lo, li) = (
            ld_base as usize,
            ld_l1 as usize,
            ld_out as usize,
            idx_ld as usize,
        );
        for r in 0..rows {
            for i in 0..n {
                // the core's criticalkv: (s + 1e-4) · l1 (f32)
                let s = *base.add(r * lb + i);
                *out.add(r * lo + i) = (s + 1e-4) * *value_l1.add(r * ll + i);
            }
            // the first-stage list (the kernel's min(count, n); positions outside the row
            // are skipped)
            let c = (*counts.add(r) as i64).min(n as i64);
            for t in 0..c.max(0) as usize {
                let i = *idx.add(r * li + t) as i64;
                if (0..n as i64).contains(&i) {
                    *out.add(r * lo + i as usize) = f32::MAX;
                }
            }
        }
        0
    }
}

// ------------------------------------------------------------------ budgets --

#[allow(clippy::too_many_arguments)]
pub unsafe fn kve_cuda_layer_budgets(
    mode: c_int,
    weights: *const f64,
    layers: i64,
    per_layer: i64,
    p: i64,
    budget: u64,
    beta: u32,
    alpha: f32,
    k_layer: *mut i64,
    k_unit: *mut i64,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (each non-null pointer
    // covers the extents it passes; host memory under the mock), and the checks below reject null
    // and out-of-range arguments before the first access.
    unsafe {
        if !(KVE_CUDA_BUDGET_UNIFORM..=KVE_CUDA_BUDGET_LAVA).contains(&mode) {
            return INVALID;
        }
        if layers < 0 || per_layer < 1 || p < 0 {
            return INVALID;
        }
        // layers·per_layer·p < 2^62 (and layers·per_layer): every budget, cap and total fits
        let units = layers as u128 * per_layer as u128;
        if units * p as u128 >= 1 << 62 || units >= 1 << 62 {
            return INVALID;
        }
        // the core's SelectConfig::validate: beta >= 1 (a divisor), 0 <= alpha <= 1
        if mode == KVE_CUDA_BUDGET_PYRAMID && beta == 0 {
            return INVALID;
        }
        if (mode == KVE_CUDA_BUDGET_ADA || mode == KVE_CUDA_BUDGET_LAVA)
            && !(0.0..=1.0).contains(&alpha)
        {
            return INVALID;
        }
        if layers == 0 {
            return 0;
        }
        if k_layer.is_null() || (mode == KVE_CUDA_BUDGET_LAVA && weights.is_null()) {
            return INVALID;
        }
        let (nl, upl, pu) = (layers as usize, per_layer as usize, p as u64);
        let b = budget.min(pu);
        let mut kl = vec![0u64; nl];
        let mut ku = vec![0u64; nl];
        // the core's ada.rs safeguard: floor(alpha · (total / per_layer))
        let floor = |total: u64| libm::floor((alpha as f64) * (total as f64 / upl as f64)) as u64;
        match mode {
            KVE_CUDA_BUDGET_UNIFORM | KVE_CUDA_BUDGET_PYRAMID => {
                for l in 0..nl {
                    let bl = if mode == KVE_CUDA_BUDGET_PYRAMID {
                        crate::budget::pyramid_budget(budget, beta, l, nl).min(pu)
                    } else {
                        b
                    };
                    kl[l] = upl as u64 * bl;
                    ku[l] = bl;
                }
            }
            _ => {
                if mode == KVE_CUDA_BUDGET_LAVA {
                    let w: Vec<f64> = (0..nl).map(|l| *weights.add(l)).collect();
                    let caps = vec![upl as u64 * pu; nl];
                    let total = ((nl * upl) as u64).saturating_mul(b);
                    let mut marks = vec![0u8; nl];
                    crate::budget::lava_budgets(&w, total, &caps, &mut kl, &mut marks);
                } else {
                    kl.fill(upl as u64 * b);
                }
                for l in 0..nl {
                    ku[l] = floor(kl[l]);
                }
            }
        }
        for l in 0..nl {
            *k_layer.add(l) = kl[l] as i64;
            if !k_unit.is_null() {
                for u in l * upl..(l + 1) * upl {
                    *k_unit.add(u) = ku[l] as i64;
                }
            }
        }
        0
    }
}

pub unsafe fn kve_cuda_mark_forced(
    scores: *mut f32,
    ld: i64,
    rows: i64,
    counts: *const i32,
    idx: *const i32,
    idx_ld: i64,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (each non-null pointer
    // covers the extents it passes; host memory under the mock), and the checks below reject null
    // and out-of-range arguments before the first access.
    unsafe {
        if rows < 0 || ld < 0 || idx_ld < 0 {
            return INVALID;
        }
        if rows == 0 || ld == 0 {
            return 0;
        }
        if scores.is_null() || counts.is_null() || idx.is_null() {
            return INVALID;
        }
        let (ldu, li) = (ld as usize, idx_ld as usize);
        for r in 0..rows as usize {
            for t in 0..(*counts.add(r)).max(0) as usize {
                // positions outside [0, ld) are skipped, as the kernel does
                let i = *idx.add(r * li + t) as i64;
                if (0..ld).contains(&i) {
                    *scores.add(r * ldu + i as usize) = f32::INFINITY;
                }
            }
        }
        0
    }
}

#[allow(clippy::too_many_arguments)]
/// `append_range`: the window positions after each row's chosen prefix.
pub unsafe fn kve_cuda_append_range(
    counts: *mut i32,
    idx: *mut i32,
    idx_ld: i64,
    rows: i64,
    start: i64,
    count: i64,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (each non-null pointer
    // covers the extents it passes; host memory under the mock), and the checks below reject null
    // and out-of-range arguments before the first access.
    unsafe {
        if rows < 0 || idx_ld < 0 || start < 0 || count < 0 {
            return INVALID;
        }
        if rows == 0 || count == 0 {
            return 0;
        }
        if start + count > (1i64 << 31) - 1 || count > idx_ld {
            return INVALID;
        }
        if counts.is_null() || idx.is_null() {
            return INVALID;
        }
        for r in 0..rows as usize {
            let c = *counts.add(r) as i64;
            for t in 0..count {
                if c + t < idx_ld {
                    *idx.add(r * idx_ld as usize + (c + t) as usize) = (start + t) as i32;
                }
            }
            *counts.add(r) = (c + count) as i32;
        }
        0
    }
}

pub unsafe fn kve_cuda_broadcast_lists(
    src_counts: *const i32,
    src_idx: *const i32,
    src_ld: i64,
    src_rows: i64,
    reps: i64,
    counts: *mut i32,
    idx: *mut i32,
    idx_ld: i64,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (each non-null pointer
    // covers the extents it passes; host memory under the mock), and the checks below reject null
    // and out-of-range arguments before the first access.
    unsafe {
        if src_rows < 0 || reps < 0 || src_ld < 0 || idx_ld < 0 {
            return INVALID;
        }
        if src_rows == 0 || reps == 0 {
            return 0;
        }
        if src_rows as u128 * reps as u128 >= 1 << 62 {
            return INVALID;
        }
        if src_counts.is_null() || src_idx.is_null() || counts.is_null() || idx.is_null() {
            return INVALID;
        }
        // the kernel's alias checks: no output array is a source array
        let outs = [counts as usize, idx as usize];
        if outs.contains(&(src_counts as usize)) || outs.contains(&(src_idx as usize)) {
            return INVALID;
        }
        let (rows, reps) = (src_rows as usize, reps as usize);
        let (ls, li) = (src_ld as usize, idx_ld as usize);
        for r in 0..rows {
            let c = *src_counts.add(r);
            for j in 0..reps {
                let u = r * reps + j;
                *counts.add(u) = c;
                for t in 0..c.max(0) as usize {
                    *idx.add(u * li + t) = *src_idx.add(r * ls + t);
                }
            }
        }
        0
    }
}

// ------------------------------------------------------------------- stream --

/// The kernel's formula: row max and `1/sum` per row, each 256-byte aligned.
pub unsafe fn kve_cuda_stream_feed_workspace_size(hq: i64, c: i64) -> usize {
    if hq <= 0 || c <= 0 {
        return 0;
    }
    hq.checked_mul(c)
        .and_then(|r| (r as u64).checked_mul(4))
        .and_then(|b| b.checked_add(255))
        .map(|b| b / 256 * 256 * 2)
        .and_then(|b| usize::try_from(b).ok())
        .unwrap_or(usize::MAX)
}

/// The core's `stream::accumulate` on the accumulators. Stricter than the kernels, which
/// read the positions on the device: negative or decreasing positions are rejected here.
/// NaN/Inf in Q or the visible keys (undetected by the kernels) give NaN accumulators.
#[allow(clippy::too_many_arguments)]
pub unsafe fn kve_cuda_stream_feed(
    q: *const KveCudaView,
    positions: *const i64,
    k: *const KveCudaView,
    row_lse: *const f32,
    acc_max: *mut f32,
    acc_sum: *mut f32,
    acc_sq: *mut f32,
    ws: *mut c_void,
    ws_bytes: usize,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (each non-null pointer
    // covers the extents it passes; host memory under the mock), and the checks below reject null
    // and out-of-range arguments before the first access.
    unsafe {
        let (Some(qd), Some(kd)) = (view_ok(q), view_ok(k)) else {
            return INVALID;
        };
        let (hq, hkv, n, dk, c) = (qd.heads, kd.heads, kd.tokens, kd.dim, qd.tokens);
        if qd.dtype != kd.dtype || hkv <= 0 || hq <= 0 || hq % hkv != 0 || c <= 0 || n <= 0 {
            return INVALID;
        }
        if qd.dim != dk || !(1..=256).contains(&dk) || hq > 65535 || hkv > 65535 {
            return INVALID;
        }
        if positions.is_null() || acc_max.is_null() || acc_sum.is_null() || acc_sq.is_null() {
            return INVALID;
        }
        let need = kve_cuda_stream_feed_workspace_size(hq, c);
        if ws.is_null() || ws_bytes < need {
            return INVALID;
        }
        let (hq, hkv, n, dk, c) = (
            hq as usize,
            hkv as usize,
            n as usize,
            dk as usize,
            c as usize,
        );
        let pos = core::slice::from_raw_parts(positions, c);
        if pos.iter().any(|&p| p < 0) || pos.windows(2).any(|w| w[1] < w[0]) {
            return INVALID;
        }
        let (Some(qv), Some(kv)) = (core_view(&qd), core_view(&kd)) else {
            return INVALID;
        };
        scribble(ws, need);
        let lim: Vec<u64> = pos.iter().map(|&p| (p as u64).min(n as u64 - 1)).collect();
        let lse = (!row_lse.is_null()).then(|| core::slice::from_raw_parts(row_lse, hq * c));
        let Ok(bytes) = crate::stream::accumulate_workspace_size(hq, hq / hkv, c, dk) else {
            return INVALID;
        };
        let mut scratch = vec![0u8; bytes];
        let hn = hq * n;
        let (mx, sm, sq) = (
            core::slice::from_raw_parts_mut(acc_max, hn),
            core::slice::from_raw_parts_mut(acc_sum, hn),
            core::slice::from_raw_parts_mut(acc_sq, hn),
        );
        if crate::stream::accumulate(&qv, &lim, &kv, lse, mx, sm, sq, &mut scratch).is_err() {
            // NaN/Inf in Q or K: the kernels do not detect it; their sums become NaN
            for h in 0..hq {
                for i in 0..=lim[c - 1] as usize {
                    sm[h * n + i] = f32::NAN;
                    sq[h * n + i] = f32::NAN;
                }
            }
        }
        0
    }
}
