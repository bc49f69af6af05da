//! The evictor (`src/evictor/`) for C: one object runs a whole model's eviction for
//! several sequences and holds the policy. Converts and checks, as the rest of the C layer.
//!
//! Flow: `kve_evictor_config_init` → set the model shape, `max_cells` and the policy →
//! `kve_evictor_size` → `kve_evictor_init` in the caller's memory → `kve_evictor_get_requirements`
//! (what to capture) → `kve_evictor_set_output_projection` per layer (LaProx) → per ubatch
//! `kve_evictor_observe_queries` per layer, then `kve_evictor_plan`; when the target is
//! below the cells held: `kve_evictor_begin` → (`kve_evictor_mark_cells`: the engine's
//! marks) → `kve_evictor_score_layer` per layer → `kve_evictor_select` → `kve_evictor_evicted_cells` / `kve_evictor_kept_cells` /
//! `kve_evictor_kept_lists` / `kve_evictor_compact` → `kve_evictor_commit`.
//!
//! The context (`kve_evictor*`) lives in the caller's memory and is only written by these
//! calls; on any error it is as it was (the workspace inside it aside). One call at a time
//! per context; contexts are independent. Device form: `kve_cuda_evictor_*`
//! (`src/capi/cuda/evictor.rs`): the same config, layer and stats structs, a stream.

use super::paged::{kve_paged_layout, PagedPool};
use super::params::{
    extensible, known_size, read_ext, score_config, select_config, write_ext, Extensible,
};
pub use super::round::{KVE_EVICTOR_ROUND_V1_SIZE, KVE_EVICTOR_ROUND_V2_SIZE};
use super::score::opt_floats;
use super::{
    check_alias, kve_score_params, kve_select_params, kve_tensor, out_param, span_ptr, span_sized,
    to_status, to_usize, tri, Buf, Span, Tensor, KVE_OK,
};
use crate::config::{Granularity, Preset};
use crate::error::{Error, Result};
use crate::evictor::presets::{preset_from_name, C_NAMES};
use crate::evictor::{
    cstr, Budget, Evictor, EvictorConfig, LayerViews, ModelDims, PagedLayerViews, Refusal, WoUse,
};
use crate::view::DType;
use core::ffi::{c_char, c_void};

/// The first released size of an extensible struct (`KVE_*_V1_SIZE`, its `sizeof`) and
/// its `Extensible` impl.
macro_rules! v1_size {
    ($t:ty, $name:ident = $size:literal) => {
        #[doc = concat!("`sizeof(", stringify!($t), ")` of the first release.")]
        pub const $name: u32 = $size;
        extensible!($t: [$name]);
    };
}

/// An evictor's context: a pointer into the memory given to `kve_evictor_init`.
pub struct kve_evictor {
    _opaque: [u8; 0],
}

/// `kve_evictor_config.granularity`: the preset's (or `select`'s) granularity.
pub const KVE_EVICTOR_PRESET_GRANULARITY: u32 = u32::MAX;
/// `kve_evictor_config.policy`: the engine passes its own targets to `kve_evictor_begin`.
pub const KVE_POLICY_EXPLICIT: u32 = 0;
/// Keep `max(floor(new * keep_ratio), min_keep)` of the cells new since the last
/// compression (the window inside); earlier kept cells are never compressed again.
pub const KVE_POLICY_KEEP_RATIO: u32 = 1;
/// Past `high` cells, evict down to `low` (over all cells).
pub const KVE_POLICY_CELLS: u32 = 2;

/// What an evictor runs (fill with `kve_evictor_config_init`, then set the shape,
/// `max_cells` and the policy). Extensible: `struct_size` is `KVE_EVICTOR_CONFIG_V1_SIZE`
/// or `KVE_EVICTOR_CONFIG_V2_SIZE` (`paged`, `paged_dtype`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kve_evictor_config {
    pub struct_size: u32,
    /// `KVE_PRESET_*` (`kve_preset_from_name` maps a name).
    pub preset: u32,
    /// The observation window; 0: the preset's (or `score`'s).
    pub window: u32,
    /// `KVE_GRANULARITY_*`, or `KVE_EVICTOR_PRESET_GRANULARITY`. Engines whose cells are
    /// shared by every head (llama.cpp, paged caches) want `KVE_GRANULARITY_TOKEN`.
    pub granularity: u32,
    // each pointer sits before a u64, so it takes 8 bytes on 32-bit targets too and the
    // layout (and KVE_EVICTOR_CONFIG_V1_SIZE) is the same on every target
    /// Optional (NULL: the preset's): scoring; `window` still overrides its window.
    pub score: *const kve_score_params,
    pub layers: u64,
    /// Optional (NULL: the preset's): selection; its budget is replaced by the policy's.
    pub select: *const kve_select_params,
    pub hq: u64,
    pub hkv: u64,
    pub dk: u64,
    pub dv: u64,
    /// Columns of `Wo`, for the methods that read it (`kve_evictor_get_requirements`).
    pub d_model: u64,
    /// Most cells a sequence holds when it is scored.
    pub max_cells: u64,
    /// Sequence slots, each with its own state (`seq` arguments are `0..max_seqs`).
    pub max_seqs: u64,
    /// `KVE_POLICY_*`.
    pub policy: u32,
    /// Value links at this threshold (0: off; 0.5 is `kve_select_model_linked`'s); needs
    /// a flat forward post-pool (the laprox-span and uniqueness selections).
    pub link_threshold: f32,
    /// `KVE_POLICY_KEEP_RATIO`: in [0, 1].
    pub keep_ratio: f64,
    /// `KVE_POLICY_KEEP_RATIO`: the fewest new cells a compression keeps (default 64).
    pub min_keep: u64,
    /// `KVE_POLICY_CELLS`: `1 <= low <= high`; `low = 0` means `high - high/8`.
    pub high: u64,
    pub low: u64,
    /// Since `KVE_EVICTOR_CONFIG_V2_SIZE`: 1 when K/V come through paged views
    /// (`kve_evictor_score_layer_paged`, `kve_evictor_compact_paged`); the context then
    /// also holds one layer's K (and V) gathered from the pool (`kve_evictor_size` grows
    /// by `Hkv * max_cells * (dk + dv) * sizeof(paged_dtype)`). 0: strided views only.
    pub paged: u32,
    /// With `paged`: the largest `KVE_DTYPE_*` of the pools (default `KVE_DTYPE_F32`).
    pub paged_dtype: u32,
}

/// `sizeof(kve_evictor_config)` of the first release (no `paged`).
pub const KVE_EVICTOR_CONFIG_V1_SIZE: u32 = 136;
/// `sizeof(kve_evictor_config)` with `paged` and `paged_dtype`.
pub const KVE_EVICTOR_CONFIG_V2_SIZE: u32 = 144;
extensible!(kve_evictor_config: [KVE_EVICTOR_CONFIG_V1_SIZE, KVE_EVICTOR_CONFIG_V2_SIZE]);

/// One layer's tensors for the round's `n` cells (fill with `kve_evictor_layer_init`:
/// every tensor absent). A tensor with `data == NULL` is absent.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kve_evictor_layer {
    pub struct_size: u32,
    /// Must be 0.
    pub reserved: u32,
    /// `[Hkv, n, dk]`, required.
    pub keys: kve_tensor,
    /// `[Hkv, n, dv]`, when the method reads values.
    pub values: kve_tensor,
    /// `[Hq, wq, dk]`, the last `wq >= min(window, n)` positions; absent: the rows
    /// `kve_evictor_observe_queries` kept.
    pub queries: kve_tensor,
    /// Optional `[Hq][min(window, n)]` window row log-sum-exp (`kve_layer_inputs.row_lse`).
    pub row_lse: *const f32,
    pub row_lse_len: u64,
    /// `[Hq, dv, D]`, when `kve_evictor_get_requirements` says `KVE_WO_EVERY_ROUND`.
    pub wo: kve_tensor,
}

