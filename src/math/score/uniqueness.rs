//! Uniqueness (design §3b; ours, question-agnostic, no queries, no extra forward pass):
//! `u[kh,i] = max(0, 1 - r_i)^24` with `r_i` the [`TWIN_RANK`]-th largest of
//! `min(cos(k_i, k_j), cos(v_i, v_j))` over every other cached token `j` (−1 where fewer
//! exist), 0 where `r_i >= ` [`TWIN_CUTOFF`] (0.5), then `s[kh,i] = max_{0 <= j <= 10} c_j·u[i+j]` over the prefix, `c_j = 1` for
//! `j <= 6` and `0.729^(j−6)` beyond: a unique token lends its whole score to the 6 tokens
//! before it and a decaying share to the 4 before those (the words that introduce it: "The
//! amber code is" before a code's digits).
//!
//! Why: a token whose key *and* value have near-twins elsewhere in the cache can go — any
//! query that would attend to it finds a twin and reads nearly the same value. What has no
//! twin (a pass key, a name, a number stated once) is what no other cell can stand in for.
//! Keys alone are not enough: the digits of "54505" share keys, not values. Why the 4th
//! twin, not the nearest: filler words recur many times, while the digits of a few codes
//! recur only once or twice among each other; with the nearest twin the codes of a
//! multi-key context were evicted and their labels kept (eval/agnostic.py, multikey: 1 of
//! 18 at 10 % with the nearest twin, 9 of 18 with the 4th; single needle unchanged). The
//! backward reach then keeps each label with its digits (with one token, the 4th twin lost
//! single needles at 5 %: 14 against 17 of 19). Why whole scores to 6 tokens, not `0.9^j`
//! to 4: in prose most tokens are unique, the label's lent share lost to them, and the
//! digits were kept without "pass key is" (eval/uniqueness_pools.py, needle in docstrings at
//! 10 % / 5 %: 7 / 1 of 19 → 16 / 7, held out 6 / 1 of 17 → 16 / 8; the grammar's needle
//! 18/17/12 of 19 → 18/18/16; multi-key 10 / 8 of 18 → 10 / 5, held out 13 / 9 → 12 / 6).
//! The power sharpens the per-head
//! scores so that the layer-sum normalisation of the token granularity (design §4) does not
//! flatten the few unique tokens into the many. Why 24, not 8: in prose many tokens of a
//! head are nearly as unique as a fact, and with 8 their summed mass outweighed the fact's
//! (the cube of every score, lends included, so the same kept sets as `0.9` cubed: needle in
//! docstrings at 10 / 5 / 2.5 %: 16 / 7 / 2 of 19 → 19 / 18 / 10, held out 16 / 8 / 4 of 17 →
//! 16 / 13 / 7; multi-key at 5 %: 5 → 8 of 18, held out 6 → 9; the grammar's needle 18 / 18 /
//! 16 of 19 → 18 / 18 / 15, held out 2k 12 / 12 / 10 of 14 → 11 / 10 / 9, the needle kept
//! verbatim in each of those misses; powers 12, 16 and 32 measured too).
//!
//! The cutoff changes no score by more than `0.5^24 ≈ 6·10⁻⁸` (eval, at power 8: single
//! needle 18/18/12 of 19 at 10/5/2.5 % against 18/18/13 without it) and makes the search sub-quadratic on
//! real caches: `r_i` only grows as more tokens are compared, so a first scan over the
//! pairs at most [`NEAR`] apart settles every token it finds four twins ≥ 0.5 for (it only
//! counts them: no top lists, value dots only where the key cosine reaches 0.5), and
//! only the rest are compared with the whole cache, stopping as soon as they reach the
//! cutoff: first in groups of 6 in position order over the panels near the group (many
//! settle there), then the ones still open (no four twins anywhere) packed into groups of
//! their own over the other panels, so that a token that settles early does not ride along
//! a full scan. When over half the tokens are left after the first scan, every pair is
//! compared as below, which is then cheaper — on SmolLM2's decode rounds at 512 cells that
//! is three heads in four (69 % open after the near scan, 27 % after every pair), so the
//! all-pairs search below is most of the cost. (2026-12-06, issue 28: `NEAR` 128 → 16 and
//! the second exact step took the scoring of SmolLM2's real decode rounds from 3.8 to 3.3 ms
//! a head at 1,024 cells on the loaded shared machine; 2026-12-07: the counting first scan,
//! 13–14 % off the fork's eviction time at 512 and 1,024 cells; docs/results/decode/cost.md.)
//! Under a cell budget the evictor carries each cell's twin list from one round to the next
//! and only the pairs with a new cell are compared ([`score_carried`], `uniqueness/twins.rs`).
//!
//! Cost of comparing every pair: every unordered pair of cached tokens once, `N·(N−1)·(dk+dv)` flops per KV head
//! at most (both ends of a pair updated from one similarity), blocked like a GEMM: the rows
//! are unit-normalised once into panels of 16 tokens `[dk][16]` (K) and `[dv][16]` (V), and a
//! 6-row × 16-column register tile accumulates the key dot products over `d` (one FMA
//! chain per pair, `d` in order, so a pair's cosine has the same bits whichever token is
//! the row). A tile's value dots are computed only for the rows where some key cosine
//! beats `min(floor_i, floor_j)`, a token's floor being its current [`TWIN_RANK`]-th
//! largest similarity (`min(ck, cv) <= ck`, so no other pair can enter either top list).
//! The top lists equal the plain search's bit for bit (`tests` below). Workspace:
//! [`scratch_floats`]. Quadratic: with the nearest twin (the same search, one list entry) a
//! SmolLM2 layer (3 KV heads, d = 64) of its real cache at N ≈ 1000 took 3.2–3.7 ms of one
//! core, the model 115 ms; on the bench's random data 79–90 % of the single-core sgemm rate
//! counting both dot products of every pair (bench/results/uniqueness_after.txt).
use super::Bufs;
use crate::error::{Error, Result};
use crate::numerics::{dot_v, Simd};
// the AVX-512 build of the tiles where there is one (the same bits: one FMA chain a pair)
#[cfg(not(all(feature = "std", target_arch = "x86_64", kvevict_avx512)))]
use crate::numerics::dispatch as dispatch_wide;
#[cfg(all(feature = "std", target_arch = "x86_64", kvevict_avx512))]
use crate::simd512::dispatch_wide;
use crate::view::{load_rows, View};

mod twins;
pub(crate) use twins::{remap as remap_twins, WORDS as TWIN_WORDS};

