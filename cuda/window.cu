// Window attention (design §2) with split-N online softmax and the column
// aggregates over the window (design §3: SnapKV mean, LaProx L2 norm, GQA
// reductions, LaProx exact-GQA cross terms). The [w, N] attention matrix is
// never written to global memory.
//
// Pass 1 (grid: splits x Hkv): for every query row (h, j) of the block's KV
//   group, the max and sum-exp of the scaled logits over the block's key range
//   (causal: query j sees keys i <= P + j), written per split.
// Combine: per row m = max_s m_s, l = Σ_s l_s·exp(m_s - m); stores (m, 1/l).
// With the caller's row log-sum-exp (flash attention's softmax_lse, or the core's
//   window_row_lse), pass 1 and the combine are skipped: a tiny kernel stores
//   (lse, 1) per row instead, and K is read once.
// Pass 2 (grid: prefix-tile ranges x Hkv): recomputes the logits of prefix keys
//   (every window query sees every prefix key, no mask), A = exp(z - m)/l, and
//   accumulates per key the column sums / sums of squares / cross products.
//
// Rows of one chunk are ordered j-major (r = jj·hn + hh) so that all g heads of
// one window position are in the same chunk (cross terms need them together);
// where even one position's g rows do not fit the shared memory (large g on
// sm_86/89), a chunk is one position and a range of hn < g heads (no cross terms).
// Logits run on tensor cores for f16/bf16 (products of 16-bit values are exact
// in f32; f32 accumulation), SIMT f32 for f32 inputs.
#include "common.cuh"
#include "mma.cuh"
#include "tile_async.cuh"

