// Value links (design §4, continuation through value runs; the core's src/math/links.rs) and the
// linked forward pool of the selection (the core's pool_forward_linked, src/math/pool.rs).
//
// value_links: one thread per (head, token) computes cos(v[h,t], v[h,t-1]) in the core's
// operation order, so the links are the host's bits on an AVX2 + FMA host:
//  - token rows (any layout but V transposed): the core's dot_v — 8 fused lanes over
//    channels 8 at a time, the lanes summed ((0+4)+(2+6))+((1+5)+(3+7)), the tail unfused;
//  - V transposed (stride_token 1, stride_dim != 1, N > 1): the core's channel pass — one
//    fused chain over channels per token, unfused (mul, then add) for tokens past the last
//    whole 8 of 1..N and for token 0's norm;
//  - cos = (double)dot / sqrt((double)|a|² · (double)|b|²), rounded to float.
// Cosines go to a [heads][N] stage; the second kernel adds them over heads in order and
// then into links[t], as the core's stage does. A non-finite value or squared norm makes
// the token's cosine NaN (the core's NonFinite, which a device cannot return).
#include "tile_loads.cuh"

namespace kve {
namespace {

constexpr int VL_NT = 256;

// a + b·c without contraction into an fma (the core's unfused `s += a * b`).
__device__ __forceinline__ float add_mul_rn(float a, float b, float c) {
    return __fadd_rn(a, __fmul_rn(b, c));
}

__device__ __forceinline__ float link_cos(float dot, float sq, float psq) {
    if (!isfinite(dot) || !isfinite(sq) || !isfinite(psq)) return __int_as_float(0x7fc00000);
    if (!(sq > 0.0f) || !(psq > 0.0f)) return 0.0f;  // a zero vector links nothing
    return (float)((double)dot / sqrt((double)sq * (double)psq));
}

// Channels c .. c+7 of a row as f32 from 16-byte loads (rows contiguous and 16-byte
// aligned): the values of to_f32, 8 (f16/bf16) or 2 x 4 (f32) per load.
__device__ __forceinline__ float2 pair_f32(__half2 h) { return __half22float2(h); }
__device__ __forceinline__ float2 pair_f32(__nv_bfloat162 h) { return __bfloat1622float2(h); }
template <typename T> struct Pair;  // two T in one 32-bit word
template <> struct Pair<__half> { using type = __half2; };
template <> struct Pair<__nv_bfloat16> { using type = __nv_bfloat162; };

// f16 / bf16: the 4 pairs of one load.
template <typename T> __device__ __forceinline__ void load8(const T* p, float* x) {
    const uint4 a = ldg16(p);
    const typename Pair<T>::type* h = reinterpret_cast<const typename Pair<T>::type*>(&a);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 f = pair_f32(h[i]);
        x[2 * i] = f.x;
        x[2 * i + 1] = f.y;
    }
}
template <> __device__ __forceinline__ void load8<float>(const float* p, float* x) {
    const uint4 a = ldg16(p), b = ldg16(p + 4);
    const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int l = 0; l < 8; ++l) x[l] = __uint_as_float(w[l]);
}

// vec: rows contiguous (stride_dim 1), dv a multiple of 8 and every row 16-byte aligned.
template <typename T>
__global__ void __launch_bounds__(VL_NT)
    value_links_rows(View v, bool vec, float* __restrict__ stage) {
    const int64_t t = (int64_t)blockIdx.x * VL_NT + threadIdx.x + 1;
    const int64_t h = blockIdx.y;
    if (t >= v.tokens) return;
    const int64_t dv = v.dim, d8 = dv / 8 * 8;
    const T* a = elem_ptr<T>(v, h, t, 0);
    const T* b = elem_ptr<T>(v, h, t - 1, 0);
    float ld[8], ls[8], lp[8];
#pragma unroll
    for (int l = 0; l < 8; ++l) ld[l] = ls[l] = lp[l] = 0.0f;
    for (int64_t c = 0; c < d8; c += 8) {
        float x[8], y[8];
        if (vec) {
            load8<T>(a + c, x);
            load8<T>(b + c, y);
        } else {
#pragma unroll
            for (int l = 0; l < 8; ++l) {
                x[l] = to_f32(a[(c + l) * v.sd]);
                y[l] = to_f32(b[(c + l) * v.sd]);
            }
        }
#pragma unroll
        for (int l = 0; l < 8; ++l) {
            ld[l] = fmaf(x[l], y[l], ld[l]);
            ls[l] = fmaf(x[l], x[l], ls[l]);
            lp[l] = fmaf(y[l], y[l], lp[l]);
        }
    }
    float dot = ((ld[0] + ld[4]) + (ld[2] + ld[6])) + ((ld[1] + ld[5]) + (ld[3] + ld[7]));
    float sq = ((ls[0] + ls[4]) + (ls[2] + ls[6])) + ((ls[1] + ls[5]) + (ls[3] + ls[7]));
    float psq = ((lp[0] + lp[4]) + (lp[2] + lp[6])) + ((lp[1] + lp[5]) + (lp[3] + lp[7]));
    for (int64_t c = d8; c < dv; ++c) {
        const float x = to_f32(a[c * v.sd]), y = to_f32(b[c * v.sd]);
        dot = add_mul_rn(dot, x, y);
        sq = add_mul_rn(sq, x, x);
        psq = add_mul_rn(psq, y, y);
    }
    stage[h * v.tokens + t] = link_cos(dot, sq, psq);
}

