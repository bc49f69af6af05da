//! TOVA's logits ([`crate::score`]'s `tova::logits`) on AVX-512 (F + VL): 16 keys per vector
//! instead of 8, one 16×16 transpose per 16 keys × 16 dimensions (64 shuffles, against
//! 96 for four 8×8 ones) and half the FMA instructions. Every logit is the same FMA chain
//! over `d` from 0 as in the 8-lane kernel: the same bits. Built with Rust >= 1.89 only
//! (`kvevict_avx512`), taken where [`crate::gemm512::available`].
#![allow(clippy::incompatible_msrv)]

use crate::numerics::prefetch_rows;
use core::arch::x86_64::*;

/// The 16×16 transpose: lane `j` of output `i` is lane `i` of input `j`.
#[inline(always)]
unsafe fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
    // SAFETY: AVX-512 F is present (the callers' target features); registers only
    unsafe {
        let mut a = [_mm512_setzero_ps(); 16];
        for i in 0..8 {
            a[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            a[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        // b[4i + j], 128-bit lane L: dimension 4L + j of keys 4i .. 4i+3
        let mut b = [_mm512_setzero_ps(); 16];
        let pd = _mm512_castps_pd;
        for i in 0..4 {
            let (x0, x1, x2, x3) = (
                pd(a[4 * i]),
                pd(a[4 * i + 1]),
                pd(a[4 * i + 2]),
                pd(a[4 * i + 3]),
            );
            b[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(x0, x2));
            b[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(x0, x2));
            b[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(x1, x3));
            b[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(x1, x3));
        }
        let mut o = [_mm512_setzero_ps(); 16];
        for j in 0..4 {
            let c1 = _mm512_shuffle_f32x4::<0x44>(b[j], b[4 + j]);
            let c2 = _mm512_shuffle_f32x4::<0xEE>(b[j], b[4 + j]);
            let c3 = _mm512_shuffle_f32x4::<0x44>(b[8 + j], b[12 + j]);
            let c4 = _mm512_shuffle_f32x4::<0xEE>(b[8 + j], b[12 + j]);
            o[j] = _mm512_shuffle_f32x4::<0x88>(c1, c3);
            o[4 + j] = _mm512_shuffle_f32x4::<0xDD>(c1, c3);
            o[8 + j] = _mm512_shuffle_f32x4::<0x88>(c2, c4);
            o[12 + j] = _mm512_shuffle_f32x4::<0xDD>(c2, c4);
        }
        o
    }
}

/// `z[a][t] = Σ_d k[t][d]·q[a][d]` for `RA` rows and the 16 keys at `k` (`ld` elements apart;
/// f16 when `F16`), `dk` a multiple of 16; returns whether every logit is finite (`z·0`).
///
/// # Safety
/// The CPU has AVX-512 F + VL; `k` holds 16 readable rows of `dk` elements, `q` `RA` rows of
/// `dk` floats, `z` `RA` rows of 16 writable floats, `zld` apart.
#[inline(always)]
unsafe fn block16<const RA: usize, const F16: bool>(
    k: *const u8,
    ld: usize,
    dk: usize,
    q: *const f32,
    z: *mut f32,
    zld: usize,
    bad: &mut __m512,
) {
    // SAFETY: this fn's contract
    unsafe {
        let mut acc = [_mm512_setzero_ps(); RA];
        let mut d = 0;
        while d < dk {
            let mut r = [_mm512_setzero_ps(); 16];
            for (l, r) in r.iter_mut().enumerate() {
                *r = if F16 {
                    let p = (k as *const u16).add(l * ld + d);
                    _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
                } else {
                    _mm512_loadu_ps((k as *const f32).add(l * ld + d))
                };
            }
            let x = transpose16(r);
            for (i, x) in x.iter().enumerate() {
                for (a, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm512_fmadd_ps(*x, _mm512_set1_ps(*q.add(a * dk + d + i)), *acc);
                }
            }
            d += 16;
        }
        for (a, acc) in acc.iter().enumerate() {
            _mm512_storeu_ps(z.add(a * zld), *acc);
            *bad = _mm512_fmadd_ps(*acc, _mm512_setzero_ps(), *bad);
        }
    }
}

/// The logits of rows `a < g` for the `nt16` (a multiple of 16) keys at `k`, 16 at a time,
/// up to 4 rows per sweep over the keys; `dk` a multiple of 16. Returns whether every logit
/// is finite.
///
/// # Safety
/// The CPU has AVX-512 F + VL ([`crate::gemm512::available`]); `k` holds `nt16` readable rows
/// of `dk` elements `ld` apart (f16 when `F16`, else f32), `q` `g` rows of `dk` floats, `z`
/// `g` rows of `nt16` writable floats, `zld` apart.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn logits<const F16: bool>(
    k: *const u8,
    ld: usize,
    dk: usize,
    q: *const f32,
    g: usize,
    z: *mut f32,
    zld: usize,
    nt16: usize,
) -> bool {
    let es = if F16 { 2 } else { 4 };
    // SAFETY: this fn's contract; each block covers keys t .. t+16 (<= nt16) and rows
    // a0 .. a0+RA (<= g)
    unsafe {
        let mut bad = _mm512_setzero_ps();
        // about the same time ahead whatever the work per key (g·dk FMA lanes): 64 keys for
        // SmolLM2's 3·64, 32 for Llama-3-8B's 4·128 (64 there: 18 % slower at 32k; 32 for
        // SmolLM2: 16 % slower)
        let ahead = if g.min(4) * dk > 256 { 32 } else { 64 };
        let mut a0 = 0;
        while a0 < g {
            let (qa, za) = (q.add(a0 * dk), z.add(a0 * zld));
            let mut t = 0;
            while t < nt16 {
                let (kt, zt, b) = (k.add(t * ld * es), za.add(t), &mut bad);
                if a0 == 0 {
                    // `ahead` keys ahead, 16 rows per block: the loads walk 16 rows side by
                    // side, which the hardware prefetcher alone follows too late (a hint: past
                    // the last key it reads nothing)
                    prefetch_rows(kt.wrapping_add(ahead * ld * es), ld * es, dk * es, 16);
                }
                match (g - a0).min(4) {
                    4 => block16::<4, F16>(kt, ld, dk, qa, zt, zld, b),
                    3 => block16::<3, F16>(kt, ld, dk, qa, zt, zld, b),
                    2 => block16::<2, F16>(kt, ld, dk, qa, zt, zld, b),
                    _ => block16::<1, F16>(kt, ld, dk, qa, zt, zld, b),
                }
                t += 16;
            }
            a0 += 4;
        }
        _mm512_reduce_add_ps(bad) == 0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[target_feature(enable = "avx512f,avx512vl")]
    unsafe fn run(m: &[f32; 256]) -> [f32; 256] {
        // SAFETY: the features are enabled on this fn (its caller checked the CPU); 16 rows
        // of 16 inside the arrays
        unsafe {
            let mut r = [_mm512_setzero_ps(); 16];
            for (i, r) in r.iter_mut().enumerate() {
                *r = _mm512_loadu_ps(m.as_ptr().add(16 * i));
            }
            let o = transpose16(r);
            let mut out = [0f32; 256];
            for (i, o) in o.iter().enumerate() {
                _mm512_storeu_ps(out.as_mut_ptr().add(16 * i), *o);
            }
            out
        }
    }

    #[test]
    fn transpose16_transposes() {
        if !crate::gemm512::available() {
            return; // nothing to run on this CPU
        }
        let m: [f32; 256] = core::array::from_fn(|i| i as f32);
        // SAFETY: the CPU has AVX-512 F + VL (checked above).
        let o = unsafe { run(&m) };
        for i in 0..16 {
            for j in 0..16 {
                assert_eq!(o[16 * i + j], m[16 * j + i], "({i}, {j})");
            }
        }
    }
}
