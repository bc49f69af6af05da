//! Budget allocation and selection for a whole model, the eviction list for engines whose
//! cache cell is shared by every head, and the sharded (multi-device) threshold search.

use super::params::{encode_select, kve_select_params, select_config};
use super::{arg, check_alias, out_param, span_ptr, to_status, tri, Buf, Span, KVE_OK};
use crate::budget::ModelScores;
use crate::config::SelectConfig;
use crate::error::{Error, Result};
use crate::select::Histogram;
use crate::shape::ModelShape;
use crate::shard::{self, ModelSearch, ShardHistogram, ShardSearch};
use core::ffi::c_void;

/// Scores of a whole model, or of a shard of consecutive layers:
/// `scores[(l * hkv + kh) * P + i]`, `P = n - min(window, n)`, as written by
/// `kve_score_layer` layer after layer. Any finite f32 is accepted (CriticalKV's forced
/// `FLT_MAX` included). NaN/Inf gives `KVE_ERR_NON_FINITE`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kve_model_scores {
    pub scores: *const f32,
    /// Floats at `scores`: exactly `layers * hkv * P` (else `KVE_ERR_SHAPE_MISMATCH`:
    /// scores laid out for another window, head count or length are refused).
    pub len: u64,
    /// Layers (1 .. 2^20), `layers * hkv <= 2^31` (else `KVE_ERR_OVERFLOW`).
    pub layers: u64,
    pub hkv: u64,
    /// Tokens in the cache, window included (1 .. 2^31).
    pub n: u64,
    /// Observation window (the last `window` tokens are always kept).
    pub window: u64,
}

impl kve_model_scores {
    /// The descriptor of all of `scores` for a model of `layers` layers of `hkv` KV heads,
    /// `n` tokens and a window of `window` (for Rust callers; nothing is checked here).
    pub fn of(scores: &[f32], layers: u64, hkv: u64, n: u64, window: u64) -> kve_model_scores {
        kve_model_scores {
            scores: scores.as_ptr(),
            len: scores.len() as u64,
            layers,
            hkv,
            n,
            window,
        }
    }
}

/// Dimensions checked before the core loops over them ([`ModelShape::new`], the check
/// the device path makes too).
fn dims(layers: u64, hkv: u64, n: u64, window: u64) -> Result<(usize, usize, usize, usize)> {
    let m = ModelShape::new(layers, hkv, n, window)?;
    Ok((m.layers, m.hkv, m.n, m.window))
}

/// Validate a scores descriptor; returns the checked buffer and the core's view of it.
///
/// # Safety
/// `m` is NULL or points to a `kve_model_scores` whose `scores` are readable for `'a`.
unsafe fn model<'a>(m: *const kve_model_scores) -> Result<(Buf<f32>, ModelScores<'a>)> {
    // SAFETY: NULL or the caller's `kve_model_scores`; `arg` checks NULL and alignment.
    let m = unsafe { arg(m)? };
    let (layers, hkv, n, window) = dims(m.layers, m.hkv, m.n, m.window)?;
    let b = Buf::new(m.scores, m.len)?;
    // exactly the layout's length: a longer buffer hides scores of another window
    let want = (layers as u64 * hkv as u64).checked_mul((n - window) as u64);
    if want != Some(m.len) {
        return Err(Error::ShapeMismatch);
    }
    // SAFETY: Buf::new checked the scores; every caller checks that no output overlaps them.
    let scores = unsafe { b.slice() };
    let ms = ModelScores {
        scores,
        layers,
        hkv,
        n,
        window,
    };
    Ok((b, ms))
}

fn write<T: Copy>(out: &mut Buf<T>, v: T) {
    // SAFETY: out_param checked non-NULL and aligned; one element.
    unsafe { out.slice_mut()[0] = v };
}

/// Element counts of `kve_select_model`'s outputs: `*offsets_len = layers*hkv + 1`
/// (uint64) and `*indices_len` (uint32) enough for every kept position. Writes only the
/// two out-parameters.
#[no_mangle]
pub unsafe extern "C" fn kve_select_output_len(
    params: *const kve_select_params,
    layers: u64,
    hkv: u64,
    n: u64,
    window: u64,
    offsets_len: *mut u64,
    indices_len: *mut u64,
) -> i32 {
    let mut oo = tri!(out_param(offsets_len));
    let mut oi = tri!(out_param(indices_len));
    // SAFETY: NULL or the caller's params; select_config checks NULL, alignment, struct_size.
    let cfg = tri!(unsafe { select_config(params) });
    tri!(check_alias(&[oo.span, oi.span], &[span_ptr(params)]));
    let (l, h, n, w) = tri!(dims(layers, hkv, n, window));
    let (a, b) = tri!(crate::select_output_len(&cfg, l, h, n, w));
    write(&mut oo, a as u64);
    write(&mut oi, b as u64);
    KVE_OK
}

