//! CriticalKV (design §3, kvpress `CriticalKVPress`): the base SnapKV score forces its top
//! `critical_first_stage` prefix tokens (score = f32::MAX); the rest are ranked by
//! `(s + 1e-4) · mean_{h in group} ||v Wo_h||_1`.
use super::{snapkv, Bufs, Sums};
use crate::config::ScoreConfig;
use crate::select::{kept, make_key, top_k_threshold};

pub(super) fn score(
    cfg: &ScoreConfig,
    s: Sums,
    value_l1: &[f32],
    bufs: &mut Bufs,
    dst: &mut [f32],
) {
    let p = s.p;
    snapkv::score(cfg, s, bufs, dst);
    let thr = top_k_threshold(&dst[..p], 0, cfg.critical_first_stage as usize);
    for (i, s) in dst[..p].iter_mut().enumerate() {
        *s = if kept(make_key(*s, i as u32, 0, false), thr) {
            f32::MAX
        } else {
            (*s + 1e-4) * value_l1[i]
        };
    }
}
