//! Uniqueness (SPEC §3b; ours, question-agnostic, no queries, no extra forward pass):
//! `u[kh,i] = max(0, 1 - r_i)^8` with `r_i` the [`TWIN_RANK`]-th largest of
//! `min(cos(k_i, k_j), cos(v_i, v_j))` over every other cached token `j` (−1 where fewer
//! exist), then `s[kh,i] = max_{0 <= j <= 4} 0.9^j·u[i+j]` over the prefix: a unique token
//! lends `0.9^j` of its score to the `j` tokens before it (the words that introduce it:
//! "The amber code is" before a code's digits).
//!
//! Why: a token whose key *and* value have near-twins elsewhere in the cache can go — any
//! query that would attend to it finds a twin and reads nearly the same value. What has no
//! twin (a pass key, a name, a number stated once) is what no other cell can stand in for.
//! Keys alone are not enough: the digits of "54505" share keys, not values. Why the 4th
//! twin, not the nearest: filler words recur many times, while the digits of a few codes
//! recur only once or twice among each other; with the nearest twin the codes of a
//! multi-key context were evicted and their labels kept (eval/agnostic.py, multikey: 1 of
//! 18 at 10 % with the nearest twin, 9 of 18 with the 4th; single needle unchanged). The
//! four-token backward reach then keeps each label with its digits (with one token, the 4th
//! twin lost single needles at 5 %: 14 against 17 of 19). The power 8 sharpens the per-head
//! scores so that the layer-sum normalisation of the token granularity (SPEC §4) does not
//! flatten the few unique tokens into the many.
//!
//! Cost: every pair of cached tokens once, `O(N²·(dk+dv)/2)` per KV head (both ends of a
//! pair updated), the value cosine only where the key cosine could enter either token's
//! top [`TWIN_RANK`]; workspace `N·(dk+dv+TWIN_RANK)` floats. Quadratic: a sub-quadratic
//! twin search is future work.
use super::Bufs;
use crate::error::{Error, Result};
use crate::numerics::{dispatch, dot_v, hsum8, Simd};
use crate::view::{load_rows, View};

/// Sharpening exponent (decision, SPEC §3b).
pub const POWER: i32 = 8;
/// Share of a token's score lent to the token before it (`BACK_DECAY^j` to the j-th before).
pub const BACK_DECAY: f32 = 0.9;
/// How many tokens before a unique token receive its lent score.
pub const BACK_REACH: usize = 4;
/// Which twin decides redundancy: a token is redundant when it has this many near-twins.
pub const TWIN_RANK: usize = 4;

/// Workspace floats: the unit-normalised K and V rows of one KV head, and every token's
/// running top [`TWIN_RANK`] similarities.
pub(crate) fn scratch_floats(n: usize, dk: usize, dv: usize) -> Result<usize> {
    n.checked_mul(dk + dv + TWIN_RANK).ok_or(Error::Overflow)
}

/// Puts `m` into `top` (descending) when it beats the smallest kept value.
#[inline(always)]
fn insert_top(top: &mut [f32], m: f32) {
    let mut k = TWIN_RANK - 1;
    if m <= top[k] {
        return;
    }
    while k > 0 && top[k - 1] < m {
        top[k] = top[k - 1];
        k -= 1;
    }
    top[k] = m;
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
        // top[i * R..][..R]: token i's R largest similarities so far, descending
        let top = &mut rest[..n * TWIN_RANK];
        top.fill(-1.0);
        let floor = |top: &[f32], t: usize| top[t * TWIN_RANK + TWIN_RANK - 1];
        let d8 = dk / 8 * 8;
        // each pair once (j > i) updates both ends: the similarity is symmetric, bit for bit
        // (the same products summed in the same order), so the top lists equal the one-sided
        // search's; a value cosine is computed only where the key cosine could enter either
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
                    if c > floor(top, i) || c > floor(top, j) {
                        // SAFETY: both slices are rows of length dv of the same buffer.
                        let cv = unsafe { dot_v::<S>(vi, &vn[j * dv..(j + 1) * dv]) };
                        let m = c.min(cv);
                        insert_top(&mut top[i * TWIN_RANK..(i + 1) * TWIN_RANK], m);
                        insert_top(&mut top[j * TWIN_RANK..(j + 1) * TWIN_RANK], m);
                    }
                }
                j0 += nb;
            }
        }
        for (t, out) in dst.iter_mut().enumerate() {
            let b = floor(top, t);
            let u2 = (1.0 - b).max(0.0) * (1.0 - b).max(0.0);
            *out = u2 * u2 * (u2 * u2); // ^POWER
        }
        // ascending: dst[i + 1 ..] are still unlent when dst[i] reads them
        for i in 0..dst.len() {
            let mut f = 1.0f32;
            for j in 1..=BACK_REACH.min(dst.len() - 1 - i) {
                f *= BACK_DECAY;
                dst[i] = dst[i].max(f * dst[i + j]);
            }
        }
    })
}
