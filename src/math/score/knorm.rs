//! KNorm (design §3): `-||K[kh,i]||_2`, no queries needed.
//!
//! Each norm is `Σ_d x_d·x_d` in the lane order of [`crate::lanes`] (each square an FMA into
//! its lane), the same on every path, so scores are bit-identical across them.
//! Keys held as f32 or f16 rows with unit element stride run 16 at a time on AVX-512
//! ([`crate::lanes512::squares`], `dk` a multiple of 16) or 8 at a time
//! ([`crate::lanes::squares8`]; f16 converted as loaded), each row read in place 16 elements
//! per step; rows of ggml's block types dequantized 8 at a time into a stack buffer and
//! summed the same way; the others (other dtypes and layouts, the last keys short of a
//! block) through a row copy and [`crate::lanes::row_squares`]. The keys are read once: a NaN/Inf element
//! makes its key's norm NaN/Inf, so `score_layer` checks the prefix keys through their
//! scores (held in its workspace until every head has passed) and sweeps only the window keys.
use super::Bufs;
use crate::lanes::{row_squares, squares8};
#[cfg(not(all(feature = "std", target_arch = "x86_64", kvevict_avx512)))]
use crate::numerics::dispatch as dispatch_wide;
use crate::numerics::{key_elem, load_key, prefetch_rows, Simd};
#[cfg(all(feature = "std", target_arch = "x86_64", kvevict_avx512))]
use crate::simd512::dispatch_wide;
use crate::view::{DType, View};

/// Longest rows of a block type (`Q8_0`, `Q4_0`) dequantized 8 at a time on the stack
/// ([`quantized_norms`]); longer ones go row by row.
const QD: usize = 256;

pub(super) fn score(keys: &View, kh: usize, bufs: &mut Bufs, dst: &mut [f32]) {
    let [_, _, dk] = keys.extent();
    let st = keys.stride();
    let f16 = keys.dtype() == DType::F16;
    let quantized = keys.dtype().is_quantized() && dk <= QD;
    let lanes = if (f16 || quantized || keys.dtype() == DType::F32) && st[2] == 1 {
        dst.len() / 8 * 8
    } else {
        0
    };
    if lanes > 0 && quantized {
        let head = &mut dst[..lanes];
        dispatch_wide!(fn(keys: &View, kh: usize, dk: usize, head: &mut [f32]) -> (), S => {
            let mut buf = [0f32; 8 * QD];
            // SAFETY: `S`'s CPU features are present (our dispatch); dk <= QD.
            unsafe { quantized_norms::<S>(keys, kh, dk, &mut buf, head) }
        });
    } else if lanes > 0 {
        assert!(kh < keys.extent()[0] && lanes <= keys.extent()[1]);
        let es = keys.dtype().size();
        // SAFETY: rows (kh, 0..lanes, 0..dk) are inside the view's extent, which the view
        // proved in bounds at construction; `byte_range` gives back its pointer.
        let base = unsafe { (keys.byte_range().0 as *const u8).add(kh * st[0] * es) };
        let (ld, head) = (st[1], &mut dst[..lanes]);
        dispatch_wide!(fn(base: *const u8, ld: usize, dk: usize, f16: bool, head: &mut [f32]) -> (), S => {
            if f16 {
                // SAFETY: `base` holds `head.len()` rows of `dk` f16, `ld` apart.
                unsafe { norms::<S, true>(base, ld, dk, head) }
            } else {
                // SAFETY: as above, f32.
                unsafe { norms::<S, false>(base, ld, dk, head) }
            }
        });
    }
    let (row, rest) = (&mut bufs.row[..dk], &mut dst[lanes..]);
    dispatch_wide!(fn(keys: &View, kh: usize, lanes: usize, row: &mut [f32], rest: &mut [f32]) -> (), S => {
        for (t, v) in rest.iter_mut().enumerate() {
            keys.load_row(kh, lanes + t, row);
            // SAFETY: `S`'s CPU features are present (our dispatch).
            *v = -libm::sqrtf(unsafe { row_squares::<S>(row) });
        }
    });
}

