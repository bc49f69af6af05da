// Histogram-threshold top-K (design §4 "Selection across devices"): a radix
// select over a 64-bit composite key, entirely on the device (no host sync):
//   c = (order-preserving bits of the score) << pbits | position,
// so that a larger score wins and, among equal scores, the later position wins.
// Each pass builds a 2048-bin histogram of the next 11-bit digit of the keys
// that still match the prefix found so far (shared-memory histograms, then
// global atomics per group); a one-block-per-group scan picks the digit that
// holds the K-th largest key. The pass count is fixed by n (launch count is
// data independent: a graph can capture it); passes after the threshold is
// resolved exit at once. Equal composites (same score and position in
// different rows of one group) are rationed by the lower row first.
// The output pass writes, per row, the kept positions in ascending order: long rows
// in chunks, one block each, after a pass that counts each chunk's kept positions.
#include "common.cuh"

namespace kve {
namespace {

constexpr int SEL_DIGIT = 11;
constexpr int SEL_BINS = 1 << SEL_DIGIT;
constexpr int SEL_NT = 256;
constexpr int64_t SEL_PER_BLOCK = 16384;  // entries per histogram block

enum { SEL_SEARCH = 0, SEL_RESOLVED = 1, SEL_NONE = 2, SEL_ALL = 3 };

struct SelState {
    unsigned long long prefix;  // digits found so far, in place
    unsigned long long thr;     // final: keep c >> cut > thr, ties (== thr) per `exact`
    long long need;             // entries still to take among those matching prefix
    int mode;
    int cut;
    int exact;  // 1: only `need` of the entries with c == thr are kept (lower rows first)
    int pad;
};

size_t states_bytes(int64_t groups) { return align_up((size_t)groups * sizeof(SelState), 256); }

// The score rows (common.cuh: their values scaled by the layer sums) in groups of rpg rows.
struct SelArgs : ScoreRows {
    int64_t rpg;
    int pbits;
    SelState* st;
    unsigned* hist;
};

// Key: the value (row r's scale `sc`) above the position's pbits bits.
__device__ __forceinline__ unsigned long long sel_key(const SelArgs& a, int64_t r, int64_t i,
                                                      float sc) {
    return ((unsigned long long)float_key(a.value(r, i, sc)) << a.pbits) | (unsigned long long)i;
}

__global__ void sel_init(SelArgs a, const int64_t* __restrict__ k, int64_t k_all) {
    const int64_t grp = blockIdx.x;
    if (threadIdx.x == 0) {
        const long long kk = k ? k[grp] : k_all;
        const long long total = (long long)(a.rpg * a.n);
        SelState s;
        s.prefix = 0;
        s.thr = 0;
        s.need = kk;
        s.cut = 0;
        s.exact = 0;
        s.pad = 0;
        s.mode = kk <= 0 ? SEL_NONE : (kk >= total ? SEL_ALL : SEL_SEARCH);
        a.st[grp] = s;
    }
    unsigned* h = a.hist + grp * SEL_BINS;
    for (int b = threadIdx.x; b < SEL_BINS; b += blockDim.x) h[b] = 0u;
}

__global__ void __launch_bounds__(SEL_NT)
    sel_hist(SelArgs a, int64_t chunks, int hi, int shift) {
    __shared__ unsigned sh[SEL_BINS];
    __shared__ int s_mode;
    __shared__ unsigned long long s_prefix;
    const int64_t r = blockIdx.x / chunks;
    const int64_t chunk = blockIdx.x - r * chunks;
    const int64_t grp = r / a.rpg;
    if (threadIdx.x == 0) {
        s_mode = a.st[grp].mode;
        s_prefix = a.st[grp].prefix;
    }
    for (int b = threadIdx.x; b < SEL_BINS; b += blockDim.x) sh[b] = 0u;
    __syncthreads();
    if (s_mode != SEL_SEARCH) return;
    const unsigned long long want = s_prefix >> hi;
    const unsigned mask = (1u << (hi - shift)) - 1u;
    const float sc = a.scale(r);
    const int64_t lo = chunk * SEL_PER_BLOCK;
    const int64_t end = min(a.n, lo + SEL_PER_BLOCK);
    for (int64_t i = lo + threadIdx.x; i < end; i += blockDim.x) {
        const unsigned long long c = sel_key(a, r, i, sc);
        if ((c >> hi) == want) atomicAdd(&sh[(unsigned)(c >> shift) & mask], 1u);
    }
    __syncthreads();
    unsigned* g = a.hist + grp * SEL_BINS;
    for (int b = threadIdx.x; b < SEL_BINS; b += blockDim.x)
        if (sh[b]) atomicAdd(&g[b], sh[b]);
}

__global__ void __launch_bounds__(SEL_NT) sel_scan(SelArgs a, int shift) {
    __shared__ unsigned sh[SEL_BINS];
    __shared__ unsigned long long tsum[SEL_NT];
    const int64_t grp = blockIdx.x;
    SelState* st = a.st + grp;
    if (st->mode != SEL_SEARCH) return;  // uniform across the block
    unsigned* g = a.hist + grp * SEL_BINS;
    constexpr int PER = SEL_BINS / SEL_NT;  // 8 bins per thread, descending order
    unsigned long long my = 0;
    for (int j = 0; j < PER; ++j) {
        const int b = SEL_BINS - 1 - (threadIdx.x * PER + j);
        const unsigned v = g[b];
        sh[b] = v;
        my += v;
    }
    tsum[threadIdx.x] = my;
    __syncthreads();
    if (threadIdx.x == 0) {
        const long long need = st->need;
        long long above = 0;
        int d = 0;
        for (int t = 0; t < SEL_NT; ++t) {
            if (above + (long long)tsum[t] >= need) {
                for (int j = 0; j < PER; ++j) {
                    const int b = SEL_BINS - 1 - (t * PER + j);
                    if (above + (long long)sh[b] >= need) {
                        d = b;
                        break;
                    }
                    above += sh[b];
                }
                break;
            }
            above += (long long)tsum[t];
        }
        const long long rem = need - above;
        const unsigned long long prefix = st->prefix | ((unsigned long long)d << shift);
        st->prefix = prefix;
        st->need = rem;
        if ((long long)sh[d] == rem) {
            st->mode = SEL_RESOLVED;
            st->cut = shift;
            st->thr = prefix >> shift;
            st->exact = 0;
        } else if (shift == 0) {
            st->mode = SEL_RESOLVED;
            st->cut = 0;
            st->thr = prefix;
            st->exact = 1;
        }
    }
    __syncthreads();
    for (int b = threadIdx.x; b < SEL_BINS; b += blockDim.x) g[b] = 0u;
}

// Whether position i of row r is kept, once the group's threshold is resolved.
__device__ __forceinline__ bool sel_keep(const SelArgs& a, const SelState& s, int64_t r,
                                         int64_t grp, int64_t i, float sc) {
    if (s.mode == SEL_ALL) return true;
    if (s.mode != SEL_RESOLVED) return false;
    const unsigned long long c = sel_key(a, r, i, sc);
    const unsigned long long top = c >> s.cut;
    if (top != s.thr) return top > s.thr;
    if (!s.exact) return true;
    // rank among equal composites: rows of the group before r
    long long rank = 0;
    for (int64_t r2 = grp * a.rpg; r2 < r; ++r2)
        if (sel_key(a, r2, i, a.scale(r2)) == c) ++rank;
    return rank < s.need;
}

// Output chunks: a row's positions in `chunks` runs of `clen` (one block each), so a
// long row is written by many blocks. Chunk counts go to the group's histogram bins,
// zero after the last scan and zeroed again by the next call's sel_init:
// bin (r - first row of the group) * chunks + c.
__device__ __forceinline__ unsigned* sel_chunk_counts(const SelArgs& a, int64_t r, int64_t grp,
                                                      int64_t chunks) {
    return a.hist + grp * SEL_BINS + (r - grp * a.rpg) * chunks;
}

// The occupancy target (4 blocks of 256 threads: <= 64 registers) keeps ptxas from
// the 4-byte local-memory spill it made on sm_80/86/89 with the thread count alone.
__global__ void __launch_bounds__(SEL_NT, 4)
    sel_count(SelArgs a, int64_t chunks, int64_t clen) {
    __shared__ int wcount[SEL_NT / 32];
    __shared__ SelState s;
    const int64_t r = blockIdx.x / chunks, c = blockIdx.x - r * chunks;
    const int64_t grp = r / a.rpg;
    if (threadIdx.x == 0) s = a.st[grp];
    __syncthreads();
    const float sc = a.scale(r);
    const int64_t lo = c * clen, hi = min(a.n, lo + clen);
    int mine = 0;
    for (int64_t i = lo + threadIdx.x; i < hi; i += SEL_NT) mine += sel_keep(a, s, r, grp, i, sc);
    for (int o = 16; o > 0; o >>= 1) mine += __shfl_xor_sync(0xffffffffu, mine, o);
    if ((threadIdx.x & 31) == 0) wcount[threadIdx.x >> 5] = mine;
    __syncthreads();
    if (threadIdx.x == 0) {
        int tot = 0;
        for (int w = 0; w < SEL_NT / 32; ++w) tot += wcount[w];
        sel_chunk_counts(a, r, grp, chunks)[c] = (unsigned)tot;
    }
}

__global__ void __launch_bounds__(SEL_NT, 4)
    sel_output(SelArgs a, int64_t chunks, int64_t clen, int32_t* __restrict__ counts,
               int32_t* __restrict__ idx, int64_t idx_ld) {
    __shared__ int wcount[SEL_NT / 32];
    __shared__ SelState s;
    __shared__ long long s_base;
    const int64_t r = blockIdx.x / chunks, c = blockIdx.x - r * chunks;
    const int64_t grp = r / a.rpg;
    if (threadIdx.x == 0) {
        s = a.st[grp];
        long long b = 0;  // kept in the row's earlier chunks
        const unsigned* cc = chunks > 1 ? sel_chunk_counts(a, r, grp, chunks) : nullptr;
        for (int64_t p = 0; p < c; ++p) b += cc[p];
        s_base = b;
    }
    __syncthreads();
    const float sc = a.scale(r);
    int32_t* out = idx + r * idx_ld;
    int64_t base = s_base;
    const int64_t lo = c * clen, hi = min(a.n, lo + clen);
    for (int64_t i0 = lo; i0 < hi; i0 += SEL_NT) {
        const int64_t i = i0 + threadIdx.x;
        const bool keep = i < hi && sel_keep(a, s, r, grp, i, sc);
        base += block_compact<SEL_NT>(keep, i, out, base, wcount);
    }
    if (threadIdx.x == 0 && c == chunks - 1) counts[r] = (int32_t)base;
}

// Output chunks per row: runs of SEL_OUT_CHUNK positions, as many as the group's
// 2048 bins can count (rows_per_group * chunks <= 2048); one chunk (no counting
// pass) for short rows or groups of more than 1024 rows.
constexpr int64_t SEL_OUT_CHUNK = 4096;
int64_t out_chunks(int64_t n, int64_t rpg, int64_t rows) {
    int64_t c = ceil_div(n, SEL_OUT_CHUNK);
    const int64_t cap = SEL_BINS / (rpg > 0 ? rpg : 1);
    if (c > cap) c = cap;
    const int64_t grid_cap = (((int64_t)1 << 31) - 1) / (rows > 0 ? rows : 1);  // grid.x
    if (c > grid_cap) c = grid_cap;
    return c < 2 ? 1 : c;
}

}  // namespace
}  // namespace kve

