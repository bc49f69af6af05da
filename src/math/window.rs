//! The one window-attention pass every query-aware scorer shares (design §2).
//!
//! For one KV group (`g` query heads reading KV head `kh`) it computes, for each prefix
//! token `i < P = N - w`, column statistics of the softmax attention of the `w` window
//! queries: `Σ_j A[h,j,i]`, optionally `Σ_j A[h,j,i]²` and the cross products
//! `Σ_j A[a,j,i]·A[b,j,i]` of the group's heads. Softmax is over every visible key
//! (causal inside the window), in f32 with max subtraction; the per-row denominators are
//! accumulated over chunks in f64 because a row can have up to 2^31 terms.
//!
//! Pass 1 gives each row's max and denominator, pass 2 the column statistics; both need the
//! logits. **One pass** ([`one_pass`]): when one KV group's `g·w·N` f32 logits fit
//! [`ONE_PASS_MAX_BYTES`] (16 MiB: `g·w·N·4 <= 2^24`), Q·Kᵀ runs once, its logits stay in
//! the workspace (`[N][g·w rounded up to 8]`, reused by every group; the size query
//! counts it), pass 1 runs on each chunk as it is computed and pass 2 reads the store.
//! **Two passes** otherwise ([`row_stats`], then [`column_stats`], which computes the logits
//! again), so the workspace never grows past the cap plus an N-independent scratch.
//! Both give the same bits (same kernel, chunks and order). NaN/Inf keys are found through
//! their logits ([`gemm`]: one `z·0` per 8 logits, no separate sweep over K), so a group
//! can fail only once its Q·Kᵀ has run: `score_layer` keeps the groups' scores in its
//! workspace and writes its output after the last group. With `row_lse` given there is
//! one pass over K anyway and nothing is stored.
//!
//! Per chunk of keys, the logits of all `g·w` window rows come out key-major with the rows
//! in vector lanes (`c[t][row]`): a 6-key × 16-row FMA micro-tile broadcasts key elements
//! against packed query panels, so keys need no transpose (f32 rows are read in place, f16
//! rows converted 8 at a time). Pass 1 then takes per-lane maxima and exp-sums down the
//! chunk (four blocks of 8 rows at a time, their exps interleaved); pass 2 forms the
//! probabilities and sums each head's rows per key — straight into the sums, 8 keys reduced
//! across lanes together, when the window is whole vectors and no cross terms are needed.
//! Where the CPU has AVX-512, pass 1 and pass 2 at w = 8 run on 16-lane vectors
//! (`softmax512`), with the same operations per lane.
//! Both passes see identical logits (same kernel, same order), so `z - max <= 0` holds
//! exactly; every variant keeps the same operations in the same order (same bits), except
//! the AVX2 build where it does not hand over to AVX-512 ([`keeps_exps`], design §2): its
//! pass 1 keeps each `exp(z - m_c)` and pass 2 rescales it per row and chunk, one exp per
//! logit instead of two, its own bits (deterministic; one pass and two passes agree).

use crate::error::{Error, Result};
use crate::numerics::{
    all_finite, dot_v, exp_neg, hsum8, prefetch_line, prefetch_rows, sum_v, Simd,
};
// the window pass takes the AVX-512 build of its kernels where there is one
#[cfg(not(all(feature = "std", target_arch = "x86_64", kvevict_avx512)))]
use crate::numerics::dispatch as dispatch_wide;
#[cfg(all(feature = "std", target_arch = "x86_64", kvevict_avx512))]
use crate::simd512::dispatch_wide;
use crate::view::{load_rows, load_rows_of, DType, View};
use crate::workspace::{Workspace, WorkspaceSize};

/// Keys per micro-tile of the Q·Kᵀ kernel.
pub(crate) const KT: usize = 6;
/// Keys ahead of a tile whose rows [`tiles_pf`] asks the cache for.
const PF_AHEAD: usize = 48;
/// Keys per chunk (a multiple of [`KT`]).
pub(crate) const CHUNK: usize = 96;

// what the pass computes and where it goes, in their own module: the AVX-512 pass 2
// (`softmax512`) takes them too, without importing this module back
pub(crate) use crate::colstats::{Needs, Stats};

pub(crate) fn pairs(g: usize) -> usize {
    g * (g - 1) / 2
}

/// Window rows of a group (`g·w`) rounded up to whole vectors.
fn padded_rows(rows: usize) -> Result<usize> {
    rows.checked_add(7).map(|r| r & !7).ok_or(Error::Overflow)
}

/// Scratch bytes for one group pass (outputs excluded).
pub(crate) fn scratch_size(ws: &mut WorkspaceSize, g: usize, w: usize, dk: usize) -> Result<()> {
    let rows = padded_rows(g.checked_mul(w).ok_or(Error::Overflow)?)?;
    ws.add::<f32>(rows.checked_mul(dk).ok_or(Error::Overflow)?)?; // packed queries
    ws.add::<f32>(dk.checked_mul(CHUNK).ok_or(Error::Overflow)?)?; // key chunk
    ws.add::<f32>(rows.checked_mul(CHUNK).ok_or(Error::Overflow)?)?; // logits
    ws.add::<f32>(rows)?; // row max
    ws.add::<f32>(rows)?; // 1 / row denominator
    ws.add::<f32>(rows)?; // per-chunk maxima or scales (`keeps_exps`)
    ws.add::<f32>(rows)?; // running max (`keeps_exps`, two passes)
    ws.add::<f32>(rows)?; // its row max and
    ws.add::<f64>(rows)?; // denominator (`keeps_exps`, two passes)
    Ok(())
}

/// Scratch slices of one group pass.
///
/// `q` holds the window queries (pre-scaled by 1/sqrt(dk)) packed for the kernel: panels of
/// 16 rows `[d][16]`, then, when `rows_pad % 16 == 8`, one panel of 8 rows `[d][8]`.
/// `c` holds a chunk's logits key-major: `c[t][rows_pad]`, so that the rows of one key are
/// contiguous (vector lanes run over window rows).
pub(crate) struct Scratch<'s> {
    pub q: &'s mut [f32],
    pub k: &'s mut [f32],
    pub c: &'s mut [f32],
    pub m: &'s mut [f32],
    pub inv: &'s mut [f32],
    /// [`keeps_exps`]: a chunk's maxima `m_c`, then its scales `exp(m_c - m)·inv` (`rows_pad`)
    pub scale: &'s mut [f32],
    /// [`keeps_exps`], two passes: pass 1's running max, row max and denominator, redone
    pub mrun: &'s mut [f32],
    pub rtmp: &'s mut [f32],
    pub stmp: &'s mut [f64],
    pub rows: usize,
    pub rows_pad: usize,
    pub dk: usize,
}

/// Carve scratch and load the group's window queries, pre-scaled by 1/sqrt(dk).
pub(crate) fn load_queries<'s>(
    queries: &View,
    kh: usize,
    g: usize,
    w: usize,
    dk: usize,
    ws: &mut Workspace<'s>,
) -> Result<Scratch<'s>> {
    let rows = g * w;
    let rows_pad = padded_rows(rows)?;
    let s = Scratch {
        q: ws.take::<f32>(rows_pad * dk)?,
        k: ws.take::<f32>(dk * CHUNK)?,
        c: ws.take::<f32>(rows_pad * CHUNK)?,
        m: ws.take::<f32>(rows_pad)?,
        inv: ws.take::<f32>(rows_pad)?,
        scale: ws.take::<f32>(rows_pad)?,
        mrun: ws.take::<f32>(rows_pad)?,
        rtmp: ws.take::<f32>(rows_pad)?,
        stmp: ws.take::<f64>(rows_pad)?,
        rows,
        rows_pad,
        dk,
    };
    let wq = queries.extent()[1];
    let scale = 1.0 / libm::sqrtf(dk as f32);
    let full = rows_pad / 16 * 16;
    for a in 0..g {
        for j in 0..w {
            let r = a * w + j;
            // one row through the key chunk buffer (free at this point)
            let row = &mut s.k[..dk];
            queries.load_row(kh * g + a, wq - w + j, row);
            let (base, width, lane) = if r < full {
                (r / 16 * 16 * dk, 16, r % 16)
            } else {
                (full * dk, 8, r - full)
            };
            for (d, &v) in row.iter().enumerate() {
                if !v.is_finite() {
                    return Err(Error::NonFinite);
                }
                s.q[base + d * width + lane] = v * scale;
            }
        }
    }
    Ok(s)
}

/// Keys `c0 .. c0+ntp` of KV head `kh` as f32 rows for the kernel: straight from the view
/// when it holds f32 rows with unit element stride and the chunk is whole tiles, else
/// converted into `k[t][dk]` with zero rows from `nt` to `ntp`. Returns the first row and the
/// row stride, and (with `check`) whether every key element is finite.
#[inline(always)]
pub(crate) fn load_keys<S: Simd>(
    keys: &View,
    kh: usize,
    c0: usize,
    nt: usize,
    ntp: usize,
    k: &mut [f32],
    check: bool,
) -> (*const f32, usize, bool) {
    let dk = keys.extent()[2];
    let st = keys.stride();
    if keys.dtype() == DType::F32 && st[2] == 1 && nt == ntp {
        assert!(kh < keys.extent()[0] && c0 + nt <= keys.extent()[1]);
        // SAFETY: rows (kh, c0..c0+nt, 0..dk) are inside the view's extent, which the view
        // proved in bounds at construction; `byte_range` gives back its pointer.
        let base = unsafe { (keys.byte_range().0 as *const f32).add(kh * st[0] + c0 * st[1]) };
        let finite = !check
            || if st[1] == dk {
                // dense rows: one sweep over the chunk
                // SAFETY: st[2] = 1 and st[1] = dk make rows c0..c0+nt one run of nt·dk floats
                // from `base`, all inside the view (asserted and proved above).
                all_finite::<S>(unsafe { core::slice::from_raw_parts(base, nt * dk) })
            } else {
                (0..nt).all(|t| {
                    // SAFETY: t < nt and st[2] = 1: row c0+t's dk floats lie inside the view.
                    let row = unsafe { core::slice::from_raw_parts(base.add(t * st[1]), dk) };
                    all_finite::<S>(row)
                })
            };
        return (base, st[1], finite);
    }
    let k = &mut k[..ntp * dk];
    let finite = if check {
        load_rows_of::<S, true>(keys, kh, c0, nt, k)
    } else {
        load_rows::<S>(keys, kh, c0, nt, k);
        true
    };
    k[nt * dk..].fill(0.0);
    (k.as_ptr(), dk, finite)
}

