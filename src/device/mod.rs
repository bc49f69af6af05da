//! The device pipeline: what the CUDA entry points enqueue, typed on the core's
//! [`ScoreConfig`](crate::ScoreConfig), [`LayerShape`](crate::LayerShape),
//! [`SelectConfig`](crate::SelectConfig) and [`ModelShape`](crate::ModelShape).
//!
//! - [`score`]: one layer's scores as a chain of launches per scorer (design §3), the same
//!   formulas in the same order as the host scorers in `src/math/score`.
//! - [`select`]: every allocator and granularity (design §4) as the host's `select_model`
//!   decides them, per-layer budgets computed on the device.
//! - [`compact`]: compaction of the kept rows.
//!
//! Every call checks everything the host can check (pointers, lengths, alignment,
//! workspace size, aliasing, the kernels' [`limits`](crate::device::limits)) before it enqueues anything, and
//! returns the core's [`Error`]; a launcher that refuses its arguments gives
//! [`Error::Cuda`]. Buffers are device pointers; descriptors live on the host. Nothing
//! synchronises. The C layer (`src/capi/cuda`) only converts arguments and statuses.

pub mod compact;
pub mod gram_split;
pub mod limits;
pub mod links;
pub mod score;
pub mod select;

use crate::cuda as cu;
use crate::error::{Error, Result};
use crate::span::Span;
use crate::workspace::DeviceCarve as Carve;
use core::ffi::{c_int, c_void};

pub use compact::{
    compact_batch, compact_batch_in_place, compact_batch_in_place_workspace_size,
    compact_batch_workspace_size, compact_in_place, compact_varlen, compact_workspace_size,
    BatchItem, BatchItems,
};
pub use gram_split::{gram_split, gram_split_size, GramSplit};
pub use links::{accumulate_value_links, select_model_linked, value_links_workspace_size};
pub use score::{score_layer, score_layer_split, score_workspace_size, LayerInputs};
pub use select::{select_model, select_workspace_size};

/// Alignment of every workspace part (cudaMalloc gives 256).
pub const ALIGN: usize = Carve::ALIGN;

/// A device tensor the caller has checked on the host (`kve_tensor` rules: dtype,
/// extents and strides within its `len`), with the bytes it may reach.
#[derive(Clone, Copy, Debug)]
pub struct Tensor {
    pub view: cu::KveCudaView,
    /// `[start, end)` of the buffer the tensor declares (alias checks).
    pub bytes: (usize, usize),
}

impl Tensor {
    pub(crate) fn span(&self) -> Span {
        Span(self.bytes.0, self.bytes.1)
    }
}

/// A device `const float*` with its length in floats: `NULL` with 0 is absent.
#[derive(Clone, Copy, Debug)]
pub struct Floats {
    pub ptr: *const f32,
    pub len: u64,
}

impl Floats {
    pub const NONE: Floats = Floats {
        ptr: core::ptr::null(),
        len: 0,
    };
    /// `None` when absent; a `NULL` with a length, or a misaligned pointer, is an error.
    fn get(&self) -> Result<Option<*const f32>> {
        if self.ptr.is_null() {
            return if self.len == 0 {
                Ok(None)
            } else {
                Err(Error::NullPointer)
            };
        }
        if (self.ptr as usize) % 4 != 0 {
            return Err(Error::Misaligned);
        }
        Ok(Some(self.ptr))
    }
}

/// A launcher's status as ours: `Err(Cuda)` for anything but cudaSuccess.
fn ck(st: c_int) -> Result<()> {
    if st == 0 {
        Ok(())
    } else {
        Err(Error::Cuda)
    }
}

fn i64_of(v: u64) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::Overflow)
}

/// The bytes of `count` elements of `T` at device address `p` (empty for `NULL`).
pub(crate) fn span_of<T>(p: *const T, count: usize) -> Result<Span> {
    if p.is_null() {
        return Ok(Span::EMPTY);
    }
    crate::span::span_of(p as usize, count, core::mem::size_of::<T>())
}

/// Bytes per element of a launcher dtype code.
fn elem_size(dtype: i32) -> usize {
    if dtype == cu::KVE_CUDA_F32 {
        4
    } else {
        2
    }
}

/// Common checks of a device workspace argument.
pub(crate) fn check_workspace(ws: *mut c_void, have: u64, need: usize) -> Result<()> {
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
