//! A whole model's selection on the device: every allocator and granularity of design §4
//! as the core's `select_model` (src/math/budget) decides them: scores at the selection
//! granularity (reduced, post-pooled), per-layer budgets computed on the device (no host
//! round trip), the AdaKV/LAVa safeguard as forced entries, then radix top-K selects.
//! The kept sets are the host's.

use super::limits::{MAX_GRID, MAX_SELECT_ENTRIES};
use super::{check_workspace, ck, span_of, Carve};
use crate::config::{AllocatorKind, Granularity, Normalize, PoolKind, SelectConfig};
use crate::cuda as cu;
use crate::error::{Error, Result};
use crate::shape::ModelShape;
use crate::span::check_alias;
use core::ffi::{c_int, c_void};
use core::ptr::{null, null_mut};

/// The model's dimensions as the launches see them.
#[derive(Clone, Copy)]
struct Shape {
    layers: usize,
    hkv: usize,
    p: usize,
    /// Window tokens (always kept, listed after the chosen prefix).
    w: usize,
}

impl Shape {
    fn of(m: &ModelShape) -> Shape {
        Shape {
            layers: m.layers,
            hkv: m.hkv,
            p: m.prefix(),
            w: m.window,
        }
    }
}

/// What the configuration asks of the device.
struct Plan {
    /// Units that each keep one set: L·Hkv, L or 1.
    units: usize,
    /// Units per layer (Hkv at head granularity, else 1).
    per_layer: usize,
    /// Scores at the selection granularity need a workspace copy.
    copy: bool,
    /// Reduce, then pool: needs a second buffer.
    tmp: bool,
    /// The AdaKV / LAVa safeguard (forced entries, per-layer totals).
    safeguard: bool,
    /// Per-layer / per-unit budgets from kve_cuda_layer_budgets.
    budgets: Option<c_int>,
    /// Layer sums (normalisation) and, for LAVa, entropies.
    stats: bool,
    /// The final lists go through the workspace and are broadcast to every head.
    shared: bool,
}

fn plan(cfg: &SelectConfig, s: &Shape, linked: bool) -> Plan {
    let (units, per_layer) = match cfg.granularity {
        Granularity::Head => (s.layers * s.hkv, s.hkv),
        Granularity::Layer => (s.layers, 1),
        Granularity::Token => (1, 1),
    };
    let token = cfg.granularity == Granularity::Token;
    let safeguard = !token
        && match cfg.allocator {
            AllocatorKind::Lava => true,
            AllocatorKind::Ada => cfg.granularity == Granularity::Head,
            _ => false,
        };
    let budgets = if token {
        None
    } else {
        match cfg.allocator {
            AllocatorKind::Global => None,
            AllocatorKind::Pyramid => Some(cu::KVE_CUDA_BUDGET_PYRAMID),
            AllocatorKind::Uniform => Some(cu::KVE_CUDA_BUDGET_UNIFORM),
            AllocatorKind::Ada if !safeguard => Some(cu::KVE_CUDA_BUDGET_UNIFORM),
            AllocatorKind::Ada => Some(cu::KVE_CUDA_BUDGET_ADA),
            AllocatorKind::Lava => Some(cu::KVE_CUDA_BUDGET_LAVA),
        }
    };
    let head = cfg.granularity == Granularity::Head;
    let normalized =
        cfg.normalize == Normalize::LayerSum && (token || cfg.allocator == AllocatorKind::Global);
    // a linked pool may extend even a 1-token kernel: it always pools (the host's copies_scores)
    let pooled = !cfg.post_pool.is_identity() || linked;
    Plan {
        units,
        per_layer,
        copy: !head || pooled || safeguard,
        tmp: !head && pooled,
        safeguard,
        budgets,
        stats: normalized || budgets == Some(cu::KVE_CUDA_BUDGET_LAVA),
        shared: !head,
    }
}

