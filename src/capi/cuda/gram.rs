//! LaProx's Gram split once per model for the device (`kve_cuda_prepare_gram`) and the
//! scoring call that takes it (`kve_cuda_score_layer_prepared`): `kve_cuda_score_layer`
//! given `gram` re-splits it into its workspace on every call.

use super::super::kve_layer_inputs;
use super::super::params::kve_score_params;
use core::ffi::c_void;

#[cfg(feature = "cuda")]
use {
    super::super::{to_status, tri},
    super::imp::write,
    crate::device::{self, Floats, GramSplit},
    crate::error::{Error, Result},
    crate::view::DType,
};

/// `with_lo` as a flag: 0 or 1.
#[cfg(feature = "cuda")]
fn flag(with_lo: u32) -> Result<bool> {
    match with_lo {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(Error::InvalidArgument),
    }
}

/// Device bytes of `kve_cuda_prepare_gram`'s output for a Gram of `gram_len` floats
/// (`kve_gram_len`) and values of `dtype` (`KVE_DTYPE_*`). `with_lo` 1: the Gram rounded
/// to the dtype plus its rounding residual (two tensor-core products, an f32-accurate G:
/// what `kve_cuda_score_layer` computes); 0: the rounded Gram alone (half the
/// tensor-core work of LaProx's value term, G to 8 (bf16) or 11 (f16) bits). f32 values:
/// the Gram itself, whatever `with_lo`. Writes only `*out_bytes`.
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_prepare_gram_size(
    gram_len: u64,
    dtype: u32,
    with_lo: u32,
    out_bytes: *mut u64,
) -> i32 {
    cuda_only!({
        let b = DType::from_u32(dtype).and_then(|dt| {
            let n = usize::try_from(gram_len).map_err(|_| Error::Overflow)?;
            device::gram_split_size(n, dt, flag(with_lo)?)
        });
        // SAFETY: a host out-parameter, checked before it is written.
        unsafe { write(out_bytes, b.map(|b| b as u64)) }
    })
}

/// Split LaProx's f32 Gram (`gram`, `gram_len` floats from `kve_compute_gram`, device
/// memory) for values of `dtype` into `split` (device memory, 256-byte aligned,
/// `kve_cuda_prepare_gram_size` bytes, not overlapping `gram`), enqueued on `stream`. Once
/// per model and layer; pass `split` to `kve_cuda_score_layer_prepared` with the same
/// `dtype` (the values') and `with_lo`. With `with_lo = 1` the scores equal
/// `kve_cuda_score_layer`'s given `gram`, bit for bit.
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_prepare_gram(
    gram: *const f32,
    gram_len: u64,
    dtype: u32,
    with_lo: u32,
    split: *mut c_void,
    split_bytes: u64,
    stream: *mut c_void,
) -> i32 {
    cuda_only!({
        let dt = tri!(DType::from_u32(dtype));
        let lo = tri!(flag(with_lo));
        let g = Floats {
            ptr: gram,
            len: gram_len,
        };
        // SAFETY: gram and split are device memory of the declared sizes (this function's
        // contract); everything is checked before the launch.
        to_status(unsafe { device::gram_split(g, dt, lo, split, split_bytes, stream) })
    })
}

/// `kve_cuda_score_layer` with LaProx's Gram given split (`kve_cuda_prepare_gram`: `split`,
/// `split_bytes`, `with_lo` as made there, for the values' dtype) instead of
/// `inputs->gram`: the split is not recomputed. `inputs->gram` and `inputs->value_forms`
/// must be NULL (`KVE_ERR_INVALID_ARGUMENT`); `split_bytes` must be the split's size for
/// this layer's Gram (`kve_gram_len` of its shape and GQA mode) and values' dtype
/// (`KVE_ERR_SHAPE_MISMATCH`). Scorers other than LaProx do not read it. Workspace:
/// `kve_cuda_score_workspace_size` bytes suffice. Everything else as
/// `kve_cuda_score_layer`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kve_cuda_score_layer_prepared(
    params: *const kve_score_params,
    inputs: *const kve_layer_inputs,
    split: *const c_void,
    split_bytes: u64,
    with_lo: u32,
    out: *mut f32,
    out_len: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
    stream: *mut c_void,
) -> i32 {
    cuda_only!({
        // SAFETY: host structs the caller passes, read within their checked `struct_size`.
        let (cfg, li) = tri!(unsafe { super::layer_args(params, inputs) });
        let sp = GramSplit {
            ptr: split,
            bytes: split_bytes,
            with_lo: tri!(flag(with_lo)),
        };
        // SAFETY: the tensors, split, `out` and the workspace are device memory of the
        // declared sizes (this function's contract); the pipeline checks them first.
        to_status(unsafe {
            device::score_layer_split(
                &cfg,
                &li,
                Some(&sp),
                out,
                out_len,
                workspace,
                workspace_bytes,
                stream,
            )
        })
    })
}
