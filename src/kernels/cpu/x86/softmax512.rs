//! The window pass's softmax passes (`math/window.rs`) on 16-lane vectors where the CPU has
//! AVX-512 F + VL: pass 1's per-chunk row max and exp sums ([`max_expsum`]) and pass 2's
//! column sums at w = 8 ([`column_sums_w8`]). Their 8-lane versions run two 8-lane vectors
//! per 16-lane exp (joined, then split again) and pass 2 reduces each (key, head) row of 8
//! by an 8×8 transpose; here a 16-lane vector holds two row blocks of one key (or, for an odd
//! last block, the block of two consecutive keys), and pass 2 reduces 16 (key, head) rows at
//! once. Every lane gets the same operations in the same order — the maxima and exp sums
//! key by key from the same start, the same exp, the sum of a row's 8 probabilities by
//! `hsum`'s tree `((0+4)+(2+6))+((1+5)+(3+7))` — so the same bits. Built with Rust >= 1.89
//! only (`kvevict_avx512`), taken where [`crate::gemm512::available`].
#![allow(clippy::incompatible_msrv)]

use crate::colstats::{Needs, Stats};
use crate::numerics::{Avx2, Simd};
use crate::simd512::{exp_neg2, join, split};
use core::arch::x86_64::*;

/// `Simd::max(a, b)` on 16 lanes: `b > a ? b : a`.
#[inline(always)]
unsafe fn max16(a: __m512, b: __m512) -> __m512 {
    // SAFETY: AVX-512 F is present (our callers' target features); registers only
    unsafe { _mm512_max_ps(b, a) }
}

/// `Simd::min(a, b)` on 16 lanes: `b < a ? b : a`.
#[inline(always)]
unsafe fn min16(a: __m512, b: __m512) -> __m512 {
    // SAFETY: AVX-512 F is present (our callers' target features); registers only
    unsafe { _mm512_min_ps(b, a) }
}

/// The 8 floats at `p` in both halves.
#[inline(always)]
unsafe fn dup8(p: *const f32) -> __m512 {
    // SAFETY: AVX-512 F is present (our callers' target features); `p` holds 8 floats (the
    // callers')
    unsafe { _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd(p as *const f64))) }
}

/// `window::max_expsum` for `nb` (1 to 4) blocks of 8 rows from `cp` (`nt` keys, `rp`
/// apart): the new running max `max(mp, max_t c)` to `mx` and `Σ_t exp(c - max)`, summed in
/// key order from 0, to `cs`; the same bits.
///
/// # Safety
/// The CPU has AVX-512 F + VL ([`crate::gemm512::available`]); `cp` holds `nt` rows of
/// `8·nb` readable floats `rp` apart; `mp`, `mx`, `cs` `8·nb` floats.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn max_expsum(
    nb: usize,
    cp: *const f32,
    nt: usize,
    rp: usize,
    mp: *const f32,
    mx: *mut f32,
    cs: *mut f32,
) {
    // SAFETY: this fn's contract, passed on
    unsafe {
        match nb {
            4 => blocks::<4>(cp, nt, rp, mp, mx, cs),
            3 => blocks::<3>(cp, nt, rp, mp, mx, cs),
            2 => blocks::<2>(cp, nt, rp, mp, mx, cs),
            _ => blocks::<1>(cp, nt, rp, mp, mx, cs),
        }
    }
}

