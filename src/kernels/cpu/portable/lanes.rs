//! The summation order of KNorm's squared norms and TOVA's logits ("lane order"), shared by
//! every path (AVX-512, AVX2 and the portable kernels, the scalar fallback), so that they give
//! the same bits:
//!
//! lane `l` of 16 sums the terms of the elements `d ≡ l (mod 16)` in increasing `d` from +0,
//! each term one FMA `s[l] = x_d·y_d + s[l]` (a row is taken as padded with +0 up to a
//! multiple of 16); then the 16 lane sums add pairwise, halving: `s[l] += s[l + h]` for
//! `h = 8, 4, 2, 1`; the result is `s[0]`.
//!
//! Why this order: vector code reads it straight from a row (one load per 16 elements, no
//! transpose of keys into lanes), and 16 rows' lane sums reduce together in about two
//! shuffles per row. An 8-lane path holds each row's lanes as two halves (`0..8`, `8..16`):
//! their sum is the first step, and [`hsum8`]'s tree is the other three. KNorm's squares are
//! fused on every path, the portable one included ([`fused`]; an FMA reads the keys about
//! 1.6× as fast as a multiply then an add on the AVX-512 machine measured); TOVA's logits
//! use [`Simd::fma`], which the portable kernels round twice, as in every other kernel.
use crate::numerics::{hsum8, key_elem, load_key, Simd};

/// The pairwise halving tree over 16 lane sums.
#[inline]
pub(crate) fn tree16(mut s: [f32; 16]) -> f32 {
    for h in [8, 4, 2, 1] {
        for l in 0..h {
            s[l] += s[l + h];
        }
    }
    s[0]
}

/// `a·b + c` rounded once.
#[inline(always)]
pub(crate) fn fma1(a: f32, b: f32, c: f32) -> f32 {
    #[cfg(feature = "std")]
    return a.mul_add(b, c);
    #[cfg(not(feature = "std"))]
    return libm::fmaf(a, b, c);
}

/// `a·b + c` per lane, rounded once on every path (the portable kernels' [`Simd::fma`] rounds
/// twice).
///
/// # Safety
/// `S`'s CPU features are present.
#[inline(always)]
pub(crate) unsafe fn fused<S: Simd>(a: S::V, b: S::V, c: S::V) -> S::V {
    // SAFETY: the caller's contract; the lanes go through local arrays
    unsafe {
        if S::FUSED {
            return S::fma(a, b, c);
        }
        let (mut x, mut y, mut z) = ([0f32; 8], [0f32; 8], [0f32; 8]);
        S::store(x.as_mut_ptr(), a);
        S::store(y.as_mut_ptr(), b);
        S::store(z.as_mut_ptr(), c);
        for i in 0..8 {
            z[i] = fma1(x[i], y[i], z[i]);
        }
        S::load(z.as_ptr())
    }
}

/// `Σ_d x_d·x_d` in lane order (KNorm's row path: rows converted to f32 first).
///
/// # Safety
/// `S`'s CPU features are present.
#[inline(always)]
pub(crate) unsafe fn row_squares<S: Simd>(x: &[f32]) -> f32 {
    // SAFETY: the caller's contract; `halves` reads elements d .. min(d + 16, x.len())
    unsafe {
        let mut h = [S::zero(); 2];
        let mut d = 0;
        while d < x.len() {
            let v = halves::<S, false>(x.as_ptr() as *const u8, d, x.len());
            for (h, v) in h.iter_mut().zip(v) {
                *h = fused::<S>(v, v, *h);
            }
            d += 16;
        }
        let mut lanes = [0f32; 16];
        S::store(lanes.as_mut_ptr(), h[0]);
        S::store(lanes.as_mut_ptr().add(8), h[1]);
        tree16(lanes)
    }
}

/// The 8-lane kernels' row loads: elements `d .. d + 16` of the row at `k` as two halves,
/// zero past `dk` (the padding).
///
/// # Safety
/// `S`'s CPU features are present and elements `d .. min(d + 16, dk)` of `k` are readable.
#[inline(always)]
unsafe fn halves<S: Simd, const F16: bool>(k: *const u8, d: usize, dk: usize) -> [S::V; 2] {
    // SAFETY: the caller's contract is `halves_of`'s
    unsafe { halves_of::<S, F16, false>(k, d, dk) }
}

