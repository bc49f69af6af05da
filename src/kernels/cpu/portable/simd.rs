//! The 8-lane vector trait the hot loops are written with ([`Simd`]), its portable build
//! ([`Portable`]) and the exp it and the vector builds share ([`exp_neg`], [`EXP_POLY`]).
//! The AVX2 and NEON builds (`x86/avx2.rs`, `arm/neon.rs`) implement the trait from here;
//! `numerics` re-exports all three with the dispatch between them.

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
/// `numerics::dispatch!` enters after `numerics::has_avx2`; `Portable` anywhere. `load`, `store` and
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
