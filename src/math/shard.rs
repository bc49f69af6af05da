//! Model-wide selection split over shards of consecutive layers (design §4 "Selection across
//! devices"), for the `global` allocator at head or layer granularity.
//!
//! Every shard holds the scores of some layers. Each round, every shard counts its
//! candidates' keys into a [`Histogram`] ([`count_shard`]); the histograms add up
//! ([`Histogram::merge`]) and one [`ShardSearch::step`] fixes the next key digit, until the
//! search is done. Then every shard writes its kept lists ([`select_shard`]). With one
//! shard holding every layer the result equals [`crate::select_model`]'s exactly: same keys
//! (score · 1/layer-sum, position, global unit index), same threshold.
//!
//! [`ShardSearch`] is [`crate::select::Search`]: plain, validated data, so a C caller can
//! copy it between processes and devices.
//!
//! [`ModelSearch`] and [`ShardHistogram`] are the protocol with its protection, the one the
//! C API converts to: the search records its model and parameters (a shard of another
//! shape or other parameters is refused), every histogram records the round it was counted
//! for (a fingerprint of the search state) and which layers it covers (a checksum), so a
//! step refuses last round's counts, a missing layer or one counted twice. The free
//! functions below it ([`search_new`], [`count_shard`], [`select_shard`]) are the bare
//! primitives, for callers that mix in shards counted elsewhere (a device's launcher)
//! and check the protocol themselves.

use crate::budget::{ModelScores, ValueLinks};
use crate::config::{AllocatorKind, Granularity, Normalize, SelectConfig};
use crate::error::{add, mul, Error, Result};
use crate::pool::{pool_forward_linked, pool_past_sinks};
use crate::select::{make_key, Histogram, SPACE};
use crate::workspace::{Workspace, WorkspaceSize};

/// The search state is the core's: plain data a C caller can hold.
pub use crate::select::{Search as ShardSearch, KEEP_NOTHING};
use crate::shape::ModelShape;

fn check_cfg(cfg: &SelectConfig) -> Result<()> {
    cfg.validate()?;
    if cfg.allocator != AllocatorKind::Global || cfg.granularity == Granularity::Token {
        return Err(Error::InvalidArgument);
    }
    Ok(())
}

fn check_dims(layers: usize, hkv: usize, n: usize) -> Result<()> {
    ModelShape::new(layers as u64, hkv as u64, n as u64, 0).map(|_| ())
}

/// [`check_cfg`] and [`check_dims`], then the model's selection units: `layers` times the
/// granularity's units a layer (at most `MAX_UNITS`: no overflow).
fn checked_units(cfg: &SelectConfig, layers: usize, hkv: usize, n: usize) -> Result<usize> {
    check_cfg(cfg)?;
    check_dims(layers, hkv, n)?;
    Ok(layers * cfg.granularity.per_layer(hkv))
}

/// A search for the model of `layers` layers (all shards together): `global` allocator,
/// head or layer granularity; `k` = units · min(budget, P) as in [`crate::select_model`].
pub fn search_new(
    cfg: &SelectConfig,
    layers: usize,
    hkv: usize,
    n: usize,
    window: usize,
) -> Result<ShardSearch> {
    let nu = checked_units(cfg, layers, hkv, n)? as u64;
    let p = (n - window.min(n)) as u64;
    Ok(ShardSearch::new(
        nu.saturating_mul(cfg.budget.min(p)),
        nu * p,
    ))
}

/// Whether `s` can be a state of the search [`search_new`] starts for this model, stepped
/// on by [`ShardSearch::step`]. Checked: the fields' own consistency; while no digit is
/// settled (`bits == 0`) the whole state, recomputed (`need` is the model's `k`); after
/// that `need` at most `k`, no threshold while running, and a finished threshold that is
/// the settled digits' (or 0, keep all). Not checkable: settled digits, `need` below `k`
/// and a threshold made up together (a forged threshold) keep what they say.
pub fn check_search(
    cfg: &SelectConfig,
    layers: usize,
    hkv: usize,
    n: usize,
    window: usize,
    s: &ShardSearch,
) -> Result<()> {
    s.validate()?;
    let start = search_new(cfg, layers, hkv, n, window)?;
    let bad = Err(Error::InvalidArgument);
    if s.bits == 0 {
        return if *s == start { Ok(()) } else { bad };
    }
    if s.bits % 8 != 0 || s.bits > SPACE || s.prefix >> s.bits != 0 || s.need > start.need {
        return bad;
    }
    let settled = s.prefix << (SPACE - s.bits);
    let threshold_ok = if s.done {
        s.threshold == settled || s.threshold == 0
    } else {
        s.threshold == 0
    };
    if threshold_ok {
        Ok(())
    } else {
        bad
    }
}

