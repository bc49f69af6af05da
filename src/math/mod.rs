//! The core math on the host, stage by stage: the window pass (`window`, with what a scorer
//! reads of it, `needs`; what it computes per KV group is the kernels' `colstats`), the scorers
//! (`score`), pooling (`pool`), LaProx's Gram and value forms (`gram`), value links
//! (`links`), scoring from any query stream (`stream`), budgets and model-wide selection
//! (`budget`, on the keys and radix search of `select`, split over devices by `shard`) and
//! compaction (`compact`). Above it: the evictor (`src/evictor/`), the C ABI (`src/capi/`)
//! and the device pipeline (`src/device/`); below it: `src/base/` and the CPU kernels
//! (`src/kernels/cpu/`). The crate root re-exports each module under its own name
//! (`kvevict::score`, …).

pub mod budget;
pub mod compact;
pub mod gram;
pub mod links;
pub(crate) mod needs;
pub mod pool;
pub mod rotate;
pub mod score;
pub mod select;
pub mod shard;
pub mod stream;
pub(crate) mod window;
#[cfg(all(test, feature = "std", target_arch = "x86_64", kvevict_avx512))]
mod window_avx512_tests;
