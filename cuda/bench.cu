// Whole-model benchmark of the CUDA launchers on a Llama-3-8B-shaped cache
// (L=32, Hq=32, Hkv=8, d=128, bf16, w=32): LaProx scores for every layer
// (window attention L2 norms, avg-pool 7, value-output norms through the Gram
// matrices on tensor cores, group sum), per-layer sums, one global top-K over
// the model (LaProx Alg. 2 normalisation) and in-place compaction of K and V.
//
// Prints per-stage times, the whole pipeline eager and as a CUDA graph replay,
// the two ceilings measured in this run (device-to-device copy bandwidth; a
// bf16 WMMA GEMM of our own, or --mm-tflops from a faster library), the
// roofline floor = max(bytes / bandwidth, FLOPs / matmul rate) and the ratio.
// Every timed stage also gets its GB/s and TFLOP/s against the H200's nominal
// roofline (HBM 4.8 TB/s, 990 TFLOP/s dense f16) and a `STAGE n= name= ms= bytes=
// flops=` line, which cuda/check.sh sets beside PyTorch's time for the same stage
// (cuda/bench_torch.py `TORCH_STAGE` lines). The question-agnostic uniqueness scorer is
// timed on one layer at N <= 32k (its exact scan is quadratic; on this random data no
// token has four twins, so every token is compared with the whole cache: its worst case).
//
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Icuda -L<cuda lib> \
//          cuda/bench.cu $(ls cuda/*.cu | grep -v bench.cu)   (cuda/prebuild.sh does this)
// Run:   kvevict_bench [--n 32768,131072] [--keep 0.1] [--reps 5] [--mm-tflops X]
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <mma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <vector>
#include <algorithm>
#include <string>

#include "kvevict_cuda.h"

#define CK(x)                                                                        \
    do {                                                                             \
        int e_ = (int)(x);                                                           \
        if (e_ != 0) {                                                               \
            fprintf(stderr, "%s:%d: %s -> %d (%s)\n", __FILE__, __LINE__, #x, e_,    \
                    cudaGetErrorString((cudaError_t)e_));                            \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

// ---------------------------------------------------------------- fill ----
__global__ void fill_bf16(__nv_bfloat16* p, size_t n, uint64_t seed, float scale) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        const float u = (float)(z >> 40) / (float)(1u << 24);  // [0,1)
        p[i] = __float2bfloat16((u * 2.0f - 1.0f) * scale);
    }
}
// G += I for every [d, d] block: Gram-like (v G vᵀ ≈ |v|² > 0), so the scores are
// positive and ties at zero don't distort the selection timing.
__global__ void add_identity(__nv_bfloat16* g, size_t blocks, int d) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < blocks * d;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t b = i / d, r = i % d;
        __nv_bfloat16* x = g + b * d * d + r * d + r;
        *x = __float2bfloat16(__bfloat162float(*x) + 1.0f);
    }
}
static void fill(__nv_bfloat16* p, size_t n, uint64_t seed, float scale) {
    fill_bf16<<<4096, 256>>>(p, n, seed, scale);
    CK(cudaGetLastError());
}

