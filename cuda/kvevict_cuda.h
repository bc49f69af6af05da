/*
 * kvevict CUDA launchers: the plain C interface to the kernels in cuda/*.cu.
 *
 * Conventions shared by every launcher (read these once):
 *  - Every launcher is `extern "C"`, named kve_cuda_<stage>, takes the engine's
 *    `cudaStream_t` as `void* stream` (NULL = the legacy default stream) and
 *    returns the CUDA status as an int (cudaSuccess = 0; invalid arguments give
 *    cudaErrorInvalidValue = 1 before anything is enqueued, so nothing is written).
 *  - Launchers allocate nothing. Stages that need scratch memory take a device
 *    workspace `ws` of at least kve_cuda_<stage>_workspace_size(...) bytes
 *    (256-byte aligned; cudaMalloc memory always is).
 *  - No launcher synchronises the host or the device, reads device memory on the
 *    host, or calls anything a CUDA graph capture forbids: every one can be
 *    captured in a graph. window and vonorm query device attributes (host-side,
 *    no sync) and, on their first launch per kernel and device, raise the
 *    kernel's dynamic shared-memory limit with cudaFuncSetAttribute (host-side;
 *    run with the thread's capture mode exchanged to relaxed, so it is accepted
 *    inside a capture too); lava_factor and select zero memory with
 *    cudaMemsetAsync / a kernel (stream operations).
 *  - All pointers except the view descriptors themselves are device pointers
 *    (the descriptor structs are passed by value or by host pointer).
 *  - Scores are f32. A "score row" has one entry per prefix token; a [rows, P]
 *    array is contiguous with row stride P unless a *_ld argument says otherwise.
 *  - Query head h reads KV head h / g (g = Hq / Hkv).
 *  - Window: the last w of the N tokens; prefix tokens are i < P = N - w.
 *
 * Copyright the kvevict authors, Apache-2.0.
 */
#ifndef KVEVICT_CUDA_H
#define KVEVICT_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types of a view. */
#define KVE_CUDA_F32 0
#define KVE_CUDA_F16 1
#define KVE_CUDA_BF16 2

/* A strided 3-D tensor view on the device: element (h, t, d) lives at
 * data + h*stride_head + t*stride_token + d*stride_dim  (strides in ELEMENTS,
 * may be any non-negative values). One descriptor covers head-major [H, N, d]
 * (strides N*d, d, 1), llama.cpp token-major K rows [N, H*d] (d, H*d, 1) and
 * llama.cpp's transposed V [H*d, N] (d*N, 1, N).
 * For Qw the "heads" are the Hq query heads and the "tokens" the w window rows. */
typedef struct kve_cuda_view {
    void* data;
    int32_t dtype;      /* KVE_CUDA_F32 / F16 / BF16 */
    int32_t reserved;   /* must be 0 */
    int64_t stride_head;
    int64_t stride_token;
    int64_t stride_dim;
    int64_t heads;
    int64_t tokens;
    int64_t dim;
} kve_cuda_view;

/* GQA reductions over the g query heads of a KV group. */
#define KVE_CUDA_GQA_MEAN 0
#define KVE_CUDA_GQA_MAX 1
#define KVE_CUDA_GQA_SUM 2

/* *out = number of CUDA devices; returns cudaGetDeviceCount's status
 * (35 = cudaErrorInsufficientDriver / 100 = cudaErrorNoDevice without a GPU;
 * *out is then 0). */
int kve_cuda_device_count(int* out);