v1_size!(kve_evictor_layer, KVE_EVICTOR_LAYER_V1_SIZE = 312);

/// `kve_evictor_requirements.wo`: the method reads no `Wo`.
pub const KVE_WO_NONE: u32 = 0;
/// Once per layer, by `kve_evictor_set_output_projection` (LaProx's Gram blocks).
pub const KVE_WO_ONCE: u32 = 1;
/// With every `kve_evictor_score_layer` (`kve_evictor_layer.wo`, CriticalKV).
pub const KVE_WO_EVERY_ROUND: u32 = 2;
const _: () = assert!(
    WoUse::None as u32 == KVE_WO_NONE
        && WoUse::Once as u32 == KVE_WO_ONCE
        && WoUse::EveryRound as u32 == KVE_WO_EVERY_ROUND
);

/// What an engine captures for the configured method (flags are 0 or 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct kve_evictor_requirements {
    pub struct_size: u32,
    /// Window queries (given per layer or observed into the context).
    pub queries: u32,
    pub values: u32,
    /// `KVE_WO_*`.
    pub wo: u32,
    /// A window row log-sum-exp spares one pass over K.
    pub row_lse_helps: u32,
    /// The observation window: the last `window` cells are always kept.
    pub window: u32,
    /// `KVE_GRANULARITY_*` of the kept sets.
    pub granularity: u32,
}

v1_size!(
    kve_evictor_requirements,
    KVE_EVICTOR_REQUIREMENTS_V1_SIZE = 28
);

/// A sequence's counters.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct kve_evictor_stats {
    pub struct_size: u32,
    /// 1 when the last commit left per-head sets of different lengths: the sequence takes
    /// no further round until `kve_evictor_seq_reset`.
    pub ragged: u32,
    /// Cells held after the last commit.
    pub cells: u64,
    /// Cells the keep ratio never compresses again.
    pub protected_cells: u64,
    pub evictions: u64,
    pub cells_evicted: u64,
}

v1_size!(kve_evictor_stats, KVE_EVICTOR_STATS_V1_SIZE = 40);

/// The number of presets; `kve_preset_name(0 .. count - 1)` lists them.
#[no_mangle]
pub extern "C" fn kve_preset_count() -> u32 {
    C_NAMES.len() as u32
}

/// The name of preset `preset` (`KVE_PRESET_*`), e.g. `"laprox-span"`: a static string;
/// NULL for an unknown preset.
#[no_mangle]
pub extern "C" fn kve_preset_name(preset: u32) -> *const c_char {
    match C_NAMES.get(preset as usize) {
        Some(n) => n.as_ptr() as *const c_char,
        None => core::ptr::null(),
    }
}

/// The preset called `name` (NUL-terminated, exact: `kve_preset_name`'s spelling) into
/// `*preset`. Unknown names give `KVE_ERR_BAD_ENUM`. Reads at most 32 bytes of `name`.
#[no_mangle]
pub unsafe extern "C" fn kve_preset_from_name(name: *const c_char, preset: *mut u32) -> i32 {
    let mut out = tri!(out_param(preset));
    if name.is_null() {
        return super::KVE_ERR_NULL_POINTER;
    }
    let mut len = 0;
    // SAFETY: `name` is a NUL-terminated string (the caller's contract); reading stops at
    // its NUL or after 32 bytes.
    while len < 32 && unsafe { *name.add(len) } != 0 {
        len += 1;
    }
    // SAFETY: the `len` bytes just read.
    let bytes = unsafe { core::slice::from_raw_parts(name as *const u8, len) };
    let p = tri!(preset_from_name(bytes));
    tri!(check_alias(
        &[out.span],
        &[Span(name as usize, name as usize + len + 1)]
    ));
    // SAFETY: out_param checked it; one element.
    unsafe { out.slice_mut()[0] = p as u32 };
    KVE_OK
}

fn default_config(preset: Preset) -> kve_evictor_config {
    kve_evictor_config {
        struct_size: KVE_EVICTOR_CONFIG_V2_SIZE,
        preset: preset as u32,
        window: 0,
        granularity: KVE_EVICTOR_PRESET_GRANULARITY,
        layers: 0,
        hq: 0,
        hkv: 0,
        dk: 0,
        dv: 0,
        d_model: 0,
        max_cells: 0,
        max_seqs: 1,
        policy: KVE_POLICY_EXPLICIT,
        link_threshold: 0.0,
        keep_ratio: 1.0,
        min_keep: crate::evictor::options::MIN_KEEP,
        high: 0,
        low: 0,
        score: core::ptr::null(),
        select: core::ptr::null(),
        paged: 0,
        paged_dtype: DType::F32 as u32,
    }
}

/// Fill `config` for a preset: its window, granularity and selection, no links, one
/// sequence, `KVE_POLICY_EXPLICIT`, `min_keep` 64; the model shape and `max_cells` are 0
/// (to be set). Writes only `config` (`struct_size` bytes).
#[no_mangle]
pub unsafe extern "C" fn kve_evictor_config_init(
    config: *mut kve_evictor_config,
    struct_size: u32,
    preset: u32,
) -> i32 {
    let p = tri!(Preset::from_u32(preset));
    // SAFETY: the caller passes NULL or `struct_size` writable bytes; write_ext checks the rest.
    to_status(unsafe {
        write_ext(
            config,
            struct_size,
            KVE_EVICTOR_CONFIG_V1_SIZE,
            default_config(p),
        )
    })
}

/// The core's configuration from the C one, and the spans it was read from.
pub(crate) unsafe fn evictor_config(
    p: *const kve_evictor_config,
) -> Result<(EvictorConfig, [Span; 3])> {
    let d = default_config(Preset::SnapKv);
    // SAFETY: NULL or the caller's struct; read_ext checks NULL, alignment, struct_size.
    let c = unsafe { read_ext(p, KVE_EVICTOR_CONFIG_V1_SIZE, d)? };
    let size = |v: u64| to_usize(v);
    let budget = match c.policy {
        KVE_POLICY_EXPLICIT => Budget::Explicit,
        KVE_POLICY_KEEP_RATIO => Budget::KeepRatio {
            ratio: c.keep_ratio,
            min_keep: c.min_keep,
        },
        KVE_POLICY_CELLS if c.low == 0 => Budget::cells(c.high),
        KVE_POLICY_CELLS => Budget::Cells {
            high: c.high,
            low: c.low,
        },
        _ => return Err(Error::BadEnum),
    };
    let cfg = EvictorConfig {
        preset: Preset::from_u32(c.preset)?,
        score: match c.score.is_null() {
            true => None,
            // SAFETY: the caller's params; score_config checks alignment and struct_size.
            false => Some(unsafe { score_config(c.score)? }),
        },
        select: match c.select.is_null() {
            true => None,
            // SAFETY: the caller's params; select_config checks alignment and struct_size.
            false => Some(unsafe { select_config(c.select)? }),
        },
        window: c.window,
        granularity: match c.granularity {
            KVE_EVICTOR_PRESET_GRANULARITY => None,
            g => Some(Granularity::from_u32(g)?),
        },
        link_threshold: (c.link_threshold != 0.0).then_some(c.link_threshold),
        model: ModelDims {
            layers: size(c.layers)?,
            hq: size(c.hq)?,
            hkv: size(c.hkv)?,
            dk: size(c.dk)?,
            dv: size(c.dv)?,
            d_model: size(c.d_model)?,
        },
        max_cells: size(c.max_cells)?,
        max_seqs: size(c.max_seqs)?,
        budget,
        paged: match c.paged {
            0 => None,
            1 => Some(DType::from_u32(c.paged_dtype)?),
            _ => return Err(Error::InvalidArgument),
        },
    };
    Ok((cfg, [span_ptr(p), span_ptr(c.score), span_ptr(c.select)]))
}