/// Counts of the next key digit ([`Histogram`]) with what they cover: the round they were
/// counted for ([`ModelSearch::round`]; 0 while empty), the layers counted (with repeats)
/// and a checksum of which (a wrong set passes with probability about 2^-64).
/// [`ShardHistogram::EMPTY`] (all zero) before counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ShardHistogram {
    pub bins: Histogram,
    pub round: u64,
    pub layers: u64,
    pub layer_sum: u64,
}

impl ShardHistogram {
    pub const EMPTY: ShardHistogram = ShardHistogram {
        bins: Histogram([0; 256]),
        round: 0,
        layers: 0,
        layer_sum: 0,
    };
    /// Add another shard's counts (saturating) and layers. Unless one is empty both must
    /// be counted for the same round (`InvalidArgument`, nothing changed).
    pub fn merge(&mut self, other: &ShardHistogram) -> Result<()> {
        if self.round != 0 && other.round != 0 && self.round != other.round {
            return Err(Error::InvalidArgument);
        }
        self.bins.merge(&other.bins);
        self.round = self.round.max(other.round);
        self.layers = self.layers.saturating_add(other.layers);
        self.layer_sum = self.layer_sum.wrapping_add(other.layer_sum);
        Ok(())
    }
}

/// The checksum term of layer `l` (splitmix64's finaliser: layers spread over all bits).
fn layer_mix(l: u64) -> u64 {
    let mut z = l.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn layer_sum(layers: core::ops::Range<u64>) -> u64 {
    layers.fold(0u64, |a, l| a.wrapping_add(layer_mix(l)))
}

/// A model-wide search split over shards of layers, with the protocol's checks: it
/// records the model (`shape`, all shards together) and the selection parameters it was
/// started for. Plain data (every field public, so a caller can copy it between processes
/// and devices); every method checks it first ([`ModelSearch::validate`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelSearch {
    pub search: ShardSearch,
    pub cfg: SelectConfig,
    /// The model; `window` is `min(window, n)`.
    pub shape: ModelShape,
}

impl ModelSearch {
    /// Start a search for the model of `layers` layers (all shards together): `global`
    /// allocator, head or layer granularity (else `InvalidArgument`); the dimensions as
    /// [`ModelShape::new`] checks them.
    pub fn new(
        cfg: &SelectConfig,
        layers: usize,
        hkv: usize,
        n: usize,
        window: usize,
    ) -> Result<ModelSearch> {
        let shape = ModelShape::new(layers as u64, hkv as u64, n as u64, window as u64)?;
        let search = search_new(cfg, shape.layers, shape.hkv, shape.n, shape.window)?;
        Ok(ModelSearch {
            search,
            cfg: *cfg,
            shape,
        })
    }

    /// Whether this can be a state [`ModelSearch::new`] and [`ModelSearch::step`] produce
    /// (as [`check_search`], with the model's dimensions and window checked too);
    /// `InvalidArgument` when not. A forged threshold cannot be told from a real one.
    pub fn validate(&self) -> Result<()> {
        let m = self.shape;
        let shape = ModelShape::new(m.layers as u64, m.hkv as u64, m.n as u64, m.window as u64);
        if shape != Ok(m) {
            return Err(Error::InvalidArgument);
        }
        check_search(&self.cfg, m.layers, m.hkv, m.n, m.window, &self.search)
            .map_err(|_| Error::InvalidArgument)
    }

    /// The fingerprint of the state (never 0): FNV-1a over its fields, the parameters as
    /// their C codes. Histograms record it.
    pub fn round(&self) -> u64 {
        let (s, p, m) = (&self.search, &self.cfg, &self.shape);
        let words = [
            s.need,
            s.prefix as u64,
            (s.prefix >> 64) as u64,
            s.threshold as u64,
            (s.threshold >> 64) as u64,
            (s.bits as u64) << 32 | s.done as u64,
            m.layers as u64,
            m.hkv as u64,
            m.n as u64,
            m.window as u64,
            (p.allocator as u64) << 32 | p.granularity as u64,
            (p.normalize as u64) << 32 | p.alpha.to_bits() as u64,
            p.budget,
            (p.beta as u64) << 32 | p.post_pool.kind as u64,
            (p.post_pool.kernel as u64) << 32 | p.post_pool.decay.to_bits() as u64,
            p.post_pool_sinks as u64,
        ];
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for w in words {
            for b in w.to_le_bytes() {
                h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        h | 1
    }

    /// `cfg` must be the search's parameters (`InvalidArgument`), the shard of `m.layers`
    /// layers from `first_layer` part of its model: same `hkv`, `n`, window, inside its
    /// layers (`ShapeMismatch`).
    pub fn check_shard(
        &self,
        cfg: &SelectConfig,
        m: &ModelScores,
        first_layer: usize,
    ) -> Result<()> {
        self.validate()?;
        if *cfg != self.cfg {
            return Err(Error::InvalidArgument);
        }
        let s = self.shape;
        let end = first_layer.checked_add(m.layers);
        if m.hkv != s.hkv
            || m.n != s.n
            || m.window != s.window
            || end.map_or(true, |e| e > s.layers)
        {
            return Err(Error::ShapeMismatch);
        }
        Ok(())
    }

    fn links<'a>(&self, links: Option<ValueLinks<'a>>) -> Option<ShardLinks<'a>> {
        links.map(|links| ShardLinks {
            links,
            model_layers: self.shape.layers,
        })
    }

