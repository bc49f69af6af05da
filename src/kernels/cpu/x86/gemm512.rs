//! The window pass's Q·Kᵀ (`window::gemm` in `math/window.rs`) on AVX-512 (F + VL), taken instead of
//! the AVX2 kernel when the CPU has it: 16 window rows per vector, up to 4 vectors (64 rows)
//! per key tile, so small windows (w = 8: 24 or 32 rows) need 2 FMAs per key element
//! instead of 3-4. Every logit is the same chain of fused multiply-adds over `d` from 0, in
//! the same order, as in the AVX2 kernel: the same bits. `KVEVICT_NO_AVX512` (any value)
//! keeps the AVX2 kernel, to compare the two. Built with Rust >= 1.89 only (`build.rs`
//! sets `kvevict_avx512`), where these intrinsics are stable.
#![allow(clippy::incompatible_msrv)]

use core::arch::x86_64::*;

/// Whether the CPU has AVX-512 F and VL and `KVEVICT_NO_AVX512` is not set (once per process).
pub(crate) fn available() -> bool {
    static STATE: core::sync::atomic::AtomicU8 = core::sync::atomic::AtomicU8::new(0);
    crate::numerics::decided_once(&STATE, || {
        std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512vl")
            && std::env::var_os("KVEVICT_NO_AVX512").is_none()
    })
}

/// One vector of window rows: its packed query panel (`[d][16]`, or `[d][8]` for the last
/// panel when `rows_pad % 16 == 8`), the floats between consecutive `d`, and the lane mask.
#[derive(Clone, Copy)]
struct Slot {
    q: *const f32,
    step: usize,
    mask: __mmask16,
}

/// `window::gemm` (same contract, same packing, same bits; `in_place`: prefetch
/// the keys ahead).
///
/// # Safety
/// As `window::gemm`; the CPU must have AVX-512 F and VL ([`available`]).
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
pub(crate) unsafe fn gemm(
    q: &[f32],
    dk: usize,
    rp: usize,
    k: *const f32,
    ldk: usize,
    ntp: usize,
    c: &mut [f32],
    in_place: bool,
) -> bool {
    // SAFETY: the CPU has AVX-512 F + VL, AVX2 and FMA (this fn's contract and target features); `k`
    // holds `ntp` rows `ldk` apart (contract) and every panel and `c` offset stays inside `q`
    // and `c` (asserted first).
    unsafe {
        assert!(ntp % 6 == 0 && c.len() >= ntp * rp);
        assert!(q.len() >= rp * dk && rp % 8 == 0);
        let slots = rp.div_ceil(16);
        let (full, half) = (rp / 16, rp % 16 == 8);
        let (q, c) = (q.as_ptr(), c.as_mut_ptr());
        let mut bad = _mm512_setzero_ps();
        let mut s0 = 0;
        while s0 < slots {
            if half && full - s0 <= 3 {
                // the last full slots with the 8-row panel, which takes two keys per vector
                let f = |v: usize| q.add((s0 + v.min(full - s0)) * 16 * dk);
                let fs = [f(0), f(1), f(2)];
                let (qh, cs) = (q.add(full * 16 * dk), c.add(s0 * 16));
                let pf = in_place && s0 == 0;
                // `V` full slots, `KN` keys a tile (as below)
                macro_rules! tiles_h {
                    ($v:literal, $kn:literal) => {
                        tiles_h::<$v, $kn>(k, ldk, dk, &fs, qh, cs, rp, ntp, &mut bad, pf)
                    };
                }
                match full - s0 {
                    0 => tiles_h!(0, 12),
                    1 => tiles_h!(1, 12),
                    2 => tiles_h!(2, 6),
                    _ => tiles_h!(3, 6),
                }
                break;
            }
            let ns = (slots - s0).min(4);
            let slot = |v: usize| {
                let r = (s0 + v.min(ns - 1)) * 16;
                let half = r + 16 > rp;
                Slot {
                    // every panel starts at row r: r·dk floats in (the 8-row one included)
                    q: q.add(r * dk),
                    step: if half { 8 } else { 16 },
                    mask: if half { 0xFF } else { 0xFFFF },
                }
            };
            let sl = [slot(0), slot(1), slot(2), slot(3)];
            let cs = c.add(s0 * 16);
            // 12 keys per tile while the rows fit 2 vectors, else 6 (at most 24 accumulators)
            match ns {
                1 => tiles::<1, 12>(k, ldk, dk, &sl, cs, rp, ntp, &mut bad, in_place && s0 == 0),
                2 => tiles::<2, 12>(k, ldk, dk, &sl, cs, rp, ntp, &mut bad, in_place && s0 == 0),
                3 => tiles::<3, 6>(k, ldk, dk, &sl, cs, rp, ntp, &mut bad, in_place && s0 == 0),
                _ => tiles::<4, 6>(k, ldk, dk, &sl, cs, rp, ntp, &mut bad, in_place && s0 == 0),
            }
            s0 += ns;
        }
        _mm512_reduce_add_ps(bad) == 0.0
    }
}

