//! Test double of `cuda/links.cu` (feature `cuda-mock`): `kve_cuda_value_links`, its
//! workspace size and `kve_cuda_pool_linked` as plain Rust over host memory, with the
//! conventions of `mock.rs` (the launcher's validation, nothing written on error, the
//! workspace overwritten).
//!
//! Arithmetic: value_links is the kernel's, step for step: per (head, token) the 8 fused
//! lanes and their tree (token rows) or the per-channel chain, fused or not by the token's
//! place (V transposed), the cosine in f64, then the heads summed in order from +0. That is
//! the core's AVX2 + FMA order (`src/links.rs`), so on such a host the links are the host's
//! bits (tests/links_device.rs). pool_linked is the kernel's algorithm too — tiles of 256
//! positions, each a segmented max-scan in the kernel's steps, the carry between tiles —
//! so the tests compare that algorithm with the core's `pool_forward_linked` (the same
//! maxima; only a zero's sign can differ).

#![allow(clippy::missing_safety_doc)] // the contract: src/cuda.rs, cuda/kvevict_cuda.h

use super::mock::{get, scribble, view_ok};
use super::KveCudaView;
use core::ffi::{c_int, c_void};
use std::vec;

/// `cudaErrorInvalidValue`.
const INVALID: c_int = 1;

pub unsafe fn kve_cuda_links_workspace_size(heads: i64, n: i64) -> usize {
    if heads < 0 || n < 0 {
        return 0;
    }
    if heads as f64 * n as f64 * 4.0 > 9.0e18 {
        return usize::MAX;
    }
    (heads as usize * n as usize * 4).div_ceil(256) * 256
}

/// The kernel's `link_cos`: NaN for a non-finite input, 0 where a vector is zero.
fn link_cos(dot: f32, sq: f32, psq: f32) -> f32 {
    if !dot.is_finite() || !sq.is_finite() || !psq.is_finite() {
        return f32::NAN;
    }
    if sq <= 0.0 || psq <= 0.0 {
        return 0.0;
    }
    (dot as f64 / (sq as f64 * psq as f64).sqrt()) as f32
}

/// `(x·y, x·x, y·y)` over channels as the kernel's `value_links_rows`.
unsafe fn dots_rows(v: &KveCudaView, h: usize, t: usize) -> (f32, f32, f32) {
    // SAFETY: `v` was validated by `view_ok`, h < heads and 1 <= t < tokens (caller).
    unsafe {
        let dv = v.dim as usize;
        let d8 = dv / 8 * 8;
        let (mut ld, mut ls, mut lp) = ([0f32; 8], [0f32; 8], [0f32; 8]);
        for c in (0..d8).step_by(8) {
            for l in 0..8 {
                let (x, y) = (get(v, h, t, c + l), get(v, h, t - 1, c + l));
                ld[l] = x.mul_add(y, ld[l]);
                ls[l] = x.mul_add(x, ls[l]);
                lp[l] = y.mul_add(y, lp[l]);
            }
        }
        let tree = |a: [f32; 8]| ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
        let (mut dot, mut sq, mut psq) = (tree(ld), tree(ls), tree(lp));
        for c in d8..dv {
            let (x, y) = (get(v, h, t, c), get(v, h, t - 1, c));
            dot += x * y;
            sq += x * x;
            psq += y * y;
        }
        (dot, sq, psq)
    }
}

/// The same sums as the kernel's `value_links_channels` (V transposed).
unsafe fn dots_channels(v: &KveCudaView, h: usize, t: usize) -> (f32, f32, f32) {
    // SAFETY: as for `dots_rows`.
    unsafe {
        let n = v.tokens as usize;
        let body = 1 + (n - 1) / 8 * 8;
        let (fused, pfused) = (t < body, t > 1 && t - 1 < body);
        let (mut dot, mut sq, mut psq) = (0f32, 0f32, 0f32);
        for c in 0..v.dim as usize {
            let (x, y) = (get(v, h, t, c), get(v, h, t - 1, c));
            if fused {
                dot = x.mul_add(y, dot);
                sq = x.mul_add(x, sq);
            } else {
                dot += x * y;
                sq += x * x;
            }
            psq = if pfused {
                y.mul_add(y, psq)
            } else {
                psq + y * y
            };
        }
        (dot, sq, psq)
    }
}