/// Workspace bytes of `kve_select_model`. Writes only `*out_bytes`.
#[no_mangle]
pub unsafe extern "C" fn kve_select_workspace_size(
    params: *const kve_select_params,
    layers: u64,
    hkv: u64,
    n: u64,
    window: u64,
    out_bytes: *mut u64,
) -> i32 {
    // SAFETY: the caller's pointers, passed on; `model_size_query` checks them.
    unsafe {
        let dims = [layers, hkv, n, window];
        model_size_query(params, dims, out_bytes, crate::select_workspace_size)
    }
}

/// A model-wide size query (`kve_select_workspace_size`, the shards'): `*out_bytes =
/// f(params, layers, hkv, n, window)` once the output, the parameters (not overlapped by
/// the output) and the dimensions are checked. Writes only `*out_bytes`.
///
/// # Safety
/// `params` is NULL or the caller's struct; `out_bytes` NULL or the caller's `uint64_t`.
unsafe fn model_size_query(
    params: *const kve_select_params,
    [layers, hkv, n, window]: [u64; 4],
    out_bytes: *mut u64,
    f: impl FnOnce(&SelectConfig, usize, usize, usize, usize) -> Result<usize>,
) -> i32 {
    let mut out = tri!(out_param(out_bytes));
    // SAFETY: NULL or the caller's params; select_config checks NULL, alignment, struct_size.
    let cfg = tri!(unsafe { select_config(params) });
    tri!(check_alias(&[out.span], &[span_ptr(params)]));
    let (l, h, n, w) = tri!(dims(layers, hkv, n, window));
    let b = tri!(f(&cfg, l, h, n, w));
    write(&mut out, b as u64);
    KVE_OK
}

/// Select the kept positions of every (layer, KV head) of the model in one call.
///
/// Output, CSR: the kept positions of unit `u = l * hkv + kh` are
/// `indices[offsets[u] .. offsets[u+1]]`, ascending — chosen prefix tokens, then the whole
/// window; `offsets[layers*hkv]` is the total written. With a shared granularity every
/// head of a layer (layer) or of the model (token) has the same list. Budgets larger
/// than a unit's prefix keep all of it (clamped, never an error). Ties keep the later
/// position. Writes `offsets`, `indices` and the workspace; nothing on error.
#[no_mangle]
pub unsafe extern "C" fn kve_select_model(
    params: *const kve_select_params,
    scores: *const kve_model_scores,
    offsets: *mut u64,
    offsets_len: u64,
    indices: *mut u32,
    indices_len: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
) -> i32 {
    // SAFETY: the caller's pointers, passed on; `select` checks each (no links).
    unsafe {
        select(
            params,
            scores,
            None,
            offsets,
            offsets_len,
            indices,
            indices_len,
            workspace,
            workspace_bytes,
        )
    }
}

/// `kve_select_model` whose forward post-pool carries each continuation on through linked
/// positions, so it never ends inside a run of similar values (a number longer than the
/// kernel): position `i` continues `i - 1` when `links[i] / (layers * hkv)` exceeds
/// `link_threshold` (LaProx-span: 0.5). `links`: exactly `n` floats, the sums written by
/// `kve_accumulate_value_links` over every layer of the scores (else
/// `KVE_ERR_SHAPE_MISMATCH`; NaN/Inf: `KVE_ERR_NON_FINITE`). The post-pool must be
/// `KVE_POOL_FORWARD` with decay 1 and the threshold finite (else
/// `KVE_ERR_INVALID_ARGUMENT`). Same workspace and outputs as `kve_select_model`; nothing
/// written on error. The device form: `kve_cuda_select_model_linked`; sharded:
/// `kve_search_count_shard_linked` and `kve_select_shard_linked`.
#[no_mangle]
pub unsafe extern "C" fn kve_select_model_linked(
    params: *const kve_select_params,
    scores: *const kve_model_scores,
    links: *const f32,
    links_len: u64,
    link_threshold: f32,
    offsets: *mut u64,
    offsets_len: u64,
    indices: *mut u32,
    indices_len: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
) -> i32 {
    // SAFETY: the caller's pointers, passed on; `select` checks each.
    unsafe {
        select(
            params,
            scores,
            Some((links, links_len, link_threshold)),
            offsets,
            offsets_len,
            indices,
            indices_len,
            workspace,
            workspace_bytes,
        )
    }
}

