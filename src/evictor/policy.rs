//! The budget policy: when a sequence is compressed and to how many cells. Pure functions
//! of the sequence's cells `n` and its protected cells (those the last compression kept).
//!
//! Every target counts the cells the sequence holds afterwards, and is never below what a
//! selection keeps anyway (the protected cells and the observation window), so the kept
//! set of a rectangular selection (token granularity, uniform allocator) has exactly
//! `target` cells.

use crate::config::budget_from;
use crate::error::{Error, Result};

/// How much a sequence keeps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Budget {
    /// A compression keeps `max(floor(new · ratio), min_keep)` of the `new` cells added
    /// since the last one (kvpress's convention: the window counts inside). Cells kept by
    /// an earlier compression are never compressed again: a keep ratio applied twice to
    /// the same prompt would keep `ratio²` of it. A span that would keep all of itself
    /// (a short prompt or turn) is left alone.
    KeepRatio { ratio: f64, min_keep: u64 },
    /// Decode time: once a sequence holds more than `high` cells, evict it down to `low`
    /// (over all its cells): a gap between the two spares a compression every token.
    Cells { high: u64, low: u64 },
    /// The engine decides: [`plan`] never asks for a compression; the engine passes its
    /// own target to `Evictor::begin`.
    Explicit,
}

impl Budget {
    /// `Cells` with `low = 7/8 · high`: one compression per `high/8` decoded tokens.
    pub const fn cells(high: u64) -> Budget {
        Budget::Cells {
            high,
            low: high - high / 8,
        }
    }
    /// A ratio in [0, 1]; `1 <= low <= high`.
    pub fn validate(&self) -> Result<()> {
        let ok = match *self {
            Budget::KeepRatio { ratio, .. } => (0.0..=1.0).contains(&ratio),
            Budget::Cells { high, low } => low >= 1 && low <= high,
            Budget::Explicit => true,
        };
        if ok {
            Ok(())
        } else {
            Err(Error::InvalidArgument)
        }
    }
}

/// The first cell a compression selects over: the ratio never touches protected cells.
pub fn span_start(b: &Budget, protected: u64, n: u64) -> u64 {
    match b {
        Budget::KeepRatio { .. } => protected.min(n),
        _ => 0,
    }
}

/// The least a selection over `start..n` keeps: the protected cells and the window.
pub fn least_kept(start: u64, n: u64, window: u64) -> u64 {
    start + window.min(n - start)
}

/// The cells a sequence of `n` cells should hold now (`n`: nothing to do).
pub fn plan(b: &Budget, protected: u64, n: u64, window: u64) -> u64 {
    let start = span_start(b, protected, n);
    let target = match *b {
        Budget::KeepRatio { ratio, min_keep } => {
            let new = n - start;
            let keep = budget_from::keep_ratio_total(new, 0, ratio).max(min_keep);
            start + keep.min(new)
        }
        Budget::Cells { high, low } if n > high => low,
        Budget::Cells { .. } | Budget::Explicit => n,
    };
    target.max(least_kept(start, n, window)).min(n)
}

/// Prefix cells per selection unit for a round over `start..n` that ends at `target`
/// cells (the selection's budget: the window comes on top).
pub fn span_budget(start: u64, n: u64, window: u64, target: u64) -> u64 {
    target.saturating_sub(least_kept(start, n, window))
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATIO: Budget = Budget::KeepRatio {
        ratio: 0.25,
        min_keep: 64,
    };

    #[test]
    fn ratio_keeps_a_share_of_what_is_new() {
        // 1000 new cells: 250 kept, the window inside them
        assert_eq!(plan(&RATIO, 0, 1000, 32), 250);
        assert_eq!(span_budget(0, 1000, 32, 250), 218);
        assert_eq!(budget_from::keep_ratio_total(1000, 32, 0.25), 218);
        // a second turn of 400 cells: the 250 kept stay, 100 of the 400 are kept
        assert_eq!(span_start(&RATIO, 250, 650), 250);
        assert_eq!(plan(&RATIO, 250, 650, 32), 350);
        assert_eq!(span_budget(250, 650, 32, 350), 68);
    }

    #[test]
    fn ratio_floor_and_short_spans() {
        // 200 new cells: 50 < min_keep, so 64 are kept
        assert_eq!(plan(&RATIO, 0, 200, 32), 64);
        // 60 new cells: nothing to evict (min_keep covers them all)
        assert_eq!(plan(&RATIO, 500, 560, 32), 560);
        // a window wider than the share: the window is kept
        let r = Budget::KeepRatio {
            ratio: 0.01,
            min_keep: 0,
        };
        assert_eq!(plan(&r, 0, 1000, 32), 32);
        assert_eq!(span_budget(0, 1000, 32, 32), 0);
        // protected past n (the engine removed cells itself): nothing is new
        assert_eq!(plan(&RATIO, 900, 800, 32), 800);
    }

    #[test]
    fn cells_evict_down_to_low_past_high() {
        let b = Budget::cells(1024);
        assert_eq!(
            b,
            Budget::Cells {
                high: 1024,
                low: 896
            }
        );
        assert_eq!(plan(&b, 900, 1024, 8), 1024);
        assert_eq!(plan(&b, 900, 1025, 8), 896);
        assert_eq!(span_start(&b, 900, 1025), 0);
        assert_eq!(plan(&Budget::Cells { high: 4, low: 2 }, 0, 40, 8), 8);
        assert_eq!(plan(&Budget::Explicit, 0, 5000, 8), 5000);
    }

    #[test]
    fn validation() {
        for bad in [
            Budget::KeepRatio {
                ratio: f64::NAN,
                min_keep: 0,
            },
            Budget::KeepRatio {
                ratio: 1.5,
                min_keep: 0,
            },
            Budget::Cells { high: 10, low: 11 },
            Budget::Cells { high: 10, low: 0 },
        ] {
            assert_eq!(bad.validate(), Err(Error::InvalidArgument), "{bad:?}");
        }
        assert_eq!(RATIO.validate(), Ok(()));
    }
}
