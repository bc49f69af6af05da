//! Budget allocation and selection for a whole model (design §4).
//!
//! Input: scores `[L][Hkv][P]` from [`crate::score_layer`] (or any non-negative-ish f32
//! scores: random, external). Output: for every (layer, KV head) the kept positions in
//! ascending order — prefix tokens chosen by the allocator, then the whole window —
//! as CSR: `offsets[L·Hkv + 1]` (u64) into `indices` (u32 positions).
//!
//! Every allocator is a set of thresholds over unique 128-bit keys (see [`crate::select`]),
//! so results are exact, deterministic and independent of how a search is split.

mod ada;
pub mod lava;
pub mod pyramid;

use crate::config::{AllocatorKind, Granularity, Normalize, SelectConfig};
use crate::error::{add, mul, Error, Result};
use crate::pool::{pool_forward_linked, pool_past_sinks};
use crate::select::{make_key, run_search};
use crate::shape::ModelShape;
use crate::workspace::{Workspace, WorkspaceSize};

pub use lava::{lava_budgets, layer_entropy};
pub use pyramid::pyramid_budget;

/// Threshold meaning "keep nothing" (no key reaches it).
pub(crate) const NOTHING: u128 = u128::MAX;

/// Scores of a whole model (or of a shard of consecutive layers).
#[derive(Clone, Copy, Debug)]
pub struct ModelScores<'a> {
    /// `[layers][hkv][p]`, `p = n - min(window, n)`.
    pub scores: &'a [f32],
    pub layers: usize,
    pub hkv: usize,
    /// Tokens in the cache, window included.
    pub n: usize,
    pub window: usize,
}

impl ModelScores<'_> {
    pub fn prefix(&self) -> usize {
        self.n - self.window.min(self.n)
    }
    fn validate(&self) -> Result<()> {
        ModelShape::new(
            self.layers as u64,
            self.hkv as u64,
            self.n as u64,
            self.window as u64,
        )?;
        let len = mul(mul(self.layers, self.hkv)?, self.prefix())?;
        if self.scores.len() < len {
            return Err(Error::ShapeMismatch);
        }
        if self.scores[..len].iter().any(|v| !v.is_finite()) {
            return Err(Error::NonFinite);
        }
        Ok(())
    }
}

fn units(cfg: &SelectConfig, m: &ModelScores) -> usize {
    match cfg.granularity {
        Granularity::Head => m.layers * m.hkv,
        Granularity::Layer => m.layers,
        Granularity::Token => 1,
    }
}

/// Per-layer prefix budgets in tokens per unit of the granularity (a head, or the layer's
/// shared set), before clamping to `p`. Token granularity keeps one flat set whatever the
/// allocator, so its output size must not follow the pyramid.
fn pyramid_or_flat(cfg: &SelectConfig, l: usize, layers: usize) -> u64 {
    match cfg.allocator {
        AllocatorKind::Pyramid if cfg.granularity != Granularity::Token => {
            pyramid_budget(cfg.budget, cfg.beta, l, layers)
        }
        _ => cfg.budget,
    }
}

/// `(offsets, indices)` element counts the outputs of [`select_model`] need.
pub fn select_output_len(
    cfg: &SelectConfig,
    layers: usize,
    hkv: usize,
    n: usize,
    window: usize,
) -> Result<(usize, usize)> {
    ModelShape::new(layers as u64, hkv as u64, n as u64, window as u64)?;
    let p = (n - window.min(n)) as u64;
    let w = window.min(n);
    let mut prefix_total = 0u64;
    for l in 0..layers {
        let b = pyramid_or_flat(cfg, l, layers).min(p);
        prefix_total = prefix_total.checked_add(b).ok_or(Error::Overflow)?;
    }
    let per_head = add(
        mul(layers, w)?,
        usize::try_from(prefix_total).map_err(|_| Error::Overflow)?,
    )?;
    Ok((add(mul(layers, hkv)?, 1)?, mul(per_head, hkv)?))
}

