//! Hot-loop building blocks: 8-lane vector operations (`Simd`), a vectorisable exp, sums
//! and float keys. Dtype conversions are in `dtype`, row loads in `view`, the workspace
//! carver in `workspace`. Kernels (here, in
//! `window` and `gram`) are written once as `#[inline(always)]` generics over `Simd` and
//! instantiated twice by `dispatch!`: a portable build, and an AVX2+FMA+F16C build chosen
//! at run time when `std` can detect it, or on AArch64 a NEON build (NEON is part of the
//! base architecture; the same bits as AVX2). `KVEVICT_PORTABLE=1` forces the portable one.

/// exp(x) for finite x <= 0 (softmax after max subtraction); 0 below -87.3.
/// Cody–Waite range reduction and a degree-6 polynomial: about 2 ulp. Branch-free and
/// without float-to-int conversions (n is rounded with the 1.5·2^23 trick and read back
/// from the bits), so loops around it vectorise. NaN in, NaN out.
#[inline(always)]
pub fn exp_neg(x: f32) -> f32 {
    const LOG2E: f32 = core::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5·2^23: bits 0x4B40_0000
    let xc = if x < -87.0 { -87.0 } else { x };
    let tm = xc * LOG2E + ROUND; // ROUND + round(x·log2 e), exactly
    let n = tm - ROUND;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    for c in EXP_POLY {
        p = p * r + c;
    }
    let p = p * r * r + r + 1.0;
    // 2^n: (n + 127) << 23, with n = bits(tm) - 0x4B40_0000
    let scale = f32::from_bits(tm.to_bits().wrapping_sub(0x4B40_0000 - 127) << 23);
    if x < -87.3 {
        0.0
    } else {
        p * scale
    }
}

/// [`exp_neg`]'s polynomial coefficients after the first (`1.987_569_1e-4`), in Horner
/// order: the vector builds' `p = p·r + c` steps.
pub(crate) const EXP_POLY: [f32; 5] = [
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    5.000_000_1e-1,
];

