//! Uniqueness (SPEC §3b; ours, question-agnostic, no queries, no extra forward pass):
//! `u[kh,i] = max(0, 1 - r_i)^8` with `r_i = max_{j != i, j < N} min(cos(k_i, k_j), cos(v_i, v_j))`,
//! then `s[kh,i] = max(u[i], 0.9·u[i+1])` over the prefix: a unique token lends 0.9 of its
//! score to the token before it (the word that introduces it: "is" before a key's digits).
//!
//! Why: a token whose key *and* value have a near-twin elsewhere in the cache can go — any
//! query that would attend to it finds the twin and reads nearly the same value. What has no
//! twin (a pass key, a name, a number stated once) is what no other cell can stand in for.
//! Keys alone are not enough: the digits of "54505" share keys, not values. The power 8
//! sharpens the per-head scores so that the layer-sum normalisation of the token
//! granularity (SPEC §4) does not flatten the few unique tokens into the many (measured in
//! eval/agnostic.py: powers 1, 2, 4, 8 kept the needle on 1, 8, 8, 8 of 9 prompts at 10 %).
//! The one-token backward reach took the development split from 4 to 8 of 9 at 5 % and the
//! held-out split from 10 to 11 of 14 at 10 % (more reach did not help: eval/README.md).
//!
//! Cost: every pair of cached tokens once, `O(N²·(dk+dv)/2)` per KV head (both ends of a
//! pair updated), the value cosine only where the key cosine could raise either maximum;
//! workspace `N·(dk+dv+1)` floats. Quadratic: a sub-quadratic twin search is future work.
use super::Bufs;
use crate::error::{Error, Result};
use crate::numerics::{dispatch, dot_v, hsum8, Simd};
use crate::view::{load_rows, View};

/// Sharpening exponent (decision, SPEC §3b).
pub const POWER: i32 = 8;
/// Share of a token's score lent to the token before it.
pub const BACK_DECAY: f32 = 0.9;

/// Workspace floats: the unit-normalised K and V rows of one KV head, and every token's
/// running maximum similarity.
pub(crate) fn scratch_floats(n: usize, dk: usize, dv: usize) -> Result<usize> {
    n.checked_mul(dk + dv + 1).ok_or(Error::Overflow)
}

/// NaN/Inf anywhere in K or V is rejected before `out` is written.
pub(super) fn inputs_finite(keys: &View, values: &View, bufs: &mut Bufs) -> bool {
    for view in [keys, values] {
        let [h, n, d] = view.extent();
        for kh in 0..h {
            for t in 0..n {
                view.load_row(kh, t, bufs.row);
                if bufs.row[..d].iter().any(|v| !v.is_finite()) {
                    return false;
                }
            }
        }
    }
    true
}

/// Rows of head `kh` of `view`, each scaled to unit L2 norm (zero rows stay zero), into `dst`.
fn load_unit_rows<S: Simd>(view: &View, kh: usize, dst: &mut [f32]) {
    let [_, n, d] = view.extent();
    load_rows::<S>(view, kh, 0, n, dst);
    for row in dst[..n * d].chunks_exact_mut(d) {
        // SAFETY: `row` is one slice, read as both operands.
        let ss = unsafe { dot_v::<S>(row, row) };
        if ss > 0.0 {
            let inv = 1.0 / libm::sqrtf(ss);
            for v in row.iter_mut() {
                *v *= inv;
            }
        }
    }
}

/// Scores of KV head `kh`'s first `dst.len()` tokens; `scratch` holds [`scratch_floats`].
pub(super) fn score(keys: &View, values: &View, kh: usize, scratch: &mut [f32], dst: &mut [f32]) {
    dispatch!(fn(keys: &View, values: &View, kh: usize, scratch: &mut [f32], dst: &mut [f32]) -> (), S => {
        let [_, n, dk] = keys.extent();
        let dv = values.extent()[2];
        let (kn, rest) = scratch.split_at_mut(n * dk);
        let (vn, rest) = rest.split_at_mut(n * dv);
        load_unit_rows::<S>(keys, kh, kn);
        load_unit_rows::<S>(values, kh, vn);
        let best = &mut rest[..n];
        best.fill(-1.0);
        let d8 = dk / 8 * 8;
        // each pair once (j > i) updates both ends: the similarity is symmetric, bit for bit
        // (the same products summed in the same order), so the maxima equal the one-sided
        // search's; a value cosine is computed only where the key cosine could raise either
        for i in 0..n {
            let (ki, vi) = (&kn[i * dk..(i + 1) * dk], &vn[i * dv..(i + 1) * dv]);
            let mut j0 = i + 1;
            while j0 < n {
                // eight key cosines at once, each summed exactly as dot_v sums it
                let nb = 8.min(n - j0);
                let mut ck = [0f32; 8];
                if nb == 8 {
                    // SAFETY: rows j0..j0+8 of dk floats are inside kn; d + 8 <= d8 <= dk.
                    unsafe {
                        let mut acc = [S::zero(); 8];
                        for d in (0..d8).step_by(8) {
                            let x = S::load(ki.as_ptr().add(d));
                            for (q, a) in acc.iter_mut().enumerate() {
                                *a = S::fma(x, S::load(kn.as_ptr().add((j0 + q) * dk + d)), *a);
                            }
                        }
                        S::store(ck.as_mut_ptr(), hsum8::<S>(acc));
                    }
                    for (q, c) in ck.iter_mut().enumerate() {
                        let kj = &kn[(j0 + q) * dk..(j0 + q + 1) * dk];
                        for (a, b) in ki[d8..].iter().zip(&kj[d8..]) {
                            *c += a * b;
                        }
                    }
                } else {
                    for (q, c) in ck[..nb].iter_mut().enumerate() {
                        // SAFETY: both slices are rows of length dk of the same buffer.
                        *c = unsafe { dot_v::<S>(ki, &kn[(j0 + q) * dk..(j0 + q + 1) * dk]) };
                    }
                }
                for (q, &c) in ck[..nb].iter().enumerate() {
                    let j = j0 + q;
                    if c > best[i] || c > best[j] {
                        // SAFETY: both slices are rows of length dv of the same buffer.
                        let cv = unsafe { dot_v::<S>(vi, &vn[j * dv..(j + 1) * dv]) };
                        let m = c.min(cv);
                        best[i] = best[i].max(m);
                        best[j] = best[j].max(m);
                    }
                }
                j0 += nb;
            }
        }
        for (out, &b) in dst.iter_mut().zip(best.iter()) {
            let u2 = (1.0 - b).max(0.0) * (1.0 - b).max(0.0);
            *out = u2 * u2 * (u2 * u2); // ^POWER
        }
        // ascending: dst[i + 1] is still unlent when dst[i] reads it
        for i in 1..dst.len() {
            dst[i - 1] = dst[i - 1].max(BACK_DECAY * dst[i]);
        }
    })
}