/// [`max_expsum`] for `NB` blocks: blocks `2j, 2j+1` of a key in vector `j`; an odd last
/// block of keys `t, t+1` in one vector (its sums split back in key order).
#[inline(always)]
unsafe fn blocks<const NB: usize>(
    cp: *const f32,
    nt: usize,
    rp: usize,
    mp: *const f32,
    mx: *mut f32,
    cs: *mut f32,
) {
    // SAFETY: AVX-512 F + VL present (`max_expsum`'s features); every load is block `b < NB`
    // of a key `t < nt`, every store one of the `8·NB` floats of `mx`/`cs` (its contract)
    unsafe {
        let z = NB / 2; // whole 16-lane vectors per key
        let odd = NB % 2 == 1;
        let ob = 16 * z; // the odd block's offset in a key's row
        let ninf = f32::NEG_INFINITY;
        let mut mz = [_mm512_set1_ps(ninf); 2];
        let mut my = Avx2::splat(ninf);
        for t in 0..nt {
            let kp = cp.add(t * rp);
            for (j, m) in mz.iter_mut().enumerate().take(z) {
                *m = max16(*m, _mm512_loadu_ps(kp.add(16 * j)));
            }
            if odd {
                my = Avx2::max(my, Avx2::load(kp.add(ob)));
            }
        }
        for (j, m) in mz.iter_mut().enumerate().take(z) {
            *m = max16(_mm512_loadu_ps(mp.add(16 * j)), *m);
        }
        if odd {
            my = Avx2::max(Avx2::load(mp.add(ob)), my);
        }
        let myy = join(my, my);
        let mut az = [_mm512_setzero_ps(); 2];
        let mut ay = Avx2::zero();
        // keys per step: whole pairs of 16-lane exps (NB = 3: 4 keys, 6 vectors)
        let ks = match NB {
            1 | 3 => 4,
            2 => 2,
            _ => 1,
        };
        let nz = ks * NB / 2;
        let mut t = 0;
        while t + ks <= nt {
            // the step's vectors: each key's whole vectors, then the odd blocks by key pairs
            let mut x = [_mm512_setzero_ps(); 6];
            let mut i = 0;
            for u in 0..ks {
                let kp = cp.add((t + u) * rp);
                for (j, &m) in mz.iter().enumerate().take(z) {
                    x[i] = _mm512_sub_ps(_mm512_loadu_ps(kp.add(16 * j)), m);
                    i += 1;
                }
            }
            if odd {
                for u in (0..ks).step_by(2) {
                    let kp = cp.add((t + u) * rp + ob);
                    let v = join(Avx2::load(kp), Avx2::load(kp.add(rp)));
                    x[i] = _mm512_sub_ps(v, myy);
                    i += 1;
                }
            }
            let mut e = [_mm512_setzero_ps(); 6];
            let mut c = 0;
            while c < nz {
                let [a, b] = exp_neg2([x[c], x[c + 1]]);
                e[c] = a;
                e[c + 1] = b;
                c += 2;
            }
            let mut i = 0;
            for _ in 0..ks {
                for a in az.iter_mut().take(z) {
                    *a = _mm512_add_ps(*a, e[i]);
                    i += 1;
                }
            }
            if odd {
                for _ in (0..ks).step_by(2) {
                    let (lo, hi) = split(e[i]);
                    ay = Avx2::add(Avx2::add(ay, lo), hi);
                    i += 1;
                }
            }
            t += ks;
        }
        // the last keys one at a time (16-lane exps of one vector; the odd block 8-lane)
        for t in t..nt {
            let kp = cp.add(t * rp);
            for (j, a) in az.iter_mut().enumerate().take(z) {
                let x = _mm512_sub_ps(_mm512_loadu_ps(kp.add(16 * j)), mz[j]);
                *a = _mm512_add_ps(*a, exp_neg2([x, x])[0]);
            }
            if odd {
                let x = Avx2::sub(Avx2::load(kp.add(ob)), my);
                ay = Avx2::add(ay, Avx2::exp_neg(x));
            }
        }
        for j in 0..z {
            _mm512_storeu_ps(mx.add(16 * j), mz[j]);
            _mm512_storeu_ps(cs.add(16 * j), az[j]);
        }
        if odd {
            Avx2::store(mx.add(ob), my);
            Avx2::store(cs.add(ob), ay);
        }
    }
}

/// Rows `i + (i+4)` of two vectors: blocks 0+1 and 2+3 of `a`, then of `b`.
#[inline(always)]
unsafe fn level1(a: __m512, b: __m512) -> __m512 {
    // SAFETY: AVX-512 F is present (our callers' target features); registers only
    unsafe {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x88>(a, b),
            _mm512_shuffle_f32x4::<0xDD>(a, b),
        )
    }
}