/// 8-lane vector operations the hot loops are written with, once, as `#[inline(always)]`
/// generics: [`Portable`] (plain arrays, whatever the target vectorises them to), on
/// x86_64 with `std` (run-time detection) `Avx2` (AVX2 + FMA + F16C intrinsics), and on
/// AArch64 `Neon` (two 4-lane registers, the same operations per lane as `Avx2`: the same
/// bits). All are deterministic; the portable one differs from the others in rounding (FMA
/// contracts `a·b + c`).
///
/// # Safety
/// Every method, and every `unsafe fn` generic over `S: Simd`, may only run where `S`'s
/// CPU features are enabled: `Avx2` only inside the `avx2,fma,f16c` functions that
/// [`dispatch!`] enters after [`has_avx2`]; `Portable` anywhere. `load`, `store` and
/// `load_f16` also need 8 readable (writable) elements at `p`.
pub(crate) trait Simd: Copy {
    type V: Copy;
    /// True for the AVX2 build, whose callers may also use AVX-512 where detected (read
    /// only where the AVX-512 kernel is built).
    #[cfg_attr(
        not(all(feature = "std", target_arch = "x86_64", kvevict_avx512)),
        allow(dead_code)
    )]
    const AVX2: bool = false;
    /// True where [`Simd::fma`] rounds once (AVX2's FMA, NEON's FMLA); the portable
    /// kernels round the product and the sum separately.
    const FUSED: bool = Self::AVX2;
    unsafe fn zero() -> Self::V;
    unsafe fn splat(x: f32) -> Self::V;
    /// Unaligned load / store of 8 floats.
    unsafe fn load(p: *const f32) -> Self::V;
    unsafe fn store(p: *mut f32, v: Self::V);
    /// 8 f16 (IEEE binary16 bits) as f32.
    unsafe fn load_f16(p: *const u16) -> Self::V;
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// `a·b + c` (fused where the hardware has it).
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `if b > a { b } else { a }` per lane (a NaN in `b` is ignored).
    unsafe fn max(a: Self::V, b: Self::V) -> Self::V;
    /// `if b < a { b } else { a }` per lane (a NaN in `b` is ignored).
    unsafe fn min(a: Self::V, b: Self::V) -> Self::V;
    /// [`exp_neg`] per lane.
    unsafe fn exp_neg(x: Self::V) -> Self::V;
    /// IEEE square root per lane (correctly rounded: `libm::sqrtf`'s bits).
    unsafe fn sqrt(x: Self::V) -> Self::V;
    /// Bit `i` set where lane `i` of `a` > lane `i` of `b` (false when either is NaN).
    unsafe fn gt_mask(a: Self::V, b: Self::V) -> u32;
    /// Sum of the lanes, in a fixed order: ((0+4)+(2+6)) + ((1+5)+(3+7)).
    unsafe fn hsum(v: Self::V) -> f32;
    /// [`Simd::exp_neg`] of four vectors, the same bits; implementations interleave the
    /// four dependency chains step by step, so the out-of-order window overlaps them.
    #[inline(always)]
    unsafe fn exp_neg4(x: [Self::V; 4]) -> [Self::V; 4] {
        // SAFETY: our caller keeps the `Simd` contract; no memory is touched.
        unsafe { x.map(|v| Self::exp_neg(v)) }
    }
    /// Lane `k` of the result is [`Simd::hsum`] of `v[k]`, by the same tree (and the same
    /// operands in each addition): the transpose, then the tree on whole vectors; the
    /// vector builds reduce with fewer shuffles.
    #[inline(always)]
    unsafe fn hsum8(v: [Self::V; 8]) -> Self::V {
        // SAFETY: our caller keeps the `Simd` contract; no memory is touched.
        unsafe {
            let t = Self::transpose8(v);
            Self::add(
                Self::add(Self::add(t[0], t[4]), Self::add(t[2], t[6])),
                Self::add(Self::add(t[1], t[5]), Self::add(t[3], t[7])),
            )
        }
    }
    /// The 8×8 transpose: lane `j` of output `i` is lane `i` of input `j`.
    #[inline(always)]
    unsafe fn transpose8(v: [Self::V; 8]) -> [Self::V; 8] {
        // SAFETY: our caller keeps the `Simd` contract; each store and load covers one 8-float row
        // or column of `m`.
        unsafe {
            let mut m = [[0f32; 8]; 8];
            for (row, x) in m.iter_mut().zip(v) {
                Self::store(row.as_mut_ptr(), x);
            }
            core::array::from_fn(|i| {
                let col: [f32; 8] = core::array::from_fn(|j| m[j][i]);
                Self::load(col.as_ptr())
            })
        }
    }
}

/// Plain arrays: the baseline build (and targets without SIMD).
#[derive(Clone, Copy)]
pub(crate) struct Portable;

