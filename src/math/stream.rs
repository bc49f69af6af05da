//! Scoring one layer's keys from any stream of queries (issue 11, build step 1): a
//! caller-owned accumulator fed query chunks with their positions, finished into scores.
//!
//! # Contract
//! - **State** (`[u8]`, 8-byte aligned, [`stream_state_size`] bytes), one per layer and
//!   sequence, made by [`stream_init`] for a shape `(Hq, Hkv, N, dk)`. It holds, per query
//!   head `h` and key `i < N`: `max_j A[h,j,i]`, `Σ_j A[h,j,i]`, `Σ_j A[h,j,i]²`; per key, how
//!   many fed queries could see it; the number of queries fed and the last position. Plain
//!   bytes without pointers: it may be copied, saved and restored.
//! - **Feed** ([`stream_feed`]): queries `[Hq, c, dk]` (post-RoPE), their positions
//!   `positions[c]` (`i64`, `>= 0`, non-decreasing within the chunk and from one chunk to
//!   the next), keys `[Hkv, N, dk]` (the same `N` as the state). A query at position `p`
//!   sees keys `i <= min(p, N-1)`: queries after the cache (reconstruction, decode-time
//!   rescoring) see every key; queries at positions `< N` (whole-prefill accumulation) are
//!   causal. Attention is design §2's: `z = q·k / sqrt(dk)`, softmax over the visible keys in
//!   f32 with max subtraction, the denominator summed in f64. Two passes over the visible
//!   keys (row max and denominator, then columns); with `row_lse` (the rows' natural-log
//!   log-sum-exp over their visible keys, flash attention's `softmax_lse`) one.
//!   The workspace ([`stream_feed_workspace_size`]) depends on `Hq·c` and `dk`, never on
//!   `c × N`. Everything that can reject a chunk (shapes, positions, NaN/Inf in the queries,
//!   in the visible keys or in `row_lse`, workspace) is checked before the state changes:
//!   on error the state is unchanged. Keys beyond the last visible one are not read, so
//!   a state sized for a cache's capacity serves a growing cache (decode-time rescoring):
//!   queries at their own positions never see the unfilled tail, whose scores stay 0.
//! - **Finish** ([`stream_scores`]): one score per (KV head, key) for **all** `N` keys,
//!   `out[kh*N + i]`, larger = more worth keeping. The stream has no window: whatever the
//!   caller always keeps (sinks, recent tokens) it handles itself, e.g. by selecting with
//!   window 0. Per query head the statistic ([`StreamStat`]), then the per-head pool, then
//!   the GQA reduction over the group, then the post-pool:
//!   - `Max`: `max_j A[h,j,i]` (KVzip);
//!   - `Mean`: `Σ_j A[h,j,i] / Q`, `Q` the number of queries fed (SnapKV's mean when the
//!     queries are the window; H2O's accumulated attention up to the constant `Q`);
//!   - `MeanVisible`: `Σ_j A[h,j,i] / Q_i`, `Q_i` the queries that could see key `i`
//!     (0 when none): accumulated attention without the causal bias toward early keys;
//!   - `LaProx`: `pool(||A[h,:,i]||_2) · ||v_i Wo_h||_2` (design §3, placement "attention"),
//!     the value term from cached value forms (`cross = false`) or values + Gram.
//!
//!   Finishing reads the state only; it may be called at any time, as often as wanted.

use crate::config::{GqaReduce, Pool};
use crate::error::{add, mul, Error, Result};
use crate::gram;
use crate::numerics::{dispatch, Simd};
use crate::pool::pool_in_place;
use crate::score::{reduce_rows, MAX_HEADS};
use crate::view::View;
use crate::window::{self, Scratch, CHUNK, KT};
use crate::workspace::{Workspace, WorkspaceSize};

crate::config::c_enum! {
    /// The statistic a stream finishes into (module docs).
    StreamStat => "KVE_STREAM_STAT_" {
        Max = 0 => "MAX",
        Mean = 1 => "MEAN",
        MeanVisible = 2 => "MEAN_VISIBLE",
        LaProx = 3 => "LAPROX",
    }
}

