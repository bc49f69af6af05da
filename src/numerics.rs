//! Hot loops: the small Q·Kᵀ GEMM, a vectorisable exp, and the workspace carver.
//! Kernels are written once as `#[inline(always)]` generics and instantiated twice: a
//! baseline build and an AVX2+FMA build chosen at run time when `std` can detect it.

use crate::error::{Error, Result};

/// exp(x) for finite x <= 0 (softmax after max subtraction); 0 below -87.3.
/// Cody–Waite range reduction and a degree-6 polynomial: about 2 ulp, branch-free so
/// the loops around it vectorise.
#[inline(always)]
pub fn exp_neg(x: f32) -> f32 {
    const LOG2E: f32 = core::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let xc = if x < -87.0 { -87.0 } else { x };
    let n = (xc * LOG2E + 0.5).floor_fast();
    let r = xc - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 5.000_000_1e-1;
    let p = p * r * r + r + 1.0;
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    if x < -87.3 {
        0.0
    } else {
        p * scale
    }
}

trait FloorFast {
    fn floor_fast(self) -> f32;
}
impl FloorFast for f32 {
    /// floor for |x| < 2^22 without libm (vectorises): truncate then fix negatives.
    #[inline(always)]
    fn floor_fast(self) -> f32 {
        let t = self as i32 as f32;
        if t > self {
            t - 1.0
        } else {
            t
        }
    }
}

/// Row tile of the GEMM micro-kernel (query rows) and column tile (keys).
const MR: usize = 4;
const NR: usize = 16;

/// `out[r][t] = Σ_d q[r][d]·kt[d][t]` for `rows` query rows, `nt` keys (`nt % NR == 0`),
/// q is `[rows][dk]`, kt is `[dk][nt]`, out is `[rows][nt]`.
#[inline(always)]
fn gemm_qk_impl(q: &[f32], kt: &[f32], rows: usize, dk: usize, nt: usize, out: &mut [f32]) {
    debug_assert!(nt % NR == 0);
    let mut r = 0;
    while r < rows {
        let mr = if rows - r >= MR { MR } else { rows - r };
        let mut t0 = 0;
        while t0 < nt {
            let mut acc = [[0f32; NR]; MR];
            for d in 0..dk {
                let k: &[f32; NR] = kt[d * nt + t0..d * nt + t0 + NR].try_into().unwrap();
                for i in 0..MR {
                    // rows past the end read row r (valid memory) and are dropped below
                    let qi = q[(r + if i < mr { i } else { 0 }) * dk + d];
                    for j in 0..NR {
                        acc[i][j] += qi * k[j];
                    }
                }
            }
            for i in 0..mr {
                out[(r + i) * nt + t0..(r + i) * nt + t0 + NR].copy_from_slice(&acc[i]);
            }
            t0 += NR;
        }
        r += MR;
    }
}

#[cfg(all(feature = "std", target_arch = "x86_64"))]
#[target_feature(enable = "avx2,fma")]
unsafe fn gemm_qk_avx2(q: &[f32], kt: &[f32], rows: usize, dk: usize, nt: usize, out: &mut [f32]) {
    gemm_qk_impl(q, kt, rows, dk, nt, out)
}

#[cfg(all(feature = "std", target_arch = "x86_64"))]
fn has_avx2() -> bool {
    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
}

pub(crate) fn gemm_qk(q: &[f32], kt: &[f32], rows: usize, dk: usize, nt: usize, out: &mut [f32]) {
    assert!(q.len() >= rows * dk && kt.len() >= dk * nt && out.len() >= rows * nt);
    #[cfg(all(feature = "std", target_arch = "x86_64"))]
    if has_avx2() {
        // SAFETY: the CPU supports avx2 and fma (checked above).
        return unsafe { gemm_qk_avx2(q, kt, rows, dk, nt, out) };
    }
    gemm_qk_impl(q, kt, rows, dk, nt, out)
}

/// `x[i] = exp_neg(x[i] - m)`; returns Σ x[i] (f32: at most one chunk of terms).
#[inline(always)]
fn exp_sub_sum_impl(x: &mut [f32], m: f32) -> f32 {
    let mut s = 0f32;
    for v in x.iter_mut() {
        let e = exp_neg(*v - m);
        *v = e;
        s += e;
    }
    s
}

