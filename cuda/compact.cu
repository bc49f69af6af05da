// Compaction (SPEC §5). Kept lists are ascending int32 positions per head
// (kept_ld = 0: one list shared by all heads, counts[0]).
//
// In place: moving row kept[t] -> t in parallel would race (a later row's source
// can be an earlier row's destination), so rows are staged: gather every row
// that moves (kept[t] != t) into the workspace, then scatter them back. Two
// launches, fully parallel, stream-ordered; nothing waits on the host.
// Out of place (varlen): cu_seqlens = exclusive scan of counts, then one copy.
//
// Copies run in "units": 16-byte vectors when rows are contiguous and aligned,
// else single elements; threads run along the view's unit stride (dim, or
// tokens for transposed V) so that accesses coalesce.
#include "common.cuh"

namespace kve {
namespace {

constexpr int CP_NT = 256;

struct CpView {
    unsigned char* base;
    int64_t sh, st, sd;  // strides in units
    int64_t heads, dim;  // dim in units
    int tok_fast;        // 1: tokens are the unit-stride axis
};

template <typename U>
__device__ __forceinline__ U* unit_ptr(const CpView& v, int64_t h, int64_t t, int64_t d) {
    return reinterpret_cast<U*>(v.base) + h * v.sh + t * v.st + d * v.sd;
}

__device__ __forceinline__ int head_count(const int32_t* counts, int64_t kept_ld, int64_t h,
                                          int64_t cap) {
    const int64_t c = counts[kept_ld ? h : 0];
    return (int)(c < 0 ? 0 : (c > cap ? cap : c));
}

// Linear element e over [heads, rows, dim] -> (h, t, d); the fast axis follows
// the view's unit stride.
__device__ __forceinline__ void split3(int64_t e, int64_t rows, int64_t dim, int tok_fast,
                                       int64_t& h, int64_t& t, int64_t& d) {
    if (!tok_fast) {
        d = e % dim;
        const int64_t q = e / dim;
        t = q % rows;
        h = q / rows;
    } else {
        t = e % rows;
        const int64_t q = e / rows;
        d = q % dim;
        h = q / dim;
    }
}

// Workspace index of (h, t, d) with `rows` rows per head, same axis order.
__device__ __forceinline__ int64_t ws_index(int64_t h, int64_t t, int64_t d, int64_t rows,
                                            int64_t dim, int tok_fast) {
    return tok_fast ? (h * dim + d) * rows + t : (h * rows + t) * dim + d;
}

template <typename U>
__global__ void __launch_bounds__(CP_NT)
    compact_stage(CpView v, const int32_t* __restrict__ kept, int64_t kept_ld,
                  const int32_t* __restrict__ counts, int64_t max_keep, U* __restrict__ ws,
                  int scatter) {
    const int64_t total = v.heads * max_keep * v.dim;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t h, t, d;
        split3(e, max_keep, v.dim, v.tok_fast, h, t, d);
        if (t >= head_count(counts, kept_ld, h, max_keep)) continue;
        const int64_t src = kept[(kept_ld ? h * kept_ld : 0) + t];
        if (src == t) continue;  // already in place
        const int64_t w = ws_index(h, t, d, max_keep, v.dim, v.tok_fast);
        if (!scatter)
            ws[w] = *unit_ptr<U>(v, h, src, d);
        else
            *unit_ptr<U>(v, h, t, d) = ws[w];
    }
}

__global__ void cu_seqlens_kernel(const int32_t* __restrict__ counts, int64_t kept_ld,
                                  int64_t heads, int64_t cap, int32_t* __restrict__ cu) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    int64_t acc = 0;
    cu[0] = 0;
    for (int64_t h = 0; h < heads; ++h) {
        acc += head_count(counts, kept_ld, h, cap);
        cu[h + 1] = (int32_t)acc;
    }
}

template <typename U>
__global__ void __launch_bounds__(CP_NT)
    varlen_copy(CpView v, int64_t cap, const int32_t* __restrict__ kept, int64_t kept_ld,
                const int32_t* __restrict__ counts, const int32_t* __restrict__ cu,
                U* __restrict__ dst) {
    const int64_t total = v.heads * cap * v.dim;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t h, t, d;
        split3(e, cap, v.dim, 0, h, t, d);  // destination rows are contiguous: dim fastest
        if (t >= head_count(counts, kept_ld, h, cap)) continue;
        const int64_t src = kept[(kept_ld ? h * kept_ld : 0) + t];
        dst[((int64_t)cu[h] + t) * v.dim + d] = *unit_ptr<U>(v, h, src, d);
    }
}

// Picks the copy unit: 16-byte vectors when each row is contiguous (stride_dim
// 1), its byte length and the row / head strides are multiples of 16 and the base
// is 16-byte aligned; else the element itself.
int make_cpview(const kve_cuda_view& x, CpView& v, int& unit) {
    const int es = dtype_size(x.dtype);
    const int64_t row_bytes = x.dim * es;
    const bool vec = x.stride_dim == 1 && row_bytes % 16 == 0 &&
                     (x.stride_token * es) % 16 == 0 && (x.stride_head * es) % 16 == 0 &&
                     (reinterpret_cast<uintptr_t>(x.data) % 16) == 0;
    unit = vec ? 16 : es;
    const int64_t f = unit / es;  // elements per unit
    v.base = static_cast<unsigned char*>(x.data);
    v.sh = vec ? x.stride_head / f : x.stride_head;
    v.st = vec ? x.stride_token / f : x.stride_token;
    v.sd = vec ? 1 : x.stride_dim;
    v.heads = x.heads;
    v.dim = vec ? row_bytes / 16 : x.dim;
    v.tok_fast = (!vec && x.stride_dim != 1 && x.stride_token == 1) ? 1 : 0;
    return 0;
}