/// Sharpening exponent (decision, design §3b).
pub const POWER: i32 = 24;
/// How many tokens before a unique token receive its whole score (the words that introduce
/// it: "The pass key is" before a key's digits).
pub const BACK_FLAT: usize = 6;
/// Share lent past [`BACK_FLAT`]: `BACK_DECAY^(j - BACK_FLAT)` to the j-th token before.
pub const BACK_DECAY: f32 = 0.729;
/// How many tokens before a unique token receive some of its score.
pub const BACK_REACH: usize = 10;
/// Which twin decides redundancy: a token is redundant when it has this many near-twins.
pub const TWIN_RANK: usize = 4;
/// A token whose [`TWIN_RANK`]-th twin is at least this similar scores 0 (its `(1 - r)^24`
/// would be at most `0.5^24 ≈ 6·10⁻⁸`): since `r` can only grow as more tokens are compared,
/// a partial scan that finds four such twins settles the token exactly.
pub const TWIN_CUTOFF: f32 = 0.5;
/// The first scan compares each token with the tokens at most this far after it (and so,
/// both ends being updated, before it); only the tokens it leaves below [`TWIN_CUTOFF`]
/// are compared with the whole cache. A cost, not a result: every value gives the same
/// bits (16 was the fastest of 0 / 16 / 32 / 128 on decode rounds of SmolLM2).
pub const NEAR: usize = 16;

/// Tokens per column panel (two vectors of lanes).
const PANEL: usize = 16;
/// Rows per register tile: 6 × 2 accumulators, 2 column vectors and a broadcast fill 15 of
/// AVX2's 16 registers (the window pass's Q·Kᵀ tile shape).
const ROWS: usize = 6;

/// `n` rounded up to whole panels.
fn padded(n: usize) -> Result<usize> {
    n.checked_add(PANEL - 1)
        .map(|x| x / PANEL * PANEL)
        .ok_or(Error::Overflow)
}

/// Workspace floats: the unit-normalised K and V rows of one KV head packed in panels
/// (`n16·(dk+dv)`, `n16` = N rounded up to 16), every token's floor and top list
/// (`n16·(1 + TWIN_RANK)`), and 16 rows of `max(dk, dv)` for loading.
pub(crate) fn scratch_floats(n: usize, dk: usize, dv: usize) -> Result<usize> {
    let n16 = padded(n)?;
    let rows = dk
        .checked_add(dv)
        .ok_or(Error::Overflow)?
        .checked_add(1 + TWIN_RANK);
    let load = PANEL.checked_mul(dk.max(dv));
    n16.checked_mul(rows.ok_or(Error::Overflow)?)
        .and_then(|x| x.checked_add(load?))
        .ok_or(Error::Overflow)
}

/// NaN/Inf anywhere in K or V is rejected before `out` is written.
pub(super) fn inputs_finite(keys: &View, values: &View, bufs: &mut Bufs) -> bool {
    for view in [keys, values] {
        let [h, n, d] = view.extent();
        for kh in 0..h {
            for t in 0..n {
                view.load_row(kh, t, bufs.row);
                if bufs.row[..d].iter().any(|v| !v.is_finite()) {
                    return false;
                }
            }
        }
    }
    true
}

/// Rows of head `kh` of `view`, each scaled to unit L2 norm (zero rows stay zero), packed
/// into `dst` as panels of 16 tokens `[d][16]` (tokens past N are zero); `tmp` holds 16 rows.
#[inline(always)]
fn load_unit_panels<S: Simd>(view: &View, kh: usize, tmp: &mut [f32], dst: &mut [f32]) {
    let [_, n, d] = view.extent();
    for (p, panel) in dst.chunks_exact_mut(PANEL * d).enumerate() {
        let t0 = p * PANEL;
        let nt = PANEL.min(n - t0);
        load_rows::<S>(view, kh, t0, nt, tmp);
        for row in tmp[..nt * d].chunks_exact_mut(d) {
            // SAFETY: `row` is one slice, read as both operands.
            let ss = unsafe { dot_v::<S>(row, row) };
            if ss > 0.0 {
                let inv = 1.0 / sqrt1::<S>(ss);
                for v in row.iter_mut() {
                    *v *= inv;
                }
            }
        }
        panel.fill(0.0);
        for (t, row) in tmp[..nt * d].chunks_exact(d).enumerate() {
            for (c, &v) in row.iter().enumerate() {
                panel[c * PANEL + t] = v;
            }
        }
    }
}

/// `sqrt(x)` correctly rounded (`libm::sqrtf`'s bits) through `S`: inside the vector
/// builds a VEX-encoded square root (libm's `sqrtss` is a legacy SSE instruction, which
/// stalls on the dirty upper halves of the AVX registers: ~10 % of the scoring time).
#[inline(always)]
fn sqrt1<S: Simd>(x: f32) -> f32 {
    // SAFETY: `S`'s CPU features are present (the `Simd` contract, kept by our callers); `l`
    // holds the 8 floats stored.
    unsafe {
        let mut l = [0f32; 8];
        S::store(l.as_mut_ptr(), S::sqrt(S::splat(x)));
        l[0]
    }
}

/// Tests: the tiles of the 8-lane build even where AVX-512 is present.
#[cfg(all(test, feature = "std", target_arch = "x86_64", kvevict_avx512))]
static NARROW: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// Whether build `S` computes its tiles 16 lanes wide (AVX-512 F present).
#[cfg(all(feature = "std", target_arch = "x86_64", kvevict_avx512))]
#[inline(always)]
fn wide<S: Simd>() -> bool {
    #[cfg(test)]
    if NARROW.load(core::sync::atomic::Ordering::Relaxed) {
        return false;
    }
    S::AVX2 && crate::gemm512::available()
}

/// [`tile`] with one 16-lane accumulator a row (a panel is one AVX-512 vector): the same
/// FMA chain for every lane, so the same bits, in half the instructions.
#[cfg(all(feature = "std", target_arch = "x86_64", kvevict_avx512))]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
#[inline]
unsafe fn tile512<const M: usize>(
    rows: &[*const f32; M],
    col: *const f32,
    d: usize,
) -> [[core::arch::x86_64::__m256; 2]; M] {
    use core::arch::x86_64::*;
    // SAFETY: the CPU has AVX-512 F (this fn's features, checked by the caller); every
    // `rows[r]` and `col` panel holds `d` columns of 16 floats (caller).
    unsafe {
        let mut acc = [_mm512_setzero_ps(); M];
        for c in 0..d {
            let cv = _mm512_loadu_ps(col.add(c * PANEL));
            for r in 0..M {
                let b = _mm512_set1_ps(*rows[r].add(c * PANEL));
                acc[r] = _mm512_fmadd_ps(b, cv, acc[r]);
            }
        }
        // a loop, not `acc.map`: `map` and its closure were not inlined (calls in the tile loop)
        let mut out = [[_mm256_setzero_ps(); 2]; M];
        for r in 0..M {
            let (lo, hi) = crate::simd512::split(acc[r]);
            out[r] = [lo, hi];
        }
        out
    }
}