/// With `pf` (keys read in place, first sweep over the chunk's keys), the rows of the tile 48 keys ahead
/// asked for: a tile's loads walk `KN` rows side by side, which the hardware prefetcher
/// alone follows late (past the chunk's end: the next chunk's keys when they are read in
/// place; a hint, which never faults).
#[inline(always)]
fn prefetch_ahead(pf: bool, k: *const f32, t0: usize, kn: usize, ldk: usize, dk: usize) {
    if pf {
        let p = k.wrapping_add((t0 + 48) * ldk) as *const u8;
        crate::kernels::cpu::portable::prefetch::prefetch_rows(p, ldk * 4, dk * 4, kn);
    }
}

/// Tiles of `KN` keys (then of 6 for the rest: `ntp` is a multiple of 6) over `V` slots.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tiles<const V: usize, const KN: usize>(
    k: *const f32,
    ldk: usize,
    dk: usize,
    sl: &[Slot; 4],
    c: *mut f32,
    ldc: usize,
    ntp: usize,
    bad: &mut __m512,
    pf: bool,
) {
    // SAFETY: `gemm`'s contract (CPU features, `k` `ntp` rows `ldk` apart, `c` `ntp` rows `ldc`
    // apart); each tile starts at a key `t0` with `t0 + KN <= ntp` (or 6).
    unsafe {
        let mut t0 = 0;
        while t0 + KN <= ntp {
            prefetch_ahead(pf, k, t0, KN, ldk, dk);
            tile::<V, KN>(k.add(t0 * ldk), ldk, dk, sl, c.add(t0 * ldc), ldc, bad);
            t0 += KN;
        }
        while t0 < ntp {
            tile::<V, 6>(k.add(t0 * ldk), ldk, dk, sl, c.add(t0 * ldc), ldc, bad);
            t0 += 6;
        }
    }
}

/// [`tiles`] for `V` full slots (16-row panels at `fs`, `[d][16]`) followed by the 8-row
/// panel `qh` (`[d][8]`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tiles_h<const V: usize, const KN: usize>(
    k: *const f32,
    ldk: usize,
    dk: usize,
    fs: &[*const f32; 3],
    qh: *const f32,
    c: *mut f32,
    ldc: usize,
    ntp: usize,
    bad: &mut __m512,
    pf: bool,
) {
    // SAFETY: the caller built with AVX-512 F + VL (`available`); `k`, `qh`, `fs`, `c` cover `ntp` keys and their logits (this fn's contract)
    unsafe {
        let mut t0 = 0;
        while t0 + KN <= ntp {
            prefetch_ahead(pf, k, t0, KN, ldk, dk);
            tile_h::<V, KN>(k.add(t0 * ldk), ldk, dk, fs, qh, c.add(t0 * ldc), ldc, bad);
            t0 += KN;
        }
        while t0 < ntp {
            tile_h::<V, 6>(k.add(t0 * ldk), ldk, dk, fs, qh, c.add(t0 * ldc), ldc, bad);
            t0 += 6;
        }
    }
}