// ------------------------------------------------- WMMA GEMM (ceiling) ----
// C[M,N] f32 = A[M,K] bf16 (row-major) · B[K,N] bf16 (row-major); 128x128 block
// tile, K step 32, 8 warps of 64x32, register double-buffered global loads.
namespace gemm {
constexpr int BM = 128, BN = 128, BK = 32, LDA = BK + 8, LDB = BN + 8;
__global__ void __launch_bounds__(256) kernel(const __nv_bfloat16* A, const __nv_bfloat16* B,
                                              float* C, int M, int N, int K) {
    using namespace nvcuda;
    __shared__ __align__(128) __nv_bfloat16 As[2][BM * LDA];
    __shared__ __align__(128) __nv_bfloat16 Bs[2][BK * LDB];
    const int tid = threadIdx.x, warp = tid >> 5;
    const int wm = (warp / 4) * 64, wn = (warp % 4) * 32;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c[4][2];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 2; ++j) wmma::fill_fragment(c[i][j], 0.0f);
    // each thread moves 2 x 16B of A (128x32) and 2 x 16B of B (32x128) per step
    uint4 ra[2], rb[2];
    auto gload = [&](int k0) {
        for (int r = 0; r < 2; ++r) {
            const int e = tid + r * 256;  // 512 vectors of 8
            const int ar = e / 4, ac = (e % 4) * 8;
            ra[r] = *reinterpret_cast<const uint4*>(A + (size_t)(m0 + ar) * K + k0 + ac);
            const int br = e / 16, bc = (e % 16) * 8;
            rb[r] = *reinterpret_cast<const uint4*>(B + (size_t)(k0 + br) * N + n0 + bc);
        }
    };
    auto sstore = [&](int buf) {
        for (int r = 0; r < 2; ++r) {
            const int e = tid + r * 256;
            const int ar = e / 4, ac = (e % 4) * 8;
            *reinterpret_cast<uint4*>(&As[buf][ar * LDA + ac]) = ra[r];
            const int br = e / 16, bc = (e % 16) * 8;
            *reinterpret_cast<uint4*>(&Bs[buf][br * LDB + bc]) = rb[r];
        }
    };
    gload(0);
    sstore(0);
    __syncthreads();
    int buf = 0;
    for (int k0 = 0; k0 < K; k0 += BK) {
        const bool more = k0 + BK < K;
        if (more) gload(k0 + BK);
        for (int kk = 0; kk < BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a[4];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b[2];
            for (int i = 0; i < 4; ++i)
                wmma::load_matrix_sync(a[i], &As[buf][(wm + i * 16) * LDA + kk], LDA);
            for (int j = 0; j < 2; ++j)
                wmma::load_matrix_sync(b[j], &Bs[buf][kk * LDB + wn + j * 16], LDB);
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 2; ++j) wmma::mma_sync(c[i][j], a[i], b[j], c[i][j]);
        }
        if (more) sstore(buf ^ 1);
        __syncthreads();
        buf ^= 1;
    }
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 2; ++j)
            wmma::store_matrix_sync(C + (size_t)(m0 + wm + i * 16) * N + n0 + wn + j * 16, c[i][j],
                                    N, wmma::mem_row_major);
}
}  // namespace gemm

// The H200's nominal roofline (per-stage percentages; the floor uses the measured ceilings).
constexpr double H200_HBM = 4.8e12, H200_F16 = 990e12;

// One timed stage: human line with GB/s and TFLOP/s against the roofline, and a machine line.
static void stage_line(long long n, const char* name, const char* label, double ms, double bytes,
                       double flops) {
    const double s = ms * 1e-3, gbs = bytes / s / 1e9, tfs = flops / s / 1e12;
    printf("    %-34s %9.3f ms  %8.1f GB/s (%5.1f%% of 4.8 TB/s)  %7.2f TFLOP/s (%5.2f%% of 990)\n",
           label, ms, gbs, 100.0 * bytes / s / H200_HBM, tfs, 100.0 * flops / s / H200_F16);
    printf("STAGE n=%lld name=%s ms=%.4f bytes=%.0f flops=%.0f\n", n, name, ms, bytes, flops);
}

static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

struct Timer {
    cudaEvent_t a, b;
    Timer() {
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
    }
    void start(cudaStream_t s) { CK(cudaEventRecord(a, s)); }
    float stop(cudaStream_t s) {
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        return ms;
    }
};

static double measure_copy_bw(cudaStream_t s) {
    const size_t bytes = (size_t)4 << 30;
    void *x, *y;
    CK(cudaMalloc(&x, bytes));
    CK(cudaMalloc(&y, bytes));
    CK(cudaMemsetAsync(x, 1, bytes, s));
    Timer t;
    std::vector<float> ms;
    for (int r = 0; r < 8; ++r) {
        t.start(s);
        CK(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, s));
        const float m = t.stop(s);
        if (r >= 2) ms.push_back(m);
    }
    CK(cudaFree(x));
    CK(cudaFree(y));
    return 2.0 * bytes / (median(ms) * 1e-3);  // bytes read + written per second
}

static double measure_mm(cudaStream_t s) {
    const int M = 8192, N = 8192, K = 8192;
    __nv_bfloat16 *A, *B;
    float* C;
    CK(cudaMalloc(&A, (size_t)M * K * 2));
    CK(cudaMalloc(&B, (size_t)K * N * 2));
    CK(cudaMalloc(&C, (size_t)M * N * 4));
    fill(A, (size_t)M * K, 11, 1.0f);
    fill(B, (size_t)K * N, 12, 1.0f);
    CK(cudaDeviceSynchronize());  // fill runs on the legacy stream; s is non-blocking
    Timer t;
    std::vector<float> ms;
    for (int r = 0; r < 6; ++r) {
        t.start(s);
        gemm::kernel<<<dim3(N / gemm::BN, M / gemm::BM), 256, 0, s>>>(A, B, C, M, N, K);
        CK(cudaGetLastError());
        const float m = t.stop(s);
        if (r >= 1) ms.push_back(m);
    }
    CK(cudaFree(A));
    CK(cudaFree(B));
    CK(cudaFree(C));
    return 2.0 * M * N * (double)K / (median(ms) * 1e-3);
}