/// `kve_select_model` and `kve_select_model_linked`: `links` = (sums, their length,
/// threshold) for the latter.
///
/// # Safety
/// Each pointer is NULL or the caller's buffer of the stated length; all are checked here.
#[allow(clippy::too_many_arguments)]
unsafe fn select(
    params: *const kve_select_params,
    scores: *const kve_model_scores,
    links: Option<(*const f32, u64, f32)>,
    offsets: *mut u64,
    offsets_len: u64,
    indices: *mut u32,
    indices_len: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
) -> i32 {
    // SAFETY: NULL or the caller's params; select_config checks NULL, alignment, struct_size.
    let cfg = tri!(unsafe { select_config(params) });
    // SAFETY: NULL or the caller's `kve_model_scores`; model checks it and its scores.
    let (sb, ms) = tri!(unsafe { model(scores) });
    let lb = tri!(links_buf(links, ms.n));
    let mut o = tri!(Buf::new(offsets, offsets_len));
    let mut i = tri!(Buf::new(indices, indices_len));
    let mut ws = tri!(Buf::new(workspace as *const u8, workspace_bytes));
    tri!(check_alias(
        &[o.span, i.span, ws.span],
        &[
            sb.span,
            lb.as_ref().map_or(Span::EMPTY, |b| b.span),
            span_ptr(params),
            span_ptr(scores)
        ]
    ));
    // SAFETY: Buf::new checked the three; check_alias: they overlap no input nor each other.
    let (o, i, ws) = unsafe { (o.slice_mut(), i.slice_mut(), ws.slice_mut()) };
    match (lb, links) {
        (Some(b), Some((_, _, threshold))) => {
            // SAFETY: Buf::new checked `links`; check_alias: no output overlaps it.
            let sums = unsafe { b.slice() };
            let vl = crate::ValueLinks { sums, threshold };
            to_status(crate::select_model_linked(&cfg, &ms, vl, o, i, ws))
        }
        _ => to_status(crate::select_model(&cfg, &ms, o, i, ws)),
    }
}

/// Positions `p < prefix` missing from an ascending kept list: what an engine whose
/// cache cell serves every head and layer (llama.cpp) evicts, one
/// `llama_memory_seq_rm(mem, seq, p, p + 1)` each. `kept`: strictly ascending positions
/// (e.g. one unit's slice of `kve_select_model`'s `indices`; entries `>= prefix` are
/// ignored). `prefix <= 2^31`. Writes the ascending evicted positions to `out`
/// (`out_len` must hold them all: at most `prefix`) and their count to `*out_count`.
#[no_mangle]
pub unsafe extern "C" fn kve_evicted_positions(
    kept: *const u32,
    kept_len: u64,
    prefix: u64,
    out: *mut u32,
    out_len: u64,
    out_count: *mut u64,
) -> i32 {
    let k = tri!(Buf::new(kept, kept_len));
    let mut o = tri!(Buf::new(out, out_len));
    let mut c = tri!(out_param(out_count));
    tri!(check_alias(&[o.span, c.span], &[k.span]));
    if prefix > crate::error::MAX_TOKENS as u64 {
        return super::KVE_ERR_INVALID_ARGUMENT;
    }
    // SAFETY: Buf::new checked `kept`; check_alias: no output overlaps it.
    let kept = unsafe { k.slice() };
    if kept.windows(2).any(|w| w[0] >= w[1]) {
        return super::KVE_ERR_INVALID_ARGUMENT;
    }
    let inside = kept.iter().filter(|&&p| (p as u64) < prefix).count() as u64;
    let evicted = prefix - inside;
    if (o.len() as u64) < evicted {
        return super::KVE_ERR_OUTPUT_TOO_SMALL;
    }
    // SAFETY: Buf::new checked `out`; check_alias: it overlaps `kept` and `out_count` nowhere.
    let o = unsafe { o.slice_mut() };
    let written = tri!(crate::evicted_positions(kept, prefix as usize, o));
    write(&mut c, written as u64);
    KVE_OK
}