struct Parts {
    sel: *mut u8,
    sel_bytes: usize,
    sums: *mut f64,
    entropy: *mut f64,
    stats: *mut u8,
    stats_bytes: usize,
    arr: *mut f32,
    tmp: *mut f32,
    k_layer: *mut i64,
    k_unit: *mut i64,
    counts: *mut i32,
    idx: *mut i32,
    total: usize,
}

fn layout(pl: &Plan, s: &Shape, base: *mut c_void) -> Result<Parts> {
    let mul = crate::error::mul;
    let mut c = Carve::new(base);
    let all = s.layers * s.hkv;
    // SAFETY: pure host functions.
    let sel_bytes = unsafe {
        cu::kve_cuda_select_workspace_size(1).max(cu::kve_cuda_select_workspace_size(all as i64))
    };
    let sel = c.take::<u8>(sel_bytes)?;
    let sums = c.take::<f64>(if pl.stats { s.layers } else { 0 })?;
    let entropy = c.take::<f64>(if pl.stats { s.layers } else { 0 })?;
    let stats_bytes = if pl.stats {
        let count = mul(s.hkv, s.p)? as i64;
        // SAFETY: a pure host function.
        unsafe { cu::kve_cuda_layer_stats_workspace_size(s.layers as i64, count) }
    } else {
        0
    };
    let stats = c.take::<u8>(stats_bytes)?;
    let grid = mul(pl.units, s.p)?;
    let arr = c.take::<f32>(if pl.copy { grid } else { 0 })?;
    let tmp = c.take::<f32>(if pl.tmp { grid } else { 0 })?;
    let k_layer = c.take::<i64>(if pl.budgets.is_some() { s.layers } else { 0 })?;
    let k_unit = c.take::<i64>(if pl.budgets.is_some() { pl.units } else { 0 })?;
    let lists = pl.safeguard || pl.shared;
    let counts = c.take::<i32>(if lists { pl.units } else { 0 })?;
    let idx = c.take::<i32>(if lists { grid } else { 0 })?;
    Ok(Parts {
        sel,
        sel_bytes,
        sums,
        entropy,
        stats,
        stats_bytes,
        arr,
        tmp,
        k_layer,
        k_unit,
        counts,
        idx,
        total: c.bytes(),
    })
}

/// Limits of the kernels the plan launches, checked before anything is enqueued: grid
/// dimensions (layer_stats and the layer reduce over layers, pool over its rows) and
/// kve_cuda_select's groups (fewer than 2^32 entries).
fn kernel_limits(cfg: &SelectConfig, pl: &Plan, s: &Shape) -> Result<()> {
    if s.p == 0 {
        return Ok(()); // only the counts are written
    }
    let head = cfg.granularity == Granularity::Head;
    let grid = [
        if pl.stats { s.layers } else { 0 },
        if cfg.granularity == Granularity::Layer {
            s.layers
        } else {
            0
        },
        if (head && pl.copy) || pl.tmp {
            pl.units
        } else {
            0
        },
    ];
    // rows of one select group: every unit (global), a layer's (safeguard), else one
    let group = if cfg.granularity == Granularity::Token {
        1
    } else if pl.budgets.is_none() {
        pl.units
    } else if pl.safeguard {
        pl.per_layer
    } else {
        1
    };
    if grid.iter().any(|&r| r as u64 > MAX_GRID)
        || group as u128 * s.p as u128 >= MAX_SELECT_ENTRIES
    {
        return Err(Error::InvalidArgument);
    }
    Ok(())
}

/// Device workspace bytes of [`select_model`] (and of the linked selection: the same, as
/// a forward post-pool already pools into a copy).
pub fn select_workspace_size(cfg: &SelectConfig, m: &ModelShape) -> Result<usize> {
    cfg.validate()?;
    let s = Shape::of(m);
    let linked = cfg.post_pool.kind == PoolKind::Forward;
    Ok(layout(&plan(cfg, &s, linked), &s, null_mut())?.total)
}