/// Start keys `c0 .. c0+nt` of KV head `kh` on their way into the cache (the next chunk,
/// while this one is multiplied): the f16/bf16 conversion otherwise waits on memory
/// (Llama-3-8B at 32k: ~13 % of the window pass). A hint only.
#[inline(always)]
pub(crate) fn prefetch_keys(keys: &View, kh: usize, c0: usize, nt: usize) {
    let [_, n, dk] = keys.extent();
    let st = keys.stride();
    let es = keys.dtype().size();
    // f32 rows are read in place by the kernel, which the hardware prefetcher follows
    // (a software prefetch measured slower there); rows of a block type: not here (`es`)
    if keys.dtype() == DType::F32 || keys.dtype().is_quantized() || st[2] != 1 || c0 >= n {
        return;
    }
    let t1 = (c0 + nt).min(n);
    // dense rows: one span; else row by row (first and last byte of each row included)
    let (rows, span) = if st[1] == dk {
        (1, (t1 - c0) * dk * es)
    } else {
        (t1 - c0, dk * es)
    };
    let base = (keys.byte_range().0 as *const u8).wrapping_add((kh * st[0] + c0 * st[1]) * es);
    for r in 0..rows {
        let p = base.wrapping_add(r * st[1] * es);
        prefetch_rows(p, 0, span, 1);
        prefetch_line(p.wrapping_add(span - 1));
    }
}

/// The next chunk's key rows (from key `c0`, [`CHUNK`] of them) on their way into the cache
/// while this chunk is multiplied. The AVX2 build where it keeps its exps ([`keeps_exps`])
/// spreads them over the first Q·Kᵀ sweep, one tile's rows as each tile starts (the [`Pf`]
/// returned, for [`gemm`]); the other builds ask for all at once ([`prefetch_keys`]) and get
/// `Pf::NONE`. On the Xeon (Sapphire Rapids class) of 2026-12-06 the burst of 384 prefetches
/// per Llama-3-8B chunk stalled on the line-fill buffers (8 % of the AVX2 w = 8 samples on
/// one prefetch instruction); spread out, `snapkv-w8` ran ~4 % faster.
#[inline(always)]
fn next_keys<S: Simd>(keys: &View, kh: usize, c0: usize) -> Pf {
    if !keeps_exps::<S>() {
        prefetch_keys(keys, kh, c0, CHUNK);
        return Pf::NONE;
    }
    let [_, n, dk] = keys.extent();
    let st = keys.stride();
    let es = keys.dtype().size();
    // what `prefetch_keys` asks for: rows of 2-byte elements converted by `load_keys`
    if keys.dtype() == DType::F32 || keys.dtype().is_quantized() || st[2] != 1 || c0 >= n {
        return Pf::NONE;
    }
    Pf {
        p: (keys.byte_range().0 as *const u8).wrapping_add((kh * st[0] + c0 * st[1]) * es),
        ld: st[1] * es,
        bytes: dk * es,
    }
}

/// `c[t][0 .. 8V] = Σ_d k[t][d]·q[d][..]` for `KN` keys and `V` vectors of 8 window rows:
/// with `P16` the two halves of the 16-row panel `q16` (`[d][16]`), with `H` the 8-row panel
/// `q8` (`[d][8]`) after them. Each logit is one FMA chain over `d` from 0, whatever the
/// tile; `bad` gains a NaN lane when a logit is not finite (`z·0` is 0 for finite `z`, NaN
/// for NaN/Inf). With 16 vector registers (AVX2) the accumulators, the `V` query loads and
/// a broadcast must fit: 2 × 6 keys, or 3 × 3 (24 rows: one sweep over the keys instead of a
/// 16-row and an 8-row one).
#[inline(always)]
unsafe fn tile<S: Simd, const P16: bool, const H: bool, const KN: usize>(
    k: *const f32,
    ldk: usize,
    dk: usize,
    q16: *const f32,
    q8: *const f32,
    c: *mut f32,
    ldc: usize,
    bad: &mut S::V,
) {
    // SAFETY: `S`'s CPU features are present (the `Simd` contract, kept by our callers); `k` holds
    // KN rows of `dk` floats `ldk` apart, `q16` `dk` rows of 16 (with `P16`), `q8` `dk` rows of 8
    // (with `H`) and `c` KN rows of the tile's rows `ldc` apart (the callers in `tiles_pf`).
    unsafe {
        debug_assert!(P16 || H);
        let mut a16 = [[S::zero(); 2]; KN];
        let mut a8 = [S::zero(); KN];
        // one pointer per key row: each broadcast is base + d, no per-element index arithmetic
        let mut kr = [k; KN];
        for (i, r) in kr.iter_mut().enumerate() {
            *r = k.add(i * ldk);
        }
        for d in 0..dk {
            let (q0, q1, qh) = (
                if P16 {
                    S::load(q16.add(d * 16))
                } else {
                    S::zero()
                },
                if P16 {
                    S::load(q16.add(d * 16 + 8))
                } else {
                    S::zero()
                },
                if H { S::load(q8.add(d * 8)) } else { S::zero() },
            );
            for i in 0..KN {
                let b = S::splat(*kr[i].add(d));
                if P16 {
                    a16[i][0] = S::fma(b, q0, a16[i][0]);
                    a16[i][1] = S::fma(b, q1, a16[i][1]);
                }
                if H {
                    a8[i] = S::fma(b, qh, a8[i]);
                }
            }
        }
        let o8 = if P16 { 16 } else { 0 };
        for i in 0..KN {
            if P16 {
                S::store(c.add(i * ldc), a16[i][0]);
                S::store(c.add(i * ldc + 8), a16[i][1]);
                *bad = S::fma(a16[i][0], S::zero(), *bad);
                *bad = S::fma(a16[i][1], S::zero(), *bad);
            }
            if H {
                S::store(c.add(i * ldc + o8), a8[i]);
                *bad = S::fma(a8[i], S::zero(), *bad);
            }
        }
    }
}

/// Rows a Q·Kᵀ sweep asks the cache for, `KN` rows as each tile of `KN` keys starts: the
/// tile at key `t` asks for rows `t ..` from `p`, each `ld` bytes after the last and `bytes`
/// long (a hint, which never faults). `p` null: none.
#[derive(Clone, Copy)]
pub(crate) struct Pf {
    pub p: *const u8,
    pub ld: usize,
    pub bytes: usize,
}

impl Pf {
    pub(crate) const NONE: Pf = Pf {
        p: core::ptr::null(),
        ld: 0,
        bytes: 0,
    };
}

/// [`tile`] over keys `0 .. ntp` (a multiple of [`KT`], so of `KN`); with `pf` the rows it
/// names asked for as each tile starts (a hint, which never faults).
#[inline(always)]
unsafe fn tile_run<S: Simd, const P16: bool, const H: bool, const KN: usize>(
    k: *const f32,
    ldk: usize,
    dk: usize,
    q16: *const f32,
    q8: *const f32,
    c: *mut f32,
    ldc: usize,
    ntp: usize,
    pf: Pf,
    bad: &mut S::V,
) {
    // SAFETY: as `tile` (our callers'): every tile starts at a key `t0` with `t0 + KN <= ntp`.
    unsafe {
        debug_assert!(KT % KN == 0 && ntp % KN == 0);
        let mut t0 = 0;
        while t0 < ntp {
            if !pf.p.is_null() {
                prefetch_rows(pf.p.wrapping_add(t0 * pf.ld), pf.ld, pf.bytes, KN);
            }
            let kt = k.add(t0 * ldk);
            tile::<S, P16, H, KN>(kt, ldk, dk, q16, q8, c.add(t0 * ldc), ldc, bad);
            t0 += KN;
        }
    }
}

/// Logits of one chunk: `c[t][r] = k[t]·q[r]` for `t < ntp` (a multiple of KT), every row;
/// key row `t` at `k + t·ldk`, `c` the chunk's `[ntp][rows_pad]` logits (`s.c`, or a slice
/// of the one-pass store), `q` the packed queries of [`Scratch`]. Returns whether every
/// logit is finite: with finite queries, false iff a key element is NaN/Inf (which makes
/// its key's logits NaN/Inf: `Inf·x` is ±Inf or NaN, and NaN/Inf stay so through the sum)
/// or a logit overflows f32, so the logits themselves check the keys.
///
/// `in_place`: the keys are the view's own f32 rows, whose next ones the kernel asks the
/// cache for (a hint only). Converted keys come from the chunk buffer: `next` names the next
/// chunk's rows in the view for the 8-lane kernel to ask for ([`next_keys`]), or nothing
/// ([`prefetch_keys`] asked for them already).
///
/// # Safety
/// `k` must point to `ntp` readable rows of `dk` floats, `ldk` apart.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm<S: Simd>(
    q: &[f32],
    dk: usize,
    rp: usize,
    k: *const f32,
    ldk: usize,
    ntp: usize,
    c: &mut [f32],
    in_place: bool,
    next: Pf,
) -> bool {
    #[cfg(all(feature = "std", target_arch = "x86_64", kvevict_avx512))]
    if S::AVX2 && crate::gemm512::available() {
        // SAFETY: the caller's contract, and the CPU has AVX-512 F + VL (just checked).
        return unsafe { crate::gemm512::gemm(q, dk, rp, k, ldk, ntp, c, in_place) };
    }
    // SAFETY: the caller's contract is `gemm_tiles`'s.
    unsafe {
        let pf = if in_place {
            Pf {
                p: k.wrapping_add(PF_AHEAD * ldk) as *const u8,
                ld: ldk * 4,
                bytes: dk * 4,
            }
        } else {
            next
        };
        tiles_pf::<S>(q, dk, rp, k, ldk, ntp, c, pf)
    }
}

