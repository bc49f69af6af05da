//! Value links (SPEC §4, continuation through value runs): how much each cached token's
//! value continues its predecessor's, `cos(v_i, v_{i-1})`, summed over heads and layers.
//!
//! A continuation pool that lends a read token's score to a fixed number of followers
//! cuts multi-token values (a 7-digit number after a cue whose kernel fits 5 digits).
//! The tokens of such a value have similar values in most heads (SmolLM2: mean adjacent
//! cosine 0.65–0.82 between digits, 0.34 over filler, 0.23 at the full stop after a
//! number), so [`crate::select_model_linked`] carries a continuation on while the mean
//! link exceeds a threshold.

use crate::error::{mul, Error, Result};
use crate::view::View;
use crate::workspace::{Workspace, WorkspaceSize};

/// Workspace bytes of [`accumulate_value_links`] for values of dimension `dv`.
pub fn value_links_workspace_size(dv: usize) -> Result<usize> {
    let mut ws = WorkspaceSize::new();
    ws.add::<f32>(mul(dv, 2)?)?;
    Ok(ws.total())
}

/// Add `Σ_h cos(v[h, i], v[h, i - 1])` over the `Hkv` heads of `values [Hkv, N, dv]` to
/// `out[i]` for `1 <= i < N` (`out[0]` is left as it is; a zero vector links nothing).
/// Call it once per layer on the same `out` (zeroed first). Non-finite values, or a
/// non-finite `out` entry, give `NonFinite` with nothing written.
pub fn accumulate_value_links(values: &View, out: &mut [f32], workspace: &mut [u8]) -> Result<()> {
    let [hkv, n, dv] = values.extent();
    if out.len() < n {
        return Err(Error::OutputTooSmall);
    }
    if workspace.len() < value_links_workspace_size(dv)? {
        return Err(Error::WorkspaceTooSmall);
    }
    let mut ws = Workspace::new(workspace);
    let mut a = ws.take::<f32>(dv)?;
    let mut b = ws.take::<f32>(dv)?;
    // validate everything before writing
    if out[..n].iter().any(|x| !x.is_finite()) {
        return Err(Error::NonFinite);
    }
    for kh in 0..hkv {
        for t in 0..n {
            values.load_row(kh, t, a);
            if a.iter().any(|x| !x.is_finite()) {
                return Err(Error::NonFinite);
            }
        }
    }
    for kh in 0..hkv {
        if n == 0 {
            break;
        }
        values.load_row(kh, 0, b);
        let mut prev_sq: f64 = b.iter().map(|&x| x as f64 * x as f64).sum();
        for t in 1..n {
            // `b` holds row t - 1, `a` row t; swap after
            values.load_row(kh, t, a);
            let (mut dot, mut sq) = (0f64, 0f64);
            for (&x, &y) in a.iter().zip(b.iter()) {
                dot += x as f64 * y as f64;
                sq += x as f64 * x as f64;
            }
            if sq > 0.0 && prev_sq > 0.0 {
                out[t] += (dot / libm::sqrt(sq * prev_sq)) as f32;
            }
            prev_sq = sq;
            core::mem::swap(&mut a, &mut b);
        }
    }
    Ok(())
}
