//! The 8-lane vector operations ([`Simd`]) on AVX2 + FMA + F16C.

use crate::kernels::cpu::portable::simd::{Simd, EXP_POLY};
use core::arch::x86_64::*;

/// AVX2 + FMA + F16C. Only reached through functions with those target features,
/// after run-time detection (`numerics::has_avx2`).
#[derive(Clone, Copy)]
pub(crate) struct Avx2;

impl Simd for Avx2 {
    type V = __m256;
    const AVX2: bool = true;
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        // SAFETY: the CPU has avx2 (the `Simd` contract); no memory is touched.
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m256 {
        // SAFETY: the CPU has avx2 (the `Simd` contract); no memory is touched.
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        // SAFETY: the CPU has avx2 (the `Simd` contract) and `p` holds 8 floats (the caller's).
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        // SAFETY: the CPU has avx2 (the `Simd` contract) and `p` holds 8 writable floats (the
        // caller's).
        unsafe { _mm256_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> __m256 {
        // SAFETY: the CPU has avx2 and f16c (the `Simd` contract) and `p` holds 8 u16 (the
        // caller's).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the CPU has avx2 (the `Simd` contract); no memory is touched.
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn sub(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the CPU has avx2 (the `Simd` contract); no memory is touched.
        unsafe { _mm256_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the CPU has avx2 (the `Simd` contract); no memory is touched.
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: the CPU has fma (the `Simd` contract); no memory is touched.
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn max(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the CPU has avx2 (the `Simd` contract); no memory is touched.
        unsafe {
            // vmaxps(x, y) = x > y ? x : y (y when either is NaN)
            _mm256_max_ps(b, a)
        }
    }
    #[inline(always)]
    unsafe fn min(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the CPU has avx2 (the `Simd` contract); no memory is touched.
        unsafe {
            // vminps(x, y) = x < y ? x : y (y when either is NaN)
            _mm256_min_ps(b, a)
        }
    }
    #[inline(always)]
    unsafe fn gt_mask(a: __m256, b: __m256) -> u32 {
        // SAFETY: the CPU has avx2 (the `Simd` contract); no memory is touched.
        unsafe { _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(a, b)) as u32 }
    }
    #[inline(always)]
    unsafe fn exp_neg(x: __m256) -> __m256 {
        // SAFETY: the CPU has avx2 and fma (the `Simd` contract); no memory is touched.
        unsafe { exp_steps([x])[0] }
    }
    #[inline(always)]
    unsafe fn transpose8(v: [__m256; 8]) -> [__m256; 8] {
        // SAFETY: the CPU has avx2 (the `Simd` contract); no memory is touched.
        unsafe {
            // pairs of rows interleaved, then 64-bit pairs, then 128-bit halves
            let t0 = _mm256_unpacklo_ps(v[0], v[1]);
            let t1 = _mm256_unpackhi_ps(v[0], v[1]);
            let t2 = _mm256_unpacklo_ps(v[2], v[3]);
            let t3 = _mm256_unpackhi_ps(v[2], v[3]);
            let t4 = _mm256_unpacklo_ps(v[4], v[5]);
            let t5 = _mm256_unpackhi_ps(v[4], v[5]);
            let t6 = _mm256_unpacklo_ps(v[6], v[7]);
            let t7 = _mm256_unpackhi_ps(v[6], v[7]);
            let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            [
                _mm256_permute2f128_ps::<0x20>(u0, u4),
                _mm256_permute2f128_ps::<0x20>(u1, u5),
                _mm256_permute2f128_ps::<0x20>(u2, u6),
                _mm256_permute2f128_ps::<0x20>(u3, u7),
                _mm256_permute2f128_ps::<0x31>(u0, u4),
                _mm256_permute2f128_ps::<0x31>(u1, u5),
                _mm256_permute2f128_ps::<0x31>(u2, u6),
                _mm256_permute2f128_ps::<0x31>(u3, u7),
            ]
        }
    }
    #[inline(always)]
    unsafe fn hsum8(v: [__m256; 8]) -> __m256 {
        // SAFETY: the CPU has avx2 (the `Simd` contract); no memory is touched.
        unsafe {
            // x = (0+4, 1+5, 2+6, 3+7) of keys k and k + 4 side by side: [x_k | x_k+4]
            let x = |a: __m256, b: __m256| {
                let lo = _mm256_permute2f128_ps::<0x20>(a, b);
                _mm256_add_ps(lo, _mm256_permute2f128_ps::<0x31>(a, b))
            };
            let x = [x(v[0], v[4]), x(v[1], v[5]), x(v[2], v[6]), x(v[3], v[7])];
            // y = (x0 + x2, x1 + x3) of two keys: [y_k y_k+1 | y_k+4 y_k+5]
            let y = |a: __m256, b: __m256| {
                let l = _mm256_shuffle_ps::<0x44>(a, b);
                _mm256_add_ps(l, _mm256_shuffle_ps::<0xEE>(a, b))
            };
            let (c, d) = (y(x[0], x[1]), y(x[2], x[3]));
            // y0 + y1, keys 0..4 | 4..8
            let l = _mm256_shuffle_ps::<0x88>(c, d);
            _mm256_add_ps(l, _mm256_shuffle_ps::<0xDD>(c, d))
        }
    }
    #[inline(always)]
    unsafe fn exp_neg4(x: [__m256; 4]) -> [__m256; 4] {
        // SAFETY: the CPU has avx2 and fma (the `Simd` contract); no memory is touched.
        unsafe { exp4(x) }
    }
    #[inline(always)]
    unsafe fn sqrt(x: __m256) -> __m256 {
        // SAFETY: AVX (part of AVX2) is present: the `Simd` contract of `Avx2`
        unsafe { _mm256_sqrt_ps(x) }
    }
    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        // SAFETY: the CPU has avx2 (the `Simd` contract); no memory is touched.
        unsafe {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
            _mm_cvtss_f32(s)
        }
    }
}

/// One instruction `$op d, a, b` (Intel syntax) on 4 vectors as 4 consecutive
/// instructions: `d[j] = op(d[j], a_j, b_j)` for `j < 4`, registers only.
macro_rules! step4 {
    ($op:literal, $d:ident, $a0:expr, $a1:expr, $a2:expr, $a3:expr, $b0:expr, $b1:expr, $b2:expr, $b3:expr) => {
        core::arch::asm!(
            concat!($op, " {d0}, {a0}, {b0}"),
            concat!($op, " {d1}, {a1}, {b1}"),
            concat!($op, " {d2}, {a2}, {b2}"),
            concat!($op, " {d3}, {a3}, {b3}"),
            d0 = inout(ymm_reg) $d[0],
            d1 = inout(ymm_reg) $d[1],
            d2 = inout(ymm_reg) $d[2],
            d3 = inout(ymm_reg) $d[3],
            a0 = in(ymm_reg) $a0,
            a1 = in(ymm_reg) $a1,
            a2 = in(ymm_reg) $a2,
            a3 = in(ymm_reg) $a3,
            b0 = in(ymm_reg) $b0,
            b1 = in(ymm_reg) $b1,
            b2 = in(ymm_reg) $b2,
            b3 = in(ymm_reg) $b3,
            options(pure, nomem, nostack, preserves_flags),
        )
    };
}

/// [`exp_steps`] of 4 vectors (the same operations, so the same bits) with its
/// multiply-add chains written as blocks of 4 consecutive instructions, one per vector:
/// LLVM otherwise re-serialises the interleaved chains (one vector's Horner steps, then
/// the next's) and, with 16 registers, the out-of-order window then holds too few
/// independent FMAs to keep both pipes busy (SmolLM2 `snapkv`: 48 → 56 % of sgemm).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp4(x: [__m256; 4]) -> [__m256; 4] {
    // SAFETY: the CPU has avx2 and fma (this fn's features, its callers' contract); every
    // instruction reads and writes registers only.
    unsafe {
        let lo = _mm256_set1_ps(-87.0);
        let mut xc = x;
        for v in xc.iter_mut() {
            *v = _mm256_max_ps(lo, *v);
        }
        // the macro's operands: one register for all four, or each vector's own
        macro_rules! one {
            ($op:literal, $d:ident, $a:expr, $b:expr) => {{
                let (a, b) = ($a, $b);
                step4!($op, $d, a, a, a, a, b, b, b, b)
            }};
        }
        macro_rules! each {
            ($op:literal, $d:ident, $a:expr, $b:expr) => {{
                let (a, b) = ($a, $b);
                step4!($op, $d, a[0], a[1], a[2], a[3], b, b, b, b)
            }};
        }
        // t = xc·log2 e + 0.5 (fmadd213: d = d·a + b), then n = floor(t)
        let mut n = xc;
        one!(
            "vfmadd213ps",
            n,
            _mm256_set1_ps(core::f32::consts::LOG2_E),
            _mm256_set1_ps(0.5)
        );
        for v in n.iter_mut() {
            *v = _mm256_round_ps::<0x09>(*v);
        }
        // r = xc - n·hi - n·lo (fnmadd231: d = -(a·b) + d)
        let mut r = xc;
        each!("vfnmadd231ps", r, n, _mm256_set1_ps(0.693_359_4));
        each!("vfnmadd231ps", r, n, _mm256_set1_ps(-2.121_944_4e-4));
        let mut p = [_mm256_set1_ps(1.987_569_1e-4); 4];
        for c in EXP_POLY {
            each!("vfmadd213ps", p, r, _mm256_set1_ps(c));
        }
        // p = (p·r)·r + r: vmulps d = d·a, then fmadd231 d' = a·b + d' with d' = r
        let mut q = p;
        step4!("vmulps", q, q[0], q[1], q[2], q[3], r[0], r[1], r[2], r[3]);
        let mut rr = r;
        step4!(
            "vfmadd231ps",
            rr,
            q[0],
            q[1],
            q[2],
            q[3],
            r[0],
            r[1],
            r[2],
            r[3]
        );
        let (one, magic) = (_mm256_set1_ps(1.0), _mm256_set1_ps(12_582_912.0 + 127.0));
        let min = _mm256_set1_ps(-87.3);
        let mut y = rr;
        for j in 0..4 {
            let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(_mm256_add_ps(n[j], magic)));
            let v = _mm256_mul_ps(_mm256_add_ps(rr[j], one), _mm256_castsi256_ps(e));
            y[j] = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(x[j], min), v);
        }
        y
    }
}