// ------------------------------------------------------------------ sharded selection

/// State of a model-wide top-K search split over shards of layers (design §4, "selection
/// across devices"). Plain data: copy it to every shard, process or device. Written only
/// by `kve_search_init` and `kve_search_step`; the fields are the library's business.
/// What can be checked is (`KVE_ERR_INVALID_ARGUMENT`): the fields' consistency; before
/// the first step the whole state, recomputed from the model and parameters (`need` is
/// their candidate count, at most the model's prefix positions); after it `need` at most
/// that count, no threshold while running, a final threshold made of the settled digits.
/// What cannot be: settled digits, `need` and threshold forged together stay a search
/// the library cannot tell from its own, and the shards keep what its threshold says.
///
/// It records the model and the parameters it was started for: a shard whose `hkv`, `n`
/// or window differ, or whose layers reach past the model's, gives
/// `KVE_ERR_SHAPE_MISMATCH`; other selection parameters than `kve_search_init`'s give
/// `KVE_ERR_INVALID_ARGUMENT`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct kve_search {
    pub need: u64,
    pub prefix_lo: u64,
    pub prefix_hi: u64,
    pub threshold_lo: u64,
    pub threshold_hi: u64,
    pub bits: u32,
    /// 1 when the threshold is known.
    pub done: u32,
    /// The model: layers (all shards together), KV heads, tokens, `min(window, n)`.
    pub layers: u64,
    pub hkv: u64,
    pub n: u64,
    pub window: u64,
    /// The selection parameters, as decoded (first-release layout).
    pub params: kve_select_params,
}

/// Counts of the next key digit, one per bucket, and which search round and layers they
/// cover. Zero it (`kve_histogram_clear`, or all-zero bytes) before counting; add
/// shards' histograms with `kve_histogram_merge`. `kve_search_step` accepts it only when
/// every layer of the model was counted exactly once for the search's current round.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct kve_histogram {
    pub bins: [u64; 256],
    /// The round it was counted for (a fingerprint of the search state); 0 while empty.
    pub round: u64,
    /// Layers counted into it, with repeats.
    pub layers: u64,
    /// A checksum of which layers (a wrong set passes with probability about 2^-64).
    pub layer_sum: u64,
}

impl kve_histogram {
    fn to_core(self) -> ShardHistogram {
        ShardHistogram {
            bins: Histogram(self.bins),
            round: self.round,
            layers: self.layers,
            layer_sum: self.layer_sum,
        }
    }
    fn from_core(h: &ShardHistogram) -> kve_histogram {
        kve_histogram {
            bins: h.bins.0,
            round: h.round,
            layers: h.layers,
            layer_sum: h.layer_sum,
        }
    }
}

/// The C form of a search: its fields and the model as recorded, the parameters encoded.
fn to_c(s: &ModelSearch) -> kve_search {
    let (t, m) = (&s.search, &s.shape);
    kve_search {
        need: t.need,
        prefix_lo: t.prefix as u64,
        prefix_hi: (t.prefix >> 64) as u64,
        threshold_lo: t.threshold as u64,
        threshold_hi: (t.threshold >> 64) as u64,
        bits: t.bits,
        done: t.done as u32,
        layers: m.layers as u64,
        hkv: m.hkv as u64,
        n: m.n as u64,
        window: m.window as u64,
        params: encode_select(&s.cfg),
    }
}

/// The core's search from its C form, checked ([`ModelSearch::validate`]); anything that
/// does not convert (a `done` other than 0/1, parameters not in their canonical encoding,
/// dimensions out of range) is `InvalidArgument` as well.
fn from_c(c: &kve_search) -> Result<ModelSearch> {
    let done = match c.done {
        0 => false,
        1 => true,
        _ => return Err(Error::InvalidArgument),
    };
    let search = ShardSearch {
        need: c.need,
        prefix: (c.prefix_hi as u128) << 64 | c.prefix_lo as u128,
        bits: c.bits,
        done,
        threshold: (c.threshold_hi as u128) << 64 | c.threshold_lo as u128,
    };
    // SAFETY: a reference to a local struct (non-NULL, aligned, `struct_size` read).
    let cfg = unsafe { select_config(&c.params) }.map_err(|_| Error::InvalidArgument)?;
    let shape =
        ModelShape::new(c.layers, c.hkv, c.n, c.window).map_err(|_| Error::InvalidArgument)?;
    if c.window != shape.window as u64 || encode_select(&cfg) != c.params {
        return Err(Error::InvalidArgument);
    }
    let s = ModelSearch { search, cfg, shape };
    s.validate()?;
    Ok(s)
}

