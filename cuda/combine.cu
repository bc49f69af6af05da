// Score combination per KV group (SPEC §3): products with the value term, head
// factors, the GQA reduction (mean / max / sum), and LaProx's exact-GQA norm.
#include "common.cuh"

namespace kve {
namespace {

__global__ void head_reduce_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                   int b_mode, const float* __restrict__ scale, int64_t ld_in,
                                   float* __restrict__ out, int64_t ld_out, int g, int64_t n,
                                   int op) {
    const int64_t hk = blockIdx.y;
    const float sc = scale ? scale[hk] : 1.0f;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float red = (op == KVE_CUDA_GQA_MAX) ? -INFINITY : 0.0f;
        for (int hh = 0; hh < g; ++hh) {
            const int64_t h = hk * g + hh;
            float x = a[h * ld_in + i];
            if (b_mode == 1) x *= sqrtf(fmaxf(b[h * ld_in + i], 0.0f));
            else if (b_mode == 2) x *= b[h * ld_in + i];
            x *= sc;
            red = (op == KVE_CUDA_GQA_MAX) ? fmaxf(red, x) : red + x;
        }
        out[hk * ld_out + i] = (op == KVE_CUDA_GQA_MEAN) ? red / (float)g : red;
    }
}

__global__ void laprox_exact_kernel(const float* __restrict__ cross, const float* __restrict__ qv,
                                    float* __restrict__ out, int g, int64_t n, int mode) {
    const int64_t hk = blockIdx.y;
    const int np = g * (g + 1) / 2;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        // blocks: the diagonal (a, a) for p < g, then the pairs a < b (counted twice)
        float s = 0.0f, vsum = 0.0f;
        for (int p = 0; p < np; ++p) {
            const float c = cross[(hk * np + p) * n + i];
            const float w = p < g ? 1.0f : 2.0f;
            if (mode == 0) {
                s += w * c * qv[(hk * np + p) * n + i];
            } else {
                s += w * c;
                if (p < g) vsum += sqrtf(fmaxf(qv[(hk * np + p) * n + i], 0.0f));
            }
        }
        out[hk * n + i] = mode == 0 ? sqrtf(fmaxf(s, 0.0f))
                                    : sqrtf(fmaxf(s, 0.0f)) * (vsum / (float)g);
    }
}

}  // namespace
}  // namespace kve

using namespace kve;

extern "C" int kve_cuda_head_reduce(const float* a, const float* b, int b_mode,
                                    const float* scale, int64_t ld_in, float* out,
                                    int64_t ld_out, int64_t hq, int64_t hkv, int64_t n,
                                    int gqa_op, void* stream) {
    if (hq <= 0 || hkv <= 0 || hq % hkv != 0 || n < 0 || hkv > 65535)
        return (int)cudaErrorInvalidValue;
    if (b_mode < 0 || b_mode > 2 || gqa_op < 0 || gqa_op > 2) return (int)cudaErrorInvalidValue;
    if (n == 0) return 0;
    if (!a || !out || (b_mode != 0 && !b) || ld_in < n || ld_out < n)
        return (int)cudaErrorInvalidValue;
    int64_t bx = ceil_div(n, 256);
    if (bx > 65535) bx = 65535;
    head_reduce_kernel<<<dim3((unsigned)bx, (unsigned)hkv), 256, 0, KVE_STREAM(stream)>>>(
        a, b, b_mode, scale, ld_in, out, ld_out, (int)(hq / hkv), n, gqa_op);
    return launch_status();
}

extern "C" int kve_cuda_laprox_exact(const float* cross, const float* qv, float* out,
                                     int64_t hkv, int64_t g, int64_t n, int mode, void* stream) {
    if (hkv <= 0 || hkv > 65535 || g <= 0 || g > 64 || n < 0 || mode < 0 || mode > 1)
        return (int)cudaErrorInvalidValue;
    if (n == 0) return 0;
    if (!cross || !qv || !out) return (int)cudaErrorInvalidValue;
    int64_t bx = ceil_div(n, 256);
    if (bx > 65535) bx = 65535;
    laprox_exact_kernel<<<dim3((unsigned)bx, (unsigned)hkv), 256, 0, KVE_STREAM(stream)>>>(
        cross, qv, out, (int)g, n, mode);
    return launch_status();
}
