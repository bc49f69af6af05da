//! The device entry points with feature `cuda` (or `cuda-mock`): C descriptors to the
//! core's types, then the device pipeline (`crate::device`), its `Error` to a status.

#![deny(unsafe_op_in_unsafe_fn)]

use super::super::params::{read_ext, score_config, select_config};
use super::super::score::{kve_layer_inputs, KVE_LAYER_INPUTS_V1_SIZE, NO_INPUTS};
use super::super::select::kve_model_scores;
use super::super::{
    arg, kve_score_params, kve_select_params, kve_tensor, out_param, status_of, to_status, tri,
    Tensor, KVE_OK,
};
use crate::cuda as cu;
use crate::device::{self, select::KeptLists, Floats};
use crate::error::{Error, Result};
use crate::score::LayerShape;
use crate::shape::ModelShape;
use core::ffi::{c_int, c_void};

fn i64_of(v: u64) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::Overflow)
}

/// Host-side checks of a device tensor (those of a host tensor), then the launcher's
/// descriptor and the bytes the tensor declares.
fn tensor(t: &kve_tensor) -> Result<device::Tensor> {
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
unsafe fn write<T>(p: *mut T, v: Result<T>) -> i32 {
    let out = tri!(out_param(p));
    let v = tri!(v);
    // SAFETY: out_param checked non-NULL and aligned; one element.
    unsafe { out.slice_mut()[0] = v };
    KVE_OK
}

pub unsafe fn device_count(count: *mut i32) -> i32 {
    let out = tri!(out_param(count));
    let mut c: c_int = 0;
    // SAFETY: writes one int to a local.
    let st = unsafe { cu::kve_cuda_device_count(&mut c) };
    // SAFETY: out_param checked non-NULL and aligned; one element.
    unsafe { out.slice_mut()[0] = if st == 0 { c } else { 0 } };
    KVE_OK
}

pub unsafe fn score_workspace_size(
    params: *const kve_score_params,
    hq: u64,
    hkv: u64,
    n: u64,
    dk: u64,
    dv: u64,
    out_bytes: *mut u64,
) -> i32 {
    // SAFETY: `params` is NULL or the caller's struct of `struct_size` bytes (checked).
    let bytes = unsafe { score_config(params) }.and_then(|cfg| {
        let shape = LayerShape::from_dims(hq, hkv, n, dk, dv)?;
        device::score_workspace_size(&cfg, &shape)
    });
    // SAFETY: a host out-parameter, checked before it is written.
    unsafe { write(out_bytes, bytes.map(|b| b as u64)) }
}

pub unsafe fn score_layer(
    params: *const kve_score_params,
    inputs: *const kve_layer_inputs,
    out: *mut f32,
    out_len: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
    stream: *mut c_void,
) -> i32 {
    // SAFETY: host structs the caller passes, read within their checked `struct_size`.
    let cfg = tri!(unsafe { score_config(params) });
    // SAFETY: as above.
    let d = tri!(unsafe { read_ext(inputs, KVE_LAYER_INPUTS_V1_SIZE, NO_INPUTS) });
    if d.reserved != 0 {
        return status_of(Error::InvalidArgument);
    }
    let floats = |ptr, len| Floats { ptr, len };
    let li = device::LayerInputs {
        queries: tensor(&d.queries),
        keys: tensor(&d.keys),
        values: tensor(&d.values),
        gram: floats(d.gram, d.gram_len),
        value_forms: floats(d.value_forms, d.value_forms_len),
        value_l1: floats(d.value_l1, d.value_l1_len),
        row_lse: floats(d.row_lse, d.row_lse_len),
    };
    // SAFETY: the tensors, `out` and the workspace are device memory of the declared
    // sizes (this function's contract); the pipeline checks them before any launch.
    to_status(unsafe {
        device::score_layer(&cfg, &li, out, out_len, workspace, workspace_bytes, stream)
    })
}

pub unsafe fn select_workspace_size(
    params: *const kve_select_params,
    layers: u64,
    hkv: u64,
    n: u64,
    window: u64,
    out_bytes: *mut u64,
) -> i32 {
    // SAFETY: `params` is NULL or the caller's struct of `struct_size` bytes (checked).
    let bytes = unsafe { select_config(params) }.and_then(|cfg| {
        let shape = ModelShape::new(layers, hkv, n, window)?;
        device::select_workspace_size(&cfg, &shape)
    });
    // SAFETY: a host out-parameter, checked before it is written.
    unsafe { write(out_bytes, bytes.map(|b| b as u64)) }
}

pub unsafe fn select_model(
    params: *const kve_select_params,
    scores: *const kve_model_scores,
    counts: *mut i32,
    counts_len: u64,
    idx: *mut i32,
    idx_ld: u64,
    idx_len: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
    stream: *mut c_void,
) -> i32 {
    // SAFETY: host structs the caller passes (NULL and alignment checked).
    let cfg = tri!(unsafe { select_config(params) });
    // SAFETY: as above.
    let m = tri!(unsafe { arg(scores) });
    let shape = tri!(ModelShape::new(m.layers, m.hkv, m.n, m.window));
    let lists = KeptLists {
        counts,
        counts_len,
        idx,
        idx_ld,
        idx_len,
    };
    // SAFETY: scores, lists and workspace are device memory of the declared sizes (this
    // function's contract); the pipeline checks them before any launch.
    to_status(unsafe {
        device::select_model(
            &cfg,
            &shape,
            m.scores,
            m.len,
            &lists,
            workspace,
            workspace_bytes,
            stream,
        )
    })
}

pub unsafe fn compact_workspace_size(
    kv: *const kve_tensor,
    max_keep: u64,
    out_bytes: *mut u64,
) -> i32 {
    // SAFETY: a host descriptor (NULL and alignment checked).
    let v = tri!(tensor(tri!(unsafe { arg(kv) })));
    let b = tri!(device::compact_workspace_size(&v.view, max_keep));
    // SAFETY: a host out-parameter, checked before it is written.
    unsafe { write(out_bytes, Ok(b as u64)) }
}

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
    // SAFETY: a host descriptor (NULL and alignment checked).
    let v = tri!(tensor(tri!(unsafe { arg(kv) })));
    // SAFETY: the view, lists and workspace are device memory (this function's contract).
    to_status(unsafe {
        device::compact_in_place(
            &v.view,
            kept,
            kept_ld,
            counts,
            max_keep,
            workspace,
            workspace_bytes,
            stream,
        )
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
    // SAFETY: a host descriptor (NULL and alignment checked).
    let v = tri!(tensor(tri!(unsafe { arg(src) })));
    // SAFETY: the view, lists and outputs are device memory (this function's contract).
    to_status(unsafe {
        device::compact_varlen(&v.view, kept, kept_ld, counts, dst, cu_seqlens, stream)
    })
}