/// A C layer number as the core's (past `usize`: no model's, so refused as outside it).
fn layer_of(first_layer: u64) -> usize {
    usize::try_from(first_layer).unwrap_or(usize::MAX)
}

/// Start a search for the model of `layers` layers (all shards together). Sharded
/// selection supports the `KVE_ALLOCATOR_GLOBAL` allocator at head or layer granularity
/// (others: `KVE_ERR_INVALID_ARGUMENT`; they either need no cross-layer search or need
/// all scores in one place — use `kve_select_model`). The state records `layers`, `hkv`,
/// `n`, `min(window, n)` and the parameters. `search` must not overlap `params`
/// (`KVE_ERR_ALIASING`). Writes only `*search`.
#[no_mangle]
pub unsafe extern "C" fn kve_search_init(
    search: *mut kve_search,
    params: *const kve_select_params,
    layers: u64,
    hkv: u64,
    n: u64,
    window: u64,
) -> i32 {
    let mut out = tri!(out_param(search));
    // SAFETY: NULL or the caller's params; select_config checks NULL, alignment, struct_size.
    let cfg = tri!(unsafe { select_config(params) });
    tri!(check_alias(&[out.span], &[span_ptr(params)]));
    let (l, h, n, w) = tri!(dims(layers, hkv, n, window));
    let s = tri!(ModelSearch::new(&cfg, l, h, n, w));
    write(&mut out, to_c(&s));
    KVE_OK
}

/// Zero a histogram (counts, round and layers). Writes only `*hist`.
#[no_mangle]
pub unsafe extern "C" fn kve_histogram_clear(hist: *mut kve_histogram) -> i32 {
    let mut out = tri!(out_param(hist));
    write(&mut out, kve_histogram::from_core(&ShardHistogram::EMPTY));
    KVE_OK
}

/// Workspace bytes of `kve_search_count_shard` and `kve_select_shard` for a shard of
/// `layers` layers. Writes only `*out_bytes`.
#[no_mangle]
pub unsafe extern "C" fn kve_select_shard_workspace_size(
    params: *const kve_select_params,
    layers: u64,
    hkv: u64,
    n: u64,
    window: u64,
    out_bytes: *mut u64,
) -> i32 {
    // SAFETY: the caller's pointers, passed on; `model_size_query` checks them.
    unsafe {
        let dims = [layers, hkv, n, window];
        model_size_query(params, dims, out_bytes, shard::shard_workspace_size)
    }
}

/// Add a shard's candidates to `hist` for the search's next digit. `shard` holds layers
/// `first_layer .. first_layer + shard->layers` of the model (global layer numbering
/// decides ties). Every shard of one round counts with the same `search`, into an empty
/// histogram or one counted for the same round (else `KVE_ERR_INVALID_ARGUMENT`); the
/// histogram records the round and the layers counted. `params` must be
/// `kve_search_init`'s (else `KVE_ERR_INVALID_ARGUMENT`), the shard of the same `hkv`,
/// `n` and window and inside the model's layers (else `KVE_ERR_SHAPE_MISMATCH`). `hist`
/// and the workspace must not overlap the scores or any struct argument. Writes `hist`
/// (added to, not cleared) and the workspace.
#[no_mangle]
pub unsafe extern "C" fn kve_search_count_shard(
    params: *const kve_select_params,
    shard: *const kve_model_scores,
    first_layer: u64,
    search: *const kve_search,
    hist: *mut kve_histogram,
    workspace: *mut c_void,
    workspace_bytes: u64,
) -> i32 {
    // SAFETY: the caller's pointers, passed on; `count_shard` checks each (no links).
    unsafe {
        count_shard(
            params,
            shard,
            first_layer,
            search,
            None,
            hist,
            workspace,
            workspace_bytes,
        )
    }
}

