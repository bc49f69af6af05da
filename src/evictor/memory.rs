//! The layout of the caller's memory (zstd's static context): one block, sized by
//! [`Layout::new`], holding
//!
//! `header | model: gram_set [L] u8, gram [L][gram_len] f32 | slot × max_seqs | workspace`
//!
//! and per sequence slot `state [STATE_WORDS] u64, scored [L] u8, ring_rows [L] u64,
//! words [L·Hkv·max_cells] (scores f32 while scoring, kept cells u32 once selected: a
//! round needs one or the other), offsets [L·Hkv + 1] u64, links [max_cells] f32,
//! ring [L][Hq][w][dk] f32, carry [L·Hkv·max_cells] f32, marks [max_cells] u8,
//! twins [L·Hkv·cap·TWIN_WORDS] u32` (the decode-time score memory, `carry.rs`; the round's
//! marked cells, `marks.rs`; `uniqueness`'s twin lists under a cell budget, `cap` =
//! `Resolved::twins`). Parts are cut by the crate's one carver (`workspace.rs`),
//! each 64-byte aligned, the optional ones empty when the method does not read them.

use super::Resolved;
use crate::error::{add, mul, Error, Result};
use crate::workspace::{Workspace, WorkspaceSize};

/// Words of a sequence's bookkeeping ([`super::SeqState`]).
pub(crate) const STATE_WORDS: usize = 12;

/// Alignment of the block's start (the library aligns inside the caller's memory).
pub const ALIGN: usize = 64;

/// Byte offsets of the block's regions from its aligned start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub model: usize,
    pub slots: usize,
    pub slot: usize,
    pub workspace: usize,
    pub ws_bytes: usize,
    /// Bytes from the aligned start to the end of the workspace.
    pub total: usize,
}

fn padded(bytes: usize) -> Result<usize> {
    add(bytes, ALIGN - 1).map(|b| b & !(ALIGN - 1))
}

impl Layout {
    pub fn new(r: &Resolved, header: usize, ws_bytes: usize) -> Result<Layout> {
        let model = padded(header)?;
        let slots = add(model, model_bytes(r)?)?;
        let slot = slot_bytes(r)?;
        let workspace = add(slots, mul(slot, r.max_seqs)?)?;
        let ws_bytes = padded(ws_bytes)?;
        let total = add(workspace, ws_bytes)?;
        if total > isize::MAX as usize {
            return Err(Error::Overflow);
        }
        Ok(Layout {
            model,
            slots,
            slot,
            workspace,
            ws_bytes,
            total,
        })
    }
}

/// What the model part holds.
pub(crate) struct Model<'a> {
    /// 1 once the layer's Gram blocks are set.
    pub gram_set: &'a mut [u8],
    pub gram: &'a mut [f32],
}

fn model_bytes(r: &Resolved) -> Result<usize> {
    let mut s = WorkspaceSize::new();
    s.add::<u8>(r.m.layers)?;
    s.add::<f32>(mul(r.m.layers, r.gram_len)?)?;
    Ok(s.0)
}

pub(crate) fn carve_model<'a>(buf: &'a mut [u8], r: &Resolved) -> Result<Model<'a>> {
    let mut ws = Workspace::new(buf);
    Ok(Model {
        gram_set: ws.take_dirty::<u8>(r.m.layers)?,
        gram: ws.take_dirty::<f32>(r.m.layers * r.gram_len)?,
    })
}

/// One sequence's slot.
pub(crate) struct Slot<'a> {
    pub state: &'a mut [u64],
    /// 1 once the layer is scored in the current round.
    pub scored: &'a mut [u8],
    /// Query rows observed per layer (the ring holds the last `min(rows, w)`).
    pub ring_rows: &'a mut [u64],
    /// The round's scores, then its kept cells: see [`floats`], [`cells`].
    pub words: &'a mut [u8],
    pub offsets: &'a mut [u64],
    pub links: &'a mut [f32],
    pub ring: &'a mut [f32],
    /// Decode-time score memory `[L·Hkv][max_cells]` (`carry.rs`), empty when off.
    pub carry: &'a mut [f32],
    /// The round's marked cells `[max_cells]` (1: marked; `marks.rs`), valid while the
    /// state's `mark_share` is set.
    pub marks: &'a mut [u8],
    /// `uniqueness`'s twin lists `[L·Hkv][cap][TWIN_WORDS]`, valid for the state's
    /// `carried` cells (`score/uniqueness/twins.rs`), empty when off.
    pub twins: &'a mut [u32],
}