/// Bytes of memory `kve_evictor_init` needs for `config` (any alignment; 63 bytes of
/// slack included). Writes only `*bytes`.
#[no_mangle]
pub unsafe extern "C" fn kve_evictor_size(
    config: *const kve_evictor_config,
    bytes: *mut u64,
) -> i32 {
    let mut out = tri!(out_param(bytes));
    // SAFETY: NULL or the caller's config; evictor_config checks it.
    let (cfg, spans) = tri!(unsafe { evictor_config(config) });
    tri!(check_alias(&[out.span], &spans));
    let size = tri!(Evictor::memory_size(&cfg));
    // SAFETY: out_param checked it; one element.
    unsafe { out.slice_mut()[0] = size as u64 };
    KVE_OK
}

/// The optional `const char **message` of the calls that say why they refuse.
struct Message(Option<Buf<*const c_char>>);

impl Message {
    fn new(message: *mut *const c_char) -> Result<Message> {
        Ok(Message(match message.is_null() {
            true => None,
            false => Some(out_param(message)?),
        }))
    }

    fn span(&self) -> Span {
        self.0.as_ref().map_or(Span::EMPTY, |m| m.span)
    }

    /// `why` into `*message` (when given), and `status`.
    fn answer(&mut self, status: i32, why: *const c_char) -> i32 {
        if let Some(m) = self.0.as_mut() {
            // SAFETY: out_param checked it; one element.
            unsafe { m.slice_mut()[0] = why };
        }
        status
    }
}

/// The `bytes` bytes at `p`, or nothing for NULL (an optional extensible out-struct).
fn optional_span<T>(p: *const T, bytes: u32) -> Span {
    match p.is_null() {
        true => Span::EMPTY,
        false => span_sized(p, bytes),
    }
}

/// Check `config` as `kve_evictor_size` and `kve_evictor_init` do, without memory, and
/// say why it is refused: returns the status they return. On `KVE_OK` writes what the
/// method reads into `requirements` (when not NULL: `requirements_size` bytes, as
/// `kve_evictor_get_requirements`; a bad size is its status, nothing else written) and
/// NULL into `*message` (when not NULL). On a refusal writes only `*message` (when not
/// NULL): a static NUL-terminated sentence naming what to change, for an engine's startup
/// error.
#[no_mangle]
pub unsafe extern "C" fn kve_evictor_config_check(
    config: *const kve_evictor_config,
    requirements: *mut kve_evictor_requirements,
    requirements_size: u32,
    message: *mut *const c_char,
) -> i32 {
    let mut msg = tri!(Message::new(message));
    let outs = [msg.span(), optional_span(requirements, requirements_size)];
    // SAFETY: NULL or the caller's config; evictor_config checks it.
    let checked = match unsafe { evictor_config(config) } {
        Ok((cfg, spans)) => {
            tri!(check_alias(&outs, &spans));
            Evictor::check(&cfg)
        }
        Err(error) => Err(Refusal {
            error,
            why: match error {
                Error::NullPointer => cstr!("config is NULL"),
                Error::BadEnum => cstr!("an enum field (preset, policy, granularity, paged_dtype) is unknown"),
                _ => cstr!("the config cannot be read (struct_size, alignment, score or select parameters, paged)"),
            },
        }),
    };
    let (status, why) = match checked {
        Ok(needs) if !requirements.is_null() => {
            // SAFETY: `requirements_size` writable bytes (the caller's contract); checked there.
            let st = unsafe { write_requirements(needs, requirements, requirements_size) };
            if st != KVE_OK {
                return st;
            }
            (KVE_OK, core::ptr::null())
        }
        Ok(_) => (KVE_OK, core::ptr::null()),
        Err(r) => (to_status(Err(r.error)), r.why.as_ptr()),
    };
    msg.answer(status, why)
}

/// `kve_evictor_options.flags`: the engine cannot give `Wo` with every round: methods that
/// read it so (criticalkv) are refused and left out of its method list.
pub const KVE_OPTIONS_NO_WO_EVERY_ROUND: u32 = 1;
/// `kve_evictor_options.flags`: the engine's cells are shared by every head (llama.cpp,
/// paged caches): the config gets `KVE_GRANULARITY_TOKEN`.
pub const KVE_OPTIONS_TOKEN_CELLS: u32 = 2;
/// The largest `kve_evictor_options.window`.
pub const KVE_OPTIONS_MAX_WINDOW: u32 = crate::evictor::options::MAX_WINDOW;

/// An engine's eviction options, as its user gives them (command-line flags), for
/// `kve_evictor_options_apply`. Zero-fill it, then set `struct_size`
/// (`KVE_EVICTOR_OPTIONS_V1_SIZE`) and what the user gave.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kve_evictor_options {
    pub struct_size: u32,
    /// `KVE_OPTIONS_*`.
    pub flags: u32,
    /// The method: `kve_preset_name`'s spelling, NUL-terminated; NULL or "": laprox-span.
    pub method: *const c_char,
    /// The cell budget per sequence (0: off): past it, down to
    /// `floor(max_cells * evict_to)`, which must exceed the window.
    pub max_cells: u64,
    /// The observation window (0: the method's), at most `KVE_OPTIONS_MAX_WINDOW`.
    pub window: u32,
    /// Value links at this threshold, at most 1 (0 or negative: off).
    pub link_threshold: f32,
    /// The keep ratio of what is new since the last compression, in (0, 1] (0: off).
    pub keep_ratio: f64,
    /// With `max_cells`: in (0, 1).
    pub evict_to: f64,
}

v1_size!(kve_evictor_options, KVE_EVICTOR_OPTIONS_V1_SIZE = 48);

/// The ", "-separated names of every preset (`flags` 0) or of those an engine with
/// `flags` (`KVE_OPTIONS_NO_WO_EVERY_ROUND`) may run: a static NUL-terminated string, for
/// an engine's `--help` and messages.
#[no_mangle]
pub extern "C" fn kve_preset_list(flags: u32) -> *const c_char {
    crate::evictor::options::method_list(flags & KVE_OPTIONS_NO_WO_EVERY_ROUND != 0).as_ptr()
}

