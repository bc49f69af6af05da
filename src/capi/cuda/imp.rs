//! Shared pieces of the device entry points: descriptor conversion, workspace carving,
//! CUDA status mapping; device count and compaction (thin wrappers of one launcher each).

use super::super::{
    arg, kve_tensor, out_param, status_of, tri, Span, Tensor, KVE_ERR_CUDA, KVE_OK,
};
use crate::cuda as cu;
use crate::error::{Error, Result};
use core::ffi::{c_int, c_void};

pub(super) use super::score::{score_layer, score_workspace_size};
pub(super) use super::select::{select_model, select_workspace_size};

/// Alignment of every workspace part (cudaMalloc gives 256).
pub(super) const ALIGN: usize = 256;

pub(super) fn i64_of(v: u64) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::Overflow)
}

/// A launcher's status as ours: `Err(Cuda)` for anything but cudaSuccess.
pub(super) fn ck(st: c_int) -> core::result::Result<(), i32> {
    if st == 0 {
        Ok(())
    } else {
        Err(KVE_ERR_CUDA)
    }
}

/// Host-side checks of a device tensor, then the launcher's descriptor.
pub(super) fn view(t: &kve_tensor) -> Result<cu::KveCudaView> {
    Tensor::new(t)?;
    Ok(cu::KveCudaView {
        data: t.data as *mut c_void,
        dtype: t.dtype as i32,
        reserved: 0,
        stride_head: i64_of(t.stride[0])?,
        stride_token: i64_of(t.stride[1])?,
        stride_dim: i64_of(t.stride[2])?,
        heads: i64_of(t.extent[0])?,
        tokens: i64_of(t.extent[1])?,
        dim: i64_of(t.extent[2])?,
    })
}

/// The bytes a device tensor may reach (its declared `len`), for alias checks.
pub(super) fn tensor_span(t: &kve_tensor) -> Result<Span> {
    if t.data.is_null() {
        return Ok(Span::EMPTY);
    }
    Ok(Tensor::new(t)?.span)
}

/// `count` elements of `T` at `p` (device addresses live in the same address space).
pub(super) fn span_of<T>(p: *const T, count: usize) -> Span {
    let a = p as usize;
    let bytes = count.saturating_mul(core::mem::size_of::<T>());
    if p.is_null() {
        Span::EMPTY
    } else {
        Span(a, a.saturating_add(bytes))
    }
}

/// Bytes per element of a launcher dtype code.
pub(super) fn elem_size(dtype: i32) -> usize {
    if dtype == cu::KVE_CUDA_F32 {
        4
    } else {
        2
    }
}

/// Carves 256-aligned parts off a device workspace. With a null base it only adds up
/// sizes, so the size query and the call share one layout.
pub(super) struct Carve {
    base: *mut u8,
    off: usize,
}

impl Carve {
    pub fn new(base: *mut c_void) -> Carve {
        Carve {
            base: base as *mut u8,
            off: 0,
        }
    }
    /// `count` elements of `T`; a null pointer for `count == 0`.
    pub fn take<T>(&mut self, count: usize) -> Result<*mut T> {
        if count == 0 {
            return Ok(core::ptr::null_mut());
        }
        let bytes = count
            .checked_mul(core::mem::size_of::<T>())
            .ok_or(Error::Overflow)?;
        let at = self.off;
        self.off = at
            .checked_add(bytes)
            .and_then(|x| x.checked_add(ALIGN - 1))
            .map(|x| x & !(ALIGN - 1))
            .ok_or(Error::Overflow)?;
        Ok(if self.base.is_null() {
            core::ptr::null_mut()
        } else {
            self.base.wrapping_add(at) as *mut T
        })
    }
    pub fn bytes(&self) -> usize {
        self.off
    }
}

pub(super) fn write<T>(p: *mut T, v: T) -> Result<()> {
    let b = out_param(p)?;
    // SAFETY: checked non-NULL and aligned.
    unsafe { b.slice_mut()[0] = v };
    Ok(())
}

/// Common checks of a device workspace argument.
pub(super) fn check_workspace(ws: *mut c_void, have: u64, need: usize) -> Result<()> {
    if (have as u128) < need as u128 {
        return Err(Error::WorkspaceTooSmall);
    }
    if need > 0 && ws.is_null() {
        return Err(Error::NullPointer);
    }
    if (ws as usize) % ALIGN != 0 {
        return Err(Error::Misaligned);
    }
    Ok(())
}

/// Run a chain of launches; the first failing one ends it with `KVE_ERR_CUDA`.
pub(super) fn run(f: impl FnOnce() -> core::result::Result<(), i32>) -> i32 {
    match f() {
        Ok(()) => KVE_OK,
        Err(e) => e,
    }
}

pub unsafe fn device_count(count: *mut i32) -> i32 {
    let out = tri!(out_param(count));
    let mut c: c_int = 0;
    let st = cu::kve_cuda_device_count(&mut c);
    let v = if st == 0 { c } else { 0 };
    out.slice_mut()[0] = v;
    KVE_OK
}

pub unsafe fn compact_workspace_size(
    kv: *const kve_tensor,
    max_keep: u64,
    out_bytes: *mut u64,
) -> i32 {
    let v = tri!(view(tri!(arg(kv))));
    let mk = tri!(i64_of(max_keep));
    let b = cu::kve_cuda_compact_workspace_size(&v, mk);
    tri!(write(out_bytes, b as u64));
    KVE_OK
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn compact_in_place(
    kv: *const kve_tensor,
    kept: *const i32,
    kept_ld: u64,
    counts: *const i32,
    max_keep: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
    stream: *mut c_void,
) -> i32 {
    let v = tri!(view(tri!(arg(kv))));
    if kept.is_null() || counts.is_null() {
        return status_of(Error::NullPointer);
    }
    if crate::view::layout_overlaps(
        [v.heads as usize, v.tokens as usize, v.dim as usize],
        [
            v.stride_head as usize,
            v.stride_token as usize,
            v.stride_dim as usize,
        ],
    ) {
        return status_of(Error::Aliasing);
    }
    let mk = tri!(i64_of(max_keep));
    let need = cu::kve_cuda_compact_workspace_size(&v, mk);
    if (workspace_bytes as u128) < need as u128 {
        return status_of(Error::WorkspaceTooSmall);
    }
    run(|| {
        ck(cu::kve_cuda_compact(
            &v,
            kept,
            i64_of(kept_ld).map_err(status_of)?,
            counts,
            mk,
            workspace,
            workspace_bytes as usize,
            stream,
        ))
    })
}

pub unsafe fn compact_varlen(
    src: *const kve_tensor,
    kept: *const i32,
    kept_ld: u64,
    counts: *const i32,
    dst: *mut c_void,
    cu_seqlens: *mut i32,
    stream: *mut c_void,
) -> i32 {
    let v = tri!(view(tri!(arg(src))));
    if kept.is_null() || counts.is_null() || dst.is_null() || cu_seqlens.is_null() {
        return status_of(Error::NullPointer);
    }
    let ld = tri!(i64_of(kept_ld));
    run(|| {
        ck(cu::kve_cuda_compact_varlen(
            &v, kept, ld, counts, dst, cu_seqlens, stream,
        ))
    })
}