impl Simd for Portable {
    type V = [f32; 8];
    #[inline(always)]
    unsafe fn zero() -> [f32; 8] {
        [0.0; 8]
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> [f32; 8] {
        [x; 8]
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> [f32; 8] {
        // SAFETY: `p` holds 8 readable floats (the caller's, per `Simd::load`).
        unsafe { core::ptr::read_unaligned(p as *const [f32; 8]) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: [f32; 8]) {
        // SAFETY: `p` holds 8 writable floats (the caller's, per `Simd::store`).
        unsafe { core::ptr::write_unaligned(p as *mut [f32; 8], v) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> [f32; 8] {
        // SAFETY: `p` holds 8 readable u16 (the caller's, per `Simd::load_f16`).
        unsafe {
            let mut o = [0f32; 8];
            for (i, x) in o.iter_mut().enumerate() {
                *x = half::f16::from_bits(*p.add(i)).to_f32();
            }
            o
        }
    }
    #[inline(always)]
    unsafe fn add(a: [f32; 8], b: [f32; 8]) -> [f32; 8] {
        let mut o = a;
        for i in 0..8 {
            o[i] += b[i];
        }
        o
    }
    #[inline(always)]
    unsafe fn sub(a: [f32; 8], b: [f32; 8]) -> [f32; 8] {
        let mut o = a;
        for i in 0..8 {
            o[i] -= b[i];
        }
        o
    }
    #[inline(always)]
    unsafe fn mul(a: [f32; 8], b: [f32; 8]) -> [f32; 8] {
        let mut o = a;
        for i in 0..8 {
            o[i] *= b[i];
        }
        o
    }
    #[inline(always)]
    unsafe fn fma(a: [f32; 8], b: [f32; 8], c: [f32; 8]) -> [f32; 8] {
        let mut o = c;
        for i in 0..8 {
            o[i] += a[i] * b[i];
        }
        o
    }
    #[inline(always)]
    unsafe fn max(a: [f32; 8], b: [f32; 8]) -> [f32; 8] {
        let mut o = a;
        for i in 0..8 {
            if b[i] > o[i] {
                o[i] = b[i];
            }
        }
        o
    }
    #[inline(always)]
    unsafe fn min(a: [f32; 8], b: [f32; 8]) -> [f32; 8] {
        let mut o = a;
        for i in 0..8 {
            if b[i] < o[i] {
                o[i] = b[i];
            }
        }
        o
    }
    #[inline(always)]
    unsafe fn gt_mask(a: [f32; 8], b: [f32; 8]) -> u32 {
        let mut m = 0;
        for i in 0..8 {
            m |= u32::from(a[i] > b[i]) << i;
        }
        m
    }
    #[inline(always)]
    unsafe fn exp_neg(x: [f32; 8]) -> [f32; 8] {
        let mut o = x;
        for v in o.iter_mut() {
            *v = exp_neg(*v);
        }
        o
    }
    #[inline(always)]
    unsafe fn sqrt(x: [f32; 8]) -> [f32; 8] {
        x.map(libm::sqrtf)
    }
    #[inline(always)]
    unsafe fn hsum(v: [f32; 8]) -> f32 {
        ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]))
    }
}

#[cfg(all(feature = "std", target_arch = "x86_64"))]
pub(crate) use avx2::Avx2;

#[cfg(all(feature = "std", target_arch = "x86_64"))]
mod avx2 {
    use super::{Simd, EXP_POLY};
    use core::arch::x86_64::*;

    /// AVX2 + FMA + F16C. Only reached through functions with those target features,
    /// after run-time detection ([`super::has_avx2`]).
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
    /// [`super::exp_neg`]'s fused steps lane for lane (`Simd::exp_neg`'s bits), in fewer
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
}

#[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
pub(crate) use neon::Neon;

#[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
mod neon {
    use super::{Simd, EXP_POLY};
    use core::arch::aarch64::*;

    /// AArch64 Advanced SIMD (NEON): an 8-lane vector as two 4-lane registers (lanes 0-3,
    /// 4-7), every operation [`super::Avx2`]'s per lane (fused multiply-adds, the same exp
    /// steps, `hsum`'s tree), so the same bits. NEON is part of the AArch64 base
    /// architecture: chosen at compile time ([`super::has_neon`]).
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
                let b = |r: usize, h: usize| {
                    transpose4([v[r][h], v[r + 1][h], v[r + 2][h], v[r + 3][h]])
                };
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
}

/// Whether the NEON kernels run: always on AArch64 (NEON is part of the base
/// architecture), unless, with `std`, the environment variable `KVEVICT_PORTABLE` is set
/// (it forces the portable kernels, for tests). Decided once per process.
#[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
pub(crate) fn has_neon() -> bool {
    #[cfg(feature = "std")]
    {
        use core::sync::atomic::{AtomicU8, Ordering};
        static STATE: AtomicU8 = AtomicU8::new(0);
        match STATE.load(Ordering::Relaxed) {
            1 => true,
            2 => false,
            _ => {
                let yes = std::env::var_os("KVEVICT_PORTABLE").is_none();
                STATE.store(if yes { 1 } else { 2 }, Ordering::Relaxed);
                yes
            }
        }
    }
    #[cfg(not(feature = "std"))]
    true
}

/// Whether the AVX2 kernels run: the CPU has AVX2, FMA and F16C, and the environment
/// variable `KVEVICT_PORTABLE` is not set (it forces the portable kernels, for tests).
/// Decided once per process.
#[cfg(all(feature = "std", target_arch = "x86_64"))]
pub(crate) fn has_avx2() -> bool {
    use core::sync::atomic::{AtomicU8, Ordering};
    static STATE: AtomicU8 = AtomicU8::new(0);
    match STATE.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let yes = std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c")
                && std::env::var_os("KVEVICT_PORTABLE").is_none();
            STATE.store(if yes { 1 } else { 2 }, Ordering::Relaxed);
            yes
        }
    }
}

