//! Twin lists carried from one decode round to the next (design §3c, issue 28's cost).
//!
//! Under a cell budget a sequence is scored again at every eviction, and three quarters of
//! its cells were there the round before: comparing every pair again (the all-pairs search
//! most heads take) repeats what the last round knew. Each cell keeps instead its [`KEEP`]
//! most similar partners (`min(ck, cv)` and the partner's cell) and a *bound* `b`: every
//! partner not in the list is at most `b` similar. Then:
//! - an eviction drops the dead partners from each list ([`remap`]), `b` unchanged;
//! - a round compares only the pairs with a new cell (every pair `(i, j)`, `j ≥ held`,
//!   once), offering each to both lists;
//! - a cell whose list's 4th value is at or past [`TWIN_CUTOFF`] is settled (score 0,
//!   whatever its exact 4th twin), one whose 4th value is at least `b` has that value as
//!   its exact 4th twin (nothing outside the list can be larger), and only the others
//!   (their twins evicted) are compared again with every cell ("rescans");
//! - a full list raises `b` to its last value (what was turned away or pushed out this
//!   round is at most that), and a pair at or under `b` below the cutoff is turned away
//!   without a change of it ([`gate_of`]: else a list that lost partners would take
//!   every new pair until full).
//!
//! Each pair's similarity is the same tile arithmetic as [`super::kth_similarity`]'s (one
//! FMA chain a pair, the same bits whichever cell is the row), so the floors — and the
//! scores — equal the plain search's bit for bit (`uniqueness.rs`'s tests, over many
//! rounds; `tests/uniqueness_carry.rs` through the evictor). Measured on SmolLM2's decode
//! rounds at 512 cells before building it (a probe, not kept): 25–31 % of a round's cells
//! new, 4 % of the old cells settled with their twins evicted, and of the old open cells
//! 2.7 % with fewer than 4 of an 8-entry list left (57 % of a 4-entry one).

use super::{
    pairs_after, panel_at, row_tile, tile, value_pass, Simd, PANEL, ROWS, TWIN_CUTOFF, TWIN_RANK,
};

/// Entries of a cell's list (8: the probe above; 4 would rescan most open cells).
pub(crate) const KEEP: usize = 8;
/// `u32` words a cell: [`KEEP`] values (`f32` bits, descending, −∞ padded), [`KEEP`]
/// partner cells, the bound.
pub(crate) const WORDS: usize = 2 * KEEP + 1;
const NO_CELL: u32 = u32::MAX;
const BOUND: usize = 2 * KEEP;

#[inline(always)]
fn value(l: &[u32], k: usize) -> f32 {
    f32::from_bits(l[k])
}

/// An empty list that knows every partner (bound −∞).
#[inline(always)]
fn clear(l: &mut [u32]) {
    l[..KEEP].fill(f32::NEG_INFINITY.to_bits());
    l[KEEP..BOUND].fill(NO_CELL);
    l[BOUND] = f32::NEG_INFINITY.to_bits();
}

/// What a pair must beat to enter list `l`: its last value, or its bound below the cutoff
/// (a partner turned away at or under the bound needs no change of it; one at the cutoff
/// may still settle the cell).
#[inline(always)]
fn gate_of(l: &[u32]) -> f32 {
    let below = f32::from_bits(TWIN_CUTOFF.to_bits() - 1);
    value(l, KEEP - 1).max(value(l, BOUND).min(below))
}

/// Puts partner `j` at similarity `v` into list `l` when `v` beats its gate, and keeps
/// the gate ([`gate_of`]).
#[inline(always)]
fn offer(l: &mut [u32], gate: &mut f32, v: f32, j: usize) {
    if v <= *gate {
        return;
    }
    let mut k = KEEP - 1;
    while k > 0 && value(l, k - 1) < v {
        l[k] = l[k - 1];
        l[KEEP + k] = l[KEEP + k - 1];
        k -= 1;
    }
    l[k] = v.to_bits();
    l[KEEP + k] = j as u32;
    *gate = gate_of(l);
}

/// The cell's floor once every pair of the round was offered, or `None` when its list no
/// longer decides it (rescan); a full list's bound rises to its last value.
#[inline(always)]
fn finish(l: &mut [u32]) -> Option<f32> {
    let (v4, b) = (value(l, TWIN_RANK - 1), value(l, BOUND));
    let last = value(l, KEEP - 1);
    if last > f32::NEG_INFINITY {
        l[BOUND] = b.max(last).to_bits();
    }
    if v4 >= TWIN_CUTOFF {
        Some(v4)
    } else if v4 >= b {
        // nothing outside the list beats b <= v4; −1 where fewer than 4 (the plain search's)
        Some(v4.max(-1.0))
    } else {
        None
    }
}

