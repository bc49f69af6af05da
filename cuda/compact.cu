// Compaction (design §5). Kept lists are ascending int32 positions per head
// (kept_ld = 0: one list shared by all heads, counts[0]).
//
// In place: moving row kept[t] -> t in parallel would race (a later row's source
// can be an earlier row's destination), so rows are staged: gather every row
// that moves (kept[t] != t) into the workspace, then scatter them back. Two
// launches, fully parallel, stream-ordered; nothing waits on the host. A batch of
// tensors (K and V of every layer) shares those two launches: up to CP_MAX tensors
// ride in one kernel parameter block, each with its own lists and staging area.
// Out of place (varlen): cu_seqlens = exclusive scan of counts, then one copy.
//
// Work covers kept rows only: one block per (tensor, head) and chunk of CP_ROWS kept
// rows, grid-striding over the chunks; a block whose chunk starts at or past the head's
// count returns after reading it. Copies run in "units": 16-byte vectors when rows are
// contiguous and aligned, else single elements; threads run along the view's unit
// stride (dim, or tokens for transposed V) so that accesses coalesce.
#include "common.cuh"

namespace kve {
namespace {

constexpr int CP_NT = 256;
constexpr int CP_ROWS = 32;       // kept rows per block step
constexpr int CP_MAX = 32;        // tensors per launch (kernel parameters: 32 x 96 B)
constexpr int64_t CP_CHUNKS = 65535;  // row chunks: a grid dimension (the blocks stride)

struct CpView {
    unsigned char* base;
    int64_t sh, st, sd;  // strides in units
    int64_t heads, dim;  // dim in units
    int tok_fast;        // 1: tokens are the unit-stride axis
    int unit;            // bytes per unit: 16, 4 or 2
};

// One tensor of a batch: its unit view, lists, staging area (bytes into the workspace)
// and its first (tensor, head) index in the batch.
struct CpItem {
    CpView v;
    const int32_t* kept;
    int64_t kept_ld;
    const int32_t* counts;
    int64_t ws_off;
    int64_t max_keep;  // min(the call's max_keep, this tensor's tokens)
    int64_t unit0;
};

struct CpBatch {
    CpItem it[CP_MAX];
    int n;
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

// Workspace index of (h, t, d) with `rows` rows per head, the view's axis order.
__device__ __forceinline__ int64_t ws_index(int64_t h, int64_t t, int64_t d, int64_t rows,
                                            int64_t dim, int tok_fast) {
    return tok_fast ? (h * dim + d) * rows + t : (h * rows + t) * dim + d;
}

// Rows t0 .. t0+nr of head h (sources src[0..nr), staged in shared memory): gather into
// the staging area, or scatter back; rows already in place are skipped.
template <typename U>
__device__ __forceinline__ void move_rows(const CpView& v, int64_t h, int64_t t0, int nr,
                                          const int32_t* src, U* __restrict__ ws,
                                          int64_t max_keep, int scatter) {
    const int64_t total = (int64_t)nr * v.dim;
    for (int64_t e = threadIdx.x; e < total; e += CP_NT) {
        int r;
        int64_t d;
        if (v.tok_fast) {
            r = (int)(e % nr);
            d = e / nr;
        } else {
            r = (int)(e / v.dim);
            d = e - (int64_t)r * v.dim;
        }
        const int64_t t = t0 + r, s = src[r];
        if (s == t) continue;  // already in place
        const int64_t w = ws_index(h, t, d, max_keep, v.dim, v.tok_fast);
        if (!scatter)
            ws[w] = *unit_ptr<U>(v, h, s, d);
        else
            *unit_ptr<U>(v, h, t, d) = ws[w];
    }
}

__global__ void __launch_bounds__(CP_NT)
    compact_rows(const CpBatch b, unsigned char* __restrict__ ws, int scatter) {
    __shared__ int32_t src[CP_ROWS];
    const int64_t u = blockIdx.x;
    int k = 0;
    while (k + 1 < b.n && b.it[k + 1].unit0 <= u) ++k;
    const CpItem& it = b.it[k];
    const int64_t h = u - it.unit0;
    const int64_t c = head_count(it.counts, it.kept_ld, h, it.max_keep);
    const int32_t* list = it.kept + (it.kept_ld ? h * it.kept_ld : 0);
    unsigned char* stage = ws + it.ws_off;
    for (int64_t t0 = (int64_t)blockIdx.y * CP_ROWS; t0 < c; t0 += (int64_t)gridDim.y * CP_ROWS) {
        const int nr = (int)(c - t0 < CP_ROWS ? c - t0 : CP_ROWS);
        __syncthreads();  // the previous chunk's src is read
        if (threadIdx.x < nr) src[threadIdx.x] = list[t0 + threadIdx.x];
        __syncthreads();
        switch (it.v.unit) {
            case 16:
                move_rows(it.v, h, t0, nr, src, reinterpret_cast<uint4*>(stage), it.max_keep,
                          scatter);
                break;
            case 4:
                move_rows(it.v, h, t0, nr, src, reinterpret_cast<uint32_t*>(stage), it.max_keep,
                          scatter);
                break;
            default:
                move_rows(it.v, h, t0, nr, src, reinterpret_cast<uint16_t*>(stage), it.max_keep,
                          scatter);
                break;
        }
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

// One block per head and chunk of CP_ROWS kept rows (as compact_rows): dst rows
// cu[h] + t, contiguous, dim fastest.
template <typename U>
__global__ void __launch_bounds__(CP_NT)
    varlen_copy(CpView v, int64_t cap, const int32_t* __restrict__ kept, int64_t kept_ld,
                const int32_t* __restrict__ counts, const int32_t* __restrict__ cu,
                U* __restrict__ dst) {
    const int64_t h = blockIdx.x;
    const int64_t c = head_count(counts, kept_ld, h, cap);
    const int32_t* list = kept + (kept_ld ? h * kept_ld : 0);
    U* out = dst + (int64_t)cu[h] * v.dim;
    for (int64_t t0 = (int64_t)blockIdx.y * CP_ROWS; t0 < c; t0 += (int64_t)gridDim.y * CP_ROWS) {
        const int64_t nr = c - t0 < CP_ROWS ? c - t0 : CP_ROWS;
        for (int64_t e = threadIdx.x; e < nr * v.dim; e += CP_NT) {
            const int64_t r = e / v.dim, d = e - r * v.dim;
            out[(t0 + r) * v.dim + d] = *unit_ptr<U>(v, h, list[t0 + r], d);
        }
    }
}

// Picks the copy unit: 16-byte vectors when each row is contiguous (stride_dim
// 1), its byte length and the row / head strides are multiples of 16 and the base
// is 16-byte aligned; else the element itself.
CpView make_cpview(const kve_cuda_view& x) {
    const int es = dtype_size(x.dtype);
    const int64_t row_bytes = x.dim * es;
    const bool vec = x.stride_dim == 1 && row_bytes % 16 == 0 &&
                     (x.stride_token * es) % 16 == 0 && (x.stride_head * es) % 16 == 0 &&
                     (reinterpret_cast<uintptr_t>(x.data) % 16) == 0;
    CpView v;
    v.unit = vec ? 16 : es;
    const int64_t f = v.unit / es;  // elements per unit
    v.base = static_cast<unsigned char*>(x.data);
    v.sh = vec ? x.stride_head / f : x.stride_head;
    v.st = vec ? x.stride_token / f : x.stride_token;
    v.sd = vec ? 1 : x.stride_dim;
    v.heads = x.heads;
    v.dim = vec ? row_bytes / 16 : x.dim;
    v.tok_fast = (!vec && x.stride_dim != 1 && x.stride_token == 1) ? 1 : 0;
    return v;
}

// Row chunks of a grid: enough for `rows` rows, at most CP_CHUNKS (the blocks stride).
unsigned chunks_for(int64_t rows) {
    const int64_t c = ceil_div(rows, CP_ROWS);
    return (unsigned)(c < 1 ? 1 : (c > CP_CHUNKS ? CP_CHUNKS : c));
}

// One tensor's checks (kve_cuda_compact's); `mk` gets max_keep capped at its tokens and
// `bytes` its staging bytes (0: nothing to move). cudaSuccess or cudaErrorInvalidValue.
int check_item(const kve_cuda_view* x, const int32_t* kept, int64_t kept_ld,
               const int32_t* counts, int64_t max_keep, int64_t& mk, size_t& bytes) {
    mk = 0;
    bytes = 0;
    if (!view_ok(x) || kept_ld < 0 || max_keep < 0) return (int)cudaErrorInvalidValue;
    mk = max_keep > x->tokens ? x->tokens : max_keep;
    if (x->heads == 0 || x->dim == 0 || mk == 0) return 0;
    if (!kept || !counts) return (int)cudaErrorInvalidValue;
    if (kept_ld != 0 && kept_ld < mk) return (int)cudaErrorInvalidValue;
    bytes = (size_t)(x->heads * mk * x->dim * dtype_size(x->dtype));
    return 0;
}

// Gather, then scatter, of the items[0..n) whose staging bytes are nonzero: two launches
// per CP_MAX of them. Every argument was checked (nothing is refused from here on but a
// launch itself).
int compact_items(const kve_cuda_compact_item* items, int64_t n, int64_t max_keep,
                  unsigned char* ws, cudaStream_t st) {
    int64_t i = 0;
    while (i < n) {
        CpBatch b;
        b.n = 0;
        // each launch pair stages into the start of the workspace: stream order keeps the
        // next pair's gather after this pair's scatter
        int64_t units = 0, rows = 1, off = 0;
        for (; i < n && b.n < CP_MAX; ++i) {
            const kve_cuda_compact_item& x = items[i];
            int64_t mk = 0;
            size_t bytes = 0;
            check_item(&x.x, x.kept, x.kept_ld, x.counts, max_keep, mk, bytes);
            if (bytes == 0) continue;
            CpItem& it = b.it[b.n++];
            it.v = make_cpview(x.x);
            it.kept = x.kept;
            it.kept_ld = x.kept_ld;
            it.counts = x.counts;
            it.ws_off = off;
            it.max_keep = mk;
            it.unit0 = units;
            units += x.x.heads;
            if (mk > rows) rows = mk;
            off += (int64_t)align_up(bytes, 256);
        }
        if (b.n == 0) break;
        const dim3 grid((unsigned)units, chunks_for(rows));
        for (int scatter = 0; scatter < 2; ++scatter)
            KVE_CHECK(launch_kernel(compact_rows, grid, CP_NT, 0, st, b, ws, scatter));
    }
    return 0;
}

}  // namespace
}  // namespace kve

using namespace kve;

extern "C" size_t kve_cuda_compact_workspace_size(const kve_cuda_view* x, int64_t max_keep) {
    if (!x || max_keep <= 0 || x->heads <= 0 || x->dim <= 0) return 0;
    const int es = dtype_size(x->dtype);
    return (size_t)(x->heads * max_keep * x->dim * es);
}

extern "C" size_t kve_cuda_compact_batch_workspace_size(const kve_cuda_compact_item* items,
                                                        int64_t n_items, int64_t max_keep) {
    if (!items || n_items <= 0 || max_keep <= 0) return 0;
    // the largest launch pair: CP_MAX tensors with something to move, in order
    size_t most = 0, sum = 0;
    int in_pair = 0;
    for (int64_t i = 0; i < n_items; ++i) {
        const kve_cuda_view& x = items[i].x;
        const int64_t mk = max_keep > x.tokens ? x.tokens : max_keep;
        const size_t b = mk > 0 ? kve_cuda_compact_workspace_size(&x, mk) : 0;
        if (b == 0) continue;
        if (in_pair == CP_MAX) sum = 0, in_pair = 0;
        sum += align_up(b, 256);
        ++in_pair;
        if (sum > most) most = sum;
    }
    return most;
}

extern "C" int kve_cuda_compact(const kve_cuda_view* x, const int32_t* kept, int64_t kept_ld,
                                const int32_t* counts, int64_t max_keep, void* ws,
                                size_t ws_bytes, void* stream) {
    int64_t mk = 0;
    size_t bytes = 0;
    KVE_CHECK(check_item(x, kept, kept_ld, counts, max_keep, mk, bytes));
    if (bytes == 0) return 0;
    if (!ws || ws_bytes < bytes) return (int)cudaErrorInvalidValue;
    kve_cuda_compact_item it;
    it.x = *x;
    it.kept = kept;
    it.kept_ld = kept_ld;
    it.counts = counts;
    return compact_items(&it, 1, mk, static_cast<unsigned char*>(ws), KVE_STREAM(stream));
}

extern "C" int kve_cuda_compact_batch(const kve_cuda_compact_item* items, int64_t n_items,
                                      int64_t max_keep, void* ws, size_t ws_bytes,
                                      void* stream) {
    if (n_items < 0 || max_keep < 0 || (n_items > 0 && !items)) return (int)cudaErrorInvalidValue;
    bool any = false;
    for (int64_t i = 0; i < n_items; ++i) {
        int64_t mk = 0;
        size_t bytes = 0;
        const kve_cuda_compact_item& x = items[i];
        KVE_CHECK(check_item(&x.x, x.kept, x.kept_ld, x.counts, max_keep, mk, bytes));
        any = any || bytes > 0;
    }
    if (!any) return 0;
    if (!ws || ws_bytes < kve_cuda_compact_batch_workspace_size(items, n_items, max_keep) ||
        reinterpret_cast<uintptr_t>(ws) % 16 != 0)
        return (int)cudaErrorInvalidValue;
    return compact_items(items, n_items, max_keep, static_cast<unsigned char*>(ws),
                         KVE_STREAM(stream));
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
    CpView v = make_cpview(*src);
    const bool dst_vec = (reinterpret_cast<uintptr_t>(dst) % 16) == 0;
    if (v.unit == 16 && !dst_vec) {
        // fall back to element copies
        v.sh = src->stride_head;
        v.st = src->stride_token;
        v.sd = src->stride_dim;
        v.dim = src->dim;
        v.unit = dtype_size(src->dtype);
    }
    const dim3 grid((unsigned)src->heads, chunks_for(src->tokens));
    switch (v.unit) {
        case 16:
            KVE_CHECK(launch_kernel(varlen_copy<uint4>, grid, CP_NT, 0, st, v, src->tokens, kept,
                                    kept_ld, counts, cu_seqlens, static_cast<uint4*>(dst)));
            break;
        case 4:
            KVE_CHECK(launch_kernel(varlen_copy<uint32_t>, grid, CP_NT, 0, st, v, src->tokens,
                                    kept, kept_ld, counts, cu_seqlens,
                                    static_cast<uint32_t*>(dst)));
            break;
        default:
            KVE_CHECK(launch_kernel(varlen_copy<uint16_t>, grid, CP_NT, 0, st, v, src->tokens,
                                    kept, kept_ld, counts, cu_seqlens,
                                    static_cast<uint16_t*>(dst)));
            break;
    }
    return 0;
}