/* ------------------------------------------------------------------ window --
 * Window attention with split-N online softmax, and the column aggregates over
 * the window for prefix tokens i < P = N - w (design §2):
 *   z[h,j,i] = Qw[h,j]·K[h/g,i] / sqrt(dk), causal inside the window,
 *   A = softmax_i(z) in f32 with max subtraction over all visible keys.
 * q: [Hq, w, dk] view; k: [Hkv, N, dk] view; q and k must have the same dtype;
 * dk <= 256. Shared memory grows with dk, the dtype, the group and the statistics
 * asked for; the launcher reads the device's opt-in limit per block and takes fewer
 * window positions per block where it is lower, and where one position's g query rows
 * do not fit, splits the group's heads over several chunks (not with out_cross, which
 * needs the whole group together). So these run on sm_80, 86, 89 and 90 alike, with
 * every output asked for: f16/bf16 with g <= 128 (dk <= 128) or g <= 96 (dk <= 256),
 * f32 with g <= 128 (dk <= 64), g <= 96 (dk <= 128) or g <= 24 (dk <= 256); out_cross
 * with g <= 16, but f32 with dk > 128 only g <= 8 (Llama-3-8B, bf16, dk = 128, g = 4,
 * cross: 92,032 B < 99 KiB). Beyond that sm_80's 163 KiB or sm_90's 227 KiB is needed
 * (the table: cuda/checks/smem_table.cu); the launcher returns cudaErrorInvalidValue,
 * with nothing enqueued, where the device lacks it. Three launches: pass 1 (per-split row
 * max / sum-exp), combine, pass 2 (aggregates). The [w, N] attention matrix is never
 * stored.
 * Outputs (each may be NULL; all contiguous f32):
 *   out_mean  [Hq, P]  mean_j A[h,j,i]                       (SnapKV, LAVa)
 *   out_l2    [Hq, P]  ||A[h,:,i]||_2                         (LaProx)
 *   out_cross [Hkv, g(g+1)/2, P]  sum_j A[a,j,i]·A[b,j,i] for the group's query
 *             heads a <= b; block order as the core's Gram (src/math/gram.rs): the
 *             diagonal (0,0)..(g-1,g-1) first, then (0,1),(0,2)..(0,g-1),(1,2),..;
 *             needs g <= 16  (LaProx exact GQA)
 *   out_group [Hkv, P]  gqa_op over the group of mean_j A[h,j,i]   (SnapKV
 *             reduce-before-pool)
 * Workspace: kve_cuda_window_workspace_size(Hq, w, N, Hkv) bytes.
 * row_lse: NULL, or [Hq, w] contiguous f32 (row h*w + j): the natural-log
 *   log-sum-exp of window row (h, j)'s scaled logits over every key it sees
 *   (flash attention's softmax_lse, or the core's window_row_lse). When given,
 *   pass 1 and the combine are skipped (K is read once) and A = exp(z - lse).
 * P == 0 is valid (nothing to do). */
size_t kve_cuda_window_workspace_size(int64_t hq, int64_t w, int64_t n, int64_t hkv);
int kve_cuda_window(const kve_cuda_view* q, const kve_cuda_view* k, int64_t w,
                    float* out_mean, float* out_l2, float* out_cross,
                    float* out_group, int gqa_op, const float* row_lse, void* ws,
                    size_t ws_bytes, void* stream);

/* ------------------------------------------------------------- lava_factor --
 * LAVa head factor: out[hk] = max over prefix tokens i < prefix of
 * ||V[hk,i,:]||_1 (f32, one per KV head; 0 when prefix == 0). v: [Hkv, N, dv]. */
int kve_cuda_lava_factor(const kve_cuda_view* v, int64_t prefix, float* out,
                         void* stream);

/* ------------------------------------------------------------------ vonorm --
 * Value-output norms through Gram matrices, on tensor cores for f16/bf16:
 *   out[m, i] = v_i G_m v_iᵀ   (or its square root when take_sqrt != 0)
 * for tokens i < n_tokens, v_i = V[m / (n_gram / Hkv), i, :].
 * With G_h = Wo_h Wo_hᵀ (n_gram = Hq) this is ||V[h/g,i] Wo_h||² per query head;
 * with the cross-Grams G_{hh'} of a group (n_gram = Hkv·g(g+1)/2, block order
 * as out_cross above = the core's compute_gram(cross) layout [Hkv][blocks][dv][dv])
 * it gives the exact-GQA terms; out is then the core's value-form cache layout
 * [Hkv][blocks][N] (compute_value_forms). n_gram must be a multiple of Hkv.
 * gram_hi: [n_gram, dv, dv] contiguous, in v's dtype (f32 V: f32 G, SIMT path);
 * gram_lo: NULL, or the rounding residual G - gram_hi in the same dtype (two MMAs,
 * ~f32-accurate G); kve_cuda_gram_split makes both from an f32 G.
 * dv <= 256. out: [n_gram, n_tokens] contiguous f32.
 * Shared memory fits sm_80, 86, 89 and 90 for every dtype and dv, except f32 with
 * dv > 128 AND a gram_lo (111 KB: sm_80 / sm_90 only; the C API passes none for f32). */
int kve_cuda_vonorm(const kve_cuda_view* v, int64_t n_tokens, const void* gram_hi,
                    const void* gram_lo, int64_t n_gram, int take_sqrt, float* out,
                    void* stream);

/* vonorm_factor: the same out[m, i] = v_i G_m v_iᵀ (or its root) from a Cholesky
 * factor G_m = L_m L_mᵀ (L lower triangular, [n_gram, dv, dv] row-major, entries
 * above the diagonal ignored; hi/lo in v's dtype as for vonorm): ||v_i L_m||²,
 * skipping L's zero blocks — about 0.56x the tensor-core work of vonorm at dv = 128.
 * Only for symmetric positive semi-definite G (G_h = Wo_h Wo_hᵀ; not the cross-Grams). */
int kve_cuda_vonorm_factor(const kve_cuda_view* v, int64_t n_tokens, const void* factor_hi,
                           const void* factor_lo, int64_t n_gram, int take_sqrt, float* out,
                           void* stream);