/// [`tile`] for `V` full slots and the 8-row panel, whose logits take half a vector per
/// key: keys `2j` and `2j + 1` share one (their broadcasts blended, the panel's 8 rows in
/// both halves), so 8 rows cost half an FMA per key element instead of a whole one. Each
/// lane is still its logit's FMA chain over `d` in order (the same bits).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_h<const V: usize, const KN: usize>(
    k: *const f32,
    ldk: usize,
    dk: usize,
    fs: &[*const f32; 3],
    qh: *const f32,
    c: *mut f32,
    ldc: usize,
    bad: &mut __m512,
) {
    // SAFETY: AVX-512 F + VL present (the callers' contract); `k` holds `KN` keys of `dk` floats `ldk` apart, `qh`/`fs` the query panel, `c` `KN` rows of logits `ldc` apart
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 3]; KN];
        let mut acch = [_mm512_setzero_ps(); 6];
        let mut kr = [k; KN];
        for (i, r) in kr.iter_mut().enumerate() {
            *r = k.add(i * ldk);
        }
        for d in 0..dk {
            let mut qv = [_mm512_setzero_ps(); 3];
            for (v, x) in qv.iter_mut().enumerate().take(V) {
                *x = _mm512_loadu_ps(fs[v].add(d * 16));
            }
            // the panel's 8 floats in both halves
            let qd = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd(
                qh.add(d * 8) as *const f64
            )));
            for j in 0..KN / 2 {
                let b = [
                    _mm512_set1_ps(*kr[2 * j].add(d)),
                    _mm512_set1_ps(*kr[2 * j + 1].add(d)),
                ];
                for (u, &b) in b.iter().enumerate() {
                    for v in 0..V {
                        acc[2 * j + u][v] = _mm512_fmadd_ps(b, qv[v], acc[2 * j + u][v]);
                    }
                }
                let bb = _mm512_mask_blend_ps(0xFF00, b[0], b[1]);
                acch[j] = _mm512_fmadd_ps(bb, qd, acch[j]);
            }
        }
        for i in 0..KN {
            for v in 0..V {
                _mm512_storeu_ps(c.add(i * ldc + 16 * v), acc[i][v]);
                *bad = _mm512_fmadd_ps(acc[i][v], _mm512_setzero_ps(), *bad);
            }
        }
        for j in 0..KN / 2 {
            let (lo, hi) = (
                _mm512_castps512_ps256(acch[j]),
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acch[j]))),
            );
            _mm256_storeu_ps(c.add(2 * j * ldc + 16 * V), lo);
            _mm256_storeu_ps(c.add((2 * j + 1) * ldc + 16 * V), hi);
            *bad = _mm512_fmadd_ps(acch[j], _mm512_setzero_ps(), *bad);
        }
    }
}

/// `c[t][16v + l] = Σ_d k[t][d]·q_v[d][l]` for `KN` keys and `V` slots; `bad` gains a NaN
/// lane when a logit is not finite (as the AVX2 tile; masked-off lanes hold 0, or NaN only
/// when a key element is NaN/Inf, which the real lanes show too).
#[inline(always)]
unsafe fn tile<const V: usize, const KN: usize>(
    k: *const f32,
    ldk: usize,
    dk: usize,
    sl: &[Slot; 4],
    c: *mut f32,
    ldc: usize,
    bad: &mut __m512,
) {
    // SAFETY: the CPU has AVX-512 F + VL (our callers run under `gemm`'s target features); `k`
    // holds `KN` rows `ldk` apart, each slot's panel `dk` steps and `c` `KN` rows `ldc` apart
    // (as `tiles` passes them).
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); V]; KN];
        let mut kr = [k; KN];
        for (i, r) in kr.iter_mut().enumerate() {
            *r = k.add(i * ldk);
        }
        for d in 0..dk {
            // plain loops, not `array::from_fn` (its closures may stay outlined)
            let mut qv = [_mm512_setzero_ps(); V];
            for (v, x) in qv.iter_mut().enumerate() {
                *x = _mm512_maskz_loadu_ps(sl[v].mask, sl[v].q.add(d * sl[v].step));
            }
            for i in 0..KN {
                let b = _mm512_set1_ps(*kr[i].add(d));
                for v in 0..V {
                    acc[i][v] = _mm512_fmadd_ps(b, qv[v], acc[i][v]);
                }
            }
        }
        for i in 0..KN {
            for v in 0..V {
                _mm512_mask_storeu_ps(c.add(i * ldc + 16 * v), sl[v].mask, acc[i][v]);
                *bad = _mm512_fmadd_ps(acc[i][v], _mm512_setzero_ps(), *bad);
            }
        }
    }
}
