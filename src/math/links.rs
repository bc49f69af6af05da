//! Value links (design §4, continuation through value runs): how much each cached token's
//! value continues its predecessor's, `cos(v_i, v_{i-1})`, summed over heads and layers.
//!
//! A continuation pool that lends a read token's score to a fixed number of followers
//! cuts multi-token values (a 7-digit number after a cue whose kernel fits 5 digits).
//! The tokens of such a value have similar values in most heads (SmolLM2: mean adjacent
//! cosine 0.65–0.82 between digits, 0.34 over filler, 0.23 at the full stop after a
//! number), so [`crate::select_model_linked`] carries a continuation on while the mean
//! link exceeds a threshold.

use crate::error::{mul, Error, Result};
use crate::numerics::{all_finite, dispatch, dot_v, Simd};
use crate::view::View;
use crate::workspace::{Workspace, WorkspaceSize};

/// Workspace bytes of [`accumulate_value_links`] for `n` tokens of dimension `dv`: `n` in
/// `1 ..= MAX_TOKENS`, `dv >= 1` (else `InvalidArgument`, as the other size queries).
pub fn value_links_workspace_size(n: usize, dv: usize) -> Result<usize> {
    if n == 0 || dv == 0 || n > crate::error::MAX_TOKENS {
        return Err(Error::InvalidArgument);
    }
    let mut ws = WorkspaceSize::new();
    ws.add::<f32>(n)?; // this layer's links, added to `out` once all are finite
                       // two token rows, or (V transposed) a channel row and per-token dots and norms
    ws.add::<f32>(mul(dv, 2)?.max(mul(n, 3)?))?;
    Ok(ws.total())
}

/// Add `Σ_h cos(v[h, i], v[h, i - 1])` over the `Hkv` heads of `values [Hkv, N, dv]` to
/// `out[i]` for `1 <= i < N` (`out[0]` is left as it is; a zero vector links nothing).
/// Call it once per layer on the same `out` (zeroed first). Non-finite values, values
/// whose squared norm overflows f32, or a non-finite `out` entry give `NonFinite` with
/// nothing written.
pub fn accumulate_value_links(values: &View, out: &mut [f32], workspace: &mut [u8]) -> Result<()> {
    let [_, n, dv] = values.extent();
    if out.len() < n {
        return Err(Error::OutputTooSmall);
    }
    if workspace.len() < value_links_workspace_size(n, dv)? {
        return Err(Error::WorkspaceTooSmall);
    }
    if out[..n].iter().any(|x| !x.is_finite()) {
        return Err(Error::NonFinite);
    }
    let mut ws = Workspace::new(workspace);
    let stage = ws.take::<f32>(n)?;
    let rest = ws.take::<f32>((2 * dv).max(3 * n))?;
    stage.fill(0.0);
    // V stored transposed (tokens contiguous): read channel rows instead of token rows
    let transposed = values.stride()[1] == 1 && values.stride()[2] != 1 && n > 1;
    let ok = dispatch!(fn(values: &View, stage: &mut [f32], rest: &mut [f32], transposed: bool) -> bool, S => {
        if transposed {
            let n = stage.len();
            let (row, acc) = rest.split_at_mut(n);
            let (dot, sq) = acc.split_at_mut(n);
            links_by_channel::<S>(&values.swap_last(), stage, row, dot, &mut sq[..n])
        } else {
            let dv = values.extent()[2];
            let (a, b) = rest.split_at_mut(dv);
            links_into::<S>(values, stage, a, &mut b[..dv])
        }
    });
    if !ok {
        return Err(Error::NonFinite);
    }
    for (o, &s) in out[1..n].iter_mut().zip(&stage[1..]) {
        *o += s;
    }
    Ok(())
}

/// `stage[t] += cos(v[h, t], v[h, t - 1])` over heads; false at the first non-finite row
/// or squared norm.
#[inline(always)]
fn links_into<S: Simd>(values: &View, stage: &mut [f32], a: &mut [f32], b: &mut [f32]) -> bool {
    let [hkv, n, _] = values.extent();
    let (mut cur, mut prev) = (a, b);
    for kh in 0..hkv {
        let mut prev_sq = 0f32;
        for t in 0..n {
            values.load_row(kh, t, cur);
            if !all_finite::<S>(cur) {
                return false;
            }
            // SAFETY: the dispatch runs S only where the CPU has its features; rows have dv
            // elements each (`prev` holds row t - 1 once t > 0).
            let sq = unsafe { dot_v::<S>(cur, cur) };
            let dot = if t > 0 {
                // SAFETY: as above.
                unsafe { dot_v::<S>(cur, prev) }
            } else {
                0.0
            };
            if !sq.is_finite() || !dot.is_finite() {
                return false;
            }
            if t > 0 && sq > 0.0 && prev_sq > 0.0 {
                stage[t] += (dot as f64 / libm::sqrt(sq as f64 * prev_sq as f64)) as f32;
            }
            prev_sq = sq;
            core::mem::swap(&mut cur, &mut prev);
        }
    }
    true
}

/// [`links_into`] for `values` given channel-major (`[Hkv, dv, N]`, tokens contiguous):
/// per head, every channel row adds `v[t]·v[t-1]` and `v[t]²` into per-token sums.
#[inline(always)]
fn links_by_channel<S: Simd>(
    values: &View,
    stage: &mut [f32],
    row: &mut [f32],
    dot: &mut [f32],
    sq: &mut [f32],
) -> bool {
    let [hkv, dv, n] = values.extent();
    let n8 = (n - 1) / 8 * 8; // outputs t = 1 .. 1 + n8, eight at a time
    for kh in 0..hkv {
        dot.fill(0.0);
        sq.fill(0.0);
        for c in 0..dv {
            values.load_row(kh, c, row);
            if !all_finite::<S>(row) {
                return false;
            }
            let (r, d, q) = (row.as_ptr(), dot.as_mut_ptr(), sq.as_mut_ptr());
            let mut t = 1;
            while t < 1 + n8 {
                // SAFETY: 1 <= t and t + 8 <= n, so t - 1 .. t + 8 lies inside the n-long
                // row, dots and norms; S runs only where the CPU has its features.
                unsafe {
                    let x = S::load(r.add(t));
                    S::store(
                        d.add(t),
                        S::fma(x, S::load(r.add(t - 1)), S::load(d.add(t))),
                    );
                    S::store(q.add(t), S::fma(x, x, S::load(q.add(t))));
                }
                t += 8;
            }
            for t in 1 + n8..n {
                dot[t] += row[t] * row[t - 1];
                sq[t] += row[t] * row[t];
            }
            sq[0] += row[0] * row[0];
        }
        for t in 0..n {
            if !sq[t].is_finite() || !dot[t].is_finite() {
                return false;
            }
            if t > 0 && sq[t] > 0.0 && sq[t - 1] > 0.0 {
                stage[t] += (dot[t] as f64 / libm::sqrt(sq[t] as f64 * sq[t - 1] as f64)) as f32;
            }
        }
    }
    true
}