/* gram_factor (HOST memory, no device, no stream): l_out = the lower-triangular
 * Cholesky factor of each [dv, dv] block of g (f64 arithmetic; a zero pivot of a
 * semi-definite block gives a zero column). 1 (invalid) when a block is not
 * positive semi-definite or not finite, with nothing written. Run once per model. */
int kve_cuda_gram_factor(const float* g, int64_t n_gram, int64_t dv, float* l_out);

/* gram_split: hi = round(G) to dtype, lo = round(G - hi) (lo may be NULL).
 * g: n contiguous f32; hi/lo: n elements of dtype (F16 or BF16; F32 copies). */
int kve_cuda_gram_split(const float* g, int64_t n, int dtype, void* hi, void* lo,
                        void* stream);

/* -------------------------------------------------------------------- pool --
 * 1-D pooling along tokens of each row of in[rows, n] (row stride ld_in) into
 * out[rows, n] (row stride ld_out), stride 1, kernel k (odd for avg/max):
 *   mode 0 avg:     pad k/2 zeros counted (count_include_pad, PyTorch default)
 *   mode 1 max:     pad k/2 with -inf
 *   mode 2 forward: out[i] = max_{0<=j<k, j<=i} decay^j · in[i-j]
 * in and out must not overlap. */
#define KVE_CUDA_POOL_AVG 0
#define KVE_CUDA_POOL_MAX 1
#define KVE_CUDA_POOL_FORWARD 2
int kve_cuda_pool(const float* in, int64_t ld_in, float* out, int64_t ld_out,
                  int64_t rows, int64_t n, int mode, int k, float decay,
                  void* stream);

/* ------------------------------------------------------------- head_reduce --
 * out[hk, i] = gqa_op over hh < g of  a[h,i] · f(b[h,i]) · scale[hk],  h = hk·g+hh
 * a: [Hq, n] (row stride ld_a); b: [Hq, n] (row stride ld_b; ignored with b_mode 0);
 * out: [Hkv, n] (row stride ld_out; may equal a when Hkv == Hq and ld_out == ld_a).
 * b_mode 0: b unused (NULL ok); 1: f(b) = sqrt(max(b,0)); 2: f(b) = b.
 * scale: NULL or [Hkv]. Covers LaProx (a = pooled ||A||, b = v G vᵀ, sqrt, SUM),
 * LAVa (a = pooled mean, scale = head factor, MAX), SnapKV (a = pooled mean,
 * MEAN), and plain per-head products (Hkv = Hq). */
int kve_cuda_head_reduce(const float* a, int64_t ld_a, const float* b, int64_t ld_b,
                         int b_mode, const float* scale, float* out,
                         int64_t ld_out, int64_t hq, int64_t hkv, int64_t n,
                         int gqa_op, void* stream);

/* --------------------------------------------------------- head_reduce_all --
 * out[r, i] = gqa_op over h < hq of a[h, i], the same value in every row r < reps (one
 * launch; TOVA: the mean over a layer's query heads, one copy per KV head). a: [Hq, n]
 * (row stride ld_a), out: [reps, n] (row stride ld_out; may equal a with ld_out == ld_a).
 * Arithmetic as head_reduce's (b_mode 0, no scale): the core's bits. */
int kve_cuda_head_reduce_all(const float* a, int64_t ld_a, float* out, int64_t ld_out,
                             int64_t hq, int64_t reps, int64_t n, int gqa_op, void* stream);

/* ------------------------------------------------------------ laprox_exact --
 * LaProx exact GQA: out[hk,i] = sqrt(max(0, sum_{a,b} C_ab(i) · Q_ab(i))) over
 * the g² ordered pairs, from the upper-triangle arrays cross [Hkv, np, n]
 * (kve_cuda_window out_cross) and qv [Hkv, np, n] (kve_cuda_vonorm with the
 * cross-Grams, take_sqrt = 0); np = g(g+1)/2, block order as out_cross (diagonal
 * first); off-diagonal pairs count twice.
 * mode 1 (mean-attn): out = sqrt(sum_{a,b} C_ab) · mean_h sqrt(Q_hh).
 * mode 2 (mean-attn attention term): out = sqrt(max(0, sum_{a,b} C_ab)); qv unused
 *   (may be NULL).
 * mode 3 (mean-attn value term): out = mean_h sqrt(max(0, Q_hh)); cross unused
 *   (may be NULL).
 * (Modes 2 and 3 let the caller pool the attention term alone, design §3 placement.)
 * Row strides: cross[(hk*np + p)*ld_cross + i], qv[(hk*np + p)*ld_qv + i],
 * out[hk*ld_out + i]; each ld >= n. */
#define KVE_CUDA_LAPROX_EXACT 0
#define KVE_CUDA_LAPROX_MEAN_ATTN 1
#define KVE_CUDA_LAPROX_ATTN_TERM 2
#define KVE_CUDA_LAPROX_VALUE_TERM 3
int kve_cuda_laprox_exact(const float* cross, int64_t ld_cross, const float* qv,
                          int64_t ld_qv, float* out, int64_t ld_out, int64_t hkv,
                          int64_t g, int64_t n, int mode, void* stream);

