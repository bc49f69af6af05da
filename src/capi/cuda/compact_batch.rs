//! Batched in-place compaction on the device: K and V of every layer in one call, two
//! launches (gather, scatter) per 32 tensors instead of two per tensor.

use super::super::kve_tensor;
use core::ffi::c_void;

#[cfg(not(any(feature = "cuda", feature = "cuda-mock")))]
use super::super::KVE_ERR_NOT_BUILT_WITH_CUDA as STUB;
#[cfg(any(feature = "cuda", feature = "cuda-mock"))]
use {
    super::super::{span_ptr, to_status, tri, Buf, Span, KVE_OK},
    super::imp::{tensor, write},
    crate::cuda as cu,
    crate::device::{self, compact::in_place_ok},
    crate::error::{Error, Result},
};

/// One tensor of `kve_cuda_compact_batch_in_place` (host memory; `kv.data`, `kept` and
/// `counts` are device pointers): as the arguments of `kve_cuda_compact_in_place` — for
/// each head `h` of `kv`, rows `kept[h*kept_ld + t]` (`t < counts[h]`, ascending, `< N`)
/// move to token `t`; `kept_ld = 0`: one list and one count shared by every head.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kve_compact_item {
    /// The tensor compacted in place (writable device memory, any layout).
    pub kv: kve_tensor,
    /// int32 kept lists, device memory (`kve_cuda_select_model`'s `idx + u*idx_ld`).
    pub kept: *const i32,
    /// Elements between two heads' lists: 0 (shared) or `>= min(max_keep, N)`.
    pub kept_ld: u64,
    /// int32 counts, one per head (one when `kept_ld = 0`), device memory.
    pub counts: *const i32,
}

/// Items of one call at most (the aliasing checks compare every pair).
#[cfg(any(feature = "cuda", feature = "cuda-mock"))]
const MAX_ITEMS: usize = 1024;
/// Tensors per launch pair of the launcher (`CP_MAX` in cuda/compact.cu).
#[cfg(any(feature = "cuda", feature = "cuda-mock"))]
const CHUNK: usize = 32;

/// The byte ranges one item writes (its tensor) and reads (its lists).
#[cfg(any(feature = "cuda", feature = "cuda-mock"))]
#[derive(Clone, Copy)]
struct ItemSpans {
    out: Span,
    kept: Span,
    counts: Span,
}

#[cfg(any(feature = "cuda", feature = "cuda-mock"))]
const NO_SPANS: ItemSpans = ItemSpans {
    out: Span::EMPTY,
    kept: Span::EMPTY,
    counts: Span::EMPTY,
};