/// [`gemm`] with `S`'s own tiles (groups of 8-row vectors × keys), no prefetch (what the
/// tests compare with a scalar chain and with the AVX-512 kernel).
///
/// # Safety
/// As [`gemm`].
#[cfg_attr(not(all(test, feature = "std")), allow(dead_code))]
#[inline(always)]
pub(crate) unsafe fn gemm_tiles<S: Simd>(
    q: &[f32],
    dk: usize,
    rp: usize,
    k: *const f32,
    ldk: usize,
    ntp: usize,
    c: &mut [f32],
) -> bool {
    // SAFETY: the caller's contract is `tiles_pf`'s.
    unsafe { tiles_pf::<S>(q, dk, rp, k, ldk, ntp, c, Pf::NONE) }
}

/// [`gemm_tiles`]; with `pf > 0` (keys read in place) the first panel's sweep asks the cache
/// for the rows `pf` keys on (its loads walk [`KT`] rows side by side, which the hardware
/// prefetcher alone follows late; a hint, which never faults). AVX2, SmolLM2 at 4k (keys in
/// L3): the Q·Kᵀ of 24 rows 66 → 82–85 GFLOP/s in a micro-benchmark, the w = 32 scorers
/// about 5 % faster.
///
/// # Safety
/// As [`gemm`].
#[inline(always)]
unsafe fn tiles_pf<S: Simd>(
    q: &[f32],
    dk: usize,
    rp: usize,
    k: *const f32,
    ldk: usize,
    ntp: usize,
    c: &mut [f32],
    pf: Pf,
) -> bool {
    // SAFETY: `S`'s CPU features are present (the `Simd` contract, kept by our callers); `k` holds
    // `ntp` rows `ldk` apart (this fn's contract) and the tiles stay inside `q` and `c` (asserted
    // first).
    unsafe {
        assert!(ntp % KT == 0 && c.len() >= ntp * rp);
        assert!(q.len() >= rp * dk && rp % 8 == 0);
        let full = rp / 16 * 16;
        let (q, c) = (q.as_ptr(), c.as_mut_ptr());
        let q8 = q.add(full * dk);
        let mut bad = S::zero();
        // 16-row panels; the last one with the 8-row panel when there is one (one sweep of
        // 24 rows over the keys)
        let mut r0 = 0;
        while r0 < full {
            let (q16, cr, pfr) = (
                q.add(r0 * dk),
                c.add(r0),
                if r0 == 0 { pf } else { Pf::NONE },
            );
            if r0 + 16 == full && full < rp {
                tile_run::<S, true, true, 3>(k, ldk, dk, q16, q8, cr, rp, ntp, pfr, &mut bad);
            } else {
                tile_run::<S, true, false, 6>(k, ldk, dk, q16, q8, cr, rp, ntp, pfr, &mut bad);
            }
            r0 += 16;
        }
        if full == 0 {
            tile_run::<S, false, true, 6>(k, ldk, dk, q, q8, c, rp, ntp, pf, &mut bad);
        }
        S::hsum(bad) == 0.0
    }
}

/// Whether the window pass of build `S` takes the AVX-512 kernels (16-lane Q·Kᵀ and softmax
/// passes, the 8-lane bits) on this CPU.
#[inline(always)]
fn wide<S: Simd>() -> bool {
    #[cfg(all(feature = "std", target_arch = "x86_64", kvevict_avx512))]
    return S::AVX2 && crate::gemm512::available();
    #[cfg(not(all(feature = "std", target_arch = "x86_64", kvevict_avx512)))]
    false
}

/// Whether the window pass of build `S` keeps pass 1's exps: the AVX2 build where it does
/// not hand over to AVX-512 (design §2, "which paths share bits"). Pass 1 then turns each
/// logit into `exp(z - m_c)`, with `m_c` its row's running max after chunk `c`, and keeps
/// `m_c` per row and chunk; pass 2 multiplies by `exp(m_c - m)·inv` per row and chunk
/// instead of taking a second exp per logit. The row statistics (max, denominator) are the
/// shared bits; the probabilities round differently from the other builds (a few ulp).
/// The two-pass form recomputes pass 1's exps and maxima chunk by chunk with the same code,
/// so one pass and two passes still give the same bits on every build.
#[inline(always)]
pub(crate) fn keeps_exps<S: Simd>() -> bool {
    S::AVX2 && !wide::<S>()
}

/// Pass 1 on one chunk of logits `c[t][rp]` (keys `c0 .. c0+nt`): the causal mask, then
/// each row's running max (`m`, `rmax`) and f64 denominator (`rsum`), rescaled per chunk.
/// With `keep` (the AVX2 build's own bits, [`keeps_exps`]) each logit becomes its
/// `exp(z - m_c)` and `keep[..rp]` gets `m_c`, the running max after this chunk, for every
/// lane (padding rows too); `m`, `rmax` and `rsum` are the same bits as without.
#[inline(always)]
fn chunk_row_stats<S: Simd>(
    c: &mut [f32],
    c0: usize,
    nt: usize,
    p: usize,
    g: usize,
    w: usize,
    rp: usize,
    m: &mut [f32],
    rmax: &mut [f32],
    rsum: &mut [f64],
    mut keep: Option<&mut [f32]>,
) -> Result<()> {
    let rows = rmax.len();
    assert!(c.len() >= nt * rp && m.len() >= rp && rsum.len() == rows && rows <= rp);
    assert!(keep.as_ref().map(|k| k.len()).unwrap_or(rp) >= rp);
    // causal mask: query j (position p + j) sees keys i <= p + j
    for t in p.saturating_sub(c0)..nt {
        let hide = (c0 + t - p).min(w);
        for a in 0..g {
            c[t * rp + a * w..t * rp + a * w + hide].fill(f32::NEG_INFINITY);
        }
    }
    let mut r0 = 0;
    while r0 < rows {
        // up to 4 row blocks at once: independent exp-sum chains keep the core busy
        let mut mx = [0f32; 32];
        let mut cs = [0f32; 32];
        let nb = (rows - r0).div_ceil(8).min(4);
        // SAFETY: r0 + 8·nb <= rp and t < nt: inside `c` (asserted above), `m` has rp.
        unsafe {
            let (cp, mp) = (c.as_mut_ptr().add(r0), m.as_ptr().add(r0));
            let (mx, cs) = (mx.as_mut_ptr(), cs.as_mut_ptr());
            // 16 lanes where the CPU has AVX-512 (the same bits)
            #[cfg(all(feature = "std", target_arch = "x86_64", kvevict_avx512))]
            let wide = keep.is_none() && wide::<S>();
            match (nb, keep.is_some()) {
                #[cfg(all(feature = "std", target_arch = "x86_64", kvevict_avx512))]
                _ if wide => crate::softmax512::max_expsum(nb, cp, nt, rp, mp, mx, cs),
                (4, false) => max_expsum::<S, 4>(cp, nt, rp, mp, mx, cs),
                (3, false) => max_expsum::<S, 3>(cp, nt, rp, mp, mx, cs),
                (2, false) => max_expsum::<S, 2>(cp, nt, rp, mp, mx, cs),
                (_, false) => max_expsum::<S, 1>(cp, nt, rp, mp, mx, cs),
                (4, true) => max_expsum_keep::<S, 4, true>(cp, nt, rp, mp, mx, cs),
                (3, true) => max_expsum_keep::<S, 3, true>(cp, nt, rp, mp, mx, cs),
                (2, true) => max_expsum_keep::<S, 2, true>(cp, nt, rp, mp, mx, cs),
                (_, true) => max_expsum_keep::<S, 1, true>(cp, nt, rp, mp, mx, cs),
            }
        }
        if let Some(k) = keep.as_deref_mut() {
            k[r0..r0 + 8 * nb].copy_from_slice(&mx[..8 * nb]);
        }
        for l in 0..(8 * nb).min(rows - r0) {
            let r = r0 + l;
            fold_row(&mut rmax[r], &mut rsum[r], mx[l], cs[l])?;
            m[r] = mx[l];
        }
        r0 += 8 * nb;
    }
    Ok(())
}

/// One row's pass-1 update for a chunk: the running max becomes `m_new` (the chunk's max
/// with the old one) and the f64 denominator is rescaled to it and gains `cs`, the chunk's
/// `Σ exp(z - m_new)`. A non-finite max (a row of -inf so far, or NaN) is `NonFinite`.
#[inline(always)]
pub(crate) fn fold_row(rmax: &mut f32, rsum: &mut f64, m_new: f32, cs: f32) -> Result<()> {
    let m_old = *rmax;
    if !m_new.is_finite() {
        return Err(Error::NonFinite);
    }
    let rescale = if m_old == f32::NEG_INFINITY {
        0.0
    } else {
        exp_neg(m_old - m_new) as f64
    };
    *rsum = *rsum * rescale + cs as f64;
    *rmax = m_new;
    Ok(())
}

/// Fold the logits of one key chunk (`s.c`, `nt` keys, already masked by the caller) into
/// the running row maxima `rmax` and f64 denominators `rsum` of the `s.rows` rows (pass 1
/// without the window's causal mask; the query stream masks by position itself).
#[inline(always)]
pub(crate) fn fold_rows<S: Simd>(
    s: &mut Scratch,
    nt: usize,
    rmax: &mut [f32],
    rsum: &mut [f64],
) -> Result<()> {
    let rows = s.rows;
    // p = usize::MAX: no key is past the prefix, so no causal mask is applied
    chunk_row_stats::<S>(
        s.c,
        0,
        nt,
        usize::MAX,
        0,
        0,
        s.rows_pad,
        s.m,
        &mut rmax[..rows],
        &mut rsum[..rows],
        None,
    )
}

