//! LAVa (design §3): `max_{h in group} maxpool(mean_j A[h,j,i]) · max_{k<P} ||V[kh,k]||_1`.
use super::knorm::row_sums;
use super::{pooled_mean_attention, Bufs, Sums};
use crate::config::{GqaReduce, ScoreConfig};
use crate::error::{Error, Result};
use crate::numerics::dispatch;
use crate::view::{DType, View};

/// `out[kh] = max over prefix tokens of ||V[kh,k]||_1`; rejects NaN/Inf in the prefix values.
pub(super) fn head_factors(
    values: &View,
    p: usize,
    row: &mut [f32],
    out: &mut [f32],
) -> Result<()> {
    let [hkv, _, dv] = values.extent();
    let st = values.stride();
    // f32 rows with unit element stride: 8 rows at a time, one per lane (knorm's row sums)
    let lanes = if values.dtype() == DType::F32 && st[2] == 1 {
        p / 8 * 8
    } else {
        0
    };
    for kh in 0..hkv {
        let mut m = 0f32;
        if lanes > 0 {
            // SAFETY: rows (kh, 0..lanes, 0..dv) are inside the view's extent, which the
            // view proved in bounds at construction; `byte_range` gives back its pointer.
            let base = unsafe { (values.byte_range().0 as *const f32).add(kh * st[0]) };
            let (ld, mx) = (st[1], &mut m);
            let ok = dispatch!(fn(base: *const f32, ld: usize, dv: usize, lanes: usize,
                                  mx: &mut f32) -> bool, S => {
                let mut l1 = [0f32; 8];
                let mut t = 0;
                while t < lanes {
                    // SAFETY: rows t .. t+8 (< lanes), each dv floats, ld apart.
                    unsafe { row_sums::<S, 1, true>(base.add(t * ld), ld, dv, &mut l1) };
                    for &v in &l1 {
                        if !v.is_finite() {
                            return false;
                        }
                        *mx = mx.max(v);
                    }
                    t += 8;
                }
                true
            });
            if !ok {
                return Err(Error::NonFinite);
            }
        }
        for t in lanes..p {
            values.load_row(kh, t, row);
            let l1: f32 = row[..values.extent()[2]].iter().map(|x| x.abs()).sum();
            if !l1.is_finite() {
                return Err(Error::NonFinite);
            }
            m = m.max(l1);
        }
        out[kh] = m;
    }
    Ok(())
}

pub(super) fn score(cfg: &ScoreConfig, s: Sums, kh: usize, bufs: &mut Bufs, dst: &mut [f32]) {
    let (c, p) = (bufs.acc[kh], s.p);
    pooled_mean_attention(&cfg.pool, GqaReduce::Max, false, s, bufs, dst);
    for v in dst[..p].iter_mut() {
        *v *= c;
    }
}