/// [`halves`]; `FULL`: the caller knows `dk` is a multiple of 16 (no tail to test for: the
/// hot loops of 64- and 128-dim heads then keep their pointers in registers).
///
/// # Safety
/// As [`halves`].
#[inline(always)]
unsafe fn halves_of<S: Simd, const F16: bool, const FULL: bool>(
    k: *const u8,
    d: usize,
    dk: usize,
) -> [S::V; 2] {
    // SAFETY: the caller's contract; a whole chunk is read in place, a partial one through a copy
    unsafe {
        if FULL || d + 16 <= dk {
            return [load_key::<S, F16>(k, d), load_key::<S, F16>(k, d + 8)];
        }
        let mut t = [0f32; 16];
        for (i, t) in t.iter_mut().enumerate().take(dk - d) {
            *t = key_elem::<F16>(k, d + i);
        }
        [S::load(t.as_ptr()), S::load(t.as_ptr().add(8))]
    }
}

/// `out[j] = Σ_d x_d·x_d` (lane order, fused) for the 8 rows of `dk` elements at `k`, `ld` elements
/// apart (f16 when `F16`, converted exactly as loaded).
///
/// # Safety
/// `S`'s CPU features are present; `k` holds 8 readable rows of `dk` elements, `ld` apart.
#[inline(always)]
pub(crate) unsafe fn squares8<S: Simd, const F16: bool>(
    k: *const u8,
    ld: usize,
    dk: usize,
    out: &mut [f32; 8],
) {
    // SAFETY: the caller's contract is `squares8_of`'s
    unsafe {
        // the common head sizes with `dk` a constant: each row's loop unrolled whole, so the
        // speed no longer hangs on where the linker puts a 32-byte loop (crossing a 64-byte
        // line it cost Llama-3-8B's KNorm ~12 % on Zen 3); the same FMAs in the same order
        match dk {
            64 => squares8_of::<S, F16, true>(k, ld, 64, out),
            128 => squares8_of::<S, F16, true>(k, ld, 128, out),
            _ if dk % 16 == 0 => squares8_of::<S, F16, true>(k, ld, dk, out),
            _ => squares8_of::<S, F16, false>(k, ld, dk, out),
        }
    }
}

/// [`squares8`] (`FULL`: `dk` is a multiple of 16).
///
/// # Safety
/// As [`squares8`].
#[inline(always)]
unsafe fn squares8_of<S: Simd, const F16: bool, const FULL: bool>(
    k: *const u8,
    ld: usize,
    dk: usize,
    out: &mut [f32; 8],
) {
    let es = if F16 { 2 } else { 4 };
    // SAFETY: every row read is one of the 8 of this fn's contract
    unsafe {
        let mut v = [S::zero(); 8];
        for (j, v) in v.iter_mut().enumerate() {
            let row = k.add(j * ld * es);
            let mut h = [S::zero(); 2];
            let mut d = 0;
            while d < dk {
                let x = halves_of::<S, F16, FULL>(row, d, dk);
                for (h, x) in h.iter_mut().zip(x) {
                    *h = fused::<S>(x, x, *h);
                }
                d += 16;
            }
            *v = S::add(h[0], h[1]);
        }
        S::store(out.as_mut_ptr(), hsum8::<S>(v));
    }
}

/// `z[a·zld + j] = Σ_d k_j[d]·q_a[d]` (lane order, each term an [`Simd::fma`]) for the 8 rows
/// `k_j` of `dk` elements at `k` (`ld` elements apart; f16 when `F16`) and the `RA` query rows
/// at `q` (`dk` apart); returns the 8 logits of each row, also stored.
///
/// # Safety
/// `S`'s CPU features are present; `k` holds 8 readable rows of `dk` elements `ld` apart, `q`
/// `RA` rows of `dk` floats and `z` `RA` rows of 8 writable floats, `zld` apart.
#[inline(always)]
pub(crate) unsafe fn dots8<S: Simd, const RA: usize, const F16: bool>(
    k: *const u8,
    ld: usize,
    dk: usize,
    q: *const f32,
    z: *mut f32,
    zld: usize,
) -> [S::V; RA] {
    // SAFETY: the caller's contract is `dots8_of`'s and `dots8_split`'s
    unsafe {
        if dk % 16 != 0 {
            return dots8_of::<S, RA, F16, false>(k, ld, dk, q, z, zld);
        }
        // f16 rows: each half of a key converted once per sweep, the query vectors held
        // (Llama-3-8B TOVA on AVX2 11 % faster); f32 rows: the query halves as FMA memory
        // operands, two keys at a time (SmolLM2 measured no slower than the split). The
        // common head sizes with `dk` a constant, their loops over `d` unrolled whole (as
        // `squares8`; Llama-3-8B TOVA on the AVX-512 Xeon, AVX2 kernels: 0.83 -> 0.77 ms)
        if !F16 {
            return match dk {
                64 => dots8_of::<S, RA, F16, true>(k, ld, 64, q, z, zld),
                128 => dots8_of::<S, RA, F16, true>(k, ld, 128, q, z, zld),
                _ => dots8_of::<S, RA, F16, true>(k, ld, dk, q, z, zld),
            };
        }
        // keys per sweep: RA·KB accumulators + RA query vectors + a key in 16 registers
        match (RA, dk) {
            (1, 128) => dots8_split::<S, RA, 8, F16>(k, ld, 128, q, z, zld),
            (1, _) => dots8_split::<S, RA, 8, F16>(k, ld, dk, q, z, zld),
            (2, 128) => dots8_split::<S, RA, 4, F16>(k, ld, 128, q, z, zld),
            (2, _) => dots8_split::<S, RA, 4, F16>(k, ld, dk, q, z, zld),
            (_, 128) => dots8_split::<S, RA, 2, F16>(k, ld, 128, q, z, zld),
            _ => dots8_split::<S, RA, 2, F16>(k, ld, dk, q, z, zld),
        }
    }
}

