// Uniqueness (design §3b, the question-agnostic scorer) on the device: per KV head,
// r_i = the 4th largest min(cos(k_i, k_j), cos(v_i, v_j)) over every other cached token
// (-1 where fewer), u_i = max(0, 1 - r_i)^24, s_i = max_{0<=j<=10} c_j·u_{i+j} over the
// prefix, c_j = 1 for j <= 6 and 0.729^(j-6) beyond (src/math/score/uniqueness.rs says why).
//
// The same arithmetic as the core's AVX2 path, so the scores match it bit for bit: each
// row's squared norm in 8 fused lanes summed by the core's tree ((0+4)+(2+6)) +
// ((1+5)+(3+7)), the tail unfused; rows scaled by 1/sqrt (both correctly rounded); each
// pair's cosine one fmaf chain over d in order; the 0.729^(j-6) as repeated f32 products. A top
// list is the largest values of a multiset, exact whatever the order of insertion.
//
// Two scans, as the core's (src/math/score/uniqueness.rs): r_i only grows as more pairs are
// seen, and a token whose r_i reaches the cutoff (0.5) scores 0 whatever the rest. So
// (1) every row tile compares its 64 rows with the column tiles within UQ_NEAR tokens
// (a band: 5 tiles instead of N/64), (2) the tokens the band left below the cutoff are
// listed in order, and (3) blocks of 64 listed tokens scan the whole cache outward from
// their first token, each restarting its list, and stop as soon as all 64 are settled
// (four similarities at or past the cutoff). Every unsettled token's r_i is then exact
// and every settled one's is at or past the cutoff: the scores are the full search's.
// When the band covers every pair (N <= UQ_NEAR + 64), (1) is the whole search.
// Launches: unit K rows, unit V rows, band, open list, exact rows, scores.
// Workspace: the unit K and V rows in f32, one floor (the 4th similarity) per token, the
// open list (int32 per token) and its count per head.
#include <float.h>

#include "common.cuh"