#[cfg(all(feature = "std", target_arch = "x86_64"))]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_sub_sum_avx2(x: &mut [f32], m: f32) -> f32 {
    exp_sub_sum_impl(x, m)
}

pub(crate) fn exp_sub_sum(x: &mut [f32], m: f32) -> f32 {
    #[cfg(all(feature = "std", target_arch = "x86_64"))]
    if has_avx2() {
        return unsafe { exp_sub_sum_avx2(x, m) };
    }
    exp_sub_sum_impl(x, m)
}

/// `x[i] = exp_neg(x[i] - m) * inv`.
#[inline(always)]
fn exp_scale_impl(x: &mut [f32], m: f32, inv: f32) {
    for v in x.iter_mut() {
        *v = exp_neg(*v - m) * inv;
    }
}

#[cfg(all(feature = "std", target_arch = "x86_64"))]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_scale_avx2(x: &mut [f32], m: f32, inv: f32) {
    exp_scale_impl(x, m, inv)
}

pub(crate) fn exp_scale(x: &mut [f32], m: f32, inv: f32) {
    #[cfg(all(feature = "std", target_arch = "x86_64"))]
    if has_avx2() {
        return unsafe { exp_scale_avx2(x, m, inv) };
    }
    exp_scale_impl(x, m, inv)
}

/// Maximum of a slice (-inf when empty).
#[inline]
pub(crate) fn max_of(x: &[f32]) -> f32 {
    x.iter()
        .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a })
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

/// Carves typed, 64-byte-aligned slices out of the caller's byte workspace.
pub struct Workspace<'a> {
    buf: &'a mut [u8],
}

/// Bytes a workspace needs for a list of (element size, count) requests, alignment included.
pub struct WorkspaceSize(pub usize);

impl WorkspaceSize {
    pub const fn new() -> Self {
        WorkspaceSize(0)
    }
    pub fn add<T>(&mut self, n: usize) -> Result<()> {
        let bytes = n
            .checked_mul(core::mem::size_of::<T>())
            .ok_or(Error::Overflow)?;
        let padded = bytes.checked_add(63).ok_or(Error::Overflow)? & !63;
        // 64 more for the alignment of the first slice
        self.0 = self.0.checked_add(padded).ok_or(Error::Overflow)?;
        Ok(())
    }
    pub fn total(&self) -> usize {
        self.0 + 64
    }
}

impl Default for WorkspaceSize {
    fn default() -> Self {
        Self::new()
    }
}

mod sealed {
    pub trait Pod: Copy + Default {}
    impl Pod for f32 {}
    impl Pod for f64 {}
    impl Pod for u32 {}
    impl Pod for u64 {}
    impl Pod for u128 {}
    impl Pod for u8 {}
}

impl<'a> Workspace<'a> {
    pub fn new(buf: &'a mut [u8]) -> Self {
        let off = buf.as_ptr().align_offset(64).min(buf.len());
        let (_, rest) = buf.split_at_mut(off);
        Workspace { buf: rest }
    }
    /// What is left, for scratch that is carved anew on every iteration.
    pub fn into_rest(self) -> &'a mut [u8] {
        self.buf
    }
    /// A zeroed slice of `n` elements.
    pub fn take<T: sealed::Pod>(&mut self, n: usize) -> Result<&'a mut [T]> {
        let bytes = n
            .checked_mul(core::mem::size_of::<T>())
            .ok_or(Error::Overflow)?;
        let padded = bytes.checked_add(63).ok_or(Error::Overflow)? & !63;
        let buf = core::mem::take(&mut self.buf);
        if padded > buf.len() && bytes > buf.len() {
            self.buf = buf;
            return Err(Error::WorkspaceTooSmall);
        }
        let cut = padded.min(buf.len());
        let (head, rest) = buf.split_at_mut(cut);
        self.buf = rest;
        // SAFETY: head is 64-byte aligned (every cut is a multiple of 64 from an aligned
        // start), at least `bytes` long, and T is plain data valid for any bit pattern.
        let s = unsafe { core::slice::from_raw_parts_mut(head.as_mut_ptr() as *mut T, n) };
        s.fill(T::default());
        Ok(s)
    }
}