/* ------------------------------------------------------------- layer_stats --
 * Per-layer sum and entropy (design §4 lava): for layer l the scores
 * s = scores[l*layer_stride + e], e < count (all heads and prefix tokens):
 *   sums[l] = Σ |s|,   entropy[l] = -Σ p ln p with p = |s| / Σ |s| (entropy 0 when
 *   the sum is 0), as the core (src/math/budget: layer sums of |s|, layer_entropy).
 * f64 outputs, deterministic (fixed reduction order).
 * Workspace: kve_cuda_layer_stats_workspace_size(L, count). */
size_t kve_cuda_layer_stats_workspace_size(int64_t layers, int64_t count);
int kve_cuda_layer_stats(const float* scores, int64_t layer_stride, int64_t count,
                         int64_t layers, double* sums, double* entropy, void* ws,
                         size_t ws_bytes, void* stream);

/* ------------------------------------------------------------ token_reduce --
 * Token granularity: out[i] = Σ_l Σ_r scores[l, r, i] · (float)(1 / sums[l]) over
 * the rows_per_layer rows of each layer (factor 1 where sums is NULL or sums[l] <= 0),
 * accumulated in f32 in (l, r) order without fused multiply-add: the core's
 * token-granularity scores bit for bit.
 * scores: [layers, rows_per_layer, n] contiguous; out: [n]. */
int kve_cuda_token_reduce(const float* scores, const double* sums, int64_t layers,
                          int64_t rows_per_layer, int64_t n, float* out,
                          void* stream);

/* ------------------------------------------------------------------ select --
 * Histogram-threshold top-K (radix select over order-preserving float bits, no
 * sort). Rows r < n_groups·rows_per_group of scores (row stride ld, n entries);
 * group G = rows [G·rows_per_group, (G+1)·rows_per_group) keeps its k[G] largest
 * entries (k: device int64 array of n_groups, or NULL to use k_all for every
 * group; k <= 0 keeps none, k >= size keeps all). Keys are
 * score[r,i] · (float)(1 / layer_sum[r / rows_per_layer]) (an f32 product, as the
 * core's select_model; factor 1 where the sum is <= 0) when layer_sum != NULL
 * (global LaProx normalisation, sums from kve_cuda_layer_stats), else the raw
 * scores; NaN ranks lowest.
 *   - global (whole model):   n_groups = 1, rows_per_group = L·Hkv
 *   - per layer (ada, no floor): n_groups = L, rows_per_group = Hkv
 *   - uniform per head:        n_groups = L·Hkv, rows_per_group = 1
 * Ties: among equal keys the later position is kept first; equal keys at the same
 * position in different rows: the lower row first (deterministic).
 * Output per row: counts[r] (int32) and the kept positions in ascending order in
 * idx[r·idx_ld + 0 .. counts[r]) (int32; idx_ld >= n).
 * A group's entries must number < 2^32. Launches: 1 init + passes·2 + 1 output,
 * the number of passes fixed by n (ceil((32 + bits(n-1)) / 11)).
 * n == 0: every row's count is set to 0 and nothing else is read.
 * Workspace: kve_cuda_select_workspace_size(n_groups). */
size_t kve_cuda_select_workspace_size(int64_t n_groups);
int kve_cuda_select(const float* scores, int64_t ld, int64_t n, int64_t n_groups,
                    int64_t rows_per_group, const int64_t* k, int64_t k_all,
                    const double* layer_sum, int64_t rows_per_layer, int32_t* counts,
                    int32_t* idx, int64_t idx_ld, void* ws, size_t ws_bytes,
                    void* stream);

/* ------------------------------------------------------------------- shard --
 * The GPU side of the core's sharded selection (src/math/shard.rs ShardSearch, design §4
 * "Selection across devices"): rows r < rows of scores (row stride ld, n entries)
 * at the selection granularity are units unit0 + r of the model (layer·Hkv + head
 * for head granularity). Keys are the core's 128-bit keys
 *   fkey(score · scale) << 64 | position << 32 | ~unit
 * with scale = (float)(1 / layer_sum[r / rows_per_layer]) (1 when layer_sum is
 * NULL or the sum <= 0), exactly as the core's prepare().
 * shard_count: adds to hist[256] (device, u64; zero it before a round) the keys
 *   that match the search's fixed digits: pass ShardSearch.prefix as (hi, lo)
 *   64-bit halves and ShardSearch.bits. The host adds every shard's histogram and
 *   calls ShardSearch::step, until done.
 * shard_select: counts[r] and ascending kept positions idx[r·idx_ld ..] of the keys
 *   >= ShardSearch.threshold (hi, lo halves; KEEP_NOTHING = all ones keeps none).
 *   The window positions, which the core appends, are not written. */