/// [`dots8`] (`FULL`: `dk` is a multiple of 16).
///
/// # Safety
/// As [`dots8`].
#[inline(always)]
unsafe fn dots8_of<S: Simd, const RA: usize, const F16: bool, const FULL: bool>(
    k: *const u8,
    ld: usize,
    dk: usize,
    q: *const f32,
    z: *mut f32,
    zld: usize,
) -> [S::V; RA] {
    let es = if F16 { 2 } else { 4 };
    // SAFETY: every row read is one of this fn's contract, every store inside `z`'s rows
    unsafe {
        let mut v = [[S::zero(); 8]; RA];
        // two keys side by side where their 4·RA chains fit the registers (f32 rows, RA <= 3)
        const fn pair(ra: usize, f16: bool, full: bool) -> usize {
            if full && !f16 && ra <= 3 {
                2
            } else {
                1
            }
        }
        let kb = pair(RA, F16, FULL);
        for j0 in (0..8).step_by(kb) {
            let mut h = [[[S::zero(); 2]; RA]; 2];
            let mut d = 0;
            while d < dk {
                for (jj, h) in h.iter_mut().enumerate().take(kb) {
                    let x = halves_of::<S, F16, FULL>(k.add((j0 + jj) * ld * es), d, dk);
                    for (a, h) in h.iter_mut().enumerate() {
                        let qa = halves_of::<S, false, FULL>(q.add(a * dk) as *const u8, d, dk);
                        for i in 0..2 {
                            h[i] = S::fma(x[i], qa[i], h[i]);
                        }
                    }
                }
                d += 16;
            }
            for (jj, h) in h.iter().enumerate().take(kb) {
                for (v, h) in v.iter_mut().zip(h) {
                    v[j0 + jj] = S::add(h[0], h[1]);
                }
            }
        }
        let mut out = [S::zero(); RA];
        for (a, (o, v)) in out.iter_mut().zip(v).enumerate() {
            *o = hsum8::<S>(v);
            S::store(z.add(a * zld), *o);
        }
        out
    }
}

