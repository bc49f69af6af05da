// Score combination per KV group (design §3): products with the value term, head
// factors, the GQA reduction (mean / max / sum), and LaProx's exact-GQA norm (or its
// mean-attn attention and value terms, alone or multiplied). Row strides everywhere.
#include "common.cuh"

namespace kve {
namespace {

// op over hh < g of term(hh) in the core's order (src/math/score reduce_rows): the first head,
// then max / sum, unfused; the mean as a product with 1/g.
template <typename F>
__device__ __forceinline__ float gqa_reduce(int g, int op, F term) {
    float red = 0.0f;
    for (int hh = 0; hh < g; ++hh) {
        const float x = term(hh);
        red = hh == 0 ? x : (op == KVE_CUDA_GQA_MAX) ? fmaxf(red, x) : __fadd_rn(red, x);
    }
    return (op == KVE_CUDA_GQA_MEAN) ? __fmul_rn(red, 1.0f / (float)g) : red;
}

// a and out may be the same array (Hkv == Hq, ld_out == ld_a): no __restrict__ on
// them; every element is read before it is written, by the same thread.
// Arithmetic in the core's order, unfused (src/math/score: products, then reduce_rows), so
// equal inputs give the core's bits.
__global__ void head_reduce_kernel(const float* a, int64_t ld_a, const float* __restrict__ b,
                                   int64_t ld_b, int b_mode, const float* __restrict__ scale,
                                   float* out, int64_t ld_out, int g, int64_t n, int op) {
    const int64_t hk = blockIdx.y;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        out[hk * ld_out + i] = gqa_reduce(g, op, [&](int hh) {
            const int64_t h = hk * g + hh;
            float x = a[h * ld_a + i];
            if (b_mode == 1) x = __fmul_rn(x, sqrtf(fmaxf(b[h * ld_b + i], 0.0f)));
            else if (b_mode == 2) x = __fmul_rn(x, b[h * ld_b + i]);
            if (scale) x = __fmul_rn(x, scale[hk]);
            return x;
        });
    }
}

// Every one of the g rows of a reduced once per element, the result written to `reps` rows
// of out (TOVA: the mean over all query heads, one copy per KV head). a and out may be the
// same array with the same ld (element for element, as above).
__global__ void head_reduce_all_kernel(const float* a, int64_t ld_a, float* out, int64_t ld_out,
                                       int g, int64_t reps, int64_t n, int op) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float r = gqa_reduce(g, op, [&](int hh) { return a[hh * ld_a + i]; });
        for (int64_t k = 0; k < reps; ++k) out[k * ld_out + i] = r;
    }
}

// mode 0: sqrt(max(0, Σ_ab C_ab Q_ab)); 1: sqrt(max(0, Σ C)) · mean_h sqrt(max(0, Q_hh));
// 2: the attention term alone (qv unread); 3: the value term alone (cross unread).
// Blocks: the diagonal (a, a) for p < g, then the pairs a < b (counted twice).
// Sums in the core's order, unfused (src/math/score/laprox.rs Exact / MeanAttn).
__global__ void laprox_exact_kernel(const float* __restrict__ cross, int64_t ld_cross,
                                    const float* __restrict__ qv, int64_t ld_qv,
                                    float* __restrict__ out, int64_t ld_out, int g, int64_t n,
                                    int mode) {
    const int64_t hk = blockIdx.y;
    const int np = g * (g + 1) / 2;
    const bool use_c = mode != KVE_CUDA_LAPROX_VALUE_TERM;
    const bool use_q = mode != KVE_CUDA_LAPROX_ATTN_TERM;
    const float fg = (float)g;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float r;
        if (mode == KVE_CUDA_LAPROX_EXACT) {
            float s = 0.0f;
            for (int p = 0; p < np; ++p) {
                const int64_t row = hk * np + p;
                const float w = p < g ? 1.0f : 2.0f;
                s = __fadd_rn(s, __fmul_rn(__fmul_rn(w, cross[row * ld_cross + i]),
                                           qv[row * ld_qv + i]));
            }
            r = sqrtf(fmaxf(s, 0.0f));
        } else {
            float att = 0.0f, val = 0.0f;
            if (use_c) {
                for (int p = 0; p < np; ++p) {
                    const float c = cross[(hk * np + p) * ld_cross + i];
                    att = __fadd_rn(att, p < g ? c : __fmul_rn(2.0f, c));
                }
                att = sqrtf(fmaxf(att, 0.0f));
            }
            if (use_q)
                for (int p = 0; p < g; ++p)
                    val = __fadd_rn(val, __fdiv_rn(sqrtf(fmaxf(qv[(hk * np + p) * ld_qv + i], 0.0f)), fg));
            r = mode == KVE_CUDA_LAPROX_MEAN_ATTN ? __fmul_rn(val, att)
                : mode == KVE_CUDA_LAPROX_ATTN_TERM ? att
                                                     : val;
        }
        out[hk * ld_out + i] = r;
    }
}

}  // namespace
}  // namespace kve