struct Model {
    int L = 32, hq = 32, hkv = 8, d = 128, w = 32;
    int64_t n = 0, p = 0;
    __nv_bfloat16 *K = nullptr, *V = nullptr, *Q = nullptr, *G = nullptr;
    float *l2 = nullptr, *pooled = nullptr, *vo = nullptr, *scores = nullptr;
    double* sums = nullptr;
    int32_t *counts = nullptr, *idx = nullptr;
    void *ws_win = nullptr, *ws_stats = nullptr, *ws_sel = nullptr, *ws_cmp = nullptr;
    void* ws_uniq = nullptr;
    size_t b_win = 0, b_stats = 0, b_sel = 0, b_cmp = 0, b_uniq = 0;
    int64_t keep = 0;

    // A contiguous bf16 [heads][tokens][d] view at `data`.
    kve_cuda_view view(__nv_bfloat16* data, int heads, int64_t tokens) const {
        kve_cuda_view v;
        v.data = data;
        v.dtype = KVE_CUDA_BF16;
        v.reserved = 0;
        v.stride_head = tokens * d;
        v.stride_token = d;
        v.stride_dim = 1;
        v.heads = heads;
        v.tokens = tokens;
        v.dim = d;
        return v;
    }
    kve_cuda_view kv(__nv_bfloat16* base, int l) const {
        return view(base + (size_t)l * hkv * n * d, hkv, n);
    }
    // K and V of every layer with the layer's kept lists (kept_ld = p).
    std::vector<kve_cuda_compact_item> compact_items() const {
        std::vector<kve_cuda_compact_item> items;
        for (int l = 0; l < L; ++l)
            for (int t = 0; t < 2; ++t) {
                kve_cuda_compact_item it;
                it.x = kv(t == 0 ? K : V, l);
                it.kept = idx + (size_t)l * hkv * p;
                it.kept_ld = p;
                it.counts = counts + (size_t)l * hkv;
                items.push_back(it);
            }
        return items;
    }
    kve_cuda_view qv(int l) const { return view(Q + (size_t)l * hq * w * d, hq, w); }
};

// stage masks
enum { ST_WINDOW = 1, ST_VONORM = 2, ST_COMBINE = 4, ST_SELECT = 8, ST_COMPACT = 16, ST_ALL = 31,
       ST_FACTOR = 32 /* value-output norms through the Cholesky factor instead of G */,
       ST_UNIQ = 64 /* the uniqueness scorer of layer 0 alone (not part of ST_ALL) */ };

static void pipeline(Model& m, cudaStream_t s, int stages) {
    const int64_t P = m.p;
    if (stages & ST_UNIQ) {
        kve_cuda_view k = m.kv(m.K, 0), v = m.kv(m.V, 0);
        CK(kve_cuda_uniqueness(&k, &v, P, m.scores, P, m.ws_uniq, m.b_uniq, s));
        return;
    }
    for (int l = 0; l < m.L; ++l) {
        if (stages & ST_WINDOW) {
            kve_cuda_view q = m.qv(l), k = m.kv(m.K, l);
            CK(kve_cuda_window(&q, &k, m.w, nullptr, m.l2, nullptr, nullptr, KVE_CUDA_GQA_MEAN,
                               nullptr, m.ws_win, m.b_win, s));
        }
        if (stages & ST_VONORM) {
            kve_cuda_view v = m.kv(m.V, l);
            // (timing only: the random G serves as its own "factor" in the factor form)
            if (stages & ST_FACTOR)
                CK(kve_cuda_vonorm_factor(&v, P, m.G + (size_t)l * m.hq * m.d * m.d, nullptr, m.hq,
                                          0, m.vo, s));
            else
                CK(kve_cuda_vonorm(&v, P, m.G + (size_t)l * m.hq * m.d * m.d, nullptr, m.hq, 0,
                                   m.vo, s));
        }
        if (stages & ST_COMBINE) {
            CK(kve_cuda_pool(m.l2, P, m.pooled, P, m.hq, P, KVE_CUDA_POOL_AVG, 7, 1.0f, s));
            CK(kve_cuda_head_reduce(m.pooled, P, m.vo, P, 1, nullptr,
                                    m.scores + (size_t)l * m.hkv * P, P, m.hq, m.hkv, P,
                                    KVE_CUDA_GQA_SUM, s));
        }
    }
    if (stages & ST_SELECT) {
        CK(kve_cuda_layer_stats(m.scores, (int64_t)m.hkv * P, (int64_t)m.hkv * P, m.L, m.sums,
                                nullptr, m.ws_stats, m.b_stats, s));
        CK(kve_cuda_select(m.scores, P, P, 1, (int64_t)m.L * m.hkv, nullptr, m.keep, m.sums,
                           m.hkv, m.counts, m.idx, P, m.ws_sel, m.b_sel, s));
    }
    if (stages & ST_COMPACT) {
        // K and V of every layer in one batched call (two launches per 32 tensors)
        std::vector<kve_cuda_compact_item> items = m.compact_items();
        CK(kve_cuda_compact_batch(items.data(), (int64_t)items.size(), P, m.ws_cmp, m.b_cmp, s));
    }
}

