//! A sequence's bookkeeping: plain words in its slot, loaded and stored whole, so a
//! context in caller memory holds no Rust value a corrupted word could make invalid.

use super::marks::MarkSplit;
use super::memory::STATE_WORDS;
use super::policy;
use super::Resolved;
use super::SeqStats;
use crate::error::{Error, Result};

/// Where a sequence is in its round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) enum Phase {
    #[default]
    Idle = 0,
    Scoring = 1,
    Selected = 2,
}

/// A sequence's bookkeeping, kept as `STATE_WORDS` u64 in its slot.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SeqState {
    pub phase: Phase,
    /// The round's cells, first selected cell and target.
    pub n: u64,
    pub start: u64,
    pub target: u64,
    /// Cells held after the last commit, and those a ratio never compresses again.
    pub held: u64,
    pub protected: u64,
    pub ragged: bool,
    pub evictions: u64,
    pub evicted: u64,
    /// Kept cells over all units of the selected round.
    pub kept_total: u64,
    /// Held cells whose decode-time scores are carried (`carry.rs`; 0: none).
    pub carried: u64,
    /// The round's marks (`marks.rs`): the share of the kept cells reserved for the marked
    /// cells, `None` when the engine marked none this round.
    pub mark_share: Option<f32>,
    /// With `mark_share`: how the marked cells' budget is spent (bit 33 of its word).
    pub mark_split: MarkSplit,
}

impl SeqState {
    pub fn load(w: &[u64]) -> Result<SeqState> {
        let phase = match w[0] {
            0 => Phase::Idle,
            1 => Phase::Scoring,
            2 => Phase::Selected,
            _ => return Err(Error::InvalidArgument),
        };
        Ok(SeqState {
            phase,
            n: w[1],
            start: w[2],
            target: w[3],
            held: w[4],
            protected: w[5],
            ragged: w[6] != 0,
            evictions: w[7],
            evicted: w[8],
            kept_total: w[9],
            carried: w[10],
            mark_share: match w[11] {
                0 => None,
                x => Some(f32::from_bits(x as u32)),
            },
            mark_split: if w[11] >> 33 & 1 != 0 {
                MarkSplit::Spans
            } else {
                MarkSplit::Share
            },
        })
    }
    pub fn store(&self, w: &mut [u64]) {
        let v: [u64; STATE_WORDS] = [
            self.phase as u64,
            self.n,
            self.start,
            self.target,
            self.held,
            self.protected,
            self.ragged as u64,
            self.evictions,
            self.evicted,
            self.kept_total,
            self.carried,
            self.mark_share
                .map_or(0, |s| (1 << 32) | s.to_bits() as u64)
                | (((self.mark_split == MarkSplit::Spans) as u64) << 33),
        ];
        w.copy_from_slice(&v);
    }
}

impl SeqState {
    /// The policy of `r` for `n_cells` cells: the cells to hold (a ragged sequence takes
    /// no round). The host and device forms' `plan`.
    pub fn plan(&self, r: &Resolved, n_cells: usize) -> Result<usize> {
        if self.ragged {
            return Err(Error::InvalidArgument);
        }
        let (n, window) = (n_cells as u64, r.score.window as u64);
        Ok(policy::plan(&r.budget, self.protected, n, window) as usize)
    }

    /// Start a round on `n_cells` cells (`1..=max_cells`) that ends holding `target`
    /// cells, raised to what a selection keeps anyway; a round in progress is abandoned.
    /// The host and device forms' `begin` (their slots' scratch aside).
    pub fn begin(&mut self, r: &Resolved, n_cells: usize, target: usize) -> Result<()> {
        let (n, target, window) = (n_cells as u64, target as u64, r.score.window as u64);
        if self.ragged || n == 0 || n > r.max_cells as u64 || target > n {
            return Err(Error::InvalidArgument);
        }
        let b = &r.budget;
        let start = policy::span_start(b, self.protected, n);
        if start == n {
            return Err(Error::InvalidArgument); // nothing new to select over
        }
        self.phase = Phase::Scoring;
        self.n = n;
        self.start = start;
        self.target = target.max(policy::least_kept(start, n, window));
        self.kept_total = 0;
        self.mark_share = None;
        self.mark_split = MarkSplit::Share;
        Ok(())
    }

    /// [`SeqState::begin`] on a slot's state words, the layers' scored marks cleared
    /// (nothing changed on error): the host and device forms' `begin`.
    pub fn begin_slot(
        r: &Resolved,
        words: &mut [u64],
        scored: &mut [u8],
        n_cells: usize,
        target: usize,
    ) -> Result<()> {
        let mut st = SeqState::load(words)?;
        // an abandoned round that scored a layer offered its pairs to the carried twin
        // lists (`score/uniqueness/twins.rs`): they no longer describe the held cells
        let touched = r.twins > 0 && st.phase == Phase::Scoring && scored.iter().any(|&s| s != 0);
        st.begin(r, n_cells, target)?;
        if touched {
            st.carried = 0;
        }
        st.store(words);
        scored.fill(0);
        Ok(())
    }

    /// Record a selected round's commit: the sequence holds `held` cells (all protected).
    pub fn commit(&mut self, held: u64, ragged: bool) -> Result<()> {
        if self.phase != Phase::Selected {
            return Err(Error::InvalidArgument);
        }
        self.ragged = ragged;
        self.phase = Phase::Idle;
        self.held = held;
        self.protected = held;
        self.evictions += 1;
        self.evicted += self.n - held;
        Ok(())
    }

    /// The engine changed the sequence's cells itself (removed or rewound some): its
    /// round, protection, raggedness and carried scores are forgotten, its counters kept.
    pub fn unprotect(&self) -> SeqState {
        SeqState {
            evictions: self.evictions,
            evicted: self.evicted,
            ..SeqState::default()
        }
    }

    pub fn stats(&self) -> SeqStats {
        SeqStats {
            cells: self.held,
            protected: self.protected,
            evictions: self.evictions,
            cells_evicted: self.evicted,
            ragged: self.ragged,
        }
    }
}
