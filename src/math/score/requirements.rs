//! What each scorer reads and computes, one row per scorer. The host scorer (window
//! statistics, input checks), its workspace size, the device layout and input checks
//! (src/device/score.rs) and `ScoreConfig::needs_*` all read this table, so a new
//! scorer is its formula file, its row here and its launch chain.

use crate::config::ScorerKind;

/// How a scorer reads V.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueInput {
    /// Not at all.
    None,
    /// The values tensor.
    Values,
    /// LaProx: the values with their Gram blocks, or the cached value forms instead.
    ValuesOrForms,
}

/// The inputs and intermediate statistics of one scorer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Requirements {
    /// The window queries (and so the optional `row_lse`): the window attention pass.
    pub queries: bool,
    pub values: ValueInput,
    /// CriticalKV's per-token value norms `value_l1` `[Hkv][N]`.
    pub value_l1: bool,
    /// Window statistic `Σ_j A[h,j,i]` (mean attention) per query head.
    pub attn_sum: bool,
    /// Window statistic `Σ_j A[h,j,i]²` per query head.
    pub attn_sq: bool,
    /// Window statistic `Σ_j A[a,j,i]·A[b,j,i]` over the group's head pairs, when the GQA
    /// mode asks for it (LaProx exact and mean-attn: `ScoreConfig::needs_cross`).
    pub attn_cross: bool,
    /// LAVa: one value factor per KV head (`max_k ||V[kh,k]||_1`).
    pub head_factors: bool,
    /// CriticalKV: a first-stage top-k per head before the value term is combined.
    pub first_stage: bool,
    /// Uniqueness: the unit-normalised K and V rows of one KV head, packed in panels of 16
    /// tokens, and each token's top-4 similarities (`⌈N/16⌉·16·(dk+dv+5) + 16·max(dk, dv)`
    /// floats of workspace), for the pairwise similarities.
    pub unit_rows: bool,
}

const NOTHING: Requirements = Requirements {
    queries: false,
    values: ValueInput::None,
    value_l1: false,
    attn_sum: false,
    attn_sq: false,
    attn_cross: false,
    head_factors: false,
    first_stage: false,
    unit_rows: false,
};

/// Mean attention over the window (SnapKV and the scorers built on it).
const MEAN_ATTENTION: Requirements = Requirements {
    queries: true,
    attn_sum: true,
    ..NOTHING
};

/// The row of `kind`.
pub const fn requirements(kind: ScorerKind) -> Requirements {
    match kind {
        ScorerKind::SnapKv | ScorerKind::Tova => MEAN_ATTENTION,
        ScorerKind::Lava => Requirements {
            values: ValueInput::Values,
            head_factors: true,
            ..MEAN_ATTENTION
        },
        ScorerKind::LaProx => Requirements {
            queries: true,
            values: ValueInput::ValuesOrForms,
            attn_sq: true,
            attn_cross: true,
            ..NOTHING
        },
        ScorerKind::CriticalKv => Requirements {
            value_l1: true,
            first_stage: true,
            ..MEAN_ATTENTION
        },
        // keys only: the sinks need no input at all, KNorm reads the key norms
        ScorerKind::StreamingLlm | ScorerKind::KNorm => NOTHING,
        // question-agnostic: no queries, every key and value against every other
        ScorerKind::Uniqueness => Requirements {
            values: ValueInput::Values,
            unit_rows: true,
            ..NOTHING
        },
    }
}
