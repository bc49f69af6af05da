//! LaProx's value-output norms without forming `V·Wo` (SPEC §3): per-head Gram matrices
//! `G_ab = Wo_a Wo_bᵀ` (`[dv, dv]`, once per model) and per-token quadratic forms
//! `v G_ab vᵀ = (v Wo_a)·(v Wo_b)`, which an engine may cache when a token enters the cache.
//! CriticalKV's L1 norms `||v Wo_h||_1` cannot come from a Gram matrix and use `Wo` itself.
//!
//! Layouts: Gram `[Hkv][blocks][dv][dv]`, value forms `[Hkv][blocks][N]`, where
//! `blocks = g` (the diagonal `(a,a)`) or, with `cross`, `g + g(g-1)/2` (the diagonal,
//! then pairs `a < b` in order). The diagonal part is identical in both layouts.

use crate::error::{mul, Error, Result};
use crate::numerics::{Workspace, WorkspaceSize};
use crate::view::View;

/// Blocks per KV head.
pub fn blocks(g: usize, cross: bool) -> usize {
    if cross {
        g + g * (g - 1) / 2
    } else {
        g
    }
}

/// (a, b) of block `k` of a group of `g`.
pub(crate) fn block_pair(g: usize, k: usize) -> (usize, usize) {
    if k < g {
        return (k, k);
    }
    let mut k = k - g;
    for a in 0..g {
        let row = g - a - 1;
        if k < row {
            return (a, a + 1 + k);
        }
        k -= row;
    }
    (0, 0)
}

fn group_of(hq: usize, hkv: usize) -> Result<usize> {
    if hq == 0 || hkv == 0 || hq % hkv != 0 {
        return Err(Error::ShapeMismatch);
    }
    Ok(hq / hkv)
}

/// f32 elements of the Gram output.
pub fn gram_len(hq: usize, hkv: usize, dv: usize, cross: bool) -> Result<usize> {
    let g = group_of(hq, hkv)?;
    mul(mul(hkv, blocks(g, cross))?, mul(dv, dv)?)
}

/// Workspace bytes of [`compute_gram`]: two heads of `Wo` as f32.
pub fn gram_workspace_size(dv: usize, d_model: usize) -> Result<usize> {
    let mut ws = WorkspaceSize::new();
    ws.add::<f32>(mul(dv, d_model)?)?;
    ws.add::<f32>(mul(dv, d_model)?)?;
    Ok(ws.total())
}

/// `wo` is `[Hq, dv, D]` (head, row, col): `Wo_h[r][c]`. For PyTorch's `o_proj.weight`
/// (`[D, Hq·dv]`, row-major) use strides `[dv, 1, Hq·dv]`. Sums in f64 (once per model).
pub fn compute_gram(
    wo: &View,
    hkv: usize,
    cross: bool,
    out: &mut [f32],
    workspace: &mut [u8],
) -> Result<()> {
    let [hq, dv, dm] = wo.extent();
    let g = group_of(hq, hkv)?;
    let nb = blocks(g, cross);
    let len = gram_len(hq, hkv, dv, cross)?;
    if out.len() < len {
        return Err(Error::OutputTooSmall);
    }
    if workspace.len() < gram_workspace_size(dv, dm)? {
        return Err(Error::WorkspaceTooSmall);
    }
    let mut ws = Workspace::new(workspace);
    let wa = ws.take::<f32>(dv * dm)?;
    let wb = ws.take::<f32>(dv * dm)?;
    // validate everything before writing
    for h in 0..hq {
        for r in 0..dv {
            wo.load_row(h, r, &mut wa[r * dm..(r + 1) * dm]);
        }
        if wa.iter().any(|v| !v.is_finite()) {
            return Err(Error::NonFinite);
        }
    }
    for kh in 0..hkv {
        for k in 0..nb {
            let (a, b) = block_pair(g, k);
            for r in 0..dv {
                wo.load_row(kh * g + a, r, &mut wa[r * dm..(r + 1) * dm]);
                wo.load_row(kh * g + b, r, &mut wb[r * dm..(r + 1) * dm]);
            }
            let blk = &mut out[((kh * nb + k) * dv * dv)..((kh * nb + k + 1) * dv * dv)];
            for r in 0..dv {
                for c in 0..dv {
                    if a == b && c < r {
                        blk[r * dv + c] = blk[c * dv + r];
                        continue;
                    }
                    let (x, y) = (&wa[r * dm..(r + 1) * dm], &wb[c * dm..(c + 1) * dm]);
                    let mut s = 0f64;
                    for (p, q) in x.iter().zip(y) {
                        s += (*p as f64) * (*q as f64);
                    }
                    blk[r * dv + c] = s as f32;
                }
            }
        }
    }
    Ok(())
}