using namespace kve;

extern "C" size_t kve_cuda_select_workspace_size(int64_t n_groups) {
    if (n_groups <= 0) return 0;
    return states_bytes(n_groups) + (size_t)n_groups * SEL_BINS * sizeof(unsigned);
}

extern "C" int kve_cuda_select(const float* scores, int64_t ld, int64_t n, int64_t n_groups,
                               int64_t rows_per_group, const int64_t* k, int64_t k_all,
                               const double* layer_sum, int64_t rows_per_layer, int32_t* counts,
                               int32_t* idx, int64_t idx_ld, void* ws, size_t ws_bytes,
                               void* stream) {
    if (n < 0 || n_groups < 0 || rows_per_group < 0 || n > ((int64_t)1 << 31) - 1)
        return (int)cudaErrorInvalidValue;
    const int64_t rows = n_groups * rows_per_group;
    if (rows == 0) return 0;
    if (!counts || rows > ((int64_t)1 << 31) - 1) return (int)cudaErrorInvalidValue;
    if (rows_per_group * n >= ((int64_t)1 << 32)) return (int)cudaErrorInvalidValue;
    cudaStream_t st = KVE_STREAM(stream);
    if (n == 0) return (int)cudaMemsetAsync(counts, 0, (size_t)rows * sizeof(int32_t), st);
    if (!scores || !idx || ld < n || idx_ld < n) return (int)cudaErrorInvalidValue;
    if (layer_sum && rows_per_layer <= 0) return (int)cudaErrorInvalidValue;
    if (!ws || ws_bytes < kve_cuda_select_workspace_size(n_groups))
        return (int)cudaErrorInvalidValue;

    int pbits = 0;
    while (pbits < 32 && ((int64_t)1 << pbits) < n) ++pbits;  // positions 0..n-1 fit
    const int total_bits = 32 + pbits;
    const SelArgs a{
        score_rows(scores, ld, n, layer_sum, rows_per_layer),
        rows_per_group,
        pbits,
        reinterpret_cast<SelState*>(ws),
        reinterpret_cast<unsigned*>(static_cast<unsigned char*>(ws) + states_bytes(n_groups)),
    };

    KVE_CHECK(launch_kernel(sel_init, (unsigned)n_groups, SEL_NT, 0, st, a, k, k_all));
    const int64_t chunks = ceil_div(n, SEL_PER_BLOCK);
    for (int hi = total_bits; hi > 0; hi -= SEL_DIGIT) {
        const int shift = hi > SEL_DIGIT ? hi - SEL_DIGIT : 0;
        KVE_CHECK(launch_kernel(sel_hist, (unsigned)(rows * chunks), SEL_NT, 0, st, a, chunks, hi,
            shift));
        KVE_CHECK(launch_kernel(sel_scan, (unsigned)n_groups, SEL_NT, 0, st, a, shift));
    }
    const int64_t oc = out_chunks(n, rows_per_group, rows);
    const int64_t clen = ceil_div(n, oc);
    if (oc > 1)
        KVE_CHECK(launch_kernel(sel_count, (unsigned)(rows * oc), SEL_NT, 0, st, a, oc, clen));
    KVE_CHECK(launch_kernel(sel_output, (unsigned)(rows * oc), SEL_NT, 0, st, a, oc, clen, counts,
        idx, idx_ld));
    return 0;
}