/// Workspace bytes of [`select_model`].
pub fn select_workspace_size(
    cfg: &SelectConfig,
    layers: usize,
    hkv: usize,
    n: usize,
    window: usize,
) -> Result<usize> {
    cfg.validate()?;
    ModelShape::new(layers as u64, hkv as u64, n as u64, window as u64)?;
    let p = n - window.min(n);
    let u = match cfg.granularity {
        Granularity::Head => mul(layers, hkv)?,
        Granularity::Layer => layers,
        Granularity::Token => 1,
    };
    let copy = match cfg.granularity {
        Granularity::Head if !copies_scores(cfg) => 0,
        _ => mul(u, p)?,
    };
    let mut ws = WorkspaceSize::new();
    ws.add::<f32>(copy)?; // reduced / pooled scores
    ws.add::<f32>(p)?; // pooling scratch
    ws.add::<f32>(u)?; // scale per unit
    ws.add::<u128>(u)?; // threshold per unit
    ws.add::<u128>(u)?; // safeguard threshold per unit
    ws.add::<f64>(layers)?; // layer sums / entropies
    ws.add::<u64>(layers)?; // layer budgets
    ws.add::<u64>(layers)?; // caps
    ws.add::<u8>(layers)?; // marks
    Ok(ws.total())
}

/// Everything needed to compute the key of candidate `i` of unit `u`.
pub(crate) struct Units<'a> {
    /// Either the caller's scores (head granularity, no pooling) or the workspace copy.
    pub arr: &'a [f32],
    pub p: usize,
    pub scale: &'a [f32],
    pub forced: &'a [u128],
}

impl Units<'_> {
    #[inline(always)]
    pub fn base_key(&self, u: usize, i: usize) -> u128 {
        make_key(
            self.arr[u * self.p + i] * self.scale[u],
            i as u32,
            u as u32,
            false,
        )
    }
    #[inline(always)]
    pub fn key(&self, u: usize, i: usize) -> u128 {
        let k = self.base_key(u, i);
        if k >= self.forced[u] {
            k | (1u128 << 96)
        } else {
            k
        }
    }
    /// Threshold of the top-`k` of unit `u` (unforced keys).
    pub fn top_k(&self, u: usize, k: u64) -> u128 {
        run_search(k, self.p as u64, |sink| {
            for i in 0..self.p {
                sink(self.base_key(u, i));
            }
        })
        .unwrap_or(NOTHING)
    }
    /// One search over units `us` (forced keys first), `k` candidates.
    pub fn top_k_over(&self, us: core::ops::Range<usize>, k: u64) -> u128 {
        let total = (us.len() * self.p) as u64;
        run_search(k, total, |sink| {
            for u in us.clone() {
                for i in 0..self.p {
                    sink(self.key(u, i));
                }
            }
        })
        .unwrap_or(NOTHING)
    }
}

/// Whether per-head selection pools into its own copy of the scores (a forward post-pool
/// always does: value links may extend even a 1-token kernel).
fn copies_scores(cfg: &SelectConfig) -> bool {
    !cfg.post_pool.is_identity() || cfg.post_pool.kind == crate::config::PoolKind::Forward
}

/// Value links for [`select_model_linked`]: `sums[i]` is `Σ cos(v_i, v_{i-1})` over every
/// layer and KV head of the scores ([`crate::accumulate_value_links`] once per layer), for
/// all `n` cache positions; position `i` continues `i - 1` when the mean over those
/// `layers·hkv` heads exceeds `threshold`.
#[derive(Clone, Copy, Debug)]
pub struct ValueLinks<'a> {
    pub sums: &'a [f32],
    pub threshold: f32,
}

impl ValueLinks<'_> {
    /// The selection takes links with a flat forward post-pool and a finite threshold
    /// (`InvalidArgument`), `n` sums (`ShapeMismatch`), all finite (`NonFinite`).
    pub(crate) fn check(&self, cfg: &SelectConfig, n: usize) -> Result<()> {
        let flat =
            cfg.post_pool.kind == crate::config::PoolKind::Forward && cfg.post_pool.decay == 1.0;
        if !flat || !self.threshold.is_finite() {
            return Err(Error::InvalidArgument);
        }
        if self.sums.len() < n {
            return Err(Error::ShapeMismatch);
        }
        if self.sums[..n].iter().any(|v| !v.is_finite()) {
            return Err(Error::NonFinite);
        }
        Ok(())
    }
    pub(crate) fn link_min(&self, heads: usize) -> f32 {
        link_min(self.threshold, heads)
    }
}

/// The least sum that links: `threshold` times the `heads` (layers · Hkv) summed.
pub(crate) fn link_min(threshold: f32, heads: usize) -> f32 {
    (threshold as f64 * heads as f64) as f32
}

/// The LaProx-span selection's link threshold (design §4, continuation through value runs).
pub const LINK_THRESHOLD: f32 = 0.5;