pub unsafe fn kve_cuda_value_links(
    v: *const KveCudaView,
    links: *mut f32,
    ws: *mut c_void,
    ws_bytes: usize,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (the view covers
    // its extents, links holds N floats, host memory under the mock); the checks below
    // reject null and out-of-range arguments before the first access.
    unsafe {
        let Some(v) = view_ok(v) else {
            return INVALID;
        };
        if v.heads > 65535 || v.tokens > (1 << 31) - 1 {
            return INVALID;
        }
        if v.tokens < 2 || v.heads == 0 {
            return 0;
        }
        if links.is_null() {
            return INVALID;
        }
        let need = kve_cuda_links_workspace_size(v.heads, v.tokens);
        if ws.is_null() || ws_bytes < need || (ws as usize) % 256 != 0 {
            return INVALID;
        }
        let (heads, n) = (v.heads as usize, v.tokens as usize);
        let transposed = v.stride_token == 1 && v.stride_dim != 1;
        scribble(ws, need);
        let mut stage = vec![0f32; heads * n];
        for h in 0..heads {
            for t in 1..n {
                let (dot, sq, psq) = if transposed {
                    dots_channels(&v, h, t)
                } else {
                    dots_rows(&v, h, t)
                };
                stage[h * n + t] = link_cos(dot, sq, psq);
            }
        }
        for t in 1..n {
            let mut s = 0f32;
            for h in 0..heads {
                s += stage[h * n + t];
            }
            *links.add(t) += s;
        }
        0
    }
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn kve_cuda_pool_linked(
    input: *const f32,
    ld_in: i64,
    out: *mut f32,
    ld_out: i64,
    rows: i64,
    n: i64,
    k: c_int,
    sinks: i64,
    links: *const f32,
    link_min: f32,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract (each non-null pointer covers the
    // extents it passes; host memory under the mock); the checks below come first.
    unsafe {
        if rows < 0 || n < 0 || sinks < 0 || !(1..=4096).contains(&k) || link_min.is_nan() {
            return INVALID;
        }
        if rows == 0 || n == 0 {
            return 0;
        }
        if input.is_null() || out.is_null() || links.is_null() || ld_in < n || ld_out < n {
            return INVALID;
        }
        if rows > 0x7fff_ffff {
            return INVALID;
        }
        let n = n as usize;
        let l = core::slice::from_raw_parts(links, n);
        let (mut src, mut dst) = (vec![0f32; n], vec![0f32; n]);
        for r in 0..rows as usize {
            core::ptr::copy(input.add(r * ld_in as usize), src.as_mut_ptr(), n);
            pool_linked_row(&src, &mut dst, k as usize, sinks as usize, l, link_min);
            core::ptr::copy(dst.as_ptr(), out.add(r * ld_out as usize), n);
        }
        0
    }
}

/// Threads of the kernel's block: the tile of one scan.
const PL_NT: usize = 256;

/// One row of the kernel's `pool_linked_kernel`, thread by thread and step by step.
fn pool_linked_row(x: &[f32], y: &mut [f32], k: usize, sinks: usize, links: &[f32], min: f32) {
    let n = x.len();
    let mut carry = f32::NEG_INFINITY;
    for j0 in (0..n).step_by(PL_NT) {
        let mut pre = [f32::NEG_INFINITY; PL_NT];
        let mut starts = [true; PL_NT];
        let mut v = [0f32; PL_NT];
        for i in 0..PL_NT {
            let j = j0 + i;
            let s = if j < n { x[j] } else { 0.0 };
            starts[i] = j >= n || j == 0 || j == sinks || links[j] <= min || links[j].is_nan();
            if j < n && starts[i] && j > sinks {
                let lo = (j + 1).saturating_sub(k).max(sinks);
                for a in (lo..j).rev() {
                    pre[i] = pre[i].max(x[a]);
                }
            }
            v[i] = if starts[i] { pre[i].max(s) } else { s };
        }
        // the inclusive segmented max-scan, Hillis-Steele as the block runs it
        let mut hd = starts;
        let mut off = 1;
        while off < PL_NT {
            let (val, head) = (v, hd);
            for i in off..PL_NT {
                if !hd[i] {
                    v[i] = v[i].max(val[i - off]);
                    hd[i] = head[i - off];
                }
            }
            off <<= 1;
        }
        for i in 0..PL_NT {
            if !hd[i] {
                v[i] = v[i].max(carry);
            }
        }
        for i in 0..PL_NT {
            let j = j0 + i;
            if j < n {
                let prev = if i == 0 { carry } else { v[i - 1] };
                let best = if starts[i] { pre[i] } else { prev };
                y[j] = if j >= sinks && best > x[j] {
                    best
                } else {
                    x[j]
                };
            }
        }
        carry = v[PL_NT - 1];
    }
}