/// Within each 128-bit block, lanes picked by `L` plus lanes picked by `H` (of `a`, then of
/// `b`): `0x44, 0xEE` adds lanes `0+2, 1+3`, `0x88, 0xDD` lanes `0+1, 2+3`.
#[inline(always)]
unsafe fn level<const L: i32, const H: i32>(a: __m512, b: __m512) -> __m512 {
    // SAFETY: AVX-512 F is present (our callers' target features); registers only
    unsafe { _mm512_add_ps(_mm512_shuffle_ps::<L>(a, b), _mm512_shuffle_ps::<H>(a, b)) }
}

/// Lane sums of 8 vectors, each two rows of 8 (one (key, head) pair per half), by `hsum`'s
/// tree `((0+4)+(2+6))+((1+5)+(3+7))`; output lanes
/// `A0 C0 E0 G0 | A1 C1 E1 G1 | B0 D0 F0 H0 | B1 D1 F1 H1` for inputs `A..H` (`X0`: the
/// row in `X`'s low half, `X1`: high half).
#[inline(always)]
unsafe fn reduce8(v: &[__m512; 8]) -> __m512 {
    // SAFETY: AVX-512 F is present (our callers' target features); registers only
    unsafe {
        let s1 = [
            level1(v[0], v[1]),
            level1(v[2], v[3]),
            level1(v[4], v[5]),
            level1(v[6], v[7]),
        ];
        let l2 = level::<0x44, 0xEE>;
        level::<0x88, 0xDD>(l2(s1[0], s1[1]), l2(s1[2], s1[3]))
    }
}

/// [`reduce8`] for 4 vectors: output lanes `A0 C0 · · A1 C1 · · B0 D0 · · B1 D1 · ·`.
#[inline(always)]
unsafe fn reduce4(v: &[__m512; 4]) -> __m512 {
    // SAFETY: AVX-512 F is present (our callers' target features); registers only
    unsafe {
        let s2 = level::<0x44, 0xEE>(level1(v[0], v[1]), level1(v[2], v[3]));
        level::<0x88, 0xDD>(s2, s2)
    }
}

/// `q·q` (as `Simd::fma(q, q, 0)`) of each vector.
#[inline(always)]
unsafe fn squares<const N: usize>(q: &[__m512; N]) -> [__m512; N] {
    // SAFETY: AVX-512 F is present (our callers' target features); registers only
    unsafe {
        let mut o = *q;
        for o in o.iter_mut() {
            *o = _mm512_fmadd_ps(*o, *o, _mm512_setzero_ps());
        }
        o
    }
}

/// `d[0..8] += s` (`Simd::add(load(d), s)`).
#[inline(always)]
unsafe fn add_to(d: &mut [f32], s: __m256) {
    // SAFETY: AVX2 is present (our callers' target features); `d` holds 8 floats
    unsafe {
        let d = d[..8].as_mut_ptr();
        Avx2::store(d, Avx2::add(Avx2::load(d), s))
    }
}

/// [`reduce8`]'s sums of heads `a, a+1` (blocks 0, 2 and 1, 3) added to their 8 keys at
/// `o[d0..]` and `o[d0 + p..]`.
#[inline(always)]
unsafe fn add_pair(o: &mut [f32], d0: usize, p: usize, s: __m512) {
    // SAFETY: AVX-512 F is present (our callers' target features); `add_to` checks the range
    unsafe {
        let (lo, hi) = split(_mm512_shuffle_f32x4::<0xD8>(s, s));
        add_to(&mut o[d0..], lo);
        add_to(&mut o[d0 + p..], hi);
    }
}