/// The logits of one key chunk (`s.c`, `nt` keys) to probabilities in place,
/// `exp(z - m[r]) · inv[r]` (padding rows have inv = 0).
#[inline(always)]
pub(crate) fn probabilities<S: Simd>(s: &mut Scratch, nt: usize) {
    let rp = s.rows_pad;
    let c = &mut s.c[..nt * rp];
    for t in 0..nt {
        let mut r0 = 0;
        while r0 < rp {
            // SAFETY: r0 + 8 <= rp, t < nt.
            unsafe {
                let cp = c.as_mut_ptr().add(t * rp + r0);
                // z <= 0 exactly with pass 1's maxima; the clamp bounds p by 1/denominator
                // when the caller gave `row_lse` (its logits may round differently)
                let z = S::min(
                    S::sub(S::load(cp), S::load(s.m.as_ptr().add(r0))),
                    S::zero(),
                );
                S::store(cp, S::mul(S::exp_neg(z), S::load(s.inv.as_ptr().add(r0))));
            }
            r0 += 8;
        }
    }
}

/// For `B` blocks of 8 rows from `cp` (`nt` keys, `rp` apart): the new running max
/// `max(mp, max_t c)` to `mx` and `Σ_t exp(c - max)`, summed in key order, to `cs`.
///
/// # Safety
/// `cp` must hold `nt` rows of `8·B` readable floats `rp` apart; `mp`, `mx`, `cs` `8·B`.
#[inline(always)]
pub(crate) unsafe fn max_expsum<S: Simd, const B: usize>(
    cp: *const f32,
    nt: usize,
    rp: usize,
    mp: *const f32,
    mx: *mut f32,
    cs: *mut f32,
) {
    // SAFETY: this fn's contract is `max_expsum_keep`'s without the writes.
    unsafe { max_expsum_keep::<S, B, false>(cp as *mut f32, nt, rp, mp, mx, cs) }
}

/// [`max_expsum`]; with `KEEP` each `exp(c - max)` also replaces its logit in `cp` (the
/// AVX2 build's pass 1, whose pass 2 rescales these instead of taking a second exp: see
/// [`keeps_exps`]). The maxima and sums are [`max_expsum`]'s bits either way.
///
/// # Safety
/// As [`max_expsum`]; with `KEEP` the `nt` rows of `8·B` floats at `cp` must be writable.
#[inline(always)]
pub(crate) unsafe fn max_expsum_keep<S: Simd, const B: usize, const KEEP: bool>(
    cp: *mut f32,
    nt: usize,
    rp: usize,
    mp: *const f32,
    mx: *mut f32,
    cs: *mut f32,
) {
    // SAFETY: `S`'s CPU features are present (the `Simd` contract, kept by our callers); `cp`,
    // `mp`, `mx`, `cs` cover the `nt` rows of `8·B` floats this fn's contract asks for.
    unsafe {
        let mut mv = [S::splat(f32::NEG_INFINITY); B];
        for t in 0..nt {
            for j in 0..B {
                mv[j] = S::max(mv[j], S::load(cp.add(t * rp + 8 * j)));
            }
        }
        for j in 0..B {
            mv[j] = S::max(S::load(mp.add(8 * j)), mv[j]);
        }
        let mut acc = [S::zero(); B];
        // `kb` keys per step make whole groups of four (key, block) vectors, taken key-major,
        // so every exp_neg4 call has four useful chains (w = 8: 3 blocks, 4 keys; TOVA: 1
        // block, 4 keys) and each block still sums its keys in order (the same bits)
        let kb = match B {
            1 | 3 => 4,
            2 => 2,
            _ => 1,
        };
        let mut t = 0;
        while t + kb <= nt {
            if kb * B / 4 == 3 {
                // B = 3 (SmolLM2's w = 8), 4 keys: block by block, its four keys in order (the
                // same adds into each block's sum), the sums and maxima rotated so that the
                // block at hand is always the first. A loop over the key-major groups of four
                // kept its sums in memory and divided its indices at run time; unrolled, its
                // three exp_neg4 calls were left outlined (AVX2 `snapkv-w8` 7 % slower)
                let mut a = [acc[0], acc[1], acc[2]];
                let mut m3 = [mv[0], mv[1], mv[2]];
                let mut o = 0;
                for _ in 0..3 {
                    let mut x = [S::zero(); 4];
                    for (u, x) in x.iter_mut().enumerate() {
                        *x = S::sub(S::load(cp.add((t + u) * rp + o)), m3[0]);
                    }
                    let e = S::exp_neg4(x);
                    let mut s = a[0];
                    for (u, e) in e.into_iter().enumerate() {
                        s = S::add(s, e);
                        if KEEP {
                            S::store(cp.add((t + u) * rp + o), e);
                        }
                    }
                    a = [a[1], a[2], s];
                    m3 = [m3[1], m3[2], m3[0]];
                    o += 8;
                }
                acc[0] = a[0];
                acc[1] = a[1];
                acc[2] = a[2];
            } else {
                // the kb·B = 4 (key, block) vectors of these keys, key-major
                let mut x = [S::zero(); 4];
                for (l, x) in x.iter_mut().enumerate() {
                    let (u, j) = (l / B, l % B);
                    *x = S::sub(S::load(cp.add((t + u) * rp + 8 * j)), mv[j]);
                }
                let e = S::exp_neg4(x);
                for (l, e) in e.into_iter().enumerate() {
                    let (u, j) = (l / B, l % B);
                    acc[j] = S::add(acc[j], e);
                    if KEEP {
                        S::store(cp.add((t + u) * rp + 8 * j), e);
                    }
                }
            }
            t += kb;
        }
        for t in t..nt {
            // four chains at once (fewer than four blocks: repeats, results unused); plain
            // loops, not `array::from_fn`, whose closures LLVM may leave outlined (and then
            // without the AVX2 features: every load a call)
            let mut x = [S::zero(); 4];
            for (j, x) in x.iter_mut().enumerate() {
                let j = j.min(B - 1);
                *x = S::sub(S::load(cp.add(t * rp + 8 * j)), mv[j]);
            }
            let e = S::exp_neg4(x);
            for j in 0..B {
                acc[j] = S::add(acc[j], e[j]);
                if KEEP {
                    S::store(cp.add(t * rp + 8 * j), e[j]);
                }
            }
        }
        for j in 0..B {
            S::store(mx.add(8 * j), mv[j]);
            S::store(cs.add(8 * j), acc[j]);
        }
    }
}

/// Pass 1 for KV group `kh`: running max `rmax[g*w]` and denominator `rsum[g*w]` of every
/// window row over its visible keys. `queries` is `[Hq, wq, dk]` with `wq >= w` (the last
/// `w` rows are the window), `keys` is `[Hkv, N, dk]`, `1 <= w <= N`. Rejects NaN/Inf in
/// the group's queries and in every key of the head (and logits that overflow f32).
pub(crate) fn row_stats(
    queries: &View,
    keys: &View,
    kh: usize,
    g: usize,
    w: usize,
    scratch: &mut [u8],
    rmax: &mut [f32],
    rsum: &mut [f64],
) -> Result<()> {
    let dk = keys.extent()[2];
    let s = &mut load_queries(queries, kh, g, w, dk, &mut Workspace::new(scratch))?;
    dispatch_wide!(fn(keys: &View, kh: usize, g: usize, w: usize, s: &mut Scratch,
                 rmax: &mut [f32], rsum: &mut [f64]) -> Result<()>, S => {
        row_stats_impl::<S>(keys, kh, g, w, s, None, None, rmax, rsum)
    })
}

/// Pass 1 over every key; with `store` (the one pass) each chunk's logits stay there
/// (`[key][rows_pad]`), and with `maxima` as well (`[chunk][rows_pad]`, [`keeps_exps`]) they
/// become their exps, each chunk's maxima going to `maxima`. NaN/Inf keys are found through
/// their logits ([`gemm`]).
#[inline(always)]
fn row_stats_impl<S: Simd>(
    keys: &View,
    kh: usize,
    g: usize,
    w: usize,
    s: &mut Scratch,
    mut store: Option<&mut [f32]>,
    mut maxima: Option<&mut [f32]>,
    rmax: &mut [f32],
    rsum: &mut [f64],
) -> Result<()> {
    let n = keys.extent()[1];
    let p = n - w;
    let (rows, rp) = (s.rows, s.rows_pad);
    let rmax = &mut rmax[..rows];
    let rsum = &mut rsum[..rows];
    start_rows(s, rmax, rsum);
    let mut c0 = 0;
    while c0 < n {
        let nt = CHUNK.min(n - c0);
        let ntp = nt.div_ceil(KT) * KT;
        let (kp, ldk, _) = load_keys::<S>(keys, kh, c0, nt, ntp, s.k, false);
        let next = next_keys::<S>(keys, kh, c0 + nt);
        let c = match store.as_deref_mut() {
            Some(st) => &mut st[c0 * rp..(c0 + ntp) * rp],
            None => &mut s.c[..ntp * rp],
        };
        let in_place = kp != s.k.as_ptr();
        // SAFETY: load_keys returns ntp rows of dk floats, ldk apart.
        if !unsafe { gemm::<S>(s.q, s.dk, rp, kp, ldk, ntp, c, in_place, next) } {
            // a NaN/Inf key (or an overflowing logit), found through its logits
            return Err(Error::NonFinite);
        }
        let keep = maxima.as_deref_mut().map(|mc| &mut mc[c0 / CHUNK * rp..]);
        chunk_row_stats::<S>(c, c0, nt, p, g, w, rp, s.m, rmax, rsum, keep)?;
        c0 += nt;
    }
    check_denominators(rsum)
}

/// Start pass 1's running statistics: the row maxima `rmax` and the chunk maxima `s.m` at
/// -inf, the denominators `rsum` at 0. The running max starts at -inf, not 0: rows whose
/// logits are all below -87 would otherwise underflow every exp to 0 and be rejected as
/// non-finite.
#[inline(always)]
pub(crate) fn start_rows(s: &mut Scratch, rmax: &mut [f32], rsum: &mut [f64]) {
    rmax.fill(f32::NEG_INFINITY);
    rsum.fill(0.0);
    s.m.fill(f32::NEG_INFINITY);
}