/// Which kernel build the scorers take on this machine (in this process): `"AVX-512"` (the
/// window pass, TOVA and KNorm on 16 lanes, the rest AVX2), `"AVX2"` (AVX2 + FMA + F16C,
/// detected at run time; `KVEVICT_NO_AVX512` set, or no AVX-512), `"NEON"` (AArch64), or
/// `"portable"` (no vector build for the CPU, or `KVEVICT_PORTABLE` set). Benchmarks print it
/// beside their numbers.
pub fn kernel_name() -> &'static str {
    #[cfg(all(feature = "std", target_arch = "x86_64"))]
    if has_avx2() {
        #[cfg(kvevict_avx512)]
        if crate::gemm512::available() {
            return "AVX-512";
        }
        return "AVX2";
    }
    #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
    if has_neon() {
        return "NEON";
    }
    "portable"
}

/// Run `$body` with `$S` bound to the best [`Simd`] the CPU has: `Avx2` inside a function
/// compiled with those target features when detected (x86_64 with `std`), `Neon` on AArch64
/// (compile time), else [`Portable`].
macro_rules! dispatch {
    (fn($($arg:ident : $ty:ty),* $(,)?) -> $ret:ty, $S:ident => $body:block) => {{
        #[inline(always)]
        fn body<$S: $crate::numerics::Simd>($($arg: $ty),*) -> $ret $body
        #[cfg(all(feature = "std", target_arch = "x86_64"))]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn fast($($arg: $ty),*) -> $ret {
            body::<$crate::numerics::Avx2>($($arg),*)
        }
        #[cfg(all(feature = "std", target_arch = "x86_64"))]
        if $crate::numerics::has_avx2() {
            // SAFETY: the CPU has avx2, fma and f16c (checked just above).
            unsafe { fast($($arg),*) }
        } else {
            body::<$crate::numerics::Portable>($($arg),*)
        }
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        if $crate::numerics::has_neon() {
            body::<$crate::numerics::Neon>($($arg),*)
        } else {
            body::<$crate::numerics::Portable>($($arg),*)
        }
        #[cfg(not(any(
            all(feature = "std", target_arch = "x86_64"),
            all(target_arch = "aarch64", target_feature = "neon")
        )))]
        {
            body::<$crate::numerics::Portable>($($arg),*)
        }
    }};
}
pub(crate) use dispatch;

/// A prefetch of `rows` rows of `bytes` bytes, `ld` bytes apart, from `p` (a hint: never
/// faults, whatever the address).
#[inline(always)]
pub(crate) fn prefetch_rows(p: *const u8, ld: usize, bytes: usize, rows: usize) {
    for r in 0..rows {
        let row = p.wrapping_add(r * ld);
        let mut o = 0;
        while o < bytes {
            prefetch_line(row.wrapping_add(o));
            o += 64;
        }
    }
}

/// A prefetch of the cache line holding `p` into L1 (x86 `PREFETCHT0`, AArch64
/// `PRFM PLDL1KEEP`, nothing elsewhere; a hint: never faults, whatever the address).
#[inline(always)]
pub(crate) fn prefetch_line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults; the address is only a hint.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: PRFM never faults and writes nothing; the address is only a hint.
    unsafe {
        core::arch::asm!(
            "prfm pldl1keep, [{0}]",
            in(reg) p,
            options(nostack, preserves_flags, readonly)
        )
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}

