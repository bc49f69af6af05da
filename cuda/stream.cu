// One chunk of a query stream (src/math/stream.rs): per query head and key, the max, sum and
// sum of squares of the attention of c queries at arbitrary positions, added into
// accumulators [Hq][N] that live on the device between chunks.
//
// Rows (grid c x Hq): each row's visible keys i <= min(pos[j], N-1); per thread an online
//   max / f64 sum-exp over a strided slice of them, combined across the block; stores
//   (m, 1/l). With the caller's row log-sum-exp: (lse, 1), and K is read once.
// Columns (grid key tiles x Hkv): one thread per key owns its accumulators (no atomics,
//   deterministic); the tile's keys sit in shared memory as f32, the group's query rows
//   stream through shared memory in tiles; A = exp(z - m)·(1/l) for the rows that see
//   the key.
#include "common.cuh"

namespace kve {
namespace {

constexpr int ST_ROW_NT = 256;  // threads per row block
constexpr int ST_TK = 64;       // keys per column block (one per thread)
constexpr int ST_QT = 16;       // query rows per shared tile

__device__ __forceinline__ int64_t last_key(const int64_t* pos, int64_t j, int64_t n) {
    const int64_t p = pos[j];
    return p < n - 1 ? p : n - 1;
}

template <typename T>
__global__ void __launch_bounds__(ST_ROW_NT)
    stream_rows(View q, View k, const int64_t* __restrict__ pos, int g, float scale,
                float* __restrict__ m_out, float* __restrict__ inv_out) {
    extern __shared__ float qs[];  // [dk]
    __shared__ float red_m[ST_ROW_NT / 32];
    __shared__ double red_l[ST_ROW_NT / 32];
    const int64_t j = blockIdx.x, h = blockIdx.y;
    const int dk = (int)k.dim;
    for (int d = threadIdx.x; d < dk; d += blockDim.x) qs[d] = to_f32(*elem_ptr<T>(q, h, j, d)) * scale;
    __syncthreads();
    const int64_t last = last_key(pos, j, k.tokens);
    const int64_t kh = h / g;
    float m = -INFINITY;
    double l = 0.0;
    for (int64_t i = threadIdx.x; i <= last; i += blockDim.x) {
        float z = 0.f;
        for (int d = 0; d < dk; ++d) z = fmaf(qs[d], to_f32(*elem_ptr<T>(k, kh, i, d)), z);
        if (z > m) {
            l = l * (double)__expf(m - z) + 1.0;
            m = z;
        } else {
            l += (double)__expf(z - m);
        }
    }
    // block combine: max, then rescaled sums
    float wm = warp_max(m);
    if ((threadIdx.x & 31) == 0) red_m[threadIdx.x >> 5] = wm;
    __syncthreads();
    float bm = -INFINITY;
    for (int w = 0; w < ST_ROW_NT / 32; ++w) bm = fmaxf(bm, red_m[w]);
    double ls = (m == -INFINITY) ? 0.0 : l * (double)__expf(m - bm);
    ls = warp_sum_d(ls);
    if ((threadIdx.x & 31) == 0) red_l[threadIdx.x >> 5] = ls;
    __syncthreads();
    if (threadIdx.x == 0) {
        double tot = 0.0;
        for (int w = 0; w < ST_ROW_NT / 32; ++w) tot += red_l[w];
        const int64_t r = h * gridDim.x + j;
        m_out[r] = bm;
        inv_out[r] = (float)(1.0 / tot);
    }
}

__global__ void stream_lse_rows(const float* __restrict__ lse, int64_t rows,
                                float* __restrict__ m_out, float* __restrict__ inv_out) {
    const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows) {
        m_out[r] = lse[r];
        inv_out[r] = 1.0f;
    }
}

// Shared memory of stream_cols: keys [ST_TK][dk+1] and a query tile [ST_QT][dk] (f32).
__host__ __device__ inline size_t stream_cols_smem(int dk) {
    return ((size_t)ST_TK * (dk + 1) + (size_t)ST_QT * dk) * sizeof(float);
}

template <typename T>
__global__ void __launch_bounds__(ST_TK)
    stream_cols(View q, View k, const int64_t* __restrict__ pos, int g, float scale,
                const float* __restrict__ m_in, const float* __restrict__ inv_in,
                float* __restrict__ acc_max, float* __restrict__ acc_sum,
                float* __restrict__ acc_sq) {
    extern __shared__ float sm[];
    const int dk = (int)k.dim, ldk = dk + 1;
    float* ks = sm;                   // [ST_TK][ldk]
    float* qt = sm + ST_TK * ldk;     // [ST_QT][dk]
    const int64_t n = k.tokens, c = q.tokens;
    const int64_t kh = blockIdx.y;
    const int64_t i0 = (int64_t)blockIdx.x * ST_TK;
    const int64_t i = i0 + threadIdx.x;
    for (int e = threadIdx.x; e < ST_TK * dk; e += blockDim.x) {
        const int t = e / dk, d = e - t * dk;
        ks[t * ldk + d] = (i0 + t < n) ? to_f32(*elem_ptr<T>(k, kh, i0 + t, d)) : 0.f;
    }
    for (int a = 0; a < g; ++a) {
        const int64_t h = kh * g + a;
        float s1 = 0.f, s2 = 0.f, mx = 0.f;
        for (int64_t j0 = 0; j0 < c; j0 += ST_QT) {
            const int jn = (int)(c - j0 < ST_QT ? c - j0 : ST_QT);
            __syncthreads();  // keys loaded / previous tile consumed
            for (int e = threadIdx.x; e < jn * dk; e += blockDim.x) {
                const int jj = e / dk, d = e - jj * dk;
                qt[jj * dk + d] = to_f32(*elem_ptr<T>(q, h, j0 + jj, d)) * scale;
            }
            __syncthreads();
            if (i < n) {
                for (int jj = 0; jj < jn; ++jj) {
                    const int64_t j = j0 + jj;
                    if (i > last_key(pos, j, n)) continue;
                    float z = 0.f;
                    for (int d = 0; d < dk; ++d) z = fmaf(qt[jj * dk + d], ks[threadIdx.x * ldk + d], z);
                    const int64_t r = h * c + j;
                    const float p = __expf(fminf(z - m_in[r], 0.f)) * inv_in[r];
                    s1 += p;
                    s2 = fmaf(p, p, s2);
                    mx = fmaxf(mx, p);
                }
            }
        }
        if (i < n) {
            const int64_t o = h * n + i;
            acc_sum[o] += s1;
            acc_sq[o] += s2;
            acc_max[o] = fmaxf(acc_max[o], mx);
        }
    }
}

template <typename T>
int launch(const View& q, const View& k, const int64_t* pos, const float* row_lse, int g,
           float* acc_max, float* acc_sum, float* acc_sq, float* m, float* inv,
           cudaStream_t st) {
    const int dk = (int)k.dim;
    const float scale = 1.0f / sqrtf((float)dk);
    const int64_t hq = q.heads, c = q.tokens, n = k.tokens;
    if (row_lse) {
        const int64_t rows = hq * c;
        KVE_CHECK(launch_kernel(stream_lse_rows, (unsigned)ceil_div(rows, 256), 256, 0, st, row_lse,
            rows, m, inv));
    } else {
        KVE_CHECK(launch_kernel(stream_rows<T>, dim3((unsigned)c, (unsigned)hq), ST_ROW_NT,
            dk * sizeof(float), st, q, k, pos, g, scale, m, inv));
    }
    const size_t smem = stream_cols_smem(dk);
    KVE_CHECK(set_smem(stream_cols<T>, smem));
    KVE_CHECK(launch_kernel(stream_cols<T>, dim3((unsigned)ceil_div(n, ST_TK), (unsigned)k.heads),
        ST_TK, smem, st, q, k, pos, g, scale, m, inv, acc_max, acc_sum, acc_sq));
    return 0;
}

}  // namespace
}  // namespace kve

