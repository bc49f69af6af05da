//! Compaction of the kept rows on the device (one launcher each).

use super::{check_workspace, ck, i64_of, Tensor};
use crate::cuda as cu;
use crate::error::{Error, Result};
use crate::span::Span;
use core::ffi::c_void;

/// Device workspace bytes of [`compact_in_place`] for a view and the largest count.
pub fn compact_workspace_size(kv: &cu::KveCudaView, max_keep: u64) -> Result<usize> {
    let mk = i64_of(max_keep)?;
    // SAFETY: a pure host function of the descriptor's fields.
    Ok(unsafe { cu::kve_cuda_compact_workspace_size(kv, mk) })
}

/// Rows written in place must not share memory.
pub(crate) fn in_place_ok(kv: &cu::KveCudaView) -> Result<()> {
    let ext = [kv.heads, kv.tokens, kv.dim].map(|x| x as usize);
    let strides = [kv.stride_head, kv.stride_token, kv.stride_dim].map(|x| x as usize);
    if crate::view::layout_overlaps(ext, strides) {
        return Err(Error::Aliasing);
    }
    Ok(())
}

/// For each head `h` of `kv`, rows `kept[h*kept_ld + t]` (`t < counts[h]`, ascending)
/// move to token `t`; `kept_ld = 0`: one list for every head.
///
/// # Safety
/// `kv`'s data, `kept`, `counts` and `workspace` are device memory of the declared sizes.
pub unsafe fn compact_in_place(
    kv: &cu::KveCudaView,
    kept: *const i32,
    kept_ld: u64,
    counts: *const i32,
    max_keep: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
    stream: *mut c_void,
) -> Result<()> {
    if kept.is_null() || counts.is_null() {
        return Err(Error::NullPointer);
    }
    in_place_ok(kv)?;
    let need = compact_workspace_size(kv, max_keep)?;
    if (workspace_bytes as u128) < need as u128 {
        return Err(Error::WorkspaceTooSmall);
    }
    // SAFETY: the caller's device buffers; the launcher checks the lists on the device.
    ck(unsafe {
        cu::kve_cuda_compact(
            kv,
            kept,
            i64_of(kept_ld)?,
            counts,
            max_keep as i64,
            workspace,
            workspace_bytes as usize,
            stream,
        )
    })
}

/// Device workspace bytes of [`compact_batch`] for these tensors and the largest count.
pub fn compact_batch_workspace_size(
    items: &[cu::KveCudaCompactItem],
    max_keep: u64,
) -> Result<usize> {
    let mk = i64_of(max_keep)?;
    let n = i64_of(items.len() as u64)?;
    // SAFETY: a pure host function of the descriptors, which `items` holds.
    Ok(unsafe { cu::kve_cuda_compact_batch_workspace_size(items.as_ptr(), n, mk) })
}

/// [`compact_in_place`] for every item (K and V of every layer) in two launches per 32
/// items; the items' tensors must not overlap one another.
///
/// # Safety
/// Each item's data, lists and counts, and `workspace`, are device memory of the declared
/// sizes.
pub unsafe fn compact_batch(
    items: &[cu::KveCudaCompactItem],
    max_keep: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
    stream: *mut c_void,
) -> Result<()> {
    for it in items {
        if it.kept.is_null() || it.counts.is_null() {
            return Err(Error::NullPointer);
        }
        in_place_ok(&it.x)?;
    }
    let need = compact_batch_workspace_size(items, max_keep)?;
    if (workspace_bytes as u128) < need as u128 {
        return Err(Error::WorkspaceTooSmall);
    }
    let n = i64_of(items.len() as u64)?;
    // SAFETY: the caller's device buffers; the launcher checks every descriptor first.
    ck(unsafe {
        cu::kve_cuda_compact_batch(
            items.as_ptr(),
            n,
            i64_of(max_keep)?,
            workspace,
            workspace_bytes as usize,
            stream,
        )
    })
}

/// One tensor of a batch compaction ([`compact_batch_in_place`]): for each head `h` of
/// `kv`, rows `kept[h*kept_ld + t]` (`t < counts[h]`, ascending, `< N`) move to token `t`;
/// `kept_ld = 0`: one list and one count shared by every head.
#[derive(Clone, Copy, Debug)]
pub struct BatchItem {
    /// The tensor compacted in place (writable device memory, any layout).
    pub kv: Tensor,
    /// int32 lists, device memory.
    pub kept: *const i32,
    /// Elements between two heads' lists: 0 (shared) or `>= min(max_keep, N)`.
    pub kept_ld: u64,
    /// int32 counts, one per head (one when `kept_ld = 0`), device memory.
    pub counts: *const i32,
}

