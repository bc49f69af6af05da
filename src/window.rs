//! The one window-attention pass every query-aware scorer shares (SPEC §2).
//!
//! For one KV group (`g` query heads reading KV head `kh`) it computes, for each prefix
//! token `i < P = N - w`, column statistics of the softmax attention of the `w` window
//! queries: `Σ_j A[h,j,i]`, optionally `Σ_j A[h,j,i]²` and the cross products
//! `Σ_j A[a,j,i]·A[b,j,i]` of the group's heads. Softmax is over every visible key
//! (causal inside the window), in f32 with max subtraction; the per-row denominators are
//! accumulated over chunks in f64 because a row can have up to 2^31 terms.
//! Two passes over K: row max/denominator, then statistics. Nothing of size `[w, N]` is
//! ever stored, so the workspace stays independent of N apart from the outputs.
//!
//! Per chunk of keys, the logits of all `g·w` window rows come out key-major with the rows
//! in vector lanes (`c[t][row]`): a 6-key × 16-row FMA micro-tile broadcasts key elements
//! against packed query panels, so keys need no transpose (f32 rows are read in place, f16
//! rows converted 8 at a time). Pass 1 then takes per-lane maxima and exp-sums down the
//! chunk; pass 2 forms the probabilities and sums each head's rows per key. Both passes
//! compute identical logits (same kernel, same order), so `z - max <= 0` holds exactly.

use crate::error::{Error, Result};
use crate::numerics::{all_finite, dispatch, dot_v, exp_neg, sum_v, Simd};
use crate::view::{load_rows, DType, View};
use crate::workspace::{Workspace, WorkspaceSize};

/// Keys per micro-tile of the Q·Kᵀ kernel.
const KT: usize = 6;
/// Keys per chunk (a multiple of [`KT`]).
pub(crate) const CHUNK: usize = 96;

/// Which statistics a scorer needs.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Needs {
    pub sum: bool,
    pub sq: bool,
    pub cross: bool,
}

/// Per-group outputs, each `[rows][P]` row-major; `cross` rows are pairs `a < b` in order.
pub(crate) struct Stats<'s> {
    pub sum: &'s mut [f32],
    pub sq: &'s mut [f32],
    pub cross: &'s mut [f32],
}

pub(crate) fn pairs(g: usize) -> usize {
    g * (g - 1) / 2
}

/// Window rows of a group (`g·w`) rounded up to whole vectors.
fn padded_rows(rows: usize) -> Result<usize> {
    rows.checked_add(7).map(|r| r & !7).ok_or(Error::Overflow)
}

/// Scratch bytes for one group pass (outputs excluded).
pub(crate) fn scratch_size(ws: &mut WorkspaceSize, g: usize, w: usize, dk: usize) -> Result<()> {
    let rows = padded_rows(g.checked_mul(w).ok_or(Error::Overflow)?)?;
    ws.add::<f32>(rows.checked_mul(dk).ok_or(Error::Overflow)?)?; // packed queries
    ws.add::<f32>(dk.checked_mul(CHUNK).ok_or(Error::Overflow)?)?; // key chunk
    ws.add::<f32>(rows.checked_mul(CHUNK).ok_or(Error::Overflow)?)?; // logits
    ws.add::<f32>(rows)?; // row max
    ws.add::<f32>(rows)?; // 1 / row denominator
    Ok(())
}

/// Scratch slices of one group pass.
///
/// `q` holds the window queries (pre-scaled by 1/sqrt(dk)) packed for the kernel: panels of
/// 16 rows `[d][16]`, then, when `rows_pad % 16 == 8`, one panel of 8 rows `[d][8]`.
/// `c` holds a chunk's logits key-major: `c[t][rows_pad]`, so that the rows of one key are
/// contiguous (vector lanes run over window rows).
struct Scratch<'s> {
    q: &'s mut [f32],
    k: &'s mut [f32],
    c: &'s mut [f32],
    m: &'s mut [f32],
    inv: &'s mut [f32],
    rows: usize,
    rows_pad: usize,
    dk: usize,
}

