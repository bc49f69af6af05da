//! Exact top-K by threshold, mergeable across shards (design §4 "Selection across devices").
//!
//! Every candidate gets a unique 128-bit key, larger = kept first:
//! `flag (1 bit) | order-preserving score bits (32) | position (32) | !unit (32)`,
//! so ties in score keep the later position, then the lower unit (layer·Hkv + head).
//! The K-th largest key is found by radix passes of 8 bits: each shard histograms the
//! candidates that match the digits fixed so far, the histograms add up, and one step
//! fixes the next digit. A search ends as soon as the bucket holding the K-th key is
//! taken whole — usually after the 4 score digits. Then every shard keeps `key >= threshold`.

use crate::numerics::float_key;

/// Total key bits: flag + score + position + unit.
pub const KEY_BITS: u32 = 97;
const DIGIT: u32 = 8;

/// Key of a candidate. `forced` sorts above every unforced key (safeguards, CriticalKV).
#[inline(always)]
pub fn make_key(score: f32, position: u32, unit: u32, forced: bool) -> u128 {
    ((forced as u128) << 96)
        | ((float_key(score) as u128) << 64)
        | ((position as u128) << 32)
        | ((!unit) as u128)
}

/// A 256-bin histogram of the next key digit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Histogram(pub [u64; 256]);

impl Default for Histogram {
    fn default() -> Self {
        Histogram([0; 256])
    }
}

impl Histogram {
    /// Add another shard's histogram.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.0.iter_mut().zip(other.0.iter()) {
            *a = a.saturating_add(*b); // hostile counts must not wrap
        }
    }
}

/// Threshold that keeps nothing (no key reaches it).
pub const KEEP_NOTHING: u128 = u128::MAX;

/// Bits of the key space rounded up to whole digits.
pub(crate) const SPACE: u32 = KEY_BITS.div_ceil(DIGIT) * DIGIT;

/// State of one top-K search. Plain, validated data (every field public), so a shard, a
/// device or a C caller can hold and copy it between rounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Search {
    /// Candidates still to take among the keys matching `prefix`.
    pub need: u64,
    /// Digits fixed so far, right-aligned.
    pub prefix: u128,
    /// Bits fixed so far: a multiple of 8, below 104 while running.
    pub bits: u32,
    /// Whether the threshold is known.
    pub done: bool,
    /// When done: keep keys `>= threshold` ([`KEEP_NOTHING`] keeps none).
    pub threshold: u128,
}

impl Search {
    /// Find the `k`-th largest of `total` candidates.
    pub fn new(k: u64, total: u64) -> Search {
        let mut s = Search {
            need: k,
            prefix: 0,
            bits: 0,
            done: false,
            threshold: 0,
        };
        if k == 0 {
            s.done = true;
            s.threshold = KEEP_NOTHING;
        } else if k >= total {
            s.done = true;
        }
        s
    }
    pub fn is_done(&self) -> bool {
        self.done
    }
    /// The final threshold: keep keys `>=` it; `None` keeps nothing (or not done yet).
    pub fn threshold(&self) -> Option<u128> {
        if self.done && self.threshold != KEEP_NOTHING {
            Some(self.threshold)
        } else {
            None
        }
    }
    /// Whether the fields are consistent (any state `new` and `step` produce is).
    pub fn validate(&self) -> crate::error::Result<()> {
        use crate::error::Error;
        if self.done {
            return Ok(());
        }
        if self.bits % DIGIT != 0 || self.bits >= SPACE || self.need == 0 {
            return Err(Error::InvalidArgument);
        }
        if (self.bits > 0 && self.prefix >> self.bits != 0) || (self.bits == 0 && self.prefix != 0)
        {
            return Err(Error::InvalidArgument);
        }
        Ok(())
    }
    /// Count a candidate into `h` if it matches the digits fixed so far (while running).
    #[inline(always)]
    pub fn count(&self, key: u128, h: &mut Histogram) {
        let shift = SPACE - self.bits - DIGIT;
        if self.bits == 0 || (key >> (shift + DIGIT)) == self.prefix {
            let c = &mut h.0[((key >> shift) & 0xff) as usize];
            *c = c.saturating_add(1);
        }
    }
    /// Fix the next digit from the merged histogram. Returns whether the search is done.
    /// Counts that do not add up (fewer candidates than `k`) end it keeping everything seen.
    pub fn step(&mut self, h: &Histogram) -> bool {
        if self.done {
            return true;
        }
        let mut above = 0u64;
        for d in (0..256usize).rev() {
            let c = h.0[d];
            if above.saturating_add(c) >= self.need {
                self.need -= above;
                self.prefix = (self.prefix << DIGIT) | d as u128;
                self.bits += DIGIT;
                if c == self.need || self.bits >= SPACE {
                    // the whole bucket is kept: its smallest possible key is the threshold
                    self.done = true;
                    self.threshold = self.prefix << (SPACE - self.bits);
                }
                return self.done;
            }
            above = above.saturating_add(c);
        }
        self.done = true;
        self.threshold = 0;
        true
    }
}

/// Run a whole search over candidates produced by `each` (called once per pass with a
/// sink for keys). Passes: at most 13, usually 4.
pub fn run_search(k: u64, total: u64, mut each: impl FnMut(&mut dyn FnMut(u128))) -> Option<u128> {
    let mut s = Search::new(k, total);
    while !s.is_done() {
        let mut h = Histogram::default();
        each(&mut |key| s.count(key, &mut h));
        s.step(&h);
    }
    s.threshold()
}

/// Threshold of the top-`k` of one unit's scores (`k` clamped to the length).
pub fn top_k_threshold(scores: &[f32], unit: u32, k: usize) -> Option<u128> {
    run_search(k as u64, scores.len() as u64, |sink| {
        for (i, &s) in scores.iter().enumerate() {
            sink(make_key(s, i as u32, unit, false));
        }
    })
}

/// Whether `key` is kept under `threshold`.
#[inline(always)]
pub fn kept(key: u128, threshold: Option<u128>) -> bool {
    matches!(threshold, Some(t) if key >= t)
}
