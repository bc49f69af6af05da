//! Scoring one layer (design §3): one score per (KV head, prefix token), `[Hkv][P]`, where
//! `P = N - min(w, N)`; window tokens are always kept and never scored.
//!
//! Data flow: validate everything → per group: the window attention (one pass when the
//! group's logits fit the workspace, else pass 1 for every group first; NaN/Inf in Q and K
//! rejected through the logits) → column statistics → the scorer's formula → the held
//! scores; `out` is written once every group has passed.
//!
//! Where a scorer lives: its formula in `score/<name>.rs`, what it reads in its row of
//! [`requirements()`] (inputs, window statistics; the host checks, the workspace sizes and
//! the device layout follow the row), its launch chain in `src/device/score.rs`, and its
//! `ScorerKind` / `Preset` in `config.rs`.

mod criticalkv;
mod knorm;
mod laprox;
mod lava;
pub mod power;
pub mod requirements;
mod snapkv;
mod streaming;
mod tova;
mod uniqueness;
pub use uniqueness::POWER as UNIQUENESS_POWER;

use crate::config::{ScoreConfig, ScorerKind};
use crate::error::{mul, Error, Result};
use crate::gram;
use crate::view::View;
use crate::window::{self, Needs, Stats};
use crate::workspace::{Workspace, WorkspaceSize};
use requirements::{requirements, ValueInput};

/// The tensors of one layer, where the engine keeps them.
#[derive(Clone, Copy, Debug, Default)]
pub struct LayerInputs<'a> {
    /// `[Hq, wq, dk]`: post-RoPE queries of the last `wq >= w` positions.
    pub queries: Option<View<'a>>,
    /// `[Hkv, N, dk]`: post-RoPE keys.
    pub keys: Option<View<'a>>,
    /// `[Hkv, N, dv]`: values (LAVa, LaProx without cached forms).
    pub values: Option<View<'a>>,
    /// LaProx: Gram blocks from [`gram::compute_gram`] (with `cross` for the exact and
    /// mean-attn GQA modes). `None` when `value_forms` is given (both: `InvalidArgument`).
    pub gram: Option<&'a [f32]>,
    /// LaProx: cached value forms `[Hkv][blocks][N]` from [`gram::compute_value_forms`].
    pub value_forms: Option<&'a [f32]>,
    /// CriticalKV: `[Hkv][N]` from [`gram::compute_value_l1`].
    pub value_l1: Option<&'a [f32]>,
    /// Optional, for the scorers that read queries: `[Hq][w]` (`w = min(window, N)`,
    /// exactly `Hq·w` floats), the natural-log log-sum-exp of each window row's scaled
    /// logits over every key it sees (causal inside the window), as flash attention's
    /// `softmax_lse` gives it, or [`window_row_lse`]: `lse[h][j] = ln Σ_{i <= N-w+j}
    /// exp(Qw[h, wq-w+j]·K[h/g, i] / sqrt(dk))`. When given, the window pass reads K once
    /// instead of twice (it uses `A = exp(z - lse)` and skips the row max / denominator
    /// pass). Not read by KNorm and StreamingLLM.
    pub row_lse: Option<&'a [f32]>,
}

/// Most query heads a layer may have.
pub const MAX_HEADS: usize = 65536;

/// Sizes of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerShape {
    pub hq: usize,
    pub hkv: usize,
    pub n: usize,
    pub dk: usize,
    pub dv: usize,
}

