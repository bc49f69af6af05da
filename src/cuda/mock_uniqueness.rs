//! Test double of `cuda/uniqueness.cu` (feature `cuda-mock`): `kve_cuda_uniqueness` and its
//! workspace size as plain Rust over host memory, with the conventions of `mock.rs` (same
//! validation as the launcher, nothing written on error, the workspace overwritten).
//!
//! Arithmetic: the kernel's, step for step, rather than a call into the core: each row's
//! squared norm in 8 fused lanes (`mul_add`) summed by the core's tree, the tail unfused,
//! `1 / sqrt` both correctly rounded; each pair's cosine one fused chain over `d` in order;
//! each token's 4th largest similarity from lists of -1; the 0.729^(j-6) as repeated products. That is also the core's AVX2 path, so on an AVX2 + FMA host the scores
//! equal the host scorer's bit for bit (tests/launchers.rs, `uniqueness_matches_host_scorer`), and the test shows what
//! the kernel computes without a GPU.
//!
//! Structure: the kernel's two scans, tile for tile: the band (each row tile of 64 against
//! the column tiles within [`NEAR`] of it; every pair when `N <= NEAR + 64`), the list of
//! the tokens it leaves below the cutoff, then groups of 64 listed tokens against the
//! whole cache, their lists restarted, column tiles outward from the group's first token's,
//! stopping after the first tile that leaves every token of the group settled.

#![allow(clippy::missing_safety_doc)] // the contract: src/cuda.rs, cuda/kvevict_cuda.h

use super::mock::{get, scribble, view_ok};
use super::KveCudaView;
use core::ffi::{c_int, c_void};
use std::vec::Vec;

/// `cudaErrorInvalidValue`.
const INVALID: c_int = 1;
/// Tokens per row tile of the kernel, and its row tiles (a grid dimension).
const TILE: i64 = 64;
const MAX_TILES: i64 = 65535;

/// The kernel's part sizes, 4 bytes an element rounded up to 256; `None` on overflow.
fn part_bytes(heads: i64, n: i64, d: i64) -> Option<usize> {
    let x = (heads as usize)
        .checked_mul(n as usize)?
        .checked_mul(d as usize)?;
    x.checked_mul(4)?.checked_add(255).map(|b| b / 256 * 256)
}

/// `usize::MAX` (the kernel's `SIZE_MAX`) when the size overflows.
pub unsafe fn kve_cuda_uniqueness_workspace_size(heads: i64, n: i64, dk: i64, dv: i64) -> usize {
    if heads < 0 || n < 0 || dk < 0 || dv < 0 {
        return 0;
    }
    // unit K, unit V, floors, open lists, their counts
    let parts = [(n, dk), (n, dv), (n, 1), (n, 1), (1, 1)].map(|(t, d)| part_bytes(heads, t, d));
    parts
        .into_iter()
        .try_fold(0usize, |a, b| a.checked_add(b?))
        .unwrap_or(usize::MAX)
}

/// Unit rows of head `h` (`[N][d]`), as the kernel's `unit_rows_kernel`.
unsafe fn unit_rows(x: &KveCudaView, h: usize) -> Vec<f32> {
    // SAFETY: `x` was validated by `view_ok` and `h` < heads (caller), so every `get` is inside it.
    unsafe {
        let (n, d) = (x.tokens as usize, x.dim as usize);
        let d8 = d / 8 * 8;
        let mut out = Vec::with_capacity(n * d);
        for t in 0..n {
            let mut lane = [0f32; 8];
            for c in (0..d8).step_by(8) {
                for (l, a) in lane.iter_mut().enumerate() {
                    let v = get(x, h, t, c + l);
                    *a = v.mul_add(v, *a);
                }
            }
            let mut s = ((lane[0] + lane[4]) + (lane[2] + lane[6]))
                + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
            for c in d8..d {
                let v = get(x, h, t, c);
                s += v * v;
            }
            let inv = if s > 0.0 { 1.0 / s.sqrt() } else { 1.0 };
            out.extend((0..d).map(|c| get(x, h, t, c) * inv));
        }
        out
    }
}

/// The kernel's `UQ_RANK` and `UQ_REACH`.
const RANK: usize = 4;
const REACH: usize = 10;
/// The kernel's `UQ_FLAT`: the first tokens before get the whole score.
const FLAT: usize = 6;
/// The kernel's `UQ_DECAY`: the share lent past [`FLAT`], per token further back.
const DECAY: f32 = 0.729;

/// `m` into the descending list `l` when it beats its last entry.
fn insert_top(l: &mut [f32; RANK], m: f32) {
    if m > l[RANK - 1] {
        l[RANK - 1] = m;
        l.sort_by(|a, b| b.total_cmp(a));
    }
}

/// `Σ_c a[c]·b[c]`, one fused multiply-add per term, in order.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0f32, |s, (x, y)| x.mul_add(*y, s))
}

/// The kernel's `UQ_CUTOFF` and `UQ_NEAR`.
const CUTOFF: f32 = 0.5;
const NEAR: usize = 128;