/// The items of a batch, read one at a time (the pipeline keeps at most a launch's worth,
/// on the stack). A C caller's array converts each item when asked.
pub trait BatchItems {
    fn count(&self) -> usize;
    /// Item `i < count()`, or why it cannot be one.
    fn item(&self, i: usize) -> Result<BatchItem>;
    /// The host bytes holding the items, which no tensor may overlap (none by default).
    fn host_bytes(&self) -> (usize, usize) {
        (0, 0)
    }
}

impl BatchItems for [BatchItem] {
    fn count(&self) -> usize {
        self.len()
    }
    fn item(&self, i: usize) -> Result<BatchItem> {
        Ok(self[i])
    }
}

/// Items of one batch at most (the aliasing checks compare every pair).
pub const MAX_BATCH_ITEMS: usize = 1024;
/// Tensors per launch pair of the launcher (`CP_MAX` in cuda/compact.cu).
const CHUNK: usize = 32;

/// The byte ranges one item writes (its tensor) and reads (its lists).
#[derive(Clone, Copy)]
struct ItemSpans {
    out: Span,
    kept: Span,
    counts: Span,
}

const NO_SPANS: ItemSpans = ItemSpans {
    out: Span::EMPTY,
    kept: Span::EMPTY,
    counts: Span::EMPTY,
};

const EMPTY_ITEM: cu::KveCudaCompactItem = cu::KveCudaCompactItem {
    x: cu::KveCudaView {
        data: core::ptr::null_mut(),
        dtype: 0,
        reserved: 0,
        stride_head: 0,
        stride_token: 0,
        stride_dim: 0,
        heads: 0,
        tokens: 0,
        dim: 0,
    },
    kept: core::ptr::null(),
    kept_ld: 0,
    counts: core::ptr::null(),
};

/// Every host check of one item (those of [`compact_in_place`], and the lists'
/// alignment, stride and reach), then the launcher's item and its byte ranges.
fn check_item(it: &BatchItem, max_keep: u64) -> Result<(cu::KveCudaCompactItem, ItemSpans)> {
    let x = it.kv.view;
    in_place_ok(&x)?;
    if it.kept.is_null() || it.counts.is_null() {
        return Err(Error::NullPointer);
    }
    if (it.kept as usize) % 4 != 0 || (it.counts as usize) % 4 != 0 {
        return Err(Error::Misaligned);
    }
    let ld = i64::try_from(it.kept_ld).map_err(|_| Error::Overflow)?;
    // what the launcher refuses (kve_cuda_compact's list stride), refused here first
    let mk = max_keep.min(x.tokens as u64);
    if ld != 0 && (ld as u64) < mk {
        return Err(Error::InvalidArgument);
    }
    let heads = x.heads as u64;
    let moves = mk > 0 && heads > 0 && x.dim > 0;
    let ints = |n: u64| -> Result<Span> {
        let n = usize::try_from(n).map_err(|_| Error::Overflow)?;
        crate::span::span_of(it.kept as usize, n, 4)
    };
    let spans = if moves {
        let kept_len = if ld == 0 {
            mk
        } else {
            (heads - 1)
                .checked_mul(ld as u64)
                .and_then(|e| e.checked_add(mk))
                .ok_or(Error::Overflow)?
        };
        let counts_len = if ld == 0 { 1 } else { heads };
        ItemSpans {
            out: it.kv.span(),
            kept: ints(kept_len)?,
            counts: crate::span::span_of(it.counts as usize, counts_len as usize, 4)?,
        }
    } else {
        NO_SPANS
    };
    let item = cu::KveCudaCompactItem {
        x,
        kept: it.kept,
        kept_ld: ld,
        counts: it.counts,
    };
    Ok((item, spans))
}

/// Items `start ..` (at most [`CHUNK`]) checked into `items` / `spans`; their count.
fn check_chunk<I: BatchItems + ?Sized>(
    all: &I,
    start: usize,
    max_keep: u64,
    items: &mut [cu::KveCudaCompactItem; CHUNK],
    spans: &mut [ItemSpans; CHUNK],
) -> Result<usize> {
    let n = (all.count() - start).min(CHUNK);
    for i in 0..n {
        (items[i], spans[i]) = check_item(&all.item(start + i)?, max_keep)?;
    }
    Ok(n)
}

