//! AdaKV within a layer (design §4), also LAVa's head budgets: every head first keeps its own
//! top `floor(alpha·B)` (the safeguard), then one top over the layer's remaining scores
//! fills the layer total. Ragged per-head counts.

use super::{Units, NOTHING};
use crate::config::SelectConfig;

/// `budgets[l]`: prefix tokens of layer `l` over all its `per_layer` units. Writes the
/// safeguard thresholds into `forced` and the layer thresholds into `thr`.
#[allow(clippy::too_many_arguments)]
pub(super) fn thresholds(
    cfg: &SelectConfig,
    arr: &[f32],
    p: usize,
    scale: &[f32],
    per_layer: usize,
    budgets: &[u64],
    forced: &mut [u128],
    thr: &mut [u128],
) {
    for (l, &total) in budgets.iter().enumerate() {
        let us = l * per_layer..(l + 1) * per_layer;
        // the floor follows this layer's own average head budget
        let floor = libm::floor((cfg.alpha as f64) * (total as f64 / per_layer as f64)) as u64;
        for u in us.clone() {
            let t = if floor == 0 {
                NOTHING
            } else {
                Units {
                    arr,
                    p,
                    scale,
                    forced: &*forced,
                }
                .top_k(u, floor)
            };
            forced[u] = t;
        }
        let un = Units {
            arr,
            p,
            scale,
            forced: &*forced,
        };
        let t = un.top_k_over(us.clone(), total);
        for u in us {
            thr[u] = t;
        }
    }
}