/// Read an engine's eviction options into an evictor config, and check them: the method
/// (none: laprox-span), the policy (`KVE_POLICY_KEEP_RATIO` when `keep_ratio` is set,
/// else `KVE_POLICY_CELLS` when `max_cells` is, else `KVE_POLICY_EXPLICIT`; `high` and
/// `low` are set whenever `max_cells` is), the window, the value links, the granularity
/// (`KVE_OPTIONS_TOKEN_CELLS`); then as `kve_evictor_config_check` on a one-cell model.
/// On `KVE_OK` writes `*config` (`config_size` bytes; its model shape, `max_cells` 1 and
/// `max_seqs` 1 are for the engine to set), the method's requirements (when
/// `requirements` is not NULL, as `kve_evictor_config_check`) and NULL into `*message`
/// (when not NULL). On a refusal writes only `*message` (when not NULL): a static
/// sentence naming what to change (an unknown method's lists the known ones).
#[no_mangle]
pub unsafe extern "C" fn kve_evictor_options_apply(
    options: *const kve_evictor_options,
    config: *mut kve_evictor_config,
    config_size: u32,
    requirements: *mut kve_evictor_requirements,
    requirements_size: u32,
    message: *mut *const c_char,
) -> i32 {
    use crate::evictor::options::{from_options, Options};
    let mut msg = tri!(Message::new(message));
    let zero = kve_evictor_options {
        struct_size: KVE_EVICTOR_OPTIONS_V1_SIZE,
        flags: 0,
        method: core::ptr::null(),
        max_cells: 0,
        window: 0,
        link_threshold: 0.0,
        keep_ratio: 0.0,
        evict_to: 0.0,
    };
    // SAFETY: NULL or the caller's struct; read_ext checks NULL, alignment, struct_size.
    let o = tri!(unsafe { read_ext(options, KVE_EVICTOR_OPTIONS_V1_SIZE, zero) });
    let mut len = 0;
    // SAFETY: NULL or a NUL-terminated string (the caller's contract); reading stops at its
    // NUL or after 32 bytes (no preset name is that long: unknown).
    while !o.method.is_null() && len < 33 && unsafe { *o.method.add(len) } != 0 {
        len += 1;
    }
    let name = match o.method.is_null() {
        true => &[][..],
        // SAFETY: the `len` bytes just read.
        false => unsafe { core::slice::from_raw_parts(o.method as *const u8, len) },
    };
    let outs = [
        msg.span(),
        span_sized(config, config_size),
        optional_span(requirements, requirements_size),
    ];
    let ins = [
        span_sized(options, o.struct_size),
        Span(
            o.method as usize,
            o.method as usize + len + !o.method.is_null() as usize,
        ),
    ];
    tri!(check_alias(&outs, &ins));
    let opts = Options {
        method: name,
        window: o.window,
        keep_ratio: o.keep_ratio,
        max_cells: o.max_cells,
        evict_to: o.evict_to,
        link_threshold: o.link_threshold,
        no_wo_every_round: o.flags & KVE_OPTIONS_NO_WO_EVERY_ROUND != 0,
        token_cells: o.flags & KVE_OPTIONS_TOKEN_CELLS != 0,
    };
    let known = KVE_OPTIONS_NO_WO_EVERY_ROUND | KVE_OPTIONS_TOKEN_CELLS;
    let why = match (o.flags & !known, from_options(&opts)) {
        (0, Ok(ch)) => {
            let mut c = default_config(ch.config.preset);
            c.window = ch.config.window;
            c.granularity = ch.config.granularity.map_or(c.granularity, |g| g as u32);
            c.link_threshold = ch.config.link_threshold.unwrap_or(0.0);
            c.max_cells = 1;
            (c.layers, c.hq, c.hkv, c.dk, c.dv, c.d_model) = (1, 1, 1, 1, 1, 1);
            c.policy = match ch.config.budget {
                Budget::KeepRatio { ratio, .. } => {
                    c.keep_ratio = ratio;
                    KVE_POLICY_KEEP_RATIO
                }
                Budget::Cells { .. } => KVE_POLICY_CELLS,
                Budget::Explicit => KVE_POLICY_EXPLICIT,
            };
            (c.high, c.low) = ch.cells.unwrap_or((0, 0));
            // both sizes first: on an error nothing is written
            tri!(known_size::<kve_evictor_config>(
                config_size,
                KVE_EVICTOR_CONFIG_V1_SIZE
            ));
            if !requirements.is_null() {
                let first = KVE_EVICTOR_REQUIREMENTS_V1_SIZE;
                tri!(known_size::<kve_evictor_requirements>(
                    requirements_size,
                    first
                ));
            }
            // SAFETY: NULL or `config_size` writable bytes (the caller's contract); checked there.
            tri!(unsafe { write_ext(config, config_size, KVE_EVICTOR_CONFIG_V1_SIZE, c) });
            if !requirements.is_null() {
                // SAFETY: `requirements_size` writable bytes (the caller's contract).
                let st = unsafe { write_requirements(ch.needs, requirements, requirements_size) };
                if st != KVE_OK {
                    return st;
                }
            }
            Ok(core::ptr::null())
        }
        (0, Err(r)) => Err((r.error, r.why.as_ptr())),
        (_, _) => Err((
            Error::InvalidArgument,
            cstr!("unknown option flags").as_ptr(),
        )),
    };
    let (status, why) = match why {
        Ok(p) => (KVE_OK, p),
        Err((e, p)) => (to_status(Err(e)), p),
    };
    msg.answer(status, why)
}

/// An engine's in-graph query ring (per sequence `window` rows `seq * window + slot`, then
/// one scratch row `n_seqs * window`): the row each of a ubatch's `n_tokens` queries is
/// written to, into `rows` (`rows_len >= n_tokens`). Token `i` belongs to sequence
/// `seq_of[i]` (`0 .. n_seqs`; anything else: the scratch row); `counts[s]` (`n_seqs`
/// of them) holds the queries of `s` written so far and is advanced. A token that a later
/// token of its sequence in the same ubatch overwrites goes to the scratch row, so no two
/// rows of one write collide and the ring holds each sequence's last `window` queries:
/// the `k`-th in slot `k % window`, the last `w` starting at slot `(counts[s] - w) %
/// window`. `window >= 1` (else `KVE_ERR_INVALID_ARGUMENT`). Writes `rows` and `counts`.
#[no_mangle]
pub unsafe extern "C" fn kve_query_ring_rows(
    counts: *mut u64,
    n_seqs: u64,
    window: u32,
    seq_of: *const i32,
    n_tokens: u64,
    rows: *mut i64,
    rows_len: u64,
) -> i32 {
    let mut c = tri!(Buf::new(counts, n_seqs));
    let s = tri!(Buf::new(seq_of, n_tokens));
    let mut r = tri!(Buf::new(rows, rows_len));
    tri!(check_alias(&[c.span, r.span], &[s.span]));
    // SAFETY: Buf::new checked the three; check_alias: the outputs overlap nothing else.
    let (c, s, r) = unsafe { (c.slice_mut(), s.slice(), r.slice_mut()) };
    to_status(crate::evictor::qring::ring_rows(c, window, s, r))
}

/// Start an evictor in `memory` (`bytes` from `kve_evictor_size`, any alignment) and
/// set `*evictor` to it: a pointer into `memory`, valid while the caller keeps the
/// memory and does not write it. No teardown: the caller frees `memory`. Writes
/// `memory` and `*evictor` only on success.
#[no_mangle]
pub unsafe extern "C" fn kve_evictor_init(
    memory: *mut c_void,
    bytes: u64,
    config: *const kve_evictor_config,
    evictor: *mut *mut kve_evictor,
) -> i32 {
    let mut out = tri!(out_param(evictor));
    let mut mem = tri!(Buf::new(memory as *const u8, bytes));
    // SAFETY: NULL or the caller's config; evictor_config checks it.
    let (cfg, spans) = tri!(unsafe { evictor_config(config) });
    tri!(check_alias(&[out.span, mem.span], &spans));
    // SAFETY: Buf::new checked the memory; check_alias: it overlaps no input nor output.
    let mut ev = tri!(Evictor::init(unsafe { mem.slice_mut() }, &cfg));
    // SAFETY: out_param checked it; one element.
    unsafe { out.slice_mut()[0] = ev.as_ptr() as *mut kve_evictor };
    KVE_OK
}

