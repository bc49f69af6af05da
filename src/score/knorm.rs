//! KNorm (SPEC §3): `-||K[kh,i]||_2`, no queries needed.
//!
//! Each norm is `Σ_d x_d·x_d` summed in dimension order, every product and sum rounded to
//! f32 (what the original scalar loop did, so scores are bit-identical to it). Keys held as
//! f32 rows with unit element stride run eight at a time, one key per vector lane: the
//! lanes keep each key's order, and the adds of eight keys overlap instead of waiting on
//! one chain. Other dtypes and layouts take the scalar loop.
use super::Bufs;
use crate::numerics::{all_finite, dispatch, Simd};
use crate::view::{DType, View};

/// Whether every key of every head is finite (vectorised; f32 rows read in place, others
/// converted 8 at a time).
pub(super) fn keys_finite(keys: &View, _bufs: &mut Bufs) -> bool {
    let [hkv, n, dk] = keys.extent();
    let st = keys.stride();
    if keys.dtype() != DType::F32 || st[2] != 1 {
        return crate::gram::values_finite(keys, 0, n);
    }
    let base = keys.byte_range().0 as *const f32;
    dispatch!(fn(base: *const f32, st: [usize; 3], hkv: usize, n: usize, dk: usize) -> bool, S => {
        (0..hkv).all(|h| {
            (0..n).all(|t| {
                // SAFETY: row (h, t, 0..dk) is inside the view's extent, which the view
                // proved in bounds at construction; `byte_range` gives back its pointer.
                let row = unsafe { core::slice::from_raw_parts(base.add(h * st[0] + t * st[1]), dk) };
                all_finite::<S>(row)
            })
        })
    })
}

pub(super) fn score(keys: &View, kh: usize, bufs: &mut Bufs, dst: &mut [f32]) {
    let [_, _, dk] = keys.extent();
    let st = keys.stride();
    let lanes = if keys.dtype() == DType::F32 && st[2] == 1 {
        dst.len() / 8 * 8
    } else {
        0
    };
    if lanes > 0 {
        assert!(kh < keys.extent()[0] && lanes <= keys.extent()[1]);
        // SAFETY: rows (kh, 0..lanes, 0..dk) are inside the view's extent, which the view
        // proved in bounds at construction; `byte_range` gives back its pointer.
        let base = unsafe { (keys.byte_range().0 as *const f32).add(kh * st[0]) };
        let (ld, head) = (st[1], &mut dst[..lanes]);
        dispatch!(fn(base: *const f32, ld: usize, dk: usize, head: &mut [f32]) -> (), S => {
            // two blocks of 8 keys at a time: two independent add chains
            let mut pairs = head.chunks_exact_mut(16);
            let mut t = 0;
            for out in &mut pairs {
                // SAFETY: keys t .. t+16 (< lanes), each dk floats, ld apart.
                unsafe { row_sums::<S, 2, false>(base.add(t * ld), ld, dk, out) };
                t += 16;
            }
            let rest = pairs.into_remainder();
            if !rest.is_empty() {
                // SAFETY: keys t .. t+8 (< lanes).
                unsafe { row_sums::<S, 1, false>(base.add(t * ld), ld, dk, rest) };
            }
            for v in head.iter_mut() {
                *v = -libm::sqrtf(*v);
            }
        });
    }
    for (t, v) in dst.iter_mut().enumerate().skip(lanes) {
        keys.load_row(kh, t, bufs.row);
        let s: f32 = bufs.row[..dk].iter().map(|x| x * x).sum();
        *v = -libm::sqrtf(s);
    }
}

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
    // SAFETY: `S`'s CPU features are present (the `Simd` contract); `k` holds `8·B` rows of `dk` floats `ld` apart and `out` `8·B` (this fn's contract)
    unsafe {
        // |x| as max(x, 0 - x): NaN stays NaN, and -0 gives -0, which adds to a +0 sum as +0
        let term = |x: S::V| {
            if L1 {
                S::max(x, S::sub(S::zero(), x))
            } else {
                S::mul(x, x)
            }
        };
        let mut acc = [S::zero(); B];
        let d8 = dk / 8 * 8;
        let mut d = 0;
        while d < d8 {
            for (j, a) in acc.iter_mut().enumerate() {
                // 8 dims of 8 keys, turned so that vector i holds dim d + i of the 8 keys
                // a plain loop, not `array::from_fn` (its closure may stay outlined)
                let mut x = [S::zero(); 8];
                for (l, x) in x.iter_mut().enumerate() {
                    *x = S::load(k.add((8 * j + l) * ld + d));
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
                    *c = *k.add((8 * j + l) * ld + d);
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