unsigned grid_for(int64_t total) {
    int64_t b = ceil_div(total, CP_NT);
    if (b > 65535 * 8) b = 65535 * 8;
    return (unsigned)(b < 1 ? 1 : b);
}

}  // namespace
}  // namespace kve

using namespace kve;

extern "C" size_t kve_cuda_compact_workspace_size(const kve_cuda_view* x, int64_t max_keep) {
    if (!x || max_keep <= 0 || x->heads <= 0 || x->dim <= 0) return 0;
    const int es = dtype_size(x->dtype);
    return (size_t)(x->heads * max_keep * x->dim * es);
}

extern "C" int kve_cuda_compact(const kve_cuda_view* x, const int32_t* kept, int64_t kept_ld,
                                const int32_t* counts, int64_t max_keep, void* ws,
                                size_t ws_bytes, void* stream) {
    if (!view_ok(x) || kept_ld < 0 || max_keep < 0) return (int)cudaErrorInvalidValue;
    if (max_keep > x->tokens) max_keep = x->tokens;
    if (x->heads == 0 || x->dim == 0 || max_keep == 0) return 0;
    if (!kept || !counts) return (int)cudaErrorInvalidValue;
    if (kept_ld != 0 && kept_ld < max_keep) return (int)cudaErrorInvalidValue;
    if (!ws || ws_bytes < kve_cuda_compact_workspace_size(x, max_keep))
        return (int)cudaErrorInvalidValue;
    CpView v;
    int unit = 0;
    make_cpview(*x, v, unit);
    cudaStream_t st = KVE_STREAM(stream);
    const unsigned grid = grid_for(v.heads * max_keep * v.dim);
    for (int scatter = 0; scatter < 2; ++scatter) {
        switch (unit) {
            case 16:
                KVE_CHECK(launch_kernel(compact_stage<uint4>, grid, CP_NT, 0, st, v, kept, kept_ld,
                    counts, max_keep, static_cast<uint4*>(ws), scatter));
                break;
            case 4:
                KVE_CHECK(launch_kernel(compact_stage<uint32_t>, grid, CP_NT, 0, st, v, kept,
                    kept_ld, counts, max_keep, static_cast<uint32_t*>(ws), scatter));
                break;
            default:
                KVE_CHECK(launch_kernel(compact_stage<uint16_t>, grid, CP_NT, 0, st, v, kept,
                    kept_ld, counts, max_keep, static_cast<uint16_t*>(ws), scatter));
                break;
        }
    }
    return 0;
}

extern "C" int kve_cuda_compact_varlen(const kve_cuda_view* src, const int32_t* kept,
                                       int64_t kept_ld, const int32_t* counts, void* dst,
                                       int32_t* cu_seqlens, void* stream) {
    if (!view_ok(src) || kept_ld < 0) return (int)cudaErrorInvalidValue;
    if (src->heads == 0) return 0;
    if (!kept || !counts || !cu_seqlens) return (int)cudaErrorInvalidValue;
    if (kept_ld != 0 && kept_ld < src->tokens) return (int)cudaErrorInvalidValue;
    if (src->heads * src->tokens >= ((int64_t)1 << 31)) return (int)cudaErrorInvalidValue;
    // every argument check before the first launch: nothing is written on refusal
    const bool copies = src->dim > 0 && src->tokens > 0;
    if (copies && !dst) return (int)cudaErrorInvalidValue;
    cudaStream_t st = KVE_STREAM(stream);
    KVE_CHECK(launch_kernel(cu_seqlens_kernel, 1, 32, 0, st, counts, kept_ld, src->heads,
        src->tokens, cu_seqlens));
    if (!copies) return 0;
    CpView v;
    int unit = 0;
    make_cpview(*src, v, unit);
    const bool dst_vec = (reinterpret_cast<uintptr_t>(dst) % 16) == 0;
    if (unit == 16 && !dst_vec) {
        // fall back to element copies
        v.base = static_cast<unsigned char*>(src->data);
        v.sh = src->stride_head;
        v.st = src->stride_token;
        v.sd = src->stride_dim;
        v.dim = src->dim;
        unit = dtype_size(src->dtype);
    }
    const unsigned grid = grid_for(v.heads * src->tokens * v.dim);
    switch (unit) {
        case 16:
            KVE_CHECK(launch_kernel(varlen_copy<uint4>, grid, CP_NT, 0, st, v, src->tokens, kept,
                kept_ld, counts, cu_seqlens, static_cast<uint4*>(dst)));
            break;
        case 4:
            KVE_CHECK(launch_kernel(varlen_copy<uint32_t>, grid, CP_NT, 0, st, v, src->tokens, kept,
                kept_ld, counts, cu_seqlens, static_cast<uint32_t*>(dst)));
            break;
        default:
            KVE_CHECK(launch_kernel(varlen_copy<uint16_t>, grid, CP_NT, 0, st, v, src->tokens, kept,
                kept_ld, counts, cu_seqlens, static_cast<uint16_t*>(dst)));
            break;
    }
    return 0;
}
