//! Configuration structs that can grow without breaking compiled callers.
//!
//! Each starts with `uint32_t struct_size`, which must be exactly the size of one released
//! version of the struct (`KVE_*_V<k>_SIZE`), else `KVE_ERR_INVALID_ARGUMENT`: a size
//! between two versions would split a field, and a size the library does not know would
//! make it read bytes the caller may not own. The caller fills a struct with its `*_init`
//! function, passing `sizeof` of the struct as the caller's header declares it; the
//! library writes exactly that many bytes. When reading, it reads the fields of that
//! version and uses defaults for fields an older version lacks. A caller built against a
//! newer header talks to an older library by passing an older version's size.
//! Fields are only ever appended.

use super::{arg, out_param, to_status, tri};
use crate::config::*;
use crate::error::{Error, Result};

/// An upper bound of every released `struct_size` (no extensible struct is larger).
pub const MAX_STRUCT_SIZE: u32 = 4096;
/// Budgets above this are clamped to it (a budget of at least the prefix length keeps
/// every prefix token; `2^31` is the most tokens a cache may hold).
pub const MAX_BUDGET: u64 = crate::error::MAX_TOKENS as u64;

/// How to score one layer (design §3). Fill with `kve_score_params_init`, then adjust.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct kve_score_params {
    /// `sizeof(kve_score_params)` as the caller compiled it (set by the init function).
    pub struct_size: u32,
    /// `KVE_SCORER_*`.
    pub scorer: u32,
    /// Observation window `w` (>= 1): the last `w` positions, whose queries are given.
    pub window: u32,
    /// `KVE_POOL_*` applied along tokens to the per-head attention statistic.
    pub pool_kind: u32,
    /// Pooling kernel: odd for avg/max (<= 4095), 1..4096 for forward.
    pub pool_kernel: u32,
    /// Forward pooling decay in (0, 1].
    pub pool_decay: f32,
    /// `KVE_GQA_*` for SnapKV-style scores (LAVa always uses max).
    pub gqa: u32,
    /// 1: reduce the query heads of a group before pooling; 0: after.
    pub reduce_before_pool: u32,
    /// `KVE_LAPROX_GQA_*`.
    pub laprox_gqa: u32,
    /// `KVE_PLACEMENT_*`.
    pub placement: u32,
    /// StreamingLLM sink tokens.
    pub sinks: u32,
    /// CriticalKV: prefix tokens per KV head forced by the base score; they score
    /// `FLT_MAX` (see `kve_score_layer`).
    pub critical_first_stage: u32,
    /// The scores raised to this integer power in [1, `KVE_MAX_SCORE_POWER`], sign kept,
    /// saturating at `FLT_MAX` (products rounded one by one; the same bits on the host and
    /// the device). Each head's order is unchanged; a head's peaks weigh more once the
    /// selection normalises by the layer sum and adds heads and layers. 1: as the scorer
    /// computes them. The `laprox-span` preset: 3. Since V2 (`KVE_SCORE_PARAMS_V2_SIZE`);
    /// a V1 caller gets 1.
    pub power: u32,
}

/// How to allocate budgets and select (design §4). Fill with `kve_select_params_init`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct kve_select_params {
    /// `sizeof(kve_select_params)` as the caller compiled it (set by the init function).
    pub struct_size: u32,
    /// `KVE_ALLOCATOR_*`.
    pub allocator: u32,
    /// `KVE_GRANULARITY_*`.
    pub granularity: u32,
    /// `KVE_NORMALIZE_*`.
    pub normalize: u32,
    /// Average prefix tokens kept per (layer, KV head), window excluded (`C - w`).
    /// Larger than the prefix keeps the whole prefix; values above `KVE_MAX_BUDGET` are
    /// clamped to it. See `kve_budget_*` for capacity and keep-ratio conventions.
    pub budget: u64,
    /// AdaKV / LAVa safeguard fraction in [0, 1].
    pub alpha: f32,
    /// PyramidKV ratio (>= 1).
    pub beta: u32,
    /// `KVE_POOL_*` applied to the scores at the selection granularity.
    pub post_pool_kind: u32,
    /// Its kernel (see `kve_score_params.pool_kernel`).
    pub post_pool_kernel: u32,
    /// Its decay (forward pooling).
    pub post_pool_decay: f32,
    /// The first `post_pool_sinks` prefix positions are left out of the post-pool: they
    /// keep their own score and lend none to their followers (an attention sink's score
    /// is not a read of what follows it). Any value; clamped to the prefix. 0: pool all
    /// (the V1 `reserved` slot, so V1 callers that zeroed it get this). LaProx-span: 1.
    pub post_pool_sinks: u32,
}

