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

use crate::error::{Error, Result};
use crate::numerics::{exp_neg, exp_scale, exp_sub_sum, gemm_qk, max_of, Workspace, WorkspaceSize};
use crate::view::View;

/// Keys per chunk (a multiple of the GEMM column tile).
pub(crate) const CHUNK: usize = 64;

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

/// Scratch bytes for one group pass (outputs excluded).
pub(crate) fn scratch_size(ws: &mut WorkspaceSize, g: usize, w: usize, dk: usize) -> Result<()> {
    let rows = g.checked_mul(w).ok_or(Error::Overflow)?;
    ws.add::<f32>(rows.checked_mul(dk).ok_or(Error::Overflow)?)?; // q
    ws.add::<f32>(dk.checked_mul(CHUNK).ok_or(Error::Overflow)?)?; // kᵀ chunk
    ws.add::<f32>(rows.checked_mul(CHUNK).ok_or(Error::Overflow)?)?; // logits
    ws.add::<f32>(dk)?; // one key row
    Ok(())
}

/// Load keys `c0 .. c0+nt` of KV head `kh` transposed into `kt[d][CHUNK]`, zero padded.
/// Returns false when a key element is NaN or infinite.
fn load_keys_t(
    keys: &View,
    kh: usize,
    c0: usize,
    nt: usize,
    row: &mut [f32],
    kt: &mut [f32],
) -> bool {
    let dk = keys.extent()[2];
    kt[..dk * CHUNK].fill(0.0);
    let mut finite = true;
    for t in 0..nt {
        keys.load_row(kh, c0 + t, row);
        for d in 0..dk {
            finite &= row[d].is_finite();
            kt[d * CHUNK + t] = row[d];
        }
    }
    finite
}

/// Scratch slices of one group pass.
struct Scratch<'s> {
    q: &'s mut [f32],
    kt: &'s mut [f32],
    logits: &'s mut [f32],
    krow: &'s mut [f32],
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
    let s = Scratch {
        q: ws.take::<f32>(rows * dk)?,
        kt: ws.take::<f32>(dk * CHUNK)?,
        logits: ws.take::<f32>(rows * CHUNK)?,
        krow: ws.take::<f32>(dk)?,
    };
    let wq = queries.extent()[1];
    let scale = 1.0 / libm::sqrtf(dk as f32);
    for a in 0..g {
        for j in 0..w {
            let r = a * w + j;
            let q = &mut s.q[r * dk..(r + 1) * dk];
            queries.load_row(kh * g + a, wq - w + j, q);
            for v in q.iter_mut() {
                if !v.is_finite() {
                    return Err(Error::NonFinite);
                }
                *v *= scale;
            }
        }
    }
    Ok(s)
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
    let [_, n, dk] = keys.extent();
    let p = n - w;
    let rows = g * w;
    let s = load_queries(queries, kh, g, w, dk, scratch)?;
    rmax[..rows].fill(f32::NEG_INFINITY);
    rsum[..rows].fill(0.0);
    let mut c0 = 0;
    while c0 < n {
        let nt = CHUNK.min(n - c0);
        if !load_keys_t(keys, kh, c0, nt, s.krow, s.kt) {
            return Err(Error::NonFinite);
        }
        gemm_qk(s.q, s.kt, rows, dk, CHUNK, s.logits);
        for j in 0..w {
            // query j sits at position p + j and sees keys i <= p + j
            let visible = (p + j + 1).saturating_sub(c0).min(nt);
            if visible == 0 {
                continue;
            }
            for a in 0..g {
                let r = a * w + j;
                let l = &mut s.logits[r * CHUNK..r * CHUNK + visible];
                let cm = max_of(l);
                let m_old = rmax[r];
                let m = if cm > m_old { cm } else { m_old };
                if !m.is_finite() {
                    return Err(Error::NonFinite);
                }
                let cs = exp_sub_sum(l, m);
                let rescale = if m_old == f32::NEG_INFINITY {
                    0.0
                } else {
                    exp_neg(m_old - m) as f64
                };
                rsum[r] = rsum[r] * rescale + cs as f64;
                rmax[r] = m;
            }
        }
        c0 += nt;
    }
    if rsum[..rows].iter().any(|s| !s.is_finite() || *s <= 0.0) {
        return Err(Error::NonFinite);
    }
    Ok(())
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
    let [_, n, dk] = keys.extent();
    let p = n - w;
    let rows = g * w;
    let s = load_queries(queries, kh, g, w, dk, scratch)?;
    let logits = s.logits;
    let mut c0 = 0;
    while c0 < p {
        let nt = CHUNK.min(p - c0);
        load_keys_t(keys, kh, c0, nt, s.krow, s.kt);
        gemm_qk(s.q, s.kt, rows, dk, CHUNK, logits);
        for r in 0..rows {
            exp_scale(
                &mut logits[r * CHUNK..r * CHUNK + nt],
                rmax[r],
                (1.0 / rsum[r]) as f32,
            );
        }
        for a in 0..g {
            let base = a * p + c0;
            for j in 0..w {
                let pr = &logits[(a * w + j) * CHUNK..(a * w + j) * CHUNK + nt];
                if needs.sum {
                    for (o, &v) in out.sum[base..base + nt].iter_mut().zip(pr) {
                        *o += v;
                    }
                }
                if needs.sq {
                    for (o, &v) in out.sq[base..base + nt].iter_mut().zip(pr) {
                        *o += v * v;
                    }
                }
            }
        }
        if needs.cross {
            let mut pi = 0;
            for a in 0..g {
                for b in a + 1..g {
                    let base = pi * p + c0;
                    for j in 0..w {
                        let pa = &logits[(a * w + j) * CHUNK..(a * w + j) * CHUNK + nt];
                        let pb = &logits[(b * w + j) * CHUNK..(b * w + j) * CHUNK + nt];
                        for t in 0..nt {
                            out.cross[base + t] += pa[t] * pb[t];
                        }
                    }
                    pi += 1;
                }
            }
        }
        c0 += nt;
    }
    Ok(())
}