/// How a stream's statistics become scores.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StreamScoreConfig {
    pub stat: StreamStat,
    /// Reduction of the `g` query heads of a KV group (after `pool`).
    pub gqa: GqaReduce,
    /// Per query head, along tokens (LaProx: on the attention term).
    pub pool: Pool,
    /// Per KV head after the GQA reduction (e.g. forward pooling).
    pub post_pool: Pool,
}

impl StreamScoreConfig {
    /// No pooling, the given statistic and reduction.
    pub const fn new(stat: StreamStat, gqa: GqaReduce) -> Self {
        StreamScoreConfig {
            stat,
            gqa,
            pool: Pool::NONE,
            post_pool: Pool::NONE,
        }
    }
    pub fn validate(&self) -> Result<()> {
        self.pool.validate()?;
        self.post_pool.validate()
    }
}

/// Where LaProx's value term comes from (ignored by the other statistics): cached value
/// forms `[Hkv][g][N]` ([`gram::compute_value_forms`] with `cross = false`), or values
/// `[Hkv, N, dv]` with the Gram blocks of [`gram::compute_gram`] (`cross = false`).
/// Forms beside values or a Gram are `InvalidArgument` for LaProx (never one ignored).
#[derive(Clone, Copy, Debug, Default)]
pub struct StreamValues<'a> {
    pub value_forms: Option<&'a [f32]>,
    pub values: Option<View<'a>>,
    pub gram: Option<&'a [f32]>,
}

/// Sizes of the layer a stream scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamShape {
    pub hq: usize,
    pub hkv: usize,
    pub n: usize,
    pub dk: usize,
}

impl StreamShape {
    fn validate(&self) -> Result<()> {
        if self.hq == 0 || self.hkv == 0 || self.n == 0 || self.dk == 0 {
            return Err(Error::InvalidArgument);
        }
        if self.hq % self.hkv != 0 {
            return Err(Error::ShapeMismatch);
        }
        if self.n > crate::error::MAX_TOKENS || self.dk > 1024 || self.hq > MAX_HEADS {
            return Err(Error::InvalidArgument);
        }
        Ok(())
    }
    fn group(&self) -> usize {
        self.hq / self.hkv
    }
}

/// Header words: magic, version, hq, hkv, n, dk, queries fed, last position + 1 (0: none).
const HEADER_WORDS: usize = 16;
const MAGIC: u64 = 0x6b76_6573_7472_6d31; // "kvestrm1"
const VERSION: u64 = 1;
const H_QUERIES: usize = 6;
const H_LAST: usize = 7;

/// Bytes of a stream state: a 128-byte header, `N` u64 visibility counts, then
/// `max`, `sum`, `sq` as `[Hq][N]` f32 each.
pub fn stream_state_size(shape: &StreamShape) -> Result<usize> {
    shape.validate()?;
    let hn = mul(shape.hq, shape.n)?;
    add(add(HEADER_WORDS * 8, mul(shape.n, 8)?)?, mul(hn, 12)?)
}

/// The typed parts of a state buffer.
struct Parts<'s> {
    head: &'s mut [u64],
    /// `seen[i]`: fed queries whose last visible key is `i`.
    seen: &'s mut [u64],
    max: &'s mut [f32],
    sum: &'s mut [f32],
    sq: &'s mut [f32],
}

