// Shared device helpers for the kvevict kernels: dtype loads, strided views,
// order-preserving float bits, warp/block reductions, launch plumbing.
#pragma once

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>
#include <mutex>

#include "kvevict_cuda.h"

namespace kve {

// ------------------------------------------------------------------ dtypes --
template <typename T> __device__ __forceinline__ float to_f32(T x);
template <> __device__ __forceinline__ float to_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ float to_f32<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 x) {
    return __bfloat162float(x);
}

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

template <typename T> __device__ __forceinline__ T zero_val() { return from_f32<T>(0.0f); }

// Element size of a dtype code; 0 for an unknown code.
static inline int dtype_size(int32_t dt) {
    return dt == KVE_CUDA_F32 ? 4 : (dt == KVE_CUDA_F16 || dt == KVE_CUDA_BF16) ? 2 : 0;
}

// ------------------------------------------------------------------- views --
// Device-side copy of the view descriptor (passed by value to kernels).
struct View {
    void* data;
    int64_t sh, st, sd;  // element strides: head, token, dim
    int64_t heads, tokens, dim;
};

static inline View to_view(const kve_cuda_view& v) {
    return View{v.data, v.stride_head, v.stride_token, v.stride_dim, v.heads, v.tokens, v.dim};
}

template <typename T>
__device__ __forceinline__ const T* elem_ptr(const View& v, int64_t h, int64_t t, int64_t d) {
    return reinterpret_cast<const T*>(v.data) + h * v.sh + t * v.st + d * v.sd;
}
template <typename T>
__device__ __forceinline__ T* elem_ptr_mut(const View& v, int64_t h, int64_t t, int64_t d) {
    return reinterpret_cast<T*>(v.data) + h * v.sh + t * v.st + d * v.sd;
}

// Host-side validation of a view: known dtype, non-null data when non-empty,
// non-negative extents and strides, and the largest element offset fits int64.
static inline bool view_ok(const kve_cuda_view* v) {
    if (!v) return false;
    if (dtype_size(v->dtype) == 0 || v->reserved != 0) return false;
    if (v->heads < 0 || v->tokens < 0 || v->dim < 0) return false;
    if (v->stride_head < 0 || v->stride_token < 0 || v->stride_dim < 0) return false;
    if (v->heads == 0 || v->tokens == 0 || v->dim == 0) return true;
    if (!v->data) return false;
    const double span = (double)(v->heads - 1) * (double)v->stride_head +
                        (double)(v->tokens - 1) * (double)v->stride_token +
                        (double)(v->dim - 1) * (double)v->stride_dim;
    return span < 9.0e18;
}

// ------------------------------------------------- order-preserving floats --
// Monotone map float -> uint32: a < b (as floats, -0 == +0 treated as equal
// after canonicalisation) iff key(a) < key(b). NaN maps to 0 (ranks lowest).
__device__ __forceinline__ uint32_t float_key(float f) {
    if (f != f) return 0u;
    if (f == 0.0f) f = 0.0f;  // -0 -> +0
    uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// ------------------------------------------------------ rows of scores --
// Selection's input (select.cu, shard.cu): rows of `n` scores `ld` apart, each row's
// value scaled as the core's selection compares them: score · (f32)(1 / layer sum)
// (src/math/budget/mod.rs: scale = (1.0 / lsum) as f32, then an f32 product), the sum of
// row r at ls[r / rpl]; the score itself without sums (ls NULL) or where a sum is <= 0.
struct ScoreRows {
    const float* s;
    int64_t ld, n;
    const double* ls;
    int64_t rpl;

    __device__ __forceinline__ float scale(int64_t r) const {
        if (!ls) return 1.0f;
        const double sum = ls[r / rpl];
        return sum > 0.0 ? (float)(1.0 / sum) : 1.0f;
    }
    // value of (r, i), `sc` = scale(r)
    __device__ __forceinline__ float value(int64_t r, int64_t i, float sc) const {
        return s[r * ld + i] * sc;
    }
};

inline ScoreRows score_rows(const float* s, int64_t ld, int64_t n, const double* ls,
                            int64_t rpl) {
    return ScoreRows{s, ld, n, ls, ls ? rpl : 1};
}

// ----------------------------------------------------- block compaction --
// One chunk of an order-keeping block-wide compaction (NT threads, `wcount` NT / 32
// shared ints): the threads whose `keep` is set write `i` to `out[base + their rank]`,
// ranked by thread; returns how many the block kept. Ends on a barrier, so `wcount` may
// be reused by the next chunk.
template <int NT>
__device__ __forceinline__ int block_compact(bool keep, int64_t i, int32_t* out, int64_t base,
                                             int* wcount) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned bal = __ballot_sync(0xffffffffu, keep);
    if (lane == 0) wcount[warp] = __popc(bal);
    __syncthreads();
    int off = 0, tot = 0;
    for (int w = 0; w < NT / 32; ++w) {
        if (w < warp) off += wcount[w];
        tot += wcount[w];
    }
    if (keep) out[base + off + __popc(bal & ((1u << lane) - 1u))] = (int32_t)i;
    __syncthreads();
    return tot;
}

// -------------------------------------------------------------- reductions --
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ double warp_sum_d(double x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// ------------------------------------------------------------------- host --
static inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// Enqueues kernel<<<grid, block, smem, st>>>(args...) and returns this launch's own status.
// cudaLaunchKernelEx's return value (not cudaGetLastError) so that an earlier, unrelated
// non-sticky error of the caller is neither reported as ours nor cleared.
template <typename... P, typename... A>
static inline int launch_kernel(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                                cudaStream_t st, A&&... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    return (int)cudaLaunchKernelEx(&cfg, kernel, static_cast<A&&>(args)...);
}

// Raises a kernel's dynamic shared-memory limit when it needs more than the
// default 48 KiB. Host-side only (no synchronisation). Done once per (kernel,
// device, size): later launches make no API call at all. The one call runs with
// the thread's capture mode exchanged to relaxed, so a first launch inside a
// global-mode stream capture is not refused as "potentially unsafe".
template <typename K>
static inline int set_smem(K kernel, size_t bytes) {
    if (bytes <= 48 * 1024) return 0;
    struct Entry {
        const void* fn;
        int dev;
        size_t bytes;
    };
    static std::mutex mu;
    static Entry cache[256];
    static int used = 0;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return (int)e;
    const void* fn = reinterpret_cast<const void*>(kernel);
    std::lock_guard<std::mutex> lock(mu);
    for (int i = 0; i < used; ++i)
        if (cache[i].fn == fn && cache[i].dev == dev && cache[i].bytes >= bytes) return 0;
    int optin = 0;
    e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e != cudaSuccess) return (int)e;
    if ((size_t)optin < bytes) return (int)cudaErrorInvalidValue;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    cudaThreadExchangeStreamCaptureMode(&mode);  // restore the caller's mode
    if (e != cudaSuccess) return (int)e;
    int slot = -1;
    for (int i = 0; i < used; ++i)
        if (cache[i].fn == fn && cache[i].dev == dev) slot = i;
    if (slot < 0 && used < 256) slot = used++;
    if (slot >= 0) cache[slot] = Entry{fn, dev, bytes};
    return 0;
}

}  // namespace kve

#define KVE_STREAM(s) (reinterpret_cast<cudaStream_t>(s))
#define KVE_CHECK(x)                       \
    do {                                   \
        int kve_rc_ = (int)(x);            \
        if (kve_rc_ != 0) return kve_rc_;  \
    } while (0)