/// No tensor overlaps another tensor, any item's lists, the items or the workspace.
fn check_overlaps<I: BatchItems + ?Sized>(all: &I, max_keep: u64, ws: Span) -> Result<()> {
    let (mut a, mut b) = ([NO_SPANS; CHUNK], [NO_SPANS; CHUNK]);
    let mut scratch = [EMPTY_ITEM; CHUNK];
    let (h0, h1) = all.host_bytes();
    let items_span = Span(h0, h1);
    let hit = |o: Span, r: &ItemSpans| o.overlaps(r.kept) || o.overlaps(r.counts);
    let count = all.count();
    for sa in (0..count).step_by(CHUNK) {
        let na = check_chunk(all, sa, max_keep, &mut scratch, &mut a)?;
        for (i, x) in a[..na].iter().enumerate() {
            if x.out.overlaps(items_span) || x.out.overlaps(ws) || hit(ws, x) {
                return Err(Error::Aliasing);
            }
            for (j, y) in a[..na].iter().enumerate() {
                if hit(x.out, y) || (j > i && x.out.overlaps(y.out)) {
                    return Err(Error::Aliasing);
                }
            }
        }
        for sb in (sa + CHUNK..count).step_by(CHUNK) {
            let nb = check_chunk(all, sb, max_keep, &mut scratch, &mut b)?;
            for x in &a[..na] {
                for y in &b[..nb] {
                    if x.out.overlaps(y.out) || hit(x.out, y) || hit(y.out, x) {
                        return Err(Error::Aliasing);
                    }
                }
            }
        }
    }
    Ok(())
}

/// Device workspace bytes of [`compact_batch_in_place`]: the largest of its launch pairs'
/// (every item checked as the call checks it; at most [`MAX_BATCH_ITEMS`], else
/// `InvalidArgument`).
pub fn compact_batch_in_place_workspace_size<I: BatchItems + ?Sized>(
    all: &I,
    max_keep: u64,
) -> Result<usize> {
    if all.count() > MAX_BATCH_ITEMS {
        return Err(Error::InvalidArgument);
    }
    let mut items = [EMPTY_ITEM; CHUNK];
    let mut spans = [NO_SPANS; CHUNK];
    let mut most = 0;
    for s in (0..all.count()).step_by(CHUNK) {
        let n = check_chunk(all, s, max_keep, &mut items, &mut spans)?;
        most = most.max(compact_batch_workspace_size(&items[..n], max_keep)?);
    }
    Ok(most)
}

/// [`compact_in_place`] of every item (K and V of every layer) on `stream`, two launches
/// per 32 items. The items' tensors must not overlap one another, any item's lists, the
/// items' host bytes or the workspace (`Aliasing`); items may share lists. Every item is
/// checked before the first launch (nothing enqueued on error).
///
/// # Safety
/// Each item's data, lists and counts, and `workspace`, are device memory of the declared
/// sizes.
pub unsafe fn compact_batch_in_place<I: BatchItems + ?Sized>(
    all: &I,
    max_keep: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
    stream: *mut c_void,
) -> Result<()> {
    let need = compact_batch_in_place_workspace_size(all, max_keep)?;
    check_workspace(workspace, workspace_bytes, need)?;
    let ws = super::span_of(workspace as *const u8, need)?;
    check_overlaps(all, max_keep, ws)?;
    let mut chunk = [EMPTY_ITEM; CHUNK];
    let mut spans = [NO_SPANS; CHUNK];
    for s in (0..all.count()).step_by(CHUNK) {
        let n = check_chunk(all, s, max_keep, &mut chunk, &mut spans)?;
        // SAFETY: every item checked above; the caller's device memory (this contract).
        unsafe { compact_batch(&chunk[..n], max_keep, workspace, workspace_bytes, stream)? };
    }
    Ok(())
}

/// Kept rows of every head of `src`, head after head, into `dst` (contiguous rows of
/// `src`'s dtype and dim) and `cu_seqlens[0..=heads]`.
///
/// # Safety
/// Every pointer is device memory of the sizes the lists imply.
pub unsafe fn compact_varlen(
    src: &cu::KveCudaView,
    kept: *const i32,
    kept_ld: u64,
    counts: *const i32,
    dst: *mut c_void,
    cu_seqlens: *mut i32,
    stream: *mut c_void,
) -> Result<()> {
    if kept.is_null() || counts.is_null() || dst.is_null() || cu_seqlens.is_null() {
        return Err(Error::NullPointer);
    }
    let ld = i64_of(kept_ld)?;
    // SAFETY: the caller's device buffers of the sizes the lists imply.
    ck(unsafe { cu::kve_cuda_compact_varlen(src, kept, ld, counts, dst, cu_seqlens, stream) })
}
