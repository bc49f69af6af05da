// Uniqueness (SPEC §3b, the question-agnostic scorer) on the device: per KV head,
// r_i = the 4th largest min(cos(k_i, k_j), cos(v_i, v_j)) over every other cached token
// (-1 where fewer), u_i = max(0, 1 - r_i)^8, s_i = max_{0<=j<=4} 0.9^j·u_{i+j} over the
// prefix (src/score/uniqueness.rs says why).
//
// The same arithmetic as the core's AVX2 path, so the scores match it bit for bit: each
// row's squared norm in 8 fused lanes summed by the core's tree ((0+4)+(2+6)) +
// ((1+5)+(3+7)), the tail unfused; rows scaled by 1/sqrt (both correctly rounded); each
// pair's cosine one fmaf chain over d in order; the 0.9^j as repeated f32 products. A top
// list is the largest values of a multiset, exact whatever the order of insertion. Four
// launches: unit K rows, unit V rows, row tiles (each block scans every column tile for its
// 64 rows: twice the symmetric search's dot products, but no cross-block merge), scores.
// Workspace: the unit K and V rows in f32 and one floor (the 4th similarity) per token.
#include <float.h>

#include "common.cuh"

namespace kve {
namespace {

constexpr int UQ_NT = 256;  // threads of every kernel here
constexpr int UQ_T = 64;    // tokens per side of a pair tile (16 x 16 threads, 4 x 4 pairs each)
constexpr int UQ_DC = 32;   // dims per staged chunk
constexpr int64_t UQ_MAX_TILES = 65535;  // row tiles: a grid dimension
constexpr int UQ_RANK = 4;               // the twin that decides (TWIN_RANK in the core)
constexpr int UQ_REACH = 4;              // tokens before a unique one that it lends to
constexpr float UQ_CUTOFF = 0.5f;        // redundant from here on: score 0 (TWIN_CUTOFF)

// One thread per token: the unit row of (h, t) into dst[(h·N + t)·d ..], f32.
template <typename T>
__global__ void __launch_bounds__(UQ_NT) unit_rows_kernel(View x, float* __restrict__ dst) {
    const int64_t h = blockIdx.y;
    const int64_t t = (int64_t)blockIdx.x * UQ_NT + threadIdx.x;
    if (t >= x.tokens) return;
    const int d = (int)x.dim, d8 = d / 8 * 8;
    float lane[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int c = 0; c < d8; c += 8)
#pragma unroll
        for (int l = 0; l < 8; ++l) {
            const float v = to_f32<T>(*elem_ptr<T>(x, h, t, c + l));
            lane[l] = fmaf(v, v, lane[l]);
        }
    float s = __fadd_rn(__fadd_rn(__fadd_rn(lane[0], lane[4]), __fadd_rn(lane[2], lane[6])),
                        __fadd_rn(__fadd_rn(lane[1], lane[5]), __fadd_rn(lane[3], lane[7])));
    for (int c = d8; c < d; ++c) {
        const float v = to_f32<T>(*elem_ptr<T>(x, h, t, c));
        s = __fadd_rn(s, __fmul_rn(v, v));
    }
    // zero rows stay zero (their cosines are 0)
    const bool scale = s > 0.f;
    const float inv = scale ? __fdiv_rn(1.0f, __fsqrt_rn(s)) : 1.0f;
    float* row = dst + (h * x.tokens + t) * (int64_t)d;
    for (int c = 0; c < d; ++c) {
        const float v = to_f32<T>(*elem_ptr<T>(x, h, t, c));
        row[c] = scale ? __fmul_rn(v, inv) : v;
    }
}

// Puts m into the descending list l[0..UQ_RANK) when it beats the last entry.
__device__ __forceinline__ void insert_top(float (&l)[UQ_RANK], float m) {
    if (!(m > l[UQ_RANK - 1])) return;
    l[UQ_RANK - 1] = m;
#pragma unroll
    for (int k = UQ_RANK - 1; k > 0; --k)
        if (l[k] > l[k - 1]) {
            const float t = l[k];
            l[k] = l[k - 1];
            l[k - 1] = t;
        }
}

// Stage rows r0.. of a unit-row matrix ([N][d], f32), dims d0..d0+UQ_DC, transposed into
// s[c][r] (zero past n or d).
__device__ __forceinline__ void stage(float (*s)[UQ_T + 1], const float* __restrict__ rows,
                                      int64_t r0, int64_t n, int d, int d0) {
    for (int e = threadIdx.x; e < UQ_T * UQ_DC; e += UQ_NT) {
        const int r = e / UQ_DC, c = e - r * UQ_DC;
        float x = 0.f;
        if (r0 + r < n && d0 + c < d) x = rows[(r0 + r) * d + d0 + c];
        s[c][r] = x;
    }
}

// acc[a][b] = Σ_c row(ty + 16a)[c] · col(tx + 16b)[c], c in order, one fmaf per term.
__device__ __forceinline__ void dots(float (&acc)[4][4], const float* __restrict__ rows,
                                     int64_t i0, int64_t j0, int64_t n, int d,
                                     float (*sa)[UQ_T + 1], float (*sb)[UQ_T + 1]) {
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) acc[a][b] = 0.f;
    for (int d0 = 0; d0 < d; d0 += UQ_DC) {
        stage(sa, rows, i0, n, d, d0);
        stage(sb, rows, j0, n, d, d0);
        __syncthreads();
        const int nc = min(UQ_DC, d - d0);
        for (int c = 0; c < nc; ++c) {
            float x[4], y[4];
#pragma unroll
            for (int a = 0; a < 4; ++a) x[a] = sa[c][ty + 16 * a];
#pragma unroll
            for (int b = 0; b < 4; ++b) y[b] = sb[c][tx + 16 * b];
#pragma unroll
            for (int a = 0; a < 4; ++a)
#pragma unroll
                for (int b = 0; b < 4; ++b) acc[a][b] = fmaf(x[a], y[b], acc[a][b]);
        }
        __syncthreads();
    }
}

// One block per row tile of a head: every column tile in turn, min(key cosine, value
// cosine) of each pair i != j into the thread's top list for its row; then the 16 lists
// of a row merged in shared memory and its floor (the list's last entry) written.
__global__ void __launch_bounds__(UQ_NT)
    rows_kernel(const float* __restrict__ ku, const float* __restrict__ vu, int64_t n, int dk,
                int dv, float* __restrict__ floor_out) {
    const int64_t h = blockIdx.y, i0 = (int64_t)blockIdx.x * UQ_T;
    __shared__ float sa[UQ_DC][UQ_T + 1];
    __shared__ float sb[UQ_DC][UQ_T + 1];
    __shared__ float lists[UQ_T][16][UQ_RANK];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float top[4][UQ_RANK];
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int k = 0; k < UQ_RANK; ++k) top[a][k] = -1.0f;
    for (int64_t j0 = 0; j0 < n; j0 += UQ_T) {
        float ck[4][4], cv[4][4];
        dots(ck, ku + h * n * dk, i0, j0, n, dk, sa, sb);
        dots(cv, vu + h * n * dv, i0, j0, n, dv, sa, sb);
#pragma unroll
        for (int a = 0; a < 4; ++a) {
            const int64_t i = i0 + ty + 16 * a;
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                const int64_t j = j0 + tx + 16 * b;
                if (i < n && j < n && j != i) insert_top(top[a], fminf(ck[a][b], cv[a][b]));
            }
        }
    }
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int k = 0; k < UQ_RANK; ++k) lists[ty + 16 * a][tx][k] = top[a][k];
    __syncthreads();
    if (threadIdx.x < UQ_T) {
        const int64_t i = i0 + threadIdx.x;
        if (i < n) {
            float l[UQ_RANK];
#pragma unroll
            for (int k = 0; k < UQ_RANK; ++k) l[k] = -1.0f;
            for (int t = 0; t < 16; ++t)
#pragma unroll
                for (int k = 0; k < UQ_RANK; ++k) insert_top(l, lists[threadIdx.x][t][k]);
            floor_out[h * n + i] = l[UQ_RANK - 1];
        }
    }
}