impl LayerShape {
    pub fn group(&self) -> usize {
        self.hq / self.hkv
    }
    /// Prefix tokens that get a score.
    pub fn prefix(&self, window: u32) -> usize {
        self.n - (window as usize).min(self.n)
    }
    /// A layer of these dimensions, checked as every scoring path checks it (host and
    /// device, size queries and calls): heads past [`MAX_HEADS`] are `InvalidArgument`, a
    /// value that does not fit `usize` is `Overflow`, then [`LayerShape::validate`].
    pub fn from_dims(hq: u64, hkv: u64, n: u64, dk: u64, dv: u64) -> Result<LayerShape> {
        let heads = |v: u64| {
            if v > MAX_HEADS as u64 {
                Err(Error::InvalidArgument)
            } else {
                Ok(v as usize)
            }
        };
        let size = |v: u64| usize::try_from(v).map_err(|_| Error::Overflow);
        let shape = LayerShape {
            hq: heads(hq)?,
            hkv: heads(hkv)?,
            n: size(n)?,
            dk: size(dk)?,
            dv: size(dv)?,
        };
        shape.validate()?;
        Ok(shape)
    }
    /// Every dimension at least 1, `hq` a multiple of `hkv`, `n <= MAX_TOKENS`, head dims
    /// `<= 1024`, `hq <= MAX_HEADS`.
    pub fn validate(&self) -> Result<()> {
        if self.hq == 0 || self.hkv == 0 || self.n == 0 || self.dk == 0 || self.dv == 0 {
            return Err(Error::InvalidArgument);
        }
        if self.hq % self.hkv != 0 {
            return Err(Error::ShapeMismatch);
        }
        // heads are bounded so that group arithmetic (g², pairs) cannot overflow
        if self.n > crate::error::MAX_TOKENS
            || self.dk > 1024
            || self.dv > 1024
            || self.hq > MAX_HEADS
        {
            return Err(Error::InvalidArgument);
        }
        Ok(())
    }
}

/// Elements of the score output: `Hkv · P`.
pub fn score_len(cfg: &ScoreConfig, shape: &LayerShape) -> Result<usize> {
    mul(shape.hkv, shape.prefix(cfg.window))
}

/// The window statistics the scorer reads (its row of [`requirements`]).
fn needs(cfg: &ScoreConfig) -> Needs {
    let r = requirements(cfg.scorer);
    Needs {
        sum: r.attn_sum,
        sq: r.attn_sq,
        cross: cfg.needs_cross(),
    }
}

/// Workspace bytes [`score_layer`] needs for this configuration and shape.
pub fn score_workspace_size(cfg: &ScoreConfig, shape: &LayerShape) -> Result<usize> {
    cfg.validate()?;
    shape.validate()?;
    let g = shape.group();
    let w = (cfg.window as usize).min(shape.n);
    let p = shape.prefix(cfg.window);
    let nd = needs(cfg);
    let mut ws = WorkspaceSize::new();
    let rows = mul(shape.hq, w)?;
    ws.add::<f32>(rows)?; // row max, every group
    ws.add::<f64>(rows)?; // row denominators
    ws.add::<f32>(if nd.sum { mul(g, p)? } else { 0 })?;
    ws.add::<f32>(if nd.sq { mul(g, p)? } else { 0 })?;
    ws.add::<f32>(if nd.cross {
        mul(window::pairs(g), p)?
    } else {
        0
    })?;
    ws.add::<f32>(p)?; // tmp a
    ws.add::<f32>(p)?; // tmp b
    ws.add::<f32>(p.max(shape.hkv))?; // accumulator / LAVa head factors
    ws.add::<f32>(shape.dv.max(shape.dk))?; // one row
    ws.add::<f32>(if holds_scores(cfg) {
        mul(shape.hkv, p)? // scores held back until every group has passed
    } else {
        0
    })?;
    let mut scratch = WorkspaceSize::new();
    if cfg.needs_queries() {
        window::scratch_size(&mut scratch, g, w, shape.dk)?;
        window::one_pass_size(&mut scratch, g, w, shape.n)?;
    }
    if requirements(cfg.scorer).unit_rows {
        scratch.add::<f32>(uniqueness::scratch_floats(shape.n, shape.dk, shape.dv)?)?;
    }
    ws.total()
        .checked_add(scratch.total())
        .ok_or(Error::Overflow)
}

/// Whether `score_layer` keeps the scores in its workspace until every head has passed:
/// the scorers whose input checks run on the way (the window pass checks keys through
/// their logits, KNorm through their norms).
fn holds_scores(cfg: &ScoreConfig) -> bool {
    cfg.needs_queries() || cfg.scorer == ScorerKind::KNorm
}

/// Buffers a scorer's formula works with, `[P]` each unless noted.
pub(crate) struct Bufs<'s> {
    pub tmp_a: &'s mut [f32],
    pub tmp_b: &'s mut [f32],
    pub acc: &'s mut [f32],
    pub row: &'s mut [f32],
}

/// Derive and check the layer shape from the inputs the scorer needs.
pub fn layer_shape(cfg: &ScoreConfig, inputs: &LayerInputs) -> Result<LayerShape> {
    LayerShape::from_extents(
        cfg,
        inputs.keys.as_ref().map(|v| v.extent()),
        inputs.queries.as_ref().map(|v| v.extent()),
        inputs.values.as_ref().map(|v| v.extent()),
    )
}