/// Where [`select_model`] writes: per unit `u = l*hkv + kh`, `counts[u]` kept positions
/// in `idx[u*idx_ld ..]` (int32, device memory).
#[derive(Clone, Copy, Debug)]
pub struct KeptLists {
    pub counts: *mut i32,
    pub counts_len: u64,
    pub idx: *mut i32,
    pub idx_ld: u64,
    pub idx_len: u64,
}

/// Select the kept positions of every (layer, KV head) from device `scores`
/// (`[layers][hkv][P]`, `scores_len` floats, exactly `layers*hkv*P`) on `stream`.
/// Everything the host can check is checked before anything is enqueued.
///
/// # Safety
/// `scores`, the lists and `workspace` are device memory of the declared sizes, valid
/// until the stream has run the launches.
pub unsafe fn select_model(
    cfg: &SelectConfig,
    m: &ModelShape,
    scores: *const f32,
    scores_len: u64,
    out: &KeptLists,
    workspace: *mut c_void,
    workspace_bytes: u64,
    stream: *mut c_void,
) -> Result<()> {
    cfg.validate()?;
    // SAFETY: the caller's contract, passed on.
    unsafe {
        select_with(
            cfg,
            m,
            scores,
            scores_len,
            None,
            out,
            workspace,
            workspace_bytes,
            stream,
        )
    }
}

/// Value links on the device for the selection's forward post-pool: `n` sums at `sums`
/// (device memory), linked where a sum exceeds `link_min`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Linked {
    pub sums: *const f32,
    pub link_min: f32,
}

/// [`select_model`], its forward post-pool carried on through `links` when given (checked
/// by the caller: pointer, length, alignment, configuration).
///
/// # Safety
/// As [`select_model`]; `links.sums` is device memory of `n` floats.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn select_with(
    cfg: &SelectConfig,
    m: &ModelShape,
    scores: *const f32,
    scores_len: u64,
    links: Option<Linked>,
    out: &KeptLists,
    workspace: *mut c_void,
    workspace_bytes: u64,
    stream: *mut c_void,
) -> Result<()> {
    let s = Shape::of(m);
    let (counts, idx, idx_ld) = (out.counts, out.idx, out.idx_ld);
    if scores.is_null() || counts.is_null() || idx.is_null() {
        return Err(Error::NullPointer);
    }
    if (scores as usize) % 4 != 0 || (counts as usize) % 4 != 0 || (idx as usize) % 4 != 0 {
        return Err(Error::Misaligned);
    }
    let all = (s.layers * s.hkv) as u64;
    if scores_len as u128 != all as u128 * s.p as u128 {
        return Err(Error::ShapeMismatch);
    }
    if idx_ld < (s.p + s.w) as u64
        || idx_ld > i32::MAX as u64
        || out.counts_len < all
        || (out.idx_len as u128) < all as u128 * idx_ld as u128
    {
        return Err(Error::OutputTooSmall);
    }
    let pl = plan(cfg, &s, links.is_some());
    kernel_limits(cfg, &pl, &s)?;
    let need = layout(&pl, &s, null_mut())?.total;
    check_workspace(workspace, workspace_bytes, need)?;
    let reads = [
        span_of(scores, all as usize * s.p)?,
        span_of(links.map_or(null(), |l| l.sums), m.n)?,
    ];
    let writes = [
        span_of(counts, all as usize)?,
        span_of(idx, all as usize * idx_ld as usize)?,
        span_of(workspace as *const u8, need)?,
    ];
    check_alias(&writes, &reads)?;
    let parts = layout(&pl, &s, workspace)?;
    let idx_ld = idx_ld as i64;
    // SAFETY: scores, lists and workspace parts are the caller's device buffers, their
    // sizes checked above against the shape the chain launches over; the launchers only
    // enqueue work on `stream`. The chosen prefix positions, then the window, in every
    // unit's list.
    unsafe {
        choose(
            cfg, &pl, &s, &parts, scores, links, counts, idx, idx_ld, stream,
        )?;
        ck(cu::kve_cuda_append_range(
            counts,
            idx,
            idx_ld,
            (s.layers * s.hkv) as i64,
            s.p as i64,
            s.w as i64,
            stream,
        ))
    }
}