/// [`dots8`] for `dk` a multiple of 16, the halves apart: a lane sum `l < 8` (elements
/// `16c + l`) and its partner `l + 8` (`16c + 8 + l`) are independent FMA chains, so each
/// half runs as its own sweep over `KB` keys' rows with the `RA` query vectors of the step
/// held in registers: one query load per `KB` FMAs and one key load (f16 converted) per
/// `RA`, against a query load per FMA reading both halves per key. The same FMAs in the same
/// order per lane, so the same bits as [`dots8_of`].
///
/// # Safety
/// As [`dots8`], and `dk % 16 == 0`, `8 % KB == 0`.
#[inline(always)]
unsafe fn dots8_split<S: Simd, const RA: usize, const KB: usize, const F16: bool>(
    k: *const u8,
    ld: usize,
    dk: usize,
    q: *const f32,
    z: *mut f32,
    zld: usize,
) -> [S::V; RA] {
    let es = if F16 { 2 } else { 4 };
    // SAFETY: every row read is one of this fn's contract (elements d .. d + 8 <= dk), every
    // store inside `z`'s rows; every element of `v` is written in the first half's sweeps
    // (keys s + i cover 0..8) before it is read
    unsafe {
        let mut v = core::mem::MaybeUninit::<[[S::V; 8]; RA]>::uninit();
        let vp = v.as_mut_ptr() as *mut S::V; // [a][key]
        for half in 0..2 {
            for s in (0..8).step_by(KB) {
                let rows: [*const u8; KB] = core::array::from_fn(|i| k.add((s + i) * ld * es));
                let mut h = [[S::zero(); RA]; KB];
                let mut d = 8 * half;
                while d < dk {
                    let qv: [S::V; RA] = core::array::from_fn(|a| S::load(q.add(a * dk + d)));
                    for (h, row) in h.iter_mut().zip(rows) {
                        let x = load_key::<S, F16>(row, d);
                        for (h, &qv) in h.iter_mut().zip(&qv) {
                            *h = S::fma(x, qv, *h);
                        }
                    }
                    d += 16;
                }
                for (i, h) in h.iter().enumerate() {
                    for (a, &h) in h.iter().enumerate() {
                        let o = vp.add(a * 8 + s + i);
                        o.write(if half == 0 { h } else { S::add(o.read(), h) });
                    }
                }
            }
            // the first half's sums wait in memory: LLVM otherwise holds them in registers
            // through the second half's sweeps and spills those sweeps' accumulators instead
            core::hint::black_box(vp);
        }
        let v = v.assume_init();
        let mut out = [S::zero(); RA];
        for (a, (o, v)) in out.iter_mut().zip(v).enumerate() {
            *o = hsum8::<S>(v);
            S::store(z.add(a * zld), *o);
        }
        out
    }
}

#[cfg(all(test, feature = "std"))]
pub(crate) mod tests {
    use super::*;
    pub(crate) use crate::numerics::tests::spread;
    use crate::numerics::Portable;
    use std::vec::Vec;

    /// `Σ_d x_d·x_d` in lane order, fused (every path of KNorm).
    pub(crate) fn sum_squares(x: &[f32]) -> f32 {
        let mut s = [0f32; 16];
        for (d, &v) in x.iter().enumerate() {
            s[d % 16] = v.mul_add(v, s[d % 16]);
        }
        // the padding's +0·+0 terms: a lane sum of squares is never -0, so adding +0 is exact
        tree16(s)
    }

    /// `Σ_d k_d·q_d` in lane order, the padding included, each term `fma(k, q, s)` when
    /// `fused` (the AVX2 / AVX-512 kernels) or `s + k·q` (the portable ones).
    pub(crate) fn dot(k: &[f32], q: &[f32], fused: bool) -> f32 {
        let mut s = [0f32; 16];
        for d in 0..k.len().div_ceil(16) * 16 {
            let (x, y) = (
                k.get(d).copied().unwrap_or(0.0),
                q.get(d).copied().unwrap_or(0.0),
            );
            let l = &mut s[d % 16];
            *l = if fused { x.mul_add(y, *l) } else { *l + x * y };
        }
        tree16(s)
    }

    /// `x` as f16 bits, and those f16 values as f32 (what the kernels see).
    pub(crate) fn f16_rows(x: &[f32]) -> (Vec<u16>, Vec<f32>) {
        let bits: Vec<u16> = x
            .iter()
            .map(|&v| half::f16::from_f32(v).to_bits())
            .collect();
        let vals = bits
            .iter()
            .map(|&b| half::f16::from_bits(b).to_f32())
            .collect();
        (bits, vals)
    }

    /// Head-major `[hkv][n][dk]` as token rows `[n][hkv·dk]` (llama.cpp's layout).
    pub(crate) fn token_rows(kv: &[f32], hkv: usize, n: usize, dk: usize) -> Vec<f32> {
        let mut kt = std::vec![0f32; kv.len()];
        for h in 0..hkv {
            for t in 0..n {
                let (o, i) = (t * hkv * dk + h * dk, (h * n + t) * dk);
                kt[o..o + dk].copy_from_slice(&kv[i..i + dk]);
            }
        }
        kt
    }

    /// The same keys `[hkv][n][dk]` in the layouts the scorers read: f32 head-major, then
    /// token rows (llama.cpp's) in f32, f16 and bf16.
    pub(crate) struct KeyLayouts {
        kv: Vec<f32>,
        kt: Vec<f32>,
        k16: Vec<half::f16>,
        kb16: Vec<half::bf16>,
        extent: [usize; 3],
    }

    impl KeyLayouts {
        pub(crate) fn new(kv: Vec<f32>, hkv: usize, n: usize, dk: usize) -> Self {
            let kt = token_rows(&kv, hkv, n, dk);
            let k16 = kt.iter().map(|&x| half::f16::from_f32(x)).collect();
            let kb16 = kt.iter().map(|&x| half::bf16::from_f32(x)).collect();
            Self {
                kv,
                kt,
                k16,
                kb16,
                extent: [hkv, n, dk],
            }
        }