/// Carve scratch and load the group's window queries, pre-scaled by 1/sqrt(dk).
fn load_queries<'s>(
    queries: &View,
    kh: usize,
    g: usize,
    w: usize,
    dk: usize,
    scratch: &'s mut [u8],
) -> Result<Scratch<'s>> {
    let mut ws = Workspace::new(scratch);
    let rows = g * w;
    let rows_pad = padded_rows(rows)?;
    let s = Scratch {
        q: ws.take::<f32>(rows_pad * dk)?,
        k: ws.take::<f32>(dk * CHUNK)?,
        c: ws.take::<f32>(rows_pad * CHUNK)?,
        m: ws.take::<f32>(rows_pad)?,
        inv: ws.take::<f32>(rows_pad)?,
        rows,
        rows_pad,
        dk,
    };
    let wq = queries.extent()[1];
    let scale = 1.0 / libm::sqrtf(dk as f32);
    let full = rows_pad / 16 * 16;
    for a in 0..g {
        for j in 0..w {
            let r = a * w + j;
            // one row through the key chunk buffer (free at this point)
            let row = &mut s.k[..dk];
            queries.load_row(kh * g + a, wq - w + j, row);
            let (base, width, lane) = if r < full {
                (r / 16 * 16 * dk, 16, r % 16)
            } else {
                (full * dk, 8, r - full)
            };
            for (d, &v) in row.iter().enumerate() {
                if !v.is_finite() {
                    return Err(Error::NonFinite);
                }
                s.q[base + d * width + lane] = v * scale;
            }
        }
    }
    Ok(s)
}

/// Keys `c0 .. c0+ntp` of KV head `kh` as f32 rows for the kernel: straight from the view
/// when it holds f32 rows with unit element stride and the chunk is whole tiles, else
/// converted into `k[t][dk]` with zero rows from `nt` to `ntp`. Returns the first row and the
/// row stride, and (with `check`) whether every key element is finite.
#[inline(always)]
fn load_keys<S: Simd>(
    keys: &View,
    kh: usize,
    c0: usize,
    nt: usize,
    ntp: usize,
    k: &mut [f32],
    check: bool,
) -> (*const f32, usize, bool) {
    let dk = keys.extent()[2];
    let st = keys.stride();
    if keys.dtype() == DType::F32 && st[2] == 1 && nt == ntp {
        assert!(kh < keys.extent()[0] && c0 + nt <= keys.extent()[1]);
        // SAFETY: rows (kh, c0..c0+nt, 0..dk) are inside the view's extent, which the view
        // proved in bounds at construction; `byte_range` gives back its pointer.
        let base = unsafe { (keys.byte_range().0 as *const f32).add(kh * st[0] + c0 * st[1]) };
        let finite = !check
            || if st[1] == dk {
                // dense rows: one sweep over the chunk
                all_finite::<S>(unsafe { core::slice::from_raw_parts(base, nt * dk) })
            } else {
                (0..nt).all(|t| {
                    let row = unsafe { core::slice::from_raw_parts(base.add(t * st[1]), dk) };
                    all_finite::<S>(row)
                })
            };
        return (base, st[1], finite);
    }
    let k = &mut k[..ntp * dk];
    load_rows::<S>(keys, kh, c0, nt, k);
    k[nt * dk..].fill(0.0);
    (k.as_ptr(), dk, !check || all_finite::<S>(&k[..nt * dk]))
}

/// `c[t][r0..r0+16] = Σ_d k[t][d]·q[d][0..16]` for `KT` keys.
#[inline(always)]
unsafe fn tile16<S: Simd>(
    k: *const f32,
    ldk: usize,
    dk: usize,
    q: *const f32,
    c: *mut f32,
    ldc: usize,
) {
    let mut acc = [[S::zero(); 2]; KT];
    for d in 0..dk {
        let q0 = S::load(q.add(d * 16));
        let q1 = S::load(q.add(d * 16 + 8));
        for i in 0..KT {
            let b = S::splat(*k.add(i * ldk + d));
            acc[i][0] = S::fma(b, q0, acc[i][0]);
            acc[i][1] = S::fma(b, q1, acc[i][1]);
        }
    }
    for i in 0..KT {
        S::store(c.add(i * ldc), acc[i][0]);
        S::store(c.add(i * ldc + 8), acc[i][1]);
    }
}