/// Split `state` for `shape` (length and alignment checked). A buffer shorter than the
/// shape's state is `InvalidArgument` for every call (init included): it is not a state.
fn parts<'s>(state: &'s mut [u8], shape: &StreamShape) -> Result<Parts<'s>> {
    if state.len() < stream_state_size(shape)? {
        return Err(Error::InvalidArgument);
    }
    if state.as_ptr() as usize % 8 != 0 {
        return Err(Error::Misaligned);
    }
    let hn = shape.hq * shape.n;
    let (h, rest) = state.split_at_mut(HEADER_WORDS * 8);
    let (s, rest) = rest.split_at_mut(shape.n * 8);
    let (mx, rest) = rest.split_at_mut(hn * 4);
    let (sm, rest) = rest.split_at_mut(hn * 4);
    let sq = &mut rest[..hn * 4];
    // SAFETY: each piece is 8-aligned (every cut is a multiple of 8 from an 8-aligned
    // start), long enough, and u64/f32 are valid for any bit pattern.
    unsafe {
        Ok(Parts {
            head: core::slice::from_raw_parts_mut(h.as_mut_ptr() as *mut u64, HEADER_WORDS),
            seen: core::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut u64, shape.n),
            max: core::slice::from_raw_parts_mut(mx.as_mut_ptr() as *mut f32, hn),
            sum: core::slice::from_raw_parts_mut(sm.as_mut_ptr() as *mut f32, hn),
            sq: core::slice::from_raw_parts_mut(sq.as_mut_ptr() as *mut f32, hn),
        })
    }
}

/// The shape an initialised state records; `InvalidArgument` when `state` is not one.
pub fn stream_shape(state: &[u8]) -> Result<StreamShape> {
    if state.len() < HEADER_WORDS * 8 {
        return Err(Error::InvalidArgument);
    }
    let w = |k: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&state[k * 8..k * 8 + 8]);
        u64::from_ne_bytes(b)
    };
    if w(0) != MAGIC || w(1) != VERSION {
        return Err(Error::InvalidArgument);
    }
    let u = |k: usize| usize::try_from(w(k)).map_err(|_| Error::InvalidArgument);
    let shape = StreamShape {
        hq: u(2)?,
        hkv: u(3)?,
        n: u(4)?,
        dk: u(5)?,
    };
    shape.validate().map_err(|_| Error::InvalidArgument)?;
    Ok(shape)
}

/// Queries fed into an initialised state so far. A state shorter than its shape's size is
/// not one (`InvalidArgument`, as in [`stream_stats`]).
pub fn stream_query_count(state: &[u8]) -> Result<u64> {
    if state.len() < stream_state_size(&stream_shape(state)?)? {
        return Err(Error::InvalidArgument);
    }
    let mut b = [0u8; 8];
    b.copy_from_slice(&state[H_QUERIES * 8..H_QUERIES * 8 + 8]);
    Ok(u64::from_ne_bytes(b))
}

/// Start an empty stream for `shape` in `state` (at least [`stream_state_size`] bytes,
/// 8-byte aligned). Writes only the first [`stream_state_size`] bytes of `state`.
pub fn stream_init(shape: &StreamShape, state: &mut [u8]) -> Result<()> {
    let p = parts(state, shape)?;
    p.head.fill(0);
    p.head[..6].copy_from_slice(&[
        MAGIC,
        VERSION,
        shape.hq as u64,
        shape.hkv as u64,
        shape.n as u64,
        shape.dk as u64,
    ]);
    p.seen.fill(0);
    p.max.fill(0.0);
    p.sum.fill(0.0);
    p.sq.fill(0.0);
    Ok(())
}

/// Workspace bytes [`stream_feed`] needs for chunks of up to `chunk` queries.
pub fn stream_feed_workspace_size(shape: &StreamShape, chunk: usize) -> Result<usize> {
    shape.validate()?;
    if chunk == 0 || chunk > crate::error::MAX_TOKENS {
        return Err(Error::InvalidArgument);
    }
    let mut ws = WorkspaceSize::new();
    ws.add::<u64>(chunk)?; // last visible key per query
    add(
        ws.total(),
        accumulate_workspace_size(shape.hq, shape.group(), chunk, shape.dk)?,
    )
}

