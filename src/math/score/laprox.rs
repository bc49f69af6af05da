//! LaProx (design §3): per query head `pool(||A[h,:,i]||_2) · ||v_i Wo_h||_2`, the value-output
//! norm read from the Gram quadratic form `v G_h vᵀ`. GQA modes: `sum` over the group,
//! `exact` (Frobenius norm of the group's rank-g term, cross-Gram blocks) and `mean-attn`.
//! In `exact` mode attention and value terms do not factor, so the pool applies to the
//! product whatever the placement says. Gram and value forms must be built with
//! `cross = (gqa != sum)`.

use super::{Bufs, LayerInputs, LayerShape};
use crate::config::{LaproxGqa, PoolPlacement, ScoreConfig};
use crate::error::{Error, Result};
use crate::gram::{self, block_pair, blocks};
use crate::numerics::dispatch;
use crate::pool::{pool, pool_in_place};

pub(super) fn check_inputs(
    cfg: &ScoreConfig,
    inputs: &LayerInputs,
    shape: &LayerShape,
) -> Result<()> {
    let cross = cfg.needs_cross();
    // one value term: a Gram beside the cached forms would be ignored unchecked
    if inputs.value_forms.is_some() && inputs.gram.is_some() {
        return Err(Error::InvalidArgument);
    }
    if let Some(f) = inputs.value_forms {
        // exact length: a cache built with the other `cross` layout is a caller error we can see
        if f.len() != gram::value_forms_len(shape.hq, shape.hkv, shape.n, cross)? {
            return Err(Error::ShapeMismatch);
        }
        return Ok(());
    }
    let g = inputs.gram.ok_or(Error::NullPointer)?;
    inputs.values.as_ref().ok_or(Error::NullPointer)?;
    if g.len() != gram::gram_len(shape.hq, shape.hkv, shape.dv, cross)? {
        return Err(Error::ShapeMismatch);
    }
    if g.iter()
        .take(gram::gram_len(shape.hq, shape.hkv, shape.dv, cross)?)
        .any(|v| !v.is_finite())
    {
        return Err(Error::NonFinite);
    }
    Ok(())
}

/// Reject NaN/Inf in what the value term reads (cached forms or prefix values).
pub(super) fn check_values_finite(
    cfg: &ScoreConfig,
    inputs: &LayerInputs,
    shape: &LayerShape,
    p: usize,
    _row: &mut [f32],
) -> Result<()> {
    if let Some(f) = inputs.value_forms {
        let nb = blocks(shape.group(), cfg.needs_cross());
        for blk in 0..shape.hkv * nb {
            if !crate::numerics::finite(&f[blk * shape.n..blk * shape.n + p]) {
                return Err(Error::NonFinite);
            }
        }
        return Ok(());
    }
    let v = inputs.values.as_ref().ok_or(Error::NullPointer)?;
    if !gram::values_finite(v, 0, p) {
        return Err(Error::NonFinite);
    }
    Ok(())
}

/// Value form of block `k` for token `t` of KV head `kh`.
struct Forms<'a> {
    inputs: &'a LayerInputs<'a>,
    shape: &'a LayerShape,
    nb: usize,
}

