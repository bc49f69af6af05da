//! The evictor's configuration: what the caller gives ([`EvictorConfig`]) and what the
//! context keeps once every default is applied and checked ([`Resolved`]), with the
//! workspace the largest stage call needs.

use super::policy::Budget;
use super::presets::{capture, decode_decay, default_select, Capture, WoUse};
use super::Needs;
use crate::config::{Granularity, Preset, ScoreConfig, ScorerKind, SelectConfig};
use crate::error::{mul, Error, Result, MAX_LAYERS};
use crate::score::LayerShape;
use crate::shape::ModelShape;
use crate::view::DType;
use crate::workspace::WorkspaceSize;
use crate::ValueLinks;
use core::ffi::CStr;

/// The model an evictor serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelDims {
    pub layers: usize,
    pub hq: usize,
    pub hkv: usize,
    pub dk: usize,
    pub dv: usize,
    /// Columns of `Wo`; read only by methods that use it ([`Capture::wo`]).
    pub d_model: usize,
}

/// What an evictor runs and for how much memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EvictorConfig {
    pub preset: Preset,
    /// Overrides the preset's scoring (then `window` overrides its window).
    pub score: Option<ScoreConfig>,
    /// Overrides the preset's selection ([`default_select`]); its budget is the policy's.
    pub select: Option<SelectConfig>,
    /// The observation window; 0: the scoring's.
    pub window: u32,
    /// Overrides the selection's granularity (engines of shared cells want `Token`).
    pub granularity: Option<Granularity>,
    /// Value links at this threshold ([`crate::LINK_THRESHOLD`]); needs a flat forward
    /// post-pool. Off by default for every preset.
    pub link_threshold: Option<f32>,
    pub model: ModelDims,
    /// Most cells a sequence holds when it is scored.
    pub max_cells: usize,
    /// Sequence slots, each with its own state.
    pub max_seqs: usize,
    pub budget: Budget,
    /// K/V given through paged views ([`super::Evictor::score_layer_paged`]) of this
    /// element type at most (its size bounds the gathered layer's): the workspace then
    /// also holds one layer's K (and V) gathered from the pool. `None`: strided views only.
    pub paged: Option<DType>,
}

impl EvictorConfig {
    /// A preset with its defaults, one sequence.
    pub fn new(preset: Preset, model: ModelDims, max_cells: usize, budget: Budget) -> Self {
        EvictorConfig {
            preset,
            score: None,
            select: None,
            window: 0,
            granularity: None,
            link_threshold: None,
            model,
            max_cells,
            max_seqs: 1,
            budget,
            paged: None,
        }
    }
}

/// The configuration with every default applied and checked (kept in the context).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Resolved {
    pub score: ScoreConfig,
    pub select: SelectConfig,
    pub critical_default: bool,
    pub links: Option<f32>,
    pub budget: Budget,
    pub capture: Capture,
    pub m: ModelDims,
    pub max_cells: usize,
    pub max_seqs: usize,
    /// Floats of one layer's Gram blocks (0 unless LaProx).
    pub gram_len: usize,
    /// Decode-time score memory (`carry.rs`): 0 = off.
    pub decay: f32,
    /// Cells whose `uniqueness` twin lists a sequence carries from round to round (the
    /// cell budget's `high`, at most `max_cells`; 0 = off: other scorers, other budgets).
    pub twins: usize,
    /// The largest element type of paged K/V (`None`: no paged views).
    pub paged: Option<DType>,
}

impl Resolved {
    /// Whether a round over `n` cells, the first `start` protected, carries `uniqueness`'s
    /// twin lists (`score/uniqueness/twins.rs`): scored with them, renumbered by `select`,
    /// kept by `commit`.
    pub fn carries_twins(&self, start: u64, n: u64) -> bool {
        self.twins > 0 && start == 0 && n <= self.twins as u64
    }

    /// What the engine captures, the window and the granularity.
    pub fn needs(&self) -> Needs {
        Needs {
            capture: self.capture,
            window: self.score.window,
            granularity: self.select.granularity,
        }
    }

    /// `layer` names a layer of the model (`InvalidArgument` otherwise).
    pub fn check_layer(&self, layer: usize) -> Result<()> {
        if layer >= self.m.layers {
            return Err(Error::InvalidArgument);
        }
        Ok(())
    }