/// Feed one chunk of queries (module docs). `state` from [`stream_init`]; `queries`
/// `[Hq, c, dk]`, `positions[c]`, `keys` `[Hkv, N, dk]` as recorded in the state;
/// `row_lse` optional, exactly `Hq·c` floats `[Hq][c]`; `workspace` at least
/// [`stream_feed_workspace_size`] for `c`. On error the state is unchanged.
pub fn stream_feed(
    state: &mut [u8],
    queries: &View,
    positions: &[i64],
    keys: &View,
    row_lse: Option<&[f32]>,
    workspace: &mut [u8],
) -> Result<()> {
    let shape = stream_shape(state)?;
    let [hq, c, dq] = queries.extent();
    if keys.extent() != [shape.hkv, shape.n, shape.dk] || hq != shape.hq || dq != shape.dk {
        return Err(Error::ShapeMismatch);
    }
    if positions.len() != c {
        return Err(Error::ShapeMismatch);
    }
    let st = parts(state, &shape)?;
    if workspace.len() < stream_feed_workspace_size(&shape, c)? {
        return Err(Error::WorkspaceTooSmall);
    }
    // positions: >= 0, non-decreasing within the chunk and after the last one fed
    let mut prev = st.head[H_LAST].saturating_sub(1) as i64;
    for &p in positions {
        if p < 0 || p < prev {
            return Err(Error::InvalidArgument);
        }
        prev = p;
    }
    let rows = hq * c;
    if let Some(l) = row_lse {
        if l.len() != rows {
            return Err(Error::ShapeMismatch);
        }
        if l.iter().any(|v| !v.is_finite()) {
            return Err(Error::NonFinite);
        }
    }
    let mut ws = Workspace::new(workspace);
    let lim = ws.take::<u64>(c)?;
    for (l, &p) in lim.iter_mut().zip(positions) {
        *l = (p as u64).min(shape.n as u64 - 1);
    }
    let Parts {
        head,
        seen,
        max,
        sum,
        sq,
    } = st;
    accumulate(queries, lim, keys, row_lse, max, sum, sq, ws.into_rest())?;
    for &l in lim.iter() {
        seen[l as usize] += 1;
    }
    head[H_QUERIES] += c as u64;
    head[H_LAST] = positions[c - 1] as u64 + 1;
    Ok(())
}

/// Workspace bytes of [`accumulate`] for `rows = Hq·c` rows of a group of `g`.
pub(crate) fn accumulate_workspace_size(hq: usize, g: usize, c: usize, dk: usize) -> Result<usize> {
    let rows = mul(hq, c)?;
    let mut ws = WorkspaceSize::new();
    ws.add::<f32>(rows)?; // row max (or lse)
    ws.add::<f64>(rows)?; // row denominators
    let mut scratch = WorkspaceSize::new();
    window::scratch_size(&mut scratch, g, c, dk)?;
    add(ws.total(), scratch.total())
}