/// The end of pass 1: every row's denominator finite and positive, else `NonFinite`.
#[inline(always)]
pub(crate) fn check_denominators(rsum: &[f64]) -> Result<()> {
    if rsum.iter().any(|s| !s.is_finite() || *s <= 0.0) {
        return Err(Error::NonFinite);
    }
    Ok(())
}

/// Pass 2 on one chunk of logits `src[t][rp]` (prefix keys `c0 .. c0+nt`): per key, the
/// probabilities into `dst[t][rp]` from the final row max `m` and `inv` = 1 / denominator,
/// then that key's statistics added into `out` (while its row is in L1). `dst` may be
/// `src` (two passes: in place); the one pass reads its store and writes `s.c`, so the
/// store is only read. With `KEPT` ([`keeps_exps`]) `src` holds pass 1's `exp(z - m_c)`
/// and `inv` the chunk's scales ([`chunk_scales`]): each probability is one multiply, `m`
/// is not read.
///
/// # Safety
/// `src` and `dst` must each hold `nt·rp` floats (the same ones, or not overlapping).
#[inline(always)]
unsafe fn chunk_column_stats<S: Simd, const KEPT: bool>(
    src: *const f32,
    dst: *mut f32,
    c0: usize,
    nt: usize,
    p: usize,
    g: usize,
    w: usize,
    rp: usize,
    m: &[f32],
    inv: &[f32],
    needs: Needs,
    out: &mut Stats,
) {
    // SAFETY: `S`'s CPU features are present (the `Simd` contract, kept by our callers); `src` and
    // `dst` hold `nt·rp` floats (this fn's contract), `m` and `inv` `rp` (asserted first).
    unsafe {
        assert!(m.len() >= rp && inv.len() >= rp && g * w <= rp && rp % 8 == 0);
        let t0 = if w % 8 == 0 && !needs.cross {
            let nt8 = nt / 8 * 8;
            // w = 8 on 16 lanes where the CPU has AVX-512 (the same bits)
            if !KEPT && w == 8 && wide::<S>() {
                #[cfg(all(feature = "std", target_arch = "x86_64", kvevict_avx512))]
                crate::softmax512::column_sums_w8(src, c0, nt8, p, g, m, inv, needs, out);
            } else {
                fused_stats::<S, KEPT>(src, c0, nt8, p, g, w, rp, m, inv, needs, out);
            }
            nt8
        } else {
            0
        };
        for t in t0..nt {
            let (sp, dp) = (src.add(t * rp), dst.add(t * rp));
            let (mp, ip) = (m.as_ptr(), inv.as_ptr());
            let mut r0 = 0;
            while r0 + 32 <= rp {
                // four vectors at once, as below
                let mut z = [S::zero(); 4];
                for (j, z) in z.iter_mut().enumerate() {
                    let o = r0 + 8 * j;
                    *z = if KEPT {
                        S::load(sp.add(o))
                    } else {
                        S::min(S::sub(S::load(sp.add(o)), S::load(mp.add(o))), S::zero())
                    };
                }
                let e = if KEPT { z } else { S::exp_neg4(z) };
                for (j, e) in e.into_iter().enumerate() {
                    let o = r0 + 8 * j;
                    S::store(dp.add(o), S::mul(e, S::load(ip.add(o))));
                }
                r0 += 32;
            }
            while r0 < rp {
                // z <= 0 exactly with pass 1's maxima; the clamp bounds p by 1/denominator
                // when the caller gave `row_lse` (its logits may round differently); padding
                // rows have inv = 0
                let e = if KEPT {
                    S::load(sp.add(r0))
                } else {
                    let z = S::min(
                        S::sub(S::load(sp.add(r0)), S::load(m.as_ptr().add(r0))),
                        S::zero(),
                    );
                    S::exp_neg(z)
                };
                S::store(dp.add(r0), S::mul(e, S::load(inv.as_ptr().add(r0))));
                r0 += 8;
            }
            let row = core::slice::from_raw_parts(dp as *const f32, g * w);
            for a in 0..g {
                let pa = &row[a * w..(a + 1) * w];
                let o = a * p + c0 + t;
                if needs.sum {
                    out.sum[o] += sum_v::<S>(pa);
                }
                if needs.sq {
                    out.sq[o] += dot_v::<S>(pa, pa);
                }
            }
            if needs.cross {
                let mut pi = 0;
                for a in 0..g {
                    for b in a + 1..g {
                        let (pa, pb) = (&row[a * w..(a + 1) * w], &row[b * w..(b + 1) * w]);
                        out.cross[pi * p + c0 + t] += dot_v::<S>(pa, pb);
                        pi += 1;
                    }
                }
            }
        }
    }
}

/// [`chunk_column_stats`] for keys `0 .. nt8` (a multiple of 8) when `w` is whole vectors
/// and no cross terms are needed, with the same operations in the same order (so the same
/// bits), but each probability goes straight into its head's sums (nothing stored), and
/// the sums of 8 keys are reduced across lanes together (`transpose8`, then `hsum`'s tree).
/// `KEPT` as in [`chunk_column_stats`]: `src` pass 1's exps, `inv` the chunk's scales.
///
/// # Safety
/// `src` must hold `nt8·rp` floats.
#[inline(always)]
pub(crate) unsafe fn fused_stats<S: Simd, const KEPT: bool>(
    src: *const f32,
    c0: usize,
    nt8: usize,
    p: usize,
    g: usize,
    w: usize,
    rp: usize,
    m: &[f32],
    inv: &[f32],
    needs: Needs,
    out: &mut Stats,
) {
    // SAFETY: `S`'s CPU features are present (the `Simd` contract, kept by our callers); `src`
    // holds `nt8·rp` floats (this fn's contract), `m` and `inv` `rp` (the caller's `Scratch`).
    unsafe {
        let wv = w / 8;
        let (mp, ip) = (m.as_ptr(), inv.as_ptr());
        let prob = |o: usize, e: S::V| S::mul(e, S::load(ip.add(o)));
        // the argument of the exp, or (KEPT) pass 1's exp itself, then the exp (or nothing)
        let z = |sp: *const f32, o: usize| {
            if KEPT {
                S::load(sp.add(o))
            } else {
                S::min(S::sub(S::load(sp.add(o)), S::load(mp.add(o))), S::zero())
            }
        };
        let exp4 = |x: [S::V; 4]| if KEPT { x } else { S::exp_neg4(x) };
        // 8 keys × up to 8 heads per step: each key's row is read in order (streams well from
        // the one-pass store), the heads' sums wait in `sums[a][k]`
        let mut sums = [[S::zero(); 8]; 8];
        let mut sqs = [[S::zero(); 8]; 8];
        let mut tb = 0;
        while tb < nt8 {
            let mut ag = 0;
            while ag < g && wv == 1 {
                // w = 8: each (key, head) is one vector, whose sum is `0 + p`: per head, the 8
                // keys' vectors go straight to `hsum8`, without the running sums the loop below
                // keeps (indexed at run time, so in memory); the same operations, the same bits
                let a = ag;
                let o = a * w;
                let (mut pr, mut pq) = ([S::zero(); 8], [S::zero(); 8]);
                for h in 0..2 {
                    let mut x = [S::zero(); 4];
                    for (j, x) in x.iter_mut().enumerate() {
                        *x = z(src.add((tb + 4 * h + j) * rp), o);
                    }
                    for (j, e) in exp4(x).into_iter().enumerate() {
                        let q = prob(o, e);
                        pr[4 * h + j] = S::add(S::zero(), q);
                        pq[4 * h + j] = S::fma(q, q, S::zero());
                    }
                }
                let d0 = a * p + c0 + tb;
                if needs.sum {
                    let d = out.sum[d0..d0 + 8].as_mut_ptr();
                    S::store(d, S::add(S::load(d), hsum8::<S>(pr)));
                }
                if needs.sq {
                    let d = out.sq[d0..d0 + 8].as_mut_ptr();
                    S::store(d, S::add(S::load(d), hsum8::<S>(pq)));
                }
                ag += 1;
            }
            while ag < g {
                let na = (g - ag).min(8);
                if wv < 4 {
                    // w = 16, 24: the (key, head, vector) triples in that order, four per
                    // exp_neg4 call (8·na·wv is a multiple of 4; AVX-512 runs them as two
                    // 16-lane exps), each added to its head's sum in the order of the loop below
                    // (the same bits)
                    for a in 0..na {
                        sums[a] = [S::zero(); 8];
                        sqs[a] = [S::zero(); 8];
                    }
                    let (mut k, mut a, mut v) = (0, 0, 0);
                    let mut i = 0;
                    while i < 8 * na * wv {
                        let mut x = [S::zero(); 4];
                        let mut at = [(0, 0, 0); 4];
                        for (x, at) in x.iter_mut().zip(at.iter_mut()) {
                            *at = (k, a, (ag + a) * w + 8 * v);
                            *x = z(src.add((tb + k) * rp), at.2);
                            v += 1;
                            if v == wv {
                                v = 0;
                                a += 1;
                                if a == na {
                                    a = 0;
                                    k += 1;
                                }
                            }
                        }
                        let e = exp4(x);
                        for (e, &(k, a, o)) in e.into_iter().zip(at.iter()) {
                            let pr = prob(o, e);
                            sums[a][k] = S::add(sums[a][k], pr);
                            if needs.sq {
                                sqs[a][k] = S::fma(pr, pr, sqs[a][k]);
                            }
                        }
                        i += 4;
                    }
                }
                for k in (0..8).filter(|_| wv >= 4) {
                    let sp = src.add((tb + k) * rp);
                    for a in ag..ag + na {
                        let (mut sm, mut sq) = (S::zero(), S::zero());
                        let mut v = 0;
                        while v + 4 <= wv {
                            let o = a * w + 8 * v;
                            let mut x = [S::zero(); 4];
                            for (j, x) in x.iter_mut().enumerate() {
                                *x = z(sp, o + 8 * j);
                            }
                            let e = exp4(x);
                            for (j, e) in e.into_iter().enumerate() {
                                let pr = prob(o + 8 * j, e);
                                sm = S::add(sm, pr);
                                if needs.sq {
                                    sq = S::fma(pr, pr, sq);
                                }
                            }
                            v += 4;
                        }
                        while v < wv {
                            let o = a * w + 8 * v;
                            let x = z(sp, o);
                            let pr = prob(o, if KEPT { x } else { S::exp_neg(x) });
                            sm = S::add(sm, pr);
                            if needs.sq {
                                sq = S::fma(pr, pr, sq);
                            }
                            v += 1;
                        }
                        sums[a - ag][k] = sm;
                        sqs[a - ag][k] = sq;
                    }
                }
                for a in ag..ag + na {
                    let o = a * p + c0 + tb;
                    if needs.sum {
                        let d = out.sum[o..o + 8].as_mut_ptr();
                        S::store(d, S::add(S::load(d), hsum8::<S>(sums[a - ag])));
                    }
                    if needs.sq {
                        let d = out.sq[o..o + 8].as_mut_ptr();
                        S::store(d, S::add(S::load(d), hsum8::<S>(sqs[a - ag])));
                    }
                }
                ag += na;
            }
            tb += 8;
        }
    }
}

