//! Cells the engine marks (design §3c, issue 28): the text the user supplied (user turns,
//! the system prompt), which the queries of later, unrelated turns never attend to, so no
//! query-based score keeps it. The engine passes a round's marks
//! ([`super::Evictor::mark_cells`]) with a share `s` of the kept cells reserved for them.
//!
//! The rule, over the round's prefix cells (the window is kept as always) with the
//! selection's prefix budget `B` (per selection unit, clamped to the prefix): `M` marked,
//! `U` unmarked prefix cells. When `s = 0`, `B = 0`, or `M` or `U` is empty, the plain
//! selection runs (bit-identical to a round without marks). Otherwise the budget splits:
//! `b_u = min(B − min(⌊s·B⌋, M), U)` for the unmarked cells and `b_m = min(B − b_u, M)` for
//! the marked ones (a part with fewer cells than its share gives the rest to the other), and
//! the method's own selection runs twice, unchanged: over the marked prefix cells alone
//! (window 0, budget `b_m`) and over the unmarked prefix cells followed by the window
//! (budget `b_u`), each on the scores of its cells in position order (value links gathered
//! with them: a link then joins a cell to the previous cell of its part). The kept set is
//! the union, `b_m + b_u <= B` prefix cells a unit.
//!
//! Opt-in ([`MarkSplit::Spans`], issue 28's ninth pass): the marked part's budget `b_m` is
//! split evenly over the marked spans (each run of consecutive prefix cells with the same
//! nonzero mark: by position, the cells of one of the engine's ranges, a user turn each)
//! instead of one selection over all marked cells, so a newer turn's cells
//! cannot crowd every cell of an older one out. Span `s` of `len_s` cells gets
//! `min(len_s, t)` with `t` the largest level whose sum over the spans fits `b_m`, and the
//! rest, one cell each, goes to the first (oldest) spans longer than `t`
//! ([`span_budgets`]); the method's selection then runs over each span alone (window 0,
//! its budget), and the marked part is the spans' union. Two ranges stay two spans when
//! the unmarked text between them is all evicted (as it is with share 1 once the marked
//! text is more than the budget: with plain runs of marked cells every kept turn would then
//! be one span, the newest turns each as large a part as all older ones together; design
//! §3c, tenth pass); flags given per cell name their spans by value. The default
//! ([`MarkSplit::Share`]) is the rule above, unchanged (it reads only nonzero).

/// The share of the kept cells reserved for marked cells that engines pass by default
/// (`KVE_MARK_SHARE_DEFAULT`), chosen on the conversation benchmark's dev split
/// (`eval/decode/`, design §3c: SmolLM2-135M, 128 cells, `uniqueness` with 0.25 / 0.5 /
/// 0.75 / 0.9 / 1 and `laprox-span` with 0.25 / 0.5 / 0.75 / 0.9 / 1: 0.75 with `uniqueness`
/// chose the most facts over the three checkpoints).
pub const MARK_SHARE: f32 = 0.75;

/// How the marked cells' budget is spent (design §3c).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MarkSplit {
    /// One selection over all marked cells (the default).
    #[default]
    Share,
    /// The marked budget split evenly over the marked spans (runs of consecutive cells
    /// with the same nonzero mark), one selection each ([`span_budgets`]).
    Spans,
}