/// 8 consecutive key elements at element `i` of `k`, f16 (`F16`) or f32, as f32 lanes.
///
/// # Safety
/// `S`'s CPU features are present and elements `i .. i + 8` of `k` are readable.
#[inline(always)]
pub(crate) unsafe fn load_key<S: Simd, const F16: bool>(k: *const u8, i: usize) -> S::V {
    // SAFETY: the caller's contract.
    unsafe {
        if F16 {
            S::load_f16((k as *const u16).add(i))
        } else {
            S::load((k as *const f32).add(i))
        }
    }
}

/// Element `i` of `k`, f16 (`F16`) or f32, as f32.
///
/// # Safety
/// Element `i` of `k` is readable.
#[inline(always)]
pub(crate) unsafe fn key_elem<const F16: bool>(k: *const u8, i: usize) -> f32 {
    // SAFETY: the caller's contract.
    unsafe {
        if F16 {
            half::f16::from_bits(*(k as *const u16).add(i)).to_f32()
        } else {
            *(k as *const f32).add(i)
        }
    }
}

/// Whether every element of `x` is finite (`v - v` is +0 for finite `v`, NaN otherwise).
#[inline(always)]
pub(crate) fn all_finite<S: Simd>(x: &[f32]) -> bool {
    let n8 = x.len() / 8 * 8;
    // SAFETY: i + 8 <= n8 <= x.len().
    let lanes_ok = unsafe {
        let mut acc = S::zero();
        let mut i = 0;
        while i < n8 {
            let v = S::load(x.as_ptr().add(i));
            acc = S::add(acc, S::sub(v, v));
            i += 8;
        }
        S::hsum(acc) == 0.0
    };
    lanes_ok && x[n8..].iter().all(|v| v.is_finite())
}

/// Whether every element of `x` is finite ([`all_finite`] with the best kernels the CPU has).
pub(crate) fn finite(x: &[f32]) -> bool {
    dispatch!(fn(x: &[f32]) -> bool, S => { all_finite::<S>(x) })
}

/// Sum of `x` with 8 lanes of partial sums (deterministic order).
#[inline(always)]
pub(crate) unsafe fn sum_v<S: Simd>(x: &[f32]) -> f32 {
    // SAFETY: the CPU has avx2 (the `Simd` contract); no memory is touched.
    unsafe {
        let n8 = x.len() / 8 * 8;
        let mut acc = S::zero();
        let p = x.as_ptr();
        let mut i = 0;
        while i < n8 {
            acc = S::add(acc, S::load(p.add(i)));
            i += 8;
        }
        let mut s = S::hsum(acc);
        for &v in &x[n8..] {
            s += v;
        }
        s
    }
}

/// Lane `k` of the result is [`Simd::hsum`] of `v[k]`, by the same tree.
#[inline(always)]
pub(crate) unsafe fn hsum8<S: Simd>(v: [S::V; 8]) -> S::V {
    // SAFETY: the caller's contract is `Simd::hsum8`'s
    unsafe { S::hsum8(v) }
}

/// `Σ x[i]·y[i]` with 8 lanes of partial sums (deterministic order); `y.len() >= x.len()`.
#[inline(always)]
pub(crate) unsafe fn dot_v<S: Simd>(x: &[f32], y: &[f32]) -> f32 {
    // SAFETY: the CPU has avx2 (the `Simd` contract); no memory is touched.
    unsafe {
        let y = &y[..x.len()];
        let n8 = x.len() / 8 * 8;
        let mut acc = S::zero();
        let (px, py) = (x.as_ptr(), y.as_ptr());
        let mut i = 0;
        while i < n8 {
            acc = S::fma(S::load(px.add(i)), S::load(py.add(i)), acc);
            i += 8;
        }
        let mut s = S::hsum(acc);
        for (a, b) in x[n8..].iter().zip(&y[n8..]) {
            s += a * b;
        }
        s
    }
}