/// `sizeof(kve_score_params)` of the first release (without `power`; still accepted).
pub const KVE_SCORE_PARAMS_V1_SIZE: u32 = 48;
/// `sizeof(kve_score_params)` with `power`.
pub const KVE_SCORE_PARAMS_V2_SIZE: u32 = 52;
/// The largest `kve_score_params.power`.
pub const KVE_MAX_SCORE_POWER: u32 = crate::config::MAX_SCORE_POWER;
/// `sizeof(kve_select_params)` of the first release.
pub const KVE_SELECT_PARAMS_V1_SIZE: u32 = 48;

/// An extensible struct: its released sizes, oldest first (the last is its `sizeof`).
pub(crate) trait Extensible: Copy {
    const SIZES: &'static [u32];
}

/// `extensible!(T: [V1, V2, ..])`: `T`'s `Extensible` impl with these released sizes, and a
/// compile-time check that the last is `sizeof(T)`.
macro_rules! extensible {
    ($t:ty: [$($size:expr),+ $(,)?]) => {
        impl $crate::capi::params::Extensible for $t {
            const SIZES: &'static [u32] = &[$($size),+];
        }
        const _: () = {
            let sizes = <$t as $crate::capi::params::Extensible>::SIZES;
            assert!(core::mem::size_of::<$t>() == sizes[sizes.len() - 1] as usize);
        };
    };
}
pub(crate) use extensible;

extensible!(kve_score_params: [KVE_SCORE_PARAMS_V1_SIZE, KVE_SCORE_PARAMS_V2_SIZE]);
extensible!(kve_select_params: [KVE_SELECT_PARAMS_V1_SIZE]);

fn flag(v: u32) -> Result<bool> {
    match v {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(Error::InvalidArgument),
    }
}

pub(crate) fn encode_score(c: &ScoreConfig) -> kve_score_params {
    kve_score_params {
        struct_size: KVE_SCORE_PARAMS_V2_SIZE,
        scorer: c.scorer as u32,
        window: c.window,
        pool_kind: c.pool.kind as u32,
        pool_kernel: c.pool.kernel,
        pool_decay: c.pool.decay,
        gqa: c.gqa as u32,
        reduce_before_pool: c.reduce_before_pool as u32,
        laprox_gqa: c.laprox_gqa as u32,
        placement: c.placement as u32,
        sinks: c.sinks,
        critical_first_stage: c.critical_first_stage,
        power: c.power,
    }
}

pub(crate) fn encode_select(c: &SelectConfig) -> kve_select_params {
    kve_select_params {
        struct_size: KVE_SELECT_PARAMS_V1_SIZE,
        allocator: c.allocator as u32,
        granularity: c.granularity as u32,
        normalize: c.normalize as u32,
        budget: c.budget,
        alpha: c.alpha,
        beta: c.beta,
        post_pool_kind: c.post_pool.kind as u32,
        post_pool_kernel: c.post_pool.kernel,
        post_pool_decay: c.post_pool.decay,
        post_pool_sinks: c.post_pool_sinks,
    }
}

/// `size` when it is a released size of `T` no older than `first` (a call introduced
/// with a later version passes that version's size).
pub(crate) fn known_size<T: Extensible>(size: u32, first: u32) -> Result<usize> {
    if size >= first && T::SIZES.contains(&size) && size as usize <= core::mem::size_of::<T>() {
        Ok(size as usize)
    } else {
        Err(Error::InvalidArgument)
    }
}

/// Read an extensible struct (rules in the module docs): the fields of its version,
/// `defaults` for the rest.
pub(crate) unsafe fn read_ext<T: Extensible>(p: *const T, first: u32, defaults: T) -> Result<T> {
    // SAFETY: the caller passes NULL or a `T`; arg checks NULL and alignment.
    let r = unsafe { arg(p)? };
    // SAFETY: `r` is a checked `&T`, and every Extensible struct starts with its u32 struct_size.
    let size = known_size::<T>(unsafe { *(r as *const T as *const u32) }, first)?;
    let mut v = defaults;
    // SAFETY: known_size bounds `size` by size_of::<T>(): the caller's bytes, into a local `T`.
    unsafe { core::ptr::copy_nonoverlapping(p as *const u8, &mut v as *mut T as *mut u8, size) };
    Ok(v)
}