/// After a selection: cell `j` of the next round is `kept[j]` (ascending) of this one.
/// Moves the kept cells' lists to the front, each without its evicted partners and with
/// the others renumbered (bounds unchanged: an eviction only removes partners).
pub(crate) fn remap(lists: &mut [u32], kept: &[u32]) {
    for (j, &src) in kept.iter().enumerate() {
        let src = src as usize;
        let mut old = [0u32; WORDS];
        old.copy_from_slice(&lists[src * WORDS..(src + 1) * WORDS]);
        let l = &mut lists[j * WORDS..(j + 1) * WORDS];
        clear(l);
        l[BOUND] = old[BOUND];
        let mut k = 0;
        for e in 0..KEEP {
            if old[KEEP + e] == NO_CELL {
                break;
            }
            if let Ok(to) = kept.binary_search(&old[KEEP + e]) {
                l[k] = old[e];
                l[KEEP + k] = to as u32;
                k += 1;
            }
        }
    }
}

/// `floor[i]` for `i < n`, as [`super::twin_floors`] gives it, from `lists` (`n·WORDS`
/// words): cells `0..held` carry theirs from the last round ([`remap`]), the others are new.
/// Leaves every cell's list valid for the next round. `gate` holds `n16` floats.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn carried_floors<S: Simd>(
    kp: &[f32],
    vp: &[f32],
    n: usize,
    held: usize,
    dk: usize,
    dv: usize,
    floor: &mut [f32],
    gate: &mut [f32],
    lists: &mut [u32],
) {
    let n16 = floor.len();
    assert!(n16 % PANEL == 0 && n16 >= n && gate.len() >= n16 && held <= n);
    assert!(kp.len() >= n16 * dk && vp.len() >= n16 * dv && lists.len() >= n * WORDS);
    if n == 0 {
        return;
    }
    for l in lists[held * WORDS..n * WORDS].chunks_exact_mut(WORDS) {
        clear(l);
    }
    for (g, l) in gate.iter_mut().zip(lists[..n * WORDS].chunks_exact(WORDS)) {
        *g = gate_of(l);
    }
    gate[n..n16].fill(f32::INFINITY);
    let (kb, vb) = (kp.as_ptr(), vp.as_ptr());
    // every pair (i, j) with i < j and j new, once: row tiles over all cells, the panels
    // holding new cells past the row tile
    // the new cells' rows first: their pairs among themselves (near each other, likelier
    // twins) raise their gates before the old cells' rows are compared with them
    let split = held / ROWS * ROWS;
    let tiles = (split..n).step_by(ROWS).chain((0..split).step_by(ROWS));
    for i0 in tiles {
        let (ri, kr, vr) = row_tile((kb, vb), (dk, dv), i0, n);
        let first = held.max(i0) / PANEL * PANEL;
        for j0 in (first..n).step_by(PANEL) {
            let new: u32 = 0xffff & !((1u32 << held.saturating_sub(j0).min(PANEL)) - 1);
            // SAFETY: rows and panel inside kp/vp, gate[j0 .. j0 + 16] inside gate (asserted).
            unsafe {
                let ck = tile::<S, ROWS>(&kr, kb.add(j0 * dk), dk);
                let gp = gate.as_ptr();
                let b = [S::load(gp.add(j0)), S::load(gp.add(j0 + 8))];
                let mut hits = [0u32; ROWS];
                for r in 0..ROWS {
                    // only a pair whose key cosine beats one of the two gates can enter a list
                    let br = S::splat(gate[ri[r]]);
                    let hit = S::gt_mask(ck[r][0], S::min(br, b[0]))
                        | S::gt_mask(ck[r][1], S::min(br, b[1])) << 8;
                    hits[r] = hit & new & pairs_after(i0 + r, j0, n);
                }
                let mut m = [[0f32; PANEL]; ROWS];
                let (sel, ns) = value_pass::<S>(&ck, &hits, &vr, vb.add(j0 * dv), dv, &mut m);
                for &r in &sel[..ns] {
                    // vector compares against the gates first: most pairs enter no list
                    let i = ri[r];
                    let x = [S::load(m[r].as_ptr()), S::load(m[r].as_ptr().add(8))];
                    let gp = gate.as_ptr();
                    let mut bits = (S::gt_mask(x[0], S::load(gp.add(j0)))
                        | S::gt_mask(x[1], S::load(gp.add(j0 + 8))) << 8)
                        & hits[r];
                    while bits != 0 {
                        let j = j0 + bits.trailing_zeros() as usize;
                        offer(
                            &mut lists[j * WORDS..(j + 1) * WORDS],
                            &mut gate[j],
                            m[r][j - j0],
                            i,
                        );
                        bits &= bits - 1;
                    }
                    // read after the columns (the row's cell may be one of them)
                    offer_row::<S>(lists, gate, i, &m[r], hits[r], j0);
                }
            }
        }
    }
    // the cells whose lists decide them; the others, ROWS at a time, against every cell
    let (mut rows, mut k) = ([0usize; ROWS], 0);
    for i in 0..=n {
        if i < n {
            match finish(&mut lists[i * WORDS..(i + 1) * WORDS]) {
                Some(f) => floor[i] = f,
                None => {
                    rows[k] = i;
                    k += 1;
                }
            }
        }
        if k == ROWS || (i == n && k > 0) {
            rescan::<S>(kp, vp, n, dk, dv, &rows, k, gate, lists);
            for &t in &rows[..k] {
                // a list of every partner decides its cell
                floor[t] = finish(&mut lists[t * WORDS..(t + 1) * WORDS]).unwrap_or(-1.0);
            }
            k = 0;
        }
    }
}