int kve_cuda_shard_count(const float* scores, int64_t ld, int64_t n, int64_t rows,
                         int64_t unit0, const double* layer_sum, int64_t rows_per_layer,
                         uint64_t prefix_hi, uint64_t prefix_lo, uint32_t bits,
                         unsigned long long* hist, void* stream);
int kve_cuda_shard_select(const float* scores, int64_t ld, int64_t n, int64_t rows,
                          int64_t unit0, const double* layer_sum, int64_t rows_per_layer,
                          uint64_t threshold_hi, uint64_t threshold_lo, int32_t* counts,
                          int32_t* idx, int64_t idx_ld, void* stream);

/* --------------------------------------------------------------- baselines --
 * knorm: out[h*ld_out + i] = -sqrt(sum_d K[h,i,d]^2) (f32 accumulation) for
 *   h < k->heads, i < prefix (KNorm, design §3). ld_out >= prefix.
 * sink_scores: out[r*ld + i] = (i < sinks) ? 1 : 0 for r < rows, i < n
 *   (StreamingLLM: with the later-position-first tie rule the selection keeps
 *   the sinks and the most recent tokens).
 * critical_combine (CriticalKV second stage, design §3): for r < rows, i < n
 *   out[r*ld_out + i] = (base[r*ld_base + i] + 1e-4f) * value_l1[r*ld_l1 + i],
 *   then out[r*ld_out + idx[r*idx_ld + t]] = FLT_MAX for t < counts[r] (the
 *   first-stage kept list, e.g. from kve_cuda_select with k = first_stage).
 *   out may be base itself (same ld); no other overlap. */
int kve_cuda_knorm(const kve_cuda_view* k, int64_t prefix, float* out, int64_t ld_out,
                   void* stream);
/* score_power (kve_score_params.power, src/math/score/power.rs): in place, for r < rows,
 *   i < n, s = scores[r*ld + i]: a = |s|, t = a, then power-1 times t = t*a (f32,
 *   rounded each time, no FMA), t = min(t, FLT_MAX) (NaN stays NaN), s's sign put
 *   back: the core's bits. power in [1, 16] (1: nothing to do), ld >= n. */
int kve_cuda_score_power(float* scores, int64_t rows, int64_t n, int64_t ld, int power,
                         void* stream);
int kve_cuda_sink_scores(float* out, int64_t rows, int64_t n, int64_t ld, int64_t sinks,
                         void* stream);
int kve_cuda_critical_combine(const float* base, int64_t ld_base, const float* value_l1,
                              int64_t ld_l1, const int32_t* counts, const int32_t* idx,
                              int64_t idx_ld, int64_t rows, int64_t n, float* out,
                              int64_t ld_out, void* stream);

/* -------------------------------------------------------------- uniqueness --
 * uniqueness (question-agnostic, design §3b): per head h < k->heads, over every token
 *   of the views (N = k->tokens), r_i = the 4th largest min(cos(k_i, k_j), cos(v_i, v_j))
 *   over j != i (-1 where fewer), u_i = max(0, 1 - r_i)^8 (0 where r_i >= 0.5), and for
 *   i < prefix out[h*ld_out + i] = max_{0<=j<=4, i+j<prefix} 0.9^j * u_{i+j}.
 *   k and v: same dtype, heads and tokens (dims may differ), any strides. The
 *   arithmetic is the core's AVX2 path (src/math/score/uniqueness.rs), so the scores are
 *   its bits. Two scans as the core's: pairs within 128 tokens first, then only the
 *   tokens still below the cutoff against the whole cache, stopping once settled;
 *   O(N^2 (dk + dv)) per head at worst, on FP32 cores.
 *   Workspace: kve_cuda_uniqueness_workspace_size(heads, N, dk, dv) bytes, 256-byte
 *   aligned (unit K and V rows in f32, a floor and an open-list entry per token, a
 *   count per head). Limits: heads <= 65535,
 *   N <= 65535 * 64, ld_out >= prefix; otherwise cudaErrorInvalidValue, nothing
 *   enqueued. NaN/Inf inputs are not detected. */
size_t kve_cuda_uniqueness_workspace_size(int64_t heads, int64_t n, int64_t dk, int64_t dv);
int kve_cuda_uniqueness(const kve_cuda_view* k, const kve_cuda_view* v, int64_t prefix,
                        float* out, int64_t ld_out, void* ws, size_t ws_bytes, void* stream);