/// `kve_search_count_shard` for the linked selection (`kve_select_model_linked`'s
/// forward post-pool carried on through linked positions): `links`, exactly `n` floats,
/// are the sums over EVERY layer of the model — each shard accumulates its own layers
/// with `kve_accumulate_value_links`, the caller adds the shards' sums — and every shard
/// of the search passes the same `links` and `link_threshold` to this and to
/// `kve_select_shard_linked`. Link rules as `kve_select_model_linked`'s: length
/// `KVE_ERR_SHAPE_MISMATCH`, NaN/Inf `KVE_ERR_NON_FINITE`, a post-pool other than
/// forward with decay 1 or a non-finite threshold `KVE_ERR_INVALID_ARGUMENT`. With one
/// shard holding every layer the lists are `kve_select_model_linked`'s. `links` must not
/// overlap `hist` or the workspace. Writes `hist` and the workspace; nothing on error.
#[no_mangle]
pub unsafe extern "C" fn kve_search_count_shard_linked(
    params: *const kve_select_params,
    shard: *const kve_model_scores,
    first_layer: u64,
    search: *const kve_search,
    links: *const f32,
    links_len: u64,
    link_threshold: f32,
    hist: *mut kve_histogram,
    workspace: *mut c_void,
    workspace_bytes: u64,
) -> i32 {
    // SAFETY: the caller's pointers, passed on; `count_shard` checks each.
    unsafe {
        count_shard(
            params,
            shard,
            first_layer,
            search,
            Some((links, links_len, link_threshold)),
            hist,
            workspace,
            workspace_bytes,
        )
    }
}

/// A shard's links argument checked: the buffer (NULL, alignment) and its length, `n`.
fn links_buf(links: Option<(*const f32, u64, f32)>, n: usize) -> Result<Option<Buf<f32>>> {
    match links {
        Some((p, len, _)) => {
            let b = Buf::new(p, len)?;
            if len != n as u64 {
                return Err(Error::ShapeMismatch);
            }
            Ok(Some(b))
        }
        None => Ok(None),
    }
}

/// The core's value links over a checked buffer.
///
/// # Safety
/// `b` was checked by [`links_buf`] and overlaps no output of the call.
unsafe fn value_links<'a>(
    b: &'a Option<Buf<f32>>,
    links: Option<(*const f32, u64, f32)>,
) -> Option<crate::ValueLinks<'a>> {
    match (b, links) {
        (Some(b), Some((_, _, threshold))) => {
            // SAFETY: the caller's contract (checked buffer, no output overlaps it).
            let sums = unsafe { b.slice() };
            Some(crate::ValueLinks { sums, threshold })
        }
        _ => None,
    }
}

/// `kve_search_count_shard` and its linked form.
///
/// # Safety
/// Each pointer is NULL or the caller's buffer of the stated length; all are checked here.
#[allow(clippy::too_many_arguments)]
unsafe fn count_shard(
    params: *const kve_select_params,
    shard: *const kve_model_scores,
    first_layer: u64,
    search: *const kve_search,
    links: Option<(*const f32, u64, f32)>,
    hist: *mut kve_histogram,
    workspace: *mut c_void,
    workspace_bytes: u64,
) -> i32 {
    // SAFETY: NULL or the caller's params; select_config checks NULL, alignment, struct_size.
    let cfg = tri!(unsafe { select_config(params) });
    // SAFETY: NULL or the caller's `kve_model_scores`; model checks it and its scores.
    let (sb, ms) = tri!(unsafe { model(shard) });
    // SAFETY: NULL or the caller's struct; `arg` checks NULL and alignment.
    let c = *tri!(unsafe { arg(search) });
    let st = tri!(from_c(&c));
    let lb = tri!(links_buf(links, ms.n));
    let mut h = tri!(out_param(hist));
    let mut ws = tri!(Buf::new(workspace as *const u8, workspace_bytes));
    tri!(check_alias(
        &[h.span, ws.span],
        &[
            sb.span,
            lb.as_ref().map_or(Span::EMPTY, |b| b.span),
            span_ptr(search),
            span_ptr(params),
            span_ptr(shard)
        ]
    ));
    // SAFETY: links_buf checked it; check_alias: no output overlaps it.
    let vl = unsafe { value_links(&lb, links) };
    // SAFETY: out_param checked `hist` non-NULL and aligned; check_alias: no input overlaps it.
    let mut v = unsafe { h.slice() }[0].to_core();
    // SAFETY: Buf::new checked the workspace; check_alias: it overlaps no input nor `hist`.
    let ws = unsafe { ws.slice_mut() };
    tri!(st.count_shard(&cfg, &ms, layer_of(first_layer), vl, &mut v, ws));
    write(&mut h, kve_histogram::from_core(&v));
    KVE_OK
}