/// `acc[r][h]` lane `l` = `Σ_c row_r[c]·col_l[c]`, `c` in order, one FMA per term: rows `r`
/// read at `rows[r] + 16·c` (a token inside its panel), the 16 columns at `col + 16·c + l`.
#[inline(always)]
unsafe fn tile<S: Simd, const M: usize>(
    rows: &[*const f32; M],
    col: *const f32,
    d: usize,
) -> [[S::V; 2]; M] {
    #[cfg(all(feature = "std", target_arch = "x86_64", kvevict_avx512))]
    if wide::<S>() {
        // SAFETY: the CPU has AVX-512 F + VL (just checked) and the caller's contract is
        // tile512's; an AVX2 build's `S::V` is `__m256` (`S::AVX2`), so the copy is of the
        // same type
        unsafe {
            let t = tile512::<M>(rows, col, d);
            debug_assert_eq!(
                core::mem::size_of_val(&t),
                core::mem::size_of::<[[S::V; 2]; M]>()
            );
            return core::mem::transmute_copy(&t);
        }
    }
    // SAFETY: `S`'s CPU features are present (the `Simd` contract, kept by our callers); every
    // `rows[r]` and `col` panel holds `d` columns of 16 floats (caller).
    unsafe {
        let mut acc = [[S::zero(); 2]; M];
        for c in 0..d {
            let c0 = S::load(col.add(c * PANEL));
            let c1 = S::load(col.add(c * PANEL + 8));
            for r in 0..M {
                let b = S::splat(*rows[r].add(c * PANEL));
                acc[r][0] = S::fma(b, c0, acc[r][0]);
                acc[r][1] = S::fma(b, c1, acc[r][1]);
            }
        }
        acc
    }
}

/// The value tile of the `M` rows `sel[..M]` of the row tile against one panel, each
/// `min`ed with its key cosines `m[sel[k]]` (16 lanes per row, in memory: the tile's
/// accumulators get every register).
#[inline(always)]
unsafe fn value_rows<S: Simd, const M: usize>(
    vr: &[*const f32; ROWS],
    sel: &[usize; ROWS],
    col: *const f32,
    dv: usize,
    m: &mut [[f32; PANEL]; ROWS],
) {
    // SAFETY: `S`'s CPU features are present (the `Simd` contract, kept by our callers);
    // `vr[sel[k]]` and `col` hold `dv` panel columns (caller), `m` rows of 16.
    unsafe {
        let rows: [*const f32; M] = core::array::from_fn(|k| vr[sel[k]]);
        let cv = tile::<S, M>(&rows, col, dv);
        for k in 0..M {
            let p = m[sel[k]].as_mut_ptr();
            S::store(p, S::min(S::load(p), cv[k][0]));
            S::store(p.add(8), S::min(S::load(p.add(8)), cv[k][1]));
        }
    }
}

/// [`value_rows`] for the first `ns` (1..=ROWS) rows of `sel`: one tile size per count.
#[inline(always)]
unsafe fn value_rows_n<S: Simd>(
    ns: usize,
    vr: &[*const f32; ROWS],
    sel: &[usize; ROWS],
    col: *const f32,
    dv: usize,
    m: &mut [[f32; PANEL]; ROWS],
) {
    // SAFETY: forwarded to `value_rows` under this fn's own contract (the same as its).
    unsafe {
        match ns {
            1 => value_rows::<S, 1>(vr, sel, col, dv, m),
            2 => value_rows::<S, 2>(vr, sel, col, dv, m),
            3 => value_rows::<S, 3>(vr, sel, col, dv, m),
            4 => value_rows::<S, 4>(vr, sel, col, dv, m),
            5 => value_rows::<S, 5>(vr, sel, col, dv, m),
            _ => value_rows::<S, ROWS>(vr, sel, col, dv, m),
        }
    }
}

/// The value cosines of the rows of a tile with some lane to look at (`hits[r]`, 0: none):
/// `m[r]` = `min(ck, cv)` lane by lane for those rows, returned (`sel[..ns]`) in row order.
///
/// # Safety
/// `S`'s CPU features are present; `vr[r]` and `col` hold `dv` panel columns.
#[inline(always)]
unsafe fn value_pass<S: Simd>(
    ck: &[[S::V; 2]; ROWS],
    hits: &[u32; ROWS],
    vr: &[*const f32; ROWS],
    col: *const f32,
    dv: usize,
    m: &mut [[f32; PANEL]; ROWS],
) -> ([usize; ROWS], usize) {
    let (mut sel, mut ns) = ([0usize; ROWS], 0);
    for r in 0..ROWS {
        if hits[r] != 0 {
            sel[ns] = r;
            ns += 1;
            // SAFETY: m[r] holds 16 floats (the caller's features, as for every call here)
            unsafe {
                S::store(m[r].as_mut_ptr(), ck[r][0]);
                S::store(m[r].as_mut_ptr().add(8), ck[r][1]);
            }
        }
    }
    if ns > 0 {
        let m = core::hint::black_box(m);
        // SAFETY: forwarded (this fn's contract)
        unsafe { value_rows_n::<S>(ns, vr, &sel, col, dv, m) };
    }
    (sel, ns)
}

/// Token `i`'s element 0 in packed panels `[n16/16][d][16]` at `base` (element `c` is
/// `16·c` further). Safe to call while `i` is inside the packed tokens.
#[inline(always)]
fn panel_at(base: *const f32, d: usize, i: usize) -> *const f32 {
    base.wrapping_add(i / PANEL * PANEL * d + i % PANEL)
}

/// Puts `m` into token `t`'s descending list `top[t·R..][..R]` when it beats the list's
/// last entry, and keeps `floor[t]` equal to that last entry.
#[inline(always)]
fn insert_top(top: &mut [f32], floor: &mut [f32], t: usize, m: f32) {
    if m <= floor[t] {
        return;
    }
    let l = &mut top[t * TWIN_RANK..(t + 1) * TWIN_RANK];
    let mut k = TWIN_RANK - 1;
    while k > 0 && l[k - 1] < m {
        l[k] = l[k - 1];
        k -= 1;
    }
    l[k] = m;
    floor[t] = l[TWIN_RANK - 1];
}