impl<'a> Forms<'a> {
    /// Block `k`'s cached forms of tokens `0..p` of KV head `kh`, when the caller gave them.
    fn cached(&self, kh: usize, k: usize, p: usize) -> Option<&'a [f32]> {
        let n = self.shape.n;
        let nb = self.nb;
        self.inputs
            .value_forms
            .map(|f| &f[(kh * nb + k) * n..(kh * nb + k) * n + p])
    }

    /// Fill `dst[t]` with block `k`'s form for tokens `0..p`.
    fn fill(&self, kh: usize, k: usize, p: usize, _row: &mut [f32], dst: &mut [f32]) {
        let (n, dv) = (self.shape.n, self.shape.dv);
        if let Some(f) = self.inputs.value_forms {
            let nb = self.nb;
            dst[..p].copy_from_slice(&f[(kh * nb + k) * n..(kh * nb + k) * n + p]);
            return;
        }
        let (Some(v), Some(g)) = (self.inputs.values.as_ref(), self.inputs.gram) else {
            return;
        };
        let nb = self.nb;
        let gb = &g[(kh * nb + k) * dv * dv..(kh * nb + k + 1) * dv * dv];
        gram::quad_forms(v, kh, gb, 0, p, dst);
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn score(
    cfg: &ScoreConfig,
    inputs: &LayerInputs,
    shape: &LayerShape,
    sq: &mut [f32],
    cross: &mut [f32],
    kh: usize,
    p: usize,
    bufs: &mut Bufs,
    dst: &mut [f32],
) {
    let g = shape.group();
    let forms = Forms {
        inputs,
        shape,
        nb: blocks(g, cfg.needs_cross()),
    };
    let dst = &mut dst[..p];
    match cfg.laprox_gqa {
        LaproxGqa::Sum if cfg.placement == PoolPlacement::Attention => {
            // per head: the attention norms pooled, then one sweep adding their products with
            // the value norms, read straight from the cached forms when given (no copy)
            for a in 0..g {
                let att = &mut sq[a * p..(a + 1) * p];
                if cfg.pool.is_identity() {
                    sqrt_all(att, false);
                } else {
                    sqrt_to(att, bufs.tmp_a);
                    pool(&cfg.pool, &bufs.tmp_a[..p], att);
                }
                let vf = match forms.cached(kh, a, p) {
                    Some(f) => f,
                    None => {
                        forms.fill(kh, a, p, bufs.row, bufs.tmp_b);
                        &bufs.tmp_b[..p]
                    }
                };
                add_norm_products(dst, att, vf, a == 0);
            }
        }
        LaproxGqa::Sum => {
            // the pool on the product
            dst.fill(0.0);
            for a in 0..g {
                let att = &mut sq[a * p..(a + 1) * p];
                sqrt_all(att, false);
                forms.fill(kh, a, p, bufs.row, bufs.tmp_b);
                let vn = &mut bufs.tmp_b[..p];
                sqrt_all(vn, true);
                for (x, &y) in att.iter_mut().zip(vn.iter()) {
                    *x *= y;
                }
                pool_in_place(&cfg.pool, att, bufs.tmp_a);
                for (d, &x) in dst.iter_mut().zip(att.iter()) {
                    *d += x;
                }
            }
        }
        LaproxGqa::Exact => {
            // Σ_a |A_a|² F_aa + 2 Σ_{a<b} (A_a·A_b) F_ab, under a square root
            let acc = &mut bufs.acc[..p];
            acc.fill(0.0);
            for k in 0..blocks(g, true) {
                let (a, b) = block_pair(g, k);
                forms.fill(kh, k, p, bufs.row, bufs.tmp_b);
                let att = if a == b {
                    &sq[a * p..(a + 1) * p]
                } else {
                    &cross[(k - g) * p..(k - g + 1) * p]
                };
                let w = if a == b { 1.0 } else { 2.0 };
                for ((o, &x), &f) in acc.iter_mut().zip(att).zip(bufs.tmp_b[..p].iter()) {
                    *o += w * x * f;
                }
            }
            for v in acc.iter_mut() {
                *v = libm::sqrtf(v.max(0.0));
            }
            pool(&cfg.pool, acc, dst);
        }
        LaproxGqa::MeanAttn => {
            // ||Σ_a A_a||_2 = sqrt(Σ_a |A_a|² + 2 Σ_{a<b} A_a·A_b)
            let att = &mut bufs.acc[..p];
            att.fill(0.0);
            for a in 0..g {
                for (o, &x) in att.iter_mut().zip(&sq[a * p..(a + 1) * p]) {
                    *o += x;
                }
            }
            for k in 0..window_pairs(g) {
                for (o, &x) in att.iter_mut().zip(&cross[k * p..(k + 1) * p]) {
                    *o += 2.0 * x;
                }
            }
            for v in att.iter_mut() {
                *v = libm::sqrtf(v.max(0.0));
            }
            // mean value-output norm of the group, into dst
            dst.fill(0.0);
            for a in 0..g {
                forms.fill(kh, a, p, bufs.row, bufs.tmp_b);
                for (d, &f) in dst.iter_mut().zip(bufs.tmp_b[..p].iter()) {
                    *d += libm::sqrtf(f.max(0.0)) / g as f32;
                }
            }
            match cfg.placement {
                PoolPlacement::Attention => {
                    pool_in_place(&cfg.pool, att, bufs.tmp_a);
                    for (d, &x) in dst.iter_mut().zip(att.iter()) {
                        *d *= x;
                    }
                }
                PoolPlacement::Product => {
                    for (d, &x) in dst.iter_mut().zip(att.iter()) {
                        *d *= x;
                    }
                    pool_in_place(&cfg.pool, dst, bufs.tmp_a);
                }
            }
        }
    }
}

/// `x = sqrt(x)` (with `clamp`: `sqrt(max(x, 0))`, NaN to 0 as `f32::max`), 8 at a time
/// (IEEE square roots: the scalar loop's bits).
fn sqrt_all(x: &mut [f32], clamp: bool) {
    dispatch!(fn(x: &mut [f32], clamp: bool) -> (), S => {
        let n8 = x.len() / 8 * 8;
        let mut i = 0;
        while i < n8 {
            // SAFETY: i + 8 <= n8 <= x.len().
            unsafe {
                let p = x.as_mut_ptr().add(i);
                let v = S::load(p);
                // max(0, v) keeps 0 where v is NaN or not above 0, as `f32::max(v, 0.0)`
                S::store(p, S::sqrt(if clamp { S::max(S::zero(), v) } else { v }));
            }
            i += 8;
        }
        for v in x[n8..].iter_mut() {
            *v = libm::sqrtf(if clamp { v.max(0.0) } else { *v });
        }
    })
}

/// `dst = sqrt(src)` elementwise, as [`sqrt_all`] without the clamp (the same bits).
fn sqrt_to(src: &[f32], dst: &mut [f32]) {
    dispatch!(fn(src: &[f32], dst: &mut [f32]) -> (), S => {
        let n = src.len();
        let dst = &mut dst[..n];
        let n8 = n / 8 * 8;
        let mut i = 0;
        while i < n8 {
            // SAFETY: i + 8 <= n8 <= n, both slices hold n.
            unsafe { S::store(dst.as_mut_ptr().add(i), S::sqrt(S::load(src.as_ptr().add(i)))) };
            i += 8;
        }
        for (d, &v) in dst[n8..].iter_mut().zip(&src[n8..]) {
            *d = libm::sqrtf(v);
        }
    })
}

/// `d = (first ? 0 : d) + x·sqrt(max(f, 0))` elementwise (a product, then a sum: no fused
/// multiply-add; the square root as [`sqrt_all`]'s with the clamp), `f` only read.
fn add_norm_products(d: &mut [f32], x: &[f32], f: &[f32], first: bool) {
    dispatch!(fn(d: &mut [f32], x: &[f32], f: &[f32], first: bool) -> (), S => {
        let n = d.len();
        assert!(x.len() >= n && f.len() >= n);
        let n8 = n / 8 * 8;
        let mut i = 0;
        while i < n8 {
            // SAFETY: i + 8 <= n8 <= n, every slice holds n.
            unsafe {
                let dp = d.as_mut_ptr().add(i);
                let y = S::sqrt(S::max(S::zero(), S::load(f.as_ptr().add(i))));
                let xy = S::mul(S::load(x.as_ptr().add(i)), y);
                let acc = if first { S::zero() } else { S::load(dp) };
                S::store(dp, S::add(acc, xy));
            }
            i += 8;
        }
        for ((d, &x), &f) in d[n8..].iter_mut().zip(&x[n8..n]).zip(&f[n8..n]) {
            let acc = if first { 0.0 } else { *d };
            *d = acc + x * libm::sqrtf(f.max(0.0));
        }
    })
}

fn window_pairs(g: usize) -> usize {
    g * (g - 1) / 2
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;
    use crate::window::tests::vals;
    use std::vec::Vec;

    /// The one-sweep value term gives the bits of the scalar sequence it replaced (copy the
    /// forms, `sqrtf(max(f, 0))`, then `d += x·v` from a zeroed `d` for the first head), and
    /// `sqrt_to` those of `sqrtf`: every length around whole vectors, negative and zero forms,
    /// signed zeros, with the kernels this CPU takes (`KVEVICT_PORTABLE=1`: the portable ones).
    #[test]
    fn value_term_sweep_matches_scalar_bits() {
        for n in 0..=41 {
            let mut f = vals(n, 3, 4.0);
            let x: Vec<f32> = vals(n, 5, 2.0).iter().map(|v| v.abs()).collect();
            for (i, v) in f.iter_mut().enumerate() {
                match i % 7 {
                    1 => *v = 0.0,
                    2 => *v = -0.0,
                    _ => {}
                }
            }
            let d0 = vals(n, 9, 1.0);
            for first in [true, false] {
                let mut d = d0.clone();
                add_norm_products(&mut d, &x, &f, first);
                for i in 0..n {
                    let acc = if first { 0.0 } else { d0[i] };
                    let want = acc + x[i] * libm::sqrtf(f[i].max(0.0));
                    assert_eq!(d[i].to_bits(), want.to_bits(), "n {n} i {i} first {first}");
                }
            }
            let mut r = std::vec![0f32; n];
            sqrt_to(&x, &mut r);
            for i in 0..n {
                assert_eq!(r[i].to_bits(), libm::sqrtf(x[i]).to_bits(), "n {n} i {i}");
            }
        }
    }
}
