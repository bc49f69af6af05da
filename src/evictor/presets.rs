//! The one preset table: each name the examples, the Python binding, `eval/methods.py` and
//! the llama.cpp fork use, its [`Preset`], the selection it gets when the caller gives
//! none, and what the engine must capture for it. Every integration asks here instead of
//! keeping a copy (issue 26).

use crate::config::{AllocatorKind, Granularity, Preset, ScoreConfig, ScorerKind, SelectConfig};
use crate::error::{Error, Result};
use crate::score::requirements::{requirements, ValueInput};

/// The table, written once: the Rust names and the same names NUL-terminated for C.
macro_rules! presets {
    ($($name:literal => $p:ident),+ $(,)?) => {
        /// Every preset by its name, in `Preset` order (the C `kve_preset_name` indexes it).
        pub const PRESETS: [(&str, Preset); 12] = [$(($name, Preset::$p)),+];
        /// [`PRESETS`]' names NUL-terminated, for C.
        pub(crate) const C_NAMES: [&str; 12] = [$(concat!($name, "\0")),+];
    };
}

presets! {
    "snapkv" => SnapKv,
    "snapkv-kvpress" => SnapKvKvpress,
    "lava" => Lava,
    "laprox" => LaProx,
    "laprox-span" => LaProxSpan,
    "criticalkv" => CriticalKv,
    "streamingllm" => StreamingLlm,
    "knorm" => KNorm,
    "tova" => Tova,
    "uniqueness" => Uniqueness,
    "tova-decay" => TovaDecay,
    "h2o" => H2o,
}
const _: () = {
    let mut i = 0;
    while i < PRESETS.len() {
        assert!(PRESETS[i].1 as usize == i, "PRESETS is in Preset order");
        i += 1;
    }
};

/// The preset called `name` (exact, lower case); unknown names are `BadEnum`.
pub fn preset_from_name(name: &[u8]) -> Result<Preset> {
    PRESETS
        .iter()
        .find(|(n, _)| n.as_bytes() == name)
        .map(|&(_, p)| p)
        .ok_or(Error::BadEnum)
}

/// The name of `p`.
pub const fn preset_name(p: Preset) -> &'static str {
    PRESETS[p as usize].0
}

/// The selection a preset gets by default, `budget` prefix tokens per (layer, KV head):
/// the allocator its paper pairs it with (LAVa's entropy split, LaProx's global one),
/// LaProx-span's token selection for the two token-granular presets, uniform otherwise.
pub const fn default_select(p: Preset, budget: u64) -> SelectConfig {
    match p {
        Preset::Lava => SelectConfig::new(AllocatorKind::Lava, Granularity::Head, budget),
        Preset::LaProx => SelectConfig::new(AllocatorKind::Global, Granularity::Head, budget),
        Preset::LaProxSpan | Preset::Uniqueness => SelectConfig::laprox_span(budget),
        _ => SelectConfig::new(AllocatorKind::Uniform, Granularity::Head, budget),
    }
}

/// The decay of a preset's decode-time score memory (design §3c, `evictor/carry.rs`): under
/// a cell budget ([`super::Budget::Cells`]) a round ranks each cell by its score plus this
/// times the score it had when last kept; 0 = none (every other preset: a round reads only
/// its own window). Tuned on the dev split (eval/decode): TOVA's scoring with 0.3
/// (2026-12-05) beat TOVA, StreamingLLM and `laprox-span` at 128 and 256 cells; 0.5 and
/// more keep too many old cells. H2O's (2026-12-06: the mean attention of the window's
/// queries, the window the ubatch): 0 / 0.3 / 0.5 / 0.65 / 0.8 / 0.95 at 128 cells gave
/// 1.042 / 1.033 / 1.031 / 1.044 / 1.038 / 1.051 × the full cache's perplexity.
pub const fn decode_decay(p: Preset) -> f32 {
    match p {
        Preset::TovaDecay => 0.3,
        Preset::H2o => 0.5,
        _ => 0.0,
    }
}

/// How a method reads the output projection `Wo`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum WoUse {
    /// Not at all.
    None = 0,
    /// Once per layer at setup (LaProx: its Gram blocks are kept, `Wo` may be dropped).
    Once = 1,
    /// With every scoring of a layer (CriticalKV: value norms through `Wo`).
    EveryRound = 2,
}

/// What an engine must capture for a scorer (its row of `score/requirements.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capture {
    /// Window queries (post-RoPE), given per layer or observed into the evictor's ring.
    pub queries: bool,
    /// V of every cached cell.
    pub values: bool,
    pub wo: WoUse,
    /// The window rows' log-sum-exp spares one pass over K (scorers that read queries).
    pub row_lse_helps: bool,
}

/// The inputs `cfg`'s scorer reads.
pub const fn capture(cfg: &ScoreConfig) -> Capture {
    let r = requirements(cfg.scorer);
    Capture {
        queries: r.queries,
        values: !matches!(r.values, ValueInput::None) || r.value_l1,
        wo: match cfg.scorer {
            ScorerKind::LaProx => WoUse::Once,
            ScorerKind::CriticalKv => WoUse::EveryRound,
            _ => WoUse::None,
        },
        row_lse_helps: r.queries,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for (i, &(name, p)) in PRESETS.iter().enumerate() {
            assert_eq!(preset_from_name(name.as_bytes()), Ok(p));
            assert_eq!(preset_name(p), name);
            assert_eq!(Preset::from_u32(i as u32), Ok(p));
        }
        for bad in [&b"SnapKV"[..], b"", b"laprox-span\0", b"lapro"] {
            assert_eq!(preset_from_name(bad), Err(Error::BadEnum));
        }
    }

    #[test]
    fn capture_follows_requirements() {
        let c = |p| capture(&ScoreConfig::preset(p));
        assert_eq!(c(Preset::LaProxSpan).wo, WoUse::Once);
        assert!(c(Preset::LaProx).values && c(Preset::LaProx).queries);
        assert_eq!(c(Preset::CriticalKv).wo, WoUse::EveryRound);
        assert!(c(Preset::CriticalKv).values);
        assert!(!c(Preset::KNorm).queries && !c(Preset::KNorm).values);
        assert!(!c(Preset::Uniqueness).queries && c(Preset::Uniqueness).values);
        assert!(c(Preset::Tova).row_lse_helps && !c(Preset::StreamingLlm).row_lse_helps);
    }
}
