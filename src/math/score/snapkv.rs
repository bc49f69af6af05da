//! SnapKV (design §3): pooled mean window attention, reduced over the query group.
use super::{pooled_mean_attention, Bufs, Sums};
use crate::config::ScoreConfig;

pub(super) fn score(cfg: &ScoreConfig, s: Sums, bufs: &mut Bufs, dst: &mut [f32]) {
    pooled_mean_attention(&cfg.pool, cfg.gqa, cfg.reduce_before_pool, s, bufs, dst);
}