/* ----------------------------------------------------------------- budgets --
 * layer_budgets (one thread; layers is small): the per-layer and per-unit
 * budgets of the allocators (design §4), exactly as the core's select_model
 * (src/math/budget: pyramid_budget, lava_budgets, ada's safeguard floor), in f64
 * without contraction. Layer l owns units l*per_layer .. (l+1)*per_layer - 1;
 * p = prefix tokens per unit; B = min(budget, p).
 *   mode 0 uniform: k_unit[u] = B,  k_layer[l] = per_layer * B
 *   mode 1 pyramid: b_l = min(pyramid_budget(budget, beta, l, layers), p);
 *                   k_unit[u] = b_l, k_layer[l] = per_layer * b_l
 *   mode 2 ada:     k_layer[l] = per_layer * B;
 *                   k_unit[u] = floor((double)alpha * ((double)k_layer[l] / per_layer))
 *   mode 3 lava:    k_layer = lava_budgets(weights (the layer entropies), total =
 *                   layers*per_layer*B (saturating), caps = per_layer*p);
 *                   k_unit as mode 2 (the safeguard follows the layer's budget)
 * weights: device f64 [layers], read in mode 3 only (may be NULL otherwise).
 * k_layer: device int64 [layers]; k_unit: device int64 [layers*per_layer] or NULL.
 *
 * mark_forced (the AdaKV/LAVa safeguard, and the core's forced keys): for
 *   r < rows, t < counts[r]: scores[r*ld + idx[r*idx_ld + t]] = +INFINITY, so a
 *   later kve_cuda_select ranks those entries above every finite score.
 *
 * broadcast_lists (shared granularities): for r < src_rows, j < reps, row
 *   u = r*reps + j: counts[u] = src_counts[r] and idx[u*idx_ld + t] =
 *   src_idx[r*src_ld + t] for t < src_counts[r]. The outputs must not overlap
 *   the sources. */
#define KVE_CUDA_BUDGET_UNIFORM 0
#define KVE_CUDA_BUDGET_PYRAMID 1
#define KVE_CUDA_BUDGET_ADA 2
#define KVE_CUDA_BUDGET_LAVA 3
int kve_cuda_layer_budgets(int mode, const double* weights, int64_t layers,
                           int64_t per_layer, int64_t p, uint64_t budget, uint32_t beta,
                           float alpha, int64_t* k_layer, int64_t* k_unit, void* stream);
int kve_cuda_mark_forced(float* scores, int64_t ld, int64_t rows, const int32_t* counts,
                         const int32_t* idx, int64_t idx_ld, void* stream);
int kve_cuda_broadcast_lists(const int32_t* src_counts, const int32_t* src_idx,
                             int64_t src_ld, int64_t src_rows, int64_t reps,
                             int32_t* counts, int32_t* idx, int64_t idx_ld, void* stream);

/* append_range (the window after the chosen prefix): for r < rows, row r's list gets
 * start, start+1, .. start+count-1 at idx[r*idx_ld + counts[r] + t], then counts[r] +=
 * count. The caller guarantees counts[r] + count <= idx_ld (entries past idx_ld are
 * not written). start + count < 2^31, count <= idx_ld. */
int kve_cuda_append_range(int32_t* counts, int32_t* idx, int64_t idx_ld, int64_t rows,
                          int64_t start, int64_t count, void* stream);

/* ------------------------------------------------------------------ compact --
 * In place: for each head h of view x, rows kept[h·kept_ld + t] (ascending,
 * t < counts[h]) move to token t, order kept; the rest of the head is left as it
 * was. kept_ld = 0 means one list shared by all heads (llama.cpp token rows: view
 * the [N, Hkv·d] rows as heads = Hkv, stride_head = d, stride_token = Hkv·d, or
 * heads = 1, dim = Hkv·d); counts then has one entry. Works for every layout
 * (transposed V too). Rows are staged through the workspace (gather, then
 * scatter: two launches), so counts[h] must be <= max_keep (rows beyond are not
 * moved). The launches cover kept rows only (blocks past a head's count return at
 * once). Workspace: kve_cuda_compact_workspace_size(x, max_keep). */
size_t kve_cuda_compact_workspace_size(const kve_cuda_view* x, int64_t max_keep);
int kve_cuda_compact(const kve_cuda_view* x, const int32_t* kept, int64_t kept_ld,
                     const int32_t* counts, int64_t max_keep, void* ws,
                     size_t ws_bytes, void* stream);

/* Batched in place: every item compacted as kve_cuda_compact(&item.x, item.kept,
 * item.kept_ld, item.counts, max_keep, ...) would, all of them in two launches per 32
 * items (K and V of every layer: 4 launches for 32 layers instead of 128). The items'
 * tensors must not overlap one another or the workspace; items may share lists. Work
 * covers the kept rows only (as kve_cuda_compact's). Workspace (16-byte aligned):
 * kve_cuda_compact_batch_workspace_size(items, n_items, max_keep) bytes, reused by each
 * launch pair in stream order. Every item is checked before the first launch: 1 and
 * nothing enqueued when any is refused. */
