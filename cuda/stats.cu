// Per-layer sums and entropies (design §4 lava) and the token-granularity
// reduction (design §4 shared granularities). Deterministic: fixed partitions,
// fixed-order tree reductions, a fixed-order final pass.
#include "common.cuh"

namespace kve {
namespace {

constexpr int LS_NT = 256;
constexpr int64_t LS_PER_BLOCK = 8192;  // elements per block of the first pass
constexpr int64_t LS_MAX_BLOCKS = 1024;

int64_t ls_blocks(int64_t count) {
    int64_t b = ceil_div(count, LS_PER_BLOCK);
    if (b < 1) b = 1;
    return b > LS_MAX_BLOCKS ? LS_MAX_BLOCKS : b;
}

// partial[l * nb + b] = (Σ |s|, Σ |s| ln |s|) over the block's fixed slice.
__global__ void __launch_bounds__(LS_NT) layer_stats_partial(const float* __restrict__ s,
                                                             int64_t layer_stride, int64_t count,
                                                             int nb, double2* __restrict__ part) {
    __shared__ double sh_s[LS_NT / 32], sh_e[LS_NT / 32];
    const int64_t l = blockIdx.y;
    const float* x = s + l * layer_stride;
    const int64_t per = (count + nb - 1) / nb;
    const int64_t lo = (int64_t)blockIdx.x * per;
    const int64_t hi = min(count, lo + per);
    double a = 0.0, e = 0.0;
    for (int64_t i = lo + threadIdx.x; i < hi; i += LS_NT) {
        const double v = fabs((double)x[i]);  // the core's |s| (src/math/budget/lava.rs)
        a += v;
        if (v > 0.0) e += v * log(v);
    }
    a = warp_sum_d(a);
    e = warp_sum_d(e);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sh_s[warp] = a;
        sh_e[warp] = e;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double ta = 0.0, te = 0.0;
        for (int w = 0; w < LS_NT / 32; ++w) {
            ta += sh_s[w];
            te += sh_e[w];
        }
        part[l * nb + blockIdx.x] = make_double2(ta, te);
    }
}

// entropy = -Σ p ln p, p = |s|/S, S = Σ|s|:  = ln S - (Σ |s| ln |s|) / S
__global__ void layer_stats_final(const double2* __restrict__ part, int nb, int64_t layers,
                                  double* __restrict__ sums, double* __restrict__ ent) {
    const int64_t l = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (l >= layers) return;
    double a = 0.0, e = 0.0;
    for (int b = 0; b < nb; ++b) {
        a += part[l * nb + b].x;
        e += part[l * nb + b].y;
    }
    if (sums) sums[l] = a;
    if (ent) ent[l] = a > 0.0 ? fmax(0.0, log(a) - e / a) : 0.0;
}

__global__ void token_reduce_kernel(const float* __restrict__ s, const double* __restrict__ sums,
                                    int64_t layers, int64_t rpl, int64_t n,
                                    float* __restrict__ out) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        // the core's token granularity (src/math/budget/mod.rs): f32, (layer, row) order,
        // s · (float)(1 / sum), unfused, so equal scores give the core's bits
        float acc = 0.0f;
        for (int64_t l = 0; l < layers; ++l) {
            const float f = (sums && sums[l] > 0.0) ? (float)(1.0 / sums[l]) : 1.0f;
            for (int64_t r = 0; r < rpl; ++r)
                acc = __fadd_rn(acc, __fmul_rn(s[(l * rpl + r) * n + i], f));
        }
        out[i] = acc;
    }
}

}  // namespace
}  // namespace kve

using namespace kve;

extern "C" size_t kve_cuda_layer_stats_workspace_size(int64_t layers, int64_t count) {
    if (layers <= 0) return 0;
    return (size_t)(layers * ls_blocks(count)) * sizeof(double2);
}

extern "C" int kve_cuda_layer_stats(const float* scores, int64_t layer_stride, int64_t count,
                                    int64_t layers, double* sums, double* entropy, void* ws,
                                    size_t ws_bytes, void* stream) {
    if (layers < 0 || count < 0 || layers > 65535) return (int)cudaErrorInvalidValue;
    if (layers == 0) return 0;
    if (!sums && !entropy) return 0;
    if ((count > 0 && !scores) || (layers > 1 && layer_stride < count))
        return (int)cudaErrorInvalidValue;
    if (!ws || ws_bytes < kve_cuda_layer_stats_workspace_size(layers, count))
        return (int)cudaErrorInvalidValue;
    cudaStream_t st = KVE_STREAM(stream);
    const int nb = (int)ls_blocks(count);
    double2* part = reinterpret_cast<double2*>(ws);
    KVE_CHECK(launch_kernel(layer_stats_partial, dim3((unsigned)nb, (unsigned)layers), LS_NT, 0, st,
        scores, layer_stride, count, nb, part));
    KVE_CHECK(launch_kernel(layer_stats_final, (unsigned)ceil_div(layers, 128), 128, 0, st, part,
        nb, layers, sums, entropy));
    return 0;
}

extern "C" int kve_cuda_token_reduce(const float* scores, const double* sums, int64_t layers,
                                     int64_t rows_per_layer, int64_t n, float* out,
                                     void* stream) {
    if (layers < 0 || rows_per_layer < 0 || n < 0) return (int)cudaErrorInvalidValue;
    if (n == 0) return 0;
    if (!out || ((layers > 0 && rows_per_layer > 0) && !scores)) return (int)cudaErrorInvalidValue;
    int64_t bx = ceil_div(n, 256);
    if (bx > 65535) bx = 65535;
    KVE_CHECK(launch_kernel(token_reduce_kernel, (unsigned)bx, 256, 0, KVE_STREAM(stream), scores,
        sums, layers, rows_per_layer, n, out));
    return 0;
}