/// Write an extensible struct of the caller's `struct_size` (rules in the module docs).
pub(crate) unsafe fn write_ext<T: Extensible>(
    p: *mut T,
    struct_size: u32,
    first: u32,
    value: T,
) -> Result<()> {
    let _ = out_param(p)?;
    let size = known_size::<T>(struct_size, first)?;
    let dst = p as *mut u8;
    // SAFETY: out_param checked `p` non-NULL, aligned; known_size: `size` <= size_of::<T>().
    unsafe { core::ptr::copy_nonoverlapping(&value as *const T as *const u8, dst, size) };
    // SAFETY: `dst` is non-NULL and aligned (out_param) and every Extensible struct starts
    // with its u32 struct_size, inside the `size` >= 4 bytes the caller declared.
    unsafe { *(dst as *mut u32) = struct_size };
    Ok(())
}

/// Decode score parameters into the core's configuration (validated).
pub(crate) unsafe fn score_config(p: *const kve_score_params) -> Result<ScoreConfig> {
    let d = encode_score(&ScoreConfig::preset(Preset::SnapKv));
    // SAFETY: the caller passes NULL or a `kve_score_params`; read_ext checks the rest.
    let p = unsafe { read_ext(p, KVE_SCORE_PARAMS_V1_SIZE, d)? };
    let cfg = ScoreConfig {
        scorer: ScorerKind::from_u32(p.scorer)?,
        window: p.window,
        pool: Pool {
            kind: PoolKind::from_u32(p.pool_kind)?,
            kernel: p.pool_kernel,
            decay: p.pool_decay,
        },
        gqa: GqaReduce::from_u32(p.gqa)?,
        reduce_before_pool: flag(p.reduce_before_pool)?,
        laprox_gqa: LaproxGqa::from_u32(p.laprox_gqa)?,
        placement: PoolPlacement::from_u32(p.placement)?,
        sinks: p.sinks,
        critical_first_stage: p.critical_first_stage,
        power: p.power,
    };
    cfg.validate()?;
    Ok(cfg)
}

/// Decode selection parameters (validated; budget clamped to `MAX_BUDGET`).
pub(crate) unsafe fn select_config(p: *const kve_select_params) -> Result<SelectConfig> {
    let d = encode_select(&SelectConfig::new(
        AllocatorKind::Uniform,
        Granularity::Head,
        0,
    ));
    // SAFETY: the caller passes NULL or a `kve_select_params`; read_ext checks the rest.
    let p = unsafe { read_ext(p, KVE_SELECT_PARAMS_V1_SIZE, d)? };
    let cfg = SelectConfig {
        allocator: AllocatorKind::from_u32(p.allocator)?,
        granularity: Granularity::from_u32(p.granularity)?,
        budget: p.budget.min(MAX_BUDGET),
        alpha: p.alpha,
        beta: p.beta,
        normalize: Normalize::from_u32(p.normalize)?,
        post_pool: Pool {
            kind: PoolKind::from_u32(p.post_pool_kind)?,
            kernel: p.post_pool_kernel,
            decay: p.post_pool_decay,
        },
        post_pool_sinks: p.post_pool_sinks,
    };
    cfg.validate()?;
    Ok(cfg)
}

/// Fill `params` with the defaults of a scoring preset (`KVE_PRESET_*`).
///
/// `struct_size`: `sizeof(kve_score_params)` as the caller sees it; the library writes
/// that many bytes. Returns `KVE_ERR_BAD_ENUM` for an unknown preset,
/// `KVE_ERR_INVALID_ARGUMENT` for a `struct_size` that is not a released size
/// (`KVE_SCORE_PARAMS_V1_SIZE`, `KVE_SCORE_PARAMS_V2_SIZE`). Writes only `params`.
#[no_mangle]
pub unsafe extern "C" fn kve_score_params_init(
    params: *mut kve_score_params,
    struct_size: u32,
    preset: u32,
) -> i32 {
    let preset = tri!(Preset::from_u32(preset));
    let v = encode_score(&ScoreConfig::preset(preset));
    // SAFETY: the caller passes NULL or `struct_size` writable bytes; write_ext checks the rest.
    to_status(unsafe { write_ext(params, struct_size, KVE_SCORE_PARAMS_V1_SIZE, v) })
}