/// The arithmetic of one feed: queries `[Hq, c, dk]` whose last visible keys are
/// `lim[c]` (non-decreasing, `< N`), keys `[Hkv, N, dk]`, optional `row_lse` (`[Hq][c]`,
/// finite, checked by the caller); adds the column statistics into `max`, `sum`, `sq`
/// (`[Hq][N]` each). Everything that can fail (NaN/Inf in the queries or the visible keys)
/// is checked before the first write. `workspace`: [`accumulate_workspace_size`].
pub(crate) fn accumulate(
    queries: &View,
    lim: &[u64],
    keys: &View,
    row_lse: Option<&[f32]>,
    max: &mut [f32],
    sum: &mut [f32],
    sq: &mut [f32],
    workspace: &mut [u8],
) -> Result<()> {
    let [hkv, n, dk] = keys.extent();
    let [hq, c, _] = queries.extent();
    let g = hq / hkv;
    let rows = hq * c;
    let mut ws = Workspace::new(workspace);
    let rmax = ws.take::<f32>(rows)?;
    let rsum = ws.take::<f64>(rows)?;
    let last = lim[c - 1] as usize;
    let scratch = ws.into_rest();

    // pass 1 (or the caller's row statistics): everything that can fail, before any write
    for kh in 0..hkv {
        let (m, s) = (
            &mut rmax[kh * g * c..(kh + 1) * g * c],
            &mut rsum[kh * g * c..(kh + 1) * g * c],
        );
        let sc =
            &mut window::load_queries(queries, kh, g, c, dk, &mut Workspace::new(&mut *scratch))?;
        match row_lse {
            Some(l) => {
                m.copy_from_slice(&l[kh * g * c..(kh + 1) * g * c]);
                s.fill(1.0);
                check_keys(keys, kh, last, sc)?;
            }
            None => row_stats(keys, kh, lim, sc, m, s)?,
        }
    }
    // pass 2: column statistics (cannot fail)
    for kh in 0..hkv {
        let sc =
            &mut window::load_queries(queries, kh, g, c, dk, &mut Workspace::new(&mut *scratch))?;
        for r in 0..g * c {
            sc.m[r] = rmax[kh * g * c + r];
            sc.inv[r] = (1.0 / rsum[kh * g * c + r]) as f32;
        }
        let o = kh * g * n..(kh + 1) * g * n;
        let mut out = Cols {
            max: &mut max[o.clone()],
            sum: &mut sum[o.clone()],
            sq: &mut sq[o],
        };
        column_stats(keys, kh, g, lim, sc, &mut out);
    }
    Ok(())
}

/// Rows of the chunk (of `c = lim.len()`) that cannot see key `i`: those before the first
/// query whose last visible key is `>= i` (`lim` is non-decreasing).
#[inline(always)]
fn hidden(lim: &[u64], i: usize) -> usize {
    lim.partition_point(|&l| (l as usize) < i)
}

/// `-inf` on the logits of `s.c` (keys `c0..c0+nt`) that their query cannot see.
#[inline(always)]
fn mask(s: &mut Scratch, g: usize, lim: &[u64], c0: usize, nt: usize) {
    let (c, rp) = (lim.len(), s.rows_pad);
    for t in 0..nt {
        let hide = hidden(lim, c0 + t);
        if hide == 0 {
            continue;
        }
        for a in 0..g {
            s.c[t * rp + a * c..t * rp + a * c + hide].fill(f32::NEG_INFINITY);
        }
    }
}

/// NaN/Inf in keys `0..=last` of KV head `kh` (what a feed with `row_lse` reads).
fn check_keys(keys: &View, kh: usize, last: usize, s: &mut Scratch) -> Result<()> {
    dispatch!(fn(keys: &View, kh: usize, last: usize, s: &mut Scratch) -> Result<()>, S => {
        let mut c0 = 0;
        while c0 <= last {
            let nt = CHUNK.min(last + 1 - c0);
            let (_, _, finite) = window::load_keys::<S>(keys, kh, c0, nt, nt, s.k, true);
            if !finite {
                return Err(Error::NonFinite);
            }
            c0 += nt;
        }
        Ok(())
    })
}

/// Pass 1 for KV group `kh`: row max and denominator of every row over its visible keys.
fn row_stats(
    keys: &View,
    kh: usize,
    lim: &[u64],
    s: &mut Scratch,
    rmax: &mut [f32],
    rsum: &mut [f64],
) -> Result<()> {
    dispatch!(fn(keys: &View, kh: usize, lim: &[u64], s: &mut Scratch, rmax: &mut [f32],
                 rsum: &mut [f64]) -> Result<()>, S => {
        let g = s.rows / lim.len();
        let end = lim[lim.len() - 1] as usize + 1;
        window::start_rows(s, rmax, rsum);
        let mut c0 = 0;
        while c0 < end {
            let nt = CHUNK.min(end - c0);
            if !chunk_logits::<S>(keys, kh, g, lim, c0, nt, true, s) {
                return Err(Error::NonFinite);
            }
            window::fold_rows::<S>(s, nt, rmax, rsum)?;
            c0 += nt;
        }
        window::check_denominators(rsum)
    })
}

