// Value-output norms through Gram matrices (design §3 LaProx):
//   ||v Wo_h||² = v G_h vᵀ,  G_h = Wo_h Wo_hᵀ  ([dv, dv], computed once per model).
// The compute-bound stage: per block, one KV head and a tile of TV tokens; the
// V tile stays in shared memory while every Gram of the group is applied in
// column chunks X = V·G[:, c0:c0+CB] (tensor cores for f16/bf16, f32 accumulate),
// then q_i += Σ_c X[i,c]·V[i,c0+c]. V is read from device memory once.
//
// Factor form (kve_cuda_vonorm_factor): with a Cholesky factor G = L Lᵀ (L lower
// triangular, kve_cuda_gram_factor on the host, once per model) the same value is
// ||v L||² = Σ_c X[i,c]² with X = V·L, and a column chunk [c0, c0+CB) needs only
// rows r >= c0 of L: about (1 + 16/dv)/2 of the tensor-core work (0.56 at dv 128).
#include <math.h>
#include <algorithm>
#include <vector>
#include "common.cuh"
#include "mma.cuh"
#include "tile_async.cuh"

namespace kve {
namespace {

constexpr int VO_NT = 256;
constexpr int VO_CB = 32;  // Gram columns per chunk

template <typename T, int DVP> struct VoCfg {
    static constexpr int PAD = Pad<T>::value;
    // tokens per tile; f32 at dv 256 takes 32 so that a block fits sm_86/89's 99 KiB
    static constexpr int TV = (sizeof(T) == 4 && DVP >= 256) ? 32
                              : (DVP >= 256 || sizeof(T) == 4) ? 64 : 128;
    static constexpr int LDV = DVP + PAD;
    static constexpr int LDG = VO_CB + (sizeof(T) == 2 ? 8 : 4);
    static constexpr int LDX = VO_CB + 4;
    static constexpr size_t V_BYTES = ((size_t)TV * LDV * sizeof(T) + 127) / 128 * 128;
    static constexpr size_t G_BYTES = ((size_t)DVP * LDG * sizeof(T) + 127) / 128 * 128;
    static constexpr size_t X_BYTES = ((size_t)TV * LDX * sizeof(float) + 127) / 128 * 128;
    // the lo half's G chunk only when a lo half is given; two of each with dbuf (the
    // next chunk in flight while the current one is used)
    static constexpr size_t smem(bool lo, bool dbuf = false) {
        return V_BYTES + (lo ? 2 : 1) * (dbuf ? 2 : 1) * G_BYTES + X_BYTES;
    }
    // Blocks per SM ptxas must allow for (registers): what sm_90's shared memory holds
    // for 16-bit V (3), 2 for f32; without it ptxas spilled a few bytes in two builds.
    static constexpr int MIN_BLOCKS = sizeof(T) == 2 ? 3 : 2;
};

// One G chunk (hi, and lo when given) into the slots of buffer `buf`.
template <typename T, int DVP>
__device__ __forceinline__ void vo_issue(unsigned char* gslots, int nparts, int buf, const T* gh,
                                         const T* gl, int dv, int c0, int tri) {
    using C = VoCfg<T, DVP>;
    T* h = reinterpret_cast<T*>(gslots + (size_t)(buf * nparts) * C::G_BYTES);
    load_g_cols_async<T, VO_NT, VO_CB, DVP>(h, C::LDG, gh, dv, c0, tri);
    if (gl) {
        T* l = reinterpret_cast<T*>(gslots + (size_t)(buf * nparts + 1) * C::G_BYTES);
        load_g_cols_async<T, VO_NT, VO_CB, DVP>(l, C::LDG, gl, dv, c0, tri);
    }
}

// Chunks of every Gram of the group in one sequence (mm, c0): with dbuf the next
// chunk's G is fetched (cp.async) while the current one is multiplied.
template <typename T, int DVP>
__global__ void __launch_bounds__(VO_NT, (VoCfg<T, DVP>::MIN_BLOCKS))
    vonorm_kernel(View v, int64_t n_tokens, const T* __restrict__ ghi, const T* __restrict__ glo,
                  int gpk, int take_sqrt, int tri, int dbuf, float* __restrict__ out) {
    using C = VoCfg<T, DVP>;
    extern __shared__ __align__(128) unsigned char smem[];
    T* Vs = reinterpret_cast<T*>(smem);
    unsigned char* gslots = smem + C::V_BYTES;
    const int nparts = glo ? 2 : 1;
    float* X = reinterpret_cast<float*>(gslots + (size_t)(nparts * (dbuf ? 2 : 1)) * C::G_BYTES);

    const int hk = blockIdx.y;
    const int64_t i0 = (int64_t)blockIdx.x * C::TV;
    const int tn = (int)min((int64_t)C::TV, n_tokens - i0);
    const int dv = (int)v.dim;
    constexpr int TPT = VO_NT / C::TV;  // threads per token (2, 4 or 8)
    constexpr int CPT = VO_CB / TPT;    // columns per thread per chunk
    const int tok = threadIdx.x / TPT, sub = threadIdx.x % TPT;

    load_tile<T>(Vs, C::LDV, v, hk, i0, tn, C::TV, DVP);
    const int64_t gsz = (int64_t)dv * dv;
    const int ncc = (dv + VO_CB - 1) / VO_CB;
    const int total = gpk * ncc;
    const T* g0 = ghi + (int64_t)hk * gpk * gsz;
    const T* l0 = glo ? glo + (int64_t)hk * gpk * gsz : nullptr;
    if (dbuf) vo_issue<T, DVP>(gslots, nparts, 0, g0, l0, dv, 0, tri);
    __pipeline_commit();
    float q = 0.0f;
    for (int ci = 0; ci < total; ++ci) {
        const int mm = ci / ncc, c0 = (ci - mm * ncc) * VO_CB;
        const int buf = dbuf ? (ci & 1) : 0;
        __syncthreads();  // V loaded / the previous chunk's G and X no longer read
        if (dbuf) {
            if (ci + 1 < total) {
                const int mn = (ci + 1) / ncc, cn = (ci + 1 - mn * ncc) * VO_CB;
                vo_issue<T, DVP>(gslots, nparts, buf ^ 1, g0 + mn * gsz,
                                 l0 ? l0 + mn * gsz : nullptr, dv, cn, tri);
            }
            __pipeline_commit();
            __pipeline_wait_prior(1);  // all but the newest group: chunk ci
        } else {
            vo_issue<T, DVP>(gslots, nparts, 0, g0 + mm * gsz, l0 ? l0 + mm * gsz : nullptr, dv, c0,
                             tri);
            __pipeline_commit();
            __pipeline_wait_prior(0);
        }
        __syncthreads();
        const T* Gh = reinterpret_cast<const T*>(gslots + (size_t)(buf * nparts) * C::G_BYTES);
        const T* Gl = glo ? reinterpret_cast<const T*>(gslots + (size_t)(buf * nparts + 1) * C::G_BYTES)
                          : nullptr;
        // factor form: only the lower triangle (row >= column) of L counts
        MM<T>::template ab<DVP>(X, C::LDX, Vs, C::LDV, Gh, Gl, C::LDG, C::TV, VO_CB,
                                tri ? (c0 / 16) * 16 : 0);
        __syncthreads();
        if (tri) {
#pragma unroll
            for (int cc = 0; cc < CPT; ++cc) {
                const float x = X[tok * C::LDX + sub * CPT + cc];
                q = fmaf(x, x, q);
            }
        } else {
#pragma unroll
            for (int cc = 0; cc < CPT; ++cc) {
                const int c = sub * CPT + cc;
                q = fmaf(X[tok * C::LDX + c], to_f32<T>(Vs[tok * C::LDV + c0 + c]), q);
            }
        }
        if (c0 + VO_CB >= dv) {  // the Gram's last chunk (uniform across the block)
            // reduce over the TPT adjacent lanes of a token
#pragma unroll
            for (int o = TPT / 2; o > 0; o >>= 1) q += __shfl_xor_sync(0xffffffffu, q, o);
            const int64_t m = (int64_t)hk * gpk + mm;
            if (sub == 0 && tok < tn)
                out[m * n_tokens + i0 + tok] = take_sqrt ? sqrtf(fmaxf(q, 0.0f)) : q;
            q = 0.0f;
        }
    }
}

template <typename T, int DVP>
int vonorm_run(const View& v, int64_t n_tokens, const void* ghi, const void* glo, int64_t n_gram,
               int take_sqrt, int tri, float* out, cudaStream_t st) {
    using C = VoCfg<T, DVP>;
    const int64_t hkv = v.heads;
    const int gpk = (int)(n_gram / hkv);
    // double-buffered G where the device's opt-in limit holds it and it costs no resident
    // block below the MIN_BLOCKS the registers were sized for (blocks of one SM overlap
    // each other's loads too)
    int dev = 0, optin = 0, per_sm = 0;
    KVE_CHECK(cudaGetDevice(&dev));
    KVE_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    KVE_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    const bool lo = glo != nullptr;
    const size_t one = C::smem(lo, false), two = C::smem(lo, true);
    const size_t reserve = 1024;  // per block, taken by the runtime
    const size_t b1 = (size_t)per_sm / (one + reserve), b2 = (size_t)per_sm / (two + reserve);
    const size_t want = b1 < (size_t)C::MIN_BLOCKS ? b1 : (size_t)C::MIN_BLOCKS;
    const int dbuf = two <= (size_t)optin && b2 >= want ? 1 : 0;
    const size_t sm = C::smem(lo, dbuf != 0);
    KVE_CHECK(set_smem(vonorm_kernel<T, DVP>, sm));
    const dim3 grid((unsigned)ceil_div(n_tokens, C::TV), (unsigned)hkv);
    KVE_CHECK(launch_kernel(vonorm_kernel<T, DVP>, grid, VO_NT, sm, st, v, n_tokens,
        reinterpret_cast<const T*>(ghi), reinterpret_cast<const T*>(glo), gpk, take_sqrt, tri,
        dbuf, out));
    return 0;
}

template <typename T>
int vonorm_dispatch(const View& v, int64_t n_tokens, const void* ghi, const void* glo,
                    int64_t n_gram, int take_sqrt, int tri, float* out, cudaStream_t st) {
    if (v.dim <= 64)
        return vonorm_run<T, 64>(v, n_tokens, ghi, glo, n_gram, take_sqrt, tri, out, st);
    if (v.dim <= 128)
        return vonorm_run<T, 128>(v, n_tokens, ghi, glo, n_gram, take_sqrt, tri, out, st);
    return vonorm_run<T, 256>(v, n_tokens, ghi, glo, n_gram, take_sqrt, tri, out, st);
}

int vonorm_any(const kve_cuda_view* v, int64_t n_tokens, const void* gram_hi, const void* gram_lo,
               int64_t n_gram, int take_sqrt, int tri, float* out, void* stream) {
    if (!view_ok(v)) return (int)cudaErrorInvalidValue;
    const int64_t hkv = v->heads;
    if (hkv <= 0 || v->dim < 1 || v->dim > 256) return (int)cudaErrorInvalidValue;
    if (n_tokens < 0 || n_tokens > v->tokens) return (int)cudaErrorInvalidValue;
    if (n_gram <= 0 || n_gram % hkv != 0 || hkv > 65535) return (int)cudaErrorInvalidValue;
    if (n_tokens == 0) return 0;
    if (!gram_hi || !out) return (int)cudaErrorInvalidValue;
    const View vv = to_view(*v);
    cudaStream_t st = KVE_STREAM(stream);
    switch (v->dtype) {
        case KVE_CUDA_F32:
            return vonorm_dispatch<float>(vv, n_tokens, gram_hi, gram_lo, n_gram, take_sqrt, tri,
                                          out, st);
        case KVE_CUDA_F16:
            return vonorm_dispatch<__half>(vv, n_tokens, gram_hi, gram_lo, n_gram, take_sqrt, tri,
                                           out, st);
        case KVE_CUDA_BF16:
            return vonorm_dispatch<__nv_bfloat16>(vv, n_tokens, gram_hi, gram_lo, n_gram,
                                                  take_sqrt, tri, out, st);
        default: return (int)cudaErrorInvalidValue;
    }
}

template <typename T>
__global__ void gram_split_kernel(const float* __restrict__ g, int64_t n, T* __restrict__ hi,
                                  T* __restrict__ lo) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float x = g[i];
        const T h = from_f32<T>(x);
        hi[i] = h;
        if (lo) lo[i] = from_f32<T>(x - to_f32<T>(h));
    }
}

}  // namespace
}  // namespace kve