impl LayerShape {
    /// The layer's shape from the extents of the tensors given (`None`: absent), checked
    /// as every scoring path checks it (host and device): keys always needed, queries
    /// when the scorer reads them (at least `min(window, N)` rows, keys' dim), values
    /// when given (keys' heads and tokens), then [`LayerShape::validate`].
    pub fn from_extents(
        cfg: &ScoreConfig,
        keys: Option<[usize; 3]>,
        queries: Option<[usize; 3]>,
        values: Option<[usize; 3]>,
    ) -> Result<LayerShape> {
        let [hkv, n, dk] = keys.ok_or(Error::NullPointer)?;
        let mut shape = LayerShape {
            hq: hkv,
            hkv,
            n,
            dk,
            dv: dk,
        };
        if cfg.needs_queries() {
            let [hq, wq, dq] = queries.ok_or(Error::NullPointer)?;
            if dq != dk {
                return Err(Error::ShapeMismatch);
            }
            if wq < (cfg.window as usize).min(n) {
                return Err(Error::InvalidArgument);
            }
            shape.hq = hq;
        }
        if let Some([vh, vn, dv]) = values {
            if vh != hkv || vn != n {
                return Err(Error::ShapeMismatch);
            }
            shape.dv = dv;
        }
        shape.validate()?;
        Ok(shape)
    }
}

/// Score one layer into `out[Hkv][P]`. `workspace` must hold [`score_workspace_size`] bytes.
/// Nothing is written to `out` when validation fails; NaN/Inf in Q, K or V (or in the
/// cached value forms / L1 norms) is rejected before the first write, and so are window
/// logits that overflow f32. The one exception: for the scorers that read no queries
/// (StreamingLLM, uniqueness; not KNorm), finite inputs whose scores overflow f32 return
/// `NonFinite` after `out` was written; its contents are then unspecified. LaProx's `gram` / `value_forms`
/// must have exactly the length for `cross = (laprox_gqa != Sum)`.
pub fn score_layer(
    cfg: &ScoreConfig,
    inputs: &LayerInputs,
    out: &mut [f32],
    workspace: &mut [u8],
) -> Result<()> {
    score_layer_carried(cfg, inputs, out, workspace, None)
}

/// Twin lists a decode round carries from the last (`uniqueness`, `uniqueness/twins.rs`):
/// the layer's `[Hkv][cap][TWIN_WORDS]` words, valid for its first `held` cells.
pub(crate) struct CarriedTwins<'a> {
    pub lists: &'a mut [u32],
    pub cap: usize,
    pub held: usize,
}

/// Words of one cell's carried twin list.
pub(crate) const TWIN_WORDS: usize = uniqueness::TWIN_WORDS;
pub(crate) use uniqueness::remap_twins;

