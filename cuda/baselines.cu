// Scores of the baseline scorers (design §3) that need no attention: KNorm
// (-||K[h,i]||_2, in the core's f32 lane order), StreamingLLM's sink scores, and
// CriticalKV's second stage ((base + 1e-4) · value L1 norm, the first stage's kept
// tokens forced to FLT_MAX); and the power any scorer's output may be raised to
// (kve_score_params.power). Each equals the core bit for bit; no workspace.
#include <float.h>

#include "common.cuh"

namespace kve {
namespace {

constexpr int BL_NT = 256;
constexpr int KN_TOK = 128;  // knorm: tokens (= threads) per block
constexpr int KN_DCH = 32;   // knorm: dims per staged chunk
static_assert(KN_DCH % 16 == 0, "a chunk starts at a multiple of the 16 lanes");

// out[h*ld_out + i] = -sqrt(Σ_d K[h,i,d]²) in f32 in the core's lane order (lane d % 16 by
// FMA, then the halving tree; src/lanes.rs): the core's knorm bit for bit. Chunks of [KN_TOK tokens x KN_DCH dims] are staged
// through shared memory with loads coalesced along the view's unit stride (dim, or
// tokens for transposed layouts); then each thread sums its own token in its 16 lanes.
template <typename T>
__global__ void __launch_bounds__(KN_TOK)
    knorm_kernel(View k, int64_t prefix, float* __restrict__ out, int64_t ld_out) {
    __shared__ float tile[KN_TOK * (KN_DCH + 1)];
    const int64_t h = blockIdx.y;
    const int64_t t0 = (int64_t)blockIdx.x * KN_TOK;
    const int nt = (int)min((int64_t)KN_TOK, prefix - t0);
    const int dim = (int)k.dim;
    const bool dim_fast = k.sd == 1 || k.st != 1;
    float lane[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) lane[j] = 0.0f;
    for (int d0 = 0; d0 < dim; d0 += KN_DCH) {
        const int nd = min(KN_DCH, dim - d0);
        // (unrolled by 8 only: the 16 lanes stay live across it)
#pragma unroll 8
        for (int e = threadIdx.x; e < KN_TOK * KN_DCH; e += KN_TOK) {
            int r, d;
            if (dim_fast) {
                r = e / KN_DCH;
                d = e - r * KN_DCH;
            } else {
                d = e / KN_TOK;
                r = e - d * KN_TOK;
            }
            // dims past the row are +0: the lanes' FMA adds nothing (the core pads so too)
            if (r < nt)
                tile[r * (KN_DCH + 1) + d] =
                    d < nd ? to_f32<T>(*elem_ptr<T>(k, h, t0 + r, d0 + d)) : 0.0f;
        }
        __syncthreads();
        if (threadIdx.x < nt)
#pragma unroll 1
            for (int dd = 0; dd < KN_DCH; dd += 16) {
                // d0 and dd are multiples of 16, so lane j holds the dims d ≡ j (mod 16)
                const float* row = tile + threadIdx.x * (KN_DCH + 1) + dd;
#pragma unroll
                for (int j = 0; j < 16; ++j) lane[j] = __fmaf_rn(row[j], row[j], lane[j]);
            }
        __syncthreads();
    }
    // the core's halving tree over the 16 lanes (crate::lanes::tree16)
#pragma unroll
    for (int j = 0; j < 8; ++j) lane[j] = __fadd_rn(lane[j], lane[j + 8]);
#pragma unroll
    for (int j = 0; j < 4; ++j) lane[j] = __fadd_rn(lane[j], lane[j + 4]);
#pragma unroll
    for (int j = 0; j < 2; ++j) lane[j] = __fadd_rn(lane[j], lane[j + 2]);
    lane[0] = __fadd_rn(lane[0], lane[1]);
    if (threadIdx.x < nt) out[h * ld_out + t0 + threadIdx.x] = -sqrtf(lane[0]);
}

__global__ void sink_kernel(float* __restrict__ out, int64_t rows, int64_t n, int64_t ld,
                            int64_t sinks) {
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
             i += (int64_t)gridDim.x * blockDim.x)
            out[r * ld + i] = i < sinks ? 1.0f : 0.0f;
}

// kve_score_params.power: the core's src/math/score/power.rs bit for bit (products rounded one
// by one: __fmul_rn is never contracted into an FMA).
__global__ void power_kernel(float* __restrict__ s, int64_t rows, int64_t n, int64_t ld,
                             int power) {
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
             i += (int64_t)gridDim.x * blockDim.x) {
            const float x = s[r * ld + i];
            const float a = fabsf(x);
            float t = a;
            for (int k = 1; k < power; ++k) t = __fmul_rn(t, a);
            if (t > FLT_MAX) t = FLT_MAX;  // a NaN stays NaN
            s[r * ld + i] = copysignf(t, x);
        }
}

// out may be base (same ld): no __restrict__ on either; each element is read, then
// written, by one thread. The arithmetic is the core's f32 (s + 1e-4) · l1, unfused.
__global__ void critical_product_kernel(const float* base, int64_t ld_base,
                                        const float* __restrict__ l1, int64_t ld_l1, int64_t rows,
                                        int64_t n, float* out, int64_t ld_out) {
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
             i += (int64_t)gridDim.x * blockDim.x)
            out[r * ld_out + i] = __fmul_rn(__fadd_rn(base[r * ld_base + i], 1e-4f), l1[r * ld_l1 + i]);
}