/// f32 elements of the value-form cache `[Hkv][blocks][N]`.
pub fn value_forms_len(hq: usize, hkv: usize, n: usize, cross: bool) -> Result<usize> {
    let g = group_of(hq, hkv)?;
    mul(mul(hkv, blocks(g, cross))?, n)
}

/// `v G v'ᵀ` for one token: `v` is `[dv]`, `gblk` `[dv][dv]`; f32 accumulation of dv² terms.
#[inline]
pub(crate) fn quad_form(v: &[f32], gblk: &[f32]) -> f32 {
    let dv = v.len();
    let mut s = 0f32;
    for r in 0..dv {
        let row = &gblk[r * dv..(r + 1) * dv];
        let mut t = 0f32;
        for (x, y) in row.iter().zip(v) {
            t += x * y;
        }
        s += v[r] * t;
    }
    s
}

/// Fill columns `t0..t1` of the value-form cache from `values` (`[Hkv, N, dv]`) and a Gram
/// computed with the same `cross`. Other columns are not touched, so an engine can fill
/// new tokens as they enter the cache. Rejects NaN/Inf in the values read.
pub fn compute_value_forms(
    values: &View,
    gram: &[f32],
    hq: usize,
    cross: bool,
    t0: usize,
    t1: usize,
    out: &mut [f32],
) -> Result<()> {
    let [hkv, n, dv] = values.extent();
    let g = group_of(hq, hkv)?;
    let nb = blocks(g, cross);
    if t0 > t1 || t1 > n {
        return Err(Error::InvalidArgument);
    }
    if gram.len() < gram_len(hq, hkv, dv, cross)? {
        return Err(Error::ShapeMismatch);
    }
    if out.len() < value_forms_len(hq, hkv, n, cross)? {
        return Err(Error::OutputTooSmall);
    }
    if dv > 1024 {
        return Err(Error::InvalidArgument);
    }
    let mut v = [0f32; 1024];
    let v = &mut v[..dv];
    for kh in 0..hkv {
        for t in t0..t1 {
            values.load_row(kh, t, v);
            if v.iter().any(|x| !x.is_finite()) {
                return Err(Error::NonFinite);
            }
        }
    }
    for kh in 0..hkv {
        for t in t0..t1 {
            values.load_row(kh, t, v);
            for k in 0..nb {
                let gb = &gram[(kh * nb + k) * dv * dv..(kh * nb + k + 1) * dv * dv];
                out[(kh * nb + k) * n + t] = quad_form(v, gb);
            }
        }
    }
    Ok(())
}

/// Workspace bytes of [`compute_value_l1`].
pub fn value_l1_workspace_size(dv: usize, d_model: usize) -> Result<usize> {
    let mut ws = WorkspaceSize::new();
    ws.add::<f32>(mul(dv, d_model)?)?;
    ws.add::<f32>(d_model)?;
    ws.add::<f32>(dv)?;
    Ok(ws.total())
}

/// CriticalKV's `mean_{h in group} ||v_i Wo_h||_1` for every token: out `[Hkv][N]`.
pub fn compute_value_l1(
    values: &View,
    wo: &View,
    out: &mut [f32],
    workspace: &mut [u8],
) -> Result<()> {
    let [hkv, n, dv] = values.extent();
    let [hq, dv2, dm] = wo.extent();
    let g = group_of(hq, hkv)?;
    if dv2 != dv {
        return Err(Error::ShapeMismatch);
    }
    if out.len() < mul(hkv, n)? {
        return Err(Error::OutputTooSmall);
    }
    if workspace.len() < value_l1_workspace_size(dv, dm)? {
        return Err(Error::WorkspaceTooSmall);
    }
    let mut ws = Workspace::new(workspace);
    let w = ws.take::<f32>(dv * dm)?;
    let y = ws.take::<f32>(dm)?;
    let v = ws.take::<f32>(dv)?;
    for kh in 0..hkv {
        for t in 0..n {
            values.load_row(kh, t, v);
            if v.iter().any(|x| !x.is_finite()) {
                return Err(Error::NonFinite);
            }
        }
    }
    out[..hkv * n].fill(0.0);
    for kh in 0..hkv {
        for a in 0..g {
            for r in 0..dv {
                wo.load_row(kh * g + a, r, &mut w[r * dm..(r + 1) * dm]);
            }
            for t in 0..n {
                values.load_row(kh, t, v);
                y.fill(0.0);
                for r in 0..dv {
                    let vr = v[r];
                    for (o, x) in y.iter_mut().zip(&w[r * dm..(r + 1) * dm]) {
                        *o += vr * x;
                    }
                }
                let l1: f32 = y.iter().map(|x| x.abs()).sum();
                out[kh * n + t] += l1 / g as f32;
            }
        }
    }
    Ok(())
}