typedef struct kve_cuda_compact_item {
  kve_cuda_view x;
  const int32_t* kept;
  int64_t kept_ld;
  const int32_t* counts;
} kve_cuda_compact_item;
size_t kve_cuda_compact_batch_workspace_size(const kve_cuda_compact_item* items,
                                             int64_t n_items, int64_t max_keep);
int kve_cuda_compact_batch(const kve_cuda_compact_item* items, int64_t n_items,
                           int64_t max_keep, void* ws, size_t ws_bytes, void* stream);

/* Varlen, out of place: dst = [Σ_h counts[h], dim] contiguous rows of src's dtype,
 * head h's kept rows (ascending kept lists as above; kept_ld = 0 shares one list)
 * at rows cu_seqlens[h] .. cu_seqlens[h+1]; cu_seqlens[heads+1] (int32) is written
 * too (flash-attention varlen layout). dst must hold Σ counts rows (at most
 * heads·src.tokens). */
int kve_cuda_compact_varlen(const kve_cuda_view* src, const int32_t* kept,
                            int64_t kept_ld, const int32_t* counts, void* dst,
                            int32_t* cu_seqlens, void* stream);

/* ------------------------------------------------------------------- stream --
 * One chunk of a query stream (src/math/stream.rs; design §2's attention for queries at any
 * positions): q [Hq, c, dk] post-RoPE queries at positions[c] (device int64, >= 0),
 * k [Hkv, N, dk] (same dtype, dk <= 256). Query j sees keys i <= min(positions[j], N-1);
 * A = softmax over them in f32 with max subtraction (row denominators summed in f64).
 * Adds into the device accumulators acc_max / acc_sum / acc_sq ([Hq][N] f32, row stride
 * N, zeroed by the caller before the first chunk), for every query head h and key i:
 *   acc_max[h,i] = max(acc_max[h,i], max_j A[h,j,i]),
 *   acc_sum[h,i] += Σ_j A[h,j,i],   acc_sq[h,i] += Σ_j A[h,j,i]².
 * Rows that do not see a key add nothing to it. row_lse (optional, NULL when absent):
 * [Hq][c], each row's natural-log log-sum-exp over its visible keys (flash attention's
 * softmax_lse): the row pass is skipped and K is read once. The kernels read the
 * positions on the device and do not check their order (the host API does); NaN/Inf
 * inputs are not detected (they propagate). Deterministic: one thread owns each key.
 * Workspace: kve_cuda_stream_feed_workspace_size(Hq, c) bytes (row max and 1/sum). */
size_t kve_cuda_stream_feed_workspace_size(int64_t hq, int64_t c);
int kve_cuda_stream_feed(const kve_cuda_view* q, const int64_t* positions,
                         const kve_cuda_view* k, const float* row_lse, float* acc_max,
                         float* acc_sum, float* acc_sq, void* ws, size_t ws_bytes,
                         void* stream);

/* -------------------------------------------------------------- value links --
 * value_links (design §4, continuation through value runs; the core's
 * accumulate_value_links): links[t] += Σ_h cos(v[h,t], v[h,t-1]) over the v->heads heads
 * of one layer's values v [Hkv, N, dv] (any dtype and strides, llama.cpp's transposed V
 * included), for 1 <= t < N; links[0] untouched, a zero vector links nothing. links: N
 * floats, zeroed by the caller before the first layer. In the core's operation order
 * (token rows: its 8-lane fused dot; V transposed: its per-channel chains; the cosine in
 * double), so the sums are the host's bits on an AVX2 + FMA host. A non-finite value or
 * squared norm makes the cosines of its token and of the next one NaN, which then
 * propagates into links (the host returns KVE_ERR_NON_FINITE instead). Workspace:
 * kve_cuda_links_workspace_size(heads, N) bytes (the [heads][N] cosines),
 * 256-byte aligned. Limits: heads <= 65535, N < 2^31.
 *
 * pool_linked: the selection's forward pool whose reach runs on through linked positions
 * (the core's pool_forward_linked): for each of `rows` rows of n scores, out[j] = the
 * largest of in[j] and in[a] over anchors sinks <= a < j that reach j, where anchor a
 * reaches a + k - 1, carried on while the next position is linked (links[j] > link_min,
 * links: n floats, links[0] not read); positions j < sinks are copied. Ties between
 * equal scores may differ from the host in the sign of a zero only. k in 1..4096,
 * link_min not NaN, in and out distinct. */
size_t kve_cuda_links_workspace_size(int64_t heads, int64_t n);
int kve_cuda_value_links(const kve_cuda_view* v, float* links, void* ws, size_t ws_bytes,
                         void* stream);
int kve_cuda_pool_linked(const float* in, int64_t ld_in, float* out, int64_t ld_out,
                         int64_t rows, int64_t n, int k, int64_t sinks, const float* links,
                         float link_min, void* stream);