/// Select kept positions for the whole model in one call.
///
/// Budgets larger than what a unit has are clamped (never an error). `offsets` needs
/// `L·Hkv + 1` entries and `indices` the count from [`select_output_len`]; on success
/// `offsets[L·Hkv]` is the number of indices written. Nothing is written on error.
pub fn select_model(
    cfg: &SelectConfig,
    m: &ModelScores,
    offsets: &mut [u64],
    indices: &mut [u32],
    workspace: &mut [u8],
) -> Result<()> {
    select(cfg, m, None, offsets, indices, workspace)
}

/// [`select_model`] whose forward post-pool (flat: decay 1) carries each continuation on
/// through linked positions, so that it never ends inside a run of similar values (a
/// number, a name cut by the kernel's length). Needs `post_pool` forward with decay 1
/// (else `InvalidArgument`), `links.sums` of at least `n` finite floats
/// (`ShapeMismatch`, `NonFinite`) and a finite threshold (`InvalidArgument`).
pub fn select_model_linked(
    cfg: &SelectConfig,
    m: &ModelScores,
    links: ValueLinks,
    offsets: &mut [u64],
    indices: &mut [u32],
    workspace: &mut [u8],
) -> Result<()> {
    select(cfg, m, Some(links), offsets, indices, workspace)
}