/// The 8-row panel of [`tile16`] (the same arithmetic per logit).
#[inline(always)]
unsafe fn tile8<S: Simd>(
    k: *const f32,
    ldk: usize,
    dk: usize,
    q: *const f32,
    c: *mut f32,
    ldc: usize,
) {
    let mut acc = [S::zero(); KT];
    for d in 0..dk {
        let q0 = S::load(q.add(d * 8));
        for i in 0..KT {
            acc[i] = S::fma(S::splat(*k.add(i * ldk + d)), q0, acc[i]);
        }
    }
    for i in 0..KT {
        S::store(c.add(i * ldc), acc[i]);
    }
}

/// Logits of one chunk: `c[t][r] = k[t]·q[r]` for `t < ntp` (a multiple of KT), every row;
/// key row `t` at `k + t·ldk`.
///
/// # Safety
/// `k` must point to `ntp` readable rows of `dk` floats, `ldk` apart.
#[inline(always)]
unsafe fn gemm<S: Simd>(s: &mut Scratch, k: *const f32, ldk: usize, ntp: usize) {
    let (dk, rp) = (s.dk, s.rows_pad);
    assert!(ntp % KT == 0 && s.c.len() >= ntp * rp);
    assert!(s.q.len() >= rp * dk && rp % 8 == 0);
    let full = rp / 16 * 16;
    let (q, c) = (s.q.as_ptr(), s.c.as_mut_ptr());
    // every q and c access is inside the slices checked above
    let mut r0 = 0;
    while r0 < full {
        let qp = q.add(r0 * dk);
        let mut t0 = 0;
        while t0 < ntp {
            tile16::<S>(k.add(t0 * ldk), ldk, dk, qp, c.add(t0 * rp + r0), rp);
            t0 += KT;
        }
        r0 += 16;
    }
    if full < rp {
        let qp = q.add(full * dk);
        let mut t0 = 0;
        while t0 < ntp {
            tile8::<S>(k.add(t0 * ldk), ldk, dk, qp, c.add(t0 * rp + full), rp);
            t0 += KT;
        }
    }
}

/// Pass 1 for KV group `kh`: running max `rmax[g*w]` and denominator `rsum[g*w]` of every
/// window row over its visible keys. `queries` is `[Hq, wq, dk]` with `wq >= w` (the last
/// `w` rows are the window), `keys` is `[Hkv, N, dk]`, `1 <= w <= N`. Rejects NaN/Inf in
/// the group's queries and in every key of the head.
pub(crate) fn row_stats(
    queries: &View,
    keys: &View,
    kh: usize,
    g: usize,
    w: usize,
    scratch: &mut [u8],
    rmax: &mut [f32],
    rsum: &mut [f64],
) -> Result<()> {
    let dk = keys.extent()[2];
    let s = &mut load_queries(queries, kh, g, w, dk, scratch)?;
    dispatch!(fn(keys: &View, kh: usize, g: usize, w: usize, s: &mut Scratch,
                 rmax: &mut [f32], rsum: &mut [f64]) -> Result<()>, S => {
        row_stats_impl::<S>(keys, kh, g, w, s, rmax, rsum)
    })
}