/// `out[t] = -sqrt(Σ_d x_d·x_d)` for the `out.len()` (a multiple of 8) rows at `k`.
///
/// # Safety
/// `k` must hold `out.len()` readable rows of `dk` elements (f16 when `F16`, else f32),
/// `ld` elements apart.
#[inline(always)]
unsafe fn norms<S: Simd, const F16: bool>(k: *const u8, ld: usize, dk: usize, out: &mut [f32]) {
    let es = if F16 { 2 } else { 4 };
    // SAFETY: every block of keys starts at a key t with t + its size <= out.len() (the
    // contract's rows); the caller keeps `S`'s contract.
    unsafe {
        #[allow(unused_mut)]
        let mut t = 0;
        #[cfg(all(feature = "std", target_arch = "x86_64", kvevict_avx512))]
        if S::AVX2 && dk % 16 == 0 && crate::gemm512::available() {
            t = out.len() / 16 * 16;
            crate::lanes512::squares::<F16>(k, ld, dk, &mut out[..t]);
        }
        for o in out[t..].chunks_exact_mut(8) {
            prefetch_rows(k.add((t + AHEAD) * ld * es), ld * es, dk * es, 8);
            let o: &mut [f32; 8] = o.try_into().unwrap_or_else(|_| unreachable!());
            squares8::<S, F16>(k.add(t * ld * es), ld, dk, o);
            t += 8;
        }
        let neg = S::splat(-1.0);
        for o in out.chunks_exact_mut(8) {
            // IEEE sqrt (libm::sqrtf's bits), negated exactly (-0 for a zero key, as `-sqrtf`)
            S::store(o.as_mut_ptr(), S::mul(neg, S::sqrt(S::load(o.as_ptr()))));
        }
    }
}

/// [`norms`] of the first `out.len()` (a multiple of 8) keys of head `kh` of `keys` (rows of
/// a block type): each 8 rows dequantized into `buf` (`8·dk` floats) and summed as f32 rows
/// are ([`squares8`]'s lane order), so the bits of every other path.
///
/// # Safety
/// `S`'s CPU features are present; `buf` holds `8·dk` floats; `out.len()` keys exist.
#[inline(always)]
unsafe fn quantized_norms<S: Simd>(
    keys: &View,
    kh: usize,
    dk: usize,
    buf: &mut [f32],
    out: &mut [f32],
) {
    let buf = &mut buf[..8 * dk];
    // SAFETY: `buf` holds the 8 rows squares8 reads (dk floats, dk apart); the caller keeps
    // `S`'s contract.
    unsafe {
        let neg = S::splat(-1.0);
        for (i, o) in out.chunks_exact_mut(8).enumerate() {
            for (r, row) in buf.chunks_exact_mut(dk).enumerate() {
                keys.load_row(kh, i * 8 + r, row);
            }
            let o: &mut [f32; 8] = o.try_into().unwrap_or_else(|_| unreachable!());
            squares8::<S, false>(buf.as_ptr() as *const u8, dk, dk, o);
            // as `norms`: IEEE sqrt, negated exactly
            S::store(o.as_mut_ptr(), S::mul(neg, S::sqrt(S::load(o.as_ptr()))));
        }
    }
}

/// Keys ahead of the one being summed that [`norms`]'s 8-key blocks ask the cache for: the
/// loads of a block walk 8 rows side by side, which the hardware prefetcher alone follows
/// too late.
const AHEAD: usize = 32;

/// `out[i] = Σ_d x_d·x_d` (`L1`: `Σ_d |x_d|`) for the `8·B` f32 rows at `k` (`ld` apart),
/// each summed in dimension order from +0 in its own lane (a scalar loop's bits).
///
/// # Safety
/// `k` must point to `8·B` readable rows of `dk` floats, `ld` apart; `out` has `8·B`.
#[inline(always)]
pub(super) unsafe fn row_sums<S: Simd, const B: usize, const L1: bool>(
    k: *const f32,
    ld: usize,
    dk: usize,
    out: &mut [f32],
) {
    // SAFETY: this fn's contract is `row_sums_of`'s for f32 rows.
    unsafe { row_sums_of::<S, B, L1, false>(k as *const u8, ld, dk, out) }
}