/* ------------------------------------------------------------------ evictor --
 * The evictor's device form (src/evictor/device.rs, cuda/evictor.cu): pure moves.
 *
 * ring_put: rows first .. first+rows-1 of q (any dtype and strides, heads <= 65535,
 * rows <= cap) into the mirrored ring [heads][2*cap][dim] of q's dtype (contiguous): row j lands at slots
 * s = (seen + j) % cap and s + cap of its head, so the last w <= cap rows observed are
 * the contiguous slots (seen' - w) % cap .. + w - 1 (seen' = seen + rows).
 *
 * span_rows: dst[r*count + i] = src[r*ld + start + i] for r < rows (<= 65535), i < count;
 * start + count <= ld; src and dst distinct.
 *
 * shift_lists: for r < rows, idx[r*idx_ld + t] = t for t < start, then
 * src_idx[r*src_ld + u] + start for u < c, counts[r] = start + c, where c is
 * src_counts[r] clamped to [0, src_ld] and to idx_ld - start. start <= idx_ld < 2^31;
 * outputs distinct from the sources.
 *
 * upload: bytes of host memory src to device memory dst on stream, then waits for the
 * stream (setup only: src may be freed on return; not capturable). download: bytes of
 * device memory src to host memory dst on stream, then waits for the stream (dst holds
 * them on return; not capturable). */
int kve_cuda_ring_put(const kve_cuda_view* q, int64_t first, int64_t rows, void* ring,
                      int64_t cap, int64_t seen, void* stream);
int kve_cuda_span_rows(const float* src, int64_t rows, int64_t ld, int64_t start, int64_t count,
                       float* dst, void* stream);
int kve_cuda_shift_lists(const int32_t* src_counts, const int32_t* src_idx, int64_t src_ld,
                         int64_t rows, int64_t start, int32_t* counts, int32_t* idx,
                         int64_t idx_ld, void* stream);
int kve_cuda_upload(void* dst, const void* src, size_t bytes, void* stream);
int kve_cuda_download(void* dst, const void* src, size_t bytes, void* stream);

/* -------------------------------------------------------------------- paged --
 * Paged KV caches (cuda/paged.cu; the host form is src/paged.rs): one K or V tensor of a
 * block pool. Element (block b, slot s, head h, dim c) is at element offset + b*stride_block
 * + s*stride_slot + h*stride_head + c*stride_dim of data (dtype KVE_CUDA_*); a sequence's
 * token t is in block table[t / block_size], slot t % block_size. Launchers refuse (1) a
 * NULL data, reserved != 0, an unknown dtype, an extent < 1, heads > 65535, a negative
 * offset or stride.
 *
 * The table (uint32, DEVICE memory, ceil(n / block_size) entries read) is not checked
 * beyond a guard: an entry >= num_blocks is skipped (nothing read or written through it).
 * Callers refuse repeated entries and short tables before the launch (the evictor checks
 * the host table with the core's check and uploads it).
 *
 * gather: the first n tokens into dst, a contiguous [heads][n][dim] tensor of the pool's
 * dtype (raw bits), distinct from the pool.
 *
 * compact: in place, each head's kept tokens (ascending int32 lists < n: head h's at
 * kept + h*kept_ld, counts[h] entries; kept_ld = 0 shares kept/counts[0]) moved to tokens
 * 0 .. count-1 of the sequence, order kept, the rest left as it was; counts clamped to
 * [0, min(max_keep, n)]. ws: kve_cuda_paged_compact_workspace_size bytes (0 for a
 * refused descriptor). Two launches (staged gather, scatter). The trailing blocks
 * table[ceil(max count / block_size) ..] then hold nothing the sequence keeps.
 *
 * upload_async: bytes of host memory src to device memory dst on stream, not waited for
 * (as cudaMemcpyAsync: from pageable memory, src may be reused on return). */
typedef struct kve_cuda_paged {
    void* data;
    int32_t dtype;      /* KVE_CUDA_F32 / F16 / BF16 */
    int32_t reserved;   /* must be 0 */
    int64_t offset;
    int64_t num_blocks;
    int64_t block_size;
    int64_t heads;
    int64_t dim;
    int64_t stride_block;
    int64_t stride_slot;
    int64_t stride_head;
    int64_t stride_dim;
} kve_cuda_paged;
int kve_cuda_paged_gather(const kve_cuda_paged* src, const uint32_t* table, int64_t n, void* dst,
                          void* stream);
size_t kve_cuda_paged_compact_workspace_size(const kve_cuda_paged* kv, int64_t max_keep);
int kve_cuda_paged_compact(const kve_cuda_paged* kv, const uint32_t* table, int64_t n,
                           const int32_t* kept, int64_t kept_ld, const int32_t* counts,
                           int64_t max_keep, void* ws, size_t ws_bytes, void* stream);
int kve_cuda_upload_async(void* dst, const void* src, size_t bytes, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* KVEVICT_CUDA_H */
