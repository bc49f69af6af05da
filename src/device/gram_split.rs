//! LaProx's Gram prepared once per model for the tensor cores: the f32 Gram rounded to
//! the values' dtype (hi) and, optionally, its rounding residual (lo; hi + lo is an
//! f32-accurate G, at twice the MMA work). `score_layer` without it splits the Gram into
//! its workspace on every call; a caller that keeps the split passes it instead.
//!
//! Layout of the caller's device buffer: hi (`n` elements of the dtype), then lo from the
//! next 256-byte boundary (16-bit dtypes with the lo half only). For f32 values hi is the
//! Gram itself (f32 needs no split) and there is no lo.

use super::{ck, span_of, Floats};
use crate::cuda as cu;
use crate::error::{mul, Error, Result};
use crate::span::check_alias;
use crate::view::DType;
use core::ffi::c_void;

/// A caller's prepared Gram (device memory) as a scoring call receives it.
#[derive(Clone, Copy, Debug)]
pub struct GramSplit {
    pub ptr: *const c_void,
    pub bytes: u64,
    /// The residual half is present (`kve_cuda_prepare_gram`'s `with_lo`).
    pub with_lo: bool,
}

/// The launcher's dtype code; the kernels take no block-quantized values
/// (`UnsupportedDtype`).
fn code(dtype: DType) -> Result<i32> {
    match dtype {
        DType::F32 => Ok(cu::KVE_CUDA_F32),
        DType::F16 => Ok(cu::KVE_CUDA_F16),
        DType::BF16 => Ok(cu::KVE_CUDA_BF16),
        DType::Q8_0 | DType::Q4_0 => Err(Error::UnsupportedDtype),
    }
}

/// Byte offset of the lo half and the total bytes for `n` Gram floats.
fn plan(n: usize, dtype: DType, with_lo: bool) -> Result<(usize, usize)> {
    code(dtype)?;
    let hi = mul(n, dtype.size())?;
    if dtype == DType::F32 || !with_lo || n == 0 {
        return Ok((hi, hi));
    }
    let lo = hi.checked_add(255).ok_or(Error::Overflow)? / 256 * 256;
    Ok((lo, lo.checked_add(hi).ok_or(Error::Overflow)?))
}

/// Bytes of the split of `n` Gram floats (`kve_gram_len`) for values of `dtype`.
pub fn gram_split_size(n: usize, dtype: DType, with_lo: bool) -> Result<usize> {
    Ok(plan(n, dtype, with_lo)?.1)
}

/// Write the split of the f32 Gram `gram` (`n` floats) into `split` on `stream`.
///
/// # Safety
/// `gram` and `split` are device memory of the declared sizes.
pub unsafe fn gram_split(
    gram: Floats,
    dtype: DType,
    with_lo: bool,
    split: *mut c_void,
    split_bytes: u64,
    stream: *mut c_void,
) -> Result<()> {
    let g = gram.get()?;
    let n = usize::try_from(gram.len).map_err(|_| Error::Overflow)?;
    let (lo_at, need) = plan(n, dtype, with_lo)?;
    if (split_bytes as u128) < need as u128 {
        return Err(Error::OutputTooSmall);
    }
    if need > 0 && split.is_null() {
        return Err(Error::NullPointer);
    }
    if (split as usize) % super::ALIGN != 0 {
        return Err(Error::Misaligned);
    }
    let Some(g) = g else {
        return Ok(()); // an empty Gram: nothing to split
    };
    check_alias(&[span_of(split as *const u8, need)?], &[span_of(g, n)?])?;
    let lo = if need > lo_at {
        (split as *mut u8).wrapping_add(lo_at) as *mut c_void
    } else {
        core::ptr::null_mut()
    };
    let n = i64::try_from(n).map_err(|_| Error::Overflow)?;
    let dt = code(dtype)?;
    // SAFETY: the caller's device buffers, sizes checked above.
    ck(unsafe { cu::kve_cuda_gram_split(g, n, dt, split, lo, stream) })
}

impl GramSplit {
    /// The hi and lo (or NULL) parts for `n` Gram floats and values of launcher dtype
    /// `dt`; `ShapeMismatch` unless the buffer is exactly that split's size.
    pub(crate) fn parts(&self, n: usize, dt: i32) -> Result<(*const c_void, *const c_void)> {
        let dtype = match dt {
            cu::KVE_CUDA_F32 => DType::F32,
            cu::KVE_CUDA_F16 => DType::F16,
            _ => DType::BF16,
        };
        let (lo_at, need) = plan(n, dtype, self.with_lo)?;
        if self.bytes as u128 != need as u128 {
            return Err(Error::ShapeMismatch);
        }
        if self.ptr.is_null() {
            return Err(Error::NullPointer);
        }
        if (self.ptr as usize) % super::ALIGN != 0 {
            return Err(Error::Misaligned);
        }
        let lo = if need > lo_at {
            (self.ptr as *const u8).wrapping_add(lo_at) as *const c_void
        } else {
            core::ptr::null()
        };
        Ok((self.ptr, lo))
    }
}
