//! Hot-loop building blocks: 8-lane vector operations (`Simd`), a vectorisable exp, sums
//! and float keys. Dtype conversions are in `dtype`, row loads in `view`, the workspace
//! carver in `workspace`. Kernels (here, in
//! `window` and `gram`) are written once as `#[inline(always)]` generics over `Simd` and
//! instantiated twice by `dispatch!`: a portable build, and an AVX2+FMA+F16C build chosen
//! at run time when `std` can detect it (`KVEVICT_PORTABLE=1` forces the portable one).

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
    let p = 1.987_569_1e-4f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 5.000_000_1e-1;
    let p = p * r * r + r + 1.0;
    // 2^n: (n + 127) << 23, with n = bits(tm) - 0x4B40_0000
    let scale = f32::from_bits(tm.to_bits().wrapping_sub(0x4B40_0000 - 127) << 23);
    if x < -87.3 {
        0.0
    } else {
        p * scale
    }
}

/// 8-lane vector operations the hot loops are written with, once, as `#[inline(always)]`
/// generics: [`Portable`] (plain arrays, whatever the target vectorises them to) and, on
/// x86_64 with `std` (run-time detection), `Avx2` (AVX2 + FMA + F16C intrinsics). Both are
/// deterministic; they differ from each other in rounding (FMA contracts `a·b + c`).
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
    use super::Simd;
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
            unsafe {
                // the scalar exp_neg's steps, lane-wise; NaN propagates like there
                let lo = _mm256_set1_ps(-87.0);
                let xc = _mm256_blendv_ps(x, lo, _mm256_cmp_ps::<_CMP_LT_OQ>(x, lo));
                let t = _mm256_fmadd_ps(
                    xc,
                    _mm256_set1_ps(core::f32::consts::LOG2_E),
                    _mm256_set1_ps(0.5),
                );
                let n = _mm256_floor_ps(t);
                let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), xc);
                let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
                let p = _mm256_set1_ps(1.987_569_1e-4);
                let p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.398_199_9e-3));
                let p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.333_452e-3));
                let p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.166_579_6e-2));
                let p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.666_666_5e-1));
                let p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.000_000_1e-1));
                let p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r);
                let p = _mm256_add_ps(p, _mm256_set1_ps(1.0));
                let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
                    _mm256_cvttps_epi32(n),
                    _mm256_set1_epi32(127),
                ));
                let y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
                let under = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-87.3));
                _mm256_andnot_ps(under, y)
            }
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
        unsafe fn exp_neg4(x: [__m256; 4]) -> [__m256; 4] {
            // SAFETY: the CPU has avx2 and fma (the `Simd` contract); no memory is touched.
            unsafe {
                // exp_neg's steps, each applied to the four vectors before the next
                macro_rules! step {
                (|$v:ident, $i:ident| $e:expr, $a:expr) => {{
                    let a = $a;
                    let f = |$v: __m256, $i: usize| $e;
                    [f(a[0], 0), f(a[1], 1), f(a[2], 2), f(a[3], 3)]
                }};
            }
                let lo = _mm256_set1_ps(-87.0);
                let xc = step!(
                    |v, _i| _mm256_blendv_ps(v, lo, _mm256_cmp_ps::<_CMP_LT_OQ>(v, lo)),
                    x
                );
                let (l2e, half) = (
                    _mm256_set1_ps(core::f32::consts::LOG2_E),
                    _mm256_set1_ps(0.5),
                );
                let n = step!(|v, _i| _mm256_floor_ps(_mm256_fmadd_ps(v, l2e, half)), xc);
                let (hi, lo2) = (_mm256_set1_ps(0.693_359_4), _mm256_set1_ps(-2.121_944_4e-4));
                let r = step!(|v, i| _mm256_fnmadd_ps(n[i], hi, v), xc);
                let r = step!(|v, i| _mm256_fnmadd_ps(n[i], lo2, v), r);
                let mut p = [_mm256_set1_ps(1.987_569_1e-4); 4];
                for c in [
                    1.398_199_9e-3,
                    8.333_452e-3,
                    4.166_579_6e-2,
                    1.666_666_5e-1,
                    5.000_000_1e-1,
                ] {
                    let cv = _mm256_set1_ps(c);
                    p = step!(|v, i| _mm256_fmadd_ps(v, r[i], cv), p);
                }
                let p = step!(
                    |v, i| _mm256_fmadd_ps(_mm256_mul_ps(v, r[i]), r[i], r[i]),
                    p
                );
                let one = _mm256_set1_ps(1.0);
                let p = step!(|v, _i| _mm256_add_ps(v, one), p);
                let bias = _mm256_set1_epi32(127);
                let y = step!(
                    |v, i| {
                        let e = _mm256_add_epi32(_mm256_cvttps_epi32(n[i]), bias);
                        _mm256_mul_ps(v, _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e)))
                    },
                    p
                );
                let min = _mm256_set1_ps(-87.3);
                step!(
                    |v, i| _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(x[i], min), v),
                    y
                )
            }
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

/// Run `$body` with `$S` bound to the best [`Simd`] the CPU has: `Avx2` inside a function
/// compiled with those target features when detected, else [`Portable`].
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
        #[cfg(not(all(feature = "std", target_arch = "x86_64")))]
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
    #[cfg(target_arch = "x86_64")]
    for r in 0..rows {
        let row = p.wrapping_add(r * ld);
        let mut o = 0;
        while o < bytes {
            // SAFETY: a prefetch never faults; the address is only a hint.
            unsafe {
                core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                    row.wrapping_add(o) as *const i8,
                )
            };
            o += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, ld, bytes, rows);
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
    // SAFETY: the CPU has avx2 (the `Simd` contract); no memory is touched.
    unsafe {
        let t = S::transpose8(v);
        S::add(
            S::add(S::add(t[0], t[4]), S::add(t[2], t[6])),
            S::add(S::add(t[1], t[5]), S::add(t[3], t[7])),
        )
    }
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

    #[test]
    fn exp_neg4_is_exp_neg() {
        transpose_ok::<Portable>();
        exp4_matches::<Portable>();
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn avx() {
                transpose_ok::<Avx2>();
                exp4_matches::<Avx2>();
            }
            // SAFETY: the CPU has avx2, fma and f16c.
            unsafe { avx() };
        }
    }
}
