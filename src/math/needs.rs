//! What a configured scorer reads: `ScoreConfig::needs_*`, read off the scorer table
//! (`score/requirements.rs`). Here rather than in `config.rs`, so that the table names the
//! config's [`ScorerKind`](crate::ScorerKind) without the two modules importing each other.

use crate::config::{LaproxGqa, ScoreConfig};
use crate::score::requirements::{requirements, ValueInput};

impl ScoreConfig {
    /// Whether this scorer reads the window queries.
    pub fn needs_queries(&self) -> bool {
        requirements(self.scorer).queries
    }
    /// Whether this scorer reads V (directly, or through CriticalKV's value norms).
    pub fn needs_values(&self) -> bool {
        let r = requirements(self.scorer);
        r.values != ValueInput::None || r.value_l1
    }
    /// Whether the LaProx path needs the g×g cross-head attention products.
    pub(crate) fn needs_cross(&self) -> bool {
        requirements(self.scorer).attn_cross && self.laprox_gqa != LaproxGqa::Sum
    }
}