    /// Add the shard's candidates (layers `first_layer ..` of the model, scores `m`) to
    /// `hist` for this round: `hist` empty or counted for the same round (else
    /// `InvalidArgument`); it then records the round and the layers. `links`: the sums over
    /// EVERY layer of the model for the linked selection ([`count_shard_linked`]'s rules).
    /// `hist` is written only on success.
    pub fn count_shard(
        &self,
        cfg: &SelectConfig,
        m: &ModelScores,
        first_layer: usize,
        links: Option<ValueLinks>,
        hist: &mut ShardHistogram,
        workspace: &mut [u8],
    ) -> Result<()> {
        self.check_shard(cfg, m, first_layer)?;
        let round = self.round();
        if hist.round != 0 && hist.round != round {
            return Err(Error::InvalidArgument);
        }
        let mut bins = hist.bins;
        let links = self.links(links);
        count_shard_linked(
            cfg,
            m,
            first_layer,
            links,
            &self.search,
            &mut bins,
            workspace,
        )?;
        let first = first_layer as u64;
        *hist = ShardHistogram {
            bins,
            round,
            layers: hist.layers.saturating_add(m.layers as u64),
            layer_sum: hist
                .layer_sum
                .wrapping_add(layer_sum(first..first + m.layers as u64)),
        };
        Ok(())
    }

    /// Fix the next digit from `hist`, merged over every shard: while running it must be
    /// counted for this round (`InvalidArgument`) over every layer of the model exactly
    /// once (`ShapeMismatch`); a finished search ignores it. Returns whether the search is
    /// done; unchanged on error.
    pub fn step(&mut self, hist: &ShardHistogram) -> Result<bool> {
        self.validate()?;
        if !self.search.done {
            if hist.round != self.round() {
                return Err(Error::InvalidArgument);
            }
            let layers = self.shape.layers as u64;
            if hist.layers != layers || hist.layer_sum != layer_sum(0..layers) {
                return Err(Error::ShapeMismatch);
            }
        }
        Ok(self.search.step(&hist.bins))
    }

    /// The threshold of a finished search as a normalised score: candidates above it are
    /// kept, ties decided by position and unit; `-inf` keeps every candidate, `+inf` none.
    /// `InvalidArgument` while running.
    pub fn threshold_score(&self) -> Result<f32> {
        self.validate()?;
        let s = &self.search;
        if !s.done {
            return Err(Error::InvalidArgument);
        }
        Ok(if s.threshold == KEEP_NOTHING {
            f32::INFINITY
        } else if s.threshold == 0 {
            f32::NEG_INFINITY
        } else {
            crate::numerics::key_float((s.threshold >> 64) as u32)
        })
    }

    /// The shard's kept lists under the finished search ([`select_shard_linked`]), the shard
    /// and parameters checked as in [`ModelSearch::count_shard`].
    #[allow(clippy::too_many_arguments)]
    pub fn select_shard(
        &self,
        cfg: &SelectConfig,
        m: &ModelScores,
        first_layer: usize,
        links: Option<ValueLinks>,
        offsets: &mut [u64],
        indices: &mut [u32],
        workspace: &mut [u8],
    ) -> Result<()> {
        self.check_shard(cfg, m, first_layer)?;
        let links = self.links(links);
        select_shard_linked(
            cfg,
            m,
            first_layer,
            links,
            &self.search,
            offsets,
            indices,
            workspace,
        )
    }
}

/// Workspace bytes of [`count_shard`] and [`select_shard`] for a shard of `layers` layers.
pub fn shard_workspace_size(
    cfg: &SelectConfig,
    layers: usize,
    hkv: usize,
    n: usize,
    window: usize,
) -> Result<usize> {
    let nu = checked_units(cfg, layers, hkv, n)?;
    let p = n - window.min(n);
    let mut ws = WorkspaceSize::new();
    ws.add::<f32>(mul(nu, p)?)?; // scores at the selection granularity, pooled
    ws.add::<f32>(p)?; // pooling scratch
    ws.add::<f32>(nu)?; // scale per unit
    Ok(ws.total())
}

/// `(offsets, indices)` element counts that are always enough for [`select_shard`]:
/// `layers·Hkv + 1` and `layers·Hkv·N` (the call itself accepts any `indices` holding
/// what it keeps).
pub fn shard_output_len(layers: usize, hkv: usize, n: usize) -> Result<(usize, usize)> {
    let u = mul(layers, hkv)?;
    Ok((add(u, 1)?, mul(u, n)?))
}