/// The evictor at `ev`, and its context's span.
unsafe fn attach<'a>(ev: *const kve_evictor) -> Result<(Evictor<'a>, Span)> {
    // SAFETY: NULL, or a context kve_evictor_init returned (the caller's contract);
    // from_block checks NULL, alignment and the magic.
    let e = unsafe { Evictor::from_block(ev as *mut u8)? };
    let (a, b) = e.byte_range();
    Ok((e, Span(a, b)))
}

/// `f` (commit, reset, unprotect: a sequence and nothing more) on sequence `seq` of the
/// context, its status.
///
/// # Safety
/// `ev` as [`attach`]'s.
unsafe fn on_seq<'a>(
    ev: *const kve_evictor,
    seq: u64,
    f: fn(&mut Evictor<'a>, usize) -> Result<()>,
) -> i32 {
    // SAFETY: the caller's context; attach checks it.
    let (mut e, _) = tri!(unsafe { attach(ev) });
    to_status(f(&mut e, tri!(to_usize(seq))))
}

/// A scoring call's context and layer struct: the context attached, the struct read
/// (`read_ext`: NULL, alignment, `struct_size`), its `reserved` field 0 (else
/// `InvalidArgument`).
///
/// # Safety
/// `ev` as [`attach`]'s; `views` NULL or the caller's struct.
unsafe fn layer_call<'a, T: Extensible>(
    ev: *const kve_evictor,
    views: *const T,
    first: u32,
    defaults: T,
    reserved: fn(&T) -> u32,
) -> Result<(Evictor<'a>, Span, T)> {
    // SAFETY: the caller's context; attach checks it.
    let (e, ctx) = unsafe { attach(ev)? };
    // SAFETY: NULL or the caller's struct; read_ext checks NULL, alignment, struct_size.
    let l = unsafe { read_ext(views, first, defaults)? };
    if reserved(&l) != 0 {
        return Err(Error::InvalidArgument);
    }
    Ok((e, ctx, l))
}

/// Write what an engine captures for `evictor`'s method into `out` (`struct_size`
/// bytes: `KVE_EVICTOR_REQUIREMENTS_V1_SIZE`).
#[no_mangle]
pub unsafe extern "C" fn kve_evictor_get_requirements(
    evictor: *const kve_evictor,
    out: *mut kve_evictor_requirements,
    struct_size: u32,
) -> i32 {
    // SAFETY: the caller's context; attach checks it.
    let (ev, ctx) = tri!(unsafe { attach(evictor) });
    tri!(check_alias(&[span_sized(out, struct_size)], &[ctx]));
    // SAFETY: NULL or `struct_size` writable bytes (the caller's contract).
    unsafe { write_requirements(ev.needs(), out, struct_size) }
}

/// `needs` into the caller's `out` (`struct_size` bytes), as a status.
pub(crate) unsafe fn write_requirements(
    n: crate::evictor::Needs,
    out: *mut kve_evictor_requirements,
    struct_size: u32,
) -> i32 {
    let v = kve_evictor_requirements {
        struct_size,
        queries: n.capture.queries as u32,
        values: n.capture.values as u32,
        wo: n.capture.wo as u32,
        row_lse_helps: n.capture.row_lse_helps as u32,
        window: n.window,
        granularity: n.granularity as u32,
    };
    // SAFETY: NULL or `struct_size` writable bytes; write_ext checks the rest.
    to_status(unsafe { write_ext(out, struct_size, KVE_EVICTOR_REQUIREMENTS_V1_SIZE, v) })
}

/// `f`'s answer on the evictor at `evictor` into `*out` (not in the context), written
/// only on success.
unsafe fn answer(
    evictor: *mut kve_evictor,
    out: *mut u64,
    f: impl FnOnce(&mut Evictor) -> Result<usize>,
) -> i32 {
    let mut o = tri!(out_param(out));
    // SAFETY: the caller's context; attach checks it.
    let (mut ev, ctx) = tri!(unsafe { attach(evictor) });
    tri!(check_alias(&[o.span, ctx], &[]));
    let v = tri!(f(&mut ev));
    // SAFETY: out_param checked it; one element.
    unsafe { o.slice_mut()[0] = v as u64 };
    KVE_OK
}

/// A view of a required tensor argument; neither it nor its descriptor may overlap the
/// context.
unsafe fn input<'a>(p: *const kve_tensor, ctx: Span) -> Result<crate::View<'a>> {
    check_alias(&[ctx], &[span_ptr(p)])?;
    // SAFETY: NULL or the caller's descriptor; from_ptr checks it.
    let t = unsafe { Tensor::from_ptr(p)? };
    check_alias(&[ctx], &[t.span])?;
    // SAFETY: checked by Tensor::new; the context (the only output) does not overlap it.
    unsafe { t.view() }
}

/// Set `layer`'s output projection `wo` (`[Hq, dv, D]`) for a method with
/// `KVE_WO_ONCE`: its Gram blocks go into the context; `wo` may be freed after.
/// Other methods: `KVE_ERR_INVALID_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn kve_evictor_set_output_projection(
    evictor: *mut kve_evictor,
    layer: u64,
    wo: *const kve_tensor,
) -> i32 {
    // SAFETY: the caller's context; attach checks it.
    let (mut ev, ctx) = tri!(unsafe { attach(evictor) });
    // SAFETY: the caller's descriptor; `input` checks it.
    let wo = tri!(unsafe { input(wo, ctx) });
    to_status(ev.set_output_projection(tri!(to_usize(layer)), &wo))
}

/// Keep the last `window` of the query rows `queries` (`[Hq, c, dk]`: this ubatch's rows
/// of sequence `seq` at `layer`, in position order, any dtype and strides) in the
/// context, so the engine need not keep window queries. Methods without queries:
/// `KVE_ERR_INVALID_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn kve_evictor_observe_queries(
    evictor: *mut kve_evictor,
    seq: u64,
    layer: u64,
    queries: *const kve_tensor,
) -> i32 {
    // SAFETY: the caller's context; attach checks it.
    let (mut ev, ctx) = tri!(unsafe { attach(evictor) });
    // SAFETY: the caller's descriptor; `input` checks it.
    let q = tri!(unsafe { input(queries, ctx) });
    to_status(ev.observe_queries(tri!(to_usize(seq)), tri!(to_usize(layer)), &q))
}

/// The policy: `*target` = the cells sequence `seq` should hold now that it holds
/// `n_cells` (`n_cells`: nothing to do). Changes nothing; ask after every ubatch.
#[no_mangle]
pub unsafe extern "C" fn kve_evictor_plan(
    evictor: *mut kve_evictor,
    seq: u64,
    n_cells: u64,
    target: *mut u64,
) -> i32 {
    // SAFETY: the caller's pointers; `answer` checks them.
    unsafe {
        answer(evictor, target, |ev| {
            ev.plan(to_usize(seq)?, to_usize(n_cells)?)
        })
    }
}

/// Start a round on sequence `seq`, whose cells are `0 .. n_cells - 1` in position
/// order (`n_cells <= max_cells`), to end holding `target` cells (`kve_evictor_plan`'s
/// or the engine's; raised to the window and, with the keep ratio, the protected
/// cells). A round in progress on `seq` is abandoned.
#[no_mangle]
pub unsafe extern "C" fn kve_evictor_begin(
    evictor: *mut kve_evictor,
    seq: u64,
    n_cells: u64,
    target: u64,
) -> i32 {
    // SAFETY: the caller's context; attach checks it.
    let (mut ev, _) = tri!(unsafe { attach(evictor) });
    let s = tri!(to_usize(seq));
    to_status(ev.begin(s, tri!(to_usize(n_cells)), tri!(to_usize(target))))
}

