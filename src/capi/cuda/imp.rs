//! Conversions of the device entry points (features `cuda`, `cuda-emu`): C tensor
//! descriptors to the device pipeline's, out-parameters; the device count.

use super::super::{kve_tensor, out_param, tri, Tensor, KVE_OK};
use crate::cuda as cu;
use crate::device;
use crate::error::{Error, Result};
use core::ffi::{c_int, c_void};

fn i64_of(v: u64) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::Overflow)
}

/// Host-side checks of a device tensor (those of a host tensor), then the launcher's
/// descriptor and the bytes the tensor declares.
pub(super) fn tensor(t: &kve_tensor) -> Result<device::Tensor> {
    let checked = Tensor::new(t)?;
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
