//! Conversions of the device entry points (features `cuda`, `cuda-emu`): C tensor
//! descriptors to the device pipeline's, out-parameters; the device count.

use super::super::params::{kve_select_params, select_config};
use super::super::select::kve_model_scores;
use super::super::{arg, kve_tensor, out_param, tri, Tensor, KVE_OK};
use crate::cuda as cu;
use crate::device;
use crate::device::select::KeptLists;
use crate::error::{Error, Result};
use crate::shape::ModelShape;
use core::ffi::{c_int, c_void};

fn i64_of(v: u64) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::Overflow)
}

/// Host-side checks of a device tensor (those of a host tensor; the kernels take f32, f16
/// and bf16 only: `Q8_0`/`Q4_0` are `UnsupportedDtype`, before anything is enqueued), then
/// the launcher's descriptor and the bytes the tensor declares.
pub(super) fn tensor(t: &kve_tensor) -> Result<device::Tensor> {
    let checked = Tensor::new(t)?;
    if crate::dtype::DType::from_u32(t.dtype)?.is_quantized() {
        return Err(Error::UnsupportedDtype);
    }
    let view = cu::KveCudaView {
        data: t.data as *mut c_void,
        dtype: t.dtype as i32,
        reserved: 0,
        stride_head: i64_of(t.stride[0])?,
        stride_token: i64_of(t.stride[1])?,
        stride_dim: i64_of(t.stride[2])?,
        heads: i64_of(t.extent[0])?,
        tokens: i64_of(t.extent[1])?,
        dim: i64_of(t.extent[2])?,
    };
    Ok(device::Tensor {
        view,
        bytes: (checked.span.0, checked.span.1),
    })
}

/// Write one out-parameter (checked first, like the host functions do).
///
/// # Safety
/// `p` is NULL or points to a host `T` the caller lets us write.
pub(super) unsafe fn write<T>(p: *mut T, v: Result<T>) -> i32 {
    let mut out = tri!(out_param(p));
    let v = tri!(v);
    // SAFETY: out_param checked non-NULL and aligned; one element.
    unsafe { out.slice_mut()[0] = v };
    KVE_OK
}

pub unsafe fn device_count(count: *mut i32) -> i32 {
    let mut out = tri!(out_param(count));
    let mut c: c_int = 0;
    // SAFETY: writes one int to a local.
    let st = unsafe { cu::kve_cuda_device_count(&mut c) };
    // SAFETY: out_param checked non-NULL and aligned; one element.
    unsafe { out.slice_mut()[0] = if st == 0 { c } else { 0 } };
    KVE_OK
}

/// `kve_cuda_select_model` and its linked form (`links`: the sums, their length and the
/// threshold): the parameters and the scores' descriptor checked on the host, then the
/// device selection into the kept lists `(counts, counts_len, idx, idx_ld, idx_len)`,
/// enqueued on `stream`.
///
/// # Safety
/// `params` and `scores` are NULL or the caller's host structs; the scores, the links, the
/// lists and the workspace `(pointer, bytes)` are device memory of the declared sizes.
pub(super) unsafe fn select_model(
    params: *const kve_select_params,
    scores: *const kve_model_scores,
    links: Option<(*const f32, u64, f32)>,
    (counts, counts_len, idx, idx_ld, idx_len): (*mut i32, u64, *mut i32, u64, u64),
    (ws, ws_bytes): (*mut c_void, u64),
    stream: *mut c_void,
) -> Result<()> {
    // SAFETY: host structs the caller passes (NULL and alignment checked).
    let cfg = unsafe { select_config(params)? };
    // SAFETY: a host struct the caller passes (arg checks NULL and alignment).
    let m = *unsafe { arg(scores)? };
    let shape = ModelShape::new(m.layers, m.hkv, m.n, m.window)?;
    let lists = KeptLists {
        counts,
        counts_len,
        idx,
        idx_ld,
        idx_len,
    };
    let (s, len) = (m.scores, m.len);
    // SAFETY: device memory of the declared sizes (this function's contract); the pipeline
    // checks them before any launch.
    unsafe {
        match links {
            None => device::select_model(&cfg, &shape, s, len, &lists, ws, ws_bytes, stream),
            Some((l, l_len, thr)) => {
                let (w, wb) = (ws, ws_bytes);
                device::select_model_linked(
                    &cfg, &shape, s, len, l, l_len, thr, &lists, w, wb, stream,
                )
            }
        }
    }
}