using namespace kve;

extern "C" size_t kve_cuda_stream_feed_workspace_size(int64_t hq, int64_t c) {
    if (hq <= 0 || c <= 0) return 0;
    return 2 * align_up((size_t)(hq * c) * sizeof(float), 256);
}

extern "C" int kve_cuda_stream_feed(const kve_cuda_view* q, const int64_t* positions,
                                    const kve_cuda_view* k, const float* row_lse,
                                    float* acc_max, float* acc_sum, float* acc_sq, void* ws,
                                    size_t ws_bytes, void* stream) {
    if (!view_ok(q) || !view_ok(k) || q->dtype != k->dtype) return (int)cudaErrorInvalidValue;
    const int64_t hq = q->heads, hkv = k->heads, n = k->tokens, dk = k->dim, c = q->tokens;
    if (hkv <= 0 || hq <= 0 || hq % hkv != 0 || c <= 0 || n <= 0) return (int)cudaErrorInvalidValue;
    if (q->dim != dk || dk < 1 || dk > 256) return (int)cudaErrorInvalidValue;
    // grid limits: rows (c, Hq) and column blocks (N / 64, Hkv)
    if (c > 2147483647LL || hq > 65535 || hkv > 65535 || ceil_div(n, ST_TK) > 2147483647LL)
        return (int)cudaErrorInvalidValue;
    if (!positions || !acc_max || !acc_sum || !acc_sq) return (int)cudaErrorInvalidValue;
    const size_t need = kve_cuda_stream_feed_workspace_size(hq, c);
    if (!ws || ws_bytes < need) return (int)cudaErrorInvalidValue;
    const View qv = to_view(*q), kv = to_view(*k);
    float* m = reinterpret_cast<float*>(ws);
    float* inv = reinterpret_cast<float*>(reinterpret_cast<char*>(ws) + need / 2);
    const int g = (int)(hq / hkv);
    cudaStream_t st = KVE_STREAM(stream);
    switch (q->dtype) {
        case KVE_CUDA_F32:
            return launch<float>(qv, kv, positions, row_lse, g, acc_max, acc_sum, acc_sq, m, inv, st);
        case KVE_CUDA_F16:
            return launch<__half>(qv, kv, positions, row_lse, g, acc_max, acc_sum, acc_sq, m, inv, st);
        default:
            return launch<__nv_bfloat16>(qv, kv, positions, row_lse, g, acc_max, acc_sum, acc_sq, m,
                                         inv, st);
    }
}