namespace kve {
namespace {

constexpr int UQ_NT = 256;  // threads of every kernel here
constexpr int UQ_T = 64;    // tokens per side of a pair tile (16 x 16 threads, 4 x 4 pairs each)
constexpr int UQ_DC = 32;   // dims per staged chunk
constexpr int64_t UQ_MAX_TILES = 65535;  // row tiles: a grid dimension
constexpr int UQ_RANK = 4;               // the twin that decides (TWIN_RANK in the core)
constexpr int UQ_REACH = 10;             // tokens before a unique one that it lends to
constexpr int UQ_FLAT = 6;               // of those, the nearest get its whole score
constexpr float UQ_DECAY = 0.729f;       // share lent past UQ_FLAT, per token further back
constexpr float UQ_CUTOFF = 0.5f;        // redundant from here on: score 0 (TWIN_CUTOFF)
constexpr int64_t UQ_NEAR = 128;         // the band's reach (NEAR in the core)
constexpr int UQ_LIST_NT = 1024;         // threads of the open-list kernel

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

// Stage rows ri[0..UQ_T) (-1: none) of a unit-row matrix ([N][d], f32), dims
// d0..d0+UQ_DC, transposed into s[c][r] (zero for no row or past d).
__device__ __forceinline__ void stage(float (*s)[UQ_T + 1], const float* __restrict__ rows,
                                      const int* ri, int d, int d0) {
    for (int e = threadIdx.x; e < UQ_T * UQ_DC; e += UQ_NT) {
        const int r = e / UQ_DC, c = e - r * UQ_DC;
        float x = 0.f;
        if (ri[r] >= 0 && d0 + c < d) x = rows[(int64_t)ri[r] * d + d0 + c];
        s[c][r] = x;
    }
}

// acc[a][b] = Σ_c row(ri[ty + 16a])[c] · col(cj[tx + 16b])[c], c in order, one fmaf per term.
__device__ __forceinline__ void dots(float (&acc)[4][4], const float* __restrict__ rows,
                                     const int* ri, const int* cj, int d,
                                     float (*sa)[UQ_T + 1], float (*sb)[UQ_T + 1]) {
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) acc[a][b] = 0.f;
    for (int d0 = 0; d0 < d; d0 += UQ_DC) {
        stage(sa, rows, ri, d, d0);
        stage(sb, rows, cj, d, d0);
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

// The pairs of rows ri (-1: none) with the column tile j0.. (tokens < n): min(key cosine,
// value cosine) of each pair i != j into the thread's top list for its row.
__device__ __forceinline__ void pair_tile(float (&top)[4][UQ_RANK], const float* __restrict__ ku,
                                          const float* __restrict__ vu, int dk, int dv,
                                          const int* ri, int* cj, int64_t j0, int64_t n,
                                          float (*sa)[UQ_T + 1], float (*sb)[UQ_T + 1]) {
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    __syncthreads();  // the previous tile's column indices are read
    if (threadIdx.x < UQ_T) cj[threadIdx.x] = j0 + threadIdx.x < n ? (int)(j0 + threadIdx.x) : -1;
    __syncthreads();
    float ck[4][4], cv[4][4];
    dots(ck, ku, ri, cj, dk, sa, sb);
    dots(cv, vu, ri, cj, dv, sa, sb);
#pragma unroll
    for (int a = 0; a < 4; ++a) {
        const int i = ri[ty + 16 * a];
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            const int j = cj[tx + 16 * b];
            if (i >= 0 && j >= 0 && j != i) insert_top(top[a], fminf(ck[a][b], cv[a][b]));
        }
    }
}

// The 16 lists of each row merged in shared memory; the floor (the list's last entry) of
// row ri[r] written to floor_out[ri[r]].
__device__ __forceinline__ void write_floors(const float (&top)[4][UQ_RANK], const int* ri,
                                             float (*lists)[16][UQ_RANK],
                                             float* __restrict__ floor_out) {
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int k = 0; k < UQ_RANK; ++k) lists[ty + 16 * a][tx][k] = top[a][k];
    __syncthreads();
    if (threadIdx.x < UQ_T && ri[threadIdx.x] >= 0) {
        float l[UQ_RANK];
#pragma unroll
        for (int k = 0; k < UQ_RANK; ++k) l[k] = -1.0f;
        for (int t = 0; t < 16; ++t)
#pragma unroll
            for (int k = 0; k < UQ_RANK; ++k) insert_top(l, lists[threadIdx.x][t][k]);
        floor_out[ri[threadIdx.x]] = l[UQ_RANK - 1];
    }
}

// Scan 1, one block per row tile of a head: the column tiles from i0 - reach to
// i0 + 64 + reach (every pair at most `reach` apart, and more), each row's floor written.
// With reach >= N every pair: the exact floors.
// (UQ_NT, 2): room for the 4 x 4 pair tile's two accumulator sets and the top lists (left
// to itself ptxas picked 62 registers and spilled on sm_90)
__global__ void __launch_bounds__(UQ_NT, 2)
    band_kernel(const float* __restrict__ ku, const float* __restrict__ vu, int64_t n, int dk,
                int dv, int64_t reach, float* __restrict__ floor_out) {
    const int64_t h = blockIdx.y, i0 = (int64_t)blockIdx.x * UQ_T;
    __shared__ float sa[UQ_DC][UQ_T + 1];
    __shared__ float sb[UQ_DC][UQ_T + 1];
    __shared__ float lists[UQ_T][16][UQ_RANK];
    __shared__ int ri[UQ_T], cj[UQ_T];
    if (threadIdx.x < UQ_T) ri[threadIdx.x] = i0 + threadIdx.x < n ? (int)(i0 + threadIdx.x) : -1;
    float top[4][UQ_RANK];
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int k = 0; k < UQ_RANK; ++k) top[a][k] = -1.0f;
    const int64_t lo = i0 > reach ? (i0 - reach) / UQ_T * UQ_T : 0;
    const int64_t hi = n - i0 - UQ_T > reach ? i0 + UQ_T + reach : n;
    const float* k = ku + h * n * dk;
    const float* v = vu + h * n * dv;
    for (int64_t j0 = lo; j0 < hi; j0 += UQ_T) pair_tile(top, k, v, dk, dv, ri, cj, j0, n, sa, sb);
    write_floors(top, ri, lists, floor_out + h * n);
}

