//! An engine's eviction options (its command-line flags: a method name, a window, a keep
//! ratio, a cell budget and the fraction a budget eviction keeps, a value-link threshold)
//! read into an [`EvictorConfig`], checked, with a sentence naming what to change when
//! they are refused. Every engine asks here instead of keeping its own copy of which
//! methods exist, the default method and what a combination means (issue 27: the llama.cpp
//! fork's adapter carried one).
//!
//! The method lists ([`method_list`]) and the unknown-method messages are built at compile
//! time from the one preset table (`presets.rs`).

use super::config::{cstr, EvictorConfig, ModelDims, Refusal};
use super::policy::Budget;
use super::presets::{capture, preset_from_name, WoUse, PRESETS};
use super::{Evictor, Needs};
use crate::config::{Granularity, Preset, ScoreConfig};
use crate::error::Error;
use core::ffi::CStr;

/// The method an engine's options name when they name none but ask for eviction (a keep
/// ratio or a cell budget).
pub const DEFAULT_METHOD: Preset = Preset::LaProxSpan;

/// The largest observation window the options accept (an engine keeps `window` query rows
/// per layer and sequence).
pub const MAX_WINDOW: u32 = 4096;

/// An engine's eviction options.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Options<'a> {
    /// The method's name ([`PRESETS`]' spelling); empty: [`DEFAULT_METHOD`].
    pub method: &'a [u8],
    /// The observation window; 0: the method's. At most [`MAX_WINDOW`].
    pub window: u32,
    /// The keep ratio of what is new since the last compression, in (0, 1]; 0: off.
    pub keep_ratio: f64,
    /// The cell budget per sequence; 0: off. Past it a sequence is evicted down to
    /// `floor(max_cells * evict_to)` cells, which must exceed the window.
    pub max_cells: u64,
    /// With `max_cells`: in (0, 1).
    pub evict_to: f64,
    /// Value links at this threshold, at most 1; 0 or negative: off.
    pub link_threshold: f32,
    /// The engine cannot give `Wo` with every round: methods that read it so
    /// ([`WoUse::EveryRound`]) are refused.
    pub no_wo_every_round: bool,
    /// The engine's cells are shared by every head (llama.cpp, paged caches): token
    /// granularity.
    pub token_cells: bool,
}

/// Whether an engine that cannot give `Wo` with every round may run `p`.
const fn offered(p: Preset, no_wo_every_round: bool) -> bool {
    !no_wo_every_round || !matches!(capture(&ScoreConfig::preset(p)).wo, WoUse::EveryRound)
}

/// Bytes of `prefix`, the ", "-separated names of the offered presets, `suffix` and a NUL.
const fn list_len(prefix: &str, skip: bool, suffix: &str) -> usize {
    let mut n = prefix.len() + suffix.len() + 1;
    let mut i = 0;
    let mut first = true;
    while i < PRESETS.len() {
        if offered(PRESETS[i].1, skip) {
            n += PRESETS[i].0.len() + if first { 0 } else { 2 };
            first = false;
        }
        i += 1;
    }
    n
}

/// The bytes [`list_len`] counts.
const fn list<const N: usize>(prefix: &str, skip: bool, suffix: &str) -> [u8; N] {
    const fn put<const N: usize>(out: &mut [u8; N], at: usize, s: &[u8]) -> usize {
        let mut j = 0;
        while j < s.len() {
            out[at + j] = s[j];
            j += 1;
        }
        at + s.len()
    }
    let mut out = [0u8; N];
    let mut at = put(&mut out, 0, prefix.as_bytes());
    let mut i = 0;
    let mut first = true;
    while i < PRESETS.len() {
        if offered(PRESETS[i].1, skip) {
            if !first {
                at = put(&mut out, at, b", ");
            }
            at = put(&mut out, at, PRESETS[i].0.as_bytes());
            first = false;
        }
        i += 1;
    }
    at = put(&mut out, at, suffix.as_bytes());
    assert!(at + 1 == N, "list_len counts list's bytes");
    out
}

/// A NUL-terminated list (and message) per value of `no_wo_every_round`.
macro_rules! lists {
    ($($name:ident = $prefix:literal, $skip:literal, $suffix:literal;)+) => {$(
        static $name: [u8; list_len($prefix, $skip, $suffix)] =
            list::<{ list_len($prefix, $skip, $suffix) }>($prefix, $skip, $suffix);
    )+};
}

lists! {
    ALL = "", false, "";
    OFFERED = "", true, "";
    UNKNOWN_ALL = "unknown eviction method (known: ", false, ")";
    UNKNOWN_OFFERED = "unknown eviction method (known: ", true, ")";
    NOT_OFFERED = "the method reads Wo at every round, which this engine does not give (offered: ", true, ")";
}