/// Pool rows of `p` entries on the device (`src` and `dst` distinct); linked: one launch
/// of the linked forward pool, which copies the sinks itself.
unsafe fn pool_rows(
    cfg: &SelectConfig,
    src: *const f32,
    dst: *mut f32,
    rows: usize,
    p: usize,
    links: Option<Linked>,
    stream: *mut c_void,
) -> Result<()> {
    // SAFETY: the pointers are device memory of the sizes checked by the public caller;
    // the launchers only enqueue work on `stream`.
    unsafe {
        let pp = &cfg.post_pool;
        if let Some(l) = links {
            let n = p as i64;
            return ck(cu::kve_cuda_pool_linked(
                src,
                n,
                dst,
                n,
                rows as i64,
                n,
                pp.kernel as c_int,
                cfg.post_pool_sinks as i64,
                l.sums,
                l.link_min,
                stream,
            ));
        }
        let (mode, k, decay) = match pp.kind {
            // identity: a plain copy (avg over one element)
            PoolKind::None => (cu::KVE_CUDA_POOL_AVG, 1, 1.0),
            PoolKind::Avg => (cu::KVE_CUDA_POOL_AVG, pp.kernel as c_int, 1.0),
            PoolKind::Max => (cu::KVE_CUDA_POOL_MAX, pp.kernel as c_int, 1.0),
            PoolKind::Forward => (cu::KVE_CUDA_POOL_FORWARD, pp.kernel as c_int, pp.decay),
        };
        let k = if pp.is_identity() { 1 } else { k };
        let mode = if pp.is_identity() {
            cu::KVE_CUDA_POOL_AVG
        } else {
            mode
        };
        let n = p as i64;
        // the first `post_pool_sinks` positions are copied (avg over one), the rest pooled
        // on their own, as `pool_past_sinks` does on the host
        let s = (cfg.post_pool_sinks as usize).min(p);
        if s > 0 {
            ck(cu::kve_cuda_pool(
                src,
                n,
                dst,
                n,
                rows as i64,
                s as i64,
                cu::KVE_CUDA_POOL_AVG,
                1,
                1.0,
                stream,
            ))?;
        }
        if s == p {
            return Ok(());
        }
        ck(cu::kve_cuda_pool(
            src.add(s),
            n,
            dst.add(s),
            n,
            rows as i64,
            (p - s) as i64,
            mode,
            k,
            decay,
            stream,
        ))
    }
}

