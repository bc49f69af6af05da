//! FFI declarations of the CUDA launchers in `cuda/` (feature `cuda`).
//!
//! Documentation of every launcher is in `cuda/kvevict_cuda.h`; the
//! conventions in short: each launcher takes the engine's `cudaStream_t` as
//! `*mut c_void` (null = legacy default stream), returns the CUDA status
//! (`0` = success, `1` = invalid argument before anything was enqueued),
//! allocates nothing (device workspaces sized by the `*_workspace_size`
//! functions), never synchronises the host, and can be captured in a CUDA
//! graph. Pointers are device pointers except the view descriptors.
//! Every function here is `unsafe` to call: the caller guarantees the device
//! pointers and extents.

use core::ffi::{c_int, c_void};

/// `kve_cuda_view::dtype`: f32.
pub const KVE_CUDA_F32: i32 = 0;
/// `kve_cuda_view::dtype`: f16.
pub const KVE_CUDA_F16: i32 = 1;
/// `kve_cuda_view::dtype`: bf16.
pub const KVE_CUDA_BF16: i32 = 2;

/// GQA reduction: mean over the group's query heads.
pub const KVE_CUDA_GQA_MEAN: c_int = 0;
/// GQA reduction: max.
pub const KVE_CUDA_GQA_MAX: c_int = 1;
/// GQA reduction: sum.
pub const KVE_CUDA_GQA_SUM: c_int = 2;

/// Pooling: average, zero padding counted.
pub const KVE_CUDA_POOL_AVG: c_int = 0;
/// Pooling: max, -inf padding.
pub const KVE_CUDA_POOL_MAX: c_int = 1;
/// Pooling: forward (continuation) pooling with decay.
pub const KVE_CUDA_POOL_FORWARD: c_int = 2;

/// `kve_cuda_laprox_exact` modes.
pub const KVE_CUDA_LAPROX_EXACT: c_int = 0;
pub const KVE_CUDA_LAPROX_MEAN_ATTN: c_int = 1;
pub const KVE_CUDA_LAPROX_ATTN_TERM: c_int = 2;
pub const KVE_CUDA_LAPROX_VALUE_TERM: c_int = 3;

/// `kve_cuda_layer_budgets` modes.
pub const KVE_CUDA_BUDGET_UNIFORM: c_int = 0;
pub const KVE_CUDA_BUDGET_PYRAMID: c_int = 1;
pub const KVE_CUDA_BUDGET_ADA: c_int = 2;
pub const KVE_CUDA_BUDGET_LAVA: c_int = 3;

/// A strided 3-D device tensor view: element `(h, t, d)` is at
/// `data + h*stride_head + t*stride_token + d*stride_dim` (element strides).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KveCudaView {
    pub data: *mut c_void,
    pub dtype: i32,
    pub reserved: i32,
    pub stride_head: i64,
    pub stride_token: i64,
    pub stride_dim: i64,
    pub heads: i64,
    pub tokens: i64,
    pub dim: i64,
}

/// One K or V tensor of a paged pool (`kve_cuda_paged`): element (block, slot, head, dim)
/// at `offset + b·stride_block + s·stride_slot + h·stride_head + c·stride_dim`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KveCudaPaged {
    pub data: *mut c_void,
    pub dtype: i32,
    pub reserved: i32,
    pub offset: i64,
    pub num_blocks: i64,
    pub block_size: i64,
    pub heads: i64,
    pub dim: i64,
    pub stride_block: i64,
    pub stride_slot: i64,
    pub stride_head: i64,
    pub stride_dim: i64,
}

/// One tensor of `kve_cuda_compact_batch`: its view and kept lists (as `kve_cuda_compact`'s).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KveCudaCompactItem {
    pub x: KveCudaView,
    pub kept: *const i32,
    pub kept_ld: i64,
    pub counts: *const i32,
}