/// Row tile `i0..i0 + ROWS`: each row's token (rows past `n` repeat token `n - 1`, readable,
/// and are masked out by [`pairs_after`]) and its K and V panel addresses.
#[inline(always)]
fn row_tile(
    (kb, vb): (*const f32, *const f32),
    (dk, dv): (usize, usize),
    i0: usize,
    n: usize,
) -> ([usize; ROWS], [*const f32; ROWS], [*const f32; ROWS]) {
    let ri: [usize; ROWS] = core::array::from_fn(|r| (i0 + r).min(n - 1));
    (
        ri,
        ri.map(|i| panel_at(kb, dk, i)),
        ri.map(|i| panel_at(vb, dv, i)),
    )
}

/// The upper triangle's (row tile, panel) pairs up to `near` tokens past each row tile: row
/// tiles `i0` in steps of [`ROWS`], panels `j0` from the one holding `i0` (in the panels that
/// overlap the row tile, and past `n`, the pairs `j <= i` are masked: another tile's, or none).
#[inline(always)]
fn upper_tiles(n: usize, near: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n).step_by(ROWS).flat_map(move |i0| {
        let end = n.min((i0 + ROWS).saturating_add(near));
        (i0 / PANEL * PANEL..end)
            .step_by(PANEL)
            .map(move |j0| (i0, j0))
    })
}

/// The lanes of panel `j0` that pair with row token `i` in the upper triangle: `i < j < n`
/// (the others are another tile's pairs, or none).
#[inline(always)]
fn pairs_after(i: usize, j0: usize, n: usize) -> u32 {
    let lo = (i + 1).saturating_sub(j0).min(PANEL); // first lane past i
    let hi = n.saturating_sub(j0).min(PANEL); // lanes before n
    ((1u32 << hi) - 1) & !((1u32 << lo) - 1)
}

/// `floor[i]` = the [`TWIN_RANK`]-th largest of `min(kn_i·kn_j, vn_i·vn_j)` over `j != i,
/// j < n` (−1 where fewer) over the packed unit rows (`kp` `[n16/16][dk][16]`, `vp`
/// likewise); `floor` holds `n16` floats, `top` `n16·TWIN_RANK` (each token's list).
/// With `near < n` only the pairs of the panels up to `near` tokens past each row tile
/// count (every pair at most once): each floor is then a lower bound of the exact one.
#[inline(always)]
fn kth_similarity<S: Simd>(
    kp: &[f32],
    vp: &[f32],
    n: usize,
    dk: usize,
    dv: usize,
    floor: &mut [f32],
    top: &mut [f32],
    near: usize,
) {
    let n16 = floor.len();
    if n == 0 {
        return;
    }
    assert!(n16 % PANEL == 0 && n16 >= n && kp.len() >= n16 * dk && vp.len() >= n16 * dv);
    assert!(top.len() >= n16 * TWIN_RANK);
    floor.fill(-1.0);
    top.fill(-1.0);
    let (kb, vb) = (kp.as_ptr(), vp.as_ptr());
    // a token's element c sits at its panel's base + 16·c + its lane
    for (i0, j0) in upper_tiles(n, near) {
        let (ri, kr, vr) = row_tile((kb, vb), (dk, dv), i0, n);
        // SAFETY: every pointer is a row or panel inside kp/vp (asserted above) and
        // floor[j0 .. j0+16] is inside floor (j0 + 16 <= n16).
        unsafe {
            let ck = tile::<S, ROWS>(&kr, kb.add(j0 * dk), dk);
            // rows where some key cosine beats min(floor_i, floor_j): only those can
            // enter a top list, since min(ck, cv) <= ck
            let fp = floor.as_ptr();
            let b = [S::load(fp.add(j0)), S::load(fp.add(j0 + 8))];
            let edge = j0 < i0 + ROWS || j0 + PANEL > n;
            let mut sel = [0usize; ROWS];
            let mut ns = 0;
            for r in 0..ROWS {
                let br = S::splat(floor[ri[r]]);
                let mut hit = S::gt_mask(ck[r][0], S::min(br, b[0]))
                    | S::gt_mask(ck[r][1], S::min(br, b[1])) << 8;
                if edge {
                    hit &= pairs_after(i0 + r, j0, n);
                }
                sel[ns] = r;
                ns += usize::from(hit != 0);
            }
            if ns == 0 {
                continue;
            }
            let mut m = [[f32::NEG_INFINITY; PANEL]; ROWS];
            for &r in &sel[..ns] {
                S::store(m[r].as_mut_ptr(), ck[r][0]);
                S::store(m[r].as_mut_ptr().add(8), ck[r][1]);
                if edge {
                    let live = pairs_after(i0 + r, j0, n);
                    for (c, x) in m[r].iter_mut().enumerate() {
                        if live >> c & 1 == 0 {
                            *x = f32::NEG_INFINITY;
                        }
                    }
                }
            }
            let m = core::hint::black_box(&mut m);
            let col = vb.add(j0 * dv);
            value_rows_n::<S>(ns, &vr, &sel, col, dv, m);
            // both ends of every computed pair (masked pairs are -inf and enter nothing);
            // insertion order does not matter: a top list is a multiset's largest values.
            // Vector compares against the floors first: most pairs enter no list.
            for &r in &sel[..ns] {
                let x = [S::load(m[r].as_ptr()), S::load(m[r].as_ptr().add(8))];
                let fp = floor.as_ptr();
                let mut bits = S::gt_mask(x[0], S::load(fp.add(j0)))
                    | S::gt_mask(x[1], S::load(fp.add(j0 + 8))) << 8;
                while bits != 0 {
                    let c = bits.trailing_zeros() as usize;
                    insert_top(top, floor, j0 + c, m[r][c]);
                    bits &= bits - 1;
                }
                // read after the columns: a row token inside this panel may have moved;
                // a lane not above the floor now is not above it after any insertion
                let br = S::splat(floor[ri[r]]);
                let mut bits = S::gt_mask(x[0], br) | S::gt_mask(x[1], br) << 8;
                while bits != 0 {
                    let c = bits.trailing_zeros() as usize;
                    insert_top(top, floor, ri[r], m[r][c]);
                    bits &= bits - 1;
                }
            }
        }
    }
}