/// The share of the kept cells an engine reserves for marked cells by default
/// (`kve_evictor_mark_cells`), chosen on the conversation benchmark's dev split.
pub const KVE_MARK_SHARE_DEFAULT: f32 = 0.75;
const _: () = assert!(KVE_MARK_SHARE_DEFAULT == crate::evictor::MARK_SHARE);
/// `kve_evictor_round`'s `mark_split`: one selection over the marked cells (the default).
pub const KVE_MARK_SPLIT_SHARE: u32 = 0;
/// `kve_evictor_round`'s `mark_split`: the marked cells' budget split evenly over their
/// spans (each mark range's cells, a user turn each; by flags, each run of consecutive
/// cells with the same nonzero flag), one selection per span.
pub const KVE_MARK_SPLIT_SPANS: u32 = 1;

/// Mark cells of sequence `seq`'s begun round (after `kve_evictor_begin`, before
/// `kve_evictor_select`): `flags[i] != 0` marks cell `i`, for the round's `n_cells` cells
/// (`n_flags` must equal it: `KVE_ERR_SHAPE_MISMATCH`). Marked cells hold text the engine
/// was given (user turns, a system prompt), which no later query may read again. The
/// selection then reserves `share` (in [0, 1]; `KVE_MARK_SHARE_DEFAULT`) of each unit's
/// prefix budget for marked cells, picked among them by the method's own selection, and
/// gives the rest to the unmarked cells the same way (a part with too few cells leaves the
/// rest to the other); never more than the budget. No marked cell, no unmarked one, or
/// `share` 0: the plain selection, bit-identical. The marks last for this round only
/// (a new `kve_evictor_begin` forgets them): an engine knows its cells' positions, which
/// compaction keeps. Writes only the context.
#[no_mangle]
pub unsafe extern "C" fn kve_evictor_mark_cells(
    evictor: *mut kve_evictor,
    seq: u64,
    flags: *const u8,
    n_flags: u64,
    share: f32,
) -> i32 {
    let f = tri!(Buf::new(flags, n_flags));
    // SAFETY: the caller's context; attach checks it.
    let (mut ev, ctx) = tri!(unsafe { attach(evictor) });
    tri!(check_alias(&[ctx], &[f.span]));
    // SAFETY: Buf::new checked it; check_alias: the context (the only output) does not
    // overlap it.
    let flags = unsafe { f.slice() };
    to_status(ev.mark_cells(tri!(to_usize(seq)), flags, share))
}

/// Set every tensor of `layer` absent and its `struct_size`
/// (`KVE_EVICTOR_LAYER_V1_SIZE`). Writes only `layer`.
#[no_mangle]
pub unsafe extern "C" fn kve_evictor_layer_init(
    layer: *mut kve_evictor_layer,
    struct_size: u32,
) -> i32 {
    // SAFETY: the caller passes NULL or `struct_size` writable bytes; write_ext checks the rest.
    to_status(unsafe { write_ext(layer, struct_size, KVE_EVICTOR_LAYER_V1_SIZE, NO_LAYER) })
}

pub(crate) const NO_LAYER: kve_evictor_layer = kve_evictor_layer {
    struct_size: KVE_EVICTOR_LAYER_V1_SIZE,
    reserved: 0,
    keys: kve_tensor::NONE,
    values: kve_tensor::NONE,
    queries: kve_tensor::NONE,
    row_lse: core::ptr::null(),
    row_lse_len: 0,
    wo: kve_tensor::NONE,
};

/// One layer's tensors for the round's `n` cells with K and V in a paged pool (fill with
/// `kve_evictor_paged_layer_init`: everything absent): as `kve_evictor_layer`, K and V
/// through the sequence's block table.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kve_evictor_paged_layer {
    pub struct_size: u32,
    /// Must be 0.
    pub reserved: u32,
    /// K: `heads == Hkv`, `dim == dk` (`kve_paged_layout_init`), required.
    pub keys: kve_paged_layout,
    /// V (`dim == dv`), when the method reads values (`data == NULL`: absent; not read
    /// otherwise).
    pub values: kve_paged_layout,
    /// The sequence's block table (K and V share it): at least `ceil(n / block_size)`
    /// entries, each below `num_blocks`, none repeated; entries past the sequence are
    /// not read.
    pub table: *const u32,
    pub table_len: u64,
    /// As `kve_evictor_layer`'s.
    pub queries: kve_tensor,
    pub row_lse: *const f32,
    pub row_lse_len: u64,
    pub wo: kve_tensor,
}

/// `sizeof(kve_evictor_paged_layer)` of the first release.
pub const KVE_EVICTOR_PAGED_LAYER_V1_SIZE: u32 = 376;
extensible!(kve_evictor_paged_layer: [KVE_EVICTOR_PAGED_LAYER_V1_SIZE]);

const NO_POOL: kve_paged_layout = kve_paged_layout {
    data: core::ptr::null(),
    len: 0,
    dtype: 0,
    pad: 0,
    offset: 0,
    num_blocks: 0,
    block_size: 0,
    heads: 0,
    dim: 0,
    stride: [0; 4],
};

pub(crate) const NO_PAGED_LAYER: kve_evictor_paged_layer = kve_evictor_paged_layer {
    struct_size: KVE_EVICTOR_PAGED_LAYER_V1_SIZE,
    reserved: 0,
    keys: NO_POOL,
    values: NO_POOL,
    table: core::ptr::null(),
    table_len: 0,
    queries: kve_tensor::NONE,
    row_lse: core::ptr::null(),
    row_lse_len: 0,
    wo: kve_tensor::NONE,
};

/// Set everything in `layer` absent and its `struct_size`
/// (`KVE_EVICTOR_PAGED_LAYER_V1_SIZE`). Writes only `layer`.
#[no_mangle]
pub unsafe extern "C" fn kve_evictor_paged_layer_init(
    layer: *mut kve_evictor_paged_layer,
    struct_size: u32,
) -> i32 {
    // SAFETY: the caller passes NULL or `struct_size` writable bytes; write_ext checks the rest.
    to_status(unsafe {
        write_ext(
            layer,
            struct_size,
            KVE_EVICTOR_PAGED_LAYER_V1_SIZE,
            NO_PAGED_LAYER,
        )
    })
}