#[inline(always)]
fn row_stats_impl<S: Simd>(
    keys: &View,
    kh: usize,
    g: usize,
    w: usize,
    s: &mut Scratch,
    rmax: &mut [f32],
    rsum: &mut [f64],
) -> Result<()> {
    let n = keys.extent()[1];
    let p = n - w;
    let (rows, rp) = (s.rows, s.rows_pad);
    let rmax = &mut rmax[..rows];
    let rsum = &mut rsum[..rows];
    rmax.fill(f32::NEG_INFINITY);
    rsum.fill(0.0);
    let mut c0 = 0;
    while c0 < n {
        let nt = CHUNK.min(n - c0);
        let ntp = nt.div_ceil(KT) * KT;
        let (kp, ldk, finite) = load_keys::<S>(keys, kh, c0, nt, ntp, s.k, true);
        if !finite {
            return Err(Error::NonFinite);
        }
        // SAFETY: load_keys returns ntp rows of dk floats, ldk apart.
        unsafe { gemm::<S>(s, kp, ldk, ntp) };
        let c = &mut s.c[..ntp * rp];
        // causal mask: query j (position p + j) sees keys i <= p + j
        for t in p.saturating_sub(c0)..nt {
            let hide = (c0 + t - p).min(w);
            for a in 0..g {
                c[t * rp + a * w..t * rp + a * w + hide].fill(f32::NEG_INFINITY);
            }
        }
        let mut r0 = 0;
        while r0 < rows {
            let mut m = [0f32; 8];
            let mut cs = [0f32; 8];
            // SAFETY: r0 + 8 <= rp and t < nt <= ntp: inside `c`.
            unsafe {
                let cp = c.as_ptr().add(r0);
                let mut cm = S::splat(f32::NEG_INFINITY);
                for t in 0..nt {
                    cm = S::max(cm, S::load(cp.add(t * rp)));
                }
                let mv = S::max(S::load(s.m.as_ptr().add(r0)), cm);
                let mut acc = S::zero();
                for t in 0..nt {
                    acc = S::add(acc, S::exp_neg(S::sub(S::load(cp.add(t * rp)), mv)));
                }
                S::store(m.as_mut_ptr(), mv);
                S::store(cs.as_mut_ptr(), acc);
            }
            for l in 0..8.min(rows - r0) {
                let r = r0 + l;
                let (m_old, m_new) = (rmax[r], m[l]);
                if !m_new.is_finite() {
                    return Err(Error::NonFinite);
                }
                let rescale = if m_old == f32::NEG_INFINITY {
                    0.0
                } else {
                    exp_neg(m_old - m_new) as f64
                };
                rsum[r] = rsum[r] * rescale + cs[l] as f64;
                rmax[r] = m_new;
                s.m[r] = m_new;
            }
            r0 += 8;
        }
        c0 += nt;
    }
    if rsum.iter().any(|s| !s.is_finite() || *s <= 0.0) {
        return Err(Error::NonFinite);
    }
    Ok(())
}

/// What pass 1 checks, without its arithmetic, for callers that give the row statistics
/// (`LayerInputs::row_lse`): rejects NaN/Inf in the group's window queries and in every key
/// of KV head `kh`.
pub(crate) fn check_finite(
    queries: &View,
    keys: &View,
    kh: usize,
    g: usize,
    w: usize,
    scratch: &mut [u8],
) -> Result<()> {
    let dk = keys.extent()[2];
    let s = &mut load_queries(queries, kh, g, w, dk, scratch)?;
    let [_, n, _] = keys.extent();
    let st = keys.stride();
    if keys.dtype() == DType::F16 && st[2] == 1 {
        // on the bits: an f16 is NaN/Inf iff its exponent is all ones (the largest value
        // `b & 0x7C00` can take), so one max-reduction per row, no conversion
        assert!(kh < keys.extent()[0]);
        let base = keys.byte_range().0 as *const u16;
        for t in 0..n {
            // SAFETY: row (kh, t, 0..dk) is inside the view's extent, which the view proved
            // in bounds at construction; `byte_range` gives back its pointer.
            let row = unsafe { core::slice::from_raw_parts(base.add(kh * st[0] + t * st[1]), dk) };
            if row.iter().fold(0u16, |m, &b| m.max(b & 0x7C00)) == 0x7C00 {
                return Err(Error::NonFinite);
            }
        }
        return Ok(());
    }
    dispatch!(fn(keys: &View, kh: usize, s: &mut Scratch) -> Result<()>, S => {
        let n = keys.extent()[1];
        let mut c0 = 0;
        while c0 < n {
            let nt = CHUNK.min(n - c0);
            let (_, _, finite) = load_keys::<S>(keys, kh, c0, nt, nt, s.k, true);
            if !finite {
                return Err(Error::NonFinite);
            }
            c0 += nt;
        }
        Ok(())
    })
}

