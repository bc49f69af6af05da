//! StreamingLLM (design §3): sinks score 1, everything else 0; the tie rule (later position
//! first) then keeps the most recent tokens, exactly, at any N.
use crate::config::ScoreConfig;

pub(super) fn score(cfg: &ScoreConfig, dst: &mut [f32]) {
    for (i, v) in dst.iter_mut().enumerate() {
        *v = if i < cfg.sinks as usize { 1.0 } else { 0.0 };
    }
}