/// Fill `params` for an allocator (`KVE_ALLOCATOR_*`) at a granularity
/// (`KVE_GRANULARITY_*`) with the design §4 defaults: alpha 0.2, beta 20, layer-sum
/// normalisation, no post pooling. `budget`: average prefix tokens per (layer, KV head).
/// Writes only `params` (`struct_size` bytes).
#[no_mangle]
pub unsafe extern "C" fn kve_select_params_init(
    params: *mut kve_select_params,
    struct_size: u32,
    allocator: u32,
    granularity: u32,
    budget: u64,
) -> i32 {
    let a = tri!(AllocatorKind::from_u32(allocator));
    let g = tri!(Granularity::from_u32(granularity));
    // SAFETY: `params` is NULL or `struct_size` writable bytes (this function's contract).
    unsafe { write_select(params, struct_size, &SelectConfig::new(a, g, budget)) }
}

/// Fill `params` with LaProx-span's selection (design §3): global allocator, token
/// granularity (one token set for the whole model), forward post pooling (k = 9,
/// decay 1.0) with position 0 left out of it (`post_pool_sinks` = 1). Use with the
/// `KVE_PRESET_LAPROX_SPAN` scorer. Writes only `params`.
#[no_mangle]
pub unsafe extern "C" fn kve_select_params_init_laprox_span(
    params: *mut kve_select_params,
    struct_size: u32,
    budget: u64,
) -> i32 {
    // SAFETY: as in kve_select_params_init.
    unsafe { write_select(params, struct_size, &SelectConfig::laprox_span(budget)) }
}

/// Fill `params` with the selection preset `preset` (`KVE_PRESET_*`) gets by default
/// (the library's one preset table): LAVa's allocator for lava, the global one for laprox,
/// LaProx-span's selection for laprox-span and uniqueness, uniform per head otherwise.
/// `budget`: average prefix tokens per (layer, KV head). Writes only `params`.
#[no_mangle]
pub unsafe extern "C" fn kve_select_params_init_preset(
    params: *mut kve_select_params,
    struct_size: u32,
    preset: u32,
    budget: u64,
) -> i32 {
    let cfg = crate::evictor::default_select(tri!(Preset::from_u32(preset)), budget);
    // SAFETY: as in kve_select_params_init.
    unsafe { write_select(params, struct_size, &cfg) }
}

/// The end of every `kve_select_params_init*`: `cfg` written to the caller's `params`
/// (`struct_size` bytes, a released size; else `KVE_ERR_INVALID_ARGUMENT`).
///
/// # Safety
/// `params` is NULL or points to `struct_size` writable bytes.
unsafe fn write_select(
    params: *mut kve_select_params,
    struct_size: u32,
    cfg: &SelectConfig,
) -> i32 {
    let v = encode_select(cfg);
    // SAFETY: the caller passes NULL or `struct_size` writable bytes; write_ext checks the rest.
    to_status(unsafe { write_ext(params, struct_size, KVE_SELECT_PARAMS_V1_SIZE, v) })
}

/// Budget for a capacity `C` per KV head with the window inside it (SnapKV / AdaKV /
/// PyramidKV convention): `max(C - window, 0)`.
#[no_mangle]
pub extern "C" fn kve_budget_from_capacity(capacity: u64, window: u64) -> u64 {
    budget_from::capacity(capacity, window)
}

/// Budget keeping `floor(n * ratio)` tokens per head with the window counted inside that
/// total (kvpress convention): `max(floor(n * r) - min(window, n), 0)` with `r` the ratio
/// clamped to [0, 1]. `+INFINITY` counts as 1 (keep everything), `-INFINITY` and NaN as 0
/// (keep only the window).
#[no_mangle]
pub extern "C" fn kve_budget_keep_ratio_total(n: u64, window: u64, ratio: f64) -> u64 {
    budget_from::keep_ratio_total(n, window, ratio)
}

/// Budget keeping `floor((n - window) * r)` prefix tokens (the window on top), `r` the
/// ratio clamped to [0, 1]: `+INFINITY` counts as 1, `-INFINITY` and NaN as 0.
#[no_mangle]
pub extern "C" fn kve_budget_keep_ratio_prefix(n: u64, window: u64, ratio: f64) -> u64 {
    budget_from::keep_ratio_prefix(n, window, ratio)
}