/// [`reduce4`]'s sums of keys (t0,t1) (t4,t5) (t2,t3) (t6,t7) — lanes 0 4 1 5 8 12 9 13
/// are keys 0..8 — added to `o[d0..d0 + 8]`.
#[inline(always)]
unsafe fn add_one(o: &mut [f32], d0: usize, s: __m512) {
    // SAFETY: AVX-512 F is present (our callers' target features); `add_to` checks the range
    unsafe {
        let idx = _mm512_setr_epi32(0, 4, 1, 5, 8, 12, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
        add_to(&mut o[d0..], split(_mm512_permutexvar_ps(idx, s)).0);
    }
}

/// Pass 2 at w = 8 (`window::fused_stats` with one vector per (key, head)) for keys
/// `0 .. nt8` (a multiple of 8) of a chunk starting at prefix key `c0`: each head's
/// probabilities `exp(min(z - m, 0))·inv`, summed (and squared and summed) over its 8 rows,
/// added into `out` (`[g][p]`). The same operations in the same order: the same bits.
///
/// # Safety
/// The CPU has AVX-512 F + VL ([`crate::gemm512::available`]); `src` holds `nt8` rows of
/// `rp = 8·g` floats; `m` and `inv` hold `rp` floats; `out`'s rows cover `c0 + nt8 <= p`.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn column_sums_w8(
    src: *const f32,
    c0: usize,
    nt8: usize,
    p: usize,
    g: usize,
    m: &[f32],
    inv: &[f32],
    needs: Needs,
    out: &mut Stats,
) {
    // SAFETY: AVX-512 F + VL present (this fn's features); loads are rows `< nt8` of `src`
    // and the `rp` floats of `m`/`inv`, stores the slices of `out` (indexed, so checked)
    unsafe {
        let rp = 8 * g;
        assert!(m.len() >= rp && inv.len() >= rp && c0 + nt8 <= p);
        let (mp, ip) = (m.as_ptr(), inv.as_ptr());
        let zero = _mm512_setzero_ps();
        let pair = g / 2 * 2;
        let mut tb = 0;
        while tb < nt8 {
            // heads a, a+1 together: key tb+k's 16 floats at row offset 8a
            let mut a = 0;
            while a < pair {
                let (mv, iv) = (
                    _mm512_loadu_ps(mp.add(8 * a)),
                    _mm512_loadu_ps(ip.add(8 * a)),
                );
                // inputs in the order t0 t4 t1 t5 t2 t6 t3 t7 put head a's 8 sums in blocks
                // 0 and 2, head a+1's in 1 and 3
                let mut x = [zero; 8];
                for (i, x) in x.iter_mut().enumerate() {
                    let k = (i % 2) * 4 + i / 2;
                    let z = _mm512_sub_ps(_mm512_loadu_ps(src.add((tb + k) * rp + 8 * a)), mv);
                    *x = min16(z, zero);
                }
                let mut q = [zero; 8];
                for c in 0..4 {
                    let [e0, e1] = exp_neg2([x[2 * c], x[2 * c + 1]]);
                    q[2 * c] = _mm512_mul_ps(e0, iv);
                    q[2 * c + 1] = _mm512_mul_ps(e1, iv);
                }
                let d0 = a * p + c0 + tb;
                if needs.sum {
                    add_pair(out.sum, d0, p, reduce8(&q));
                }
                if needs.sq {
                    add_pair(out.sq, d0, p, reduce8(&squares(&q)));
                }
                a += 2;
            }
            if pair < g {
                // the last head: keys tb+2i, tb+2i+1 in one vector, in the order
                // (t0,t1) (t4,t5) (t2,t3) (t6,t7); lanes 0 4 1 5 8 12 9 13 are keys 0..8
                let (mv, iv) = (dup8(mp.add(8 * a)), dup8(ip.add(8 * a)));
                let mut x = [zero; 4];
                for (i, x) in x.iter_mut().enumerate() {
                    let k = 2 * ((i % 2) * 2 + i / 2);
                    let r = src.add((tb + k) * rp + 8 * a);
                    let z = _mm512_sub_ps(join(Avx2::load(r), Avx2::load(r.add(rp))), mv);
                    *x = min16(z, zero);
                }
                let mut q = [zero; 4];
                for c in 0..2 {
                    let [e0, e1] = exp_neg2([x[2 * c], x[2 * c + 1]]);
                    q[2 * c] = _mm512_mul_ps(e0, iv);
                    q[2 * c + 1] = _mm512_mul_ps(e1, iv);
                }
                let d0 = a * p + c0 + tb;
                if needs.sum {
                    add_one(out.sum, d0, reduce4(&q));
                }
                if needs.sq {
                    add_one(out.sq, d0, reduce4(&squares(&q)));
                }
            }
            tb += 8;
        }
    }
}