/// Value links for a shard's linked forward post-pool (`crate::select_model_linked`): the
/// sums over EVERY layer of the model (each shard accumulates its own layers with
/// [`crate::accumulate_value_links`], the caller adds them up) and the model's layer
/// count, over whose heads the threshold is a mean.
#[derive(Clone, Copy, Debug)]
pub struct ShardLinks<'a> {
    pub links: ValueLinks<'a>,
    pub model_layers: usize,
}

/// Scores of a shard at the selection granularity, with their per-unit scale.
struct Prepared<'a> {
    arr: &'a [f32],
    scale: &'a [f32],
    p: usize,
    /// Global index of the shard's first unit.
    u0: usize,
}

impl Prepared<'_> {
    #[inline(always)]
    fn key(&self, u: usize, i: usize) -> u128 {
        make_key(
            self.arr[u * self.p + i] * self.scale[u],
            i as u32,
            (self.u0 + u) as u32,
            false,
        )
    }
}

/// Validate and build the shard's keys source; identical arithmetic to `select_model`.
fn prepare<'a>(
    cfg: &SelectConfig,
    m: &ModelScores<'a>,
    first_layer: usize,
    links: Option<ShardLinks>,
    workspace: &'a mut [u8],
) -> Result<Prepared<'a>> {
    check_cfg(cfg)?;
    check_dims(m.layers, m.hkv, m.n)?;
    check_dims(add(first_layer, m.layers)?, m.hkv, m.n)?;
    if let Some(l) = links {
        if l.model_layers < first_layer + m.layers {
            return Err(Error::ShapeMismatch);
        }
    }
    let (layers, hkv, p) = (m.layers, m.hkv, m.prefix());
    let len = mul(mul(layers, hkv)?, p)?;
    if m.scores.len() < len {
        return Err(Error::ShapeMismatch);
    }
    let scores = &m.scores[..len];
    if scores.iter().any(|v| !v.is_finite()) {
        return Err(Error::NonFinite);
    }
    if let Some(l) = links {
        l.links.check(cfg, m.n)?;
    }
    if workspace.len() < shard_workspace_size(cfg, layers, hkv, m.n, m.window)? {
        return Err(Error::WorkspaceTooSmall);
    }
    let upl = cfg.granularity.per_layer(hkv);
    let nu = layers * upl;
    let sinks = cfg.post_pool_sinks as usize;
    let mut ws = Workspace::new(workspace);
    let copy = ws.take::<f32>(nu * p)?;
    let tmp = ws.take::<f32>(p)?;
    let scale = ws.take::<f32>(nu)?;
    // select_model's pool: linked through the model's sums when given
    let pool = |src: &[f32], dst: &mut [f32]| match links {
        Some(l) => {
            let min = l.links.link_min(l.model_layers * hkv);
            let k = cfg.post_pool.kernel as usize;
            pool_forward_linked(k, sinks, l.links.sums, min, src, dst)
        }
        None => pool_past_sinks(&cfg.post_pool, sinks, src, dst),
    };
    for l in 0..layers {
        let layer = &scores[l * hkv * p..(l + 1) * hkv * p];
        let lsum: f64 = layer.iter().map(|&s| (s as f64).abs()).sum();
        let f = if cfg.normalize == Normalize::LayerSum && lsum > 0.0 {
            (1.0 / lsum) as f32
        } else {
            1.0
        };
        match cfg.granularity {
            Granularity::Head => {
                for kh in 0..hkv {
                    let u = l * hkv + kh;
                    pool(&layer[kh * p..(kh + 1) * p], &mut copy[u * p..(u + 1) * p]);
                    scale[u] = f;
                }
            }
            _ => {
                let dst = &mut copy[l * p..(l + 1) * p];
                for kh in 0..hkv {
                    for (d, &s) in dst.iter_mut().zip(&layer[kh * p..(kh + 1) * p]) {
                        *d += s;
                    }
                }
                tmp[..p].copy_from_slice(dst);
                pool(&tmp[..p], dst);
                scale[l] = f;
            }
        }
    }
    Ok(Prepared {
        arr: copy,
        scale,
        p,
        u0: first_layer * upl,
    })
}

/// Add the shard's candidates that match the search's fixed digits to `hist`.
/// `m` holds layers `first_layer .. first_layer + m.layers` of the model. `hist` is
/// updated only on success.
pub fn count_shard(
    cfg: &SelectConfig,
    m: &ModelScores,
    first_layer: usize,
    search: &ShardSearch,
    hist: &mut Histogram,
    workspace: &mut [u8],
) -> Result<()> {
    count_shard_linked(cfg, m, first_layer, None, search, hist, workspace)
}