/// The first scan, counting only: `floor[i]` = [`TWIN_CUTOFF`] where token `i` has
/// [`TWIN_RANK`] twins or more (`min(ck, cv)` at or past the cutoff) among the pairs of the
/// panels up to `near` tokens past each row tile (its 4th twin is then at or past the cutoff:
/// settled, score 0), −1 elsewhere (open). The same settled set as [`kth_similarity`] with
/// `near`, for less: an open token's list restarts in the exact scans anyway, so only
/// "four twins at the cutoff" is used, and a fixed cutoff gates the value dots and skips the
/// list inserts that floors starting at −1 let every early pair through.
#[inline(always)]
fn settle_near<S: Simd>(
    kp: &[f32],
    vp: &[f32],
    n: usize,
    dk: usize,
    dv: usize,
    floor: &mut [f32],
    near: usize,
) {
    let n16 = floor.len();
    assert!(n16 % PANEL == 0 && n16 >= n && kp.len() >= n16 * dk && vp.len() >= n16 * dv);
    floor.fill(0.0); // twins counted so far (small whole numbers: exact in f32)
    if n == 0 {
        return;
    }
    let (kb, vb) = (kp.as_ptr(), vp.as_ptr());
    // `x > below` is `x >= TWIN_CUTOFF` (no float lies between)
    let below = f32::from_bits(TWIN_CUTOFF.to_bits() - 1);
    for (i0, j0) in upper_tiles(n, near) {
        let (ri, kr, vr) = row_tile((kb, vb), (dk, dv), i0, n);
        // SAFETY: every pointer is a row or panel inside kp/vp (asserted above).
        unsafe {
            let ck = tile::<S, ROWS>(&kr, kb.add(j0 * dk), dk);
            let cut = S::splat(below);
            let edge = j0 < i0 + ROWS || j0 + PANEL > n;
            let mut hits = [0u32; ROWS];
            for r in 0..ROWS {
                // the pairs whose key cosine reaches the cutoff (min(ck, cv) <= ck)
                hits[r] = S::gt_mask(ck[r][0], cut) | S::gt_mask(ck[r][1], cut) << 8;
                if edge {
                    hits[r] &= pairs_after(i0 + r, j0, n);
                }
            }
            let mut m = [[0f32; PANEL]; ROWS];
            let (sel, ns) = value_pass::<S>(&ck, &hits, &vr, vb.add(j0 * dv), dv, &mut m);
            // both ends of every pair at the cutoff count it
            for &r in &sel[..ns] {
                let x = [S::load(m[r].as_ptr()), S::load(m[r].as_ptr().add(8))];
                let mut bits = (S::gt_mask(x[0], cut) | S::gt_mask(x[1], cut) << 8) & hits[r];
                floor[ri[r]] += bits.count_ones() as f32;
                while bits != 0 {
                    floor[j0 + bits.trailing_zeros() as usize] += 1.0;
                    bits &= bits - 1;
                }
            }
        }
    }
    for f in floor.iter_mut() {
        *f = if *f >= TWIN_RANK as f32 {
            TWIN_CUTOFF
        } else {
            -1.0
        };
    }
}

/// A group's panels `lo..=hi` (`(1, 0)`: none).
type Span = (usize, usize);
const NONE: Span = (1, 0);

/// Rows `ri[..m]` (distinct tokens) compared one-sided with the other tokens of the panels
/// at most `reach` panels from the first row's, visited outward from it (where twins are
/// likeliest), except each row's panels `seen[r]`: with `reset` their lists restart empty
/// (`seen` then none). Stops early once every row is at or past [`TWIN_CUTOFF`]. Returns
/// the panels visited (`lo..=hi`, the same for every row). A row whose lists restarted
/// and whose visits then cover every panel is exact; one at or past the cutoff is settled.
#[inline(always)]
fn exact_rows<S: Simd>(
    kp: &[f32],
    vp: &[f32],
    n: usize,
    dk: usize,
    dv: usize,
    floor: &mut [f32],
    top: &mut [f32],
    ri: &[usize; ROWS],
    m: usize,
    reset: bool,
    seen: &[Span; ROWS],
    reach: usize,
) -> Span {
    let (kb, vb) = (kp.as_ptr(), vp.as_ptr());
    let ri: [usize; ROWS] = core::array::from_fn(|r| ri[r.min(m - 1)]);
    if reset {
        for &i in &ri[..m] {
            floor[i] = -1.0;
            top[i * TWIN_RANK..(i + 1) * TWIN_RANK].fill(-1.0);
        }
    }
    let kr = ri.map(|i| panel_at(kb, dk, i));
    let vr = ri.map(|i| panel_at(vb, dv, i));
    let panels = n.div_ceil(PANEL);
    let p0 = ri[0] / PANEL;
    let visited = |d: usize| (p0.saturating_sub(d), (p0 + d).min(panels - 1));
    let mut dist = 0;
    while dist < panels && dist <= reach {
        let below = if dist > 0 { p0.checked_sub(dist) } else { None };
        for p in [Some(p0 + dist), below] {
            let Some(p) = p.filter(|&p| p < panels) else {
                continue;
            };
            let j0 = p * PANEL;
            // SAFETY: rows and the panel are inside kp/vp (asserted by the caller's caller).
            unsafe {
                let ck = tile::<S, ROWS>(&kr, kb.add(j0 * dk), dk);
                let mut hits = [0u32; ROWS];
                // lanes of tokens < n (the last panel may be partial)
                let in_range: u32 = (1u32 << (n - j0).min(PANEL)) - 1;
                for r in 0..m {
                    if seen[r].0 <= p && p <= seen[r].1 {
                        continue; // compared before
                    }
                    let br = S::splat(floor[ri[r]]);
                    let hit = S::gt_mask(ck[r][0], br) | S::gt_mask(ck[r][1], br) << 8;
                    // not itself, not past n
                    let mut live = in_range;
                    if (j0..j0 + PANEL).contains(&ri[r]) {
                        live &= !(1 << (ri[r] - j0));
                    }
                    hits[r] = hit & live;
                }
                let mut mm = [[0f32; PANEL]; ROWS];
                let (sel, ns) = value_pass::<S>(&ck, &hits, &vr, vb.add(j0 * dv), dv, &mut mm);
                // the other lanes cannot enter (min(ck, cv) <= ck <= the floor), or are
                // the token itself or past n
                for &r in &sel[..ns] {
                    let mut bits = hits[r];
                    while bits != 0 {
                        let c = bits.trailing_zeros() as usize;
                        insert_top(top, floor, ri[r], mm[r][c]);
                        bits &= bits - 1;
                    }
                }
            }
        }
        if ri[..m].iter().all(|&i| floor[i] >= TWIN_CUTOFF) {
            return visited(dist);
        }
        dist += 1;
    }
    visited(dist - 1)
}