    /// The checks of `observe_queries` (host and device): a layer, a method that keeps
    /// a query ring (`InvalidArgument`), queries of `hq` heads of `dk` (`ShapeMismatch`).
    pub fn check_observe(&self, layer: usize, hq: usize, dk: usize) -> Result<()> {
        self.check_layer(layer)?;
        if !self.capture.queries {
            return Err(Error::InvalidArgument);
        }
        if hq != self.m.hq || dk != self.m.dk {
            return Err(Error::ShapeMismatch);
        }
        Ok(())
    }
}

/// Why a configuration is refused: the status the evictor's calls return and a sentence
/// naming what to change (for an engine's startup message).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub error: Error,
    /// NUL-terminated, for C callers (`kve_evictor_config_check`).
    pub why: &'static CStr,
}

/// A `&'static CStr` of a string literal.
macro_rules! cstr {
    ($s:expr) => {{
        const S: &str = concat!($s, "\0");
        // SAFETY: a literal with no NUL inside, one appended.
        unsafe { core::ffi::CStr::from_bytes_with_nul_unchecked(S.as_bytes()) }
    }};
}
pub(crate) use cstr;

/// `r`, its error refused for `why`.
pub(crate) fn because<T>(r: Result<T>, why: &'static CStr) -> core::result::Result<T, Refusal> {
    r.map_err(|error| Refusal { error, why })
}

pub(crate) fn resolve(c: &EvictorConfig) -> Result<Resolved> {
    resolve_why(c).map_err(|r| r.error)
}

/// [`resolve`], saying which check refused the configuration.
pub(crate) fn resolve_why(c: &EvictorConfig) -> core::result::Result<Resolved, Refusal> {
    let mut score = c.score.unwrap_or(ScoreConfig::preset(c.preset));
    if c.window != 0 {
        score.window = c.window;
    }
    because(
        score.validate(),
        cstr!("the scoring parameters or window are not accepted (tova reads the last query only: window 1)"),
    )?;
    let mut select = c.select.unwrap_or(default_select(c.preset, 0));
    if let Some(g) = c.granularity {
        select.granularity = g;
    }
    because(
        select.validate(),
        cstr!("the selection parameters are not accepted"),
    )?;
    if let Some(t) = c.link_threshold {
        let links = ValueLinks {
            sums: &[],
            threshold: t,
        };
        because(
            links.check(&select, 0),
            cstr!("value links need a finite threshold and a selection with a flat forward post-pool (laprox-span, uniqueness)"),
        )?;
    }
    because(
        c.budget.validate(),
        cstr!("the budget is not accepted: a keep ratio in [0, 1], or a cell budget with 1 <= low <= high"),
    )?;
    let m = &c.model;
    let shape = cstr!("the model shape is not accepted (layers, heads, head dims and max_cells >= 1, hq a multiple of hkv, within the crate's limits)");
    because(
        LayerShape::from_dims(
            m.hq as u64,
            m.hkv as u64,
            c.max_cells as u64,
            m.dk as u64,
            m.dv as u64,
        ),
        shape,
    )?;
    because(
        ModelShape::new(
            m.layers as u64,
            m.hkv as u64,
            c.max_cells as u64,
            score.window as u64,
        ),
        shape,
    )?;
    let mut capture = capture(&score);
    capture.values |= c.link_threshold.is_some();
    if c.max_seqs == 0 || m.layers > MAX_LAYERS {
        return because(
            Err(Error::InvalidArgument),
            cstr!("max_seqs must be >= 1 and layers within the crate's limit"),
        );
    }
    if c.paged.is_some_and(|d| d.is_quantized()) {
        return because(
            Err(Error::UnsupportedDtype),
            cstr!(
                "paged pools of Q8_0/Q4_0 are not supported: give quantized K/V as strided views"
            ),
        );
    }
    if capture.wo != WoUse::None && m.d_model == 0 {
        return because(
            Err(Error::InvalidArgument),
            cstr!("the method reads Wo: d_model must be >= 1"),
        );
    }
    let gram_len = match capture.wo {
        WoUse::Once => because(
            crate::gram_len(m.hq, m.hkv, m.dv, score.needs_cross()),
            cstr!("the Gram blocks of this shape overflow"),
        )?,
        _ => 0,
    };
    Ok(Resolved {
        score,
        select,
        critical_default: c.score.is_none() && score.scorer == ScorerKind::CriticalKv,
        links: c.link_threshold,
        budget: c.budget,
        capture,
        m: *m,
        max_cells: c.max_cells,
        max_seqs: c.max_seqs,
        gram_len,
        // a keep ratio or the engine's own rounds are one-shot: nothing to carry
        decay: match c.budget {
            Budget::Cells { .. } => decode_decay(c.preset),
            _ => 0.0,
        },
        twins: match c.budget {
            Budget::Cells { high, .. } if score.scorer == ScorerKind::Uniqueness => {
                c.max_cells.min(usize::try_from(high).unwrap_or(usize::MAX))
            }
            _ => 0,
        },
        paged: c.paged,
    })
}

