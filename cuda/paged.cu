// Paged KV caches (issue 30, src/paged.rs on the host): a layer's K or V in a pool of
// fixed-size blocks reached through a sequence's block table (vLLM, SGLang, FlashInfer,
// TensorRT-LLM). Token t of the sequence is in block table[t / block_size], slot
// t % block_size; element (block b, slot s, head h, dim c) at offset + b*stride_block +
// s*stride_slot + h*stride_head + c*stride_dim.
//
//  - paged_gather: the sequence's first n tokens into a contiguous [heads, n, dim] tensor
//    of the same dtype (raw bits), which every scorer reads as a strided view: scores on
//    it are the contiguous path's by construction. One block per (token chunk, head),
//    threads along dim.
//  - paged_compact: in place, each head's kept tokens (ascending int32 lists, as
//    compact.cu's) moved to tokens 0 .. count-1 of the sequence's logical order, the rest
//    left as it was, so the trailing table entries hold nothing the sequence keeps.
//    Staged as compact.cu (a later row's source can be an earlier row's destination):
//    every row that moves is gathered into the workspace ([heads][max_keep][dim]), then
//    scattered back; two launches, stream-ordered.
//
// The table is device memory and is not checked here beyond a guard: an entry at or past
// num_blocks is skipped (nothing read or written through it), so no access leaves the
// pool whatever the table holds. Repeated entries and short tables are the caller's to
// refuse before the launch (the evictor checks the host table with the core's check,
// src/paged.rs, and uploads it: same statuses as the host form, nothing enqueued on error).
#include "common.cuh"

namespace kve {
namespace {

constexpr int PG_NT = 128;

struct Pg {
    unsigned char* data;
    int64_t offset, num_blocks, block_size, sb, ss, sh, sd;  // strides in elements
    int64_t heads, dim;
};

// Element index of (token t, head h, dim 0) through the table; -1 for a guarded entry.
__device__ __forceinline__ int64_t pg_row(const Pg& p, const uint32_t* __restrict__ table,
                                          int64_t t, int64_t h) {
    const int64_t b = table[t / p.block_size];
    if (b >= p.num_blocks) return -1;
    return p.offset + b * p.sb + (t % p.block_size) * p.ss + h * p.sh;
}

template <typename U>
__global__ void __launch_bounds__(PG_NT)
    paged_gather_kernel(const Pg p, const uint32_t* __restrict__ table, int64_t n,
                        U* __restrict__ dst) {
    const int64_t h = blockIdx.y;
    const U* src = reinterpret_cast<const U*>(p.data);
    for (int64_t t = blockIdx.x; t < n; t += gridDim.x) {
        const int64_t r = pg_row(p, table, t, h);
        if (r < 0) continue;
        U* out = dst + (h * n + t) * p.dim;
        for (int64_t c = threadIdx.x; c < p.dim; c += PG_NT) out[c] = src[r + c * p.sd];
    }
}

// scatter = 0: rows that move (kept[r] != r) into ws; 1: back to their new place.
template <typename U>
__global__ void __launch_bounds__(PG_NT)
    paged_compact_kernel(const Pg p, const uint32_t* __restrict__ table, int64_t n,
                         const int32_t* __restrict__ kept, int64_t kept_ld,
                         const int32_t* __restrict__ counts, int64_t max_keep,
                         U* __restrict__ ws, int scatter) {
    const int64_t h = blockIdx.y;
    int64_t c = counts[kept_ld ? h : 0];
    const int64_t cap = max_keep < n ? max_keep : n;
    if (c < 0) c = 0;
    if (c > cap) c = cap;
    const int32_t* list = kept + (kept_ld ? h * kept_ld : 0);
    U* pool = reinterpret_cast<U*>(p.data);
    for (int64_t r = blockIdx.x; r < c; r += gridDim.x) {
        const int64_t s = list[r];
        if (s == r || s < 0 || s >= n) continue;
        const int64_t from = pg_row(p, table, s, h), to = pg_row(p, table, r, h);
        if (from < 0 || to < 0) continue;
        U* stage = ws + (h * max_keep + r) * p.dim;
        for (int64_t d = threadIdx.x; d < p.dim; d += PG_NT) {
            if (!scatter)
                stage[d] = pool[from + d * p.sd];
            else
                pool[to + d * p.sd] = stage[d];
        }
    }
}

// Host check of a descriptor: known dtype, extents >= 1, heads <= 65535 (a grid
// dimension), non-negative strides and offset, the highest element reachable in int64.
bool paged_ok(const kve_cuda_paged* p) {
    if (!p || !p->data || p->reserved != 0 || dtype_size(p->dtype) == 0) return false;
    if (p->num_blocks < 1 || p->block_size < 1 || p->heads < 1 || p->dim < 1) return false;
    if (p->heads > 65535 || p->offset < 0) return false;
    if (p->stride_block < 0 || p->stride_slot < 0 || p->stride_head < 0 || p->stride_dim < 0)
        return false;
    const double last = (double)p->offset + (double)(p->num_blocks - 1) * (double)p->stride_block +
                        (double)(p->block_size - 1) * (double)p->stride_slot +
                        (double)(p->heads - 1) * (double)p->stride_head +
                        (double)(p->dim - 1) * (double)p->stride_dim;
    return last < 9.0e18;
}

Pg to_pg(const kve_cuda_paged& p) {
    return Pg{static_cast<unsigned char*>(p.data), p.offset, p.num_blocks, p.block_size,
              p.stride_block, p.stride_slot, p.stride_head, p.stride_dim, p.heads, p.dim};
}

dim3 rows_grid(int64_t rows, int64_t heads) {
    return dim3((unsigned)(rows > 65535 ? 65535 : rows), (unsigned)heads);
}

}  // namespace
}  // namespace kve

