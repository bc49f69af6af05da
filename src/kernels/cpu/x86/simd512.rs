//! `Avx512`: the AVX2 [`Simd`] (8 lanes, the same operations, the same bits) inside
//! functions built with AVX-512 F + VL, whose [`Simd::exp_neg4`] runs as two 16-lane exps
//! (half the instructions of four 8-lane ones) and whose callers get 32 vector registers
//! and the AVX-512 Q·Kᵀ ([`crate::gemm512`]). [`dispatch_wide!`] picks it for the window
//! pass when [`crate::gemm512::available`]. Built with Rust >= 1.89 only (`kvevict_avx512`).
#![allow(clippy::incompatible_msrv)]

use crate::numerics::{Avx2, Simd};
use core::arch::x86_64::*;

#[derive(Clone, Copy)]
pub(crate) struct Avx512;

/// Two 8-lane vectors as one 16-lane vector (`a` low, `b` high) and back.
#[inline(always)]
pub(crate) unsafe fn join(a: __m256, b: __m256) -> __m512 {
    // SAFETY: AVX-512 F is present (`Avx512` is only used where `gemm512::available`); register casts only
    unsafe {
        let lo = _mm512_castpd256_pd512(_mm256_castps_pd(a));
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(lo, _mm256_castps_pd(b)))
    }
}
#[inline(always)]
pub(crate) unsafe fn split(v: __m512) -> (__m256, __m256) {
    // SAFETY: AVX-512 F is present (as `join`); register casts only
    unsafe {
        let d = _mm512_castps_pd(v);
        (
            _mm256_castpd_ps(_mm512_castpd512_pd256(d)),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(d)),
        )
    }
}

/// `numerics::exp_neg` on two 16-lane vectors: the AVX2 `exp_neg4`'s values, lane for lane,
/// in fewer instructions: the clamp as `max(-87, x)` (NaN kept, as the blend keeps it), floor
/// as roundscale 0x09, the same FMAs, `p·2^n` as `scalef` (the same single rounding of the
/// same product: `2^n` is exact and normal for n >= -126) with the cut-off below -87.3 as
/// its zero mask (`!(x < -87.3)`: NLT_UQ).
#[inline(always)]
pub(crate) unsafe fn exp_neg2(x: [__m512; 2]) -> [__m512; 2] {
    // SAFETY: AVX-512 F is present (as `join`); lane-wise arithmetic on registers only
    unsafe {
        let lo = _mm512_set1_ps(-87.0);
        // max(a, b) is `a > b ? a : b`: x when x is NaN, like the AVX2 blend on `x < -87`
        let xc = x.map(|v| _mm512_max_ps(lo, v));
        let (l2e, half) = (
            _mm512_set1_ps(core::f32::consts::LOG2_E),
            _mm512_set1_ps(0.5),
        );
        let n = xc.map(|v| _mm512_roundscale_ps::<0x09>(_mm512_fmadd_ps(v, l2e, half)));
        let (hi, lo2) = (_mm512_set1_ps(0.693_359_4), _mm512_set1_ps(-2.121_944_4e-4));
        let r = [
            _mm512_fnmadd_ps(n[0], hi, xc[0]),
            _mm512_fnmadd_ps(n[1], hi, xc[1]),
        ];
        let r = [
            _mm512_fnmadd_ps(n[0], lo2, r[0]),
            _mm512_fnmadd_ps(n[1], lo2, r[1]),
        ];
        let mut p = [_mm512_set1_ps(1.987_569_1e-4); 2];
        for c in crate::kernels::cpu::portable::simd::EXP_POLY {
            let cv = _mm512_set1_ps(c);
            p = [
                _mm512_fmadd_ps(p[0], r[0], cv),
                _mm512_fmadd_ps(p[1], r[1], cv),
            ];
        }
        let p = [
            _mm512_fmadd_ps(_mm512_mul_ps(p[0], r[0]), r[0], r[0]),
            _mm512_fmadd_ps(_mm512_mul_ps(p[1], r[1]), r[1], r[1]),
        ];
        let one = _mm512_set1_ps(1.0);
        let p = p.map(|v| _mm512_add_ps(v, one));
        let min = _mm512_set1_ps(-87.3);
        // lanes not below -87.3 (NaN included) get p·2^n, the others 0
        let keep = x.map(|v| _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(v, min));
        [
            _mm512_maskz_scalef_ps(keep[0], p[0], n[0]),
            _mm512_maskz_scalef_ps(keep[1], p[1], n[1]),
        ]
    }
}