/// `exp_neg` of `K` vectors, each step applied to all `K` before the next: the scalar
/// [`exp_neg`](crate::kernels::cpu::portable::simd::exp_neg)'s fused steps lane for lane (`Simd::exp_neg`'s bits), in fewer
/// instructions than their plain transcription: the clamp as `max(-87, x)` (x when x is
/// NaN, as the blend on `x < -87` kept it), and `2^n` built by adding `n` to
/// `1.5·2^23 + 127` (exact: |n| <= 127), whose low 9 bits, shifted to the exponent
/// field, are `n + 127` — no float-to-int conversion, no integer add. The product
/// `p·2^n` and the cut-off below -87.3 are as before (the same single rounding).
#[inline]
#[target_feature(enable = "avx2,fma")]
// the block is needed before Rust 1.87, where intrinsics became safe in such a fn
#[allow(unused_unsafe)]
unsafe fn exp_steps<const K: usize>(x: [__m256; K]) -> [__m256; K] {
    // SAFETY: the CPU has avx2 and fma (our callers' `Simd` contract); registers only.
    unsafe {
        let lo = _mm256_set1_ps(-87.0);
        let mut xc = x;
        for v in xc.iter_mut() {
            *v = _mm256_max_ps(lo, *v);
        }
        let (l2e, half) = (
            _mm256_set1_ps(core::f32::consts::LOG2_E),
            _mm256_set1_ps(0.5),
        );
        let mut n = xc;
        for v in n.iter_mut() {
            *v = _mm256_round_ps::<0x09>(_mm256_fmadd_ps(*v, l2e, half));
        }
        let (hi, lo2) = (_mm256_set1_ps(0.693_359_4), _mm256_set1_ps(-2.121_944_4e-4));
        let mut r = xc;
        for j in 0..K {
            r[j] = _mm256_fnmadd_ps(n[j], hi, r[j]);
        }
        for j in 0..K {
            r[j] = _mm256_fnmadd_ps(n[j], lo2, r[j]);
        }
        let mut p = [_mm256_set1_ps(1.987_569_1e-4); K];
        for c in EXP_POLY {
            let cv = _mm256_set1_ps(c);
            for j in 0..K {
                p[j] = _mm256_fmadd_ps(p[j], r[j], cv);
            }
        }
        for j in 0..K {
            p[j] = _mm256_fmadd_ps(_mm256_mul_ps(p[j], r[j]), r[j], r[j]);
        }
        let (one, magic) = (_mm256_set1_ps(1.0), _mm256_set1_ps(12_582_912.0 + 127.0));
        let min = _mm256_set1_ps(-87.3);
        let mut y = p;
        for j in 0..K {
            let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(_mm256_add_ps(n[j], magic)));
            let v = _mm256_mul_ps(_mm256_add_ps(p[j], one), _mm256_castsi256_ps(e));
            y[j] = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(x[j], min), v);
        }
        y
    }
}
