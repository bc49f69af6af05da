// LAVa head factor (design §3): c[hk] = max over prefix tokens of ||V[hk,i,:]||_1.
// Each block reduces a token range to its max and publishes it with an integer
// atomicMax on the float bits (valid because every value is >= 0); the launcher
// zeroes the output first with cudaMemsetAsync (a stream operation).
#include "common.cuh"

namespace kve {
namespace {

constexpr int LF_NT = 256;
constexpr int LF_TOKENS = 256;  // tokens per block

template <typename T>
__global__ void __launch_bounds__(LF_NT) lava_factor_kernel(View v, int64_t prefix, float* out) {
    __shared__ float wmax[LF_NT / 32];
    const int hk = blockIdx.y;
    const int64_t t0 = (int64_t)blockIdx.x * LF_TOKENS;
    const int64_t t1 = min(prefix, t0 + LF_TOKENS);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int dim = (int)v.dim;
    float best = 0.0f;
    if (v.sd == 1 || v.st != 1) {
        // one warp per token, lanes along the (unit-stride) dim
        for (int64_t t = t0 + warp; t < t1; t += LF_NT / 32) {
            float s = 0.0f;
            for (int d = lane; d < dim; d += 32) s += fabsf(to_f32<T>(*elem_ptr<T>(v, hk, t, d)));
            s = warp_sum(s);
            best = fmaxf(best, s);
        }
    } else {
        // transposed layout: one thread per token, coalesced along tokens
        for (int64_t t = t0 + threadIdx.x; t < t1; t += LF_NT) {
            float s = 0.0f;
            for (int d = 0; d < dim; ++d) s += fabsf(to_f32<T>(*elem_ptr<T>(v, hk, t, d)));
            best = fmaxf(best, s);
        }
    }
    best = warp_max(best);
    if (lane == 0) wmax[warp] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
        float b = 0.0f;
        for (int w = 0; w < LF_NT / 32; ++w) b = fmaxf(b, wmax[w]);
        if (b > 0.0f) atomicMax(reinterpret_cast<int*>(out + hk), __float_as_int(b));
    }
}

}  // namespace
}  // namespace kve

using namespace kve;

extern "C" int kve_cuda_lava_factor(const kve_cuda_view* v, int64_t prefix, float* out,
                                    void* stream) {
    if (!view_ok(v) || !out) return (int)cudaErrorInvalidValue;
    if (prefix < 0 || prefix > v->tokens || v->heads <= 0 || v->heads > 65535)
        return (int)cudaErrorInvalidValue;
    cudaStream_t st = KVE_STREAM(stream);
    KVE_CHECK(cudaMemsetAsync(out, 0, (size_t)v->heads * sizeof(float), st));
    if (prefix == 0 || v->dim == 0) return 0;
    const View vv = to_view(*v);
    const dim3 grid((unsigned)ceil_div(prefix, LF_TOKENS), (unsigned)v->heads);
    switch (v->dtype) {
        case KVE_CUDA_F32: KVE_CHECK(launch_kernel(lava_factor_kernel<float>, grid, LF_NT, 0, st,
            vv, prefix, out)); break;
        case KVE_CUDA_F16: KVE_CHECK(launch_kernel(lava_factor_kernel<__half>, grid, LF_NT, 0, st,
            vv, prefix, out)); break;
        case KVE_CUDA_BF16:
            KVE_CHECK(launch_kernel(lava_factor_kernel<__nv_bfloat16>, grid, LF_NT, 0, st, vv,
                prefix, out));
            break;
        default: return (int)cudaErrorInvalidValue;
    }
    return 0;
}
