//! kvevict: which cached tokens an LLM inference engine can evict from its KV cache, and
//! compaction of what stays. `no_std`, allocation-free: every buffer comes from the caller,
//! workspaces are sized by `*_workspace_size` queries first.
//!
//! Flow for one model: [`compute_gram`] once → per layer [`score_layer`] into `[Hkv][P]`
//! → [`select_model`] over `[L][Hkv][P]` → [`compact`] each layer's K and V.
#![no_std]
// every unsafe operation sits in its own block with a SAFETY line saying why it holds
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![allow(clippy::needless_range_loop)]
// kernels take (data, shape, strides, outputs) like their C counterparts; the fast-exp
// coefficients are written as published
#![allow(clippy::too_many_arguments, clippy::excessive_precision)]
#[cfg(feature = "std")]
extern crate std;

// The layers, each a folder: `base/` (configuration, views, statuses: no math), `math/`
// (the core math on the host), `evictor/` (the simple API), `capi/` (the C ABI), `device/`
// and `cuda.rs` (the device pipeline and its launchers); the CPU kernels below them
// (`kernels/cpu/`: `portable/`, `x86/`, `arm/`) and paged caches (`paged`) beside them.
mod base;
mod math;

pub(crate) use base::span;
pub use base::{config, dtype, error, shape, view, workspace};
pub(crate) use math::window;
pub use math::{budget, compact, gram, links, pool, rotate, score, select, shard, stream};

pub mod capi;
/// Raw launchers of cuda/ (kvevict_cuda.h); the public header declares the kve_cuda_*
/// wrappers of src/capi instead.
/// cbindgen:ignore
#[cfg(feature = "cuda")]
pub mod cuda;
/// The device pipeline: planning, workspace layout and launch chains of the CUDA paths.
#[cfg(feature = "cuda")]
pub mod device;
pub mod evictor;
pub mod paged;

// The CPU kernels (`src/kernels/cpu/`), re-exported under the names the layers above use.
mod kernels;
pub use kernels::cpu::portable::numerics;
#[cfg(all(feature = "std", target_arch = "x86_64", kvevict_avx512))]
use kernels::cpu::x86::{gemm512, lanes512, simd512, softmax512, tova512};
pub(crate) use kernels::cpu::{colstats, portable::lanes};

pub use budget::{
    evicted_positions, select_model, select_model_linked, select_output_len, select_workspace_size,
    ModelScores, ValueLinks, LINK_THRESHOLD,
};
pub use config::*;
pub use error::{Error, Result};
pub use evictor::{Evictor, EvictorConfig};
pub use gram::{
    compute_gram, compute_value_forms, compute_value_l1, gram_len, gram_workspace_size,
    value_forms_len,
};
pub use links::{accumulate_value_links, value_links_workspace_size};
pub use paged::{PagedKind, PagedLayout, PagedView, PagedViewMut};
pub use score::{
    layer_shape, score_layer, score_len, score_workspace_size, window_row_lse,
    window_row_lse_workspace_size, LayerInputs, LayerShape,
};
pub use shape::ModelShape;
pub use stream::{
    stream_feed, stream_feed_workspace_size, stream_init, stream_query_count, stream_scores,
    stream_scores_len, stream_scores_workspace_size, stream_shape, stream_state_size, stream_stats,
    StreamScoreConfig, StreamShape, StreamStat, StreamStats, StreamValues,
};
pub use view::{DType, View, ViewMut};

/// Library version.
pub const VERSION_MAJOR: u32 = 0;
pub const VERSION_MINOR: u32 = 4;
pub const VERSION_PATCH: u32 = 0;
