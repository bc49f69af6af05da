//! Exact top-K by threshold, mergeable across shards (SPEC §4 "Selection across devices").
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

/// State of one top-K search. Plain data: it can be copied to every shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Search {
    /// Digits fixed so far, right-aligned.
    prefix: u128,
    /// Bits fixed so far (multiple of 8 up to 104 ≥ KEY_BITS rounded up).
    bits: u32,
    /// Candidates still to take from the keys matching `prefix`.
    need: u64,
    /// Some(threshold) when finished; `u128::MAX`-style "keep nothing" is `None` with done.
    done: Option<Option<u128>>,
}

/// Bits of the key space rounded up to whole digits.
const SPACE: u32 = (KEY_BITS + DIGIT - 1) / DIGIT * DIGIT;

impl Search {
    /// Find the `k`-th largest of `total` candidates.
    pub fn new(k: u64, total: u64) -> Search {
        let mut s = Search {
            prefix: 0,
            bits: 0,
            need: k,
            done: None,
        };
        if k == 0 {
            s.done = Some(None);
        } else if k >= total {
            s.done = Some(Some(0));
        }
        s
    }
    pub fn is_done(&self) -> bool {
        self.done.is_some()
    }
    /// The final threshold: keep keys `>=` it; `None` keeps nothing. `None` before done.
    pub fn threshold(&self) -> Option<u128> {
        self.done.flatten()
    }
    /// Count a candidate into `h` if it matches the digits fixed so far.
    #[inline(always)]
    pub fn count(&self, key: u128, h: &mut Histogram) {
        let shift = SPACE - self.bits - DIGIT;
        if self.bits == 0 || (key >> (shift + DIGIT)) == self.prefix {
            let c = &mut h.0[((key >> shift) & 0xff) as usize];
            *c = c.saturating_add(1);
        }
    }
    /// Fix the next digit from the merged histogram. Returns whether the search is done.
    pub fn step(&mut self, h: &Histogram) -> bool {
        if self.done.is_some() {
            return true;
        }
        let mut above = 0u64;
        let mut d = 255usize;
        loop {
            let c = h.0[d];
            if above.saturating_add(c) >= self.need {
                self.need -= above;
                self.prefix = (self.prefix << DIGIT) | d as u128;
                self.bits += DIGIT;
                if c == self.need || self.bits >= SPACE {
                    // the whole bucket is kept: its smallest possible key is the threshold
                    self.done = Some(Some(self.prefix << (SPACE - self.bits)));
                }
                return self.done.is_some();
            }
            above = above.saturating_add(c);
            if d == 0 {
                // fewer candidates than k (inconsistent counts): keep everything seen
                self.done = Some(Some(0));
                return true;
            }
            d -= 1;
        }
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