static float time_stages(Model& m, cudaStream_t s, int stages, int reps) {
    Timer t;
    std::vector<float> ms;
    pipeline(m, s, stages);  // warm-up
    CK(cudaStreamSynchronize(s));
    for (int r = 0; r < reps; ++r) {
        t.start(s);
        pipeline(m, s, stages);
        ms.push_back(t.stop(s));
    }
    return median(ms);
}

int main(int argc, char** argv) {
    std::vector<int64_t> ns = {32768, 131072};
    double keep_ratio = 0.1, mm_override = 0.0;
    int reps = 5;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--n") && i + 1 < argc) {
            ns.clear();
            std::string a = argv[++i];
            size_t pos = 0;
            while (pos < a.size()) {
                size_t c = a.find(',', pos);
                if (c == std::string::npos) c = a.size();
                ns.push_back(atoll(a.substr(pos, c - pos).c_str()));
                pos = c + 1;
            }
        } else if (!strcmp(argv[i], "--keep") && i + 1 < argc) {
            keep_ratio = atof(argv[++i]);
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--mm-tflops") && i + 1 < argc) {
            mm_override = atof(argv[++i]) * 1e12;
        }
    }
    int ndev = 0;
    if (kve_cuda_device_count(&ndev) != 0 || ndev == 0) {
        printf("skipped: no CUDA device\n");
        return 0;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, %.1f GiB\n", prop.name, prop.multiProcessorCount,
           prop.totalGlobalMem / 1073741824.0);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    const double bw = measure_copy_bw(s);
    const double mm_own = measure_mm(s);
    const double mm = mm_override > mm_own ? mm_override : mm_own;
    printf("ceilings: copy %.2f TB/s (D2D, read+write); bf16 WMMA GEMM (own) %.1f TFLOP/s%s\n",
           bw / 1e12, mm_own / 1e12,
           mm_override > 0 ? "" : "; no library rate given (--mm-tflops)");
    if (mm_override > 0) printf("          matmul rate used for the floor: %.1f TFLOP/s\n", mm / 1e12);

    for (int64_t n : ns) {
        Model m;
        m.n = n;
        m.p = n - m.w;
        const int64_t P = m.p;
        const size_t kv_elems = (size_t)m.L * m.hkv * n * m.d;
        CK(cudaMalloc(&m.K, kv_elems * 2));
        CK(cudaMalloc(&m.V, kv_elems * 2));
        CK(cudaMalloc(&m.Q, (size_t)m.L * m.hq * m.w * m.d * 2));
        CK(cudaMalloc(&m.G, (size_t)m.L * m.hq * m.d * m.d * 2));
        CK(cudaMalloc(&m.l2, (size_t)m.hq * P * 4));
        CK(cudaMalloc(&m.pooled, (size_t)m.hq * P * 4));
        CK(cudaMalloc(&m.vo, (size_t)m.hq * P * 4));
        CK(cudaMalloc(&m.scores, (size_t)m.L * m.hkv * P * 4));
        CK(cudaMalloc(&m.sums, (size_t)m.L * 8));
        CK(cudaMalloc(&m.counts, (size_t)m.L * m.hkv * 4));
        CK(cudaMalloc(&m.idx, (size_t)m.L * m.hkv * P * 4));
        m.b_win = kve_cuda_window_workspace_size(m.hq, m.w, n, m.hkv);
        m.b_stats = kve_cuda_layer_stats_workspace_size(m.L, (int64_t)m.hkv * P);
        m.b_sel = kve_cuda_select_workspace_size(1);
        std::vector<kve_cuda_compact_item> items = m.compact_items();
        m.b_cmp = kve_cuda_compact_batch_workspace_size(items.data(), (int64_t)items.size(), P);
        CK(cudaMalloc(&m.ws_win, m.b_win));
        CK(cudaMalloc(&m.ws_stats, m.b_stats));
        CK(cudaMalloc(&m.ws_sel, m.b_sel));
        CK(cudaMalloc(&m.ws_cmp, m.b_cmp));
        fill(m.K, kv_elems, 1, 2.0f);
        fill(m.V, kv_elems, 2, 1.0f);
        fill(m.Q, (size_t)m.L * m.hq * m.w * m.d, 3, 2.0f);
        fill(m.G, (size_t)m.L * m.hq * m.d * m.d, 4, 0.05f);
        add_identity<<<1024, 256>>>(m.G, (size_t)m.L * m.hq, m.d);
        CK(cudaGetLastError());
        m.keep = (int64_t)(keep_ratio * (double)P) * m.L * m.hkv;
        // the fills ran on the legacy default stream, which s (non-blocking) does not
        // wait for: synchronise the device, not just s
        CK(cudaDeviceSynchronize());

        printf("\nN = %lld (P = %lld), keep %.0f%% of the prefix: K = %lld of %lld\n",
               (long long)n, (long long)P, keep_ratio * 100, (long long)m.keep,
               (long long)P * m.L * m.hkv);
        const float t_win = time_stages(m, s, ST_WINDOW, reps);
        const float t_vo = time_stages(m, s, ST_VONORM, reps);
        const float t_cmb = time_stages(m, s, ST_COMBINE, reps);
        const float t_sel = time_stages(m, s, ST_SELECT, reps);
        const float t_cmp = time_stages(m, s, ST_COMPACT, reps);
        const float t_vof = time_stages(m, s, ST_VONORM | ST_FACTOR, reps);
        const float t_allf = time_stages(m, s, ST_ALL | ST_FACTOR, reps);
        const float t_all = time_stages(m, s, ST_ALL, reps);
        // uniqueness: one layer, quadratic at worst, so only up to 32k tokens
        const bool uniq = n <= 32768;
        float t_uniq = 0.0f;
        if (uniq) {
            m.b_uniq = kve_cuda_uniqueness_workspace_size(m.hkv, n, m.d, m.d);
            CK(cudaMalloc(&m.ws_uniq, m.b_uniq));
            t_uniq = time_stages(m, s, ST_UNIQ, reps < 3 ? reps : 3);
            CK(cudaFree(m.ws_uniq));
            m.ws_uniq = nullptr;
        }
        // graph
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        pipeline(m, s, ST_ALL);
        CK(cudaStreamEndCapture(s, &graph));
        CK(cudaGraphInstantiate(&exec, graph, 0));
        CK(cudaGraphLaunch(exec, s));
        CK(cudaStreamSynchronize(s));
        Timer t;
        std::vector<float> gms;
        for (int r = 0; r < reps; ++r) {
            t.start(s);
            CK(cudaGraphLaunch(exec, s));
            gms.push_back(t.stop(s));
        }
        const float t_graph = median(gms);
        CK(cudaGraphExecDestroy(exec));
        CK(cudaGraphDestroy(graph));
        // counts check
        std::vector<int32_t> cnt((size_t)m.L * m.hkv);
        CK(cudaMemcpy(cnt.data(), m.counts, cnt.size() * 4, cudaMemcpyDeviceToHost));
        long long tot = 0;
        for (int32_t c : cnt) tot += c;

        // floor
        const double kvbytes = 2.0 * kv_elems * 2;  // read K and V once
        const double score_bytes = 2.0 * m.L * m.hkv * P * 4;  // write + read for select
        const double move_bytes = 2.0 /*K,V*/ * 2.0 /*r+w*/ * (double)m.keep * m.d * 2;
        const double bytes = kvbytes + score_bytes + move_bytes;
        const double fl_win = 2.0 * m.L * m.hq * m.w * (double)n * m.d;
        const double fl_vo = 2.0 * m.L * m.hq * (double)P * m.d * m.d;
        const double flops = fl_win + fl_vo;
        const double t_bytes = bytes / bw * 1e3, t_flops = flops / mm * 1e3;
        const double floor_ms = std::max(t_bytes, t_flops);
        printf("  stage times (all %d layers, median of %d):\n", m.L, reps);
        const double f4 = 4.0, b2 = 2.0;  // bytes of an f32 / a bf16
        const double k_bytes = (double)kv_elems * b2, hqp = (double)m.L * m.hq * P;
        const double hkvp = (double)m.L * m.hkv * P;
        // window: K and Q read, the L2 column norms written (one pass of logits counted)
        stage_line(n, "window", "window attention (2 passes)", t_win,
                   k_bytes + (double)m.L * m.hq * m.w * m.d * b2 + hqp * f4, fl_win);
        // value-output norms: the prefix of V and the Grams read, the norms written
        const double vo_bytes = (double)m.L * m.hkv * P * m.d * b2 +
                                (double)m.L * m.hq * m.d * m.d * b2 + hqp * f4;
        stage_line(n, "vonorm", "value-output norms (Gram MMA)", t_vo, vo_bytes, fl_vo);
        const double tri_frac = 0.5 * (1.0 + 16.0 / m.d);  // share of L's 16x16 blocks computed
        stage_line(n, "vonorm_factor", "value-output norms (factor)", t_vof, vo_bytes,
                   tri_frac * fl_vo);
        // pool (read l2, write pooled) and group sum (read pooled and the norms, write scores)
        stage_line(n, "combine", "pool + group sum", t_cmb, hqp * f4 * 4.0 + hkvp * f4,
                   hqp * (7.0 + 2.0));
        // layer sums and the select's passes over the scores, the kept lists written
        stage_line(n, "select", "layer sums + global select", t_sel,
                   hkvp * f4 * 2.0 + (double)m.keep * 4.0, 0.0);
        stage_line(n, "compact", "compact K and V in place", t_cmp, move_bytes, 0.0);
        if (uniq) {
            // one layer: its K and V read, the scores written; every pair's two cosines
            const double ub = 2.0 * m.hkv * (double)n * m.d * b2 + (double)m.hkv * P * f4;
            const double uf = 2.0 * (2.0 * m.d) * (double)n * (double)n * m.hkv;
            stage_line(n, "uniqueness", "uniqueness, layer 0 only (SIMT f32)", t_uniq, ub, uf);
        } else {
            printf("    uniqueness: not timed at N > 32768 (quadratic at worst)\n");
        }
        stage_line(n, "whole", "whole model, eager", t_all, bytes, flops);
        stage_line(n, "whole_graph", "whole model, CUDA graph replay", t_graph, bytes, flops);
        printf("  kept %lld rows, want %lld\n", tot, (long long)m.keep);
        printf("  whole model, eager, factor form %9.3f ms  (floor of that form: %.3f ms)\n", t_allf,
               std::max(t_bytes, (fl_win + tri_frac * fl_vo) / mm * 1e3));
        printf("  floor: bytes %.2f GB / %.2f TB/s = %.3f ms; FLOPs %.2f TFLOP / %.1f TFLOP/s = "
               "%.3f ms -> floor %.3f ms\n",
               bytes / 1e9, bw / 1e12, t_bytes, flops / 1e12, mm / 1e12, t_flops, floor_ms);
        printf("  ratio to floor: %.2fx (graph), %.2fx (eager)\n", t_graph / floor_ms,
               t_all / floor_ms);
        printf("RESULT n=%lld graph_ms=%.3f eager_ms=%.3f floor_ms=%.3f ratio=%.2f\n",
               (long long)n, t_graph, t_all, floor_ms, t_graph / floor_ms);
        if (tot != m.keep) {
            fprintf(stderr, "select kept %lld rows, expected %lld\n", tot, (long long)m.keep);
            return 1;
        }

        cudaFree(m.K);
        cudaFree(m.V);
        cudaFree(m.Q);
        cudaFree(m.G);
        cudaFree(m.l2);
        cudaFree(m.pooled);
        cudaFree(m.vo);
        cudaFree(m.scores);
        cudaFree(m.sums);
        cudaFree(m.counts);
        cudaFree(m.idx);
        cudaFree(m.ws_win);
        cudaFree(m.ws_stats);
        cudaFree(m.ws_sel);
        cudaFree(m.ws_cmp);
    }
    CK(cudaStreamDestroy(s));
    return 0;
}