/// Cells `rows[..m]`' lists anew, each against every other cell (one-sided: the partners'
/// lists already hold or turned away these pairs).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn rescan<S: Simd>(
    kp: &[f32],
    vp: &[f32],
    n: usize,
    dk: usize,
    dv: usize,
    rows: &[usize; ROWS],
    m: usize,
    gate: &mut [f32],
    lists: &mut [u32],
) {
    let (kb, vb) = (kp.as_ptr(), vp.as_ptr());
    let ri: [usize; ROWS] = core::array::from_fn(|r| rows[r.min(m - 1)]);
    for &i in &ri[..m] {
        clear(&mut lists[i * WORDS..(i + 1) * WORDS]);
        gate[i] = f32::NEG_INFINITY;
    }
    let kr = ri.map(|i| panel_at(kb, dk, i));
    let vr = ri.map(|i| panel_at(vb, dv, i));
    for j0 in (0..n).step_by(PANEL) {
        let in_range: u32 = (1u32 << (n - j0).min(PANEL)) - 1;
        // SAFETY: rows and panel inside kp/vp (asserted by the caller).
        unsafe {
            let ck = tile::<S, ROWS>(&kr, kb.add(j0 * dk), dk);
            let mut hits = [0u32; ROWS];
            for r in 0..m {
                let br = S::splat(gate[ri[r]]);
                let mut live = in_range;
                if (j0..j0 + PANEL).contains(&ri[r]) {
                    live &= !(1 << (ri[r] - j0));
                }
                hits[r] = (S::gt_mask(ck[r][0], br) | S::gt_mask(ck[r][1], br) << 8) & live;
            }
            let mut mm = [[0f32; PANEL]; ROWS];
            let (sel, ns) = value_pass::<S>(&ck, &hits, &vr, vb.add(j0 * dv), dv, &mut mm);
            for &r in &sel[..ns] {
                offer_row::<S>(lists, gate, ri[r], &mm[r], hits[r], j0);
            }
        }
    }
}

/// Offers cell `i` the partners `j0 + c` of the lanes `c` of `hits` at similarity `m[c]`
/// (vector compares against its gate first: most lanes enter nothing).
#[inline(always)]
fn offer_row<S: Simd>(
    lists: &mut [u32],
    gate: &mut [f32],
    i: usize,
    m: &[f32; PANEL],
    hits: u32,
    j0: usize,
) {
    // SAFETY: `S`'s CPU features are present (the `Simd` contract, kept by our callers); `m`
    // holds 16 floats.
    let mut bits = unsafe {
        let gi = S::splat(gate[i]);
        let x = [S::load(m.as_ptr()), S::load(m.as_ptr().add(8))];
        (S::gt_mask(x[0], gi) | S::gt_mask(x[1], gi) << 8) & hits
    };
    while bits != 0 {
        let c = bits.trailing_zeros() as usize;
        offer(
            &mut lists[i * WORDS..(i + 1) * WORDS],
            &mut gate[i],
            m[c],
            j0 + c,
        );
        bits &= bits - 1;
    }
}
