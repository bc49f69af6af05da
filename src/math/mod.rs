//! The core math on the host, stage by stage: the window pass (`window`, with what it
//! computes per KV group, `colstats`, and what a scorer reads of it, `needs`), the scorers
//! (`score`), pooling (`pool`), LaProx's Gram and value forms (`gram`), value links
//! (`links`), scoring from any query stream (`stream`), budgets and model-wide selection
//! (`budget`, on the keys and radix search of `select`, split over devices by `shard`) and
//! compaction (`compact`). Above it: the evictor (`src/evictor/`), the C ABI (`src/capi/`)
//! and the device pipeline (`src/device/`); below it: `src/base/` and the CPU kernels
//! (`numerics`, `lanes`, the AVX-512 files). The crate root re-exports each module under
//! its own name (`kvevict::score`, …).

pub mod budget;
pub(crate) mod colstats;
pub mod compact;
pub mod gram;
pub mod links;
pub(crate) mod needs;
pub mod pool;
pub mod score;
pub mod select;
pub mod shard;
pub mod stream;
pub(crate) mod window;