        pub(crate) fn views(&self) -> [crate::view::View<'_>; 4] {
            use crate::view::View;
            let [hkv, n, dk] = self.extent;
            let (hm, tr) = ([n * dk, dk, 1], [dk, hkv * dk, 1]);
            [
                View::f32(&self.kv, self.extent, hm).unwrap(),
                View::f32(&self.kt, self.extent, tr).unwrap(),
                View::f16(&self.k16, self.extent, tr).unwrap(),
                View::bf16(&self.kb16, self.extent, tr).unwrap(),
            ]
        }
    }

    #[test]
    fn tree16_is_the_halving_tree() {
        for seed in 0..20 {
            let v = spread(16, seed);
            let s: [f32; 16] = core::array::from_fn(|l| v[l]);
            let want = (((s[0] + s[8]) + (s[4] + s[12])) + ((s[2] + s[10]) + (s[6] + s[14])))
                + (((s[1] + s[9]) + (s[5] + s[13])) + ((s[3] + s[11]) + (s[7] + s[15])));
            assert_eq!(tree16(s).to_bits(), want.to_bits(), "seed {seed}");
        }
    }

    /// The 8-lane kernels (AVX2 where the CPU has it, and the portable one) against the
    /// scalar order, bit for bit, f32 and f16 rows, dims that are not whole chunks of 16.
    #[test]
    fn eight_lane_kernels_match_scalar_order() {
        fn run<S: Simd>(fused: bool) {
            for dk in [1, 5, 8, 15, 16, 17, 24, 33, 64, 72, 128] {
                let ld = dk + 3;
                let kv = spread(8 * ld, dk as u64);
                let (k16, k16f) = f16_rows(&kv);
                let q = spread(4 * dk, 77 + dk as u64);
                for (f16, rows) in [(false, &kv), (true, &k16f)] {
                    let row = |j: usize| &rows[j * ld..j * ld + dk];
                    // z[ra - 1]: the logits of `dots8` with RA = ra query rows
                    let (mut sq, mut z) = ([0f32; 8], [[0f32; 4 * 8]; 4]);
                    // SAFETY: 8 rows of dk elements, ld apart; 4 query rows; z 4 rows of 8
                    unsafe {
                        let qp = q.as_ptr();
                        let zp: [*mut f32; 4] = core::array::from_fn(|i| z[i].as_mut_ptr());
                        if f16 {
                            let p = k16.as_ptr() as *const u8;
                            squares8::<S, true>(p, ld, dk, &mut sq);
                            dots8::<S, 1, true>(p, ld, dk, qp, zp[0], 8);
                            dots8::<S, 2, true>(p, ld, dk, qp, zp[1], 8);
                            dots8::<S, 3, true>(p, ld, dk, qp, zp[2], 8);
                            dots8::<S, 4, true>(p, ld, dk, qp, zp[3], 8);
                        } else {
                            let p = kv.as_ptr() as *const u8;
                            squares8::<S, false>(p, ld, dk, &mut sq);
                            dots8::<S, 1, false>(p, ld, dk, qp, zp[0], 8);
                            dots8::<S, 2, false>(p, ld, dk, qp, zp[1], 8);
                            dots8::<S, 3, false>(p, ld, dk, qp, zp[2], 8);
                            dots8::<S, 4, false>(p, ld, dk, qp, zp[3], 8);
                        }
                    }
                    for j in 0..8 {
                        let what = std::format!("dk {dk} f16 {f16} row {j}");
                        assert_eq!(sq[j].to_bits(), sum_squares(row(j)).to_bits(), "{what}");
                        // SAFETY: as above
                        let r = unsafe { row_squares::<S>(row(j)) };
                        assert_eq!(
                            r.to_bits(),
                            sum_squares(row(j)).to_bits(),
                            "{what} row path"
                        );
                        for (ra, z) in z.iter().enumerate() {
                            for a in 0..=ra {
                                let want = dot(row(j), &q[a * dk..(a + 1) * dk], fused);
                                let got = z[a * 8 + j].to_bits();
                                assert_eq!(got, want.to_bits(), "{what} RA {} q {a}", ra + 1);
                            }
                        }
                    }
                }
            }
        }
        run::<Portable>(false);
        crate::numerics::on_vector_builds!(S => { run::<S>(true) });
    }
}