/// The level `t` of [`span_budgets`]: the largest `t` with `Σ min(len_s, t) <= budget`
/// (the longest span's length when every span fits).
fn span_level<I: Iterator<Item = u64>>(budget: u64, lens: impl Fn() -> I) -> u64 {
    let fill = |t: u64| lens().map(|l| l.min(t)).sum::<u64>();
    let (mut lo, mut hi) = (0u64, lens().max().unwrap_or(0));
    if fill(hi) <= budget {
        return hi;
    }
    // fill(lo) <= budget < fill(hi)
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fill(mid) <= budget {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The budgets of spans of `lens` cells sharing `budget` ([`MarkSplit::Spans`]) into
/// `out` (as long as `lens`): each `min(len, t)` at the level `t` where they fill
/// `budget`, and the rest one each to the first spans longer than `t`. Their sum is
/// `min(budget, Σ lens)`.
pub fn span_budgets(budget: u64, lens: &[u64], out: &mut [u64]) {
    let t = span_level(budget, || lens.iter().copied());
    let mut rest = budget - lens.iter().map(|&l| l.min(t)).sum::<u64>().min(budget);
    for (o, &l) in out.iter_mut().zip(lens) {
        *o = l.min(t);
        if l > t && rest > 0 {
            *o += 1;
            rest -= 1;
        }
    }
}

/// The runs `(first cell, cells)` of consecutive cells with the same nonzero mark among
/// `marked`.
fn spans(marked: &[u8]) -> impl Iterator<Item = (usize, usize)> + Clone + '_ {
    let mut i = 0;
    core::iter::from_fn(move || {
        while i < marked.len() && marked[i] == 0 {
            i += 1;
        }
        let a = i;
        while i < marked.len() && marked[i] != 0 && marked[i] == marked[a] {
            i += 1;
        }
        (i > a).then_some((a, i - a))
    })
}

use crate::budget::{ModelScores, ValueLinks};
use crate::config::SelectConfig;
use crate::error::{mul, Error, Result};
use crate::workspace::{Workspace, WorkspaceSize};

/// The two parts' budgets `(b_m, b_u)` of a round with prefix budget `budget`, or `None`
/// when the plain selection runs.
pub fn split_budget(budget: u64, share: f32, marked: u64, unmarked: u64) -> Option<(u64, u64)> {
    if share <= 0.0 || budget == 0 || marked == 0 || unmarked == 0 {
        return None;
    }
    let b = budget.min(marked + unmarked);
    // The product is non-negative, so the cast's truncation is the floor (core has no `floor`).
    let reserved = (((share as f64) * (b as f64)) as u64).min(marked);
    let bu = (b - reserved.min(b)).min(unmarked);
    Some(((b - bu).min(marked), bu))
}

/// Workspace bytes of [`select_marked`] for `units` selection units of at most `n` cells
/// with window `w` (the selection's own workspace inside).
pub(crate) fn marked_workspace_size(
    cfg: &SelectConfig,
    layers: usize,
    hkv: usize,
    n: usize,
    w: usize,
) -> Result<usize> {
    let units = mul(layers, hkv)?;
    let mut s = WorkspaceSize::new();
    s.add::<f32>(mul(units, n)?)?; // a part's gathered scores
    s.add::<u32>(n)?; // the part's cells
    s.add::<f32>(n)?; // its gathered link sums
    for _ in 0..2 {
        s.add::<u64>(units + 1)?;
        s.add::<u32>(mul(units, n)?)?;
    }
    let sel = crate::select_workspace_size(cfg, layers, hkv, n, w)?;
    s.total().checked_add(sel).ok_or(Error::Overflow)
}

/// One part's selection: the cells `cols` (ascending; the last `window` of them the
/// round's window) with their scores gathered, to `budget`; its lists (cells of the round)
/// into `offsets`/`indices` (the first `units + 1`, and `offsets[units]` entries).
#[allow(clippy::too_many_arguments)]
fn part(
    cfg: &SelectConfig,
    m: &ModelScores,
    links: Option<ValueLinks>,
    cols: &[u32],
    window: usize,
    budget: u64,
    offsets: &mut [u64],
    indices: &mut [u32],
    ws: &mut [u8],
) -> Result<()> {
    let (units, p, k) = (m.layers * m.hkv, m.prefix(), cols.len());
    let kp = k - window;
    let mut ws = Workspace::new(ws);
    let scores = ws.take_dirty::<f32>(units * kp)?;
    let sums = ws.take_dirty::<f32>(if links.is_some() { k } else { 0 })?;
    let rest = ws.into_rest();
    for u in 0..units {
        for (j, &c) in cols[..kp].iter().enumerate() {
            scores[u * kp + j] = m.scores[u * p + c as usize];
        }
    }
    let mut c = *cfg;
    c.budget = budget;
    let pm = ModelScores {
        scores,
        layers: m.layers,
        hkv: m.hkv,
        n: k,
        window,
    };
    match links {
        Some(l) => {
            for (s, &c) in sums.iter_mut().zip(cols) {
                *s = l.sums[c as usize];
            }
            let l = ValueLinks {
                sums,
                threshold: l.threshold,
            };
            crate::select_model_linked(&c, &pm, l, offsets, indices, rest)?;
        }
        None => crate::select_model(&c, &pm, offsets, indices, rest)?,
    }
    for i in &mut indices[..offsets[units] as usize] {
        *i = cols[*i as usize];
    }
    Ok(())
}

/// The selection of a round with marks (`marked[i] != 0` for the round's cells `i < m.n`;
/// `share` in [0, 1]): writes the kept lists as [`crate::select_model`] does and returns
/// `true`, or returns `false` (nothing written) when the rule says the plain selection.
pub(crate) fn select_marked(
    cfg: &SelectConfig,
    m: &ModelScores,
    links: Option<ValueLinks>,
    marked: &[u8],
    share: f32,
    split: MarkSplit,
    offsets: &mut [u64],
    indices: &mut [u32],
    ws: &mut [u8],
) -> Result<bool> {
    let (n, p) = (m.n, m.prefix());
    let w = n - p;
    let mk = marked[..p].iter().filter(|&&x| x != 0).count();
    let Some((bm, bu)) = split_budget(cfg.budget, share, mk as u64, (p - mk) as u64) else {
        return Ok(false);
    };
    let units = m.layers * m.hkv;
    let mut ws = Workspace::new(ws);
    let cols = ws.take_dirty::<u32>(n)?;
    let o1 = ws.take_dirty::<u64>(units + 1)?;
    let i1 = ws.take_dirty::<u32>(units * n)?;
    let o2 = ws.take_dirty::<u64>(units + 1)?;
    let i2 = ws.take_dirty::<u32>(units * n)?;
    let rest = ws.into_rest();
    // the marked part: its prefix cells, no window
    match split {
        MarkSplit::Share => {
            let mut k = 0;
            for i in 0..p {
                if marked[i] != 0 {
                    cols[k] = i as u32;
                    k += 1;
                }
            }
            part(cfg, m, links, &cols[..k], 0, bm, o1, i1, rest)?;
        }
        MarkSplit::Spans => {
            let sp = spans(&marked[..p]);
            let t = span_level(bm, || sp.clone().map(|(_, l)| l as u64));
            let mut extra = bm - sp.clone().map(|(_, l)| (l as u64).min(t)).sum::<u64>();
            o1.fill(0);
            for (a, len) in sp {
                let mut b = (len as u64).min(t);
                if len as u64 > t && extra > 0 {
                    b += 1;
                    extra -= 1;
                }
                if b == 0 {
                    continue;
                }
                for (j, c) in cols[..len].iter_mut().enumerate() {
                    *c = (a + j) as u32;
                }
                // the span's lists into the output, appended per unit to the part's (the
                // span's cells follow every earlier span's): from the last unit down, so
                // no list is overwritten before it moves
                part(cfg, m, links, &cols[..len], 0, b, offsets, indices, rest)?;
                let add = offsets[units];
                for u in (0..units).rev() {
                    let (s0, s1) = (o1[u] as usize, o1[u + 1] as usize);
                    let to = s0 + offsets[u] as usize;
                    i1.copy_within(s0..s1, to);
                    let (t0, t1) = (offsets[u] as usize, offsets[u + 1] as usize);
                    i1[to + s1 - s0..to + s1 - s0 + t1 - t0].copy_from_slice(&indices[t0..t1]);
                }
                for u in 0..units {
                    o1[u] += offsets[u];
                }
                o1[units] += add;
            }
        }
    }
    // the unmarked part: its prefix cells, then the window
    let mut k = 0;
    for i in 0..n {
        if i >= p || marked[i] == 0 {
            cols[k] = i as u32;
            k += 1;
        }
    }
    part(cfg, m, links, &cols[..k], w, bu, o2, i2, rest)?;
    // per unit, the two ascending lists merged
    let total = (o1[units] + o2[units]) as usize;
    if offsets.len() < units + 1 || indices.len() < total {
        return Err(Error::OutputTooSmall);
    }
    let mut o = 0usize;
    for u in 0..units {
        offsets[u] = o as u64;
        let a = &i1[o1[u] as usize..o1[u + 1] as usize];
        let b = &i2[o2[u] as usize..o2[u + 1] as usize];
        let (mut x, mut y) = (0, 0);
        while x < a.len() || y < b.len() {
            let take_a = y == b.len() || (x < a.len() && a[x] < b[y]);
            indices[o] = if take_a { a[x] } else { b[y] };
            if take_a {
                x += 1;
            } else {
                y += 1;
            }
            o += 1;
        }
    }
    offsets[units] = o as u64;
    Ok(true)
}