/// Every host check of one item (those of `kve_cuda_compact_in_place`, and the lists'
/// alignment, stride and reach), then the launcher's item and its byte ranges.
#[cfg(any(feature = "cuda", feature = "cuda-mock"))]
fn check_item(it: &kve_compact_item, max_keep: u64) -> Result<(cu::KveCudaCompactItem, ItemSpans)> {
    let t = tensor(&it.kv)?;
    let x = t.view;
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
            out: Span(t.bytes.0, t.bytes.1),
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
#[cfg(any(feature = "cuda", feature = "cuda-mock"))]
fn check_chunk(
    all: &[kve_compact_item],
    start: usize,
    max_keep: u64,
    items: &mut [cu::KveCudaCompactItem; CHUNK],
    spans: &mut [ItemSpans; CHUNK],
) -> Result<usize> {
    let n = (all.len() - start).min(CHUNK);
    for i in 0..n {
        (items[i], spans[i]) = check_item(&all[start + i], max_keep)?;
    }
    Ok(n)
}

/// No tensor overlaps another tensor, any item's lists, the items array or the workspace.
#[cfg(any(feature = "cuda", feature = "cuda-mock"))]
fn check_overlaps(
    all: &[kve_compact_item],
    max_keep: u64,
    fixed: [Span; 2],
    scratch: &mut [cu::KveCudaCompactItem; CHUNK],
) -> Result<()> {
    let (mut a, mut b) = ([NO_SPANS; CHUNK], [NO_SPANS; CHUNK]);
    let [items_span, ws] = fixed;
    let hit = |o: Span, r: &ItemSpans| o.overlaps(r.kept) || o.overlaps(r.counts);
    for sa in (0..all.len()).step_by(CHUNK) {
        let na = check_chunk(all, sa, max_keep, scratch, &mut a)?;
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
        for sb in (sa + CHUNK..all.len()).step_by(CHUNK) {
            let nb = check_chunk(all, sb, max_keep, scratch, &mut b)?;
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

/// The workspace of the batch: the largest of its launch pairs'.
#[cfg(any(feature = "cuda", feature = "cuda-mock"))]
fn workspace_size(all: &[kve_compact_item], max_keep: u64) -> Result<usize> {
    if all.len() > MAX_ITEMS {
        return Err(Error::InvalidArgument);
    }
    let mut items = [EMPTY_ITEM; CHUNK];
    let mut spans = [NO_SPANS; CHUNK];
    let mut most = 0;
    for s in (0..all.len()).step_by(CHUNK) {
        let n = check_chunk(all, s, max_keep, &mut items, &mut spans)?;
        most = most.max(device::compact_batch_workspace_size(&items[..n], max_keep)?);
    }
    Ok(most)
}

#[cfg(any(feature = "cuda", feature = "cuda-mock"))]
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

/// Device workspace bytes of `kve_cuda_compact_batch_in_place` for these items and the
/// largest count of any list (`max_keep`; `N` always suffices). Every item is checked as
/// the call checks it. Writes only `*out_bytes`.
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_compact_batch_in_place_workspace_size(
    items: *const kve_compact_item,
    n_items: u64,
    max_keep: u64,
    out_bytes: *mut u64,
) -> i32 {
    #[cfg(any(feature = "cuda", feature = "cuda-mock"))]
    {
        let all = tri!(Buf::new(items, n_items));
        // SAFETY: Buf::new checked the host array (NULL only when empty, aligned).
        let b = workspace_size(unsafe { all.slice() }, max_keep);
        // SAFETY: a host out-parameter, checked before it is written.
        unsafe { write(out_bytes, b.map(|b| b as u64)) }
    }
    #[cfg(not(any(feature = "cuda", feature = "cuda-mock")))]
    {
        let _ = (items, n_items, max_keep, out_bytes);
        STUB
    }
}

/// `kve_cuda_compact_in_place` of every item (K and V of every layer) on `stream`, two
/// launches per 32 items (Llama-3-8B's 64 tensors: 4 launches instead of 128). `items`
/// (host memory, at most 1024, else `KVE_ERR_INVALID_ARGUMENT`) as `kve_compact_item`
/// says; `counts[h] <= max_keep`. The items' tensors (their `data`/`len` buffers) must not
/// overlap one another, any item's lists, the items array or the workspace
/// (`KVE_ERR_ALIASING`); items may share lists. Workspace: device memory, 256-byte
/// aligned, `kve_cuda_compact_batch_in_place_workspace_size` bytes. Every item is checked
/// before the first launch (nothing enqueued on error); the lists' contents are read on
/// the device only (ascending positions below N, as `kve_cuda_select_model` writes them).
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_compact_batch_in_place(
    items: *const kve_compact_item,
    n_items: u64,
    max_keep: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
    stream: *mut c_void,
) -> i32 {
    #[cfg(any(feature = "cuda", feature = "cuda-mock"))]
    {
        let all = tri!(Buf::new(items, n_items));
        // SAFETY: Buf::new checked the host array (NULL only when empty, aligned).
        let all = unsafe { all.slice() };
        let need = tri!(workspace_size(all, max_keep));
        tri!(device::check_workspace(workspace, workspace_bytes, need));
        let ws = tri!(device::span_of(workspace as *const u8, need));
        let mut chunk = [EMPTY_ITEM; CHUNK];
        let arr = if all.is_empty() {
            Span::EMPTY
        } else {
            Span(span_ptr(items).0, span_ptr(&all[all.len() - 1]).1)
        };
        tri!(check_overlaps(all, max_keep, [arr, ws], &mut chunk));
        let mut spans = [NO_SPANS; CHUNK];
        for s in (0..all.len()).step_by(CHUNK) {
            let n = tri!(check_chunk(all, s, max_keep, &mut chunk, &mut spans));
            // SAFETY: every item checked above; the tensors, lists and workspace are device
            // memory of the declared sizes (this function's contract).
            let r = unsafe {
                device::compact_batch(&chunk[..n], max_keep, workspace, workspace_bytes, stream)
            };
            if r.is_err() {
                return to_status(r);
            }
        }
        KVE_OK
    }
    #[cfg(not(any(feature = "cuda", feature = "cuda-mock")))]
    {
        let _ = (items, n_items, max_keep, workspace, workspace_bytes, stream);
        STUB
    }
}