macro_rules! delegate {
    ($($name:ident($($a:ident: $t:ty),*) -> $r:ty;)*) => {$(
        #[inline(always)]
        unsafe fn $name($($a: $t),*) -> $r {
            // SAFETY: AVX-512 implies the AVX2 + FMA + F16C of `Avx2`; the arguments carry
            // this fn's own `Simd` contract to the same function of `Avx2`
            unsafe { Avx2::$name($($a),*) }
        }
    )*};
}

impl Simd for Avx512 {
    type V = __m256;
    const AVX2: bool = true;
    delegate! {
        zero() -> __m256;
        splat(x: f32) -> __m256;
        load(p: *const f32) -> __m256;
        store(p: *mut f32, v: __m256) -> ();
        load_f16(p: *const u16) -> __m256;
        add(a: __m256, b: __m256) -> __m256;
        sub(a: __m256, b: __m256) -> __m256;
        mul(a: __m256, b: __m256) -> __m256;
        fma(a: __m256, b: __m256, c: __m256) -> __m256;
        max(a: __m256, b: __m256) -> __m256;
        min(a: __m256, b: __m256) -> __m256;
        exp_neg(x: __m256) -> __m256;
        sqrt(x: __m256) -> __m256;
        gt_mask(a: __m256, b: __m256) -> u32;
        hsum(v: __m256) -> f32;
        transpose8(v: [__m256; 8]) -> [__m256; 8];
        hsum8(v: [__m256; 8]) -> __m256;
    }
    #[inline(always)]
    unsafe fn exp_neg4(x: [__m256; 4]) -> [__m256; 4] {
        // SAFETY: AVX-512 F + VL are present (as `join`); the two halves are registers
        unsafe {
            let [a, b] = exp_neg2([join(x[0], x[1]), join(x[2], x[3])]);
            let ((a0, a1), (b0, b1)) = (split(a), split(b));
            [a0, a1, b0, b1]
        }
    }
}

/// [`crate::numerics::dispatch!`] with one more level: `Avx512` in a function built with
/// AVX-512 F + VL when [`crate::gemm512::available`], else as `dispatch!`.
macro_rules! dispatch_wide {
    (fn($($arg:ident : $ty:ty),* $(,)?) -> $ret:ty, $S:ident => $body:block) => {{
        #[inline(always)]
        fn body_wide<$S: $crate::numerics::Simd>($($arg: $ty),*) -> $ret $body
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
        unsafe fn wide($($arg: $ty),*) -> $ret {
            body_wide::<$crate::simd512::Avx512>($($arg),*)
        }
        if $crate::numerics::has_avx2() && $crate::gemm512::available() {
            // SAFETY: the CPU has avx2, fma, f16c, avx512f and avx512vl (checked just above).
            unsafe { wide($($arg),*) }
        } else {
            $crate::numerics::dispatch!(fn($($arg: $ty),*) -> $ret, $S => $body)
        }
    }};
}
pub(crate) use dispatch_wide;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numerics::has_avx2;
    use std::vec::Vec;

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
    unsafe fn both(x: &[f32; 32]) -> ([f32; 32], [f32; 32]) {
        // SAFETY: the features are enabled on this fn (its caller checked the CPU); every
        // load and store is one of 4 groups of 8 inside the 32-float arrays
        unsafe {
            let v: [__m256; 4] = [0, 8, 16, 24].map(|o| Avx2::load(x.as_ptr().add(o)));
            let (a, b) = (Avx2::exp_neg4(v), Avx512::exp_neg4(v));
            let (mut oa, mut ob) = ([0f32; 32], [0f32; 32]);
            for j in 0..4 {
                Avx2::store(oa.as_mut_ptr().add(8 * j), a[j]);
                Avx2::store(ob.as_mut_ptr().add(8 * j), b[j]);
            }
            (oa, ob)
        }
    }

    /// The 16-lane exp gives the 8-lane one's bits, over [-100, 0] finely, the clamp and
    /// cut-off edges, zeros, -inf and NaN (the domain: x <= 0, as `numerics::exp_neg`).
    #[test]
    fn exp_neg4_matches_avx2_bits() {
        if !(has_avx2() && crate::gemm512::available()) {
            return; // nothing to compare on this CPU
        }
        let mut xs: Vec<f32> = (0..200_000).map(|i| -(i as f32) * 5e-4).collect();
        xs.extend(crate::numerics::tests::EXP_EDGES);
        xs.push(f32::NAN);
        while xs.len() % 32 != 0 {
            xs.push(-1.0);
        }
        for c in xs.chunks(32) {
            // SAFETY: the CPU features were checked above.
            let (a, b) = unsafe { both(c.try_into().unwrap()) };
            for i in 0..32 {
                assert_eq!(a[i].to_bits(), b[i].to_bits(), "x = {}", c[i]);
            }
        }
    }
}
