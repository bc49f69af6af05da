//! 1-D pooling along tokens (SPEC §3): avg (pads count as zeros), max (pads are -inf),
//! forward continuation pooling. `src` and `dst` are distinct slices of equal length.

use crate::config::{Pool, PoolKind};

pub fn pool(p: &Pool, src: &[f32], dst: &mut [f32]) {
    let n = src.len();
    let dst = &mut dst[..n];
    let k = p.kernel as usize;
    if p.is_identity() {
        dst.copy_from_slice(src);
        return;
    }
    match p.kind {
        PoolKind::None => dst.copy_from_slice(src),
        PoolKind::Avg => {
            let h = k / 2;
            let inv = 1.0 / k as f32;
            for i in 0..n {
                let lo = i.saturating_sub(h);
                let hi = (i + h + 1).min(n);
                let mut s = 0f32;
                for &v in &src[lo..hi] {
                    s += v;
                }
                dst[i] = s * inv;
            }
        }
        PoolKind::Max => {
            let h = k / 2;
            for i in 0..n {
                let lo = i.saturating_sub(h);
                let hi = (i + h + 1).min(n);
                dst[i] = src[lo..hi]
                    .iter()
                    .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
            }
        }
        PoolKind::Forward => {
            for i in 0..n {
                let mut best = src[i];
                let mut f = 1.0f32;
                for j in 1..k.min(i + 1) {
                    f *= p.decay;
                    let v = f * src[i - j];
                    if v > best {
                        best = v;
                    }
                }
                dst[i] = best;
            }
        }
    }
}

/// [`pool`] over `src[sinks..]` only; the first `sinks` entries are copied as they are, so
/// they lend nothing to their followers (the selection's `post_pool_sinks`).
pub fn pool_past_sinks(p: &Pool, sinks: usize, src: &[f32], dst: &mut [f32]) {
    let s = sinks.min(src.len());
    dst[..s].copy_from_slice(&src[..s]);
    pool(p, &src[s..], &mut dst[s..src.len()]);
}

/// Pool `buf` through `tmp` (same length), leaving the result in `buf`.
pub fn pool_in_place(p: &Pool, buf: &mut [f32], tmp: &mut [f32]) {
    if p.is_identity() {
        return;
    }
    let tmp = &mut tmp[..buf.len()];
    tmp.copy_from_slice(buf);
    pool(p, tmp, buf);
}