/// [`count_shard`], the post-pool linked when `links` are given (as
/// [`crate::select_model_linked`]: flat forward post-pool, finite threshold, `n` finite
/// sums; `model_layers` covering the shard). Every shard of the search passes the same.
pub fn count_shard_linked(
    cfg: &SelectConfig,
    m: &ModelScores,
    first_layer: usize,
    links: Option<ShardLinks>,
    search: &ShardSearch,
    hist: &mut Histogram,
    workspace: &mut [u8],
) -> Result<()> {
    search.validate()?;
    let pr = prepare(cfg, m, first_layer, links, workspace)?;
    if search.done {
        return Ok(());
    }
    let nu = pr.scale.len();
    let mut h = *hist;
    for u in 0..nu {
        for i in 0..pr.p {
            search.count(pr.key(u, i), &mut h);
        }
    }
    *hist = h;
    Ok(())
}

/// Kept positions of the shard's (layer, KV head) pairs under a finished search, as CSR
/// like [`crate::select_model`] (offsets relative to this `indices`): prefix tokens whose
/// key reaches the threshold, then the whole window. Nothing is written on error.
pub fn select_shard(
    cfg: &SelectConfig,
    m: &ModelScores,
    first_layer: usize,
    search: &ShardSearch,
    offsets: &mut [u64],
    indices: &mut [u32],
    workspace: &mut [u8],
) -> Result<()> {
    select_shard_linked(
        cfg,
        m,
        first_layer,
        None,
        search,
        offsets,
        indices,
        workspace,
    )
}