using namespace kve;

extern "C" int kve_cuda_head_reduce(const float* a, int64_t ld_a, const float* b, int64_t ld_b,
                                    int b_mode, const float* scale, float* out, int64_t ld_out,
                                    int64_t hq, int64_t hkv, int64_t n, int gqa_op,
                                    void* stream) {
    if (hq <= 0 || hkv <= 0 || hq % hkv != 0 || n < 0 || hkv > 65535)
        return (int)cudaErrorInvalidValue;
    if (b_mode < 0 || b_mode > 2 || gqa_op < 0 || gqa_op > 2) return (int)cudaErrorInvalidValue;
    if (n == 0) return 0;
    if (!a || !out || ld_a < n || ld_out < n) return (int)cudaErrorInvalidValue;
    if (b_mode != 0 && (!b || ld_b < n)) return (int)cudaErrorInvalidValue;
    // in place only element for element (one head per group, same row stride)
    if (out == a && (hkv != hq || ld_out != ld_a)) return (int)cudaErrorInvalidValue;
    int64_t bx = ceil_div(n, 256);
    if (bx > 65535) bx = 65535;
    KVE_CHECK(launch_kernel(head_reduce_kernel, dim3((unsigned)bx, (unsigned)hkv), 256, 0,
        KVE_STREAM(stream), a, ld_a, b_mode != 0 ? b : nullptr, ld_b, b_mode, scale, out, ld_out,
        (int)(hq / hkv), n, gqa_op));
    return 0;
}

extern "C" int kve_cuda_head_reduce_all(const float* a, int64_t ld_a, float* out, int64_t ld_out,
                                        int64_t hq, int64_t reps, int64_t n, int gqa_op,
                                        void* stream) {
    if (hq <= 0 || hq > INT32_MAX || reps <= 0 || n < 0 || gqa_op < 0 || gqa_op > 2)
        return (int)cudaErrorInvalidValue;
    if (n == 0) return 0;
    if (!a || !out || ld_a < n || ld_out < n) return (int)cudaErrorInvalidValue;
    if (out == a && ld_out != ld_a) return (int)cudaErrorInvalidValue;
    int64_t bx = ceil_div(n, 256);
    if (bx > 65535) bx = 65535;
    KVE_CHECK(launch_kernel(head_reduce_all_kernel, (unsigned)bx, 256, 0, KVE_STREAM(stream), a,
                            ld_a, out, ld_out, (int)hq, reps, n, gqa_op));
    return 0;
}

extern "C" int kve_cuda_laprox_exact(const float* cross, int64_t ld_cross, const float* qv,
                                     int64_t ld_qv, float* out, int64_t ld_out, int64_t hkv,
                                     int64_t g, int64_t n, int mode, void* stream) {
    if (hkv <= 0 || hkv > 65535 || g <= 0 || g > 64 || n < 0) return (int)cudaErrorInvalidValue;
    if (mode < KVE_CUDA_LAPROX_EXACT || mode > KVE_CUDA_LAPROX_VALUE_TERM)
        return (int)cudaErrorInvalidValue;
    if (n == 0) return 0;
    const bool use_c = mode != KVE_CUDA_LAPROX_VALUE_TERM;
    const bool use_q = mode != KVE_CUDA_LAPROX_ATTN_TERM;
    if (!out || ld_out < n) return (int)cudaErrorInvalidValue;
    if (use_c && (!cross || ld_cross < n)) return (int)cudaErrorInvalidValue;
    if (use_q && (!qv || ld_qv < n)) return (int)cudaErrorInvalidValue;
    int64_t bx = ceil_div(n, 256);
    if (bx > 65535) bx = 65535;
    KVE_CHECK(launch_kernel(laprox_exact_kernel, dim3((unsigned)bx, (unsigned)hkv), 256, 0,
        KVE_STREAM(stream), use_c ? cross : nullptr, ld_cross, use_q ? qv : nullptr, ld_qv, out,
        ld_out, (int)g, n, mode));
    return 0;
}