// The first stage's kept positions score FLT_MAX. A list holds distinct positions
// in [0, n): at most n entries are read, and positions outside [0, n) are skipped.
__global__ void critical_force_kernel(const int32_t* __restrict__ counts,
                                      const int32_t* __restrict__ idx, int64_t idx_ld,
                                      int64_t rows, int64_t n, float* __restrict__ out,
                                      int64_t ld_out) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int64_t c = min((int64_t)counts[r], n);
        for (int64_t t = threadIdx.x; t < c; t += blockDim.x) {
            const int64_t i = idx[r * idx_ld + t];
            if (i >= 0 && i < n) out[r * ld_out + i] = FLT_MAX;
        }
    }
}

// Grid of the elementwise [rows, n] kernels.
dim3 rows_grid(int64_t rows, int64_t n) {
    int64_t bx = ceil_div(n, BL_NT);
    if (bx > 65535) bx = 65535;
    const int64_t by = rows > 65535 ? 65535 : rows;
    return dim3((unsigned)bx, (unsigned)by);
}

}  // namespace
}  // namespace kve

using namespace kve;

extern "C" int kve_cuda_knorm(const kve_cuda_view* k, int64_t prefix, float* out, int64_t ld_out,
                              void* stream) {
    if (!view_ok(k)) return (int)cudaErrorInvalidValue;
    if (prefix < 0 || prefix > k->tokens || k->heads > 65535) return (int)cudaErrorInvalidValue;
    if (prefix == 0 || k->heads == 0) return 0;
    if (!out || ld_out < prefix) return (int)cudaErrorInvalidValue;
    const View kv = to_view(*k);
    const dim3 grid((unsigned)ceil_div(prefix, KN_TOK), (unsigned)k->heads);
    cudaStream_t st = KVE_STREAM(stream);
    switch (k->dtype) {
        case KVE_CUDA_F32: KVE_CHECK(launch_kernel(knorm_kernel<float>, grid, KN_TOK, 0, st, kv,
            prefix, out, ld_out)); break;
        case KVE_CUDA_F16: KVE_CHECK(launch_kernel(knorm_kernel<__half>, grid, KN_TOK, 0, st, kv,
            prefix, out, ld_out)); break;
        case KVE_CUDA_BF16:
            KVE_CHECK(launch_kernel(knorm_kernel<__nv_bfloat16>, grid, KN_TOK, 0, st, kv, prefix,
                out, ld_out));
            break;
        default: return (int)cudaErrorInvalidValue;
    }
    return 0;
}

extern "C" int kve_cuda_sink_scores(float* out, int64_t rows, int64_t n, int64_t ld, int64_t sinks,
                                    void* stream) {
    if (rows < 0 || n < 0) return (int)cudaErrorInvalidValue;
    if (rows == 0 || n == 0) return 0;
    if (!out || ld < n) return (int)cudaErrorInvalidValue;
    KVE_CHECK(launch_kernel(sink_kernel, rows_grid(rows, n), BL_NT, 0, KVE_STREAM(stream), out,
        rows, n, ld, sinks));
    return 0;
}

extern "C" int kve_cuda_score_power(float* scores, int64_t rows, int64_t n, int64_t ld,
                                    int power, void* stream) {
    if (rows < 0 || n < 0 || power < 1 || power > 16) return (int)cudaErrorInvalidValue;
    if (rows == 0 || n == 0 || power == 1) return 0;
    if (!scores || ld < n) return (int)cudaErrorInvalidValue;
    KVE_CHECK(launch_kernel(power_kernel, rows_grid(rows, n), BL_NT, 0, KVE_STREAM(stream),
        scores, rows, n, ld, power));
    return 0;
}

extern "C" int kve_cuda_critical_combine(const float* base, int64_t ld_base,
                                         const float* value_l1, int64_t ld_l1,
                                         const int32_t* counts, const int32_t* idx,
                                         int64_t idx_ld, int64_t rows, int64_t n, float* out,
                                         int64_t ld_out, void* stream) {
    if (rows < 0 || n < 0) return (int)cudaErrorInvalidValue;
    if (rows == 0 || n == 0) return 0;
    if (!base || !value_l1 || !out || !counts || !idx) return (int)cudaErrorInvalidValue;
    if (ld_base < n || ld_l1 < n || ld_out < n || idx_ld < 0) return (int)cudaErrorInvalidValue;
    // in place only element for element
    if (out == base && ld_out != ld_base) return (int)cudaErrorInvalidValue;
    if (out == value_l1) return (int)cudaErrorInvalidValue;
    cudaStream_t st = KVE_STREAM(stream);
    KVE_CHECK(launch_kernel(critical_product_kernel, rows_grid(rows, n), BL_NT, 0, st, base,
        ld_base, value_l1, ld_l1, rows, n, out, ld_out));
    const unsigned blocks = (unsigned)(rows > 65535 ? 65535 : rows);
    KVE_CHECK(launch_kernel(critical_force_kernel, blocks, BL_NT, 0, st, counts, idx, idx_ld, rows,
        n, out, ld_out));
    return 0;
}