fn select(
    cfg: &SelectConfig,
    m: &ModelScores,
    links: Option<ValueLinks>,
    offsets: &mut [u64],
    indices: &mut [u32],
    workspace: &mut [u8],
) -> Result<()> {
    cfg.validate()?;
    m.validate()?;
    if let Some(l) = links {
        l.check(cfg, m.n)?;
    }
    let (no, ni) = select_output_len(cfg, m.layers, m.hkv, m.n, m.window)?;
    if offsets.len() < no || indices.len() < ni {
        return Err(Error::OutputTooSmall);
    }
    if workspace.len() < select_workspace_size(cfg, m.layers, m.hkv, m.n, m.window)? {
        return Err(Error::WorkspaceTooSmall);
    }
    let (layers, hkv, p) = (m.layers, m.hkv, m.prefix());
    let nu = units(cfg, m);
    let mut ws = Workspace::new(workspace);
    let copy = ws.take::<f32>(match cfg.granularity {
        Granularity::Head if !copies_scores(cfg) => 0,
        _ => nu * p,
    })?;
    let tmp = ws.take::<f32>(p)?;
    let scale = ws.take::<f32>(nu)?;
    let thr = ws.take::<u128>(nu)?;
    let forced = ws.take::<u128>(nu)?;
    let lsum = ws.take::<f64>(layers)?;
    let budgets = ws.take::<u64>(layers)?;
    let caps = ws.take::<u64>(layers)?;
    let marks = ws.take::<u8>(layers)?;
    forced.fill(NOTHING);

    // layer sums of |s| (normalisation) — f64: a layer holds up to Hkv·2^31 terms
    for l in 0..layers {
        lsum[l] = m.scores[l * hkv * p..(l + 1) * hkv * p]
            .iter()
            .map(|&s| (s as f64).abs())
            .sum();
    }
    let norm = |l: usize| -> f32 {
        if cfg.normalize == Normalize::LayerSum && lsum[l] > 0.0 {
            (1.0 / lsum[l]) as f32
        } else {
            1.0
        }
    };

    // scores at the selection granularity
    let sinks = cfg.post_pool_sinks as usize;
    // linked when the mean over the scores' heads exceeds the threshold
    let link_min = links.map(|l| l.link_min(layers * hkv));
    let pool = |src: &[f32], dst: &mut [f32]| match (links, link_min) {
        (Some(l), Some(min)) => {
            pool_forward_linked(cfg.post_pool.kernel as usize, sinks, l.sums, min, src, dst)
        }
        _ => pool_past_sinks(&cfg.post_pool, sinks, src, dst),
    };
    match cfg.granularity {
        Granularity::Head => {
            if !copy.is_empty() {
                for u in 0..nu {
                    pool(&m.scores[u * p..(u + 1) * p], &mut copy[u * p..(u + 1) * p]);
                }
            }
        }
        Granularity::Layer => {
            for l in 0..layers {
                let dst = &mut copy[l * p..(l + 1) * p];
                for kh in 0..hkv {
                    let src = &m.scores[(l * hkv + kh) * p..(l * hkv + kh + 1) * p];
                    for (d, &s) in dst.iter_mut().zip(src) {
                        *d += s;
                    }
                }
                tmp[..p].copy_from_slice(dst);
                pool(&tmp[..p], dst);
            }
        }
        Granularity::Token => {
            let dst = &mut copy[..p];
            for l in 0..layers {
                let f = norm(l);
                for kh in 0..hkv {
                    let src = &m.scores[(l * hkv + kh) * p..(l * hkv + kh + 1) * p];
                    for (d, &s) in dst.iter_mut().zip(src) {
                        *d += s * f;
                    }
                }
            }
            tmp[..p].copy_from_slice(dst);
            pool(&tmp[..p], dst);
        }
    }
    // layer normalisation matters only where layers compete: the global allocator
    let global = cfg.allocator == AllocatorKind::Global && cfg.granularity != Granularity::Token;
    for u in 0..nu {
        let l = match cfg.granularity {
            Granularity::Head => u / hkv,
            Granularity::Layer => u,
            Granularity::Token => 0,
        };
        scale[u] = if global { norm(l) } else { 1.0 };
    }
    let arr: &[f32] = if copy.is_empty() { m.scores } else { copy };
    let per_layer = cfg.granularity.per_layer(hkv);

    // thresholds
    {
        let un = Units {
            arr,
            p,
            scale,
            forced: &*forced,
        };
        let b = |l: usize| pyramid_or_flat(cfg, l, layers).min(p as u64);
        match (cfg.allocator, cfg.granularity) {
            (_, Granularity::Token) => thr[0] = un.top_k(0, cfg.budget.min(p as u64)),
            (AllocatorKind::Global, _) => {
                let k = (nu as u64).saturating_mul(cfg.budget.min(p as u64));
                let t = un.top_k_over(0..nu, k);
                thr.fill(t);
            }
            (AllocatorKind::Uniform | AllocatorKind::Pyramid, _)
            | (AllocatorKind::Ada, Granularity::Layer) => {
                for u in 0..nu {
                    thr[u] = un.top_k(u, b(u / per_layer));
                }
            }
            (AllocatorKind::Ada | AllocatorKind::Lava, _) => {
                // per-layer totals: flat, or LAVa's entropy split
                for l in 0..layers {
                    budgets[l] = (per_layer as u64) * cfg.budget.min(p as u64);
                }
                if cfg.allocator == AllocatorKind::Lava {
                    for l in 0..layers {
                        lsum[l] = layer_entropy(&m.scores[l * hkv * p..(l + 1) * hkv * p]);
                        caps[l] = (per_layer * p) as u64;
                    }
                    let total = (nu as u64).saturating_mul(cfg.budget.min(p as u64));
                    lava_budgets(lsum, total, caps, budgets, marks);
                }
                ada::thresholds(cfg, arr, p, scale, per_layer, budgets, forced, thr);
            }
        }
    }

    // write the kept lists: (layer, head) order, prefix by threshold, then the window
    let un = Units {
        arr,
        p,
        scale,
        forced: &*forced,
    };
    let mut o = 0usize;
    for l in 0..layers {
        for kh in 0..hkv {
            let u = cfg.granularity.unit(l, kh, hkv);
            offsets[l * hkv + kh] = o as u64;
            let t = thr[u];
            for i in 0..p {
                if un.key(u, i) >= t {
                    indices[o] = i as u32;
                    o += 1;
                }
            }
            for i in p..m.n {
                indices[o] = i as u32;
                o += 1;
            }
        }
    }
    offsets[layers * hkv] = o as u64;
    Ok(())
}

/// Positions of `0..p` missing from an ascending kept list: what an engine whose cell is
/// shared by every head (llama.cpp) evicts with `llama_memory_seq_rm(mem, seq, pos, pos+1)`.
/// Returns the count written to `out` (at most `p`).
pub fn evicted_positions(kept: &[u32], p: usize, out: &mut [u32]) -> Result<usize> {
    fn each_missing(kept: &[u32], p: usize, emit: &mut dyn FnMut(u32)) {
        let mut k = 0;
        for i in 0..p as u32 {
            while k < kept.len() && kept[k] < i {
                k += 1;
            }
            if !(k < kept.len() && kept[k] == i) {
                emit(i);
            }
        }
    }
    // count first: nothing is written when `out` is too small
    let mut count = 0usize;
    each_missing(kept, p, &mut |_| count += 1);
    if out.len() < count {
        return Err(Error::OutputTooSmall);
    }
    let mut o = 0;
    each_missing(kept, p, &mut |i| {
        out[o] = i;
        o += 1;
    });
    Ok(o)
}