/// [`score_layer`], `uniqueness` taking `twins` where given (the caller's `n <= cap`): the
/// same scores.
pub(crate) fn score_layer_carried(
    cfg: &ScoreConfig,
    inputs: &LayerInputs,
    out: &mut [f32],
    workspace: &mut [u8],
    mut twins: Option<CarriedTwins>,
) -> Result<()> {
    cfg.validate()?;
    let shape = layer_shape(cfg, inputs)?;
    let keys = inputs.keys.as_ref().ok_or(Error::NullPointer)?;
    let (hq, hkv, n) = (shape.hq, shape.hkv, shape.n);
    let g = shape.group();
    let w = (cfg.window as usize).min(n);
    let p = n - w;
    if out.len() < mul(hkv, p)? {
        return Err(Error::OutputTooSmall);
    }
    if workspace.len() < score_workspace_size(cfg, &shape)? {
        return Err(Error::WorkspaceTooSmall);
    }
    // scorer-specific inputs
    let req = requirements(cfg.scorer);
    match req.values {
        ValueInput::Values => {
            inputs.values.as_ref().ok_or(Error::NullPointer)?;
        }
        ValueInput::ValuesOrForms => laprox::check_inputs(cfg, inputs, &shape)?,
        ValueInput::None => {}
    }
    if req.value_l1 {
        let l1 = inputs.value_l1.ok_or(Error::NullPointer)?;
        if l1.len() < mul(hkv, n)? {
            return Err(Error::ShapeMismatch);
        }
        if l1[..hkv * n].iter().any(|v| !v.is_finite()) {
            return Err(Error::NonFinite);
        }
    }
    // checked even with no prefix to score: a wrong length is a caller error all the same
    let row_lse = if cfg.needs_queries() {
        inputs.row_lse
    } else {
        None
    };
    if let Some(lse) = row_lse {
        if lse.len() != mul(hq, w)? {
            return Err(Error::ShapeMismatch);
        }
        if lse.iter().any(|v| !v.is_finite()) {
            return Err(Error::NonFinite);
        }
    }
    if p == 0 {
        return Ok(());
    }
    let queries = inputs.queries.as_ref();
    let nd = needs(cfg);

    let mut ws = Workspace::new(workspace);
    let rows = hq * w;
    let rmax = ws.take::<f32>(rows)?;
    let rsum = ws.take::<f64>(rows)?;
    // the column statistics: zeroed group by group before the window pass adds into them
    // (below), so not here
    let lens = [
        if nd.sum { g * p } else { 0 },
        if nd.sq { g * p } else { 0 },
        if nd.cross { window::pairs(g) * p } else { 0 },
    ];
    let [sum, sq, cross] = lens.map(|n| {
        if cfg.needs_queries() {
            ws.take_dirty::<f32>(n)
        } else {
            ws.take::<f32>(n)
        }
    });
    let (sum, sq, cross) = (sum?, sq?, cross?);
    let mut bufs = Bufs {
        tmp_a: ws.take::<f32>(p)?,
        tmp_b: ws.take::<f32>(p)?,
        acc: ws.take::<f32>(p.max(hkv))?,
        row: ws.take::<f32>(shape.dv.max(shape.dk))?,
    };
    // the window pass finds NaN/Inf keys through their logits, group by group: the scores
    // wait here until the last group has passed, so nothing is written on error
    let held = ws.take::<f32>(if holds_scores(cfg) { hkv * p } else { 0 })?;
    let scratch = ws.into_rest();

    // Everything that can reject the input runs before the first write to `out` (the window
    // pass's key checks through `held`).
    let mut one_pass = false;
    if let (Some(_), Some(lse)) = (queries, row_lse) {
        // the caller's row statistics: A = exp(z - lse), denominators 1
        rmax.copy_from_slice(lse);
        rsum.fill(1.0);
    } else if let Some(q) = queries {
        if cfg.needs_queries() {
            // one Q·Kᵀ per group when its logits fit the workspace (window.rs), else two
            one_pass = true;
            for kh in 0..hkv {
                one_pass &= window::one_pass_ready(q, keys, kh, g, w, scratch)?;
            }
            for kh in (0..hkv).filter(|_| !one_pass) {
                let r = kh * g * w;
                window::row_stats(q, keys, kh, g, w, scratch, &mut rmax[r..], &mut rsum[r..])?;
            }
        }
    }
    // KNorm checks its prefix keys through their norms (NaN/Inf in, NaN/Inf out), the
    // window keys here
    if cfg.scorer == ScorerKind::KNorm && !crate::gram::values_finite(keys, p, n) {
        return Err(Error::NonFinite);
    }
    if req.unit_rows {
        let values = inputs.values.as_ref().ok_or(Error::NullPointer)?;
        if !uniqueness::inputs_finite(keys, values, &mut bufs) {
            return Err(Error::NonFinite);
        }
    }
    if req.head_factors {
        lava::head_factors(
            inputs.values.as_ref().ok_or(Error::NullPointer)?,
            p,
            bufs.row,
            bufs.acc,
        )?;
    }
    if req.values == ValueInput::ValuesOrForms {
        laprox::check_values_finite(cfg, inputs, &shape, p, bufs.row)?;
    }

    // where the scores go first, and where they are copied once all passed
    let (dest, late): (&mut [f32], Option<&mut [f32]>) = if holds_scores(cfg) {
        (held, Some(&mut out[..hkv * p]))
    } else {
        (&mut out[..hkv * p], None)
    };
    // TOVA's one window row per head: its own pass, sums in the lane order (tova.rs), when
    // the one pass fits (the window pass below agrees to rounding)
    let tova_done = cfg.scorer == ScorerKind::Tova
        && w == 1
        && one_pass
        && tova::layer(
            queries.ok_or(Error::NullPointer)?,
            keys,
            g,
            scratch,
            rmax,
            rsum,
            bufs.tmp_b,
        )?;
    for kh in (0..hkv).filter(|_| !tova_done) {
        let dst = &mut dest[kh * p..(kh + 1) * p];
        if cfg.needs_queries() {
            sum.fill(0.0);
            sq.fill(0.0);
            cross.fill(0.0);
            let mut st = Stats {
                sum: &mut *sum,
                sq: &mut *sq,
                cross: &mut *cross,
            };
            let q = queries.ok_or(Error::NullPointer)?;
            let (rm, rs) = (&mut rmax[kh * g * w..], &mut rsum[kh * g * w..]);
            if one_pass {
                window::one_pass(q, keys, kh, g, w, rm, rs, nd, scratch, &mut st)?;
            } else {
                // the row statistics are pass 1's own unless the caller gave `row_lse`
                let own = row_lse.is_none();
                window::column_stats(q, keys, kh, g, w, rm, rs, own, nd, scratch, &mut st)?;
            }
        }
        let sums = Sums {
            sum: &mut *sum,
            g,
            w,
            p,
        };
        match cfg.scorer {
            ScorerKind::SnapKv => snapkv::score(cfg, sums, &mut bufs, dst),
            ScorerKind::Lava => lava::score(cfg, sums, kh, &mut bufs, dst),
            ScorerKind::LaProx => {
                laprox::score(cfg, inputs, &shape, sq, cross, kh, p, &mut bufs, dst)
            }
            ScorerKind::CriticalKv => {
                let l1 = &inputs.value_l1.unwrap_or(&[])[kh * n..kh * n + p];
                criticalkv::score(cfg, sums, l1, &mut bufs, dst)
            }
            ScorerKind::StreamingLlm => streaming::score(cfg, dst),
            ScorerKind::KNorm => knorm::score(keys, kh, &mut bufs, dst),
            ScorerKind::Tova => tova::accumulate(sum, g, hq, p, &mut bufs),
            ScorerKind::Uniqueness => {
                let values = inputs.values.as_ref().ok_or(Error::NullPointer)?;
                // every part is written before it is read (uniqueness.rs)
                let sf = uniqueness::scratch_floats(n, shape.dk, shape.dv)?;
                let scratch = Workspace::new(&mut *scratch).take_dirty::<f32>(sf)?;
                match twins.as_mut() {
                    Some(t) => {
                        let words = t.cap * TWIN_WORDS;
                        let lists = &mut t.lists[kh * words..(kh + 1) * words];
                        let held = t.held.min(n);
                        uniqueness::score_carried(keys, values, kh, scratch, dst, lists, held)
                    }
                    None => uniqueness::score(keys, values, kh, scratch, dst),
                }
            }
        }
    }
    if cfg.scorer == ScorerKind::Tova {
        tova::finish(&bufs, hkv, p, dest);
    }
    if !crate::numerics::finite(dest) {
        return Err(Error::NonFinite);
    }
    power::raise(cfg.power, dest);
    if let Some(out) = late {
        out.copy_from_slice(dest);
    }
    Ok(())
}