/// `bytes` (one of the lists above) as a C string.
fn c_str(bytes: &'static [u8]) -> &'static CStr {
    // the lists are built with one NUL, at the end, and preset names hold none
    CStr::from_bytes_with_nul(bytes).unwrap_or(cstr!(""))
}

/// The ", "-separated names of every preset, or (`no_wo_every_round`) of those an engine
/// that cannot give `Wo` with every round may run: NUL-terminated, static.
pub fn method_list(no_wo_every_round: bool) -> &'static CStr {
    c_str(if no_wo_every_round { &OFFERED } else { &ALL })
}

/// A refusal of the options.
fn refuse<T>(error: Error, why: &'static CStr) -> core::result::Result<T, Refusal> {
    Err(Refusal { error, why })
}

/// What [`from_options`] reads from accepted options.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Chosen {
    /// The evictor's configuration, for a one-cell model of one sequence: the engine sets
    /// the shape, `max_cells` and `max_seqs`.
    pub config: EvictorConfig,
    /// What the method reads (`window`: the options' or the method's).
    pub needs: Needs,
    /// The cell budget: `(high, low)`, `low = floor(max_cells * evict_to)`.
    pub cells: Option<(u64, u64)>,
}

/// The options as an evictor configuration (model shape, `max_cells` and `max_seqs` still
/// to be set: a one-cell model of one sequence here) and the method's requirements, or why
/// they are refused. The policy: a keep ratio when `keep_ratio` is set (a budget then
/// only sets `high`/`low`, for the engine's decode-time budget), else a cell budget
/// (`high = max_cells`, `low = floor(max_cells * evict_to)`), else explicit.
pub fn from_options(o: &Options) -> core::result::Result<Chosen, Refusal> {
    // written so that NaN fails too
    if !(o.link_threshold <= 1.0) {
        return refuse(
            Error::InvalidArgument,
            cstr!("value-link threshold must be a number <= 1 (0 or negative: off)"),
        );
    }
    let preset = match o.method {
        [] => DEFAULT_METHOD,
        name => match preset_from_name(name) {
            Ok(p) if offered(p, o.no_wo_every_round) => p,
            Ok(_) => return refuse(Error::InvalidArgument, c_str(&NOT_OFFERED)),
            Err(e) if o.no_wo_every_round => return refuse(e, c_str(&UNKNOWN_OFFERED)),
            Err(e) => return refuse(e, c_str(&UNKNOWN_ALL)),
        },
    };
    if o.window > MAX_WINDOW {
        return refuse(
            Error::InvalidArgument,
            cstr!("the observation window must be at most 4096 tokens"),
        );
    }
    if o.keep_ratio != 0.0 && !(o.keep_ratio > 0.0 && o.keep_ratio <= 1.0) {
        return refuse(
            Error::InvalidArgument,
            cstr!("the keep ratio must be in (0, 1] (0: off)"),
        );
    }
    let cells = if o.max_cells > 0 {
        if !(o.evict_to > 0.0 && o.evict_to < 1.0) {
            return refuse(
                Error::InvalidArgument,
                cstr!("evict-to fraction must be in (0, 1)"),
            );
        }
        // the product is >= 0: its floor is the cast's truncation (core has no floor)
        Some((o.max_cells, (o.max_cells as f64 * o.evict_to) as u64))
    } else {
        None
    };
    let budget = match (o.keep_ratio > 0.0, cells) {
        (true, _) => Budget::KeepRatio {
            ratio: o.keep_ratio,
            min_keep: MIN_KEEP,
        },
        (false, Some((high, low))) => Budget::Cells {
            high,
            low: low.max(1),
        },
        (false, None) => Budget::Explicit,
    };
    let one = ModelDims {
        layers: 1,
        hq: 1,
        hkv: 1,
        dk: 1,
        dv: 1,
        d_model: 1,
    };
    let mut cfg = EvictorConfig::new(preset, one, 1, budget);
    cfg.window = o.window;
    cfg.granularity = o.token_cells.then_some(Granularity::Token);
    cfg.link_threshold = (o.link_threshold > 0.0).then_some(o.link_threshold);
    let needs = Evictor::check(&cfg)?;
    if let Some((high, low)) = cells {
        if high <= needs.window as u64 {
            return refuse(
                Error::InvalidArgument,
                cstr!("cell budget must be larger than the observation window"),
            );
        }
        if low <= needs.window as u64 {
            return refuse(
                Error::InvalidArgument,
                cstr!("cell budget times the evict-to fraction must exceed the observation window"),
            );
        }
    }
    Ok(Chosen {
        config: cfg,
        needs,
        cells,
    })
}

/// `KVE_POLICY_KEEP_RATIO`'s default fewest new cells a compression keeps.
pub const MIN_KEEP: u64 = 64;