/// The chosen prefix positions of every unit.
unsafe fn choose(
    cfg: &SelectConfig,
    pl: &Plan,
    s: &Shape,
    parts: &Parts,
    scores: *const f32,
    links: Option<Linked>,
    counts: *mut i32,
    idx: *mut i32,
    idx_ld: i64,
    stream: *mut c_void,
) -> Result<()> {
    // SAFETY: the pointers are device memory of the sizes checked by the public caller;
    // the launchers only enqueue work on `stream`.
    unsafe {
        let (layers, hkv, p) = (s.layers, s.hkv, s.p);
        let pi = p as i64;
        let all = (layers * hkv) as i64;
        let sel = |arr: *const f32,
                   groups: usize,
                   rows_per_group: usize,
                   k: *const i64,
                   k_all: i64,
                   layer_sum: *const f64,
                   rows_per_layer: usize,
                   c: *mut i32,
                   x: *mut i32,
                   ld: i64| {
            ck(cu::kve_cuda_select(
                arr,
                pi,
                pi,
                groups as i64,
                rows_per_group as i64,
                k,
                k_all,
                layer_sum,
                rows_per_layer as i64,
                c,
                x,
                ld,
                parts.sel as *mut c_void,
                parts.sel_bytes,
                stream,
            ))
        };
        if p == 0 {
            // every token is in the window: nothing to choose, every count 0
            return sel(
                null(),
                all as usize,
                1,
                null(),
                0,
                null(),
                1,
                counts,
                idx,
                idx_ld,
            );
        }
        if pl.stats {
            ck(cu::kve_cuda_layer_stats(
                scores,
                hkv as i64 * pi,
                hkv as i64 * pi,
                layers as i64,
                parts.sums,
                parts.entropy,
                parts.stats as *mut c_void,
                parts.stats_bytes,
                stream,
            ))?;
        }
        // scores at the selection granularity
        let arr: *mut f32 = match cfg.granularity {
            Granularity::Head => {
                if pl.copy {
                    pool_rows(cfg, scores, parts.arr, pl.units, p, links, stream)?;
                    parts.arr
                } else {
                    scores as *mut f32
                }
            }
            Granularity::Layer | Granularity::Token => {
                let reduced = if pl.tmp { parts.tmp } else { parts.arr };
                if cfg.granularity == Granularity::Layer {
                    // raw sums over the heads of each layer
                    ck(cu::kve_cuda_head_reduce(
                        scores,
                        pi,
                        null(),
                        pi,
                        0,
                        null(),
                        reduced,
                        pi,
                        all,
                        layers as i64,
                        pi,
                        cu::KVE_CUDA_GQA_SUM,
                        stream,
                    ))?;
                } else {
                    let sums = if cfg.normalize == Normalize::LayerSum {
                        parts.sums as *const f64
                    } else {
                        null()
                    };
                    ck(cu::kve_cuda_token_reduce(
                        scores,
                        sums,
                        layers as i64,
                        hkv as i64,
                        pi,
                        reduced,
                        stream,
                    ))?;
                }
                if pl.tmp {
                    pool_rows(cfg, parts.tmp, parts.arr, pl.units, p, links, stream)?;
                }
                parts.arr
            }
        };
        // where the final lists go: the caller's, or the workspace to broadcast from
        let (fc, fi, fld) = if pl.shared {
            (parts.counts, parts.idx, pi)
        } else {
            (counts, idx, idx_ld)
        };
        let b = cfg.budget.min(p as u64).min(i64::MAX as u64) as i64;
        if cfg.granularity == Granularity::Token {
            sel(arr, 1, 1, null(), b, null(), 1, fc, fi, fld)?;
        } else if let Some(mode) = pl.budgets {
            ck(cu::kve_cuda_layer_budgets(
                mode,
                parts.entropy,
                layers as i64,
                pl.per_layer as i64,
                pi,
                cfg.budget,
                cfg.beta,
                cfg.alpha,
                parts.k_layer,
                parts.k_unit,
                stream,
            ))?;
            if pl.safeguard {
                // each unit's own top floor(alpha·B_l) is forced, then one top over the layer
                sel(
                    arr,
                    pl.units,
                    1,
                    parts.k_unit,
                    0,
                    null(),
                    1,
                    parts.counts,
                    parts.idx,
                    pi,
                )?;
                ck(cu::kve_cuda_mark_forced(
                    arr,
                    pi,
                    pl.units as i64,
                    parts.counts,
                    parts.idx,
                    pi,
                    stream,
                ))?;
                sel(
                    arr,
                    layers,
                    pl.per_layer,
                    parts.k_layer,
                    0,
                    null(),
                    1,
                    fc,
                    fi,
                    fld,
                )?;
            } else {
                sel(arr, pl.units, 1, parts.k_unit, 0, null(), 1, fc, fi, fld)?;
            }
        } else {
            // global: one top-K over every unit, layers normalised by their sums
            let layer_sum = if cfg.normalize == Normalize::LayerSum {
                parts.sums as *const f64
            } else {
                null()
            };
            let k = (pl.units as i64).saturating_mul(b);
            sel(
                arr,
                1,
                pl.units,
                null(),
                k,
                layer_sum,
                pl.per_layer,
                fc,
                fi,
                fld,
            )?;
        }
        if pl.shared {
            ck(cu::kve_cuda_broadcast_lists(
                parts.counts,
                parts.idx,
                pi,
                pl.units as i64,
                all / pl.units as i64,
                counts,
                idx,
                idx_ld,
                stream,
            ))?;
        }
        Ok(())
    }
}