/// A slot's `words` as the round's scores.
pub(crate) fn floats(words: &mut [u8]) -> &mut [f32] {
    let n = words.len() / 4;
    // the part is 64-byte aligned and 4·n bytes long: it cannot fail
    Workspace::new(words)
        .take_dirty::<f32>(n)
        .unwrap_or_default()
}

/// A slot's `words` as the selected round's kept cells.
pub(crate) fn cells(words: &mut [u8]) -> &mut [u32] {
    let n = words.len() / 4;
    Workspace::new(words)
        .take_dirty::<u32>(n)
        .unwrap_or_default()
}

fn words(r: &Resolved) -> Result<usize> {
    mul(mul(r.m.layers, r.m.hkv)?, r.max_cells)
}

fn slot_bytes(r: &Resolved) -> Result<usize> {
    let mut s = WorkspaceSize::new();
    s.add::<u64>(STATE_WORDS)?;
    s.add::<u8>(r.m.layers)?;
    s.add::<u64>(r.m.layers)?;
    s.add::<u32>(words(r)?)?;
    s.add::<u64>(add(mul(r.m.layers, r.m.hkv)?, 1)?)?;
    s.add::<f32>(if r.links.is_some() { r.max_cells } else { 0 })?;
    s.add::<f32>(ring_len(r)?)?;
    s.add::<f32>(carry_len(r)?)?;
    s.add::<u8>(r.max_cells)?;
    s.add::<u32>(twins_len(r)?)?;
    Ok(s.0)
}

/// Words of the carried twin lists: `[L·Hkv][cap][TWIN_WORDS]` when on.
pub(crate) fn twins_len(r: &Resolved) -> Result<usize> {
    mul(
        mul(r.m.layers, r.m.hkv)?,
        mul(r.twins, crate::score::TWIN_WORDS)?,
    )
}

/// Floats of the decode-time score memory: `[L·Hkv][max_cells]` when on.
fn carry_len(r: &Resolved) -> Result<usize> {
    if r.decay == 0.0 {
        return Ok(0);
    }
    words(r)
}

/// Floats of the query ring: `[L][Hq][w][dk]` when the scorer reads queries.
pub(crate) fn ring_len(r: &Resolved) -> Result<usize> {
    if !r.capture.queries {
        return Ok(0);
    }
    mul(
        mul(r.m.layers, r.m.hq)?,
        mul(r.score.window as usize, r.m.dk)?,
    )
}

pub(crate) fn carve_slot<'a>(buf: &'a mut [u8], r: &Resolved) -> Result<Slot<'a>> {
    let mut ws = Workspace::new(buf);
    Ok(Slot {
        state: ws.take_dirty::<u64>(STATE_WORDS)?,
        scored: ws.take_dirty::<u8>(r.m.layers)?,
        ring_rows: ws.take_dirty::<u64>(r.m.layers)?,
        words: ws.take_dirty::<u8>(words(r)? * 4)?,
        offsets: ws.take_dirty::<u64>(r.m.layers * r.m.hkv + 1)?,
        links: ws.take_dirty::<f32>(if r.links.is_some() { r.max_cells } else { 0 })?,
        ring: ws.take_dirty::<f32>(ring_len(r)?)?,
        carry: ws.take_dirty::<f32>(carry_len(r)?)?,
        marks: ws.take_dirty::<u8>(r.max_cells)?,
        twins: ws.take_dirty::<u32>(twins_len(r)?)?,
    })
}

/// The regions of a block: its model part, sequence `seq`'s slot and the workspace.
pub(crate) fn split<'a>(
    block: &'a mut [u8],
    lay: &Layout,
    seq: usize,
) -> (&'a mut [u8], &'a mut [u8], &'a mut [u8]) {
    let (head, ws) = block.split_at_mut(lay.workspace);
    let (model, slots) = head.split_at_mut(lay.slots);
    let slot = &mut slots[seq * lay.slot..(seq + 1) * lay.slot];
    (&mut model[lay.model..], slot, &mut ws[..lay.ws_bytes])
}