/// Pass 2 for KV group `kh`: statistics of the prefix columns, added into `out`
/// (each `[g or pairs][P]`, zeroed by the caller). Uses the row statistics of pass 1
/// (`own_rows`: [`row_stats`] on these queries and keys, so that the [`keeps_exps`] build
/// redoes pass 1's exps per chunk and gives the one pass's bits) or the caller's `row_lse`
/// (`own_rows` false: `exp(z - lse)` on every build). Rejects NaN/Inf in the group's
/// queries and in the prefix keys (through their logits, as [`row_stats`]) and in the
/// window keys (a sweep over them).
pub(crate) fn column_stats(
    queries: &View,
    keys: &View,
    kh: usize,
    g: usize,
    w: usize,
    rmax: &[f32],
    rsum: &[f64],
    own_rows: bool,
    needs: Needs,
    scratch: &mut [u8],
    out: &mut Stats,
) -> Result<()> {
    let dk = keys.extent()[2];
    let s = &mut load_queries(queries, kh, g, w, dk, &mut Workspace::new(scratch))?;
    for r in 0..s.rows {
        s.m[r] = rmax[r];
        s.inv[r] = (1.0 / rsum[r]) as f32;
    }
    dispatch_wide!(fn(keys: &View, kh: usize, g: usize, w: usize, own_rows: bool, needs: Needs,
                 s: &mut Scratch, out: &mut Stats) -> Result<()>, S => {
        let kept = own_rows && keeps_exps::<S>();
        column_stats_impl::<S>(keys, kh, g, w, needs, kept, s, out)
    })
}

/// Pass 2 over the prefix keys, chunk by chunk. With `kept` (the [`keeps_exps`] build after
/// its own pass 1) each chunk's logits cover every key of pass 1's chunk (window keys too, so
/// the running max is pass 1's), [`chunk_row_stats`] turns them into pass 1's exps and
/// maxima (the same code, so the bits of the one pass's store), then the chunk's scales
/// and the one pass's pass 2 follow.
#[inline(always)]
fn column_stats_impl<S: Simd>(
    keys: &View,
    kh: usize,
    g: usize,
    w: usize,
    needs: Needs,
    kept: bool,
    s: &mut Scratch,
    out: &mut Stats,
) -> Result<()> {
    let n = keys.extent()[1];
    let p = n - w;
    let (rows, rp) = (s.rows, s.rows_pad);
    if kept {
        // pass 1's state as `row_stats_impl` starts it
        s.mrun.fill(f32::NEG_INFINITY);
        s.rtmp.fill(f32::NEG_INFINITY);
        s.stmp.fill(0.0);
    }
    let mut c0 = 0;
    while c0 < p {
        let nt = CHUNK.min(p - c0);
        let nf = if kept { CHUNK.min(n - c0) } else { nt };
        let ntp = nf.div_ceil(KT) * KT;
        let (kp, ldk, _) = load_keys::<S>(keys, kh, c0, nf, ntp, s.k, false);
        let next = next_keys::<S>(keys, kh, c0 + nf);
        let in_place = kp != s.k.as_ptr();
        let c = &mut s.c[..ntp * rp];
        // SAFETY: load_keys returns ntp rows of dk floats, ldk apart.
        if !unsafe { gemm::<S>(s.q, s.dk, rp, kp, ldk, ntp, c, in_place, next) } {
            return Err(Error::NonFinite);
        }
        if kept {
            let (rm, rs) = (&mut s.rtmp[..rows], &mut s.stmp[..rows]);
            chunk_row_stats::<S>(c, c0, nf, p, g, w, rp, s.mrun, rm, rs, Some(&mut *s.scale))?;
            // the running max is the chunk's maxima in every row (padding rows: -inf there,
            // 0 in `scale`; their scale is 0 either way)
            chunk_scales::<S>(s.mrun, s.m, s.inv, s.scale);
            let c = c.as_mut_ptr();
            // SAFETY: `c` holds the chunk's ntp·rp exps, turned into probabilities in place.
            unsafe {
                chunk_column_stats::<S, true>(c, c, c0, nt, p, g, w, rp, s.m, s.scale, needs, out)
            };
        } else {
            let c = c.as_mut_ptr();
            // SAFETY: `c` holds the chunk's ntp·rp logits, turned into probabilities in place.
            unsafe {
                chunk_column_stats::<S, false>(c, c, c0, nt, p, g, w, rp, s.m, s.inv, needs, out)
            };
        }
        c0 += nt;
    }
    // the window keys take no part in the statistics but must be finite all the same
    while c0 < n {
        let nt = CHUNK.min(n - c0);
        if !load_keys::<S>(keys, kh, c0, nt, nt, s.k, true).2 {
            return Err(Error::NonFinite);
        }
        c0 += nt;
    }
    Ok(())
}

/// Most bytes the one-pass window may keep for one KV group's logits: the rule is
/// `g·w·N·4 <= ONE_PASS_MAX_BYTES` (16 MiB: Llama-3-8B's g = 4 at w = 32 up to N = 32k, at
/// w = 8 up to 128k; SmolLM2's g = 3 at w = 32 up to 43k); longer layers take two passes.
pub(crate) const ONE_PASS_MAX_BYTES: usize = 16 << 20;

/// Whether one KV group's `g·w·N` f32 logits fit [`ONE_PASS_MAX_BYTES`].
pub(crate) fn one_pass_fits(g: usize, w: usize, n: usize) -> bool {
    g.checked_mul(w)
        .and_then(|r| r.checked_mul(n))
        .and_then(|e| e.checked_mul(4))
        .is_some_and(|b| b <= ONE_PASS_MAX_BYTES)
}

/// f32 elements of the one-pass store: `[ceil(N/KT)·KT][rows_pad]` (whole kernel tiles).
fn store_len(g: usize, w: usize, n: usize) -> Result<usize> {
    let keys = n.div_ceil(KT).checked_mul(KT).ok_or(Error::Overflow)?;
    padded_rows(g.checked_mul(w).ok_or(Error::Overflow)?)?
        .checked_mul(keys)
        .ok_or(Error::Overflow)
}

/// f32 elements of the one pass's per-chunk row maxima ([`keeps_exps`]; taken on every
/// build, so the workspace size does not depend on the CPU): `[ceil(N/CHUNK)][rows_pad]`.
fn maxima_len(g: usize, w: usize, n: usize) -> Result<usize> {
    padded_rows(g.checked_mul(w).ok_or(Error::Overflow)?)?
        .checked_mul(n.div_ceil(CHUNK))
        .ok_or(Error::Overflow)
}

/// Bytes the one-pass window adds after [`scratch_size`]: its logits store and per-chunk
/// maxima when [`one_pass_fits`], else nothing (the layer then takes two passes).
pub(crate) fn one_pass_size(ws: &mut WorkspaceSize, g: usize, w: usize, n: usize) -> Result<()> {
    if one_pass_fits(g, w, n) {
        ws.add::<f32>(store_len(g, w, n)?)?;
        ws.add::<f32>(maxima_len(g, w, n)?)?;
    }
    Ok(())
}

/// Whether KV group `kh` may take the one pass: its store fits `scratch` (after
/// [`scratch_size`]'s slices) and its window queries are finite (NaN/Inf: `NonFinite`).
/// `Ok(false)`: take [`row_stats`] + [`column_stats`].
pub(crate) fn one_pass_ready(
    queries: &View,
    keys: &View,
    kh: usize,
    g: usize,
    w: usize,
    scratch: &mut [u8],
) -> Result<bool> {
    let [_, n, dk] = keys.extent();
    let mut ws = Workspace::new(scratch);
    load_queries(queries, kh, g, w, dk, &mut ws)?;
    Ok(one_pass_fits(g, w, n)
        && ws.take_dirty::<f32>(store_len(g, w, n)?).is_ok()
        && ws.take_dirty::<f32>(maxima_len(g, w, n)?).is_ok())
}