using namespace kve;

extern "C" int kve_cuda_paged_gather(const kve_cuda_paged* src, const uint32_t* table, int64_t n,
                                     void* dst, void* stream) {
    if (!paged_ok(src) || n < 0) return (int)cudaErrorInvalidValue;
    if (n == 0) return 0;
    if (!table || !dst) return (int)cudaErrorInvalidValue;
    const Pg p = to_pg(*src);
    const dim3 grid = rows_grid(n, src->heads);
    if (src->dtype == KVE_CUDA_F32)
        KVE_CHECK(launch_kernel(paged_gather_kernel<uint32_t>, grid, PG_NT, 0, KVE_STREAM(stream), p,
                                table, n, static_cast<uint32_t*>(dst)));
    else
        KVE_CHECK(launch_kernel(paged_gather_kernel<uint16_t>, grid, PG_NT, 0, KVE_STREAM(stream), p,
                                table, n, static_cast<uint16_t*>(dst)));
    return 0;
}

extern "C" size_t kve_cuda_paged_compact_workspace_size(const kve_cuda_paged* kv, int64_t max_keep) {
    if (!paged_ok(kv) || max_keep < 0) return 0;
    return (size_t)kv->heads * (size_t)max_keep * (size_t)kv->dim * (size_t)dtype_size(kv->dtype);
}

extern "C" int kve_cuda_paged_compact(const kve_cuda_paged* kv, const uint32_t* table, int64_t n,
                                      const int32_t* kept, int64_t kept_ld, const int32_t* counts,
                                      int64_t max_keep, void* ws, size_t ws_bytes, void* stream) {
    if (!paged_ok(kv) || n < 0 || kept_ld < 0 || max_keep < 0) return (int)cudaErrorInvalidValue;
    if (n == 0 || max_keep == 0) return 0;
    if (!table || !kept || !counts || !ws) return (int)cudaErrorInvalidValue;
    if (ws_bytes < kve_cuda_paged_compact_workspace_size(kv, max_keep)) return (int)cudaErrorInvalidValue;
    const Pg p = to_pg(*kv);
    const dim3 grid = rows_grid(max_keep < n ? max_keep : n, kv->heads);
    for (int scatter = 0; scatter < 2; ++scatter) {
        if (kv->dtype == KVE_CUDA_F32)
            KVE_CHECK(launch_kernel(paged_compact_kernel<uint32_t>, grid, PG_NT, 0, KVE_STREAM(stream), p,
                                    table, n, kept, kept_ld, counts, max_keep,
                                    static_cast<uint32_t*>(ws), scatter));
        else
            KVE_CHECK(launch_kernel(paged_compact_kernel<uint16_t>, grid, PG_NT, 0, KVE_STREAM(stream), p,
                                    table, n, kept, kept_ld, counts, max_keep,
                                    static_cast<uint16_t*>(ws), scatter));
    }
    return 0;
}

extern "C" int kve_cuda_upload_async(void* dst, const void* src, size_t bytes, void* stream) {
    if (bytes == 0) return 0;
    if (!dst || !src) return (int)cudaErrorInvalidValue;
    return (int)cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, KVE_STREAM(stream));
}