// max(0, 1 - r)^8 as the core computes it: u2 = x·x, (u2·u2)·(u2·u2); 0 from the cutoff on.
__device__ __forceinline__ float sharpen(float r) {
    const float x = fmaxf(__fsub_rn(1.0f, r), 0.0f);
    const float u2 = __fmul_rn(x, x);
    return r >= UQ_CUTOFF ? 0.0f : __fmul_rn(__fmul_rn(u2, u2), __fmul_rn(u2, u2));
}

__global__ void __launch_bounds__(UQ_NT)
    score_kernel(const float* __restrict__ floor, int64_t n, int64_t prefix,
                 float* __restrict__ out, int64_t ld_out) {
    const int64_t h = blockIdx.y;
    for (int64_t i = (int64_t)blockIdx.x * UQ_NT + threadIdx.x; i < prefix;
         i += (int64_t)gridDim.x * UQ_NT) {
        float s = sharpen(floor[h * n + i]);
        // a token lends 0.9^j of its score to the j-th before it, inside the prefix
        float f = 1.0f;
#pragma unroll
        for (int j = 1; j <= UQ_REACH; ++j) {
            f = __fmul_rn(f, 0.9f);
            if (i + j < prefix) s = fmaxf(s, __fmul_rn(f, sharpen(floor[h * n + i + j])));
        }
        out[h * ld_out + i] = s;
    }
}

