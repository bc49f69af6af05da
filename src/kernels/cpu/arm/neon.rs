//! The 8-lane vector operations ([`Simd`]) on AArch64 Advanced SIMD (NEON).

use crate::kernels::cpu::portable::simd::{Simd, EXP_POLY};
use core::arch::aarch64::*;

/// AArch64 Advanced SIMD (NEON): an 8-lane vector as two 4-lane registers (lanes 0-3,
/// 4-7), every operation AVX2's per lane (fused multiply-adds, the same exp
/// steps, `hsum`'s tree), so the same bits. NEON is part of the AArch64 base
/// architecture: chosen at compile time (`numerics::has_neon`).
#[derive(Clone, Copy)]
pub(crate) struct Neon;

/// `Simd` methods applying a 4-lane function to both halves of their vectors.
macro_rules! lanewise {
    ($($name:ident($($a:ident),+) => $f:ident;)*) => {$(
        #[inline(always)]
        unsafe fn $name($($a: [float32x4_t; 2]),+) -> [float32x4_t; 2] {
            // SAFETY: NEON is present (the `Simd` contract); registers only
            unsafe { [$f($($a[0]),+), $f($($a[1]),+)] }
        }
    )*};
}

/// `if b > a { b } else { a }` (Avx2's `vmaxps(b, a)`: NaN in `b` ignored, ±0 keep `a`).
#[inline(always)]
unsafe fn max4(a: float32x4_t, b: float32x4_t) -> float32x4_t {
    // SAFETY: NEON is present (the `Simd` contract); registers only
    unsafe { vbslq_f32(vcgtq_f32(b, a), b, a) }
}

/// `if b < a { b } else { a }`.
#[inline(always)]
unsafe fn min4(a: float32x4_t, b: float32x4_t) -> float32x4_t {
    // SAFETY: NEON is present (the `Simd` contract); registers only
    unsafe { vbslq_f32(vcltq_f32(b, a), b, a) }
}

/// `numerics::exp_neg` on 4 lanes, the steps of `Avx2::exp_neg`.
#[inline(always)]
unsafe fn exp4(x: float32x4_t) -> float32x4_t {
    // SAFETY: NEON is present (the `Simd` contract); registers only
    unsafe {
        let lo = vdupq_n_f32(-87.0);
        // x < -87 ? -87 : x (NaN kept)
        let xc = vbslq_f32(vcltq_f32(x, lo), lo, x);
        let t = vfmaq_f32(vdupq_n_f32(0.5), xc, vdupq_n_f32(core::f32::consts::LOG2_E));
        let n = vrndmq_f32(t);
        let r = vfmsq_f32(xc, n, vdupq_n_f32(0.693_359_4));
        let r = vfmsq_f32(r, n, vdupq_n_f32(-2.121_944_4e-4));
        let mut p = vdupq_n_f32(1.987_569_1e-4);
        for c in EXP_POLY {
            p = vfmaq_f32(vdupq_n_f32(c), p, r);
        }
        let p = vfmaq_f32(r, vmulq_f32(p, r), r);
        let p = vaddq_f32(p, vdupq_n_f32(1.0));
        let e = vshlq_n_s32::<23>(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)));
        let y = vmulq_f32(p, vreinterpretq_f32_s32(e));
        let under = vcltq_f32(x, vdupq_n_f32(-87.3));
        vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(y), under))
    }
}

/// The 4×4 transpose: lane `j` of output `i` is lane `i` of input `j`.
#[inline(always)]
unsafe fn transpose4(v: [float32x4_t; 4]) -> [float32x4_t; 4] {
    // SAFETY: NEON is present (the `Simd` contract); registers only
    unsafe {
        let t0 = vtrn1q_f32(v[0], v[1]);
        let t1 = vtrn2q_f32(v[0], v[1]);
        let t2 = vtrn1q_f32(v[2], v[3]);
        let t3 = vtrn2q_f32(v[2], v[3]);
        let d = |x: float32x4_t| vreinterpretq_f64_f32(x);
        let f = |x: float64x2_t| vreinterpretq_f32_f64(x);
        [
            f(vtrn1q_f64(d(t0), d(t2))),
            f(vtrn1q_f64(d(t1), d(t3))),
            f(vtrn2q_f64(d(t0), d(t2))),
            f(vtrn2q_f64(d(t1), d(t3))),
        ]
    }
}