#[cfg(feature = "cuda")]
extern "C" {
    pub fn kve_cuda_device_count(out: *mut c_int) -> c_int;

    pub fn kve_cuda_window_workspace_size(hq: i64, w: i64, n: i64, hkv: i64) -> usize;
    pub fn kve_cuda_window(
        q: *const KveCudaView,
        k: *const KveCudaView,
        w: i64,
        out_mean: *mut f32,
        out_l2: *mut f32,
        out_cross: *mut f32,
        out_group: *mut f32,
        gqa_op: c_int,
        row_lse: *const f32,
        ws: *mut c_void,
        ws_bytes: usize,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_lava_factor(
        v: *const KveCudaView,
        prefix: i64,
        out: *mut f32,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_vonorm(
        v: *const KveCudaView,
        n_tokens: i64,
        gram_hi: *const c_void,
        gram_lo: *const c_void,
        n_gram: i64,
        take_sqrt: c_int,
        out: *mut f32,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_vonorm_factor(
        v: *const KveCudaView,
        n_tokens: i64,
        factor_hi: *const c_void,
        factor_lo: *const c_void,
        n_gram: i64,
        take_sqrt: c_int,
        out: *mut f32,
        stream: *mut c_void,
    ) -> c_int;

    /// Host memory only (no device needed).
    pub fn kve_cuda_gram_factor(g: *const f32, n_gram: i64, dv: i64, l_out: *mut f32) -> c_int;

    pub fn kve_cuda_gram_split(
        g: *const f32,
        n: i64,
        dtype: c_int,
        hi: *mut c_void,
        lo: *mut c_void,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_pool(
        input: *const f32,
        ld_in: i64,
        out: *mut f32,
        ld_out: i64,
        rows: i64,
        n: i64,
        mode: c_int,
        k: c_int,
        decay: f32,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_head_reduce(
        a: *const f32,
        ld_a: i64,
        b: *const f32,
        ld_b: i64,
        b_mode: c_int,
        scale: *const f32,
        out: *mut f32,
        ld_out: i64,
        hq: i64,
        hkv: i64,
        n: i64,
        gqa_op: c_int,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_head_reduce_all(
        a: *const f32,
        ld_a: i64,
        out: *mut f32,
        ld_out: i64,
        hq: i64,
        reps: i64,
        n: i64,
        gqa_op: c_int,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_laprox_exact(
        cross: *const f32,
        ld_cross: i64,
        qv: *const f32,
        ld_qv: i64,
        out: *mut f32,
        ld_out: i64,
        hkv: i64,
        g: i64,
        n: i64,
        mode: c_int,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_layer_stats_workspace_size(layers: i64, count: i64) -> usize;
    pub fn kve_cuda_layer_stats(
        scores: *const f32,
        layer_stride: i64,
        count: i64,
        layers: i64,
        sums: *mut f64,
        entropy: *mut f64,
        ws: *mut c_void,
        ws_bytes: usize,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_token_reduce(
        scores: *const f32,
        sums: *const f64,
        layers: i64,
        rows_per_layer: i64,
        n: i64,
        out: *mut f32,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_select_workspace_size(n_groups: i64) -> usize;
    pub fn kve_cuda_select(
        scores: *const f32,
        ld: i64,
        n: i64,
        n_groups: i64,
        rows_per_group: i64,
        k: *const i64,
        k_all: i64,
        layer_sum: *const f64,
        rows_per_layer: i64,
        counts: *mut i32,
        idx: *mut i32,
        idx_ld: i64,
        ws: *mut c_void,
        ws_bytes: usize,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_shard_count(
        scores: *const f32,
        ld: i64,
        n: i64,
        rows: i64,
        unit0: i64,
        layer_sum: *const f64,
        rows_per_layer: i64,
        prefix_hi: u64,
        prefix_lo: u64,
        bits: u32,
        hist: *mut u64,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_shard_select(
        scores: *const f32,
        ld: i64,
        n: i64,
        rows: i64,
        unit0: i64,
        layer_sum: *const f64,
        rows_per_layer: i64,
        threshold_hi: u64,
        threshold_lo: u64,
        counts: *mut i32,
        idx: *mut i32,
        idx_ld: i64,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_compact_workspace_size(x: *const KveCudaView, max_keep: i64) -> usize;
    pub fn kve_cuda_compact(
        x: *const KveCudaView,
        kept: *const i32,
        kept_ld: i64,
        counts: *const i32,
        max_keep: i64,
        ws: *mut c_void,
        ws_bytes: usize,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_compact_batch_workspace_size(
        items: *const KveCudaCompactItem,
        n_items: i64,
        max_keep: i64,
    ) -> usize;
    pub fn kve_cuda_compact_batch(
        items: *const KveCudaCompactItem,
        n_items: i64,
        max_keep: i64,
        ws: *mut c_void,
        ws_bytes: usize,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_compact_varlen(
        src: *const KveCudaView,
        kept: *const i32,
        kept_ld: i64,
        counts: *const i32,
        dst: *mut c_void,
        cu_seqlens: *mut i32,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_knorm(
        k: *const KveCudaView,
        prefix: i64,
        out: *mut f32,
        ld_out: i64,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_uniqueness_workspace_size(heads: i64, n: i64, dk: i64, dv: i64) -> usize;
    #[allow(clippy::too_many_arguments)]
    pub fn kve_cuda_uniqueness(
        k: *const KveCudaView,
        v: *const KveCudaView,
        prefix: i64,
        out: *mut f32,
        ld_out: i64,
        ws: *mut c_void,
        ws_bytes: usize,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_score_power(
        scores: *mut f32,
        rows: i64,
        n: i64,
        ld: i64,
        power: c_int,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_sink_scores(
        out: *mut f32,
        rows: i64,
        n: i64,
        ld: i64,
        sinks: i64,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_critical_combine(
        base: *const f32,
        ld_base: i64,
        value_l1: *const f32,
        ld_l1: i64,
        counts: *const i32,
        idx: *const i32,
        idx_ld: i64,
        rows: i64,
        n: i64,
        out: *mut f32,
        ld_out: i64,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_mark_forced(
        scores: *mut f32,
        ld: i64,
        rows: i64,
        counts: *const i32,
        idx: *const i32,
        idx_ld: i64,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_layer_budgets(
        mode: c_int,
        weights: *const f64,
        layers: i64,
        per_layer: i64,
        p: i64,
        budget: u64,
        beta: u32,
        alpha: f32,
        k_layer: *mut i64,
        k_unit: *mut i64,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_broadcast_lists(
        src_counts: *const i32,
        src_idx: *const i32,
        src_ld: i64,
        src_rows: i64,
        reps: i64,
        counts: *mut i32,
        idx: *mut i32,
        idx_ld: i64,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_append_range(
        counts: *mut i32,
        idx: *mut i32,
        idx_ld: i64,
        rows: i64,
        start: i64,
        count: i64,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_stream_feed_workspace_size(hq: i64, c: i64) -> usize;
    pub fn kve_cuda_stream_feed(
        q: *const KveCudaView,
        positions: *const i64,
        k: *const KveCudaView,
        row_lse: *const f32,
        acc_max: *mut f32,
        acc_sum: *mut f32,
        acc_sq: *mut f32,
        ws: *mut c_void,
        ws_bytes: usize,
        stream: *mut c_void,
    ) -> c_int;
}

// The emulated runtime's host registration (feature `cuda-emu`, cuda/emu/emu.cpp).
#[cfg(feature = "cuda-emu")]
extern "C" {
    fn cudaHostRegister(p: *mut c_void, bytes: usize, flags: u32) -> c_int;
    fn cudaHostUnregister(p: *mut c_void) -> c_int;
    fn kveEmuHostMemoryAsDevice(on: c_int);
}

/// Feature `cuda-emu` only (the emulator, never shipped): makes host memory
/// `[p, p + bytes)` device memory to the emulated kernels, as `cudaHostRegister` with
/// `cudaHostRegisterMapped` does on a GPU with unified addressing (the device pointer is
/// the host pointer). For test harnesses whose "device" buffers are host memory (the
/// Python device tests, the fuzz target): the kernels then run with the emulator's pointer
/// checks on (a pointer outside every allocation and registered range aborts). Returns
/// the CUDA status (712: overlaps a registered range). Exported for ctypes; not part of
/// the C API.
///
/// # Safety
/// `[p, p + bytes)` must stay valid until [`kve_emu_host_unregister`]`(p)`.
#[cfg(feature = "cuda-emu")]
#[no_mangle]
pub unsafe extern "C" fn kve_emu_host_register(p: *mut c_void, bytes: usize) -> c_int {
    unsafe { cudaHostRegister(p, bytes, 2) }
}

/// Feature `cuda-emu` only: ends a registration of [`kve_emu_host_register`] (713: `p`
/// starts none).
///
/// # Safety
/// No kernel may still use the range.
#[cfg(feature = "cuda-emu")]
#[no_mangle]
pub unsafe extern "C" fn kve_emu_host_unregister(p: *mut c_void) -> c_int {
    unsafe { cudaHostUnregister(p) }
}

/// Feature `cuda-emu` only (the emulator, never shipped): with `on != 0` every host
/// address is device memory to the emulated kernels and copies, with no registration (the
/// pointer checks then pass any non-null pointer; `0` restores them). For a harness that
/// cannot register its buffers: the llama.cpp fork's device path on its CPU cache
/// (`llama_fork/cuda_emu.sh` links a call of it into the relinked libllama). Exported; not
/// part of the C API.
#[cfg(feature = "cuda-emu")]
#[no_mangle]
pub extern "C" fn kve_emu_host_memory_as_device(on: c_int) {
    unsafe { kveEmuHostMemoryAsDevice(on) }
}

// Value links and the linked forward pool (`cuda/links.cu`).
#[cfg(feature = "cuda")]
extern "C" {
    pub fn kve_cuda_links_workspace_size(heads: i64, n: i64) -> usize;
    pub fn kve_cuda_value_links(
        v: *const KveCudaView,
        links: *mut f32,
        ws: *mut c_void,
        ws_bytes: usize,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_pool_linked(
        input: *const f32,
        ld_in: i64,
        out: *mut f32,
        ld_out: i64,
        rows: i64,
        n: i64,
        k: c_int,
        sinks: i64,
        links: *const f32,
        link_min: f32,
        stream: *mut c_void,
    ) -> c_int;
}

// The evictor's device form's moves (`cuda/evictor.cu`).
#[cfg(feature = "cuda")]
extern "C" {
    pub fn kve_cuda_ring_put(
        q: *const KveCudaView,
        first: i64,
        rows: i64,
        ring: *mut c_void,
        cap: i64,
        seen: i64,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_span_rows(
        src: *const f32,
        rows: i64,
        ld: i64,
        start: i64,
        count: i64,
        dst: *mut f32,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_shift_lists(
        src_counts: *const i32,
        src_idx: *const i32,
        src_ld: i64,
        rows: i64,
        start: i64,
        counts: *mut i32,
        idx: *mut i32,
        idx_ld: i64,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_upload(
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_download(
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_paged_gather(
        src: *const KveCudaPaged,
        table: *const u32,
        n: i64,
        dst: *mut c_void,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_paged_compact_workspace_size(kv: *const KveCudaPaged, max_keep: i64) -> usize;

    pub fn kve_cuda_paged_compact(
        kv: *const KveCudaPaged,
        table: *const u32,
        n: i64,
        kept: *const i32,
        kept_ld: i64,
        counts: *const i32,
        max_keep: i64,
        ws: *mut c_void,
        ws_bytes: usize,
        stream: *mut c_void,
    ) -> c_int;

    pub fn kve_cuda_upload_async(
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        stream: *mut c_void,
    ) -> c_int;
}