/// How far (in panels) the first exact scan of a group reaches: most tokens the near
/// scan leaves open settle within it; the rest, the tokens with no four twins, go on
/// packed into dense groups of their own over the remaining panels.
const FIRST_REACH: usize = 4;

/// Every token's floor, exact below [`TWIN_CUTOFF`] and at or past it otherwise (so its
/// score, 0, is exact): pairs up to `near` apart first, counted ([`settle_near`]), then the
/// tokens still below the cutoff against the whole cache — or, when those are over half the
/// tokens, every pair (cheaper then: on SmolLM2's decode rounds at 512 cells, 69 % of the
/// tokens are still open after the near scan, 27 % after every pair, and three heads in
/// four take this path).
#[inline(always)]
fn twin_floors<S: Simd>(
    kp: &[f32],
    vp: &[f32],
    n: usize,
    dk: usize,
    dv: usize,
    floor: &mut [f32],
    top: &mut [f32],
    near: usize,
) {
    if near.saturating_add(ROWS) >= n {
        // the first row tile reaches the last token: every pair, once
        kth_similarity::<S>(kp, vp, n, dk, dv, floor, top, near);
        return;
    }
    settle_near::<S>(kp, vp, n, dk, dv, floor, near);
    let open = floor[..n].iter().filter(|&&f| f < TWIN_CUTOFF).count();
    if 2 * open > n {
        kth_similarity::<S>(kp, vp, n, dk, dv, floor, top, usize::MAX);
        return;
    }
    // the rows are settled in order and each only writes its own list: the tokens after
    // a group still hold their first-scan floors when they are picked. Each group first
    // scans the panels up to FIRST_REACH from its first row's; the rows it leaves open and
    // incomplete wait in `rest` (with the panels they saw) for a group of their own, which
    // compares them with every other panel: each pair enters a row's list once.
    let panels = n.div_ceil(PANEL);
    let (mut ri, mut m) = ([0usize; ROWS], 0);
    // room for a full group of open rows beside the ROWS - 1 that may wait
    let (mut rest, mut seen, mut k) = ([0usize; 2 * ROWS], [NONE; 2 * ROWS], 0);
    // (no closures here: a closure does not take the caller's `target_feature`s, so the
    // vector code inlined into one ran without them, every intrinsic a call)
    for i in 0..=n {
        if i < n && floor[i] < TWIN_CUTOFF {
            ri[m] = i;
            m += 1;
        }
        if m == ROWS || (i == n && m > 0) {
            // the group's first scan; its rows left open wait in `rest` with the panels seen
            let (reset, none) = (true, [NONE; ROWS]);
            #[rustfmt::skip] // (one line, as the call below with the same arguments)
            let span = exact_rows::<S>(kp, vp, n, dk, dv, floor, top, &ri, m, reset, &none, FIRST_REACH);
            if span != (0, panels - 1) {
                for &t in &ri[..m] {
                    if floor[t] < TWIN_CUTOFF {
                        (rest[k], seen[k]) = (t, span);
                        k += 1;
                    }
                }
            }
            m = 0;
        }
        // the open rows in groups of their own, in the order they came: each full group as
        // it fills, the last at the end
        while k >= ROWS || (i == n && k > 0) {
            let g = k.min(ROWS);
            let rows: [usize; ROWS] = core::array::from_fn(|r| rest[r]);
            let saw: [Span; ROWS] = core::array::from_fn(|r| seen[r]);
            #[rustfmt::skip]
            exact_rows::<S>(kp, vp, n, dk, dv, floor, top, &rows, g, false, &saw, usize::MAX);
            rest.copy_within(g..k, 0);
            seen.copy_within(g..k, 0);
            k -= g;
        }
    }
}

/// `max(0, 1 - r)^POWER`, 0 at or past the cutoff, as one fixed product sequence (the CUDA
/// kernel repeats it bit for bit): `u2 = x·x`, `u8 = (u2·u2)·(u2·u2)`, `(u8·u8)·u8`.
#[inline(always)]
fn sharpen(r: f32) -> f32 {
    let x = (1.0 - r).max(0.0);
    let u2 = x * x;
    let u8 = u2 * u2 * (u2 * u2);
    if r >= TWIN_CUTOFF {
        0.0
    } else {
        u8 * u8 * u8
    }
}

/// Scores of KV head `kh`'s first `dst.len()` tokens; `scratch` holds [`scratch_floats`].
pub(super) fn score(keys: &View, values: &View, kh: usize, scratch: &mut [f32], dst: &mut [f32]) {
    dispatch_wide!(fn(keys: &View, values: &View, kh: usize, scratch: &mut [f32], dst: &mut [f32]) -> (), S => {
        let (n, dk, dv) = (keys.extent()[1], keys.extent()[2], values.extent()[2]);
        let [kp, vp, floor, top] = unit_panels::<S>(keys, values, kh, scratch);
        twin_floors::<S>(kp, vp, n, dk, dv, floor, top, NEAR);
        lend(floor, dst);
    })
}

/// [`score`] for a decode round whose first `held` cells kept their twin lists from the
/// last round (`lists`: `n·`[`TWIN_WORDS`] words, [`remap_twins`]; `twins.rs`): the same
/// scores, comparing mostly the pairs with a new cell; every cell's list is then ready
/// for the next round.
pub(super) fn score_carried(
    keys: &View,
    values: &View,
    kh: usize,
    scratch: &mut [f32],
    dst: &mut [f32],
    lists: &mut [u32],
    held: usize,
) {
    dispatch_wide!(fn(keys: &View, values: &View, kh: usize, scratch: &mut [f32], dst: &mut [f32], lists: &mut [u32], held: usize) -> (), S => {
        let (n, dk, dv) = (keys.extent()[1], keys.extent()[2], values.extent()[2]);
        let [kp, vp, floor, gate] = unit_panels::<S>(keys, values, kh, scratch);
        twins::carried_floors::<S>(kp, vp, n, held, dk, dv, floor, gate, lists);
        lend(floor, dst);
    })
}