impl Simd for Neon {
    type V = [float32x4_t; 2];
    const FUSED: bool = true;
    #[inline(always)]
    unsafe fn zero() -> Self::V {
        // SAFETY: NEON is present (the `Simd` contract); no memory is touched.
        unsafe { [vdupq_n_f32(0.0); 2] }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self::V {
        // SAFETY: NEON is present (the `Simd` contract); no memory is touched.
        unsafe { [vdupq_n_f32(x); 2] }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self::V {
        // SAFETY: NEON is present and `p` holds 8 floats (the caller's).
        unsafe { [vld1q_f32(p), vld1q_f32(p.add(4))] }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self::V) {
        // SAFETY: NEON is present and `p` holds 8 writable floats (the caller's).
        unsafe {
            vst1q_f32(p, v[0]);
            vst1q_f32(p.add(4), v[1]);
        }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> Self::V {
        // SAFETY: NEON is present and `p` holds 8 u16 (the caller's). FCVTL/FCVTL2
        // (half to single, AArch64 base Advanced SIMD: no `fp16` feature needed) are
        // exact, NaNs quieted with their payload kept, as F16C and `half`.
        unsafe {
            let h = vld1q_u16(p);
            let (lo, hi): (float32x4_t, float32x4_t);
            core::arch::asm!(
                "fcvtl {lo:v}.4s, {h:v}.4h",
                "fcvtl2 {hi:v}.4s, {h:v}.8h",
                h = in(vreg) h,
                lo = out(vreg) lo,
                hi = out(vreg) hi,
                options(pure, nomem, nostack, preserves_flags)
            );
            [lo, hi]
        }
    }
    lanewise! {
        add(a, b) => vaddq_f32;
        sub(a, b) => vsubq_f32;
        mul(a, b) => vmulq_f32;
        max(a, b) => max4;
        min(a, b) => min4;
        exp_neg(x) => exp4;
        sqrt(x) => vsqrtq_f32; // FSQRT: IEEE, correctly rounded
    }
    #[inline(always)]
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        // SAFETY: NEON is present (the `Simd` contract); no memory is touched.
        unsafe { [vfmaq_f32(c[0], a[0], b[0]), vfmaq_f32(c[1], a[1], b[1])] }
    }
    #[inline(always)]
    unsafe fn gt_mask(a: Self::V, b: Self::V) -> u32 {
        // SAFETY: NEON is present (the `Simd` contract); no memory is touched.
        unsafe {
            let bit = vld1q_u32([1u32, 2, 4, 8].as_ptr());
            let lo = vaddvq_u32(vandq_u32(vcgtq_f32(a[0], b[0]), bit));
            let hi = vaddvq_u32(vandq_u32(vcgtq_f32(a[1], b[1]), bit));
            lo | hi << 4
        }
    }
    #[inline(always)]
    unsafe fn hsum(v: Self::V) -> f32 {
        // SAFETY: NEON is present (the `Simd` contract); no memory is touched.
        unsafe {
            // (0+4, 1+5, 2+6, 3+7), then ((0+4)+(2+6)) and ((1+5)+(3+7)), then their sum
            let s = vaddq_f32(v[0], v[1]);
            let s = vadd_f32(vget_low_f32(s), vget_high_f32(s));
            vget_lane_f32::<0>(s) + vget_lane_f32::<1>(s)
        }
    }
    #[inline(always)]
    unsafe fn hsum8(v: [Self::V; 8]) -> Self::V {
        // SAFETY: NEON is present (the `Simd` contract); no memory is touched.
        unsafe {
            // x = (0+4, 1+5, 2+6, 3+7) per key
            let x: [float32x4_t; 8] = core::array::from_fn(|k| vaddq_f32(v[k][0], v[k][1]));
            // (x0 + x2, x1 + x3) of two keys side by side
            let y = |a: float32x4_t, b: float32x4_t| {
                let (a, b) = (vreinterpretq_f64_f32(a), vreinterpretq_f64_f32(b));
                let l = vreinterpretq_f32_f64(vtrn1q_f64(a, b));
                vaddq_f32(l, vreinterpretq_f32_f64(vtrn2q_f64(a, b)))
            };
            // FADDP: y0 + y1, pairwise
            [
                vpaddq_f32(y(x[0], x[1]), y(x[2], x[3])),
                vpaddq_f32(y(x[4], x[5]), y(x[6], x[7])),
            ]
        }
    }
    #[inline(always)]
    unsafe fn transpose8(v: [Self::V; 8]) -> [Self::V; 8] {
        // SAFETY: NEON is present (the `Simd` contract); no memory is touched.
        unsafe {
            // four 4×4 blocks: (rows 0-3 | 4-7) × (lanes 0-3 | 4-7)
            let b =
                |r: usize, h: usize| transpose4([v[r][h], v[r + 1][h], v[r + 2][h], v[r + 3][h]]);
            let (a0, a1, b0, b1) = (b(0, 0), b(4, 0), b(0, 1), b(4, 1));
            [
                [a0[0], a1[0]],
                [a0[1], a1[1]],
                [a0[2], a1[2]],
                [a0[3], a1[3]],
                [b0[0], b1[0]],
                [b0[1], b1[1]],
                [b0[2], b1[2]],
                [b0[3], b1[3]],
            ]
        }
    }
}
