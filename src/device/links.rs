//! Value links on the device (`crate::links`, `cuda/links.cu`): accumulated per layer into
//! a device `links[n]`, and the model selection whose forward post-pool runs on through
//! them (the host's `select_model_linked`).

use super::limits::MAX_GRID;
use super::select::{select_with, KeptLists, Linked};
use super::{check_workspace, ck, span_of, Tensor};
use crate::config::{PoolKind, SelectConfig};
use crate::cuda as cu;
use crate::error::{Error, Result};
use crate::shape::ModelShape;
use crate::span::check_alias;
use core::ffi::c_void;

/// Device workspace bytes of [`accumulate_value_links`] for `hkv` heads of `n` tokens:
/// `hkv` in `1 ..= MAX_GRID`, `n` in `1 ..= MAX_TOKENS` (else `InvalidArgument`, as the
/// host's size query).
pub fn value_links_workspace_size(hkv: u64, n: u64) -> Result<usize> {
    if hkv == 0 || hkv > MAX_GRID || n == 0 || n > crate::error::MAX_TOKENS as u64 {
        return Err(Error::InvalidArgument);
    }
    let (h, n) = (super::i64_of(hkv)?, super::i64_of(n)?);
    // SAFETY: a pure host function.
    let b = unsafe { cu::kve_cuda_links_workspace_size(h, n) };
    if b == usize::MAX {
        return Err(Error::Overflow);
    }
    Ok(b)
}

/// Add `Σ_h cos(v[h, i], v[h, i-1])` over the heads of one layer's `values` to
/// `links[i]`, `1 <= i < N` (`links_len >= N` floats, device memory).
///
/// # Safety
/// The tensor's data, `links` and `workspace` are device memory of the declared sizes.
pub unsafe fn accumulate_value_links(
    values: &Tensor,
    links: *mut f32,
    links_len: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
    stream: *mut c_void,
) -> Result<()> {
    let v = &values.view;
    let n = v.tokens as u64;
    if links.is_null() && (links_len > 0 || n > 0) {
        return Err(Error::NullPointer);
    }
    if (links as usize) % 4 != 0 {
        return Err(Error::Misaligned);
    }
    if links_len < n {
        return Err(Error::OutputTooSmall);
    }
    if v.heads as u64 > MAX_GRID {
        return Err(Error::InvalidArgument);
    }
    let need = value_links_workspace_size(v.heads as u64, n)?;
    check_workspace(workspace, workspace_bytes, need)?;
    let writes = [
        span_of(links as *const f32, n as usize)?,
        span_of(workspace as *const u8, need)?,
    ];
    check_alias(&writes, &[values.span()])?;
    // SAFETY: the caller's device buffers, their sizes checked above.
    ck(unsafe { cu::kve_cuda_value_links(v, links, workspace, workspace_bytes as usize, stream) })
}

/// The device [`select_model`](super::select_model) whose forward post-pool (decay 1) is
/// carried on through linked positions: `i` continues `i - 1` when `links[i] / (layers ·
/// hkv)` exceeds `threshold`. `links`: exactly `n` floats (device memory; else
/// `ShapeMismatch`); forward post-pool with decay 1 and a finite threshold, else
/// `InvalidArgument`. Non-finite links cannot be seen from the host: a NaN sum links
/// nothing.
///
/// # Safety
/// As [`select_model`](super::select_model); `links` is device memory of `links_len` floats.
#[allow(clippy::too_many_arguments)]
pub unsafe fn select_model_linked(
    cfg: &SelectConfig,
    m: &ModelShape,
    scores: *const f32,
    scores_len: u64,
    links: *const f32,
    links_len: u64,
    threshold: f32,
    out: &KeptLists,
    workspace: *mut c_void,
    workspace_bytes: u64,
    stream: *mut c_void,
) -> Result<()> {
    cfg.validate()?;
    if links.is_null() {
        return Err(Error::NullPointer);
    }
    if (links as usize) % 4 != 0 {
        return Err(Error::Misaligned);
    }
    if links_len != m.n as u64 {
        return Err(Error::ShapeMismatch);
    }
    let flat = cfg.post_pool.kind == PoolKind::Forward && cfg.post_pool.decay == 1.0;
    if !flat || !threshold.is_finite() {
        return Err(Error::InvalidArgument);
    }
    let l = Linked {
        sums: links,
        link_min: crate::budget::link_min(threshold, m.layers * m.hkv),
    };
    // SAFETY: the caller's contract, passed on; `links` holds n floats (checked above).
    unsafe {
        select_with(
            cfg,
            m,
            scores,
            scores_len,
            Some(l),
            out,
            workspace,
            workspace_bytes,
            stream,
        )
    }
}
