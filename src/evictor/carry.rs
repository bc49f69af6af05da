//! Decode-time score memory (design §3c): under a cell budget a sequence is scored again at
//! every eviction, and a round's window queries read only what the last few tokens needed.
//! The evictor keeps, per (layer, KV head) and held cell, the score the cell had when it
//! was last kept, and a round ranks `s + decay · carried` (H2O's accumulated attention,
//! geometrically forgotten, over the queries of every round the cell lived through).
//!
//! The carried scores follow the cells: a commit keeps them in position order at the front
//! (what llama.cpp's compaction does), so cell `i < held` of the next round is the `i`-th
//! kept cell of this one; cells past `held` are new and carry nothing, as do the cells that
//! were the window (unscored) when they were kept.

/// `stage[h·p + i] += decay · carry[(layer·hkv + h)·max_cells + i]` for `i < carried.min(p)`:
/// a layer's staged round scores `[hkv][p]` with what its cells carry.
#[allow(clippy::too_many_arguments)]
pub(crate) fn add_carried(
    stage: &mut [f32],
    carry: &[f32],
    layer: usize,
    hkv: usize,
    max_cells: usize,
    p: usize,
    carried: usize,
    decay: f32,
) {
    let m = carried.min(p);
    for h in 0..hkv {
        let c = &carry[(layer * hkv + h) * max_cells..][..m];
        for (s, &c) in stage[h * p..h * p + m].iter_mut().zip(c) {
            *s += decay * c;
        }
    }
}

/// The carry of the next round: unit `u`'s `j`-th kept cell (`kept[offsets[u]..offsets[u +
/// 1]]`, ascending) carries its combined score of this round (0 for a window cell, `>= p`).
pub(crate) fn keep_carried(
    carry: &mut [f32],
    scores: &[f32],
    offsets: &[u64],
    kept: &[u32],
    units: usize,
    max_cells: usize,
    p: usize,
) {
    for u in 0..units {
        let list = &kept[offsets[u] as usize..offsets[u + 1] as usize];
        let dst = &mut carry[u * max_cells..(u + 1) * max_cells];
        for (j, &c) in list.iter().enumerate() {
            let c = c as usize;
            dst[j] = if c < p { scores[u * p + c] } else { 0.0 };
        }
    }
}