/// Order-preserving map from finite f32 to u32: a < b  <=>  key(a) < key(b).
/// -0 and +0 get one key (equal scores tie and the tie rule decides; cuda/common.cuh too).
#[inline(always)]
pub fn float_key(x: f32) -> u32 {
    let b = if x == 0.0 { 0 } else { x.to_bits() };
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// Inverse of [`float_key`].
#[inline(always)]
pub fn key_float(k: u32) -> f32 {
    if k & 0x8000_0000 != 0 {
        f32::from_bits(k & 0x7fff_ffff)
    } else {
        f32::from_bits(!k)
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;

    /// `exp_neg4` gives `exp_neg`'s bits lane for lane, over the clamp, the underflow
    /// edge, zero, and NaN.
    fn exp4_matches<S: Simd>() {
        let xs: std::vec::Vec<f32> = (0..256)
            .map(|i| match i {
                0 => f32::NAN,
                1 => -87.3,
                2 => -87.0,
                3 => -0.0,
                4 => f32::NEG_INFINITY,
                _ => -(i as f32) * 0.37 + (i % 7) as f32 * 0.011,
            })
            .collect();
        for c in xs.chunks_exact(32) {
            // SAFETY: each chunk holds 32 floats.
            unsafe {
                let v: [S::V; 4] = core::array::from_fn(|j| S::load(c.as_ptr().add(8 * j)));
                let e4 = S::exp_neg4(v);
                for j in 0..4 {
                    let (mut a, mut b) = ([0f32; 8], [0f32; 8]);
                    S::store(a.as_mut_ptr(), e4[j]);
                    S::store(b.as_mut_ptr(), S::exp_neg(v[j]));
                    for l in 0..8 {
                        assert_eq!(a[l].to_bits(), b[l].to_bits(), "x = {}", c[8 * j + l]);
                    }
                }
            }
        }
    }

    /// `hsum8` gives `hsum`'s bits for each of the 8 vectors, on values whose sums round
    /// differently in other orders.
    fn hsum8_ok<S: Simd>() {
        let x = crate::lanes::tests::spread(64 * 20, 5);
        for m in x.chunks(64) {
            // SAFETY: every row holds 8 floats (our caller has S's features)
            unsafe {
                let v: [S::V; 8] = core::array::from_fn(|r| S::load(m[8 * r..].as_ptr()));
                let mut o = [0f32; 8];
                S::store(o.as_mut_ptr(), S::hsum8(v));
                for (r, o) in o.iter().enumerate() {
                    assert_eq!(o.to_bits(), S::hsum(v[r]).to_bits(), "row {r}");
                }
            }
        }
    }

    /// `transpose8` moves lane `i` of input `j` to lane `j` of output `i`.
    fn transpose_ok<S: Simd>() {
        let m: [[f32; 8]; 8] =
            core::array::from_fn(|r| core::array::from_fn(|c| (8 * r + c) as f32));
        // SAFETY: every row holds 8 floats.
        unsafe {
            let t = S::transpose8(core::array::from_fn(|r| S::load(m[r].as_ptr())));
            for (i, v) in t.into_iter().enumerate() {
                let mut o = [0f32; 8];
                S::store(o.as_mut_ptr(), v);
                assert_eq!(o, core::array::from_fn(|j| m[j][i]));
            }
        }
    }

    /// `Avx2::exp_neg`'s steps in scalar code (each FMA one `mul_add`): the bits every
    /// FMA build (AVX2, AVX-512, NEON) gives.
    fn exp_neg_fused(x: f32) -> f32 {
        let xc = if x < -87.0 { -87.0 } else { x };
        let n = xc.mul_add(core::f32::consts::LOG2_E, 0.5).floor();
        let r = (-n).mul_add(0.693_359_4, xc);
        let r = (-n).mul_add(-2.121_944_4e-4, r);
        let mut p = 1.987_569_1e-4f32;
        for c in crate::numerics::EXP_POLY {
            p = p.mul_add(r, c);
        }
        let p = (p * r).mul_add(r, r) + 1.0;
        let y = p * f32::from_bits(((n as i32 + 127) as u32) << 23);
        if x < -87.3 {
            0.0
        } else {
            y
        }
    }

    /// An FMA build's vector operations against their scalar definitions, bit for bit:
    /// exp (fused steps), max / min (NaN in `b` ignored, signed zeros), the comparison
    /// mask, `hsum`'s tree, the f16 load (every f16 bit pattern) and the square root.
    fn fused_ops_match_scalar<S: Simd>() {
        let mut xs: std::vec::Vec<f32> = (0..40_000).map(|i| -(i as f32) * 2.5e-3).collect();
        xs.extend([
            -0.0,
            0.0,
            -87.0,
            -87.3,
            -87.29,
            -87.31,
            -1e30,
            f32::NEG_INFINITY,
            -1e-40,
        ]);
        while xs.len() % 8 != 0 {
            xs.push(-1.0);
        }
        let out = |v: S::V| {
            let mut o = [0f32; 8];
            // SAFETY: `o` holds 8 floats; our caller keeps the `Simd` contract.
            unsafe { S::store(o.as_mut_ptr(), v) };
            o
        };
        for c in xs.chunks_exact(8) {
            // SAFETY: each chunk holds 8 floats; our caller keeps the `Simd` contract.
            let e = out(unsafe { S::exp_neg(S::load(c.as_ptr())) });
            for l in 0..8 {
                assert_eq!(
                    e[l].to_bits(),
                    exp_neg_fused(c[l]).to_bits(),
                    "x = {}",
                    c[l]
                );
            }
        }
        let a = [1.0, -0.0, 0.0, f32::NAN, 2.0, -3.0, f32::INFINITY, 5.0];
        let b = [0.0, 0.0, -0.0, 1.0, f32::NAN, -3.5, 7.0, 5.0];
        // SAFETY: 8 floats each; our caller keeps the `Simd` contract.
        unsafe {
            let (va, vb) = (S::load(a.as_ptr()), S::load(b.as_ptr()));
            let (pa, pb) = (Portable::load(a.as_ptr()), Portable::load(b.as_ptr()));
            let bits = |v: [f32; 8]| v.map(f32::to_bits);
            assert_eq!(bits(out(S::max(va, vb))), bits(Portable::max(pa, pb)));
            assert_eq!(bits(out(S::min(va, vb))), bits(Portable::min(pa, pb)));
            assert_eq!(S::gt_mask(va, vb), Portable::gt_mask(pa, pb));
            assert_eq!(S::gt_mask(vb, va), Portable::gt_mask(pb, pa));
            let s = [1e8f32, 3.0, -1e8, 0.25, 7.0, -2.0, 1e-3, 5.5];
            assert_eq!(
                S::hsum(S::load(s.as_ptr())).to_bits(),
                Portable::hsum(s).to_bits()
            );
            let q = [2.0f32, 3.0, 0.5, 1e-40, 0.0, 7.0, 1e30, 123.456];
            assert_eq!(
                bits(out(S::sqrt(S::load(q.as_ptr())))),
                bits(Portable::sqrt(q))
            );
            let h: std::vec::Vec<u16> = (0..=u16::MAX).collect();
            for c in h.chunks_exact(8) {
                let v = out(S::load_f16(c.as_ptr()));
                for l in 0..8 {
                    let want = half::f16::from_bits(c[l]).to_f32();
                    assert_eq!(v[l].to_bits(), want.to_bits(), "f16 {:#06x}", c[l]);
                }
            }
        }
    }

    #[test]
    fn fma_builds_match_scalar_definitions() {
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        fused_ops_match_scalar::<Neon>();
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn avx() {
                fused_ops_match_scalar::<Avx2>();
            }
            // SAFETY: the CPU has avx2, fma and f16c.
            unsafe { avx() };
        }
    }

    #[test]
    fn exp_neg4_is_exp_neg() {
        transpose_ok::<Portable>();
        hsum8_ok::<Portable>();
        exp4_matches::<Portable>();
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        {
            transpose_ok::<Neon>();
            hsum8_ok::<Neon>();
            exp4_matches::<Neon>();
        }
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn avx() {
                transpose_ok::<Avx2>();
                hsum8_ok::<Avx2>();
                exp4_matches::<Avx2>();
            }
            // SAFETY: the CPU has avx2, fma and f16c.
            unsafe { avx() };
        }
    }
}