// One block per head: the tokens whose floor is below the cutoff, ascending, into
// list[h·N ..] and their number into count[h] (a block-wide scan per chunk).
__global__ void __launch_bounds__(UQ_LIST_NT)
    open_list_kernel(const float* __restrict__ floor, int64_t n, int32_t* __restrict__ list,
                     int32_t* __restrict__ count) {
    const int64_t h = blockIdx.y;
    __shared__ int warp_sum[UQ_LIST_NT / 32];
    int64_t base = 0;
    for (int64_t c0 = 0; c0 < n; c0 += UQ_LIST_NT) {
        const int64_t i = c0 + threadIdx.x;
        const bool open = i < n && floor[h * n + i] < UQ_CUTOFF;
        base += block_compact<UQ_LIST_NT>(open, i, list + h * n, base, warp_sum);
    }
    if (threadIdx.x == 0) count[h] = (int32_t)base;
}

// Scan 2, one block per 64 listed tokens of a head (blocks past the list return at once):
// each token compared with every other, its list restarted empty; the column tiles
// outward from the first token's, until every token of the block has four similarities
// at or past the cutoff (then its score is 0 whatever the rest) or the cache ends.
__global__ void __launch_bounds__(UQ_NT, 2)
    exact_kernel(const float* __restrict__ ku, const float* __restrict__ vu, int64_t n, int dk,
                 int dv, const int32_t* __restrict__ list, const int32_t* __restrict__ count,
                 float* __restrict__ floor_out) {
    const int64_t h = blockIdx.y, g0 = (int64_t)blockIdx.x * UQ_T;
    const int64_t m = count[h];
    if (g0 >= m) return;
    __shared__ float sa[UQ_DC][UQ_T + 1];
    __shared__ float sb[UQ_DC][UQ_T + 1];
    __shared__ float lists[UQ_T][16][UQ_RANK];
    __shared__ int ri[UQ_T], cj[UQ_T];
    if (threadIdx.x < UQ_T)
        ri[threadIdx.x] = g0 + threadIdx.x < m ? list[h * n + g0 + threadIdx.x] : -1;
    __syncthreads();
    float top[4][UQ_RANK];
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int k = 0; k < UQ_RANK; ++k) top[a][k] = -1.0f;
    const int ty = threadIdx.x / 16;
    const float* k = ku + h * n * dk;
    const float* v = vu + h * n * dv;
    const int64_t tiles = (n + UQ_T - 1) / UQ_T, p0 = ri[0] / UQ_T;
    for (int64_t step = 0; step < 2 * tiles; ++step) {
        // p0, p0 - 1, p0 + 1, p0 - 2, ...: twins are likeliest near the tokens
        const int64_t p = (step & 1) ? p0 - (step + 1) / 2 : p0 + step / 2;
        if (p < 0 || p >= tiles) continue;
        pair_tile(top, k, v, dk, dv, ri, cj, p * UQ_T, n, sa, sb);
        // a row is settled when its 16 lists hold four entries at or past the cutoff (each
        // list keeps its columns' four largest, so the sum of their counts reaches four
        // exactly when four of the row's similarities do)
        bool mine = true;
#pragma unroll
        for (int a = 0; a < 4; ++a) {
            int c = 0;
#pragma unroll
            for (int q = 0; q < UQ_RANK; ++q) c += top[a][q] >= UQ_CUTOFF;
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
            mine = mine && (ri[ty + 16 * a] < 0 || c >= UQ_RANK);
        }
        if (__syncthreads_and(mine)) break;
    }
    write_floors(top, ri, lists, floor_out + h * n);
}