namespace kve {
namespace {

constexpr int WIN_TK = 64;   // keys per tile
constexpr int WIN_NT = 256;  // threads per block
constexpr int WIN_MAXG_CROSS = 16;
constexpr int WIN_MAX_PAIRS = WIN_MAXG_CROSS * (WIN_MAXG_CROSS + 1) / 2;

template <typename T, int DKP> struct WinCfg {
    static constexpr int PAD = Pad<T>::value;
    static constexpr int LDQ = DKP + PAD;
    static constexpr int LDK = DKP + PAD;
    static constexpr int LDS = WIN_TK + 4;
    static constexpr int RMAX = (DKP * (int)sizeof(T) >= 512) ? 64 : 128;
};

// Shared-memory carve-up, identical on host and device.
struct WinSmem {
    size_t q, k, k2, s, rm, rl, acc, pairs, total;
};
template <typename T, int DKP>
__host__ __device__ inline WinSmem win_smem(int rcp, int n_items, int kbufs) {
    using C = WinCfg<T, DKP>;
    WinSmem o;
    size_t off = 0;
    auto take = [&](size_t bytes) {
        size_t at = off;
        off += (bytes + 127) / 128 * 128;
        return at;
    };
    o.q = take((size_t)rcp * C::LDQ * sizeof(T));
    o.k = take((size_t)WIN_TK * C::LDK * sizeof(T));
    o.k2 = kbufs == 2 ? take((size_t)WIN_TK * C::LDK * sizeof(T)) : o.k;  // the next K tile
    o.s = take((size_t)rcp * C::LDS * sizeof(float));
    o.rm = take((size_t)rcp * sizeof(float));
    o.rl = take((size_t)rcp * sizeof(float));
    o.acc = take((size_t)n_items * WIN_TK * sizeof(float));
    o.pairs = take((size_t)2 * WIN_MAX_PAIRS);
    o.total = off;
    return o;
}

// The buffers at win_smem's offsets in the dynamic shared memory `smem` (both passes):
// Q, the two K tiles (one where kbufs = 1), logits, row max, row sum (pass 1) or its
// inverse (pass 2), pass 2's accumulators and its pair tables.
template <typename T> struct WinBufs {
    T* q;
    T* k0;
    T* k1;
    float* s;
    float* rm;
    float* rl;
    float* acc;
    unsigned char* pairs;
};
template <typename T>
__device__ inline WinBufs<T> win_bufs(unsigned char* smem, const WinSmem& L) {
    return {reinterpret_cast<T*>(smem + L.q),    reinterpret_cast<T*>(smem + L.k),
            reinterpret_cast<T*>(smem + L.k2),   reinterpret_cast<float*>(smem + L.s),
            reinterpret_cast<float*>(smem + L.rm), reinterpret_cast<float*>(smem + L.rl),
            reinterpret_cast<float*>(smem + L.acc), smem + L.pairs};
}

// Pass 2's per-key accumulators: the g column sums when mean or group is asked for,
// then the squared sums (l2) or all g(g+1)/2 cross products (cross).
__host__ __device__ inline int win_items(int g, bool cross, bool want_sum, bool want_sq) {
    return (want_sum ? g : 0) + (want_sq ? (cross ? g * (g + 1) / 2 : g) : 0);
}

// Chunks of the window rows and the two passes' dynamic shared memory: jc
// positions of all g heads per chunk (rcp = rows padded to 16), as many as RMAX
// rows allow, fewer where pass 2 would exceed `optin` (the device's opt-in limit
// per block: 99 KiB on sm_86/89, 163 KiB on sm_80, 227 KiB on sm_90); where one
// position of g heads does not fit either, one position of hc < g heads (not with
// cross terms, which need the whole group). Smaller chunks only re-read K more often
// (pass 1) and reload Q more often (pass 2). jc = 0: no chunk fits.
struct WinPlan {
    int jc, hc, rcp;
    int kbufs;  // 2: the next K tile is fetched (cp.async) while the current one is used
    size_t sm1, sm2;
};
// A chunking that fits: a second K tile buffer too where pass 2 still fits with it
// (both passes then use two), and the passes' shared-memory sizes.
template <typename T, int DKP>
__host__ inline WinPlan win_bufs(WinPlan p, int n_items, size_t optin) {
    p.kbufs = win_smem<T, DKP>(p.rcp, n_items, 2).total <= optin ? 2 : 1;
    p.sm2 = win_smem<T, DKP>(p.rcp, n_items, p.kbufs).total;
    p.sm1 = win_smem<T, DKP>(p.rcp, 0, p.kbufs).total;
    return p;
}

template <typename T, int DKP>
__host__ inline WinPlan win_plan(int64_t w, int g, int n_items, bool cross, size_t optin) {
    using C = WinCfg<T, DKP>;
    int64_t jc = C::RMAX / g;
    if (jc < 1) jc = 1;
    if (jc > w) jc = w;
    for (; jc >= 1; --jc) {
        const int rcp = (int)((jc * g + 15) / 16 * 16);
        if (win_smem<T, DKP>(rcp, n_items, 1).total <= optin)
            return win_bufs<T, DKP>(WinPlan{(int)jc, g, rcp, 1, 0, 0}, n_items, optin);
    }
    if (!cross)
        for (int parts = 2; parts <= g; ++parts) {
            const int hc = (g + parts - 1) / parts;  // balanced head chunks
            const int rcp = (hc + 15) / 16 * 16;
            if (win_smem<T, DKP>(rcp, n_items, 1).total <= optin)
                return win_bufs<T, DKP>(WinPlan{1, hc, rcp, 1, 0, 0}, n_items, optin);
        }
    return WinPlan{0, 0, 0, 0, 0, 0};
}

struct WinArgs {
    View q, k;
    int64_t n, w, p;  // tokens, window, prefix
    int g, jc, rcp, nchunks;
    int hc, hchunks;  // heads per chunk (g unless the group is split), head chunks
    int kbufs;        // K tile buffers: 2 = the next tile in flight (cp.async)
    int64_t tiles_per_block;
    int nsplit;  // pass 1 splits
    float scale;
};

// Chunk c of the window rows: positions j0.. j0+jn, heads h0.. h0+hn of the group.
struct WinChunk {
    int64_t j0;
    int jn, h0, hn;
};
__device__ __forceinline__ WinChunk win_chunk(const WinArgs& a, int c) {
    WinChunk k;
    const int pc = c / a.hchunks, hcix = c - pc * a.hchunks;
    k.j0 = (int64_t)pc * a.jc;
    k.jn = (int)min((int64_t)a.jc, a.w - k.j0);
    k.h0 = hcix * a.hc;
    k.hn = min(a.hc, a.g - k.h0);
    return k;
}

// The K tile pipeline of both passes over tiles t_begin.. t_end of keys 0.. n: with two
// buffers, tile t+1 is issued (cp.async) before tile t is used; with one, tile t is
// issued and awaited at its turn. Either way the caller's next __syncthreads makes tile
// t visible to the block, and every read of a buffer is followed by a __syncthreads
// before it is refilled.
template <typename T, int DKP>
__device__ __forceinline__ void win_k_issue(const WinArgs& a, T* dst, int hk, int64_t t, int64_t n) {
    using C = WinCfg<T, DKP>;
    const int64_t i0 = t * WIN_TK;
    load_tile_async<T>(dst, C::LDK, a.k, hk, i0, (int)min((int64_t)WIN_TK, n - i0), WIN_TK, DKP);
}
template <typename T, int DKP>
__device__ __forceinline__ void win_k_first(const WinArgs& a, T* k0, int hk, int64_t t_begin,
                                            int64_t t_end, int64_t n) {
    if (a.kbufs == 2 && t_begin < t_end) win_k_issue<T, DKP>(a, k0, hk, t_begin, n);
    __pipeline_commit();
}
template <typename T, int DKP>
__device__ __forceinline__ T* win_k_tile(const WinArgs& a, T* k0, T* k1, int hk, int64_t t,
                                         int64_t t_begin, int64_t t_end, int64_t n) {
    if (a.kbufs != 2) {
        win_k_issue<T, DKP>(a, k0, hk, t, n);
        __pipeline_commit();
        __pipeline_wait_prior(0);
        return k0;
    }
    // selects, not an indexed array (which would live in local memory)
    const bool odd = ((t - t_begin) & 1) != 0;
    if (t + 1 < t_end) win_k_issue<T, DKP>(a, odd ? k0 : k1, hk, t + 1, n);
    __pipeline_commit();
    __pipeline_wait_prior(1);  // every group but the newest: tile t
    return odd ? k1 : k0;
}

// minBlocks 1: with the thread count alone, ptxas capped the bf16 builds at 64
// registers on sm_86/89 and spilled (the K tile pipeline's extra live pointers).
template <typename T, int DKP>
__global__ void __launch_bounds__(WIN_NT, 1) window_pass1(WinArgs a, float2* __restrict__ part) {
    using C = WinCfg<T, DKP>;
    extern __shared__ __align__(128) unsigned char smem[];
    const WinSmem L = win_smem<T, DKP>(a.rcp, 0, a.kbufs);
    [[maybe_unused]] const auto [Qs, K0, K1, S, rm, rl, acc, pairs] = win_bufs<T>(smem, L);

    const int hk = blockIdx.y;
    const int split = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int64_t ntiles = (a.n + WIN_TK - 1) / WIN_TK;
    const int64_t t_begin = (int64_t)split * a.tiles_per_block;
    const int64_t t_end = min(ntiles, t_begin + a.tiles_per_block);

    for (int c = 0; c < a.nchunks; ++c) {
        const WinChunk ch = win_chunk(a, c);
        const int64_t j0 = ch.j0;
        const int hn = ch.hn, rows = ch.jn * hn;
        load_q_rows<T>(Qs, C::LDQ, DKP, a.q, hk, a.g, ch.h0, hn, j0, ch.jn, a.rcp);
        for (int r = threadIdx.x; r < a.rcp; r += blockDim.x) {
            rm[r] = -INFINITY;
            rl[r] = 0.0f;
        }
        win_k_first<T, DKP>(a, K0, hk, t_begin, t_end, a.n);
        for (int64_t t = t_begin; t < t_end; ++t) {
            const int64_t i0 = t * WIN_TK;
            const int kn = (int)min((int64_t)WIN_TK, a.n - i0);
            T* Ks = win_k_tile<T, DKP>(a, K0, K1, hk, t, t_begin, t_end, a.n);
            __syncthreads();
            MM<T>::template abt<DKP>(S, C::LDS, Qs, C::LDQ, Ks, C::LDK, a.rcp, WIN_TK);
            __syncthreads();
            for (int r = warp; r < rows; r += nw) {
                const int64_t lim = a.p + j0 + r / hn;  // last visible key
                const int c0 = lane, c1 = lane + 32;
                float z0 = -INFINITY, z1 = -INFINITY;
                if (c0 < kn && i0 + c0 <= lim) z0 = S[r * C::LDS + c0] * a.scale;
                if (c1 < kn && i0 + c1 <= lim) z1 = S[r * C::LDS + c1] * a.scale;
                const float mt = warp_max(fmaxf(z0, z1));
                if (mt == -INFINITY) continue;  // warp-uniform: nothing visible here
                const float mo = rm[r];
                const float mn = fmaxf(mo, mt);
                float e = (z0 == -INFINITY ? 0.0f : expf(z0 - mn)) +
                          (z1 == -INFINITY ? 0.0f : expf(z1 - mn));
                e = warp_sum(e);
                if (lane == 0) {
                    rl[r] = (mo == -INFINITY ? 0.0f : rl[r] * expf(mo - mn)) + e;
                    rm[r] = mn;
                }
            }
            __syncthreads();
        }
        for (int r = threadIdx.x; r < rows; r += blockDim.x) {
            const int hh = ch.h0 + r % hn, jj = r / hn;
            const int64_t row = ((int64_t)hk * a.g + hh) * a.w + j0 + jj;
            part[row * a.nsplit + split] = make_float2(rm[r], rl[r]);
        }
        __syncthreads();
    }
}

__global__ void window_combine(const float2* __restrict__ part, int nsplit, int64_t rows,
                               float2* __restrict__ stats) {
    const int64_t row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float2* p = part + row * nsplit;
    float m = -INFINITY;
    for (int s = 0; s < nsplit; ++s)
        if (p[s].y > 0.0f) m = fmaxf(m, p[s].x);
    float l = 0.0f;
    if (m != -INFINITY)
        for (int s = 0; s < nsplit; ++s)
            if (p[s].y > 0.0f) l += p[s].y * expf(p[s].x - m);
    stats[row] = make_float2(m, l > 0.0f ? 1.0f / l : 0.0f);
}

// Row statistics from the caller's log-sum-exp: pass 2's exp(z - m) * inv_l is then
// exp(z - lse). Rows are h*w + j, as the stats array.
__global__ void window_lse_stats(const float* __restrict__ lse, int64_t rows,
                                 float2* __restrict__ stats) {
    const int64_t row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    stats[row] = make_float2(lse[row], 1.0f);
}

struct WinOut {
    float* mean;   // [Hq, P]
    float* l2;     // [Hq, P]
    float* cross;  // [Hkv, npairs, P]
    float* group;  // [Hkv, P]
    int gqa_op;
    int cross_on;
    int want_sum;  // mean or group requested: the g column sums
    int want_sq;   // l2 or cross requested: the squared sums / cross products
};

template <typename T, int DKP>
__global__ void __launch_bounds__(WIN_NT)
    window_pass2(WinArgs a, const float2* __restrict__ stats, WinOut o) {
    using C = WinCfg<T, DKP>;
    extern __shared__ __align__(128) unsigned char smem[];
    const int g = a.g;
    const int npairs = o.cross_on ? g * (g + 1) / 2 : g;
    // only the requested statistics: sums (mean, group) first, then products (l2, cross)
    const int nsum = o.want_sum ? g : 0;
    const int n_items = win_items(g, o.cross_on != 0, o.want_sum != 0, o.want_sq != 0);
    const WinSmem L = win_smem<T, DKP>(a.rcp, n_items, a.kbufs);
    const auto [Qs, K0, K1, S, rm, ri, acc, pa] = win_bufs<T>(smem, L);
    unsigned char* pb = pa + WIN_MAX_PAIRS;

    const int hk = blockIdx.y;
    if (threadIdx.x == 0) {
        // the diagonal (a, a) first, then the pairs a < b in row order (the
        // core's Gram block order, src/math/gram.rs)
        int p = 0;
        for (int x = 0; x < g; ++x, ++p) {
            pa[p] = (unsigned char)x;
            pb[p] = (unsigned char)x;
        }
        if (o.cross_on)
            for (int x = 0; x < g; ++x)
                for (int y = x + 1; y < g; ++y, ++p) {
                    pa[p] = (unsigned char)x;
                    pb[p] = (unsigned char)y;
                }
    }
    const int64_t ptiles = (a.p + WIN_TK - 1) / WIN_TK;
    const int64_t t_begin = (int64_t)blockIdx.x * a.tiles_per_block;
    const int64_t t_end = min(ptiles, t_begin + a.tiles_per_block);
    const float inv_w = 1.0f / (float)a.w;

    win_k_first<T, DKP>(a, K0, hk, t_begin, t_end, a.p);
    for (int64_t t = t_begin; t < t_end; ++t) {
        const int64_t i0 = t * WIN_TK;
        const int kn = (int)min((int64_t)WIN_TK, a.p - i0);
        T* Ks = win_k_tile<T, DKP>(a, K0, K1, hk, t, t_begin, t_end, a.p);
        for (int e = threadIdx.x; e < n_items * WIN_TK; e += blockDim.x) acc[e] = 0.0f;
        for (int c = 0; c < a.nchunks; ++c) {
            const int pc = c / a.hchunks, h0 = (c - pc * a.hchunks) * a.hc;
            const int64_t j0 = (int64_t)pc * a.jc;
            const int jn = (int)min((int64_t)a.jc, a.w - j0), hn = min(a.hc, g - h0);
            const int rows = jn * hn;
            if (a.nchunks > 1 || t == t_begin) {
                load_q_rows<T>(Qs, C::LDQ, DKP, a.q, hk, g, h0, hn, j0, jn, a.rcp);
                for (int r = threadIdx.x; r < rows; r += blockDim.x) {
                    const int hh = h0 + r % hn, jj = r / hn;
                    const float2 st = stats[((int64_t)hk * g + hh) * a.w + j0 + jj];
                    rm[r] = st.x;
                    ri[r] = st.y;
                }
            }
            __syncthreads();
            MM<T>::template abt<DKP>(S, C::LDS, Qs, C::LDQ, Ks, C::LDK, a.rcp, WIN_TK);
            __syncthreads();
            for (int e = threadIdx.x; e < rows * WIN_TK; e += blockDim.x) {
                const int r = e / WIN_TK, col = e - r * WIN_TK;
                float* sp = &S[r * C::LDS + col];
                *sp = col < kn ? expf(*sp * a.scale - rm[r]) * ri[r] : 0.0f;
            }
            __syncthreads();
            // the items of the chunk's heads (all of them unless the group is split,
            // which it never is with cross terms)
            for (int e = threadIdx.x; e < n_items * WIN_TK; e += blockDim.x) {
                const int item = e / WIN_TK, col = e - item * WIN_TK;
                const bool is_sum = item < nsum;
                const int x = (is_sum ? item : pa[item - nsum]) - h0;
                const int y = (is_sum ? item : pb[item - nsum]) - h0;
                if ((unsigned)x >= (unsigned)hn || (unsigned)y >= (unsigned)hn) continue;
                float s = 0.0f;
                if (is_sum) {
                    for (int jj = 0; jj < jn; ++jj) s += S[(jj * hn + x) * C::LDS + col];
                } else {
                    for (int jj = 0; jj < jn; ++jj)
                        s += S[(jj * hn + x) * C::LDS + col] * S[(jj * hn + y) * C::LDS + col];
                }
                acc[e] += s;
            }
            __syncthreads();
        }
        // Outputs for the tile's keys.
        for (int col = threadIdx.x; col < kn; col += blockDim.x) {
            const int64_t i = i0 + col;
            float red = (o.gqa_op == KVE_CUDA_GQA_MAX) ? -INFINITY : 0.0f;
            for (int hh = 0; hh < g; ++hh) {
                const int64_t h = (int64_t)hk * g + hh;
                const float mean = nsum ? acc[hh * WIN_TK + col] * inv_w : 0.0f;
                if (o.mean) o.mean[h * a.p + i] = mean;
                if (o.l2)
                    o.l2[h * a.p + i] = sqrtf(fmaxf(acc[(nsum + hh) * WIN_TK + col], 0.0f));
                if (o.gqa_op == KVE_CUDA_GQA_MAX)
                    red = fmaxf(red, mean);
                else
                    red += mean;
            }
            if (o.group)
                o.group[(int64_t)hk * a.p + i] =
                    (o.gqa_op == KVE_CUDA_GQA_MEAN) ? red / (float)g : red;
            if (o.cross)
                for (int p = 0; p < npairs; ++p)
                    o.cross[((int64_t)hk * npairs + p) * a.p + i] = acc[(nsum + p) * WIN_TK + col];
        }
        __syncthreads();
    }
}

// Number of pass-1 splits: a function of (N, Hkv) only, so that the workspace
// size is known before the launch.
int64_t pass1_splits(int64_t n, int64_t hkv) {
    const int64_t ntiles = ceil_div(n, WIN_TK);
    int64_t want = ceil_div(1024, hkv > 0 ? hkv : 1);
    if (want < 1) want = 1;
    return ntiles < want ? (ntiles > 0 ? ntiles : 1) : want;
}

template <typename T, int DKP>
int window_run(WinArgs a, int64_t hq, int64_t hkv, const WinOut& o, const float* row_lse,
               void* ws, cudaStream_t st) {
    // Shared-memory limits first (host-side; may refuse): nothing is enqueued
    // unless every launch can run.
    int dev = 0, optin = 0;
    KVE_CHECK(cudaGetDevice(&dev));
    KVE_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    const int n_items = win_items(a.g, o.cross_on != 0, o.want_sum != 0, o.want_sq != 0);
    const WinPlan plan = win_plan<T, DKP>(a.w, a.g, n_items, o.cross_on != 0, (size_t)optin);
    if (plan.jc == 0) return (int)cudaErrorInvalidValue;
    a.jc = plan.jc;
    a.hc = plan.hc;
    a.hchunks = (int)ceil_div(a.g, a.hc);
    a.rcp = plan.rcp;
    a.kbufs = plan.kbufs;
    a.nchunks = (int)(ceil_div(a.w, a.jc) * a.hchunks);

    const int64_t nsplit = pass1_splits(a.n, hkv);
    const int64_t ntiles = ceil_div(a.n, WIN_TK);
    a.nsplit = (int)nsplit;
    float2* part = reinterpret_cast<float2*>(ws);
    float2* stats = part + hq * a.w * nsplit;
    const int64_t rows = hq * a.w;

    const size_t sm1 = plan.sm1, sm2 = plan.sm2;
    if (!row_lse) KVE_CHECK(set_smem(window_pass1<T, DKP>, sm1));
    KVE_CHECK(set_smem(window_pass2<T, DKP>, sm2));

    if (row_lse) {
        // the caller's row statistics: (lse, 1)
        KVE_CHECK(launch_kernel(window_lse_stats, (unsigned)ceil_div(rows, 256), 256, 0, st,
            row_lse, rows, stats));
    } else {
        // pass 1
        WinArgs a1 = a;
        a1.tiles_per_block = ceil_div(ntiles, nsplit);
        // Splits past the last tile get an empty key range but are still
        // launched, so every partial (m = -inf, l = 0) gets written.
        KVE_CHECK(launch_kernel(window_pass1<T, DKP>, dim3((unsigned)nsplit, (unsigned)hkv), WIN_NT,
            sm1, st, a1, part));
        // combine
        KVE_CHECK(launch_kernel(window_combine, (unsigned)ceil_div(rows, 256), 256, 0, st, part,
            (int)nsplit, rows, stats));
    }
    // pass 2
    {
        const int64_t ptiles = ceil_div(a.p, WIN_TK);
        int64_t want = ceil_div(2048, hkv);
        if (want < 1) want = 1;
        WinArgs a2 = a;
        a2.tiles_per_block = ceil_div(ptiles, want < ptiles ? want : ptiles);
        const int64_t blocks = ceil_div(ptiles, a2.tiles_per_block);
        KVE_CHECK(launch_kernel(window_pass2<T, DKP>, dim3((unsigned)blocks, (unsigned)hkv), WIN_NT,
            sm2, st, a2, stats, o));
    }
    return 0;
}

template <typename T>
int window_dispatch(const WinArgs& a, int64_t hq, int64_t hkv, const WinOut& o,
                    const float* row_lse, void* ws, cudaStream_t st) {
    const int64_t dk = a.q.dim;
    if (dk <= 64) return window_run<T, 64>(a, hq, hkv, o, row_lse, ws, st);
    if (dk <= 128) return window_run<T, 128>(a, hq, hkv, o, row_lse, ws, st);
    return window_run<T, 256>(a, hq, hkv, o, row_lse, ws, st);
}

}  // namespace
}  // namespace kve

