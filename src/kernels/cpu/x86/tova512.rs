//! TOVA's logits (`logits` in `math/score/tova.rs`) on AVX-512 (F + VL): 16 keys per block,
//! each key's row read in place 16 elements per FMA (f16 converted as loaded), its 16 lane
//! sums per query row reduced with the block's other keys ([`crate::lanes512`]). Every logit
//! is summed in the lane order of [`crate::lanes`], as in the 8-lane kernel: the same bits.
//! Built with Rust >= 1.89 only (`kvevict_avx512`), taken where [`crate::gemm512::available`].
#![allow(clippy::incompatible_msrv)]

use crate::lanes512::{finish, halve, load16};
use crate::numerics::prefetch_rows;
use core::arch::x86_64::*;

/// Keys ahead of those being multiplied that [`logits`] asks the cache for, a block's rows
/// spread over its groups of keys: the loads walk 4 rows side by side, which the hardware
/// prefetcher alone follows too late. Llama-3-8B f16 at 32k: 3.3–3.8 ms against 4.5–5.4 with
/// all 16 rows asked at the block's start (32 keys ahead); 64–128 about the same, SmolLM2
/// slower at 128.
const AHEAD: usize = 64;

/// `z[a][t] = Σ_d k[t][d]·q[a][d]` for `RA` rows and the 16 keys at `k` (`ld` elements apart;
/// f16 when `F16`), `dk` a multiple of 16; `bad` gains a NaN lane when a logit is not finite
/// (`z·0`). With `ahead > 0`, asks the cache for the rows `ahead` keys on.
///
/// # Safety
/// The CPU has AVX-512 F + VL; `k` holds 16 readable rows of `dk` elements, `q` `RA` rows of
/// `dk` floats, `z` `RA` rows of 16 writable floats, `zld` apart.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn block16<const RA: usize, const KB: usize, const F16: bool>(
    k: *const u8,
    ld: usize,
    dk: usize,
    q: *const f32,
    z: *mut f32,
    zld: usize,
    bad: &mut __m512,
    ahead: usize,
) {
    // SAFETY: this fn's contract
    unsafe {
        // KB keys at a time (KB·RA independent FMA chains: 2 FMAs per cycle of 4 cycles'
        // latency need 8), their lane sums halved pairwise at once
        let mut w = [[_mm512_setzero_ps(); 8]; RA];
        let es = if F16 { 2 } else { 4 };
        for p in 0..16 / KB {
            if ahead > 0 {
                // the rows `ahead` keys on, KB at a time as the keys are read (a hint: past
                // the last key it reads nothing)
                let kp = k.wrapping_add((KB * p + ahead) * ld * es);
                prefetch_rows(kp, ld * es, dk * es, KB);
            }
            let mut acc = [[_mm512_setzero_ps(); RA]; KB];
            let mut d = 0;
            while d < dk {
                let x: [__m512; KB] =
                    core::array::from_fn(|j| load16::<F16>(k, (KB * p + j) * ld + d));
                for a in 0..RA {
                    let qv = _mm512_loadu_ps(q.add(a * dk + d));
                    for j in 0..KB {
                        acc[j][a] = _mm512_fmadd_ps(x[j], qv, acc[j][a]);
                    }
                }
                d += 16;
            }
            for (a, w) in w.iter_mut().enumerate() {
                for j in 0..KB / 2 {
                    w[KB / 2 * p + j] = halve(acc[2 * j][a], acc[2 * j + 1][a]);
                }
            }
        }
        for (a, w) in w.into_iter().enumerate() {
            let s = finish(w);
            _mm512_storeu_ps(z.add(a * zld), s);
            *bad = _mm512_fmadd_ps(s, _mm512_setzero_ps(), *bad);
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
        let mut a0 = 0;
        while a0 < g {
            let (qa, za) = (q.add(a0 * dk), z.add(a0 * zld));
            let mut t = 0;
            while t < nt16 {
                let (kt, zt, b) = (k.add(t * ld * es), za.add(t), &mut bad);
                // the first sweep over the keys prefetches (the rows of later ones are cached)
                let ahead = if a0 == 0 { AHEAD } else { 0 };
                match (g - a0).min(4) {
                    4 => block16::<4, 4, F16>(kt, ld, dk, qa, zt, zld, b, ahead),
                    3 => block16::<3, 4, F16>(kt, ld, dk, qa, zt, zld, b, ahead),
                    2 => block16::<2, 4, F16>(kt, ld, dk, qa, zt, zld, b, ahead),
                    _ => block16::<1, 8, F16>(kt, ld, dk, qa, zt, zld, b, ahead),
                }
                t += 16;
            }
            a0 += 4;
        }
        _mm512_reduce_add_ps(bad) == 0.0
    }
}
