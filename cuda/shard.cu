// The GPU side of the core's sharded model-wide selection (src/math/shard.rs, design §4
// "Selection across devices"): a device holding some layers' scores counts its
// candidates' keys into the round's 256-bin histogram; the host adds every
// shard's histogram and steps the core's ShardSearch; once done, each shard
// keeps the keys that reach the threshold. Keys are the core's (src/math/select.rs):
//   key = fkey(score · scale) << 64 | position << 32 | ~unit   (128 bits; the
//   forced bit 96 is never set here), digits of 8 bits over a 104-bit space.
// scale = (float)(1 / layer_sum[row / rows_per_layer]) as the core's prepare()
// (1 when the sum is <= 0 or layer_sum is NULL).
#include "common.cuh"

namespace kve {
namespace {

typedef unsigned __int128 u128;
constexpr int SH_SPACE = 104;
constexpr int SH_NT = 256;
constexpr int64_t SH_PER_BLOCK = 16384;

// The shard's score rows (common.cuh), unit0 the model-wide unit of its row 0.
struct ShArgs : ScoreRows {
    int64_t rows, unit0;
};

__device__ __forceinline__ u128 sh_key(const ShArgs& a, int64_t r, int64_t i, float sc) {
    const uint32_t unit = (uint32_t)(a.unit0 + r);
    return ((u128)float_key(a.value(r, i, sc)) << 64) | ((u128)(uint32_t)i << 32) |
           (u128)(uint32_t)(~unit);
}

__global__ void __launch_bounds__(SH_NT)
    shard_count_kernel(ShArgs a, int64_t chunks, u128 prefix, int bits,
                       unsigned long long* __restrict__ hist) {
    __shared__ unsigned sh[256];
    const int64_t r = blockIdx.x / chunks;
    const int64_t chunk = blockIdx.x - r * chunks;
    for (int b = threadIdx.x; b < 256; b += blockDim.x) sh[b] = 0u;
    __syncthreads();
    const int shift = SH_SPACE - bits - 8;
    const float sc = a.scale(r);
    const int64_t lo = chunk * SH_PER_BLOCK;
    const int64_t hi = min(a.n, lo + SH_PER_BLOCK);
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const u128 k = sh_key(a, r, i, sc);
        if (bits == 0 || (k >> (shift + 8)) == prefix)
            atomicAdd(&sh[(unsigned)(k >> shift) & 0xffu], 1u);
    }
    __syncthreads();
    for (int b = threadIdx.x; b < 256; b += blockDim.x)
        if (sh[b]) atomicAdd(&hist[b], (unsigned long long)sh[b]);
}

__global__ void __launch_bounds__(SH_NT)
    shard_select_kernel(ShArgs a, u128 thr, int32_t* __restrict__ counts,
                        int32_t* __restrict__ idx, int64_t idx_ld) {
    __shared__ int wcount[SH_NT / 32];
    const int64_t r = blockIdx.x;
    const float sc = a.scale(r);
    int32_t* out = idx + r * idx_ld;
    int64_t base = 0;
    for (int64_t i0 = 0; i0 < a.n; i0 += SH_NT) {
        const int64_t i = i0 + threadIdx.x;
        const bool keep = i < a.n && sh_key(a, r, i, sc) >= thr;
        base += block_compact<SH_NT>(keep, i, out, base, wcount);
    }
    if (threadIdx.x == 0) counts[r] = (int32_t)base;
}

bool sh_args(const float* s, int64_t ld, int64_t n, int64_t rows, int64_t unit0,
             const double* ls, int64_t rpl, ShArgs& a) {
    if (n < 0 || rows < 0 || unit0 < 0 || n > ((int64_t)1 << 31) - 1) return false;
    if (rows > 0 && n > 0 && (!s || ld < n)) return false;
    if (unit0 + rows > ((int64_t)1 << 32)) return false;
    if (ls && rpl <= 0) return false;
    a = ShArgs{score_rows(s, ld, n, ls, rpl), rows, unit0};
    return true;
}

}  // namespace
}  // namespace kve

using namespace kve;

extern "C" int kve_cuda_shard_count(const float* scores, int64_t ld, int64_t n, int64_t rows,
                                    int64_t unit0, const double* layer_sum,
                                    int64_t rows_per_layer, uint64_t prefix_hi,
                                    uint64_t prefix_lo, uint32_t bits,
                                    unsigned long long* hist, void* stream) {
    ShArgs a;
    if (!sh_args(scores, ld, n, rows, unit0, layer_sum, rows_per_layer, a))
        return (int)cudaErrorInvalidValue;
    if (bits % 8 != 0 || bits >= (uint32_t)SH_SPACE) return (int)cudaErrorInvalidValue;
    const u128 prefix = ((u128)prefix_hi << 64) | (u128)prefix_lo;
    if (bits == 0 ? prefix != 0 : (prefix >> bits) != 0) return (int)cudaErrorInvalidValue;
    if (rows == 0 || n == 0) return 0;
    if (!hist) return (int)cudaErrorInvalidValue;
    const int64_t chunks = ceil_div(n, SH_PER_BLOCK);
    if (rows * chunks > 0x7fffffffLL) return (int)cudaErrorInvalidValue;
    KVE_CHECK(launch_kernel(shard_count_kernel, (unsigned)(rows * chunks), SH_NT, 0,
        KVE_STREAM(stream), a, chunks, prefix, (int)bits, hist));
    return 0;
}

extern "C" int kve_cuda_shard_select(const float* scores, int64_t ld, int64_t n, int64_t rows,
                                     int64_t unit0, const double* layer_sum,
                                     int64_t rows_per_layer, uint64_t threshold_hi,
                                     uint64_t threshold_lo, int32_t* counts, int32_t* idx,
                                     int64_t idx_ld, void* stream) {
    ShArgs a;
    if (!sh_args(scores, ld, n, rows, unit0, layer_sum, rows_per_layer, a))
        return (int)cudaErrorInvalidValue;
    if (rows == 0) return 0;
    if (!counts || (n > 0 && (!idx || idx_ld < n)) || rows > 0x7fffffffLL)
        return (int)cudaErrorInvalidValue;
    const u128 thr = ((u128)threshold_hi << 64) | (u128)threshold_lo;
    KVE_CHECK(launch_kernel(shard_select_kernel, (unsigned)rows, SH_NT, 0, KVE_STREAM(stream), a,
        thr, counts, idx, idx_ld));
    return 0;
}