/// `dst.bins[i] += src.bins[i]` (saturating), and the layers counted. The two must not
/// overlap (`KVE_ERR_ALIASING`) and, unless one is empty, be counted for the same round
/// (`KVE_ERR_INVALID_ARGUMENT`). Writes only `dst`.
#[no_mangle]
pub unsafe extern "C" fn kve_histogram_merge(
    dst: *mut kve_histogram,
    src: *const kve_histogram,
) -> i32 {
    let mut d = tri!(out_param(dst));
    // SAFETY: NULL or the caller's struct; `arg` checks NULL and alignment.
    let s = tri!(unsafe { arg(src) });
    let sspan = span_ptr(src);
    if d.span.overlaps(sspan) {
        return super::KVE_ERR_ALIASING;
    }
    // SAFETY: out_param checked `dst` non-NULL and aligned; the overlap test above: not `src`.
    let mut v = unsafe { d.slice() }[0].to_core();
    tri!(v.merge(&s.to_core()));
    write(&mut d, kve_histogram::from_core(&v));
    KVE_OK
}

/// Fix the next digit of the search from the histogram merged over every shard.
/// `*done` (may be NULL) becomes 1 when the threshold is known: then apply it with
/// `kve_select_shard`. At most 13 rounds, usually 4. While the search runs, `hist` must
/// be counted for its current round (else `KVE_ERR_INVALID_ARGUMENT`) over every layer
/// of the model exactly once (else `KVE_ERR_SHAPE_MISMATCH`); a finished search ignores
/// `hist`. Writes `*search` and `*done`.
#[no_mangle]
pub unsafe extern "C" fn kve_search_step(
    search: *mut kve_search,
    hist: *const kve_histogram,
    done: *mut i32,
) -> i32 {
    let mut so = tri!(out_param(search));
    // SAFETY: NULL or the caller's struct; `arg` checks NULL and alignment.
    let h = tri!(unsafe { arg(hist) });
    let d = if done.is_null() {
        None
    } else {
        Some(tri!(out_param(done)))
    };
    let hspan = span_ptr(hist);
    let dspan = d.as_ref().map_or(Span::EMPTY, |d| d.span);
    tri!(check_alias(&[so.span, dspan], &[hspan]));
    // SAFETY: out_param checked `search` non-NULL and aligned; check_alias: no input overlaps it.
    let c = unsafe { so.slice() }[0];
    let mut st = tri!(from_c(&c));
    let fin = tri!(st.step(&h.to_core()));
    write(&mut so, to_c(&st));
    if let Some(mut d) = d {
        write(&mut d, fin as i32);
    }
    KVE_OK
}

/// The threshold of a finished search as a (normalised) score: candidates scoring above
/// it are kept, ties at it are decided by position and unit. `-INFINITY` when every
/// candidate is kept, `+INFINITY` when none is. `KVE_ERR_INVALID_ARGUMENT` while the
/// search is running. Writes only `*score`.
#[no_mangle]
pub unsafe extern "C" fn kve_search_threshold(search: *const kve_search, score: *mut f32) -> i32 {
    let mut out = tri!(out_param(score));
    // SAFETY: NULL or the caller's struct; `arg` checks NULL and alignment.
    let st = tri!(from_c(tri!(unsafe { arg(search) })));
    tri!(check_alias(&[out.span], &[span_ptr(search)]));
    let v = tri!(st.threshold_score());
    write(&mut out, v);
    KVE_OK
}

/// Element counts always enough for `kve_select_shard`'s outputs: `layers*hkv + 1`
/// offsets and `layers*hkv*n` indices (the call accepts any `indices` that holds what it
/// keeps). Writes only the two out-parameters.
#[no_mangle]
pub unsafe extern "C" fn kve_select_shard_output_len(
    layers: u64,
    hkv: u64,
    n: u64,
    offsets_len: *mut u64,
    indices_len: *mut u64,
) -> i32 {
    let mut oo = tri!(out_param(offsets_len));
    let mut oi = tri!(out_param(indices_len));
    if oo.span.overlaps(oi.span) {
        return super::KVE_ERR_ALIASING;
    }
    let (l, h, n, _) = tri!(dims(layers, hkv, n, 0));
    let (a, b) = tri!(shard::shard_output_len(l, h, n));
    write(&mut oo, a as u64);
    write(&mut oi, b as u64);
    KVE_OK
}

