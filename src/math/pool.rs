//! 1-D pooling along tokens (design §3): avg (pads count as zeros), max (pads are -inf),
//! forward continuation pooling. `src` and `dst` are distinct slices of equal length.

use crate::config::{Pool, PoolKind};
use crate::numerics::{dispatch, Simd};

pub fn pool(p: &Pool, src: &[f32], dst: &mut [f32]) {
    let n = src.len();
    let dst = &mut dst[..n];
    if p.is_identity() {
        dst.copy_from_slice(src);
        return;
    }
    // the interior, 8 outputs at a time, then the edges (and the tail) one by one
    let done = dispatch!(fn(p: &Pool, src: &[f32], dst: &mut [f32]) -> (usize, usize), S => {
        pool_interior::<S>(p, src, dst)
    });
    pool_scalar(p, src, dst, 0, done.0);
    pool_scalar(p, src, dst, done.1, n);
}

/// Outputs `i0 .. i1` of [`pool`] whose whole kernel lies inside `src`, 8 at a time with
/// the scalar loop's operations in its order (the same bits); returns `(i0, i1)`.
#[inline(always)]
fn pool_interior<S: Simd>(p: &Pool, src: &[f32], dst: &mut [f32]) -> (usize, usize) {
    let (n, k) = (src.len(), p.kernel as usize);
    let (i0, last) = match p.kind {
        PoolKind::Avg | PoolKind::Max => (k / 2, n.saturating_sub(k / 2)),
        PoolKind::Forward => (k - 1, n),
        PoolKind::None => return (0, 0),
    };
    if last < i0 + 8 {
        return (0, 0);
    }
    let i1 = i0 + (last - i0) / 8 * 8;
    let (sp, dp) = (src.as_ptr(), dst.as_mut_ptr());
    let mut i = i0;
    // 16 outputs per step while they last: two independent chains of the same operations
    // (each output's sum or max takes one add or max per kernel tap, in order, so one chain
    // waits on the latency of each; two keep the core busier)
    while i + 16 <= i1 {
        // SAFETY: as below, for outputs i .. i + 16 <= i1.
        unsafe {
            match p.kind {
                PoolKind::Avg => {
                    let (mut s0, mut s1) = (S::zero(), S::zero());
                    for j in 0..k {
                        s0 = S::add(s0, S::load(sp.add(i - i0 + j)));
                        s1 = S::add(s1, S::load(sp.add(i + 8 - i0 + j)));
                    }
                    let inv = S::splat(1.0 / k as f32);
                    S::store(dp.add(i), S::mul(s0, inv));
                    S::store(dp.add(i + 8), S::mul(s1, inv));
                }
                PoolKind::Max => {
                    let (mut m0, mut m1) =
                        (S::splat(f32::NEG_INFINITY), S::splat(f32::NEG_INFINITY));
                    for j in 0..k {
                        m0 = S::max(m0, S::load(sp.add(i - i0 + j)));
                        m1 = S::max(m1, S::load(sp.add(i + 8 - i0 + j)));
                    }
                    S::store(dp.add(i), m0);
                    S::store(dp.add(i + 8), m1);
                }
                _ => {
                    // forward (None returned above)
                    let (mut b0, mut b1) = (S::load(sp.add(i)), S::load(sp.add(i + 8)));
                    let mut f = 1.0f32;
                    for j in 1..k {
                        f *= p.decay;
                        b0 = S::max(b0, S::mul(S::splat(f), S::load(sp.add(i - j))));
                        b1 = S::max(b1, S::mul(S::splat(f), S::load(sp.add(i + 8 - j))));
                    }
                    S::store(dp.add(i), b0);
                    S::store(dp.add(i + 8), b1);
                }
            }
        }
        i += 16;
    }
    while i < i1 {
        // SAFETY: i0 <= i, i + 8 <= i1 <= last, so every index read below is in
        // [i - i0, i + 8 + k/2) ⊆ [0, n) (avg/max) or [i + 1 - k, i + 8) ⊆ [0, n) (forward),
        // and dst has n elements (`pool` sliced it).
        unsafe {
            match p.kind {
                PoolKind::Avg => {
                    let mut s = S::zero();
                    for j in 0..k {
                        s = S::add(s, S::load(sp.add(i - i0 + j)));
                    }
                    S::store(dp.add(i), S::mul(s, S::splat(1.0 / k as f32)));
                }
                PoolKind::Max => {
                    let mut m = S::splat(f32::NEG_INFINITY);
                    for j in 0..k {
                        m = S::max(m, S::load(sp.add(i - i0 + j)));
                    }
                    S::store(dp.add(i), m);
                }
                _ => {
                    // forward (None returned above)
                    let mut best = S::load(sp.add(i));
                    let mut f = 1.0f32;
                    for j in 1..k {
                        f *= p.decay;
                        best = S::max(best, S::mul(S::splat(f), S::load(sp.add(i - j))));
                    }
                    S::store(dp.add(i), best);
                }
            }
        }
        i += 8;
    }
    (i0, i1)
}