/// Both passes for KV group `kh` with one Q·Kᵀ: the logits of every key go to a store in
/// the workspace, pass 1 (row max / denominator) runs on each chunk as it is computed, and
/// pass 2 (column statistics, added into `out`) reads the store. Bit-identical to
/// [`row_stats`] then [`column_stats`]: the same kernel, chunks and order. Call only after
/// [`one_pass_ready`] said yes. NaN/Inf in the queries or keys (or a logit that overflows)
/// is `NonFinite`, found before `out` is touched; a caller scoring several groups holds
/// back its own output until every group has passed (`score_layer` does).
pub(crate) fn one_pass(
    queries: &View,
    keys: &View,
    kh: usize,
    g: usize,
    w: usize,
    rmax: &mut [f32],
    rsum: &mut [f64],
    needs: Needs,
    scratch: &mut [u8],
    out: &mut Stats,
) -> Result<()> {
    let [_, n, dk] = keys.extent();
    let mut ws = Workspace::new(scratch);
    let s = &mut load_queries(queries, kh, g, w, dk, &mut ws)?;
    let store = ws.take_dirty::<f32>(store_len(g, w, n)?)?;
    let maxima = ws.take_dirty::<f32>(maxima_len(g, w, n)?)?;
    dispatch_wide!(fn(keys: &View, kh: usize, g: usize, w: usize, needs: Needs, s: &mut Scratch,
                 store: &mut [f32], maxima: &mut [f32], rmax: &mut [f32], rsum: &mut [f64],
                 out: &mut Stats) -> Result<()>, S => {
        let keep = keeps_exps::<S>();
        one_pass_impl::<S>(keys, kh, g, w, needs, keep, s, store, maxima, rmax, rsum, out)
    })
}

#[inline(always)]
fn one_pass_impl<S: Simd>(
    keys: &View,
    kh: usize,
    g: usize,
    w: usize,
    needs: Needs,
    keep: bool,
    s: &mut Scratch,
    store: &mut [f32],
    maxima: &mut [f32],
    rmax: &mut [f32],
    rsum: &mut [f64],
    out: &mut Stats,
) -> Result<()> {
    let p = keys.extent()[1] - w;
    let (rows, rp) = (s.rows, s.rows_pad);
    let mc = if keep { Some(&mut *maxima) } else { None };
    row_stats_impl::<S>(keys, kh, g, w, s, Some(&mut *store), mc, rmax, rsum)?;
    for r in 0..rows {
        s.m[r] = rmax[r];
        s.inv[r] = (1.0 / rsum[r]) as f32;
    }
    let mut c0 = 0;
    while c0 < p {
        let nt = CHUNK.min(p - c0);
        let (src, dst) = (&store[c0 * rp..(c0 + nt) * rp], &mut s.c[..nt * rp]);
        let (sp, dp) = (src.as_ptr(), dst.as_mut_ptr());
        if keep {
            let mc = &maxima[c0 / CHUNK * rp..][..rp];
            chunk_scales::<S>(mc, s.m, s.inv, s.scale);
            // SAFETY: `src` (the store, pass 1's exps) and `dst` (`s.c`) each hold nt·rp floats
            // and don't overlap.
            unsafe {
                chunk_column_stats::<S, true>(sp, dp, c0, nt, p, g, w, rp, s.m, s.scale, needs, out)
            };
        } else {
            // SAFETY: `src` (the store) and `dst` (`s.c`) each hold nt·rp floats and don't
            // overlap.
            unsafe {
                chunk_column_stats::<S, false>(sp, dp, c0, nt, p, g, w, rp, s.m, s.inv, needs, out)
            };
        }
        c0 += nt;
    }
    Ok(())
}

/// [`keeps_exps`]' factors of one chunk: `scale[r] = exp(min(mc[r] - m[r], 0))·inv[r]` for
/// its running maxima `mc` (pass 1's `m_c`), the final maxima `m` and `inv` = 1 /
/// denominator, every lane of `rows_pad` (padding rows: inv = 0, so 0; the clamp keeps
/// them finite where their `m` stayed -inf).
#[inline(always)]
fn chunk_scales<S: Simd>(mc: &[f32], m: &[f32], inv: &[f32], scale: &mut [f32]) {
    let rp = mc.len();
    assert!(rp % 8 == 0 && m.len() >= rp && inv.len() >= rp && scale.len() >= rp);
    for r0 in (0..rp).step_by(8) {
        // SAFETY: r0 + 8 <= rp, the length of every slice (asserted).
        unsafe {
            let z = S::min(
                S::sub(S::load(mc.as_ptr().add(r0)), S::load(m.as_ptr().add(r0))),
                S::zero(),
            );
            let e = S::mul(S::exp_neg(z), S::load(inv.as_ptr().add(r0)));
            S::store(scale.as_mut_ptr().add(r0), e);
        }
    }
}

#[cfg(all(test, feature = "std"))]
pub(crate) mod tests {
    use super::*;
    use std::vec;
    use std::vec::Vec;

