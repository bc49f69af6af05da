// 1-D pooling along tokens (design §3): avg (count_include_pad zeros), max (-inf
// padding), forward ("continuation pooling": out[i] = max_{0<=j<k} decay^j in[i-j]).
// One thread per output element; the k inputs come through L1.
#include "common.cuh"

namespace kve {
namespace {

__global__ void pool_kernel(const float* __restrict__ in, int64_t ld_in, float* __restrict__ out,
                            int64_t ld_out, int64_t n, int mode, int k, float decay) {
    const int64_t row = blockIdx.y;
    const float* x = in + row * ld_in;
    float* y = out + row * ld_out;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float r;
        if (mode == KVE_CUDA_POOL_AVG) {
            const int64_t lo = i - k / 2;
            float s = 0.0f;
            for (int j = 0; j < k; ++j) {
                const int64_t t = lo + j;
                if (t >= 0 && t < n) s += x[t];
            }
            r = s / (float)k;
        } else if (mode == KVE_CUDA_POOL_MAX) {
            const int64_t lo = i - k / 2;
            float m = -INFINITY;
            for (int j = 0; j < k; ++j) {
                const int64_t t = lo + j;
                if (t >= 0 && t < n) m = fmaxf(m, x[t]);
            }
            r = m;
        } else {
            float m = -INFINITY, f = 1.0f;
            for (int j = 0; j < k && j <= i; ++j) {
                m = fmaxf(m, f * x[i - j]);
                f *= decay;
            }
            r = m;
        }
        y[i] = r;
    }
}

}  // namespace
}  // namespace kve

using namespace kve;

extern "C" int kve_cuda_pool(const float* in, int64_t ld_in, float* out, int64_t ld_out,
                             int64_t rows, int64_t n, int mode, int k, float decay,
                             void* stream) {
    if (rows < 0 || n < 0 || k < 1 || k > 4096) return (int)cudaErrorInvalidValue;
    if (mode < KVE_CUDA_POOL_AVG || mode > KVE_CUDA_POOL_FORWARD) return (int)cudaErrorInvalidValue;
    if (mode != KVE_CUDA_POOL_FORWARD && k % 2 == 0) return (int)cudaErrorInvalidValue;
    if (rows == 0 || n == 0) return 0;
    if (!in || !out || ld_in < n || ld_out < n || rows > 65535) return (int)cudaErrorInvalidValue;
    int64_t bx = ceil_div(n, 256);
    if (bx > 65535) bx = 65535;
    KVE_CHECK(launch_kernel(pool_kernel, dim3((unsigned)bx, (unsigned)rows), 256, 0,
        KVE_STREAM(stream), in, ld_in, out, ld_out, n, mode, k, decay));
    return 0;
}