/// The masked logits of keys `c0 .. c0+nt` of KV head `kh` into `s.c` (one chunk of both
/// passes); with `check`, whether every key element was finite.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn chunk_logits<S: Simd>(
    keys: &View,
    kh: usize,
    g: usize,
    lim: &[u64],
    c0: usize,
    nt: usize,
    check: bool,
    s: &mut Scratch,
) -> bool {
    let ntp = nt.div_ceil(KT) * KT;
    let (kp, ldk, finite) = window::load_keys::<S>(keys, kh, c0, nt, ntp, s.k, check);
    if !finite {
        return false;
    }
    let rp = s.rows_pad;
    let in_place = kp != s.k.as_ptr();
    // SAFETY: load_keys returns ntp rows of dk floats, ldk apart.
    unsafe {
        window::gemm::<S>(
            s.q,
            s.dk,
            rp,
            kp,
            ldk,
            ntp,
            &mut s.c[..ntp * rp],
            in_place,
            window::Pf::NONE,
        )
    };
    mask(s, g, lim, c0, nt);
    true
}

/// One KV group's statistics in the state, `[g][N]` each.
struct Cols<'s> {
    max: &'s mut [f32],
    sum: &'s mut [f32],
    sq: &'s mut [f32],
}

/// Pass 2 for KV group `kh`: add the chunk's column statistics of every visible key.
fn column_stats(keys: &View, kh: usize, g: usize, lim: &[u64], s: &mut Scratch, out: &mut Cols) {
    dispatch!(fn(keys: &View, kh: usize, g: usize, lim: &[u64], s: &mut Scratch,
                 out: &mut Cols) -> (), S => {
        let c = lim.len();
        let n = keys.extent()[1];
        let end = lim[c - 1] as usize + 1;
        let rp = s.rows_pad;
        let mut c0 = 0;
        while c0 < end {
            let nt = CHUNK.min(end - c0);
            chunk_logits::<S>(keys, kh, g, lim, c0, nt, false, s);
            window::probabilities::<S>(s, nt);
            for t in 0..nt {
                // rows that cannot see the key hold exact zeros: skip them
                let hide = hidden(lim, c0 + t);
                let row = &s.c[t * rp..t * rp + g * c];
                for a in 0..g {
                    let pa = &row[a * c + hide..(a + 1) * c];
                    let o = a * n + c0 + t;
                    // SAFETY: plain slice reads.
                    let (s1, s2, m) = unsafe { col_stats::<S>(pa, out.max[o]) };
                    out.sum[o] += s1;
                    out.sq[o] += s2;
                    out.max[o] = m;
                }
            }
            c0 += nt;
        }
    })
}

/// `(Σx, Σx², max(m0, max x))` of one column segment in one sweep, 8 lanes at a time (the
/// sums in the order of `sum_v` / `dot_v`).
#[inline(always)]
unsafe fn col_stats<S: Simd>(x: &[f32], m0: f32) -> (f32, f32, f32) {
    // SAFETY: `S`'s CPU features are present (the `Simd` contract, kept by our callers); the loads
    // read `x[i..i + 8]` with `i + 8 <= n8 <= x.len()`.
    unsafe {
        let n8 = x.len() / 8 * 8;
        let p = x.as_ptr();
        let (mut s, mut q, mut m) = (S::zero(), S::zero(), S::splat(m0));
        let mut i = 0;
        while i < n8 {
            let v = S::load(p.add(i));
            s = S::add(s, v);
            q = S::fma(v, v, q);
            m = S::max(m, v);
            i += 8;
        }
        let mut lanes = [0f32; 8];
        S::store(lanes.as_mut_ptr(), m);
        let (mut s, mut q) = (S::hsum(s), S::hsum(q));
        let mut m = lanes.iter().fold(m0, |a, &b| if b > a { b } else { a });
        for &v in &x[n8..] {
            s += v;
            q += v * v;
            m = if v > m { v } else { m };
        }
        (s, q, m)
    }
}

