//! Hot-loop building blocks: 8-lane vector operations (`Simd`), a vectorisable exp, sums
//! and float keys. Dtype conversions are in `dtype`, row loads in `view`, the workspace
//! carver in `workspace`. Kernels (here, in
//! `window` and `gram`) are written once as `#[inline(always)]` generics over `Simd` and
//! instantiated twice by `dispatch!`: a portable build, and an AVX2+FMA+F16C build chosen
//! at run time when `std` can detect it, or on AArch64 a NEON build (NEON is part of the
//! base architecture; the same bits as AVX2's kernels, though the AVX2 window pass keeps
//! its exps and so has its own scores: `window::keeps_exps`). `KVEVICT_PORTABLE=1` forces
//! the portable one.

pub(crate) use super::prefetch::{prefetch_line, prefetch_rows};
pub use super::simd::exp_neg;
pub(crate) use super::simd::{Portable, Simd};

#[cfg(all(feature = "std", target_arch = "x86_64"))]
pub(crate) use crate::kernels::cpu::x86::avx2::Avx2;

#[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
pub(crate) use crate::kernels::cpu::arm::neon::Neon;

#[cfg(all(
    feature = "std",
    any(
        target_arch = "x86_64",
        all(target_arch = "aarch64", target_feature = "neon")
    )
))]
use core::sync::atomic::{AtomicU8, Ordering};

/// `detect()`, decided once per process and kept in `state` (0: not yet, 1: yes, 2: no):
/// how every kernel choice below (and `gemm512::available`) remembers what it found.
#[cfg(all(
    feature = "std",
    any(
        target_arch = "x86_64",
        all(target_arch = "aarch64", target_feature = "neon")
    )
))]
#[inline]
pub(crate) fn decided_once(state: &AtomicU8, detect: impl FnOnce() -> bool) -> bool {
    match state.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let yes = detect();
            state.store(if yes { 1 } else { 2 }, Ordering::Relaxed);
            yes
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
        static STATE: AtomicU8 = AtomicU8::new(0);
        decided_once(&STATE, || std::env::var_os("KVEVICT_PORTABLE").is_none())
    }
    #[cfg(not(feature = "std"))]
    true
}

/// Whether the AVX2 kernels run: the CPU has AVX2, FMA and F16C, and the environment
/// variable `KVEVICT_PORTABLE` is not set (it forces the portable kernels, for tests).
/// Decided once per process.
#[cfg(all(feature = "std", target_arch = "x86_64"))]
pub(crate) fn has_avx2() -> bool {
    static STATE: AtomicU8 = AtomicU8::new(0);
    decided_once(&STATE, || {
        std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
            && std::env::var_os("KVEVICT_PORTABLE").is_none()
    })
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

/// Tests: `$body` with the type `$S` set to each vector build this CPU runs: NEON on
/// AArch64, AVX2 + FMA + F16C on x86-64 (detected, the body compiled under those target
/// features). The portable build is the caller's to add where it is checked too.
#[cfg(all(test, feature = "std"))]
macro_rules! on_vector_builds {
    ($S:ident => $body:block) => {{
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        {
            type $S = $crate::numerics::Neon;
            $body
        }
        #[cfg(target_arch = "x86_64")]
        if $crate::numerics::has_avx2() {
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn avx() {
                type $S = $crate::numerics::Avx2;
                $body
            }
            // SAFETY: the CPU has avx2, fma and f16c (checked just above).
            unsafe { avx() };
        }
    }};
}
#[cfg(all(test, feature = "std"))]
pub(crate) use on_vector_builds;

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
pub(crate) mod tests {
    use super::*;
    use std::vec::Vec;

    /// Values whose sums round differently in different orders (spread exponents, both signs).
    pub(crate) fn spread(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let m = (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                m * [0.01f32, 1.0, 37.0][(x % 3) as usize]
            })
            .collect()
    }

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
        let x = spread(64 * 20, 5);
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
        for c in super::super::simd::EXP_POLY {
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

    /// The exp kernels' edge inputs (every one in their domain, x <= 0): signed zeros, the
    /// cut-off at -87.3 and either side of it, a huge one, -inf and a subnormal.
    pub(crate) const EXP_EDGES: [f32; 9] = [
        -0.0,
        0.0,
        -87.0,
        -87.3,
        -87.29,
        -87.31,
        -1e30,
        f32::NEG_INFINITY,
        -1e-40,
    ];

    /// An FMA build's vector operations against their scalar definitions, bit for bit:
    /// exp (fused steps), max / min (NaN in `b` ignored, signed zeros), the comparison
    /// mask, `hsum`'s tree, the f16 load (every f16 bit pattern) and the square root.
    fn fused_ops_match_scalar<S: Simd>() {
        let mut xs: std::vec::Vec<f32> = (0..40_000).map(|i| -(i as f32) * 2.5e-3).collect();
        xs.extend(EXP_EDGES);
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
        on_vector_builds!(S => { fused_ops_match_scalar::<S>() });
    }

    /// On AArch64 the scorers take the NEON kernels unless `KVEVICT_PORTABLE` asks otherwise:
    /// what the aarch64 step's qemu run tests is the NEON path, not the portable fallback.
    #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
    #[test]
    fn aarch64_takes_the_neon_kernels() {
        let want = if std::env::var_os("KVEVICT_PORTABLE").is_some() {
            "portable"
        } else {
            "NEON"
        };
        assert_eq!(kernel_name(), want);
    }

    #[test]
    fn exp_neg4_is_exp_neg() {
        transpose_ok::<Portable>();
        hsum8_ok::<Portable>();
        exp4_matches::<Portable>();
        on_vector_builds!(S => {
            transpose_ok::<S>();
            hsum8_ok::<S>();
            exp4_matches::<S>();
        });
    }
}
