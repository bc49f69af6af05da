//! The lane order ([`crate::lanes`]) on AVX-512 (F + VL): 16 rows' lane sums reduced together
//! by transposing adds (30 shuffles and 15 adds per 16 rows, then one permute into row
//! order), and KNorm's squared norms 16 keys at a time. Built with Rust >= 1.89 only
//! (`kvevict_avx512`), taken where [`crate::gemm512::available`].
#![allow(clippy::incompatible_msrv)]

use crate::kernels::cpu::portable::prefetch::prefetch_rows;
use core::arch::x86_64::*;

/// The first step of the tree for two rows: lanes `0..8` of the result are `a[l] + a[l + 8]`,
/// lanes `8..16` the same of `b`.
#[inline(always)]
pub(crate) unsafe fn halve(a: __m512, b: __m512) -> __m512 {
    // SAFETY: AVX-512 F is present (the callers' target features); registers only
    unsafe {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x44>(a, b),
            _mm512_shuffle_f32x4::<0xEE>(a, b),
        )
    }
}

/// The rest of the tree for 16 rows given as eight [`halve`]d pairs (`w[i]`: rows `2i`,
/// `2i + 1`): lane `r` of the result is row `r`'s sum.
#[inline(always)]
pub(crate) unsafe fn finish(w: [__m512; 8]) -> __m512 {
    // SAFETY: AVX-512 F is present (as `halve`); registers only
    unsafe {
        // h = 4: 128-bit quarter j of u[i] holds row 4i + j's four sums
        let u: [__m512; 4] = core::array::from_fn(|i| {
            let (a, b) = (w[2 * i], w[2 * i + 1]);
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x88>(a, b),
                _mm512_shuffle_f32x4::<0xDD>(a, b),
            )
        });
        // h = 2: quarter j of y[i] holds rows 8i + j and 8i + 4 + j, two sums each
        let pd = _mm512_castps_pd;
        let y: [__m512; 2] = core::array::from_fn(|i| {
            let (a, b) = (pd(u[2 * i]), pd(u[2 * i + 1]));
            _mm512_add_ps(
                _mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)),
            )
        });
        // h = 1: lane 4j + m holds row 4m + j
        let s = _mm512_add_ps(
            _mm512_shuffle_ps::<0x88>(y[0], y[1]),
            _mm512_shuffle_ps::<0xDD>(y[0], y[1]),
        );
        let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        _mm512_permutexvar_ps(idx, s)
    }
}

/// 16 elements of a row at element `i` of `k` (f16 when `F16`) as f32.
///
/// # Safety
/// AVX-512 F is present; elements `i .. i + 16` of `k` are readable.
#[inline(always)]
pub(crate) unsafe fn load16<const F16: bool>(k: *const u8, i: usize) -> __m512 {
    // SAFETY: the caller's contract
    unsafe {
        if F16 {
            let p = (k as *const u16).add(i);
            _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
        } else {
            _mm512_loadu_ps((k as *const f32).add(i))
        }
    }
}

/// Keys ahead of the block being summed that [`squares`] asks the cache for, a few rows per
/// step over `d`: its loads walk 16 rows side by side, which the hardware prefetcher alone
/// follows too late (Llama-3-8B f16 at 32k: 2.4 ms with all 16 rows asked at the block's
/// start, 5.0 ms without, 1.9 ms spread; 64 keys ahead slower).
const AHEAD: usize = 32;