/// Workspace bytes [`window_row_lse`] needs (`shape.dv` is not read).
pub fn window_row_lse_workspace_size(shape: &LayerShape, window: u32) -> Result<usize> {
    let shape = LayerShape {
        dv: shape.dk,
        ..*shape
    };
    shape.validate()?;
    if window == 0 {
        return Err(Error::InvalidArgument);
    }
    let w = (window as usize).min(shape.n);
    let rows = mul(shape.hq, w)?;
    let mut ws = WorkspaceSize::new();
    ws.add::<f32>(rows)?;
    ws.add::<f64>(rows)?;
    let mut scratch = WorkspaceSize::new();
    window::scratch_size(&mut scratch, shape.group(), w, shape.dk)?;
    ws.total()
        .checked_add(scratch.total())
        .ok_or(Error::Overflow)
}

/// The per-row log-sum-exp of the window attention (design §2), the `row_lse` input of
/// [`LayerInputs`]: `out[h*w + j] = ln Σ_{i visible} exp(Qw[h,j]·K[h/g,i] / sqrt(dk))` for
/// query heads `h < Hq` and the last `w = min(window, N)` rows `j` of `queries`
/// (`[Hq, wq, dk]`, `wq >= w`); `keys` `[Hkv, N, dk]`. It is the first of the two passes
/// over K that [`score_layer`] makes without it (max and denominator per row, f64 sums);
/// engines running flash attention over the window get it from the kernel instead.
/// `out` needs `Hq·w` floats (only those are written), `workspace`
/// [`window_row_lse_workspace_size`] bytes. NaN/Inf in the queries or any key is
/// rejected before `out` is written.
pub fn window_row_lse(
    queries: &View,
    keys: &View,
    window: u32,
    out: &mut [f32],
    workspace: &mut [u8],
) -> Result<()> {
    let [hkv, n, dk] = keys.extent();
    let [hq, wq, dq] = queries.extent();
    if dq != dk {
        return Err(Error::ShapeMismatch);
    }
    let shape = LayerShape {
        hq,
        hkv,
        n,
        dk,
        dv: dk,
    };
    let need = window_row_lse_workspace_size(&shape, window)?;
    let w = (window as usize).min(n);
    if wq < w {
        return Err(Error::InvalidArgument);
    }
    let rows = hq * w;
    if out.len() < rows {
        return Err(Error::OutputTooSmall);
    }
    if workspace.len() < need {
        return Err(Error::WorkspaceTooSmall);
    }
    let g = shape.group();
    let mut ws = Workspace::new(workspace);
    let rmax = ws.take::<f32>(rows)?;
    let rsum = ws.take::<f64>(rows)?;
    let scratch = ws.into_rest();
    for kh in 0..hkv {
        let r = kh * g * w;
        window::row_stats(
            queries,
            keys,
            kh,
            g,
            w,
            scratch,
            &mut rmax[r..],
            &mut rsum[r..],
        )?;
    }
    for ((o, &m), &s) in out[..rows].iter_mut().zip(rmax.iter()).zip(rsum.iter()) {
        *o = (m as f64 + libm::log(s)) as f32;
    }
    Ok(())
}