/// [`select_shard`], the post-pool linked as in [`count_shard_linked`].
#[allow(clippy::too_many_arguments)]
pub fn select_shard_linked(
    cfg: &SelectConfig,
    m: &ModelScores,
    first_layer: usize,
    links: Option<ShardLinks>,
    search: &ShardSearch,
    offsets: &mut [u64],
    indices: &mut [u32],
    workspace: &mut [u8],
) -> Result<()> {
    search.validate()?;
    if !search.done {
        return Err(Error::InvalidArgument);
    }
    let pr = prepare(cfg, m, first_layer, links, workspace)?;
    let (layers, hkv, n, p) = (m.layers, m.hkv, m.n, pr.p);
    let upl = cfg.granularity.per_layer(hkv);
    let t = search.threshold;
    let unit = |l: usize, kh: usize| if upl == 1 { l } else { l * hkv + kh };
    // count first, so nothing is written when the outputs are too small
    let mut total = 0usize;
    for l in 0..layers {
        for kh in 0..hkv {
            let u = unit(l, kh);
            total += (0..p).filter(|&i| pr.key(u, i) >= t).count() + (n - p);
        }
    }
    if offsets.len() < layers * hkv + 1 || indices.len() < total {
        return Err(Error::OutputTooSmall);
    }
    let mut o = 0usize;
    for l in 0..layers {
        for kh in 0..hkv {
            let u = unit(l, kh);
            offsets[l * hkv + kh] = o as u64;
            for i in 0..p {
                if pr.key(u, i) >= t {
                    indices[o] = i as u32;
                    o += 1;
                }
            }
            for i in p..n {
                indices[o] = i as u32;
                o += 1;
            }
        }
    }
    offsets[layers * hkv] = o as u64;
    Ok(())
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;
    use crate::config::Pool;
    use std::vec;
    use std::vec::Vec;

    fn scores(len: usize, seed: u64) -> Vec<f32> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // coarse values so ties happen
                ((x >> 40) % 50) as f32 / 7.0
            })
            .collect()
    }

    fn run(
        cfg: &SelectConfig,
        s: &[f32],
        layers: usize,
        hkv: usize,
        n: usize,
        w: usize,
        split: usize,
    ) {
        let p = n - w.min(n);
        let m = ModelScores {
            scores: s,
            layers,
            hkv,
            n,
            window: w,
        };
        let (no, ni) = crate::select_output_len(cfg, layers, hkv, n, w).unwrap();
        let mut off = vec![0u64; no];
        let mut idx = vec![0u32; ni];
        let mut ws = vec![0u8; crate::select_workspace_size(cfg, layers, hkv, n, w).unwrap()];
        crate::select_model(cfg, &m, &mut off, &mut idx, &mut ws).unwrap();

        // the two shards (first layer, layers; an empty one left out) and their scores
        let shards: Vec<(usize, usize, ModelScores)> = [(0, split), (split, layers - split)]
            .into_iter()
            .filter(|&(_, ln)| ln > 0)
            .map(|(l0, ln)| {
                let sm = ModelScores {
                    scores: &s[l0 * hkv * p..(l0 + ln) * hkv * p],
                    layers: ln,
                    hkv,
                    n,
                    window: w,
                };
                (l0, ln, sm)
            })
            .collect();
        let mut search = search_new(cfg, layers, hkv, n, w).unwrap();
        let mut rounds = 0;
        while !search.done {
            let mut h = Histogram::default();
            for (l0, ln, sm) in &shards {
                let (l0, ln) = (*l0, *ln);
                let mut hs = Histogram::default();
                let mut ws = vec![0u8; shard_workspace_size(cfg, ln, hkv, n, w).unwrap()];
                count_shard(cfg, sm, l0, &search, &mut hs, &mut ws).unwrap();
                h.merge(&hs);
            }
            search.step(&h);
            rounds += 1;
            assert!(rounds <= 13);
        }
        let mut got: Vec<u32> = Vec::new();
        for (l0, ln, sm) in &shards {
            let (l0, ln) = (*l0, *ln);
            let (so, si) = shard_output_len(ln, hkv, n).unwrap();
            let mut o2 = vec![0u64; so];
            let mut i2 = vec![0u32; si];
            let mut ws = vec![0u8; shard_workspace_size(cfg, ln, hkv, n, w).unwrap()];
            select_shard(cfg, sm, l0, &search, &mut o2, &mut i2, &mut ws).unwrap();
            got.extend_from_slice(&i2[..o2[ln * hkv] as usize]);
            for u in 0..ln * hkv {
                let g = l0 * hkv + u;
                assert_eq!(
                    &i2[o2[u] as usize..o2[u + 1] as usize],
                    &idx[off[g] as usize..off[g + 1] as usize]
                );
            }
        }
        assert_eq!(&got[..], &idx[..off[layers * hkv] as usize]);
    }

    #[test]
    fn shards_equal_select_model() {
        for (seed, &(layers, hkv, n, w, budget, split)) in [
            (4, 2, 40, 8, 5, 1),
            (3, 3, 17, 32, 2, 2),
            (5, 1, 100, 4, 30, 3),
            (2, 4, 64, 0, 64, 1),
            (6, 2, 50, 10, 0, 3),
        ]
        .iter()
        .enumerate()
        {
            let p = n - w.min(n);
            let s = scores(layers * hkv * p, seed as u64 + 7);
            for gran in [Granularity::Head, Granularity::Layer] {
                for pooled in [false, true] {
                    for norm in [Normalize::LayerSum, Normalize::None] {
                        let mut cfg = SelectConfig::new(AllocatorKind::Global, gran, budget);
                        cfg.normalize = norm;
                        if pooled {
                            cfg.post_pool = Pool::forward(4, 0.8);
                            cfg.post_pool_sinks = seed as u32 % 3; // 0, 1, 2 positions lend nothing
                        }
                        run(&cfg, &s, layers, hkv, n, w, split);
                    }
                }
            }
        }
    }

    /// Value links of `layers` layers of random values `[hkv, n, 8]`, per shard: each
    /// shard accumulates its own layers, the caller adds the shards' sums.
    fn shard_link_sums(layers: usize, hkv: usize, n: usize, shards: &[(usize, usize)]) -> Vec<f32> {
        let dv = 8;
        let vals = scores(layers * hkv * n * dv, 99);
        // runs of similar values: token i repeats i-1's vector, a little changed, where i % 5 != 0
        let mut vals = vals;
        for l in 0..layers {
            for h in 0..hkv {
                for i in 1..n {
                    if i % 5 != 0 {
                        for c in 0..dv {
                            let at = ((l * hkv + h) * n + i) * dv + c;
                            vals[at] = vals[at - dv] + 0.05 * vals[at];
                        }
                    }
                }
            }
        }
        let mut ws = vec![0u8; crate::value_links_workspace_size(n, dv).unwrap()];
        let mut total = vec![0f32; n];
        for &(l0, ln) in shards {
            let mut part = vec![0f32; n];
            for l in l0..l0 + ln {
                let v = &vals[l * hkv * n * dv..(l + 1) * hkv * n * dv];
                let view = crate::View::f32_contiguous(v, [hkv, n, dv]).unwrap();
                crate::accumulate_value_links(&view, &mut part, &mut ws).unwrap();
            }
            for (t, p) in total.iter_mut().zip(&part) {
                *t += p;
            }
        }
        total
    }

    /// The linked shards' lists against `select_model_linked` over the whole model, for one
    /// shard holding every layer and for 2 and 3 shards.
    #[test]
    fn linked_shards_equal_select_model_linked() {
        let (layers, hkv, n, w) = (6, 2, 70, 6);
        let p = n - w;
        let s = scores(layers * hkv * p, 5);
        for shards in [
            vec![(0, 6)],
            vec![(0, 2), (2, 4)],
            vec![(0, 1), (1, 3), (4, 2)],
        ] {
            let sums = shard_link_sums(layers, hkv, n, &shards);
            for gran in [Granularity::Head, Granularity::Layer] {
                for (kernel, sinks, budget) in [(5u32, 0u32, 9u64), (1, 2, 4), (9, 1, 20)] {
                    let mut cfg = SelectConfig::new(AllocatorKind::Global, gran, budget);
                    cfg.post_pool = Pool::forward(kernel, 1.0);
                    cfg.post_pool_sinks = sinks;
                    let vl = ValueLinks {
                        sums: &sums,
                        threshold: 0.5,
                    };
                    let m = ModelScores {
                        scores: &s,
                        layers,
                        hkv,
                        n,
                        window: w,
                    };
                    let (no, ni) = crate::select_output_len(&cfg, layers, hkv, n, w).unwrap();
                    let (mut off, mut idx) = (vec![0u64; no], vec![0u32; ni]);
                    let mut ws =
                        vec![0u8; crate::select_workspace_size(&cfg, layers, hkv, n, w).unwrap()];
                    crate::select_model_linked(&cfg, &m, vl, &mut off, &mut idx, &mut ws).unwrap();
                    let links = Some(ShardLinks {
                        links: vl,
                        model_layers: layers,
                    });
                    let part = |l0: usize, ln: usize| ModelScores {
                        scores: &s[l0 * hkv * p..(l0 + ln) * hkv * p],
                        layers: ln,
                        hkv,
                        n,
                        window: w,
                    };
                    let mut search = search_new(&cfg, layers, hkv, n, w).unwrap();
                    while !search.done {
                        let mut h = Histogram::default();
                        for &(l0, ln) in &shards {
                            let mut ws =
                                vec![0u8; shard_workspace_size(&cfg, ln, hkv, n, w).unwrap()];
                            let mut hs = Histogram::default();
                            count_shard_linked(
                                &cfg,
                                &part(l0, ln),
                                l0,
                                links,
                                &search,
                                &mut hs,
                                &mut ws,
                            )
                            .unwrap();
                            h.merge(&hs);
                        }
                        search.step(&h);
                    }
                    let mut got = Vec::new();
                    for &(l0, ln) in &shards {
                        let (so, si) = shard_output_len(ln, hkv, n).unwrap();
                        let (mut o2, mut i2) = (vec![0u64; so], vec![0u32; si]);
                        let mut ws = vec![0u8; shard_workspace_size(&cfg, ln, hkv, n, w).unwrap()];
                        select_shard_linked(
                            &cfg,
                            &part(l0, ln),
                            l0,
                            links,
                            &search,
                            &mut o2,
                            &mut i2,
                            &mut ws,
                        )
                        .unwrap();
                        got.extend_from_slice(&i2[..o2[ln * hkv] as usize]);
                    }
                    assert_eq!(
                        got,
                        idx[..off[layers * hkv] as usize],
                        "{shards:?} {gran:?} kernel {kernel} sinks {sinks}"
                    );
                    // the links matter here: the unlinked selection differs
                    if shards.len() == 1 && kernel == 5 && gran == Granularity::Head {
                        let mut plain = vec![0u32; ni];
                        crate::select_model(&cfg, &m, &mut off.clone(), &mut plain, &mut ws)
                            .unwrap();
                        assert_ne!(plain, idx);
                    }
                }
            }
        }
    }

    #[test]
    fn linked_shards_refuse_bad_links() {
        let (layers, hkv, n, w) = (2, 2, 20, 4);
        let s = scores(layers * hkv * (n - w), 3);
        let mut cfg = SelectConfig::new(AllocatorKind::Global, Granularity::Head, 5);
        cfg.post_pool = Pool::forward(4, 1.0);
        let m = ModelScores {
            scores: &s,
            layers,
            hkv,
            n,
            window: w,
        };
        let search = search_new(&cfg, layers, hkv, n, w).unwrap();
        let good = vec![0f32; n];
        let mut nan = good.clone();
        nan[3] = f32::NAN;
        let mut decayed = cfg;
        decayed.post_pool = Pool::forward(4, 0.9);
        let cases: [(&SelectConfig, &[f32], f32, usize, Error); 5] = [
            (&cfg, &good[..n - 1], 0.5, layers, Error::ShapeMismatch),
            (&cfg, &nan, 0.5, layers, Error::NonFinite),
            (&cfg, &good, f32::NAN, layers, Error::InvalidArgument),
            (&decayed, &good, 0.5, layers, Error::InvalidArgument),
            (&cfg, &good, 0.5, layers - 1, Error::ShapeMismatch),
        ];
        for (i, (c, sums, threshold, model_layers, want)) in cases.into_iter().enumerate() {
            let links = Some(ShardLinks {
                links: ValueLinks { sums, threshold },
                model_layers,
            });
            let mut ws = vec![0u8; shard_workspace_size(c, layers, hkv, n, w).unwrap_or(0)];
            let mut h = Histogram::default();
            let got = count_shard_linked(c, &m, 0, links, &search, &mut h, &mut ws);
            assert_eq!(got, Err(want), "case {i}");
            assert_eq!(h, Histogram::default(), "case {i}: histogram written");
        }
    }

    /// A Rust caller of [`ModelSearch`] gets the C API's protection (issue 26): a missing
    /// or repeated layer, last round's counts, another shard shape or other parameters and
    /// a forged state are refused with nothing changed; the honest run equals
    /// `select_model`.
    #[test]
    fn model_search_protects_a_rust_caller() {
        let (layers, hkv, n, w) = (4, 2, 40, 8);
        let p = n - w;
        let s = scores(layers * hkv * p, 11);
        let cfg = SelectConfig::new(AllocatorKind::Global, Granularity::Head, 6);
        let part = |l0: usize, ln: usize| ModelScores {
            scores: &s[l0 * hkv * p..(l0 + ln) * hkv * p],
            layers: ln,
            hkv,
            n,
            window: w,
        };
        let mut ws = vec![0u8; shard_workspace_size(&cfg, layers, hkv, n, w).unwrap()];
        let mut cws = ws.clone();
        let mut count = |ms: &ModelSearch, shards: &[(usize, usize)]| {
            let mut total = ShardHistogram::EMPTY;
            for &(l0, ln) in shards {
                let mut h = ShardHistogram::EMPTY;
                ms.count_shard(&cfg, &part(l0, ln), l0, None, &mut h, &mut cws)?;
                total.merge(&h)?;
            }
            Ok::<_, Error>(total)
        };
        let mut ms = ModelSearch::new(&cfg, layers, hkv, n, w).unwrap();
        let start = ms;
        for shards in [&[(0, 3)][..], &[(0, 2), (1, 3)], &[(0, 1), (0, 1), (2, 2)]] {
            let h = count(&ms, shards).unwrap();
            assert_eq!(ms.step(&h), Err(Error::ShapeMismatch), "{shards:?}");
            assert_eq!(ms, start);
        }
        let mut h = ShardHistogram::EMPTY;
        let mut other = cfg;
        other.budget = 7;
        let got = ms.count_shard(&other, &part(0, 2), 0, None, &mut h, &mut ws);
        assert_eq!(got, Err(Error::InvalidArgument));
        let got = ms.count_shard(&cfg, &part(2, 2), 3, None, &mut h, &mut ws);
        assert_eq!(got, Err(Error::ShapeMismatch));
        let narrow = ModelScores {
            hkv: 1,
            ..part(0, 1)
        };
        let got = ms.count_shard(&cfg, &narrow, 0, None, &mut h, &mut ws);
        assert_eq!(got, Err(Error::ShapeMismatch));
        let mut forged = ms;
        forged.search.need = u64::MAX;
        let got = forged.count_shard(&cfg, &part(0, 2), 0, None, &mut h, &mut ws);
        assert_eq!(got, Err(Error::InvalidArgument));
        assert_eq!(
            forged.step(&count(&ms, &[(0, 4)]).unwrap()),
            Err(Error::InvalidArgument)
        );
        assert_eq!(h, ShardHistogram::EMPTY);
        // an honest round, then its counts again: last round's, refused everywhere
        let h0 = count(&ms, &[(0, 2), (2, 2)]).unwrap();
        assert_eq!(ms.step(&h0), Ok(false));
        let after = ms;
        assert_eq!(ms.step(&h0), Err(Error::InvalidArgument));
        let mut again = h0;
        let got = ms.count_shard(&cfg, &part(0, 2), 0, None, &mut again, &mut ws);
        assert_eq!((got, again), (Err(Error::InvalidArgument), h0));
        let mut h1 = count(&ms, &[(0, 4)]).unwrap();
        assert_eq!(h1.merge(&h0), Err(Error::InvalidArgument));
        assert_eq!(ms, after);
        while !ms.step(&count(&ms, &[(0, 1), (1, 3)]).unwrap()).unwrap() {}
        assert!(ms.threshold_score().unwrap().is_finite());
        let m = part(0, layers);
        let (no, ni) = crate::select_output_len(&cfg, layers, hkv, n, w).unwrap();
        let (mut off, mut idx) = (vec![0u64; no], vec![0u32; ni]);
        crate::select_model(&cfg, &m, &mut off, &mut idx, &mut ws).unwrap();
        let (mut o2, mut i2) = (vec![0u64; no], vec![0u32; ni]);
        ms.select_shard(&cfg, &m, 0, None, &mut o2, &mut i2, &mut ws)
            .unwrap();
        assert_eq!((o2, i2), (off, idx));
    }

    #[test]
    fn rejects_other_allocators_and_bad_states() {
        let cfg = SelectConfig::new(AllocatorKind::Uniform, Granularity::Head, 3);
        assert_eq!(search_new(&cfg, 2, 2, 10, 2), Err(Error::InvalidArgument));
        let cfg = SelectConfig::new(AllocatorKind::Global, Granularity::Token, 3);
        assert_eq!(search_new(&cfg, 2, 2, 10, 2), Err(Error::InvalidArgument));
        let bad = ShardSearch {
            need: 1,
            prefix: 5,
            bits: 0,
            done: false,
            threshold: 0,
        };
        assert!(bad.validate().is_err());
        let bad = ShardSearch {
            need: 1,
            prefix: 0,
            bits: 104,
            done: false,
            threshold: 0,
        };
        assert!(bad.validate().is_err());
    }
}