// V transposed: element (h, t, c) with stride_token 1, so a warp reads 32 tokens of a
// channel at once.
template <typename T>
__global__ void __launch_bounds__(VL_NT)
    value_links_channels(View v, float* __restrict__ stage) {
    const int64_t t = (int64_t)blockIdx.x * VL_NT + threadIdx.x + 1;
    const int64_t h = blockIdx.y;
    const int64_t n = v.tokens;
    if (t >= n) return;
    const int64_t body = 1 + (n - 1) / 8 * 8;  // tokens 1 .. body take the fused chain
    const bool fused = t < body, pfused = t - 1 >= 1 && t - 1 < body;
    const T* a = elem_ptr<T>(v, h, t, 0);
    const T* b = elem_ptr<T>(v, h, t - 1, 0);
    float dot = 0.0f, sq = 0.0f, psq = 0.0f;
    for (int64_t c = 0; c < v.dim; ++c) {
        const float x = to_f32(a[c * v.sd]), y = to_f32(b[c * v.sd]);
        if (fused) {
            dot = fmaf(x, y, dot);
            sq = fmaf(x, x, sq);
        } else {
            dot = add_mul_rn(dot, x, y);
            sq = add_mul_rn(sq, x, x);
        }
        psq = pfused ? fmaf(y, y, psq) : add_mul_rn(psq, y, y);
    }
    stage[h * n + t] = link_cos(dot, sq, psq);
}

// links[t] += Σ_h stage[h][t] (heads in order, from +0), 1 <= t < n.
__global__ void __launch_bounds__(VL_NT)
    links_add(const float* __restrict__ stage, int64_t heads, int64_t n,
              float* __restrict__ links) {
    const int64_t t = (int64_t)blockIdx.x * VL_NT + threadIdx.x + 1;
    if (t >= n) return;
    float s = 0.0f;
    for (int64_t h = 0; h < heads; ++h) s += stage[h * n + t];
    links[t] += s;
}

// ----------------------------------------------------------------- linked pool --
// Per row one block walks its n entries in tiles of PL_NT: position j >= sinks takes the
// largest score lent to it by an anchor a in [lo, j), where a run of linked positions
// (links[j] > link_min) keeps the lo of the position that starts it, lo = max(c+1-k,
// sinks). As a segmented max-scan: a segment starts at 0, at `sinks` and at every
// unlinked position c, whose input is max(src[c], src[lo .. c)) (the <= k-1 anchors before
// it); inside a segment best(j) = the scan at j - 1.
constexpr int PL_NT = 256;

