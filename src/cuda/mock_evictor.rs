//! Test double of `cuda/evictor.cu` (feature `cuda-mock`): `kve_cuda_ring_put`,
//! `kve_cuda_span_rows` and `kve_cuda_shift_lists` as plain Rust over host memory, with
//! the launchers' validation (nothing written on error). Pure moves: the kernels' bits.

#![allow(clippy::missing_safety_doc)] // the contract: src/cuda.rs, cuda/kvevict_cuda.h

use super::mock::view_ok;
use super::KveCudaView;
use core::ffi::{c_int, c_void};

/// `cudaErrorInvalidValue`.
const INVALID: c_int = 1;

pub unsafe fn kve_cuda_ring_put(
    q: *const KveCudaView,
    first: i64,
    rows: i64,
    ring: *mut c_void,
    cap: i64,
    seen: i64,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: view_ok validates the view; the caller keeps the header's contract for `ring`
    // (heads·2·cap·dim floats, host memory under the mock).
    unsafe {
        let Some(v) = view_ok(q) else { return INVALID };
        if first < 0 || rows < 0 || cap < 1 || seen < 0 {
            return INVALID;
        }
        if rows > cap || first + rows > v.tokens || v.heads > 65535 {
            return INVALID;
        }
        if rows == 0 || v.heads == 0 || v.dim == 0 {
            return 0;
        }
        if ring.is_null() {
            return INVALID;
        }
        let (cap, dim) = (cap as usize, v.dim as usize);
        let es = if v.dtype == super::KVE_CUDA_F32 { 4 } else { 2 };
        for h in 0..v.heads as usize {
            for j in 0..rows as usize {
                let slot = (seen as usize + j) % cap;
                let t = first as usize + j;
                for d in 0..dim {
                    let off = h * v.stride_head as usize
                        + t * v.stride_token as usize
                        + d * v.stride_dim as usize;
                    let src = (v.data as *const u8).add(off * es);
                    for s in [slot, slot + cap] {
                        let dst = (ring as *mut u8).add(((h * 2 * cap + s) * dim + d) * es);
                        core::ptr::copy_nonoverlapping(src, dst, es);
                    }
                }
            }
        }
        0
    }
}

pub unsafe fn kve_cuda_span_rows(
    src: *const f32,
    rows: i64,
    ld: i64,
    start: i64,
    count: i64,
    dst: *mut f32,
    _stream: *mut c_void,
) -> c_int {
    if rows < 0 || ld < 0 || start < 0 || count < 0 || start + count > ld || rows > 65535 {
        return INVALID;
    }
    if rows == 0 || count == 0 {
        return 0;
    }
    if src.is_null() || dst.is_null() {
        return INVALID;
    }
    let (ld, start, count) = (ld as usize, start as usize, count as usize);
    for r in 0..rows as usize {
        for i in 0..count {
            // SAFETY: the header's contract: src holds rows·ld floats, dst rows·count.
            unsafe { *dst.add(r * count + i) = *src.add(r * ld + start + i) };
        }
    }
    0
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn kve_cuda_shift_lists(
    src_counts: *const i32,
    src_idx: *const i32,
    src_ld: i64,
    rows: i64,
    start: i64,
    counts: *mut i32,
    idx: *mut i32,
    idx_ld: i64,
    _stream: *mut c_void,
) -> c_int {
    if rows < 0 || src_ld < 0 || start < 0 || idx_ld < start || idx_ld > (1i64 << 31) - 1 {
        return INVALID;
    }
    if rows == 0 {
        return 0;
    }
    if src_counts.is_null() || src_idx.is_null() || counts.is_null() || idx.is_null() {
        return INVALID;
    }
    for r in 0..rows as usize {
        // SAFETY: the header's contract: rows lists of src_ld / idx_ld entries, rows counts.
        unsafe {
            let c = (*src_counts.add(r) as i64)
                .clamp(0, src_ld)
                .min(idx_ld - start);
            for t in 0..start + c {
                let v = if t < start {
                    t as i32
                } else {
                    *src_idx.add(r * src_ld as usize + (t - start) as usize) + start as i32
                };
                *idx.add(r * idx_ld as usize + t as usize) = v;
            }
            *counts.add(r) = (start + c) as i32;
        }
    }
    0
}

pub unsafe fn kve_cuda_upload(
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    _stream: *mut c_void,
) -> c_int {
    if bytes == 0 {
        return 0;
    }
    if dst.is_null() || src.is_null() {
        return INVALID;
    }
    // SAFETY: the header's contract: `bytes` readable at src, writable at dst (host
    // memory under the mock), distinct.
    unsafe { core::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, bytes) };
    0
}