/// The pairs of `rows` with column tile `j0..j0 + 64` (tokens < n), `j != i`, into the rows'
/// lists (the kernel's `pair_tile`).
fn pair_tile(
    ku: &[f32],
    vu: &[f32],
    dk: usize,
    dv: usize,
    n: usize,
    rows: &[usize],
    j0: usize,
    top: &mut [[f32; RANK]],
) {
    for (r, &i) in rows.iter().enumerate() {
        for j in j0..(j0 + TILE as usize).min(n) {
            if j != i {
                let ck = dot(&ku[i * dk..(i + 1) * dk], &ku[j * dk..(j + 1) * dk]);
                let cv = dot(&vu[i * dv..(i + 1) * dv], &vu[j * dv..(j + 1) * dv]);
                insert_top(&mut top[r], ck.min(cv));
            }
        }
    }
}

/// Every token's floor (its 4th similarity) as the kernel's two scans leave it: exact below
/// the cutoff, at or past it otherwise.
fn floors(ku: &[f32], vu: &[f32], dk: usize, dv: usize, n: usize) -> Vec<f32> {
    let t = TILE as usize;
    let whole = n <= NEAR + t;
    let reach = if whole { n } else { NEAR };
    let mut floor = std::vec![-1f32; n];
    // scan 1: the band of each row tile
    for i0 in (0..n).step_by(t) {
        let rows: Vec<usize> = (i0..(i0 + t).min(n)).collect();
        let mut top = std::vec![[-1f32; RANK]; rows.len()];
        let lo = if i0 > reach { (i0 - reach) / t * t } else { 0 };
        let hi = if n - i0 > reach + t {
            i0 + t + reach
        } else {
            n
        };
        for j0 in (lo..hi).step_by(t) {
            pair_tile(ku, vu, dk, dv, n, &rows, j0, &mut top);
        }
        for (r, &i) in rows.iter().enumerate() {
            floor[i] = top[r][RANK - 1];
        }
    }
    if whole {
        return floor;
    }
    // the open list, then scan 2 per group of 64 listed tokens
    let open: Vec<usize> = (0..n).filter(|&i| floor[i] < CUTOFF).collect();
    let tiles = n.div_ceil(t) as i64;
    for rows in open.chunks(t) {
        let mut top = std::vec![[-1f32; RANK]; rows.len()];
        let p0 = (rows[0] / t) as i64;
        for step in 0..2 * tiles {
            let p = if step & 1 == 1 {
                p0 - (step + 1) / 2
            } else {
                p0 + step / 2
            };
            if p < 0 || p >= tiles {
                continue;
            }
            pair_tile(ku, vu, dk, dv, n, rows, p as usize * t, &mut top);
            if top.iter().all(|l| l[RANK - 1] >= CUTOFF) {
                break;
            }
        }
        for (r, &i) in rows.iter().enumerate() {
            floor[i] = top[r][RANK - 1];
        }
    }
    floor
}

/// `max(0, 1 - r)^24`, 0 from the cutoff on, as the kernel's `sharpen`.
fn sharpen(r: f32) -> f32 {
    let x = (1.0 - r).max(0.0);
    let u2 = x * x;
    let u8 = (u2 * u2) * (u2 * u2);
    if r >= CUTOFF {
        0.0
    } else {
        (u8 * u8) * u8
    }
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn kve_cuda_uniqueness(
    k: *const KveCudaView,
    v: *const KveCudaView,
    prefix: i64,
    out: *mut f32,
    ld_out: i64,
    ws: *mut c_void,
    ws_bytes: usize,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller keeps kvevict_cuda.h's contract for this launcher (each non-null pointer
    // covers the extents it passes; host memory under the mock), and the checks below reject null
    // and out-of-range arguments before the first access.
    unsafe {
        let (Some(kd), Some(vd)) = (view_ok(k), view_ok(v)) else {
            return INVALID;
        };
        if kd.dtype != vd.dtype || vd.heads != kd.heads || vd.tokens != kd.tokens {
            return INVALID;
        }
        let (heads, n) = (kd.heads, kd.tokens);
        if prefix < 0 || prefix > n || heads > 65535 || (n + TILE - 1) / TILE > MAX_TILES {
            return INVALID;
        }
        if kd.dim > i32::MAX as i64 || vd.dim > i32::MAX as i64 {
            return INVALID;
        }
        if prefix == 0 || heads == 0 {
            return 0;
        }
        if out.is_null() || ld_out < prefix {
            return INVALID;
        }
        let need = kve_cuda_uniqueness_workspace_size(heads, n, kd.dim, vd.dim);
        if need == usize::MAX || ws.is_null() || ws_bytes < need || (ws as usize) % 256 != 0 {
            return INVALID;
        }
        // everything is read before the workspace and `out` are written (they may not overlap
        // the inputs on the device either)
        let (n, p) = (n as usize, prefix as usize);
        let mut scores = Vec::with_capacity(heads as usize * p);
        for h in 0..heads as usize {
            let (ku, vu) = (unit_rows(&kd, h), unit_rows(&vd, h));
            let (dk, dv) = (kd.dim as usize, vd.dim as usize);
            let floor = floors(&ku, &vu, dk, dv, n);
            let u: Vec<f32> = floor[..p].iter().map(|&r| sharpen(r)).collect();
            scores.extend((0..p).map(|i| {
                let (mut s, mut f) = (u[i], 1f32);
                for j in 1..=REACH {
                    if j > FLAT {
                        f *= DECAY;
                    }
                    if let Some(&x) = u.get(i + j) {
                        s = s.max(f * x);
                    }
                }
                s
            }));
        }
        scribble(ws, need);
        for (h, row) in scores.chunks_exact(p).enumerate() {
            core::ptr::copy_nonoverlapping(row.as_ptr(), out.add(h * ld_out as usize), p);
        }
        0
    }
}