/// Outputs `i0 .. i1` of [`pool`], one at a time.
fn pool_scalar(p: &Pool, src: &[f32], dst: &mut [f32], i0: usize, i1: usize) {
    let n = src.len();
    let k = p.kernel as usize;
    match p.kind {
        PoolKind::None => dst.copy_from_slice(src),
        PoolKind::Avg => {
            let h = k / 2;
            let inv = 1.0 / k as f32;
            for i in i0..i1 {
                let lo = i.saturating_sub(h);
                let hi = (i + h + 1).min(n);
                let mut s = 0f32;
                for &v in &src[lo..hi] {
                    s += v;
                }
                dst[i] = s * inv;
            }
        }
        PoolKind::Max => {
            let h = k / 2;
            for i in i0..i1 {
                let lo = i.saturating_sub(h);
                let hi = (i + h + 1).min(n);
                dst[i] = src[lo..hi]
                    .iter()
                    .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
            }
        }
        PoolKind::Forward => {
            for i in i0..i1 {
                let mut best = src[i];
                let mut f = 1.0f32;
                for j in 1..k.min(i + 1) {
                    f *= p.decay;
                    let v = f * src[i - j];
                    if v > best {
                        best = v;
                    }
                }
                dst[i] = best;
            }
        }
    }
}

/// [`pool`] over `src[sinks..]` only; the first `sinks` entries are copied as they are, so
/// they lend nothing to their followers (the selection's `post_pool_sinks`).
pub fn pool_past_sinks(p: &Pool, sinks: usize, src: &[f32], dst: &mut [f32]) {
    let s = sinks.min(src.len());
    dst[..s].copy_from_slice(&src[..s]);
    pool(p, &src[s..], &mut dst[s..src.len()]);
}

/// Flat forward pooling whose reach runs on through linked positions (the selection's
/// value links): position `a >= sinks` lends its score to `a+1 ..= e(a)`, where `e(a)` is
/// `a + kernel - 1` carried on while the next position is linked (`links[j] > link_min`),
/// so a continuation never ends inside a run of linked tokens. `dst[j]` is the largest of
/// `src[j]` and the scores lent to it. With nothing linked this is [`pool_past_sinks`]
/// with `Pool::forward(kernel, 1.0)`, bit for bit. `links` covers `src` (index `j` says
/// whether `j` continues `j - 1`; `links[0]` is not read).
pub fn pool_forward_linked(
    kernel: usize,
    sinks: usize,
    links: &[f32],
    link_min: f32,
    src: &[f32],
    dst: &mut [f32],
) {
    let n = src.len();
    let (dst, links) = (&mut dst[..n], &links[..n]);
    let k = kernel.max(1);
    // anchor a reaches j > a iff a + k - 1 >= c(j), c(j) the first position of the linked
    // chain ending at j (c(j) = j when j is not linked): anchors [lo(j), j), lo nondecreasing
    // (ties: the nearer anchor, then the position's own score, as `pool` scans them)
    let (mut lo, mut best) = (0usize, f32::NEG_INFINITY);
    for j in 0..n {
        if j > 0 && links[j] > link_min {
            // the same chain, the same lo: one more anchor, the nearest
            if j > lo && src[j - 1] >= best {
                best = src[j - 1];
            }
        } else {
            lo = (j + 1).saturating_sub(k).max(sinks);
            best = f32::NEG_INFINITY;
            for &v in src[lo.min(j)..j].iter().rev() {
                if v > best {
                    best = v;
                }
            }
        }
        dst[j] = if j >= sinks && best > src[j] {
            best
        } else {
            src[j]
        };
    }
}