/// Score `layer` of sequence `seq`'s round from K (and V) in a paged pool: as
/// `kve_evictor_score_layer`, for a context configured with `paged = 1`
/// (`KVE_ERR_INVALID_ARGUMENT` otherwise, or for a pool dtype larger than
/// `paged_dtype`). The sequence's first `n_cells` tokens (the round's) are gathered into
/// the context and scored: kept sets bit-identical to the same K/V given strided. Table
/// errors as `kve_paged_gather`'s (`KVE_ERR_OUT_OF_BOUNDS`, `KVE_ERR_ALIASING`,
/// `KVE_ERR_SHAPE_MISMATCH` for a short table); a pool of other heads or dim
/// `KVE_ERR_SHAPE_MISMATCH`. Reads the pools, writes only the context.
#[no_mangle]
pub unsafe extern "C" fn kve_evictor_score_layer_paged(
    evictor: *mut kve_evictor,
    seq: u64,
    layer: u64,
    views: *const kve_evictor_paged_layer,
) -> i32 {
    let first = KVE_EVICTOR_PAGED_LAYER_V1_SIZE;
    // SAFETY: the caller's context and struct; layer_call checks both.
    let (mut ev, ctx, l) =
        tri!(unsafe { layer_call(evictor, views, first, NO_PAGED_LAYER, |l| l.reserved) });
    let seq = tri!(to_usize(seq));
    let layer = tri!(to_usize(layer));
    // SAFETY: a struct on the stack, read from the caller's.
    let k = tri!(unsafe { PagedPool::from_ptr(&l.keys) });
    let v = match l.values.data.is_null() {
        true => None,
        // SAFETY: as above.
        false => Some(tri!(unsafe { PagedPool::from_ptr(&l.values) })),
    };
    let t = tri!(Buf::new(l.table, l.table_len));
    let [q, wo] = [&l.queries, &l.wo].map(Tensor::optional);
    let (q, wo) = (tri!(q), tri!(wo));
    let lse = tri!(opt_floats(l.row_lse, l.row_lse_len));
    let views_span = span_sized(views, l.struct_size);
    let spans = [
        views_span,
        k.span,
        v.as_ref().map_or(Span::EMPTY, |p| p.span),
        t.span,
        Tensor::span(&q),
        Tensor::span(&wo),
        lse.as_ref().map_or(Span::EMPTY, |b| b.span),
    ];
    tri!(check_alias(&[ctx], &spans));
    let n = tri!(ev.round_cells(seq));
    // SAFETY: Buf::new checked the table; the context (the only output) does not overlap it.
    let table = unsafe { t.slice() };
    // SAFETY: PagedPool::from_ptr checked the pool's pointer, alignment and span; the
    // caller vouches for `len` readable elements; the context does not overlap it.
    let kv = tri!(unsafe { k.view(table, n, ev.scratch()) });
    let vv = match &v {
        // SAFETY: as above.
        Some(p) => Some(tri!(unsafe { p.view(table, n, ev.scratch()) })),
        None => None,
    };
    let view = |t: &Option<Tensor>| {
        // SAFETY: checked by Tensor::new; the context (the only output) does not overlap it.
        t.as_ref().map(|t| unsafe { t.view() }).transpose()
    };
    let lv = PagedLayerViews {
        keys: kv,
        values: vv,
        queries: tri!(view(&q)),
        // SAFETY: Buf::new checked the buffer; the context does not overlap it.
        row_lse: lse.as_ref().map(|b| unsafe { b.slice() }),
        wo: tri!(view(&wo)),
    };
    to_status(ev.score_layer_paged(seq, layer, &lv))
}

/// Score `layer` of sequence `seq`'s round (each layer once per round, any order) from
/// `views`, for the round's `n_cells`. Reads the tensors, writes only the context.
#[no_mangle]
pub unsafe extern "C" fn kve_evictor_score_layer(
    evictor: *mut kve_evictor,
    seq: u64,
    layer: u64,
    views: *const kve_evictor_layer,
) -> i32 {
    // SAFETY: the caller's context and struct; layer_call checks both.
    let (mut ev, ctx, l) = tri!(unsafe {
        layer_call(evictor, views, KVE_EVICTOR_LAYER_V1_SIZE, NO_LAYER, |l| {
            l.reserved
        })
    });
    let k = tri!(Tensor::new(&l.keys));
    let [v, q, wo] = [&l.values, &l.queries, &l.wo].map(Tensor::optional);
    let (v, q, wo) = (tri!(v), tri!(q), tri!(wo));
    let lse = tri!(opt_floats(l.row_lse, l.row_lse_len));
    let views_span = span_sized(views, l.struct_size);
    let lse_span = lse.as_ref().map_or(Span::EMPTY, |b| b.span);
    let spans = [
        views_span,
        k.span,
        Tensor::span(&v),
        Tensor::span(&q),
        Tensor::span(&wo),
        lse_span,
    ];
    tri!(check_alias(&[ctx], &spans));
    let view = |t: &Option<Tensor>| {
        // SAFETY: checked by Tensor::new; the context (the only output) does not overlap it.
        t.as_ref().map(|t| unsafe { t.view() }).transpose()
    };
    let lv = LayerViews {
        // SAFETY: checked by Tensor::new; the context does not overlap it.
        keys: tri!(unsafe { k.view() }),
        values: tri!(view(&v)),
        queries: tri!(view(&q)),
        // SAFETY: Buf::new checked the buffer; the context does not overlap it.
        row_lse: lse.as_ref().map(|b| unsafe { b.slice() }),
        wo: tri!(view(&wo)),
    };
    to_status(ev.score_layer(tri!(to_usize(seq)), tri!(to_usize(layer)), &lv))
}

/// Select sequence `seq`'s kept set once every layer of its round is scored: over all its
/// cells, or with the keep ratio over the cells since the protected ones (kept).
/// `*kept_cells`: the cells some (layer, KV head) keeps (every one, token granularity).
#[no_mangle]
pub unsafe extern "C" fn kve_evictor_select(
    evictor: *mut kve_evictor,
    seq: u64,
    kept_cells: *mut u64,
) -> i32 {
    let select = |ev: &mut Evictor| {
        let s = to_usize(seq)?;
        ev.select(s)?;
        ev.kept_cell_count(s)
    };
    // SAFETY: the caller's pointers; `answer` checks them.
    unsafe { answer(evictor, kept_cells, select) }
}

/// `kve_evictor_kept_cells` and `kve_evictor_evicted_cells`.
unsafe fn cells(
    evictor: *mut kve_evictor,
    seq: u64,
    out: *mut u32,
    len: u64,
    count: *mut u64,
    kept: bool,
) -> i32 {
    let mut n = tri!(out_param(count));
    let mut o = tri!(Buf::new(out, len));
    // SAFETY: the caller's context; attach checks it.
    let (mut ev, ctx) = tri!(unsafe { attach(evictor) });
    tri!(check_alias(&[n.span, o.span, ctx], &[]));
    let s = tri!(to_usize(seq));
    // SAFETY: Buf::new checked it; check_alias: it overlaps nothing else.
    let o = unsafe { o.slice_mut() };
    let c = tri!(match kept {
        true => ev.kept_cells(s, o),
        false => ev.evicted_cells(s, o),
    });
    // SAFETY: out_param checked it; one element.
    unsafe { n.slice_mut()[0] = c as u64 };
    KVE_OK
}

/// The cells some (layer, KV head) keeps in `seq`'s selected round, ascending, into
/// `cells` (`len` at least `kve_evictor_select`'s count), and their count.
#[no_mangle]
pub unsafe extern "C" fn kve_evictor_kept_cells(
    evictor: *mut kve_evictor,
    seq: u64,
    cells_out: *mut u32,
    len: u64,
    count: *mut u64,
) -> i32 {
    // SAFETY: the caller's pointers; `cells` checks them.
    unsafe { cells(evictor, seq, cells_out, len, count, true) }
}

/// The cells no (layer, KV head) keeps, ascending (`n_cells` minus the kept count):
/// what an engine of shared cells removes (`llama_memory_seq_rm` per cell).
#[no_mangle]
pub unsafe extern "C" fn kve_evictor_evicted_cells(
    evictor: *mut kve_evictor,
    seq: u64,
    cells_out: *mut u32,
    len: u64,
    count: *mut u64,
) -> i32 {
    // SAFETY: the caller's pointers; `cells` checks them.
    unsafe { cells(evictor, seq, cells_out, len, count, false) }
}

