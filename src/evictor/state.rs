//! A sequence's bookkeeping: plain words in its slot, loaded and stored whole, so a
//! context in caller memory holds no Rust value a corrupted word could make invalid.

use super::memory::STATE_WORDS;
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
        ];
        w.copy_from_slice(&v);
    }
}