/// Pool `buf` through `tmp` (same length), leaving the result in `buf`.
pub fn pool_in_place(p: &Pool, buf: &mut [f32], tmp: &mut [f32]) {
    if p.is_identity() {
        return;
    }
    let tmp = &mut tmp[..buf.len()];
    tmp.copy_from_slice(buf);
    pool(p, tmp, buf);
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;
    use std::vec;
    use std::vec::Vec;

    /// The vectorised interior gives the scalar loop's bits for every kind, kernels up to
    /// past the length, lengths around whole vectors, signed zeros among the values.
    #[test]
    fn vector_interior_matches_scalar_bits() {
        let mut x = 7u64;
        let src: Vec<f32> = (0..300)
            .map(|i| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                match i % 11 {
                    0 => -0.0,
                    1 => 0.0,
                    _ => (x >> 40) as f32 / (1u64 << 24) as f32 - 0.3,
                }
            })
            .collect();
        for p in [Pool::avg(3), Pool::avg(7), Pool::max(5), Pool::max(7)]
            .into_iter()
            .chain([Pool::max(41), Pool::forward(9, 1.0), Pool::forward(4, 0.7)])
        {
            for n in [1, 7, 8, 9, 15, 16, 23, 24, 25, 40, 300] {
                let (mut a, mut b) = (vec![1f32; n], vec![2f32; n]);
                pool(&p, &src[..n], &mut a);
                pool_scalar(&p, &src[..n], &mut b, 0, n);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "{p:?} n {n}");
            }
        }
    }

    /// Linked forward pooling against its definition (each anchor's reach carried on
    /// through linked positions, brute force), and bit for bit the flat forward pool of
    /// `pool_past_sinks` where nothing is linked.
    #[test]
    fn linked_forward_pool_follows_its_definition() {
        let mut x = 11u64;
        let mut next = move || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 40) as f32 / (1u64 << 24) as f32
        };
        for n in [1usize, 2, 5, 17, 64] {
            for k in [1usize, 2, 3, 9, 70] {
                for sinks in [0usize, 1, 3] {
                    for density in [0.0f32, 0.3, 0.8, 1.0] {
                        let src: Vec<f32> = (0..n)
                            .map(|i| match i % 7 {
                                0 => 0.0,
                                1 => -0.0,
                                _ => next() - 0.2,
                            })
                            .collect();
                        let links: Vec<f32> = (0..n).map(|_| next()).collect();
                        let min = 1.0 - density; // linked where links > min
                        let mut got = vec![f32::NAN; n];
                        pool_forward_linked(k, sinks, &links, min, &src, &mut got);
                        // brute force: reach of each anchor, then the max of what reaches j
                        let reach = |a: usize| {
                            let mut e = (a + k - 1).min(n - 1);
                            while e + 1 < n && links[e + 1] > min {
                                e += 1;
                            }
                            e
                        };
                        for j in 0..n {
                            let mut want = src[j];
                            if j >= sinks {
                                for a in (sinks..j).rev() {
                                    if reach(a) >= j && src[a] > want {
                                        want = src[a];
                                    }
                                }
                            }
                            assert_eq!(got[j], want, "n {n} k {k} sinks {sinks} j {j}");
                        }
                        if density == 0.0 {
                            let mut flat = vec![f32::NAN; n];
                            pool_past_sinks(&Pool::forward(k as u32, 1.0), sinks, &src, &mut flat);
                            let bits =
                                |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                            assert_eq!(bits(&got), bits(&flat), "n {n} k {k} sinks {sinks}");
                        }
                    }
                }
            }
        }
    }
}