/// The per-(layer, KV head) kept lists of `seq`'s selected round, as `kve_select_model`
/// writes them: `offsets` (`layers * hkv + 1`), `indices` (`offsets[layers * hkv]`
/// cells; `layers * hkv * n_cells` always suffices).
#[no_mangle]
pub unsafe extern "C" fn kve_evictor_kept_lists(
    evictor: *mut kve_evictor,
    seq: u64,
    offsets: *mut u64,
    offsets_len: u64,
    indices: *mut u32,
    indices_len: u64,
) -> i32 {
    let mut o = tri!(Buf::new(offsets, offsets_len));
    let mut i = tri!(Buf::new(indices, indices_len));
    // SAFETY: the caller's context; attach checks it.
    let (mut ev, ctx) = tri!(unsafe { attach(evictor) });
    tri!(check_alias(&[o.span, i.span, ctx], &[]));
    let kept = tri!(ev.kept(tri!(to_usize(seq))));
    if o.len() < kept.offsets.len() || i.len() < kept.indices.len() {
        return super::KVE_ERR_OUTPUT_TOO_SMALL;
    }
    // SAFETY: Buf::new checked both; check_alias: they overlap nothing else.
    let (o, i) = unsafe { (o.slice_mut(), i.slice_mut()) };
    o[..kept.offsets.len()].copy_from_slice(kept.offsets);
    i[..kept.indices.len()].copy_from_slice(kept.indices);
    KVE_OK
}

/// Move `layer`'s kept rows of `kv` (K or V of sequence `seq`, `[Hkv, n_cells, d]`, host
/// memory, written through `kv->data`) to the front of each head, in place.
#[no_mangle]
pub unsafe extern "C" fn kve_evictor_compact(
    evictor: *mut kve_evictor,
    seq: u64,
    layer: u64,
    kv: *const kve_tensor,
) -> i32 {
    // SAFETY: the caller's context; attach checks it.
    let (mut ev, ctx) = tri!(unsafe { attach(evictor) });
    // SAFETY: NULL or the caller's descriptor; from_ptr checks it.
    let t = tri!(unsafe { Tensor::from_ptr(kv) });
    tri!(check_alias(&[ctx, t.span], &[span_ptr(kv)]));
    // SAFETY: checked by Tensor::new; writable by the function's contract; unaliased.
    let mut view = tri!(unsafe { t.view_mut() });
    to_status(ev.compact(tri!(to_usize(seq)), tri!(to_usize(layer)), &mut view))
}

/// `kve_evictor_compact` for K or V in a paged pool (`kv`, the sequence's block table
/// `table`, the round's `n_cells` tokens): each head's kept tokens of `layer` move to the
/// front of the sequence's own blocks, in place, order kept (`kve_paged_compact`).
/// `*blocks_freed`: the trailing table entries of the sequence's `ceil(n_cells /
/// block_size)` that now hold nothing, for the engine's block manager to release (at
/// token granularity the same for every layer, K and V). Table errors as
/// `kve_evictor_score_layer_paged`'s; a context without `paged` works too (the table
/// check needs `max_cells` ids of the context's workspace). Everything is checked before
/// the first byte moves: on error the pool and `*blocks_freed` are as they were.
#[no_mangle]
pub unsafe extern "C" fn kve_evictor_compact_paged(
    evictor: *mut kve_evictor,
    seq: u64,
    layer: u64,
    kv: *const kve_paged_layout,
    table: *const u32,
    table_len: u64,
    blocks_freed: *mut u64,
) -> i32 {
    // SAFETY: the caller's context; attach checks it.
    let (mut ev, ctx) = tri!(unsafe { attach(evictor) });
    // SAFETY: NULL or the caller's layout; from_ptr checks it.
    let p = tri!(unsafe { PagedPool::from_ptr(kv) });
    let t = tri!(Buf::new(table, table_len));
    let mut bf = tri!(out_param(blocks_freed));
    tri!(check_alias(
        &[ctx, p.span, bf.span],
        &[span_ptr(kv), t.span]
    ));
    let seq = tri!(to_usize(seq));
    let n = tri!(ev.round_cells(seq));
    // SAFETY: Buf::new checked the table; no output overlaps it.
    let table = unsafe { t.slice() };
    // SAFETY: PagedPool::from_ptr checked the pool; the caller vouches for `len` writable
    // elements; check_alias: no other argument overlaps it.
    let mut v = tri!(unsafe { p.view_mut(table, n, ev.scratch()) });
    let r = tri!(ev.compact_paged(seq, tri!(to_usize(layer)), &mut v));
    // SAFETY: out_param checked it; check_alias: it overlaps no other argument.
    unsafe { bf.slice_mut()[0] = r.blocks_freed as u64 };
    KVE_OK
}

/// Record that sequence `seq` now holds the kept cells of its selected round (the engine
/// removed the others): they are all protected from the keep ratio.
#[no_mangle]
pub unsafe extern "C" fn kve_evictor_commit(evictor: *mut kve_evictor, seq: u64) -> i32 {
    // SAFETY: the caller's context; on_seq attaches and checks it.
    unsafe { on_seq(evictor, seq, Evictor::commit) }
}

/// Forget sequence `seq` (ended or cleared): counters, protection, round, query rows.
#[no_mangle]
pub unsafe extern "C" fn kve_evictor_seq_reset(evictor: *mut kve_evictor, seq: u64) -> i32 {
    // SAFETY: the caller's context; on_seq attaches and checks it.
    unsafe { on_seq(evictor, seq, Evictor::reset) }
}

/// The engine changed sequence `seq`'s cells itself (removed or rewound some, or copied
/// others in): forget its protection (the keep ratio takes every cell as new again), its
/// round, raggedness and held cells; keep its query rows (`kve_evictor_observe_queries`)
/// and its eviction counters. `kve_evictor_seq_reset` forgets everything.
#[no_mangle]
pub unsafe extern "C" fn kve_evictor_seq_unprotect(evictor: *mut kve_evictor, seq: u64) -> i32 {
    // SAFETY: the caller's context; on_seq attaches and checks it.
    unsafe { on_seq(evictor, seq, Evictor::unprotect) }
}

/// Sequence `seq`'s counters into `out` (`struct_size` bytes:
/// `KVE_EVICTOR_STATS_V1_SIZE`).
#[no_mangle]
pub unsafe extern "C" fn kve_evictor_get_stats(
    evictor: *mut kve_evictor,
    seq: u64,
    out: *mut kve_evictor_stats,
    struct_size: u32,
) -> i32 {
    // SAFETY: the caller's context; attach checks it.
    let (mut ev, ctx) = tri!(unsafe { attach(evictor) });
    tri!(check_alias(&[span_sized(out, struct_size)], &[ctx]));
    let s = tri!(ev.stats(tri!(to_usize(seq))));
    // SAFETY: NULL or `struct_size` writable bytes (the caller's contract).
    unsafe { write_stats(s, out, struct_size) }
}

/// `s` into the caller's `out` (`struct_size` bytes), as a status.
pub(crate) unsafe fn write_stats(
    s: crate::evictor::SeqStats,
    out: *mut kve_evictor_stats,
    struct_size: u32,
) -> i32 {
    let v = kve_evictor_stats {
        struct_size,
        ragged: s.ragged as u32,
        cells: s.cells,
        protected_cells: s.protected,
        evictions: s.evictions,
        cells_evicted: s.cells_evicted,
    };
    // SAFETY: NULL or `struct_size` writable bytes; write_ext checks the rest.
    to_status(unsafe { write_ext(out, struct_size, KVE_EVICTOR_STATS_V1_SIZE, v) })
}
