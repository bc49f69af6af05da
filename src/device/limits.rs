//! What the kernels take, in one place. Shapes past these are `InvalidArgument` before
//! anything is enqueued (the header's "Limits of the kernels" lists them). Shared-memory
//! limits depend on the architecture and are the launchers' own (`Error::Cuda`).

/// Largest key dim of the window pass; largest value dim of the Gram path (vonorm).
pub const MAX_DIM: u64 = 256;
/// Most heads (query or KV), and most rows of a pooled or reduced grid: a grid dimension.
pub const MAX_GRID: u64 = 65535;
/// Window pass: most query heads per KV head.
pub const MAX_GROUP: usize = 128;
/// LaProx's exact and mean-attn GQA modes: most query heads per KV head.
pub const MAX_GROUP_CROSS: usize = 16;
/// Window pass: most window rows.
pub const MAX_WINDOW: usize = 1 << 24;
/// `kve_cuda_select`: entries of one selection group (indices are 32-bit).
pub const MAX_SELECT_ENTRIES: u128 = 1 << 32;
/// Uniqueness: cached tokens (its pair tiles of 64 tokens span two grid dimensions).
pub const MAX_UNIQUENESS_TOKENS: u64 = 65535 * 64;
