//! LAVa (SPEC §3): `max_{h in group} maxpool(mean_j A[h,j,i]) · max_{k<P} ||V[kh,k]||_1`.
use super::{pooled_mean_attention, Bufs};
use crate::config::{GqaReduce, ScoreConfig};
use crate::error::{Error, Result};
use crate::view::View;

/// `out[kh] = max over prefix tokens of ||V[kh,k]||_1`; rejects NaN/Inf in the prefix values.
pub(super) fn head_factors(
    values: &View,
    p: usize,
    row: &mut [f32],
    out: &mut [f32],
) -> Result<()> {
    let hkv = values.extent()[0];
    for kh in 0..hkv {
        let mut m = 0f32;
        for t in 0..p {
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

pub(super) fn score(
    cfg: &ScoreConfig,
    sum: &mut [f32],
    g: usize,
    w: usize,
    p: usize,
    kh: usize,
    bufs: &mut Bufs,
    dst: &mut [f32],
) {
    let c = bufs.acc[kh];
    pooled_mean_attention(&cfg.pool, GqaReduce::Max, false, sum, g, w, p, bufs, dst);
    for v in dst[..p].iter_mut() {
        *v *= c;
    }
}