/// `out[t] = Σ_d x_d·x_d` (lane order, fused) for the `out.len()`
/// (a multiple of 16) rows of `dk` (a multiple of 16) elements at `k`, `ld` elements apart
/// (f16 when `F16`).
///
/// # Safety
/// The CPU has AVX-512 F + VL ([`crate::gemm512::available`]) and F16C; `k` holds `out.len()`
/// readable rows of `dk` elements, `ld` apart.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn squares<const F16: bool>(k: *const u8, ld: usize, dk: usize, out: &mut [f32]) {
    let es = if F16 { 2 } else { 4 };
    // SAFETY: this fn's contract; each block reads rows t .. t+16 (<= out.len())
    unsafe {
        let per = 16usize.div_ceil((dk / 16).max(1));
        for (b, o) in out.chunks_exact_mut(16).enumerate() {
            let kt = k.add(16 * b * ld * es);
            let mut acc = [_mm512_setzero_ps(); 16];
            let mut d = 0;
            let mut r0 = 0;
            while d < dk {
                if r0 < 16 {
                    // the rows AHEAD keys on, spread over the block's steps
                    let n = per.min(16 - r0);
                    prefetch_rows(kt.wrapping_add((AHEAD + r0) * ld * es), ld * es, dk * es, n);
                    r0 += n;
                }
                for (j, acc) in acc.iter_mut().enumerate() {
                    let x = load16::<F16>(kt, j * ld + d);
                    *acc = _mm512_fmadd_ps(x, x, *acc);
                }
                d += 16;
            }
            let w = core::array::from_fn(|i| halve(acc[2 * i], acc[2 * i + 1]));
            _mm512_storeu_ps(o.as_mut_ptr(), finish(w));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lanes::tests::{f16_rows, spread, sum_squares};
    use crate::lanes::tree16;

    #[target_feature(enable = "avx512f,avx512vl")]
    unsafe fn reduce(m: &[f32; 256]) -> [f32; 16] {
        // SAFETY: the features are enabled on this fn (its caller checked the CPU); 16 rows
        // of 16 inside the arrays
        unsafe {
            let r: [__m512; 16] = core::array::from_fn(|i| _mm512_loadu_ps(m.as_ptr().add(16 * i)));
            let w = core::array::from_fn(|i| halve(r[2 * i], r[2 * i + 1]));
            let mut out = [0f32; 16];
            _mm512_storeu_ps(out.as_mut_ptr(), finish(w));
            out
        }
    }

    /// The transposing reduction is [`tree16`] row by row, bit for bit, in row order; the
    /// AVX-512 norms are [`sum_squares`], f32 and f16.
    #[test]
    fn lanes512_match_scalar_order() {
        if !(crate::gemm512::available() && crate::numerics::has_avx2()) {
            return; // nothing to run on this CPU
        }
        for seed in 0..8 {
            let v = spread(256, seed);
            let m: [f32; 256] = core::array::from_fn(|i| v[i]);
            // SAFETY: the CPU has AVX-512 F + VL (checked above)
            let o = unsafe { reduce(&m) };
            for r in 0..16 {
                let row: [f32; 16] = core::array::from_fn(|l| m[16 * r + l]);
                assert_eq!(o[r].to_bits(), tree16(row).to_bits(), "seed {seed} row {r}");
            }
        }
        for dk in [16, 48, 64, 128] {
            let (n, ld) = (48, dk + 16);
            let kv = spread(n * ld, dk as u64);
            let (k16, k16f) = f16_rows(&kv);
            let (mut a, mut b) = (std::vec![0f32; n], std::vec![0f32; n]);
            // SAFETY: the CPU has AVX-512 F + VL and F16C (checked above); n rows of dk
            // elements, ld apart
            unsafe {
                squares::<false>(kv.as_ptr() as *const u8, ld, dk, &mut a);
                squares::<true>(k16.as_ptr() as *const u8, ld, dk, &mut b);
            }
            for t in 0..n {
                let (r32, r16) = (&kv[t * ld..t * ld + dk], &k16f[t * ld..t * ld + dk]);
                assert_eq!(
                    a[t].to_bits(),
                    sum_squares(r32).to_bits(),
                    "dk {dk} key {t}"
                );
                assert_eq!(
                    b[t].to_bits(),
                    sum_squares(r16).to_bits(),
                    "dk {dk} f16 key {t}"
                );
            }
        }
    }
}