/// Apply a finished search to a shard: the kept positions of its (layer, KV head) pairs
/// as CSR, exactly as `kve_select_model` would report them for those layers (offsets
/// count from this call's `indices`). `params` and the shard are checked against the
/// search as in `kve_search_count_shard`. Writes `offsets`, `indices` and the workspace.
#[no_mangle]
pub unsafe extern "C" fn kve_select_shard(
    params: *const kve_select_params,
    shard: *const kve_model_scores,
    first_layer: u64,
    search: *const kve_search,
    offsets: *mut u64,
    offsets_len: u64,
    indices: *mut u32,
    indices_len: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
) -> i32 {
    let outs = ShardOut {
        offsets,
        offsets_len,
        indices,
        indices_len,
        workspace,
        workspace_bytes,
    };
    // SAFETY: the caller's pointers, passed on; `select_shard` checks each (no links).
    unsafe { select_shard(params, shard, first_layer, search, None, &outs) }
}

/// `kve_select_shard` for the linked selection: `links` and `link_threshold` as given to
/// `kve_search_count_shard_linked` (the same rules and statuses). Writes `offsets`,
/// `indices` and the workspace; nothing on error.
#[no_mangle]
pub unsafe extern "C" fn kve_select_shard_linked(
    params: *const kve_select_params,
    shard: *const kve_model_scores,
    first_layer: u64,
    search: *const kve_search,
    links: *const f32,
    links_len: u64,
    link_threshold: f32,
    offsets: *mut u64,
    offsets_len: u64,
    indices: *mut u32,
    indices_len: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
) -> i32 {
    let outs = ShardOut {
        offsets,
        offsets_len,
        indices,
        indices_len,
        workspace,
        workspace_bytes,
    };
    let links = Some((links, links_len, link_threshold));
    // SAFETY: the caller's pointers, passed on; `select_shard` checks each.
    unsafe { select_shard(params, shard, first_layer, search, links, &outs) }
}

/// The outputs of `kve_select_shard` as passed.
struct ShardOut {
    offsets: *mut u64,
    offsets_len: u64,
    indices: *mut u32,
    indices_len: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
}

/// `kve_select_shard` and its linked form.
///
/// # Safety
/// Each pointer is NULL or the caller's buffer of the stated length; all are checked here.
unsafe fn select_shard(
    params: *const kve_select_params,
    shard: *const kve_model_scores,
    first_layer: u64,
    search: *const kve_search,
    links: Option<(*const f32, u64, f32)>,
    out: &ShardOut,
) -> i32 {
    // SAFETY: NULL or the caller's params; select_config checks NULL, alignment, struct_size.
    let cfg = tri!(unsafe { select_config(params) });
    // SAFETY: NULL or the caller's `kve_model_scores`; model checks it and its scores.
    let (sb, ms) = tri!(unsafe { model(shard) });
    // SAFETY: NULL or the caller's struct; `arg` checks NULL and alignment.
    let st = tri!(from_c(tri!(unsafe { arg(search) })));
    let lb = tri!(links_buf(links, ms.n));
    let mut o = tri!(Buf::new(out.offsets, out.offsets_len));
    let mut i = tri!(Buf::new(out.indices, out.indices_len));
    let mut ws = tri!(Buf::new(out.workspace as *const u8, out.workspace_bytes));
    tri!(check_alias(
        &[o.span, i.span, ws.span],
        &[
            sb.span,
            lb.as_ref().map_or(Span::EMPTY, |b| b.span),
            span_ptr(search),
            span_ptr(params),
            span_ptr(shard)
        ]
    ));
    // SAFETY: links_buf checked it; check_alias: no output overlaps it.
    let vl = unsafe { value_links(&lb, links) };
    // SAFETY: Buf::new checked the three; check_alias: they overlap no input nor each other.
    let (o, i, ws) = unsafe { (o.slice_mut(), i.slice_mut(), ws.slice_mut()) };
    to_status(st.select_shard(&cfg, &ms, layer_of(first_layer), vl, o, i, ws))
}