/// Workspace bytes [`stream_scores`] needs.
pub fn stream_scores_workspace_size(shape: &StreamShape) -> Result<usize> {
    shape.validate()?;
    let n = shape.n;
    let mut ws = WorkspaceSize::new();
    ws.add::<f32>(mul(shape.group(), n)?)?; // per-head statistic of one group
    ws.add::<f32>(n)?; // pool scratch
    ws.add::<f32>(n)?; // value forms of one head
    ws.add::<u64>(n)?; // queries that see each key
    ws.add::<f32>(mul(shape.hkv, n)?)?; // staged scores
    Ok(ws.total())
}

/// Floats [`stream_scores`] writes: `Hkv·N`.
pub fn stream_scores_len(shape: &StreamShape) -> Result<usize> {
    shape.validate()?;
    mul(shape.hkv, shape.n)
}

/// The raw statistics of a state, for callers that finish them their own way (or check
/// a device's accumulators): `[Hq][N]` each, `seen[i]` the fed queries whose last visible
/// key is `i` (so `Σ_{i' >= i} seen[i']` queries saw key `i`).
#[derive(Clone, Copy, Debug)]
pub struct StreamStats<'s> {
    pub shape: StreamShape,
    pub queries: u64,
    pub seen: &'s [u64],
    pub max: &'s [f32],
    pub sum: &'s [f32],
    pub sq: &'s [f32],
}

/// Borrow the statistics of an initialised state (8-byte aligned).
pub fn stream_stats(state: &[u8]) -> Result<StreamStats<'_>> {
    let shape = stream_shape(state)?;
    let queries = stream_query_count(state)?;
    if state.len() < stream_state_size(&shape)? {
        return Err(Error::InvalidArgument);
    }
    if state.as_ptr() as usize % 8 != 0 {
        return Err(Error::Misaligned);
    }
    let (n, hn) = (shape.n, shape.hq * shape.n);
    // SAFETY: the length and 8-byte alignment are checked above; read-only views of
    // plain numbers, laid out as `parts` carves them.
    unsafe {
        let b = state.as_ptr().add(HEADER_WORDS * 8);
        let f = b.add(n * 8) as *const f32;
        Ok(StreamStats {
            shape,
            queries,
            seen: core::slice::from_raw_parts(b as *const u64, n),
            max: core::slice::from_raw_parts(f, hn),
            sum: core::slice::from_raw_parts(f.add(hn), hn),
            sq: core::slice::from_raw_parts(f.add(2 * hn), hn),
        })
    }
}