// max(0, 1 - r)^24 as the core computes it: u2 = x·x, u8 = (u2·u2)·(u2·u2), (u8·u8)·u8; 0 from
// the cutoff on.
__device__ __forceinline__ float sharpen(float r) {
    const float x = fmaxf(__fsub_rn(1.0f, r), 0.0f);
    const float u2 = __fmul_rn(x, x);
    const float u8 = __fmul_rn(__fmul_rn(u2, u2), __fmul_rn(u2, u2));
    return r >= UQ_CUTOFF ? 0.0f : __fmul_rn(__fmul_rn(u8, u8), u8);
}

__global__ void __launch_bounds__(UQ_NT)
    score_kernel(const float* __restrict__ floor, int64_t n, int64_t prefix,
                 float* __restrict__ out, int64_t ld_out) {
    const int64_t h = blockIdx.y;
    for (int64_t i = (int64_t)blockIdx.x * UQ_NT + threadIdx.x; i < prefix;
         i += (int64_t)gridDim.x * UQ_NT) {
        float s = sharpen(floor[h * n + i]);
        // a token lends its score to the UQ_FLAT tokens before it, then 0.729^(j - UQ_FLAT) of it
        // to the j-th before, inside the prefix
        float f = 1.0f;
#pragma unroll
        for (int j = 1; j <= UQ_REACH; ++j) {
            if (j > UQ_FLAT) f = __fmul_rn(f, UQ_DECAY);
            if (i + j < prefix) s = fmaxf(s, __fmul_rn(f, sharpen(floor[h * n + i + j])));
        }
        out[h * ld_out + i] = s;
    }
}

// Workspace parts: unit K [H][N][dk] f32, unit V [H][N][dv] f32, floors [H][N] f32, the
// open lists [H][N] int32 and their counts [H] int32, each 4 bytes an element, rounded up
// to 256 bytes; SIZE_MAX when that overflows.
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
    const size_t parts[5] = {part_bytes(heads, n, dk), part_bytes(heads, n, dv),
                             part_bytes(heads, n, 1), part_bytes(heads, n, 1),
                             part_bytes(heads, 1, 1)};
    size_t total = 0;
    for (size_t b : parts) {
        if (b == SIZE_MAX || total > SIZE_MAX - b) return SIZE_MAX;
        total += b;
    }
    return total;
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
    char* p = static_cast<char*>(ws);
    float* ku = reinterpret_cast<float*>(p);
    p += part_bytes(heads, n, k->dim);
    float* vu = reinterpret_cast<float*>(p);
    p += part_bytes(heads, n, v->dim);
    float* floor = reinterpret_cast<float*>(p);
    p += part_bytes(heads, n, 1);
    int32_t* open = reinterpret_cast<int32_t*>(p);
    p += part_bytes(heads, n, 1);
    int32_t* n_open = reinterpret_cast<int32_t*>(p);
    cudaStream_t st = KVE_STREAM(stream);
    KVE_CHECK(unit_rows(k, ku, st));
    KVE_CHECK(unit_rows(v, vu, st));
    const int dk = (int)k->dim, dv = (int)v->dim;
    const dim3 tiles((unsigned)ceil_div(n, UQ_T), (unsigned)heads);
    // a band that reaches every pair is the whole search: no second scan
    const bool whole = n <= UQ_NEAR + UQ_T;
    KVE_CHECK(launch_kernel(band_kernel, tiles, UQ_NT, 0, st, ku, vu, n, dk, dv,
                            whole ? n : UQ_NEAR, floor));
    if (!whole) {
        KVE_CHECK(launch_kernel(open_list_kernel, dim3(1, (unsigned)heads), UQ_LIST_NT, 0, st,
                                floor, n, open, n_open));
        KVE_CHECK(launch_kernel(exact_kernel, tiles, UQ_NT, 0, st, ku, vu, n, dk, dv, open,
                                n_open, floor));
    }
    const int64_t score_blocks = ceil_div(prefix, UQ_NT);
    const dim3 grid((unsigned)(score_blocks > 65535 ? 65535 : score_blocks), (unsigned)heads);
    KVE_CHECK(launch_kernel(score_kernel, grid, UQ_NT, 0, st, floor, n, prefix, out, ld_out));
    return 0;
}
