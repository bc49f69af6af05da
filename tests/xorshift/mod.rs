//! The xorshift64 data source of the tests that want cheap, fixed-seed f32 data
//! (`tests/paged_common`, `tests/evictor.rs`, `tests/quantized_rows.rs`) and of the
//! benchmark examples (`examples/common`): one generator, so that the same seed gives the
//! same data everywhere.
#![allow(dead_code)] // each user takes its own subset

/// Deterministic data (xorshift64); the state must not be 0.
pub struct Rng(pub u64);
impl Rng {
    /// A generator whose state is `seed` spread over the word (never 0).
    pub fn seeded(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [0, 1), 24 bits.
    pub fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Uniform in (-1, 1).
    pub fn f(&mut self) -> f32 {
        self.unit() * 2.0 - 1.0
    }
    /// As `f`, one value in 29 four times larger (peaked attention).
    pub fn spiky(&mut self) -> f32 {
        let u = self.f();
        if self.0 % 29 == 0 {
            u * 4.0
        } else {
            u
        }
    }
    /// `n` values of [`Rng::spiky`].
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.spiky()).collect()
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// A random permutation of 0..n.
    pub fn perm(&mut self, n: usize) -> Vec<u32> {
        let mut v: Vec<u32> = (0..n as u32).collect();
        for i in (1..n).rev() {
            v.swap(i, self.below(i + 1));
        }
        v
    }
}