/// Finish a stream into `out[kh*N + i]` for every KV head and key (module docs). Reads
/// `state` only; `values` only for [`StreamStat::LaProx`]. `out` is written only on
/// success. `Mean` and `LaProx` on a state that has seen no query give `InvalidArgument`.
pub fn stream_scores(
    state: &[u8],
    cfg: &StreamScoreConfig,
    values: &StreamValues,
    out: &mut [f32],
    workspace: &mut [u8],
) -> Result<()> {
    cfg.validate()?;
    let st = stream_stats(state)?;
    let shape = st.shape;
    let (hkv, n, g) = (shape.hkv, shape.n, shape.group());
    let total = stream_scores_len(&shape)?;
    if out.len() < total {
        return Err(Error::OutputTooSmall);
    }
    if workspace.len() < stream_scores_workspace_size(&shape)? {
        return Err(Error::WorkspaceTooSmall);
    }
    let queries = st.queries;
    if queries == 0 && cfg.stat != StreamStat::Max {
        return Err(Error::InvalidArgument);
    }
    let (seen, max, sum, sq) = (st.seen, st.max, st.sum, st.sq);
    if cfg.stat == StreamStat::LaProx {
        check_values(values, &shape)?;
    }
    let mut ws = Workspace::new(workspace);
    let per = ws.take::<f32>(g * n)?;
    let tmp = ws.take::<f32>(n)?;
    let forms = ws.take::<f32>(n)?;
    let vis = ws.take::<u64>(n)?;
    let stage = ws.take::<f32>(hkv * n)?;
    // queries that see key i: those whose last visible key is >= i
    let mut acc = 0u64;
    for i in (0..n).rev() {
        acc += seen[i];
        vis[i] = acc;
    }
    let inv_q = 1.0 / queries.max(1) as f32;
    for kh in 0..hkv {
        for a in 0..g {
            let h = kh * g + a;
            let src = h * n..(h + 1) * n;
            let dst = &mut per[a * n..(a + 1) * n];
            match cfg.stat {
                StreamStat::Max => dst.copy_from_slice(&max[src]),
                StreamStat::Mean => {
                    for (d, &s) in dst.iter_mut().zip(&sum[src]) {
                        *d = s * inv_q;
                    }
                }
                StreamStat::MeanVisible => {
                    for ((d, &s), &v) in dst.iter_mut().zip(&sum[src]).zip(vis.iter()) {
                        *d = if v == 0 { 0.0 } else { s / v as f32 };
                    }
                }
                StreamStat::LaProx => {
                    for (d, &s) in dst.iter_mut().zip(&sq[src]) {
                        *d = libm::sqrtf(s);
                    }
                }
            }
            pool_in_place(&cfg.pool, dst, tmp);
            if cfg.stat == StreamStat::LaProx {
                value_forms(values, &shape, kh, a, forms);
                for (d, &f) in dst.iter_mut().zip(forms.iter()) {
                    *d *= libm::sqrtf(f.max(0.0));
                }
            }
        }
        let row = &mut stage[kh * n..(kh + 1) * n];
        reduce_rows(cfg.gqa, per, g, n, row);
        pool_in_place(&cfg.post_pool, row, tmp);
    }
    if stage.iter().any(|v| !v.is_finite()) {
        return Err(Error::NonFinite);
    }
    out[..total].copy_from_slice(stage);
    Ok(())
}

/// LaProx's value inputs: present, of the `cross = false` layout, finite.
fn check_values(v: &StreamValues, shape: &StreamShape) -> Result<()> {
    if let Some(f) = v.value_forms {
        if v.values.is_some() || v.gram.is_some() {
            return Err(Error::InvalidArgument); // one value term, never one ignored
        }
        if f.len() != gram::value_forms_len(shape.hq, shape.hkv, shape.n, false)? {
            return Err(Error::ShapeMismatch);
        }
        if f.iter().any(|x| !x.is_finite()) {
            return Err(Error::NonFinite);
        }
        return Ok(());
    }
    let (Some(values), Some(gr)) = (v.values.as_ref(), v.gram) else {
        return Err(Error::NullPointer);
    };
    let [vh, vn, dv] = values.extent();
    if vh != shape.hkv || vn != shape.n || dv > 1024 {
        return Err(Error::ShapeMismatch);
    }
    if gr.len() != gram::gram_len(shape.hq, shape.hkv, dv, false)? {
        return Err(Error::ShapeMismatch);
    }
    if gr.iter().any(|x| !x.is_finite()) || !gram::values_finite(values, 0, shape.n) {
        return Err(Error::NonFinite);
    }
    Ok(())
}

/// `dst[i] = ||v_i Wo_h||²` for head `a` of KV group `kh`.
fn value_forms(v: &StreamValues, shape: &StreamShape, kh: usize, a: usize, dst: &mut [f32]) {
    let (g, n) = (shape.group(), shape.n);
    if let Some(f) = v.value_forms {
        dst.copy_from_slice(&f[(kh * g + a) * n..(kh * g + a + 1) * n]);
    } else if let (Some(values), Some(gr)) = (v.values.as_ref(), v.gram) {
        let dv = values.extent()[2];
        let blk = &gr[(kh * g + a) * dv * dv..(kh * g + a + 1) * dv * dv];
        gram::quad_forms(values, kh, blk, 0, n, dst);
    }
}