    /// Values in [-s, s) from a fixed LCG.
    pub(crate) fn vals(n: usize, seed: u64, s: f32) -> Vec<f32> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * s
            })
            .collect()
    }

    struct Out {
        rmax: Vec<f32>,
        rsum: Vec<f64>,
        stats: Vec<f32>,
    }

    /// Every group of a layer through one pass (`one`) or through `row_stats` then
    /// `column_stats`, all three statistics.
    fn run(q: &View, k: &View, g: usize, w: usize, one: bool) -> Out {
        let [hkv, n, dk] = k.extent();
        let p = n - w;
        let mut sz = WorkspaceSize::new();
        scratch_size(&mut sz, g, w, dk).unwrap();
        one_pass_size(&mut sz, g, w, n).unwrap();
        // garbage in the workspace: the store is not zeroed and must not need to be
        let mut scratch = vec![0xA5u8; sz.total()];
        let needs = Needs {
            sum: true,
            sq: true,
            cross: true,
        };
        let mut o = Out {
            rmax: vec![0.0; hkv * g * w],
            rsum: vec![0.0; hkv * g * w],
            stats: Vec::new(),
        };
        for kh in 0..hkv {
            let (mut sum, mut sq) = (vec![0f32; g * p], vec![0f32; g * p]);
            let mut cross = vec![0f32; pairs(g) * p];
            let mut st = Stats {
                sum: &mut sum,
                sq: &mut sq,
                cross: &mut cross,
            };
            let (rm, rs) = (&mut o.rmax[kh * g * w..], &mut o.rsum[kh * g * w..]);
            if one {
                assert!(one_pass_ready(q, k, kh, g, w, &mut scratch).unwrap());
                one_pass(q, k, kh, g, w, rm, rs, needs, &mut scratch, &mut st).unwrap();
            } else {
                row_stats(q, k, kh, g, w, &mut scratch, rm, rs).unwrap();
                column_stats(q, k, kh, g, w, rm, rs, true, needs, &mut scratch, &mut st).unwrap();
            }
            o.stats.extend(sum.iter().chain(&sq).chain(&cross));
        }
        o
    }

    /// The one pass gives the two passes' bits: row maxima, denominators and every
    /// statistic, for f32 and f16 keys, windows that are and are not whole vectors, chunk
    /// remainders, and an 8-row query panel.
    #[test]
    fn one_pass_is_bit_identical_to_two_passes() {
        for &(g, w, n, dk, f16) in &[
            (3, 32, 1000, 64, false),
            (4, 32, 700, 128, true),
            (4, 8, 300, 128, true),
            (2, 7, 97, 24, false),
            (1, 1, 50, 16, true),
            (3, 5, 5, 8, false),
            (2, 3, 50, 5, false),
        ] {
            let hkv = 2;
            let wq = w + 3;
            let qv = vals(hkv * g * wq * dk, 1 + n as u64, 2.0);
            let kv = vals(hkv * n * dk, 2 + dk as u64, 1.5);
            let (q16, k16): (Vec<half::f16>, Vec<half::f16>) = (
                qv.iter().map(|&x| half::f16::from_f32(x)).collect(),
                kv.iter().map(|&x| half::f16::from_f32(x)).collect(),
            );
            let qe = [hkv * g, wq, dk];
            let ke = [hkv, n, dk];
            // keys as token rows [N, Hkv·dk] (stride 1 inside a row, as llama.cpp keeps them)
            let ks = [dk, hkv * dk, 1];
            let mut kt = vec![0f32; kv.len()];
            let mut kt16 = vec![half::f16::ZERO; kv.len()];
            for h in 0..hkv {
                for t in 0..n {
                    for d in 0..dk {
                        kt[t * hkv * dk + h * dk + d] = kv[(h * n + t) * dk + d];
                        kt16[t * hkv * dk + h * dk + d] = k16[(h * n + t) * dk + d];
                    }
                }
            }
            let qst = [wq * dk, dk, 1];
            let (q, k) = if f16 {
                (
                    View::f16(&q16, qe, qst).unwrap(),
                    View::f16(&kt16, ke, ks).unwrap(),
                )
            } else {
                (
                    View::f32(&qv, qe, qst).unwrap(),
                    View::f32(&kt, ke, ks).unwrap(),
                )
            };
            let (a, b) = (run(&q, &k, g, w, true), run(&q, &k, g, w, false));
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a.rmax), bits(&b.rmax), "rmax g {g} w {w} n {n}");
            assert_eq!(a.rsum, b.rsum, "rsum g {g} w {w} n {n}");
            assert_eq!(bits(&a.stats), bits(&b.stats), "stats g {g} w {w} n {n}");
            assert!(n == w || a.stats.iter().any(|&x| x > 0.0));
        }
    }

    /// The AVX2 build's own bits ([`keeps_exps`]: pass 1's exps rescaled per chunk) against
    /// the shared arithmetic on the same build (the same one pass without kept exps): the
    /// row statistics bit-identical, every statistic within 2e-6 of its value plus 1e-7 of
    /// its head's largest (a few ulp), and some differ (the kept path ran). Logits drift
    /// upwards along the keys so that rows take new maxima chunk after chunk.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn kept_exps_stay_within_ulps_of_shared_bits() {
        use crate::numerics::{has_avx2, Avx2};
        use std::format;
        if !has_avx2() {
            return;
        }
        #[target_feature(enable = "avx2,fma,f16c")]
        #[allow(clippy::too_many_arguments)]
        unsafe fn pass(
            q: &View,
            k: &View,
            kh: usize,
            g: usize,
            w: usize,
            keep: bool,
            scratch: &mut [u8],
            rm: &mut [f32],
            rs: &mut [f64],
            st: &mut Stats,
        ) {
            let [_, n, dk] = k.extent();
            let mut ws = Workspace::new(scratch);
            let s = &mut load_queries(q, kh, g, w, dk, &mut ws).unwrap();
            let store = ws.take_dirty::<f32>(store_len(g, w, n).unwrap()).unwrap();
            let maxima = ws.take_dirty::<f32>(maxima_len(g, w, n).unwrap()).unwrap();
            let needs = Needs {
                sum: true,
                sq: true,
                cross: g > 1 && w % 8 != 0,
            };
            one_pass_impl::<Avx2>(k, kh, g, w, needs, keep, s, store, maxima, rm, rs, st).unwrap();
        }
        let mut differ = 0;
        for &(g, w, n, dk, f16) in &[
            (3, 8, 1000, 64, false),
            (4, 8, 700, 128, true),
            (3, 32, 500, 64, false),
            (2, 16, 300, 40, true),
            (2, 7, 301, 24, false),
            (1, 1, 200, 16, false),
        ] {
            let p = n - w;
            let qv = vals(g * w * dk, 3 + n as u64, 1.0);
            // keys with a slowly growing component along q's mean direction
            let mut kv = vals(n * dk, 4 + dk as u64, 1.0);
            for t in 0..n {
                for d in 0..dk {
                    kv[t * dk + d] += 3.0 * t as f32 / n as f32 * qv[d].signum();
                }
            }
            let k16: Vec<half::f16> = kv.iter().map(|&x| half::f16::from_f32(x)).collect();
            let q = View::f32(&qv, [g, w, dk], [w * dk, dk, 1]).unwrap();
            let k = if f16 {
                View::f16(&k16, [1, n, dk], [n * dk, dk, 1]).unwrap()
            } else {
                View::f32(&kv, [1, n, dk], [n * dk, dk, 1]).unwrap()
            };
            let mut sz = WorkspaceSize::new();
            scratch_size(&mut sz, g, w, dk).unwrap();
            one_pass_size(&mut sz, g, w, n).unwrap();
            let mut scratch = vec![0xA5u8; sz.total()];
            let mut res = Vec::new();
            for keep in [false, true] {
                let (mut rm, mut rs) = (vec![0f32; g * w], vec![0f64; g * w]);
                let (mut sum, mut sq) = (vec![0f32; g * p], vec![0f32; g * p]);
                let mut cross = vec![0f32; pairs(g) * p];
                let mut st = Stats {
                    sum: &mut sum,
                    sq: &mut sq,
                    cross: &mut cross,
                };
                // SAFETY: the CPU has avx2, fma and f16c (checked above).
                unsafe {
                    pass(
                        &q,
                        &k,
                        0,
                        g,
                        w,
                        keep,
                        &mut scratch,
                        &mut rm,
                        &mut rs,
                        &mut st,
                    )
                };
                res.push((rm, rs, sum, sq, cross));
            }
            let (a, b) = (&res[0], &res[1]);
            let what = format!("g {g} w {w} n {n} dk {dk}");
            assert_eq!(a.0, b.0, "row max, {what}");
            assert_eq!(a.1, b.1, "row denominators, {what}");
            for (x, y) in [(&a.2, &b.2), (&a.3, &b.3), (&a.4, &b.4)] {
                for (hx, hy) in x.chunks(p).zip(y.chunks(p)) {
                    let top = hx.iter().fold(0f32, |m, v| m.max(v.abs()));
                    for (u, v) in hx.iter().zip(hy) {
                        assert!(
                            (u - v).abs() <= 2e-6 * u.abs() + 1e-7 * top,
                            "{u} {v}, {what}"
                        );
                        differ += (u != v) as usize;
                    }
                }
            }
        }
        assert!(differ > 0, "the kept exps gave the shared bits everywhere");
    }

    /// The Q·Kᵀ tiles give every logit as one chain over `d` from 0 (fused on FMA builds,
    /// `a·b` then `+` on the portable one), bit for bit, for every row count to 136 (16-
    /// and 8-row panels, groups of 3 and 2 vectors), dims that are not whole vectors,
    /// padded key strides, one tile of keys and several, and the finiteness
    /// verdict on NaN/Inf keys.
    fn tiles_match_scalar<S: Simd>() {
        for rp in (8..=136).step_by(8) {
            for (dk, ldk) in [(5, 5), (24, 30), (64, 64), (128, 131)] {
                for ntp in [6, 18] {
                    // queries row-major [rp][dk], then packed as `Scratch::q`
                    let qr = vals(rp * dk, (rp * 7 + dk) as u64, 1.0);
                    let full = rp / 16 * 16;
                    let mut q = vec![0f32; rp * dk];
                    for r in 0..rp {
                        let (base, width, lane) = if r < full {
                            (r / 16 * 16 * dk, 16, r % 16)
                        } else {
                            (full * dk, 8, r - full)
                        };
                        for d in 0..dk {
                            q[base + d * width + lane] = qr[r * dk + d];
                        }
                    }
                    let mut k = vals(ntp * ldk, (ntp + ldk) as u64, 1.5);
                    for bad in [None, Some(f32::NAN), Some(f32::INFINITY)] {
                        if let Some(b) = bad {
                            k[(ntp / 2) * ldk + dk - 1] = b;
                        }
                        let mut c = vec![7f32; ntp * rp];
                        // SAFETY: k holds ntp rows of ldk >= dk floats; the caller checked the CPU.
                        let ok =
                            unsafe { gemm_tiles::<S>(&q, dk, rp, k.as_ptr(), ldk, ntp, &mut c) };
                        assert_eq!(ok, bad.is_none(), "rp {rp} dk {dk} ntp {ntp} {bad:?}");
                        if bad.is_some() {
                            continue;
                        }
                        for t in 0..ntp {
                            for r in 0..rp {
                                let mut z = 0f32;
                                for d in 0..dk {
                                    let (a, b) = (k[t * ldk + d], qr[r * dk + d]);
                                    z = if S::FUSED { a.mul_add(b, z) } else { a * b + z };
                                }
                                assert_eq!(
                                    c[t * rp + r].to_bits(),
                                    z.to_bits(),
                                    "rp {rp} dk {dk} ntp {ntp} t {t} r {r}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn tiles_are_one_chain_per_logit() {
        tiles_match_scalar::<crate::numerics::Portable>();
        crate::numerics::on_vector_builds!(S => { tiles_match_scalar::<S>() });
    }

    /// NaN/Inf keys, NaN queries and logits that overflow f32 are `NonFinite` from the one
    /// pass and from both passes (found through the logits); a NaN query already from
    /// `one_pass_ready`; too small a workspace for the store means two passes, not an error.
    #[test]
    fn non_finite_keys_and_logits_are_rejected() {
        let (g, w, n, dk) = (2, 4, 40, 8);
        let qv = vals(g * w * dk, 5, 1.0);
        let q = View::f32(&qv, [g, w, dk], [w * dk, dk, 1]).unwrap();
        let mut sz = WorkspaceSize::new();
        scratch_size(&mut sz, g, w, dk).unwrap();
        one_pass_size(&mut sz, g, w, n).unwrap();
        let mut scratch = vec![0u8; sz.total()];
        let needs = Needs {
            sum: true,
            sq: false,
            cross: false,
        };
        // (one pass, two passes) on keys `kv`
        let score = |kv: &[f32], scratch: &mut [u8]| {
            let k = View::f32(kv, [1, n, dk], [n * dk, dk, 1]).unwrap();
            let (mut rm, mut rs) = (vec![0f32; g * w], vec![0f64; g * w]);
            let mut sum = vec![0f32; g * (n - w)];
            let mut st = Stats {
                sum: &mut sum,
                sq: &mut [],
                cross: &mut [],
            };
            assert_eq!(one_pass_ready(&q, &k, 0, g, w, scratch), Ok(true));
            let one = one_pass(&q, &k, 0, g, w, &mut rm, &mut rs, needs, scratch, &mut st);
            let two = row_stats(&q, &k, 0, g, w, scratch, &mut rm, &mut rs).and_then(|_| {
                column_stats(&q, &k, 0, g, w, &rm, &rs, true, needs, scratch, &mut st)
            });
            (one, two)
        };
        let kv = vals(n * dk, 6, 1.0);
        assert_eq!(score(&kv, &mut scratch), (Ok(()), Ok(())));
        let k = View::f32(&kv, [1, n, dk], [n * dk, dk, 1]).unwrap();
        let small = sz.total() - store_len(g, w, n).unwrap() * 4;
        assert_eq!(
            one_pass_ready(&q, &k, 0, g, w, &mut scratch[..small]),
            Ok(false)
        );
        // a bad element in a prefix key, a window key, the last key
        for (at, bad) in [(77, f32::INFINITY), (5 + (n - 2) * dk, f32::NAN)]
            .into_iter()
            .chain([((n - 1) * dk, f32::NEG_INFINITY)])
        {
            let mut kb = kv.clone();
            kb[at] = bad;
            let e = Err(Error::NonFinite);
            assert_eq!(score(&kb, &mut scratch), (e, e), "K[{at}] = {bad}");
        }
        // finite keys whose logit overflows: row 0's dot product is > f32::MAX
        let mut kb = kv.clone();
        for d in 0..dk {
            kb[3 * dk + d] = f32::MAX * qv[d].signum();
        }
        let e = Err(Error::NonFinite);
        assert_eq!(score(&kb, &mut scratch), (e, e));
        let mut qb = qv.clone();
        qb[9] = f32::NAN;
        let qn = View::f32(&qb, [g, w, dk], [w * dk, dk, 1]).unwrap();
        assert_eq!(
            one_pass_ready(&qn, &k, 0, g, w, &mut scratch),
            Err(Error::NonFinite)
        );
        assert!(one_pass_fits(4, 32, 32768) && !one_pass_fits(4, 32, 32769));
        assert!(one_pass_fits(4, 8, 131072) && !one_pass_fits(usize::MAX, 2, 2));
    }
}