/// [`scratch_floats`]' parts: head `kh`'s unit K and V rows in panels (loaded), every
/// token's floor and top list (`n16·TWIN_RANK` floats).
#[inline(always)]
fn unit_panels<'s, S: Simd>(
    keys: &View,
    values: &View,
    kh: usize,
    scratch: &'s mut [f32],
) -> [&'s mut [f32]; 4] {
    let (n, dk, dv) = (keys.extent()[1], keys.extent()[2], values.extent()[2]);
    let n16 = n.div_ceil(PANEL) * PANEL;
    let (kp, rest) = scratch.split_at_mut(n16 * dk);
    let (vp, rest) = rest.split_at_mut(n16 * dv);
    let (floor, rest) = rest.split_at_mut(n16);
    let (top, tmp) = rest.split_at_mut(n16 * TWIN_RANK);
    load_unit_panels::<S>(keys, kh, tmp, kp);
    load_unit_panels::<S>(values, kh, tmp, vp);
    [kp, vp, floor, top]
}

/// Each token's sharpened score from its floor, then lent backwards (the module's rule).
#[inline(always)]
fn lend(floor: &[f32], dst: &mut [f32]) {
    for (out, &b) in dst.iter_mut().zip(floor.iter()) {
        *out = sharpen(b);
    }
    // ascending: dst[i + 1 ..] are still unlent when dst[i] reads them
    for i in 0..dst.len() {
        let mut f = 1.0f32;
        for j in 1..=BACK_REACH.min(dst.len() - 1 - i) {
            if j > BACK_FLAT {
                f *= BACK_DECAY;
            }
            dst[i] = dst[i].max(f * dst[i + j]);
        }
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;
    use crate::numerics::Portable;
    use std::vec::Vec;

    fn lcg(seed: u64) -> impl FnMut() -> f32 {
        let mut s = seed;
        move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        }
    }

    /// Unit rows with planted near-twins (so pruning both skips and keeps value tiles),
    /// packed as `score` packs them.
    fn packed(n: usize, d: usize, seed: u64) -> Vec<f32> {
        let mut rnd = lcg(seed);
        let mut rows: Vec<f32> = (0..n * d).map(|_| rnd()).collect();
        for t in (3..n).step_by(5) {
            let src = (t * 7) % t;
            for c in 0..d {
                rows[t * d + c] = rows[src * d + c] + 0.05 * rnd();
            }
        }
        if n > 2 {
            rows[d..2 * d].fill(0.0); // a zero row stays zero
        }
        pack(rows, n, d)
    }

    /// A cache like a real one: most tokens are noisy copies of a few recurring directions
    /// (filler, many twins), every 9th is unique, and tokens 0..3 have two twins among
    /// themselves and their 3rd and 4th in the last 3 positions, beyond a short first scan.
    fn text_like(n: usize, d: usize, seed: u64) -> Vec<f32> {
        pack(text_rows(n, d, seed), n, d)
    }

    /// [`text_like`]'s rows, unpacked.
    fn text_rows(n: usize, d: usize, seed: u64) -> Vec<f32> {
        let mut rnd = lcg(seed);
        let vocab: Vec<f32> = (0..9 * d).map(|_| rnd()).collect();
        let mut rows = std::vec![0f32; n * d];
        for t in 0..n {
            let far = t < 3 || t >= n - 3;
            let w = if far { 8 } else { t * 5 % 8 };
            for c in 0..d {
                rows[t * d + c] = if t % 9 == 4 && !far {
                    rnd()
                } else {
                    vocab[w * d + c] + 0.08 * rnd()
                };
            }
        }
        rows
    }

    fn pack(mut rows: Vec<f32>, n: usize, d: usize) -> Vec<f32> {
        let n16 = n.div_ceil(PANEL) * PANEL;
        let mut p = std::vec![0f32; n16 * d];
        for t in 0..n {
            let row = &mut rows[t * d..(t + 1) * d];
            let ss: f32 = row.iter().map(|x| x * x).sum();
            if ss > 0.0 {
                let inv = 1.0 / ss.sqrt();
                row.iter_mut().for_each(|x| *x *= inv);
            }
            for c in 0..d {
                p[t / PANEL * PANEL * d + c * PANEL + t % PANEL] = row[c];
            }
        }
        p
    }

    /// Every ordered pair, the same per-pair arithmetic (one FMA chain over `d`, fused or
    /// not as `S` is), no tiles, no pruning, a full sort: the tiled search must give the
    /// same bits for the [`TWIN_RANK`]-th similarity.
    fn brute(kp: &[f32], vp: &[f32], n: usize, dk: usize, dv: usize, fused: bool) -> Vec<f32> {
        let el = |p: &[f32], d: usize, i: usize, c: usize| {
            p[i / PANEL * PANEL * d + c * PANEL + i % PANEL]
        };
        let dot = |p: &[f32], d: usize, i: usize, j: usize| {
            (0..d).fold(0f32, |a, c| {
                let (x, y) = (el(p, d, i, c), el(p, d, j, c));
                if fused {
                    x.mul_add(y, a)
                } else {
                    a + x * y
                }
            })
        };
        (0..n)
            .map(|i| {
                let mut sims: Vec<f32> = (0..n)
                    .filter(|&j| j != i)
                    .map(|j| dot(kp, dk, i, j).min(dot(vp, dv, i, j)))
                    .collect();
                sims.sort_by(|a, b| b.total_cmp(a));
                sims.get(TWIN_RANK - 1).copied().unwrap_or(-1.0)
            })
            .collect()
    }

    fn same_as_brute<S: Simd>(fused: bool) {
        for (n, dk, dv) in [
            (1, 8, 8),
            (2, 5, 3),
            (7, 16, 16),
            (16, 64, 64),
            (33, 12, 20),
            (100, 64, 64),
            (203, 32, 24),
        ] {
            let (kp, vp) = (packed(n, dk, n as u64), packed(n, dv, 99 + n as u64));
            let n16 = n.div_ceil(PANEL) * PANEL;
            let (mut floor, mut top) = (std::vec![0f32; n16], std::vec![0f32; n16 * TWIN_RANK]);
            kth_similarity::<S>(&kp, &vp, n, dk, dv, &mut floor, &mut top, usize::MAX);
            let r = brute(&kp, &vp, n, dk, dv, fused);
            for i in 0..n {
                assert_eq!(
                    floor[i].to_bits(),
                    r[i].to_bits(),
                    "n {n} dk {dk} dv {dv} token {i}"
                );
            }
        }
    }

    /// The two scans settle every token: below the cutoff its floor has the plain search's
    /// bits, at or past it the plain search is too. `text_like` caches take the second
    /// scan (the far twins of tokens 0..3 are found there and only there); random ones
    /// (every token below the cutoff) the full search.
    fn two_scans_settle<S: Simd>(fused: bool) {
        let mut second_scan = 0;
        for (n, dk, dv, near, text) in [
            (300, 16, 24, 16, true),
            (300, 64, 64, 32, true),
            (257, 8, 8, 0, true),
            (500, 32, 32, 64, true),
            (300, 16, 16, 32, false),
            (90, 16, 16, 100, true),
        ] {
            let (kp, vp) = if text {
                (
                    text_like(n, dk, 5 + n as u64),
                    text_like(n, dv, 7 + n as u64),
                )
            } else {
                (packed(n, dk, n as u64), packed(n, dv, 99 + n as u64))
            };
            let n16 = n.div_ceil(PANEL) * PANEL;
            let (mut floor, mut top) = (std::vec![0f32; n16], std::vec![0f32; n16 * TWIN_RANK]);
            kth_similarity::<S>(&kp, &vp, n, dk, dv, &mut floor, &mut top, near);
            let first: Vec<f32> = floor.clone();
            // the counting first scan settles the same tokens as the top lists' first scan
            settle_near::<S>(&kp, &vp, n, dk, dv, &mut floor, near);
            for i in 0..n {
                let settled = first[i] >= TWIN_CUTOFF;
                assert_eq!(
                    floor[i] >= TWIN_CUTOFF,
                    settled,
                    "n {n} near {near} token {i}"
                );
            }
            twin_floors::<S>(&kp, &vp, n, dk, dv, &mut floor, &mut top, near);
            let r = brute(&kp, &vp, n, dk, dv, fused);
            for i in 0..n {
                let what = std::format!("n {n} near {near} token {i}: {} vs {}", floor[i], r[i]);
                if r[i] >= TWIN_CUTOFF {
                    assert!(floor[i] >= TWIN_CUTOFF, "{what}");
                } else {
                    assert_eq!(floor[i].to_bits(), r[i].to_bits(), "{what}");
                }
                if first[i] < TWIN_CUTOFF && r[i] >= TWIN_CUTOFF {
                    second_scan += 1;
                }
            }
            if text && near + ROWS < n {
                // the far twins: redundant, and only the second scan can tell
                assert!((0..3).all(|i| first[i] < TWIN_CUTOFF && r[i] >= TWIN_CUTOFF));
            }
        }
        assert!(second_scan > 0);
    }

    /// Decode rounds: each adds new tokens after the cells kept from the last, evicts a
    /// quarter (the most redundant, or a spread), and the carried lists give the plain
    /// search's floors every round (settled tokens settled, the others bit for bit).
    fn carried_rounds<S: Simd>(fused: bool) {
        let (total, dk, dv) = (1200, 16, 24);
        let (kr, vr) = (text_rows(total, dk, 11), text_rows(total, dv, 13));
        let mut rnd = lcg(17);
        for (start, step, worst) in [
            (96, 40, true),
            (200, 64, false),
            (5, 3, true),
            (64, 1, false),
        ] {
            let mut cells: Vec<usize> = (0..start).collect();
            let (mut next, mut held) = (start, 0);
            let mut lists: Vec<u32> = Vec::new();
            for round in 0..12 {
                let n = cells.len();
                let pick = |rows: &[f32], d: usize| {
                    let r: Vec<f32> = cells
                        .iter()
                        .flat_map(|&t| rows[t * d..(t + 1) * d].to_vec())
                        .collect();
                    pack(r, n, d)
                };
                let (kp, vp) = (pick(&kr, dk), pick(&vr, dv));
                let n16 = n.div_ceil(PANEL) * PANEL;
                let (mut floor, mut gate) =
                    (std::vec![0f32; n16], std::vec![0f32; n16 * TWIN_RANK]);
                lists.resize(n * TWIN_WORDS, 0);
                twins::carried_floors::<S>(
                    &kp, &vp, n, held, dk, dv, &mut floor, &mut gate, &mut lists,
                );
                let r = brute(&kp, &vp, n, dk, dv, fused);
                for i in 0..n {
                    let what = std::format!(
                        "start {start} round {round} cell {i}/{n} held {held}: {} vs {}",
                        floor[i],
                        r[i]
                    );
                    if r[i] >= TWIN_CUTOFF {
                        assert!(floor[i] >= TWIN_CUTOFF, "{what}");
                    } else {
                        assert_eq!(floor[i].to_bits(), r[i].to_bits(), "{what}");
                    }
                }
                // evict a quarter: the most redundant (as uniqueness would), or a spread
                let mut order: Vec<usize> = (0..n).collect();
                if worst {
                    order.sort_by(|&a, &b| r[b].total_cmp(&r[a]));
                } else {
                    order.sort_by_key(|&i| (i * 7919 + round) % n);
                }
                let mut kept: Vec<u32> = order[n / 4..].iter().map(|&i| i as u32).collect();
                kept.sort();
                remap_twins(&mut lists, &kept);
                cells = kept.iter().map(|&i| cells[i as usize]).collect();
                held = cells.len();
                // now and then a round with nothing new
                let add = if rnd() > 0.2 {
                    step.min(total - next)
                } else {
                    0
                };
                cells.extend(next..next + add);
                next += add;
            }
        }
    }

    #[test]
    fn carried_twin_lists_equal_plain_search() {
        carried_rounds::<Portable>(false);
        crate::numerics::on_vector_builds!(S => { carried_rounds::<S>(true) });
        #[cfg(all(target_arch = "x86_64", kvevict_avx512))]
        if wide::<crate::numerics::Avx2>() {
            NARROW.store(true, core::sync::atomic::Ordering::Relaxed);
            crate::numerics::on_vector_builds!(S => { carried_rounds::<S>(true) });
            NARROW.store(false, core::sync::atomic::Ordering::Relaxed);
        }
    }

    #[test]
    fn tiled_pruned_search_equals_plain_search() {
        two_scans_settle::<Portable>(false);
        same_as_brute::<Portable>(false);
        let vector_builds = || {
            crate::numerics::on_vector_builds!(S => {
                same_as_brute::<S>(true);
                two_scans_settle::<S>(true);
            })
        };
        vector_builds();
        // the 8-lane tiles too where the 16-lane ones are taken
        #[cfg(all(target_arch = "x86_64", kvevict_avx512))]
        if wide::<crate::numerics::Avx2>() {
            NARROW.store(true, core::sync::atomic::Ordering::Relaxed);
            vector_builds();
            NARROW.store(false, core::sync::atomic::Ordering::Relaxed);
        }
    }
}