using namespace kve;

extern "C" int kve_cuda_vonorm(const kve_cuda_view* v, int64_t n_tokens, const void* gram_hi,
                               const void* gram_lo, int64_t n_gram, int take_sqrt, float* out,
                               void* stream) {
    return vonorm_any(v, n_tokens, gram_hi, gram_lo, n_gram, take_sqrt, 0, out, stream);
}

extern "C" int kve_cuda_vonorm_factor(const kve_cuda_view* v, int64_t n_tokens,
                                      const void* factor_hi, const void* factor_lo,
                                      int64_t n_gram, int take_sqrt, float* out, void* stream) {
    return vonorm_any(v, n_tokens, factor_hi, factor_lo, n_gram, take_sqrt, 1, out, stream);
}

// Host: Cholesky G = L Lᵀ of each [dv, dv] block, in f64. A zero (within rounding)
// pivot of a positive semi-definite block gives a zero column, which is exact for a
// PSD matrix; a clearly negative pivot means the block is not a Gram matrix.
extern "C" int kve_cuda_gram_factor(const float* g, int64_t n_gram, int64_t dv, float* l_out) {
    if (n_gram < 0 || dv < 1 || dv > 4096) return (int)cudaErrorInvalidValue;
    if (n_gram == 0) return 0;
    if (!g || !l_out) return (int)cudaErrorInvalidValue;
    std::vector<double> a((size_t)(dv * dv)), l((size_t)(dv * dv));
    // every block first: nothing is written when a later one is refused
    std::vector<float> all((size_t)(n_gram * dv * dv));
    for (int64_t m = 0; m < n_gram; ++m) {
        const float* gm = g + m * dv * dv;
        double maxd = 0.0;
        for (int64_t i = 0; i < dv * dv; ++i) {
            a[i] = (double)gm[i];
            if (!std::isfinite(a[i])) return (int)cudaErrorInvalidValue;
        }
        for (int64_t i = 0; i < dv; ++i) maxd = fmax(maxd, fabs(a[i * dv + i]));
        // pivots below tol (rounding noise of a semi-definite f32 Gram) give zero
        // columns; below -1e-3·max diag the block is not a Gram matrix.
        const double tol = 1e-7 * (maxd > 0.0 ? maxd : 1.0);
        std::fill(l.begin(), l.end(), 0.0);
        for (int64_t j = 0; j < dv; ++j) {
            double d = a[j * dv + j];
            for (int64_t k = 0; k < j; ++k) d -= l[j * dv + k] * l[j * dv + k];
            if (d < -1e-3 * (maxd > 0.0 ? maxd : 1.0)) return (int)cudaErrorInvalidValue;
            if (d <= tol) continue;  // zero column
            const double ljj = sqrt(d);
            l[j * dv + j] = ljj;
            for (int64_t i = j + 1; i < dv; ++i) {
                // symmetric input: use the lower triangle of G (G[i][j])
                double s = 0.5 * (a[i * dv + j] + a[j * dv + i]);
                for (int64_t k = 0; k < j; ++k) s -= l[i * dv + k] * l[j * dv + k];
                l[i * dv + j] = s / ljj;
            }
        }
        float* lm = all.data() + m * dv * dv;
        for (int64_t i = 0; i < dv * dv; ++i) lm[i] = (float)l[i];
    }
    std::copy(all.begin(), all.end(), l_out);
    return 0;
}