using namespace kve;

extern "C" size_t kve_cuda_window_workspace_size(int64_t hq, int64_t w, int64_t n, int64_t hkv) {
    if (hq <= 0 || w <= 0 || n <= 0 || hkv <= 0) return 0;
    const int64_t nsplit = pass1_splits(n, hkv);
    return (size_t)(hq * w * nsplit + hq * w) * sizeof(float2);
}

extern "C" int kve_cuda_window(const kve_cuda_view* q, const kve_cuda_view* k, int64_t w,
                               float* out_mean, float* out_l2, float* out_cross,
                               float* out_group, int gqa_op, const float* row_lse, void* ws,
                               size_t ws_bytes, void* stream) {
    if (!view_ok(q) || !view_ok(k)) return (int)cudaErrorInvalidValue;
    if (q->dtype != k->dtype) return (int)cudaErrorInvalidValue;
    const int64_t hq = q->heads, hkv = k->heads, n = k->tokens, dk = k->dim;
    if (hkv <= 0 || hq <= 0 || hq % hkv != 0) return (int)cudaErrorInvalidValue;
    const int64_t g = hq / hkv;
    if (w < 1 || w > n || q->tokens != w || q->dim != dk) return (int)cudaErrorInvalidValue;
    if (dk < 1 || dk > 256) return (int)cudaErrorInvalidValue;
    if (gqa_op < KVE_CUDA_GQA_MEAN || gqa_op > KVE_CUDA_GQA_SUM) return (int)cudaErrorInvalidValue;
    if (out_cross && g > WIN_MAXG_CROSS) return (int)cudaErrorInvalidValue;
    if (g > 128 || w > (int64_t)1 << 24 || n > (int64_t)1 << 40) return (int)cudaErrorInvalidValue;
    const int64_t p = n - w;
    if (p == 0 || (!out_mean && !out_l2 && !out_cross && !out_group)) return 0;
    const size_t need = kve_cuda_window_workspace_size(hq, w, n, hkv);
    if (!ws || ws_bytes < need) return (int)cudaErrorInvalidValue;

    WinArgs a;
    a.q = to_view(*q);
    a.k = to_view(*k);
    a.n = n;
    a.w = w;
    a.p = p;
    a.g = (int)g;
    a.jc = a.rcp = a.nchunks = a.nsplit = a.hc = a.hchunks = a.kbufs = 0;
    a.tiles_per_block = 0;
    a.scale = (float)(1.0 / sqrt((double)dk));
    WinOut o;
    o.mean = out_mean;
    o.l2 = out_l2;
    o.cross = out_cross;
    o.group = out_group;
    o.gqa_op = gqa_op;
    o.cross_on = out_cross != nullptr;
    o.want_sum = out_mean || out_group;
    o.want_sq = out_l2 || out_cross;
    cudaStream_t st = KVE_STREAM(stream);
    switch (q->dtype) {
        case KVE_CUDA_F32: return window_dispatch<float>(a, hq, hkv, o, row_lse, ws, st);
        case KVE_CUDA_F16: return window_dispatch<__half>(a, hq, hkv, o, row_lse, ws, st);
        case KVE_CUDA_BF16:
            return window_dispatch<__nv_bfloat16>(a, hq, hkv, o, row_lse, ws, st);
        default: return (int)cudaErrorInvalidValue;
    }
}
