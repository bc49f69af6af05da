//! Compaction of the kept rows on the device (one launcher each).

use super::{ck, i64_of};
use crate::cuda as cu;
use crate::error::{Error, Result};
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