/// [`row_sums`] for f32 rows, or f16 rows when `F16` (converted to f32 exactly as loaded);
/// `ld` counts elements.
///
/// # Safety
/// `k` must point to `8·B` readable rows of `dk` elements, `ld` apart; `out` has `8·B`.
#[inline(always)]
unsafe fn row_sums_of<S: Simd, const B: usize, const L1: bool, const F16: bool>(
    k: *const u8,
    ld: usize,
    dk: usize,
    out: &mut [f32],
) {
    // SAFETY: `S`'s CPU features are present (the `Simd` contract); `k` holds `8·B` rows of `dk`
    // elements `ld` apart and `out` `8·B` (this fn's contract)
    unsafe {
        // |x| as max(x, 0 - x): NaN stays NaN, and -0 gives -0, which adds to a +0 sum as +0
        let term = |x: S::V| {
            if L1 {
                S::max(x, S::sub(S::zero(), x))
            } else {
                S::mul(x, x)
            }
        };
        let load = |i: usize| load_key::<S, F16>(k, i);
        let elem = |i: usize| key_elem::<F16>(k, i);
        let mut acc = [S::zero(); B];
        let d8 = dk / 8 * 8;
        let mut d = 0;
        while d < d8 {
            for (j, a) in acc.iter_mut().enumerate() {
                // 8 dims of 8 keys, turned so that vector i holds dim d + i of the 8 keys
                // a plain loop, not `array::from_fn` (its closure may stay outlined)
                let mut x = [S::zero(); 8];
                for (l, x) in x.iter_mut().enumerate() {
                    *x = load((8 * j + l) * ld + d);
                }
                let x = S::transpose8(x);
                for xi in x {
                    *a = S::add(*a, term(xi));
                }
            }
            d += 8;
        }
        let mut col = [0f32; 8];
        for d in d8..dk {
            for (j, a) in acc.iter_mut().enumerate() {
                for (l, c) in col.iter_mut().enumerate() {
                    *c = elem((8 * j + l) * ld + d);
                }
                let x = S::load(col.as_ptr());
                *a = S::add(*a, term(x));
            }
        }
        for (j, a) in acc.into_iter().enumerate() {
            S::store(out[8 * j..8 * j + 8].as_mut_ptr(), a);
        }
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;
    use crate::lanes::tests::{spread, sum_squares, KeyLayouts};
    use std::vec;

    /// Every key's score is `-sqrt` of the lane-order sum of its row as f32, bit for bit,
    /// whatever path it takes (AVX-512 blocks of 16, blocks of 8, the row path for the last
    /// keys and for bf16 / strided rows): f32, f16 and bf16, head-major and token rows, dims
    /// that are not whole chunks of 16, key counts that are not whole blocks. Run natively,
    /// with `KVEVICT_NO_AVX512=1` and with `KVEVICT_PORTABLE=1`, it checks each path.
    #[test]
    fn scores_follow_lane_order_on_every_path() {
        for &(hkv, n, dk) in &[
            (2, 77, 64),
            (1, 40, 128),
            (3, 35, 20),
            (1, 53, 7),
            (2, 16, 48),
        ] {
            let keys = KeyLayouts::new(spread(hkv * n * dk, (n * dk) as u64), hkv, n, dk);
            let views = keys.views();
            for (vi, k) in views.iter().enumerate() {
                let (mut ta, mut tb, mut acc, mut row) =
                    (vec![0f32; n], vec![0f32; n], vec![0f32; n], vec![0f32; dk]);
                let mut bufs = Bufs {
                    tmp_a: &mut ta,
                    tmp_b: &mut tb,
                    acc: &mut acc,
                    row: &mut row,
                };
                for kh in 0..hkv {
                    let p = n - 3; // a window of 3
                    let mut dst = vec![f32::NAN; p];
                    score(k, kh, &mut bufs, &mut dst);
                    let mut x = vec![0f32; dk];
                    for (t, &s) in dst.iter().enumerate() {
                        k.load_row(kh, t, &mut x);
                        let want = -libm::sqrtf(sum_squares(&x));
                        let what = std::format!("n {n} dk {dk} view {vi} head {kh} key {t}");
                        assert_eq!(s.to_bits(), want.to_bits(), "{what}");
                    }
                }
            }
        }
    }
}