/// Bytes of the workspace's front part that a paged layer is gathered into: K `[Hkv,
/// max_cells, dk]` and, when the method reads values, V, at the paged element size.
pub(crate) fn gather_bytes(r: &Resolved) -> Result<usize> {
    let v = if r.capture.values {
        gather_part(r, r.m.dv)?
    } else {
        0
    };
    gather_part(r, r.m.dk)?
        .checked_add(v)
        .ok_or(Error::Overflow)
}

/// Bytes [`crate::paged::gather`] needs for one `[Hkv, max_cells, d]` tensor at the paged
/// element size (0 without paged views).
pub(crate) fn gather_part(r: &Resolved, d: usize) -> Result<usize> {
    let Some(dt) = r.paged else { return Ok(0) };
    let mut g = WorkspaceSize::new();
    g.add::<u8>(mul(mul(r.m.hkv, r.max_cells)?, mul(d, dt.size())?)?)?;
    Ok(g.total())
}

/// Bytes of the shared workspace: the largest stage call at `max_cells`.
pub(crate) fn workspace_bytes(r: &Resolved) -> Result<usize> {
    let n = r.max_cells;
    let w = (r.score.window as usize).min(n);
    let p = n - w;
    let units = mul(r.m.layers, r.m.hkv)?;
    let shape = LayerShape {
        hq: r.m.hq,
        hkv: r.m.hkv,
        n,
        dk: r.m.dk,
        dv: r.m.dv,
    };
    let mut score = WorkspaceSize::new();
    score.add::<f32>(mul(r.m.hkv, p)?)?; // staged scores
    score.add::<f32>(if r.capture.queries {
        mul(r.m.hq, mul(w, r.m.dk)?)?
    } else {
        0
    })?;
    score.add::<f32>(if r.capture.wo == WoUse::EveryRound {
        mul(r.m.hkv, n)?
    } else {
        0
    })?;
    let mut rest = crate::score_workspace_size(&r.score, &shape)?;
    if r.capture.wo == WoUse::EveryRound {
        rest = rest.max(crate::gram::value_l1_workspace_size(r.m.dv, r.m.d_model)?);
    }
    if r.links.is_some() {
        rest = rest.max(crate::value_links_workspace_size(n, r.m.dv)?);
    }
    let mut select = WorkspaceSize::new();
    select.add::<f32>(mul(units, p)?)?; // the span's scores
    select.add::<u64>(units + 1)?;
    select.add::<u32>(mul(units, n)?)?;
    let sel = crate::select_workspace_size(&r.select, r.m.layers, r.m.hkv, n, w)?;
    // a round with marks: the two parts' selections (`marks.rs`)
    let marked = super::marks::marked_workspace_size(&r.select, r.m.layers, r.m.hkv, n, w)?;
    let sel = sel.max(marked);
    let mut gram = 0;
    if r.capture.wo == WoUse::Once {
        gram = crate::gram_workspace_size(r.m.dv, r.m.d_model)?;
    }
    let mut cells = WorkspaceSize::new();
    cells.add::<u8>(n)?;
    let a = score.total().checked_add(rest).ok_or(Error::Overflow)?;
    let a = a.checked_add(gather_bytes(r)?).ok_or(Error::Overflow)?;
    let b = select.total().checked_add(sel).ok_or(Error::Overflow)?;
    // a paged table's check: a sorted copy of up to `max_cells` (block id, index) pairs
    let mut table = WorkspaceSize::new();
    table.add::<u64>(n)?;
    Ok(a.max(b).max(gram).max(cells.total()).max(table.total()))
}
