//! Batched in-place compaction on the device: K and V of every layer in one call, two
//! launches (gather, scatter) per 32 tensors instead of two per tensor.

use super::super::kve_tensor;
use core::ffi::c_void;

#[cfg(feature = "cuda")]
use {
    super::super::{span_ptr, to_status, tri, Buf},
    super::imp::{tensor, write},
    crate::device::{self, BatchItem, BatchItems},
    crate::error::Result,
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

/// The caller's host array, each item converted when the device pipeline asks for it.
#[cfg(feature = "cuda")]
struct CItems<'a>(&'a [kve_compact_item]);

#[cfg(feature = "cuda")]
impl BatchItems for CItems<'_> {
    fn count(&self) -> usize {
        self.0.len()
    }
    fn item(&self, i: usize) -> Result<BatchItem> {
        let it = &self.0[i];
        Ok(BatchItem {
            kv: tensor(&it.kv)?,
            kept: it.kept,
            kept_ld: it.kept_ld,
            counts: it.counts,
        })
    }
    fn host_bytes(&self) -> (usize, usize) {
        match self.0 {
            [] => (0, 0),
            [first, .., last] => (span_ptr(first).0, span_ptr(last).1),
            [one] => (span_ptr(one).0, span_ptr(one).1),
        }
    }
}

/// The caller's items array, checked (NULL only when empty, aligned).
///
/// # Safety
/// `items` is NULL or the caller's host array of `n_items` items.
#[cfg(feature = "cuda")]
unsafe fn c_items<'a>(items: *const kve_compact_item, n_items: u64) -> Result<CItems<'a>> {
    let all = Buf::new(items, n_items)?;
    // SAFETY: Buf::new checked the host array; the caller's contract: it lives for the call.
    Ok(CItems(unsafe { all.slice() }))
}

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
    cuda_only!({
        // SAFETY: NULL or the caller's host array; c_items checks it.
        let all = tri!(unsafe { c_items(items, n_items) });
        let b = device::compact_batch_in_place_workspace_size(&all, max_keep);
        // SAFETY: a host out-parameter, checked before it is written.
        unsafe { write(out_bytes, b.map(|b| b as u64)) }
    })
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
    cuda_only!({
        // SAFETY: NULL or the caller's host array; c_items checks it.
        let all = tri!(unsafe { c_items(items, n_items) });
        // SAFETY: the tensors, lists and workspace are device memory of the declared sizes
        // (this function's contract); the pipeline checks everything else.
        to_status(unsafe {
            device::compact_batch_in_place(&all, max_keep, workspace, workspace_bytes, stream)
        })
    })
}