/// Pass 2 for KV group `kh`: statistics of the prefix columns, added into `out`
/// (each `[g or pairs][P]`, zeroed by the caller). Uses the row statistics of pass 1.
pub(crate) fn column_stats(
    queries: &View,
    keys: &View,
    kh: usize,
    g: usize,
    w: usize,
    rmax: &[f32],
    rsum: &[f64],
    needs: Needs,
    scratch: &mut [u8],
    out: &mut Stats,
) -> Result<()> {
    let dk = keys.extent()[2];
    let s = &mut load_queries(queries, kh, g, w, dk, scratch)?;
    for r in 0..s.rows {
        s.m[r] = rmax[r];
        s.inv[r] = (1.0 / rsum[r]) as f32;
    }
    dispatch!(fn(keys: &View, kh: usize, g: usize, w: usize, needs: Needs, s: &mut Scratch,
                 out: &mut Stats) -> (), S => {
        column_stats_impl::<S>(keys, kh, g, w, needs, s, out)
    });
    Ok(())
}

#[inline(always)]
fn column_stats_impl<S: Simd>(
    keys: &View,
    kh: usize,
    g: usize,
    w: usize,
    needs: Needs,
    s: &mut Scratch,
    out: &mut Stats,
) {
    let n = keys.extent()[1];
    let p = n - w;
    let rp = s.rows_pad;
    let mut c0 = 0;
    while c0 < p {
        let nt = CHUNK.min(p - c0);
        let ntp = nt.div_ceil(KT) * KT;
        let (kp, ldk, _) = load_keys::<S>(keys, kh, c0, nt, ntp, s.k, false);
        // SAFETY: load_keys returns ntp rows of dk floats, ldk apart.
        unsafe { gemm::<S>(s, kp, ldk, ntp) };
        let c = &mut s.c[..ntp * rp];
        // probabilities in place (padding rows have inv = 0)
        for t in 0..nt {
            let mut r0 = 0;
            while r0 < rp {
                // SAFETY: r0 + 8 <= rp, t < ntp.
                unsafe {
                    let cp = c.as_mut_ptr().add(t * rp + r0);
                    // z <= 0 exactly with pass 1's maxima; the clamp bounds p by 1/denominator
                    // when the caller gave `row_lse` (its logits may round differently)
                    let z = S::min(
                        S::sub(S::load(cp), S::load(s.m.as_ptr().add(r0))),
                        S::zero(),
                    );
                    S::store(cp, S::mul(S::exp_neg(z), S::load(s.inv.as_ptr().add(r0))));
                }
                r0 += 8;
            }
        }
        for t in 0..nt {
            let row = &c[t * rp..t * rp + g * w];
            for a in 0..g {
                let pa = &row[a * w..(a + 1) * w];
                let o = a * p + c0 + t;
                // SAFETY (sum_v, dot_v): plain slice reads.
                if needs.sum {
                    out.sum[o] += unsafe { sum_v::<S>(pa) };
                }
                if needs.sq {
                    out.sq[o] += unsafe { dot_v::<S>(pa, pa) };
                }
            }
            if needs.cross {
                let mut pi = 0;
                for a in 0..g {
                    for b in a + 1..g {
                        let (pa, pb) = (&row[a * w..(a + 1) * w], &row[b * w..(b + 1) * w]);
                        out.cross[pi * p + c0 + t] += unsafe { dot_v::<S>(pa, pb) };
                        pi += 1;
                    }
                }
            }
        }
        c0 += nt;
    }
}