// Workspace parts: unit K [H][N][dk] f32, unit V [H][N][dv] f32, floors [H][N] f32, each
// 4 bytes an element, rounded up to 256 bytes; SIZE_MAX when that overflows.
size_t part_bytes(int64_t heads, int64_t n, int64_t d) {
    size_t x = 0;
    if (__builtin_mul_overflow((size_t)heads, (size_t)n, &x) ||
        __builtin_mul_overflow(x, (size_t)d, &x) || __builtin_mul_overflow(x, (size_t)4, &x) ||
        x > SIZE_MAX - 255)
        return SIZE_MAX;
    return align_up(x, 256);
}

}  // namespace
}  // namespace kve

using namespace kve;

extern "C" size_t kve_cuda_uniqueness_workspace_size(int64_t heads, int64_t n, int64_t dk,
                                                     int64_t dv) {
    if (heads < 0 || n < 0 || dk < 0 || dv < 0) return 0;
    const size_t a = part_bytes(heads, n, dk), b = part_bytes(heads, n, dv),
                 c = part_bytes(heads, n, 1);
    if (a > SIZE_MAX - b || a + b > SIZE_MAX - c) return SIZE_MAX;
    return a + b + c;
}

template <typename T>
static int launch_unit_rows(const View& x, float* dst, cudaStream_t st) {
    const dim3 grid((unsigned)ceil_div(x.tokens, UQ_NT), (unsigned)x.heads);
    KVE_CHECK(launch_kernel(unit_rows_kernel<T>, grid, UQ_NT, 0, st, x, dst));
    return 0;
}

static int unit_rows(const kve_cuda_view* x, float* dst, cudaStream_t st) {
    const View v = to_view(*x);
    switch (x->dtype) {
        case KVE_CUDA_F32: return launch_unit_rows<float>(v, dst, st);
        case KVE_CUDA_F16: return launch_unit_rows<__half>(v, dst, st);
        case KVE_CUDA_BF16: return launch_unit_rows<__nv_bfloat16>(v, dst, st);
        default: return (int)cudaErrorInvalidValue;
    }
}

extern "C" int kve_cuda_uniqueness(const kve_cuda_view* k, const kve_cuda_view* v, int64_t prefix,
                                   float* out, int64_t ld_out, void* ws, size_t ws_bytes,
                                   void* stream) {
    if (!view_ok(k) || !view_ok(v)) return (int)cudaErrorInvalidValue;
    if (k->dtype != v->dtype || v->heads != k->heads || v->tokens != k->tokens)
        return (int)cudaErrorInvalidValue;
    const int64_t heads = k->heads, n = k->tokens;
    if (prefix < 0 || prefix > n || heads > 65535 || ceil_div(n, UQ_T) > UQ_MAX_TILES)
        return (int)cudaErrorInvalidValue;
    if (k->dim > INT32_MAX || v->dim > INT32_MAX) return (int)cudaErrorInvalidValue;
    if (prefix == 0 || heads == 0) return 0;
    if (!out || ld_out < prefix) return (int)cudaErrorInvalidValue;
    const size_t need = kve_cuda_uniqueness_workspace_size(heads, n, k->dim, v->dim);
    if (need == SIZE_MAX || !ws || ws_bytes < need || reinterpret_cast<uintptr_t>(ws) % 256 != 0)
        return (int)cudaErrorInvalidValue;
    char* base = static_cast<char*>(ws);
    float* ku = reinterpret_cast<float*>(base);
    float* vu = reinterpret_cast<float*>(base + part_bytes(heads, n, k->dim));
    float* floor = reinterpret_cast<float*>(base + part_bytes(heads, n, k->dim) +
                                           part_bytes(heads, n, v->dim));
    cudaStream_t st = KVE_STREAM(stream);
    KVE_CHECK(unit_rows(k, ku, st));
    KVE_CHECK(unit_rows(v, vu, st));
    const unsigned tiles = (unsigned)ceil_div(n, UQ_T);
    KVE_CHECK(launch_kernel(rows_kernel, dim3(tiles, (unsigned)heads), UQ_NT, 0, st, ku, vu, n,
        (int)k->dim, (int)v->dim, floor));
    const int64_t score_blocks = ceil_div(prefix, UQ_NT);
    const dim3 grid((unsigned)(score_blocks > 65535 ? 65535 : score_blocks), (unsigned)heads);
    KVE_CHECK(launch_kernel(score_kernel, grid, UQ_NT, 0, st, floor, n, prefix, out, ld_out));
    return 0;
}