extern "C" int kve_cuda_gram_split(const float* g, int64_t n, int dtype, void* hi, void* lo,
                                   void* stream) {
    if (n < 0 || dtype_size(dtype) == 0) return (int)cudaErrorInvalidValue;
    if (n == 0) return 0;
    if (!g || !hi) return (int)cudaErrorInvalidValue;
    cudaStream_t st = KVE_STREAM(stream);
    int64_t blocks = ceil_div(n, 256);
    if (blocks > 65535) blocks = 65535;
    switch (dtype) {
        case KVE_CUDA_F32:
            KVE_CHECK(launch_kernel(gram_split_kernel<float>, (unsigned)blocks, 256, 0, st, g, n,
                static_cast<float*>(hi), static_cast<float*>(lo)));
            break;
        case KVE_CUDA_F16:
            KVE_CHECK(launch_kernel(gram_split_kernel<__half>, (unsigned)blocks, 256, 0, st, g, n,
                static_cast<__half*>(hi), static_cast<__half*>(lo)));
            break;
        case KVE_CUDA_BF16:
            KVE_CHECK(launch_kernel(gram_split_kernel<__nv_bfloat16>, (unsigned)blocks, 256, 0, st,
                g, n, static_cast<__nv_bfloat16*>(hi), static_cast<__nv_bfloat16*>(lo)));
            break;
        default: return (int)cudaErrorInvalidValue;
    }
    return 0;
}