/// Reduce the `g` rows of `src` (`[g][p]`) into `dst[p]` (used by SnapKV-style scorers).
pub(crate) fn reduce_rows(
    kind: crate::config::GqaReduce,
    src: &[f32],
    g: usize,
    p: usize,
    dst: &mut [f32],
) {
    use crate::config::GqaReduce;
    dst[..p].copy_from_slice(&src[..p]);
    for a in 1..g {
        let row = &src[a * p..(a + 1) * p];
        for (d, &v) in dst[..p].iter_mut().zip(row) {
            *d = match kind {
                GqaReduce::Max => d.max(v),
                _ => *d + v,
            };
        }
    }
    if kind == GqaReduce::Mean {
        let inv = 1.0 / g as f32;
        for d in dst[..p].iter_mut() {
            *d *= inv;
        }
    }
}

/// A KV group's window attention column sums: `sum[a*p + i] = Σ_j A[a, j, i]` for its `g`
/// query heads over the `w` window rows, `[g][p]` (the scorers overwrite it).
pub(crate) struct Sums<'a> {
    pub sum: &'a mut [f32],
    pub g: usize,
    pub w: usize,
    pub p: usize,
}

/// `mean_j A` per query head, pooled, then reduced over the group (or reduced, then pooled),
/// written to `dst[p]`; `s.sum` is overwritten.
pub(crate) fn pooled_mean_attention(
    pool: &crate::config::Pool,
    gqa: crate::config::GqaReduce,
    reduce_before_pool: bool,
    s: Sums,
    bufs: &mut Bufs,
    dst: &mut [f32],
) {
    let Sums { sum, g, w, p } = s;
    let inv = 1.0 / w as f32;
    for v in sum[..g * p].iter_mut() {
        *v *= inv;
    }
    if reduce_before_pool {
        reduce_rows(gqa, sum, g, p, bufs.tmp_a);
        crate::pool::pool(pool, &bufs.tmp_a[..p], &mut dst[..p]);
    } else {
        for a in 0..g {
            let row = &mut sum[a * p..(a + 1) * p];
            crate::pool::pool_in_place(pool, row, bufs.tmp_a);
        }
        reduce_rows(gqa, sum, g, p, dst);
    }
}

pub use gram::{compute_gram, compute_value_forms, compute_value_l1};