__global__ void __launch_bounds__(PL_NT)
    pool_linked_kernel(const float* __restrict__ in, int64_t ld_in, float* __restrict__ out,
                       int64_t ld_out, int64_t n, int k, int64_t sinks,
                       const float* __restrict__ links, float link_min) {
    __shared__ float val[PL_NT];
    __shared__ int head[PL_NT];
    const float* x = in + (int64_t)blockIdx.x * ld_in;
    float* y = out + (int64_t)blockIdx.x * ld_out;
    float carry = -INFINITY;  // the scan at the previous tile's last position
    for (int64_t j0 = 0; j0 < n; j0 += PL_NT) {
        const int64_t j = j0 + threadIdx.x;
        const bool in_range = j < n;
        const float s = in_range ? x[j] : 0.0f;
        const bool starts = !in_range || j == 0 || j == sinks || !(links[j] > link_min);
        float pre = -INFINITY;  // best over the anchors before a segment's start
        if (in_range && starts && j > sinks) {
            int64_t lo = j + 1 - k;
            if (lo < sinks) lo = sinks;
            for (int64_t a = j - 1; a >= lo; --a) pre = fmaxf(pre, x[a]);
        }
        float v = starts ? fmaxf(pre, s) : s;
        int hd = starts ? 1 : 0;
        // inclusive segmented max-scan (Hillis-Steele over the tile)
        for (int off = 1; off < PL_NT; off <<= 1) {
            val[threadIdx.x] = v;
            head[threadIdx.x] = hd;
            __syncthreads();
            if ((int)threadIdx.x >= off && !hd) {
                v = fmaxf(v, val[threadIdx.x - off]);
                hd = head[threadIdx.x - off];
            }
            __syncthreads();
        }
        // a tile's first segment continues the previous tile's
        if (!hd) v = fmaxf(v, carry);
        val[threadIdx.x] = v;
        __syncthreads();
        if (in_range) {
            const float prev = threadIdx.x == 0 ? carry : val[threadIdx.x - 1];
            const float best = starts ? pre : prev;
            y[j] = (j >= sinks && best > s) ? best : s;
        }
        carry = val[PL_NT - 1];
        __syncthreads();
    }
}

}  // namespace
}  // namespace kve

using namespace kve;

extern "C" size_t kve_cuda_links_workspace_size(int64_t heads, int64_t n) {
    if (heads < 0 || n < 0) return 0;
    if ((double)heads * (double)n * 4.0 > 9.0e18) return SIZE_MAX;
    return align_up((size_t)heads * (size_t)n * sizeof(float), 256);
}

extern "C" int kve_cuda_value_links(const kve_cuda_view* v, float* links, void* ws,
                                    size_t ws_bytes, void* stream) {
    if (!view_ok(v)) return (int)cudaErrorInvalidValue;
    if (v->heads > 65535 || v->tokens > ((int64_t)1 << 31) - 1) return (int)cudaErrorInvalidValue;
    if (v->tokens < 2 || v->heads == 0) return 0;  // no token has a predecessor
    if (!links) return (int)cudaErrorInvalidValue;
    const size_t need = kve_cuda_links_workspace_size(v->heads, v->tokens);
    if (!ws || ws_bytes < need || ((uintptr_t)ws & 255u) != 0) return (int)cudaErrorInvalidValue;
    const View vv = to_view(*v);
    float* stage = static_cast<float*>(ws);
    const bool transposed = v->stride_token == 1 && v->stride_dim != 1;
    const int64_t es = dtype_size(v->dtype);
    const bool vec = v->stride_dim == 1 && v->dim % 8 == 0 && ((uintptr_t)v->data & 15u) == 0 &&
                     (v->stride_head * es) % 16 == 0 && (v->stride_token * es) % 16 == 0;
    const dim3 grid((unsigned)ceil_div(v->tokens - 1, VL_NT), (unsigned)v->heads);
    cudaStream_t st = KVE_STREAM(stream);
#define KVE_VL(T)                                                                          \
    KVE_CHECK(transposed                                                                   \
                  ? launch_kernel(value_links_channels<T>, grid, VL_NT, 0, st, vv, stage) \
                  : launch_kernel(value_links_rows<T>, grid, VL_NT, 0, st, vv, vec, stage))
    switch (v->dtype) {
        case KVE_CUDA_F32: KVE_VL(float); break;
        case KVE_CUDA_F16: KVE_VL(__half); break;
        case KVE_CUDA_BF16: KVE_VL(__nv_bfloat16); break;
        default: return (int)cudaErrorInvalidValue;
    }
#undef KVE_VL
    KVE_CHECK(launch_kernel(links_add, (unsigned)ceil_div(v->tokens - 1, VL_NT), VL_NT, 0, st,
        (const float*)stage, v->heads, v->tokens, links));
    return 0;
}

extern "C" int kve_cuda_pool_linked(const float* in, int64_t ld_in, float* out, int64_t ld_out,
                                    int64_t rows, int64_t n, int k, int64_t sinks,
                                    const float* links, float link_min, void* stream) {
    if (rows < 0 || n < 0 || sinks < 0 || k < 1 || k > 4096 || link_min != link_min)
        return (int)cudaErrorInvalidValue;
    if (rows == 0 || n == 0) return 0;
    if (!in || !out || !links || ld_in < n || ld_out < n || rows > 0x7fffffffLL)
        return (int)cudaErrorInvalidValue;
    KVE_CHECK(launch_kernel(pool_linked_kernel, (unsigned)rows, PL_NT, 0, KVE_STREAM(stream), in,
        ld_in, out, ld_out, n, k, sinks, links, link_min));
    return 0;
}
