/*
 * kvevict: KV-cache eviction for LLM inference engines (LaProx, LAVa, SnapKV, AdaKV,
 * PyramidKV, CriticalKV, StreamingLLM, KNorm, TOVA). Apache-2.0.
 *
 * Flow for one model: kve_compute_gram once (LaProx) -> per layer kve_score_layer into
 * scores[L][Hkv][P] -> kve_select_model -> per layer kve_compact_in_place /
 * kve_compact_varlen, or kve_evicted_positions for engines whose cells are shared by
 * every head (llama.cpp). N = tokens in the cache, w = observation window (its queries
 * are given), P = N - min(w, N) prefix tokens; the window is always kept.
 *
 * Rules every function follows:
 *  - Returns an int32_t status: KVE_OK (0) or a KVE_ERR_* code; kve_status_name() and
 *    kve_status_message() turn it into static strings.
 *  - A pointer with a length: NULL is accepted only with length 0. Lengths count
 *    elements of the pointed-to type, workspaces count bytes. Buffers must be aligned
 *    for their element type (KVE_ERR_MISALIGNED).
 *  - Outputs and workspaces must not overlap any input nor each other, struct
 *    arguments passed by pointer included (KVE_ERR_ALIASING, byte ranges compared).
 *  - On any error nothing is written to any output (a workspace's contents are
 *    unspecified after any call); the one exception is kve_cuda_get_device_count,
 *    which writes a count of 0 with KVE_ERR_NOT_BUILT_WITH_CUDA. The caller owns
 *    every buffer; the library never allocates, keeps no pointer after a call
 *    returns, has no global state, and is thread-safe for calls on distinct outputs.
 *  - Finite inputs whose result would not be finite in float (overflow) give
 *    KVE_ERR_NON_FINITE, with nothing written, like NaN/Inf inputs.
 *  - Enumerations are uint32_t values of the KVE_* #defines; unknown values give
 *    KVE_ERR_BAD_ENUM.
 *  - Size queries first: every buffer size comes from a kve_*_len / *_workspace_size
 *    call with the same parameters.
 *  - Extensible structs (kve_score_params, kve_select_params, kve_layer_inputs) start
 *    with uint32_t struct_size: fill them with their *_init function, passing
 *    sizeof(the struct). struct_size must be exactly one released size
 *    (KVE_*_V<k>_SIZE; any other value, larger ones included, gives
 *    KVE_ERR_INVALID_ARGUMENT); the library reads that version's fields and uses
 *    defaults for fields it lacks.
 *  - Built with panic = abort and written not to panic; KVE_ERR_PANIC is reserved.
 */

#ifndef KVEVICT_H
#define KVEVICT_H

/* Generated from src/capi by cbindgen (tests/header.rs); do not edit.
 * Regenerate with: KVEVICT_BLESS=1 cargo test --test header */

#include <stddef.h>
#include <stdint.h>

/* Version of this header (kve_version() gives the library's). */
#define KVE_VERSION_MAJOR 0
#define KVE_VERSION_MINOR 4
#define KVE_VERSION_PATCH 0
#define KVE_VERSION_NUMBER 400

/* Status codes (int32_t). kve_status_name / kve_status_message describe them. */
#define KVE_OK 0
#define KVE_ERR_NULL_POINTER 1
#define KVE_ERR_INVALID_ARGUMENT 2
#define KVE_ERR_OVERFLOW 3
#define KVE_ERR_OUT_OF_BOUNDS 4
#define KVE_ERR_MISALIGNED 5
#define KVE_ERR_BAD_ENUM 6
#define KVE_ERR_NON_FINITE 7
#define KVE_ERR_OUTPUT_TOO_SMALL 8
#define KVE_ERR_WORKSPACE_TOO_SMALL 9
#define KVE_ERR_ALIASING 10
#define KVE_ERR_SHAPE_MISMATCH 11
#define KVE_ERR_NOT_BUILT_WITH_CUDA 12
#define KVE_ERR_CUDA 13
#define KVE_ERR_PANIC 14
#define KVE_ERR_UNSUPPORTED_DTYPE 15
#define KVE_ERR_CALLBACK 16

/* kve_tensor.dtype */
#define KVE_DTYPE_F32 0
#define KVE_DTYPE_F16 1
#define KVE_DTYPE_BF16 2
#define KVE_DTYPE_Q8_0 3
#define KVE_DTYPE_Q4_0 4

/* Scoring presets for kve_score_params_init (design §3 defaults). */
#define KVE_PRESET_SNAPKV 0
#define KVE_PRESET_SNAPKV_KVPRESS 1
#define KVE_PRESET_LAVA 2
#define KVE_PRESET_LAPROX 3
#define KVE_PRESET_LAPROX_SPAN 4
#define KVE_PRESET_CRITICALKV 5
#define KVE_PRESET_STREAMINGLLM 6
#define KVE_PRESET_KNORM 7
#define KVE_PRESET_TOVA 8
#define KVE_PRESET_UNIQUENESS 9
#define KVE_PRESET_TOVA_DECAY 10
#define KVE_PRESET_H2O 11

/* kve_score_params.scorer */
#define KVE_SCORER_SNAPKV 0
#define KVE_SCORER_LAVA 1
#define KVE_SCORER_LAPROX 2
#define KVE_SCORER_CRITICALKV 3
#define KVE_SCORER_STREAMINGLLM 4
#define KVE_SCORER_KNORM 5
#define KVE_SCORER_TOVA 6
#define KVE_SCORER_UNIQUENESS 7

/* Pooling kinds (kve_score_params.pool_kind, kve_select_params.post_pool_kind) */
#define KVE_POOL_NONE 0
#define KVE_POOL_AVG 1
#define KVE_POOL_MAX 2
#define KVE_POOL_FORWARD 3

/* kve_score_params.gqa: how the query heads of a KV group combine */
#define KVE_GQA_MEAN 0
#define KVE_GQA_MAX 1
#define KVE_GQA_SUM 2

/* kve_score_params.laprox_gqa */
#define KVE_LAPROX_GQA_SUM 0
#define KVE_LAPROX_GQA_EXACT 1
#define KVE_LAPROX_GQA_MEAN_ATTN 2

/* kve_score_params.placement: where LaProx pools */
#define KVE_PLACEMENT_ATTENTION 0
#define KVE_PLACEMENT_PRODUCT 1

/* kve_select_params.allocator (design §4) */
#define KVE_ALLOCATOR_UNIFORM 0
#define KVE_ALLOCATOR_ADA 1
#define KVE_ALLOCATOR_PYRAMID 2
#define KVE_ALLOCATOR_LAVA 3
#define KVE_ALLOCATOR_GLOBAL 4

/* kve_select_params.granularity: the unit that keeps one token set */
#define KVE_GRANULARITY_HEAD 0
#define KVE_GRANULARITY_LAYER 1
#define KVE_GRANULARITY_TOKEN 2

/* kve_select_params.normalize */
#define KVE_NORMALIZE_LAYER_SUM 0
#define KVE_NORMALIZE_NONE 1

/* kve_stream_score_params.stat: the statistic a query stream finishes into */
#define KVE_STREAM_STAT_MAX 0
#define KVE_STREAM_STAT_MEAN 1
#define KVE_STREAM_STAT_MEAN_VISIBLE 2
#define KVE_STREAM_STAT_LAPROX 3
#define KVE_STREAM_SCORE_PARAMS_V1_SIZE 40

/* The evictor (kve_evictor_*): kve_evictor_config.policy and .granularity, kve_evictor_requirements.wo, struct sizes */
#define KVE_POLICY_EXPLICIT 0
#define KVE_POLICY_KEEP_RATIO 1
#define KVE_POLICY_CELLS 2
#define KVE_EVICTOR_PRESET_GRANULARITY 4294967295ULL
#define KVE_WO_NONE 0
#define KVE_WO_ONCE 1
#define KVE_WO_EVERY_ROUND 2
#define KVE_EVICTOR_CONFIG_V1_SIZE 136
#define KVE_EVICTOR_CONFIG_V2_SIZE 144
#define KVE_EVICTOR_PAGED_LAYER_V1_SIZE 376
#define KVE_EVICTOR_ROUND_V1_SIZE 136
#define KVE_EVICTOR_ROUND_V2_SIZE 168
#define KVE_EVICTOR_LAYER_V1_SIZE 312
#define KVE_EVICTOR_REQUIREMENTS_V1_SIZE 28
#define KVE_EVICTOR_STATS_V1_SIZE 40

/* An engine's eviction options (kve_evictor_options_apply): kve_evictor_options.flags, the largest window, the struct's size */
#define KVE_OPTIONS_NO_WO_EVERY_ROUND 1
#define KVE_OPTIONS_TOKEN_CELLS 2
#define KVE_OPTIONS_MAX_WINDOW 4096
#define KVE_EVICTOR_OPTIONS_V1_SIZE 48

/* kve_paged_layout_init kind: the engines' paged pool layouts (H heads, d dim, bs tokens a block) */
#define KVE_PAGED_NHD 0
#define KVE_PAGED_NHD_KV_INNER 1
#define KVE_PAGED_NHD_KV_OUTER 2
#define KVE_PAGED_HND 3
#define KVE_PAGED_HND_KV_INNER 4
#define KVE_PAGED_TRTLLM 5
#define KVE_MAX_BLOCK_SIZE 65536

/* Limits and the released sizes of the extensible structs (V1: first release) */
#define KVE_MAX_HEADS 65536
#define KVE_MAX_TOKENS 2147483648ULL
#define KVE_MAX_BUDGET 2147483648ULL
#define KVE_MAX_STRUCT_SIZE 4096
#define KVE_SCORE_PARAMS_V1_SIZE 48
#define KVE_SCORE_PARAMS_V2_SIZE 52
#define KVE_MAX_SCORE_POWER 16
#define KVE_SELECT_PARAMS_V1_SIZE 48
#define KVE_LAYER_INPUTS_V1_SIZE 272
#define KVE_LAYER_INPUTS_V2_SIZE 288

/* kve_evictor_mark_cells: the share of the kept cells an engine reserves for marked cells by default */
#define KVE_MARK_SHARE_DEFAULT 0.75f
/* kve_evictor_round's mark_split: one selection over the marked cells (0), or their budget split evenly over their spans: each mark range, or run of one flag value (1) */
#define KVE_MARK_SPLIT_SHARE 0
#define KVE_MARK_SPLIT_SPANS 1


/**
 * An evictor's device form: a pointer into the host memory given to
 * `kve_cuda_evictor_init` (its tensors live in the device block given there).
 */
typedef struct kve_cuda_evictor kve_cuda_evictor;

/**
 * An evictor's context: a pointer into the memory given to `kve_evictor_init`.
 */
typedef struct kve_evictor kve_evictor;

/**
 * A strided 3-D view of memory the caller owns: element `(a, b, c)` is at
 * `data + (a*stride[0] + b*stride[1] + c*stride[2]) * sizeof(dtype)`.
 *
 * Axes are (head, token, dim) for queries `[Hq, w, dk]`, keys `[Hkv, N, dk]` and values
 * `[Hkv, N, dv]`, and (head, row, col) for the output projection `Wo` `[Hq, dv, D]`.
 * Strides count elements, not bytes, and may be 0 (broadcast) for inputs. Examples:
 * head-major `[H, N, d]`: strides `{N*d, d, 1}`; llama.cpp K rows `[N][H*d]`:
 * `{d, H*d, 1}`; llama.cpp's transposed V `[H*d][N]`: `{d*N, 1, N}`; PyTorch
 * `o_proj.weight` `[D, Hq*dv]` as `Wo`: `{dv, 1, Hq*dv}`.
 *
 * ggml's block-quantized caches (`KVE_DTYPE_Q8_0`: 32 values per 34-byte block
 * `{f16 d; int8 qs[32]}`, value `i` = `d*qs[i]`; `KVE_DTYPE_Q4_0`: 32 values per 18-byte
 * block `{f16 d; uint8 qs[16]}`, value `j` = `d*((qs[j] & 0xF) - 8)`, value `j+16` =
 * `d*((qs[j] >> 4) - 8)`) are passed as they are: `len`, extents and strides count
 * values, value `e` lies in the block at byte `(e/32)*block_bytes`; `len`, `extent[2]`
 * (the row length), `stride[0]` and `stride[1]` must be multiples of 32 and
 * `stride[2] == 1`, so every row is whole blocks (else `KVE_ERR_INVALID_ARGUMENT`), and
 * `data` 2-byte aligned. Scorers read such K/V dequantized exactly as ggml does (scores
 * bit-identical to those of the dequantized f32 tensor); compaction moves their rows
 * byte for byte. Host functions only: the `kve_cuda_*` functions refuse them
 * (`KVE_ERR_UNSUPPORTED_DTYPE`), as do paged pools.
 *
 * Checked on every use: `data` non-NULL and aligned for `dtype`; `pad == 0`; every
 * extent >= 1, `extent[0] <= KVE_MAX_HEADS`, `extent[1] <= 2^31`; the highest element
 * reached, `Σ (extent[i]-1)*stride[i]`, is `< len`; `len * sizeof(dtype)` fits the
 * address space. The library only reads a tensor, except the destination of a
 * compaction (`kve_compact_in_place`'s `kv`, `kve_compact_varlen`'s `dst`), which it
 * writes through `data`: `data` stays `const void*` so that every read-only tensor can
 * be described from const memory without a cast (one descriptor type for inputs and
 * outputs, as in DLPack), and the compaction functions document the write.
 */
typedef struct kve_tensor {
  /**
   * First element. Host memory, except for the `kve_cuda_*` functions. Must point to
   * writable memory for a compaction destination (the library writes through it).
   */
  const void *data;
  /**
   * Elements of `dtype` available from `data` (the buffer's length, not the view's;
   * values, a multiple of 32, for the block types).
   */
  uint64_t len;
  /**
   * `KVE_DTYPE_*`.
   */
  uint32_t dtype;
  /**
   * Must be 0.
   */
  uint32_t pad;
  /**
   * Extents of the three axes.
   */
  uint64_t extent[3];
  /**
   * Element strides of the three axes.
   */
  uint64_t stride[3];
} kve_tensor;

/**
 * How to score one layer (design §3). Fill with `kve_score_params_init`, then adjust.
 */
typedef struct kve_score_params {
  /**
   * `sizeof(kve_score_params)` as the caller compiled it (set by the init function).
   */
  uint32_t struct_size;
  /**
   * `KVE_SCORER_*`.
   */
  uint32_t scorer;
  /**
   * Observation window `w` (>= 1): the last `w` positions, whose queries are given.
   */
  uint32_t window;
  /**
   * `KVE_POOL_*` applied along tokens to the per-head attention statistic.
   */
  uint32_t pool_kind;
  /**
   * Pooling kernel: odd for avg/max (<= 4095), 1..4096 for forward.
   */
  uint32_t pool_kernel;
  /**
   * Forward pooling decay in (0, 1].
   */
  float pool_decay;
  /**
   * `KVE_GQA_*` for SnapKV-style scores (LAVa always uses max).
   */
  uint32_t gqa;
  /**
   * 1: reduce the query heads of a group before pooling; 0: after.
   */
  uint32_t reduce_before_pool;
  /**
   * `KVE_LAPROX_GQA_*`.
   */
  uint32_t laprox_gqa;
  /**
   * `KVE_PLACEMENT_*`.
   */
  uint32_t placement;
  /**
   * StreamingLLM sink tokens.
   */
  uint32_t sinks;
  /**
   * CriticalKV: prefix tokens per KV head forced by the base score; they score
   * `FLT_MAX` (see `kve_score_layer`).
   */
  uint32_t critical_first_stage;
  /**
   * The scores raised to this integer power in [1, `KVE_MAX_SCORE_POWER`], sign kept,
   * saturating at `FLT_MAX` (products rounded one by one; the same bits on the host and
   * the device). Each head's order is unchanged; a head's peaks weigh more once the
   * selection normalises by the layer sum and adds heads and layers. 1: as the scorer
   * computes them. The `laprox-span` preset: 3. Since V2 (`KVE_SCORE_PARAMS_V2_SIZE`);
   * a V1 caller gets 1.
   */
  uint32_t power;
} kve_score_params;

/**
 * The tensors of one layer, where the engine keeps them. Fill with
 * `kve_layer_inputs_init` (every tensor absent), then set what the scorer reads:
 *
 * | scorer | queries | keys | values | other |
 * |---|---|---|---|---|
 * | SnapKV, TOVA | yes | yes | | |
 * | LAVa | yes | yes | yes | |
 * | LaProx | yes | yes | yes + `gram`, or `value_forms` | |
 * | CriticalKV | yes | yes | | `value_l1` |
 * | StreamingLLM | | yes | | |
 * | KNorm | | yes | | |
 * | Uniqueness (question-agnostic) | | yes | yes | |
 *
 * Every scorer that reads queries also takes the optional `row_lse` (flash attention's
 * `softmax_lse` of the window rows, or `kve_window_row_lse`): K is then read once, not
 * twice (on the device too).
 *
 * A tensor with `data == NULL` is absent; a required one absent gives
 * `KVE_ERR_NULL_POINTER`. Extensible like the params structs: `struct_size` is
 * `KVE_LAYER_INPUTS_V1_SIZE` (no `row_lse`) or `KVE_LAYER_INPUTS_V2_SIZE`.
 */
typedef struct kve_layer_inputs {
  /**
   * `sizeof(kve_layer_inputs)` as the caller compiled it (set by the init function).
   */
  uint32_t struct_size;
  /**
   * Must be 0.
   */
  uint32_t reserved;
  /**
   * `[Hq, wq, dk]` post-RoPE queries of the last `wq >= min(window, N)` positions
   * (the last `window` rows are used).
   */
  struct kve_tensor queries;
  /**
   * `[Hkv, N, dk]` post-RoPE keys, `dk <= 1024`.
   */
  struct kve_tensor keys;
  /**
   * `[Hkv, N, dv]` values, `dv <= 1024`.
   */
  struct kve_tensor values;
  /**
   * LaProx: Gram blocks from `kve_compute_gram` (built with `cross = 1` for the exact
   * and mean-attn GQA modes), `gram_len` floats. NULL when `value_forms` is given:
   * both given is `KVE_ERR_INVALID_ARGUMENT` (one value term, never one ignored).
   */
  const float *gram;
  uint64_t gram_len;
  /**
   * LaProx: cached value forms `[Hkv][blocks][N]` from `kve_compute_value_forms`.
   */
  const float *value_forms;
  uint64_t value_forms_len;
  /**
   * CriticalKV: `[Hkv][N]` from `kve_compute_value_l1`.
   */
  const float *value_l1;
  uint64_t value_l1_len;
  /**
   * Optional (NULL, 0 when absent; since `KVE_LAYER_INPUTS_V2_SIZE`): `[Hq][w]`,
   * `w = min(window, N)`, exactly `Hq * w` floats: the natural-log log-sum-exp of each
   * window row's logits `q·k / sqrt(dk)` over every key it sees (causal inside the
   * window), rows in the order of the last `w` rows of `queries` (flash attention's
   * `softmax_lse`, or `kve_window_row_lse`). When given, the window pass skips its
   * first pass over K (row max and denominator) and uses `A = exp(z - lse)`. NaN/Inf
   * (`KVE_ERR_NON_FINITE`) or another length (`KVE_ERR_SHAPE_MISMATCH`) is rejected,
   * also when there is no prefix to score (`window >= N`). Ignored by KNorm and
   * StreamingLLM.
   */
  const float *row_lse;
  uint64_t row_lse_len;
} kve_layer_inputs;

/**
 * How to allocate budgets and select (design §4). Fill with `kve_select_params_init`.
 */
typedef struct kve_select_params {
  /**
   * `sizeof(kve_select_params)` as the caller compiled it (set by the init function).
   */
  uint32_t struct_size;
  /**
   * `KVE_ALLOCATOR_*`.
   */
  uint32_t allocator;
  /**
   * `KVE_GRANULARITY_*`.
   */
  uint32_t granularity;
  /**
   * `KVE_NORMALIZE_*`.
   */
  uint32_t normalize;
  /**
   * Average prefix tokens kept per (layer, KV head), window excluded (`C - w`).
   * Larger than the prefix keeps the whole prefix; values above `KVE_MAX_BUDGET` are
   * clamped to it. See `kve_budget_*` for capacity and keep-ratio conventions.
   */
  uint64_t budget;
  /**
   * AdaKV / LAVa safeguard fraction in [0, 1].
   */
  float alpha;
  /**
   * PyramidKV ratio (>= 1).
   */
  uint32_t beta;
  /**
   * `KVE_POOL_*` applied to the scores at the selection granularity.
   */
  uint32_t post_pool_kind;
  /**
   * Its kernel (see `kve_score_params.pool_kernel`).
   */
  uint32_t post_pool_kernel;
  /**
   * Its decay (forward pooling).
   */
  float post_pool_decay;
  /**
   * The first `post_pool_sinks` prefix positions are left out of the post-pool: they
   * keep their own score and lend none to their followers (an attention sink's score
   * is not a read of what follows it). Any value; clamped to the prefix. 0: pool all
   * (the V1 `reserved` slot, so V1 callers that zeroed it get this). LaProx-span: 1.
   */
  uint32_t post_pool_sinks;
} kve_select_params;

/**
 * Scores of a whole model, or of a shard of consecutive layers:
 * `scores[(l * hkv + kh) * P + i]`, `P = n - min(window, n)`, as written by
 * `kve_score_layer` layer after layer. Any finite f32 is accepted (CriticalKV's forced
 * `FLT_MAX` included). NaN/Inf gives `KVE_ERR_NON_FINITE`.
 */
typedef struct kve_model_scores {
  const float *scores;
  /**
   * Floats at `scores`: exactly `layers * hkv * P` (else `KVE_ERR_SHAPE_MISMATCH`:
   * scores laid out for another window, head count or length are refused).
   */
  uint64_t len;
  /**
   * Layers (1 .. 2^20), `layers * hkv <= 2^31` (else `KVE_ERR_OVERFLOW`).
   */
  uint64_t layers;
  uint64_t hkv;
  /**
   * Tokens in the cache, window included (1 .. 2^31).
   */
  uint64_t n;
  /**
   * Observation window (the last `window` tokens are always kept).
   */
  uint64_t window;
} kve_model_scores;

/**
 * One tensor of `kve_cuda_compact_batch_in_place` (host memory; `kv.data`, `kept` and
 * `counts` are device pointers): as the arguments of `kve_cuda_compact_in_place` — for
 * each head `h` of `kv`, rows `kept[h*kept_ld + t]` (`t < counts[h]`, ascending, `< N`)
 * move to token `t`; `kept_ld = 0`: one list and one count shared by every head.
 */
typedef struct kve_compact_item {
  /**
   * The tensor compacted in place (writable device memory, any layout).
   */
  struct kve_tensor kv;
  /**
   * int32 kept lists, device memory (`kve_cuda_select_model`'s `idx + u*idx_ld`).
   */
  const int32_t *kept;
  /**
   * Elements between two heads' lists: 0 (shared) or `>= min(max_keep, N)`.
   */
  uint64_t kept_ld;
  /**
   * int32 counts, one per head (one when `kept_ld = 0`), device memory.
   */
  const int32_t *counts;
} kve_compact_item;

/**
 * What an evictor runs (fill with `kve_evictor_config_init`, then set the shape,
 * `max_cells` and the policy). Extensible: `struct_size` is `KVE_EVICTOR_CONFIG_V1_SIZE`
 * or `KVE_EVICTOR_CONFIG_V2_SIZE` (`paged`, `paged_dtype`).
 */
typedef struct kve_evictor_config {
  uint32_t struct_size;
  /**
   * `KVE_PRESET_*` (`kve_preset_from_name` maps a name).
   */
  uint32_t preset;
  /**
   * The observation window; 0: the preset's (or `score`'s).
   */
  uint32_t window;
  /**
   * `KVE_GRANULARITY_*`, or `KVE_EVICTOR_PRESET_GRANULARITY`. Engines whose cells are
   * shared by every head (llama.cpp, paged caches) want `KVE_GRANULARITY_TOKEN`.
   */
  uint32_t granularity;
  /**
   * Optional (NULL: the preset's): scoring; `window` still overrides its window.
   */
  const struct kve_score_params *score;
  uint64_t layers;
  /**
   * Optional (NULL: the preset's): selection; its budget is replaced by the policy's.
   */
  const struct kve_select_params *select;
  uint64_t hq;
  uint64_t hkv;
  uint64_t dk;
  uint64_t dv;
  /**
   * Columns of `Wo`, for the methods that read it (`kve_evictor_get_requirements`).
   */
  uint64_t d_model;
  /**
   * Most cells a sequence holds when it is scored.
   */
  uint64_t max_cells;
  /**
   * Sequence slots, each with its own state (`seq` arguments are `0..max_seqs`).
   */
  uint64_t max_seqs;
  /**
   * `KVE_POLICY_*`.
   */
  uint32_t policy;
  /**
   * Value links at this threshold (0: off; 0.5 is `kve_select_model_linked`'s); needs
   * a flat forward post-pool (the laprox-span and uniqueness selections).
   */
  float link_threshold;
  /**
   * `KVE_POLICY_KEEP_RATIO`: in [0, 1].
   */
  double keep_ratio;
  /**
   * `KVE_POLICY_KEEP_RATIO`: the fewest new cells a compression keeps (default 64).
   */
  uint64_t min_keep;
  /**
   * `KVE_POLICY_CELLS`: `1 <= low <= high`; `low = 0` means `high - high/8`.
   */
  uint64_t high;
  uint64_t low;
  /**
   * Since `KVE_EVICTOR_CONFIG_V2_SIZE`: 1 when K/V come through paged views
   * (`kve_evictor_score_layer_paged`, `kve_evictor_compact_paged`); the context then
   * also holds one layer's K (and V) gathered from the pool (`kve_evictor_size` grows
   * by `Hkv * max_cells * (dk + dv) * sizeof(paged_dtype)`). 0: strided views only.
   */
  uint32_t paged;
  /**
   * With `paged`: the largest `KVE_DTYPE_*` of the pools (default `KVE_DTYPE_F32`).
   */
  uint32_t paged_dtype;
} kve_evictor_config;

/**
 * What an engine captures for the configured method (flags are 0 or 1).
 */
typedef struct kve_evictor_requirements {
  uint32_t struct_size;
  /**
   * Window queries (given per layer or observed into the context).
   */
  uint32_t queries;
  uint32_t values;
  /**
   * `KVE_WO_*`.
   */
  uint32_t wo;
  /**
   * A window row log-sum-exp spares one pass over K.
   */
  uint32_t row_lse_helps;
  /**
   * The observation window: the last `window` cells are always kept.
   */
  uint32_t window;
  /**
   * `KVE_GRANULARITY_*` of the kept sets.
   */
  uint32_t granularity;
} kve_evictor_requirements;

/**
 * One layer's tensors for the round's `n` cells (fill with `kve_evictor_layer_init`:
 * every tensor absent). A tensor with `data == NULL` is absent.
 */
typedef struct kve_evictor_layer {
  uint32_t struct_size;
  /**
   * Must be 0.
   */
  uint32_t reserved;
  /**
   * `[Hkv, n, dk]`, required.
   */
  struct kve_tensor keys;
  /**
   * `[Hkv, n, dv]`, when the method reads values.
   */
  struct kve_tensor values;
  /**
   * `[Hq, wq, dk]`, the last `wq >= min(window, n)` positions; absent: the rows
   * `kve_evictor_observe_queries` kept.
   */
  struct kve_tensor queries;
  /**
   * Optional `[Hq][min(window, n)]` window row log-sum-exp (`kve_layer_inputs.row_lse`).
   */
  const float *row_lse;
  uint64_t row_lse_len;
  /**
   * `[Hq, dv, D]`, when `kve_evictor_get_requirements` says `KVE_WO_EVERY_ROUND`.
   */
  struct kve_tensor wo;
} kve_evictor_layer;

/**
 * One K or V tensor of a paged pool: element (block `b`, slot `s`, head `h`, dim `c`) is
 * at `data + (offset + b*stride[0] + s*stride[1] + h*stride[2] + c*stride[3]) *
 * sizeof(dtype)`. A sequence's token `t` is in block `table[t / block_size]`, slot
 * `t % block_size`. `kve_paged_layout_init` fills it for the engines' layouts
 * (`KVE_PAGED_*`); any other layout may be described by hand.
 *
 * Checked on every use: `data` non-NULL and aligned, `pad == 0`, every extent >= 1,
 * `block_size <= KVE_MAX_BLOCK_SIZE`, `heads <= KVE_MAX_HEADS`, the highest element the
 * layout reaches below `len` (`KVE_ERR_OUT_OF_BOUNDS`), no two (block, slot, head, dim)
 * sharing an element (`KVE_ERR_ALIASING`), no overflow (`KVE_ERR_OVERFLOW`). `data` is
 * written through by `kve_paged_compact` only (writable memory there, although `const`).
 */
typedef struct kve_paged_layout {
  /**
   * The pool's first element (host memory; device memory for the
   * `kve_cuda_evictor_*_paged` calls).
   */
  const void *data;
  /**
   * Elements of `dtype` available from `data`.
   */
  uint64_t len;
  /**
   * `KVE_DTYPE_*`.
   */
  uint32_t dtype;
  /**
   * Must be 0.
   */
  uint32_t pad;
  /**
   * Element offset of (block 0, slot 0, head 0, dim 0): picks K or V, or a layer.
   */
  uint64_t offset;
  /**
   * Blocks in the pool (table entries must be below it).
   */
  uint64_t num_blocks;
  /**
   * Token slots per block.
   */
  uint64_t block_size;
  /**
   * KV heads per token.
   */
  uint64_t heads;
  /**
   * Head dimension.
   */
  uint64_t dim;
  /**
   * Element strides of (block, slot, head, dim).
   */
  uint64_t stride[4];
} kve_paged_layout;

/**
 * One layer's tensors for the round's `n` cells with K and V in a paged pool (fill with
 * `kve_evictor_paged_layer_init`: everything absent): as `kve_evictor_layer`, K and V
 * through the sequence's block table.
 */
typedef struct kve_evictor_paged_layer {
  uint32_t struct_size;
  /**
   * Must be 0.
   */
  uint32_t reserved;
  /**
   * K: `heads == Hkv`, `dim == dk` (`kve_paged_layout_init`), required.
   */
  struct kve_paged_layout keys;
  /**
   * V (`dim == dv`), when the method reads values (`data == NULL`: absent; not read
   * otherwise).
   */
  struct kve_paged_layout values;
  /**
   * The sequence's block table (K and V share it): at least `ceil(n / block_size)`
   * entries, each below `num_blocks`, none repeated; entries past the sequence are
   * not read.
   */
  const uint32_t *table;
  uint64_t table_len;
  /**
   * As `kve_evictor_layer`'s.
   */
  struct kve_tensor queries;
  const float *row_lse;
  uint64_t row_lse_len;
  struct kve_tensor wo;
} kve_evictor_paged_layer;

/**
 * `kve_evictor_round.fill`: write layer `layer`'s tensors into `*out`; 0, or any other
 * value to end the round (`KVE_ERR_CALLBACK`).
 */
typedef int32_t (*kve_evictor_fill_fn)(void *user, uint64_t layer, struct kve_evictor_layer *out);

/**
 * A round over an engine's cache (fill with `kve_evictor_round_init`: everything absent).
 * Layer `l`'s K is `keys[l]`, `[Hkv, S, dk]` over every cell of the engine's stream
 * (`S` cells, any dtype, strides as the engine stores them), V likewise (`[Hkv, S, dv]`,
 * transposed or not); the round's cells are `cells[0 .. n_cells]`, indices along axis 1,
 * in position order.
 * Or (`n_keys` 0, since `KVE_EVICTOR_ROUND_V2_SIZE`) the engine's `fill` gives each
 * layer's tensors when the round reaches it.
 * Each pointer is followed by its length, so the layout is the same for 32- and 64-bit
 * callers.
 */
typedef struct kve_evictor_round {
  uint32_t struct_size;
  /**
   * Must be 0.
   */
  uint32_t reserved;
  /**
   * The sequence's cells in the stream, in position order (`1 ..= max_cells` of them,
   * each below every tensor's `extent[1]`: `KVE_ERR_OUT_OF_BOUNDS`; none twice:
   * `KVE_ERR_ALIASING`). Cells of other sequences are not read. NULL: cells `0 ..
   * n_cells`, every tensor's `extent[1]` exactly `n_cells` (`KVE_ERR_SHAPE_MISMATCH`):
   * K/V the engine holds (or copied) in position order, scored as they are (no gather
   * area needed).
   */
  const uint32_t *cells;
  uint64_t n_cells;
  /**
   * Optional (`n_marks` 0: none): `n_cells` flags, as `kve_evictor_mark_cells`'s,
   * with `mark_share`.
   */
  const uint8_t *marks;
  uint64_t n_marks;
  /**
   * Or the marks by position (`n_mark_ranges` 0: none; not with `marks`:
   * `KVE_ERR_INVALID_ARGUMENT`): the cells' positions (`n_positions == n_cells`, else
   * `KVE_ERR_SHAPE_MISMATCH`) and ranges `[mark_ranges[2k], mark_ranges[2k+1])` of
   * marked positions (`n_mark_ranges` values, even, each range `p0 <= p1`, else
   * `KVE_ERR_INVALID_ARGUMENT`): a cell is marked when a range holds its position.
   */
  const int32_t *positions;
  uint64_t n_positions;
  const int32_t *mark_ranges;
  uint64_t n_mark_ranges;
  /**
   * Layer `l`'s K, `[Hkv, S, dk]`: `n_keys` must be the context's layers
   * (`KVE_ERR_SHAPE_MISMATCH`), or 0 with `fill`.
   */
  const struct kve_tensor *keys;
  uint64_t n_keys;
  /**
   * Layer `l`'s V, `[Hkv, S, dv]`, when the method reads values (`n_values` 0: none,
   * else the layers; not read when the method reads none).
   */
  const struct kve_tensor *values;
  uint64_t n_values;
  /**
   * Layer `l`'s window queries `[Hq, wq, dk]`, as `kve_evictor_layer.queries`
   * (`n_queries` 0: the rows `kve_evictor_observe_queries` kept, else the layers).
   */
  const struct kve_tensor *queries;
  uint64_t n_queries;
  /**
   * Cells the round ends holding (as `kve_evictor_begin`'s `target`).
   */
  uint64_t target;
  float mark_share;
  /**
   * With marks, how the marked cells' budget is spent: `KVE_MARK_SPLIT_SHARE` (0, the
   * default: one selection over them) or `KVE_MARK_SPLIT_SPANS` (1: split evenly over
   * the marked spans, one selection each: by position, the cells of each range, also
   * when the text between two ranges is evicted; by `marks`, each run of consecutive
   * cells with the same nonzero flag); else
   * `KVE_ERR_INVALID_ARGUMENT`. (Before issue 28's ninth pass: `pad`, which had to be 0.)
   */
  uint32_t mark_split;
  /**
   * Since `KVE_EVICTOR_ROUND_V2_SIZE`, optional (NULL: the arrays above): with `n_keys`,
   * `n_values` and `n_queries` 0 (else `KVE_ERR_INVALID_ARGUMENT`), called once per
   * layer, in layer order, when the round reaches it: `fill(user, layer, out)` writes
   * that layer's `keys`, `values`, `queries` into `*out` (a `kve_evictor_layer` the
   * library set absent, `KVE_EVICTOR_LAYER_V1_SIZE`; `row_lse` and `wo` stay absent, else
   * `KVE_ERR_INVALID_ARGUMENT`), as the arrays would give them. Its tensors are read
   * until `fill` is next called or the call returns, so one buffer can hold every
   * layer's copy in turn. A nonzero return ends the round with `KVE_ERR_CALLBACK`.
   * `fill` must not call the library on this context. Its tensors are checked as the
   * arrays' are, but only when it has given them: after the round has begun.
   */
  kve_evictor_fill_fn fill;
  /**
   * The layers `fill` gives: the context's layers (`KVE_ERR_SHAPE_MISMATCH`), 0 without
   * `fill`.
   */
  uint64_t fill_layers;
  /**
   * Passed to `fill` as it is; never read by the library.
   */
  void *user;
  /**
   * Must be 0 (keeps `user` in 8 bytes on 32-bit callers).
   */
  uint64_t user_pad;
} kve_evictor_round;

/**
 * A sequence's counters.
 */
typedef struct kve_evictor_stats {
  uint32_t struct_size;
  /**
   * 1 when the last commit left per-head sets of different lengths: the sequence takes
   * no further round until `kve_evictor_seq_reset`.
   */
  uint32_t ragged;
  /**
   * Cells held after the last commit.
   */
  uint64_t cells;
  /**
   * Cells the keep ratio never compresses again.
   */
  uint64_t protected_cells;
  uint64_t evictions;
  uint64_t cells_evicted;
} kve_evictor_stats;

/**
 * An engine's eviction options, as its user gives them (command-line flags), for
 * `kve_evictor_options_apply`. Zero-fill it, then set `struct_size`
 * (`KVE_EVICTOR_OPTIONS_V1_SIZE`) and what the user gave.
 */
typedef struct kve_evictor_options {
  uint32_t struct_size;
  /**
   * `KVE_OPTIONS_*`.
   */
  uint32_t flags;
  /**
   * The method: `kve_preset_name`'s spelling, NUL-terminated; NULL or "": laprox-span.
   */
  const char *method;
  /**
   * The cell budget per sequence (0: off): past it, down to
   * `floor(max_cells * evict_to)`, which must exceed the window.
   */
  uint64_t max_cells;
  /**
   * The observation window (0: the method's), at most `KVE_OPTIONS_MAX_WINDOW`.
   */
  uint32_t window;
  /**
   * Value links at this threshold, at most 1 (0 or negative: off).
   */
  float link_threshold;
  /**
   * The keep ratio of what is new since the last compression, in (0, 1] (0: off).
   */
  double keep_ratio;
  /**
   * With `max_cells`: in (0, 1).
   */
  double evict_to;
} kve_evictor_options;

/**
 * State of a model-wide top-K search split over shards of layers (design §4, "selection
 * across devices"). Plain data: copy it to every shard, process or device. Written only
 * by `kve_search_init` and `kve_search_step`; the fields are the library's business.
 * What can be checked is (`KVE_ERR_INVALID_ARGUMENT`): the fields' consistency; before
 * the first step the whole state, recomputed from the model and parameters (`need` is
 * their candidate count, at most the model's prefix positions); after it `need` at most
 * that count, no threshold while running, a final threshold made of the settled digits.
 * What cannot be: settled digits, `need` and threshold forged together stay a search
 * the library cannot tell from its own, and the shards keep what its threshold says.
 *
 * It records the model and the parameters it was started for: a shard whose `hkv`, `n`
 * or window differ, or whose layers reach past the model's, gives
 * `KVE_ERR_SHAPE_MISMATCH`; other selection parameters than `kve_search_init`'s give
 * `KVE_ERR_INVALID_ARGUMENT`.
 */
typedef struct kve_search {
  uint64_t need;
  uint64_t prefix_lo;
  uint64_t prefix_hi;
  uint64_t threshold_lo;
  uint64_t threshold_hi;
  uint32_t bits;
  /**
   * 1 when the threshold is known.
   */
  uint32_t done;
  /**
   * The model: layers (all shards together), KV heads, tokens, `min(window, n)`.
   */
  uint64_t layers;
  uint64_t hkv;
  uint64_t n;
  uint64_t window;
  /**
   * The selection parameters, as decoded (first-release layout).
   */
  struct kve_select_params params;
} kve_search;

/**
 * Counts of the next key digit, one per bucket, and which search round and layers they
 * cover. Zero it (`kve_histogram_clear`, or all-zero bytes) before counting; add
 * shards' histograms with `kve_histogram_merge`. `kve_search_step` accepts it only when
 * every layer of the model was counted exactly once for the search's current round.
 */
typedef struct kve_histogram {
  uint64_t bins[256];
  /**
   * The round it was counted for (a fingerprint of the search state); 0 while empty.
   */
  uint64_t round;
  /**
   * Layers counted into it, with repeats.
   */
  uint64_t layers;
  /**
   * A checksum of which layers (a wrong set passes with probability about 2^-64).
   */
  uint64_t layer_sum;
} kve_histogram;

/**
 * How `kve_stream_scores` turns a stream's statistics into scores. Fill with
 * `kve_stream_score_params_init` (max attention, GQA max, no pooling), then adjust.
 * Per query head: `stat`, then the pool; then the GQA reduction; then the post-pool.
 */
typedef struct kve_stream_score_params {
  /**
   * `sizeof(kve_stream_score_params)` as the caller compiled it (set by the init).
   */
  uint32_t struct_size;
  /**
   * `KVE_STREAM_STAT_*`.
   */
  uint32_t stat;
  /**
   * `KVE_GQA_*`: how the query heads of a KV group combine (after `pool`).
   */
  uint32_t gqa;
  /**
   * `KVE_POOL_*` along tokens per query head (LaProx: on the attention term).
   */
  uint32_t pool_kind;
  /**
   * Its kernel: odd for avg/max (<= 4095), 1..4096 for forward.
   */
  uint32_t pool_kernel;
  /**
   * Its decay (forward pooling), in (0, 1].
   */
  float pool_decay;
  /**
   * `KVE_POOL_*` per KV head after the GQA reduction.
   */
  uint32_t post_pool_kind;
  uint32_t post_pool_kernel;
  float post_pool_decay;
  /**
   * Must be 0.
   */
  uint32_t reserved;
} kve_stream_score_params;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/**
 * The name of a status code, e.g. `"KVE_ERR_ALIASING"`; `"KVE_UNKNOWN_STATUS"` for codes
 * the library does not know. A static string: never NULL, never freed.
 */
const char *kve_status_name(int32_t status);

/**
 * A one-line English description of a status code (static, never NULL, never freed).
 */
const char *kve_status_message(int32_t status);

/**
 * The library's version as `MAJOR*10000 + MINOR*100 + PATCH` (compare with
 * `KVE_VERSION_NUMBER` to detect a header/library mismatch).
 */
uint32_t kve_version(void);

/**
 * The library's version as a static string, e.g. `"0.4.0"` (never NULL, never freed).
 */
const char *kve_version_string(void);

/**
 * Head-major compaction in place: for every head `h` of `kv` (`[H, N, d]`, any strides
 * whose rows do not overlap — else `KVE_ERR_ALIASING`), the kept rows move to tokens
 * `0 .. count_h` in order; the rest of the head is left as it was. `offsets[0..=H]` and
 * `indices` describe the kept lists (ascending, `< N`, else
 * `KVE_ERR_INVALID_ARGUMENT`): head `h` keeps `indices[offsets[h] .. offsets[h+1]]`,
 * the offsets absolute into the whole `indices` array — pass `kve_select_model`'s
 * `offsets + l*hkv` (`offsets_len = hkv + 1`) with its whole `indices` for layer `l`.
 * `lengths` (may be NULL with `lengths_len = 0`) receives the new per-head lengths
 * `count_h` (`H` entries). Writes through `kv->data` (which must be writable although
 * `kve_tensor.data` is `const void*`) and `lengths`; every list is validated before the
 * first byte moves.
 */
int32_t kve_compact_in_place(const struct kve_tensor *kv,
                             const uint64_t *offsets,
                             uint64_t offsets_len,
                             const uint32_t *indices,
                             uint64_t indices_len,
                             uint32_t *lengths,
                             uint64_t lengths_len);

/**
 * Flattened varlen compaction, out of place: the kept rows of every head of `src`
 * (`[H, N, d]`), head after head, into rows `0 ..` of `dst` (a tensor of the same dtype
 * and `d`, `extent = {1, capacity, d}`, rows not overlapping), and
 * `cu_seqlens[0..=H]` (int32, flash-attention varlen layout: head `h` owns rows
 * `cu_seqlens[h] .. cu_seqlens[h+1]`). `offsets` and `indices` as in
 * `kve_compact_in_place` (offsets absolute into the whole `indices` array). `dst` must
 * not overlap `src` or the lists. Writes through `dst->data` (writable memory, although
 * `kve_tensor.data` is `const void*`) and `cu_seqlens`.
 */
int32_t kve_compact_varlen(const struct kve_tensor *src,
                           const uint64_t *offsets,
                           uint64_t offsets_len,
                           const uint32_t *indices,
                           uint64_t indices_len,
                           const struct kve_tensor *dst,
                           int32_t *cu_seqlens,
                           uint64_t cu_seqlens_len);

/**
 * Number of CUDA devices the library can use; 0 (and `KVE_OK`) when there is no device
 * or driver. A library built without CUDA writes `*count = 0` (when `count` is non-NULL
 * and aligned) and returns `KVE_ERR_NOT_BUILT_WITH_CUDA`: the one status that comes
 * with an output, so that a caller that only reads the count sees no device. Writes only
 * `*count`.
 */
int32_t kve_cuda_get_device_count(int32_t *count);

/**
 * Device workspace bytes of `kve_cuda_score_layer` (shape as in
 * `kve_score_workspace_size`; enough for LaProx with the Gram, whatever the dtype).
 * Writes only `*out_bytes` (host memory).
 */
int32_t kve_cuda_score_workspace_size(const struct kve_score_params *params,
                                      uint64_t hq,
                                      uint64_t hkv,
                                      uint64_t n,
                                      uint64_t dk,
                                      uint64_t dv,
                                      uint64_t *out_bytes);

/**
 * `kve_score_layer` on the device, enqueued on `stream` (a `cudaStream_t`, NULL = the
 * legacy default stream): every scorer, pooling, GQA mode and placement of the host
 * path, f32/f16/bf16 in any strided layout — one dtype for the queries, keys and values
 * (the host path mixes them; here another is `KVE_ERR_SHAPE_MISMATCH`). Tensors of `inputs` and its `gram`,
 * `value_forms`, `value_l1` and `row_lse` arrays, `out` (`Hkv*P` floats, `[Hkv][P]`)
 * and the workspace (256-byte aligned, `kve_cuda_score_workspace_size` bytes) are
 * device memory; the structs themselves are host memory. LaProx's `gram` is the f32
 * output of `kve_compute_gram` copied to the device (for f16/bf16 values it is split
 * into a high and a low part in the values' dtype, in the workspace, so the tensor
 * cores see an f32-accurate G); or pass `value_forms` (`kve_compute_value_forms`, on
 * the device). With `row_lse` the window pass reads K once.
 *
 * Limits of the kernels: `dk <= 256`; `dv <= 256` when the Gram is given; `g <= 128`
 * (`g <= 16` for the exact and mean-attn LaProx GQA modes); at most 65535 heads;
 * `window <= 2^24`; uniqueness: `N <= 65535·64`; otherwise `KVE_ERR_INVALID_ARGUMENT`. A few
 * shapes also need more shared memory than sm_86/89's 99 KiB (f32 with `dk > 128` and
 * `g > 24`, 16-bit with `dk > 128` and `g > 96`; the exact LaProx GQA modes with f32,
 * `dk > 128` and `g > 8`; `cuda/kvevict_cuda.h` has the table): the launch is then
 * refused with `KVE_ERR_CUDA`, nothing enqueued.
 * Everything the host can check (pointers, dtypes, extents and strides against `len`,
 * lengths, alignment, workspace size) is checked before anything is enqueued, with the
 * host path's status codes. Unlike the host path, NaN/Inf are not detected. Nothing
 * synchronises; kernel faults surface on the stream (`KVE_ERR_CUDA` when a launch is
 * refused).
 */
int32_t kve_cuda_score_layer(const struct kve_score_params *params,
                             const struct kve_layer_inputs *inputs,
                             float *out,
                             uint64_t out_len,
                             void *workspace,
                             uint64_t workspace_bytes,
                             void *stream);

/**
 * Device workspace bytes of `kve_cuda_select_model`. Writes only `*out_bytes`.
 */
int32_t kve_cuda_select_model_workspace_size(const struct kve_select_params *params,
                                             uint64_t layers,
                                             uint64_t hkv,
                                             uint64_t n,
                                             uint64_t window,
                                             uint64_t *out_bytes);

/**
 * `kve_select_model` on the device from device scores (`scores->scores` is a device
 * pointer): every allocator (uniform, ada, pyramid, lava, global), granularity (head,
 * layer, token), normalisation and post pooling, with the same keys and tie rule as
 * the host, so the kept sets are the host's. Layer budgets (PyramidKV, LAVa's
 * entropies) are computed on the device: no host round trip, capturable in a graph.
 * Output per unit `u = l*hkv + kh`, as the host's lists: `counts[u]` (int32,
 * `layers*hkv` entries) kept positions in `idx[u*idx_ld ..]` (int32, `N <= idx_ld <=
 * 2^31-1`), ascending — the chosen prefix tokens, then the whole window — so the lists
 * go straight to `kve_cuda_compact_in_place` (`max_keep`: the largest count; `N`
 * always suffices). With a shared granularity every head of a layer (layer)
 * or of the model (token) gets the same list. `counts`, `idx` and the
 * workspace (`kve_cuda_select_model_workspace_size` bytes, 256-byte aligned) are
 * device memory.
 */
int32_t kve_cuda_select_model(const struct kve_select_params *params,
                              const struct kve_model_scores *scores,
                              int32_t *counts,
                              uint64_t counts_len,
                              int32_t *idx,
                              uint64_t idx_ld,
                              uint64_t idx_len,
                              void *workspace,
                              uint64_t workspace_bytes,
                              void *stream);

/**
 * Device workspace bytes of `kve_cuda_compact_in_place` for a view and the largest
 * count of any list. Writes only `*out_bytes`.
 */
int32_t kve_cuda_compact_in_place_workspace_size(const struct kve_tensor *kv,
                                                 uint64_t max_keep,
                                                 uint64_t *out_bytes);

/**
 * In-place compaction on the device: for each head `h` of `kv`, rows
 * `kept[h*kept_ld + t]` (`t < counts[h]`, ascending) move to token `t`. `kept_ld = 0`:
 * one list shared by every head. `counts[h] <= max_keep`. Lists as written by
 * `kve_cuda_select_model` (device memory). Works for every layout.
 */
int32_t kve_cuda_compact_in_place(const struct kve_tensor *kv,
                                  const int32_t *kept,
                                  uint64_t kept_ld,
                                  const int32_t *counts,
                                  uint64_t max_keep,
                                  void *workspace,
                                  uint64_t workspace_bytes,
                                  void *stream);

/**
 * Varlen compaction on the device: kept rows of every head of `src`, head after head,
 * into `dst` (contiguous rows of `src`'s dtype and dim, `Σ counts` rows) and
 * `cu_seqlens[0..=heads]` (int32, device).
 */
int32_t kve_cuda_compact_to_varlen(const struct kve_tensor *src,
                                   const int32_t *kept,
                                   uint64_t kept_ld,
                                   const int32_t *counts,
                                   void *dst,
                                   int32_t *cu_seqlens,
                                   void *stream);

/**
 * Device workspace bytes of `kve_cuda_accumulate_value_links` for `hkv` heads of `n`
 * tokens: `hkv` in 1 .. 65535, `n` in 1 .. 2^31 (else `KVE_ERR_INVALID_ARGUMENT`).
 * Writes only `*out_bytes` (host memory).
 */
int32_t kve_cuda_value_links_workspace_size(uint64_t hkv, uint64_t n, uint64_t *out_bytes);

/**
 * `kve_accumulate_value_links` on the device, enqueued on `stream`: adds `sum over the
 * Hkv heads of cos(v[h, i], v[h, i-1])` to `links[i]`, `1 <= i < N`, for one layer's
 * `values` `[Hkv, N, dv]` (f32/f16/bf16, any strides, V transposed included). `links`
 * (`links_len >= N` floats, zeroed before the first layer) and the workspace
 * (`kve_cuda_value_links_workspace_size` bytes, 256-byte aligned) are device memory; the
 * descriptor is host memory. The host's operation order, so the sums are the host's bits
 * on an AVX2 + FMA host. Checked before anything is enqueued as on the host (pointers,
 * dtype, extents and strides, `links_len`, workspace, aliasing); `Hkv <= 65535` (else
 * `KVE_ERR_INVALID_ARGUMENT`). Unlike the host path NaN/Inf are not detected: a
 * non-finite value or squared norm makes its token's and the next token's link NaN.
 */
int32_t kve_cuda_accumulate_value_links(const struct kve_tensor *values,
                                        float *links,
                                        uint64_t links_len,
                                        void *workspace,
                                        uint64_t workspace_bytes,
                                        void *stream);

/**
 * `kve_cuda_select_model` whose forward post-pool carries each continuation on through
 * linked positions, as `kve_select_model_linked`: `i` continues `i - 1` when
 * `links[i] / (layers * hkv)` exceeds `link_threshold`. `links`: exactly `n` floats of
 * device memory, the sums of `kve_cuda_accumulate_value_links` over every layer (else
 * `KVE_ERR_SHAPE_MISMATCH`). The post-pool must be `KVE_POOL_FORWARD` with decay 1 and
 * the threshold finite (else `KVE_ERR_INVALID_ARGUMENT`). Same workspace
 * (`kve_cuda_select_model_workspace_size`) and outputs as `kve_cuda_select_model`;
 * nothing enqueued on error. Unlike the host path, non-finite links are not detected
 * (they are device memory): a NaN sum links nothing.
 */
int32_t kve_cuda_select_model_linked(const struct kve_select_params *params,
                                     const struct kve_model_scores *scores,
                                     const float *links,
                                     uint64_t links_len,
                                     float link_threshold,
                                     int32_t *counts,
                                     uint64_t counts_len,
                                     int32_t *idx,
                                     uint64_t idx_ld,
                                     uint64_t idx_len,
                                     void *workspace,
                                     uint64_t workspace_bytes,
                                     void *stream);

/**
 * Device workspace bytes of `kve_cuda_compact_batch_in_place` for these items and the
 * largest count of any list (`max_keep`; `N` always suffices). Every item is checked as
 * the call checks it. Writes only `*out_bytes`.
 */
int32_t kve_cuda_compact_batch_in_place_workspace_size(const struct kve_compact_item *items,
                                                       uint64_t n_items,
                                                       uint64_t max_keep,
                                                       uint64_t *out_bytes);

/**
 * `kve_cuda_compact_in_place` of every item (K and V of every layer) on `stream`, two
 * launches per 32 items (Llama-3-8B's 64 tensors: 4 launches instead of 128). `items`
 * (host memory, at most 1024, else `KVE_ERR_INVALID_ARGUMENT`) as `kve_compact_item`
 * says; `counts[h] <= max_keep`. The items' tensors (their `data`/`len` buffers) must not
 * overlap one another, any item's lists, the items array or the workspace
 * (`KVE_ERR_ALIASING`); items may share lists. Workspace: device memory, 256-byte
 * aligned, `kve_cuda_compact_batch_in_place_workspace_size` bytes. Every item is checked
 * before the first launch (nothing enqueued on error); the lists' contents are read on
 * the device only (ascending positions below N, as `kve_cuda_select_model` writes them).
 */
int32_t kve_cuda_compact_batch_in_place(const struct kve_compact_item *items,
                                        uint64_t n_items,
                                        uint64_t max_keep,
                                        void *workspace,
                                        uint64_t workspace_bytes,
                                        void *stream);

/**
 * Device bytes of `kve_cuda_prepare_gram`'s output for a Gram of `gram_len` floats
 * (`kve_gram_len`) and values of `dtype` (`KVE_DTYPE_*`). `with_lo` 1: the Gram rounded
 * to the dtype plus its rounding residual (two tensor-core products, an f32-accurate G:
 * what `kve_cuda_score_layer` computes); 0: the rounded Gram alone (half the
 * tensor-core work of LaProx's value term, G to 8 (bf16) or 11 (f16) bits). f32 values:
 * the Gram itself, whatever `with_lo`. Writes only `*out_bytes`.
 */
int32_t kve_cuda_prepare_gram_size(uint64_t gram_len,
                                   uint32_t dtype,
                                   uint32_t with_lo,
                                   uint64_t *out_bytes);

/**
 * Split LaProx's f32 Gram (`gram`, `gram_len` floats from `kve_compute_gram`, device
 * memory) for values of `dtype` into `split` (device memory, 256-byte aligned,
 * `kve_cuda_prepare_gram_size` bytes, not overlapping `gram`), enqueued on `stream`. Once
 * per model and layer; pass `split` to `kve_cuda_score_layer_prepared` with the same
 * `dtype` (the values') and `with_lo`. With `with_lo = 1` the scores equal
 * `kve_cuda_score_layer`'s given `gram`, bit for bit.
 */
int32_t kve_cuda_prepare_gram(const float *gram,
                              uint64_t gram_len,
                              uint32_t dtype,
                              uint32_t with_lo,
                              void *split,
                              uint64_t split_bytes,
                              void *stream);

/**
 * `kve_cuda_score_layer` with LaProx's Gram given split (`kve_cuda_prepare_gram`: `split`,
 * `split_bytes`, `with_lo` as made there, for the values' dtype) instead of
 * `inputs->gram`: the split is not recomputed. `inputs->gram` and `inputs->value_forms`
 * must be NULL (`KVE_ERR_INVALID_ARGUMENT`); `split_bytes` must be the split's size for
 * this layer's Gram (`kve_gram_len` of its shape and GQA mode) and values' dtype
 * (`KVE_ERR_SHAPE_MISMATCH`). Scorers other than LaProx do not read it. Workspace:
 * `kve_cuda_score_workspace_size` bytes suffice. Everything else as
 * `kve_cuda_score_layer`.
 */
int32_t kve_cuda_score_layer_prepared(const struct kve_score_params *params,
                                      const struct kve_layer_inputs *inputs,
                                      const void *split,
                                      uint64_t split_bytes,
                                      uint32_t with_lo,
                                      float *out,
                                      uint64_t out_len,
                                      void *workspace,
                                      uint64_t workspace_bytes,
                                      void *stream);

/**
 * Host bytes of the context (`*host_bytes`, any alignment, 64 bytes of slack included)
 * and device bytes of the block (`*device_bytes`, 256-byte aligned) for `config`. Methods
 * that read `Wo` every round (CriticalKV) are not on the device:
 * `KVE_ERR_INVALID_ARGUMENT`. Writes only the two sizes.
 */
int32_t kve_cuda_evictor_size(const struct kve_evictor_config *config,
                              uint64_t *host_bytes,
                              uint64_t *device_bytes);

/**
 * Start an evictor's device form: its context in `memory` (host, `bytes` from
 * `kve_cuda_evictor_size`), its tensors in `device_memory` (`device_bytes`, 256-byte
 * aligned, e.g. from cudaMalloc; not touched here), and set `*evictor`. No teardown:
 * the caller frees both. Writes `memory` and `*evictor` only on success.
 */
int32_t kve_cuda_evictor_init(void *memory,
                              uint64_t bytes,
                              void *device_memory,
                              uint64_t device_bytes,
                              const struct kve_evictor_config *config,
                              struct kve_cuda_evictor **evictor);

/**
 * As `kve_evictor_get_requirements`.
 */
int32_t kve_cuda_evictor_get_requirements(const struct kve_cuda_evictor *evictor,
                                          struct kve_evictor_requirements *out,
                                          uint32_t struct_size);

/**
 * Set `layer`'s output projection `wo` (`[Hq, dv, D]`, HOST memory) for a method with
 * `KVE_WO_ONCE`: its Gram blocks are computed on the host and uploaded to the device
 * block on `stream`, which is synchronised (a setup call, not capturable).
 */
int32_t kve_cuda_evictor_set_output_projection(struct kve_cuda_evictor *evictor,
                                               uint64_t layer,
                                               const struct kve_tensor *wo,
                                               void *stream);

/**
 * As `kve_evictor_observe_queries`, `queries` in DEVICE memory, enqueued on `stream`
 * (the last `window` rows go to the sequence's ring in the device block, in the
 * queries' dtype: every observation of a (sequence, layer) takes one dtype).
 */
int32_t kve_cuda_evictor_observe_queries(struct kve_cuda_evictor *evictor,
                                         uint64_t seq,
                                         uint64_t layer,
                                         const struct kve_tensor *queries,
                                         void *stream);

/**
 * As `kve_evictor_plan` (host only).
 */
int32_t kve_cuda_evictor_plan(struct kve_cuda_evictor *evictor,
                              uint64_t seq,
                              uint64_t n_cells,
                              uint64_t *target);

/**
 * As `kve_evictor_begin` (host bookkeeping: nothing enqueued).
 */
int32_t kve_cuda_evictor_begin(struct kve_cuda_evictor *evictor,
                               uint64_t seq,
                               uint64_t n_cells,
                               uint64_t target);

/**
 * As `kve_evictor_score_layer`, on `stream`: `views` (host struct, from
 * `kve_evictor_layer_init`) holds DEVICE tensors; its `wo` must be absent and its
 * `row_lse` is device floats. Checked on the host before anything is enqueued.
 */
int32_t kve_cuda_evictor_score_layer(struct kve_cuda_evictor *evictor,
                                     uint64_t seq,
                                     uint64_t layer,
                                     const struct kve_evictor_layer *views,
                                     void *stream);

/**
 * As `kve_evictor_score_layer_paged`, on `stream`, for a context configured with
 * `paged = 1`: `views` (host struct, from `kve_evictor_paged_layer_init`) holds pools
 * in DEVICE memory (`keys.data`, `values.data`), the block table in HOST memory, and as
 * `kve_cuda_evictor_score_layer` a device `queries` tensor (or none: the ring), device
 * `row_lse` floats and no `wo`. The table is checked on the host with the host form's
 * check (the same statuses: `KVE_ERR_SHAPE_MISMATCH` short, `KVE_ERR_OUT_OF_BOUNDS` an
 * entry past the pool, `KVE_ERR_ALIASING` a repeat; nothing enqueued on error), then its
 * used entries are copied to the device block on `stream` (keep them unchanged until the
 * stream passes the call; from pageable memory the copy is not graph-capturable), K (and
 * V) gathered there and scored: kept lists bit-identical to the contiguous call's.
 */
int32_t kve_cuda_evictor_score_layer_paged(struct kve_cuda_evictor *evictor,
                                           uint64_t seq,
                                           uint64_t layer,
                                           const struct kve_evictor_paged_layer *views,
                                           void *stream);

/**
 * As `kve_evictor_compact_paged`, on `stream`, for a context configured with `paged =
 * 1`: `kv` is a pool in DEVICE memory (written through `kv->data`; `heads == Hkv`, `dim`
 * dk or dv), `table` HOST memory checked as in `kve_cuda_evictor_score_layer_paged` and
 * copied to the device block. `*blocks_freed`: as the host call's when the selection is
 * rectangular (token granularity or the uniform allocator); `UINT64_MAX` for the other
 * allocators, whose counts stay on the device (nothing is read back). On error nothing
 * is enqueued and `*blocks_freed` is as it was.
 */
int32_t kve_cuda_evictor_compact_paged(struct kve_cuda_evictor *evictor,
                                       uint64_t seq,
                                       uint64_t layer,
                                       const struct kve_paged_layout *kv,
                                       const uint32_t *table,
                                       uint64_t table_len,
                                       uint64_t *blocks_freed,
                                       void *stream);

/**
 * As `kve_evictor_select`, on `stream`. `*kept_cells`: the cells every (layer, KV head)
 * keeps when the selection is rectangular (token granularity, or the uniform
 * allocator: the round's target); `UINT64_MAX` for the other allocators, whose counts
 * stay on the device (`kve_cuda_evictor_kept_lists`): nothing is read back.
 */
int32_t kve_cuda_evictor_select(struct kve_cuda_evictor *evictor,
                                uint64_t seq,
                                uint64_t *kept_cells,
                                void *stream);

/**
 * The kept lists of `seq`'s selected round, in the device block (valid until the
 * sequence's next `begin`): unit `u = layer * hkv + h` keeps `(*idx)[u * *idx_ld ..]`,
 * `(*counts)[u]` cells ascending (int32, DEVICE memory; one list for every unit with
 * token granularity) — `kve_cuda_compact_in_place`'s lists. Writes the three only on
 * success.
 */
int32_t kve_cuda_evictor_kept_lists(struct kve_cuda_evictor *evictor,
                                    uint64_t seq,
                                    const int32_t **counts,
                                    const int32_t **idx,
                                    uint64_t *idx_ld);

/**
 * As `kve_evictor_compact`: `kv` is DEVICE memory (written through `kv->data`),
 * compacted in place on `stream`.
 */
int32_t kve_cuda_evictor_compact(struct kve_cuda_evictor *evictor,
                                 uint64_t seq,
                                 uint64_t layer,
                                 const struct kve_tensor *kv,
                                 void *stream);

/**
 * As `kve_evictor_run_round`, on the device form, enqueued on `stream` and waited for
 * (not capturable): the same `kve_evictor_round` (V1 or V2, `fill` included) and the
 * same statuses, with each layer's `keys` and `values` in DEVICE memory (f32, f16 or
 * bf16: `Q8_0`/`Q4_0` are `KVE_ERR_UNSUPPORTED_DTYPE`; the stream's `[Hkv, S, d]`, V
 * transposed or not, its cells gathered by `cells` on the device in the context's paged
 * gather area, or `cells` NULL: the round's cells themselves) and its `queries` in HOST
 * memory (converted to the keys' dtype and uploaded by the library into its workspace;
 * absent: the ring `kve_cuda_evictor_observe_queries` filled). The kept cells (indices
 * into `round->cells`, ascending) are read back to `kept` (HOST memory) at the end. The
 * device form takes no marks (`n_marks`, `n_mark_ranges` or `mark_split` nonzero:
 * `KVE_ERR_INVALID_ARGUMENT`)
 * and needs token granularity (the round's kept cells one list; `KVE_ERR_INVALID_ARGUMENT`
 * otherwise), both checked before the round begins. The engine then moves the kept rows
 * (or drops the others) itself and calls `kve_cuda_evictor_commit`.
 */
int32_t kve_cuda_evictor_run_round(struct kve_cuda_evictor *evictor,
                                   uint64_t seq,
                                   const struct kve_evictor_round *round,
                                   uint32_t *kept,
                                   uint64_t len,
                                   uint64_t *count,
                                   void *stream);

/**
 * As `kve_evictor_commit` (host bookkeeping). A selection that is not rectangular
 * leaves the sequence ragged: no further round until `kve_cuda_evictor_seq_reset`.
 */
int32_t kve_cuda_evictor_commit(struct kve_cuda_evictor *evictor, uint64_t seq);

/**
 * As `kve_evictor_seq_reset`.
 */
int32_t kve_cuda_evictor_seq_reset(struct kve_cuda_evictor *evictor, uint64_t seq);

/**
 * As `kve_evictor_seq_unprotect` (host bookkeeping).
 */
int32_t kve_cuda_evictor_seq_unprotect(struct kve_cuda_evictor *evictor, uint64_t seq);

/**
 * As `kve_evictor_get_stats`.
 */
int32_t kve_cuda_evictor_get_stats(struct kve_cuda_evictor *evictor,
                                   uint64_t seq,
                                   struct kve_evictor_stats *out,
                                   uint32_t struct_size);

/**
 * The number of presets; `kve_preset_name(0 .. count - 1)` lists them.
 */
uint32_t kve_preset_count(void);

/**
 * The name of preset `preset` (`KVE_PRESET_*`), e.g. `"laprox-span"`: a static string;
 * NULL for an unknown preset.
 */
const char *kve_preset_name(uint32_t preset);

/**
 * The preset called `name` (NUL-terminated, exact: `kve_preset_name`'s spelling) into
 * `*preset`. Unknown names give `KVE_ERR_BAD_ENUM`. Reads at most 32 bytes of `name`.
 */
int32_t kve_preset_from_name(const char *name, uint32_t *preset);

/**
 * Fill `config` for a preset: its window, granularity and selection, no links, one
 * sequence, `KVE_POLICY_EXPLICIT`, `min_keep` 64; the model shape and `max_cells` are 0
 * (to be set). Writes only `config` (`struct_size` bytes).
 */
int32_t kve_evictor_config_init(struct kve_evictor_config *config,
                                uint32_t struct_size,
                                uint32_t preset);

/**
 * Bytes of memory `kve_evictor_init` needs for `config` (any alignment; 63 bytes of
 * slack included). Writes only `*bytes`.
 */
int32_t kve_evictor_size(const struct kve_evictor_config *config, uint64_t *bytes);

/**
 * Check `config` as `kve_evictor_size` and `kve_evictor_init` do, without memory, and
 * say why it is refused: returns the status they return. On `KVE_OK` writes what the
 * method reads into `requirements` (when not NULL: `requirements_size` bytes, as
 * `kve_evictor_get_requirements`; a bad size is its status, nothing else written) and
 * NULL into `*message` (when not NULL). On a refusal writes only `*message` (when not
 * NULL): a static NUL-terminated sentence naming what to change, for an engine's startup
 * error.
 */
int32_t kve_evictor_config_check(const struct kve_evictor_config *config,
                                 struct kve_evictor_requirements *requirements,
                                 uint32_t requirements_size,
                                 const char **message);

/**
 * The ", "-separated names of every preset (`flags` 0) or of those an engine with
 * `flags` (`KVE_OPTIONS_NO_WO_EVERY_ROUND`) may run: a static NUL-terminated string, for
 * an engine's `--help` and messages.
 */
const char *kve_preset_list(uint32_t flags);

/**
 * Read an engine's eviction options into an evictor config, and check them: the method
 * (none: laprox-span), the policy (`KVE_POLICY_KEEP_RATIO` when `keep_ratio` is set,
 * else `KVE_POLICY_CELLS` when `max_cells` is, else `KVE_POLICY_EXPLICIT`; `high` and
 * `low` are set whenever `max_cells` is), the window, the value links, the granularity
 * (`KVE_OPTIONS_TOKEN_CELLS`); then as `kve_evictor_config_check` on a one-cell model.
 * On `KVE_OK` writes `*config` (`config_size` bytes; its model shape, `max_cells` 1 and
 * `max_seqs` 1 are for the engine to set), the method's requirements (when
 * `requirements` is not NULL, as `kve_evictor_config_check`) and NULL into `*message`
 * (when not NULL). On a refusal writes only `*message` (when not NULL): a static
 * sentence naming what to change (an unknown method's lists the known ones).
 */
int32_t kve_evictor_options_apply(const struct kve_evictor_options *options,
                                  struct kve_evictor_config *config,
                                  uint32_t config_size,
                                  struct kve_evictor_requirements *requirements,
                                  uint32_t requirements_size,
                                  const char **message);

/**
 * An engine's in-graph query ring (per sequence `window` rows `seq * window + slot`, then
 * one scratch row `n_seqs * window`): the row each of a ubatch's `n_tokens` queries is
 * written to, into `rows` (`rows_len >= n_tokens`). Token `i` belongs to sequence
 * `seq_of[i]` (`0 .. n_seqs`; anything else: the scratch row); `counts[s]` (`n_seqs`
 * of them) holds the queries of `s` written so far and is advanced. A token that a later
 * token of its sequence in the same ubatch overwrites goes to the scratch row, so no two
 * rows of one write collide and the ring holds each sequence's last `window` queries:
 * the `k`-th in slot `k % window`, the last `w` starting at slot `(counts[s] - w) %
 * window`. `window >= 1` (else `KVE_ERR_INVALID_ARGUMENT`). Writes `rows` and `counts`.
 */
int32_t kve_query_ring_rows(uint64_t *counts,
                            uint64_t n_seqs,
                            uint32_t window,
                            const int32_t *seq_of,
                            uint64_t n_tokens,
                            int64_t *rows,
                            uint64_t rows_len);

/**
 * Start an evictor in `memory` (`bytes` from `kve_evictor_size`, any alignment) and
 * set `*evictor` to it: a pointer into `memory`, valid while the caller keeps the
 * memory and does not write it. No teardown: the caller frees `memory`. Writes
 * `memory` and `*evictor` only on success.
 */
int32_t kve_evictor_init(void *memory,
                         uint64_t bytes,
                         const struct kve_evictor_config *config,
                         struct kve_evictor **evictor);

/**
 * Write what an engine captures for `evictor`'s method into `out` (`struct_size`
 * bytes: `KVE_EVICTOR_REQUIREMENTS_V1_SIZE`).
 */
int32_t kve_evictor_get_requirements(const struct kve_evictor *evictor,
                                     struct kve_evictor_requirements *out,
                                     uint32_t struct_size);

/**
 * Set `layer`'s output projection `wo` (`[Hq, dv, D]`) for a method with
 * `KVE_WO_ONCE`: its Gram blocks go into the context; `wo` may be freed after.
 * Other methods: `KVE_ERR_INVALID_ARGUMENT`.
 */
int32_t kve_evictor_set_output_projection(struct kve_evictor *evictor,
                                          uint64_t layer,
                                          const struct kve_tensor *wo);

/**
 * Keep the last `window` of the query rows `queries` (`[Hq, c, dk]`: this ubatch's rows
 * of sequence `seq` at `layer`, in position order, any dtype and strides) in the
 * context, so the engine need not keep window queries. Methods without queries:
 * `KVE_ERR_INVALID_ARGUMENT`.
 */
int32_t kve_evictor_observe_queries(struct kve_evictor *evictor,
                                    uint64_t seq,
                                    uint64_t layer,
                                    const struct kve_tensor *queries);

/**
 * The policy: `*target` = the cells sequence `seq` should hold now that it holds
 * `n_cells` (`n_cells`: nothing to do). Changes nothing; ask after every ubatch.
 */
int32_t kve_evictor_plan(struct kve_evictor *evictor,
                         uint64_t seq,
                         uint64_t n_cells,
                         uint64_t *target);

/**
 * Start a round on sequence `seq`, whose cells are `0 .. n_cells - 1` in position
 * order (`n_cells <= max_cells`), to end holding `target` cells (`kve_evictor_plan`'s
 * or the engine's; raised to the window and, with the keep ratio, the protected
 * cells). A round in progress on `seq` is abandoned.
 */
int32_t kve_evictor_begin(struct kve_evictor *evictor,
                          uint64_t seq,
                          uint64_t n_cells,
                          uint64_t target);

/**
 * Mark cells of sequence `seq`'s begun round (after `kve_evictor_begin`, before
 * `kve_evictor_select`): `flags[i] != 0` marks cell `i`, for the round's `n_cells` cells
 * (`n_flags` must equal it: `KVE_ERR_SHAPE_MISMATCH`). Marked cells hold text the engine
 * was given (user turns, a system prompt), which no later query may read again. The
 * selection then reserves `share` (in [0, 1]; `KVE_MARK_SHARE_DEFAULT`) of each unit's
 * prefix budget for marked cells, picked among them by the method's own selection, and
 * gives the rest to the unmarked cells the same way (a part with too few cells leaves the
 * rest to the other); never more than the budget. No marked cell, no unmarked one, or
 * `share` 0: the plain selection, bit-identical. The marks last for this round only
 * (a new `kve_evictor_begin` forgets them): an engine knows its cells' positions, which
 * compaction keeps. Writes only the context.
 */
int32_t kve_evictor_mark_cells(struct kve_evictor *evictor,
                               uint64_t seq,
                               const uint8_t *flags,
                               uint64_t n_flags,
                               float share);

/**
 * Set every tensor of `layer` absent and its `struct_size`
 * (`KVE_EVICTOR_LAYER_V1_SIZE`). Writes only `layer`.
 */
int32_t kve_evictor_layer_init(struct kve_evictor_layer *layer, uint32_t struct_size);

/**
 * Set everything in `layer` absent and its `struct_size`
 * (`KVE_EVICTOR_PAGED_LAYER_V1_SIZE`). Writes only `layer`.
 */
int32_t kve_evictor_paged_layer_init(struct kve_evictor_paged_layer *layer, uint32_t struct_size);

/**
 * Score `layer` of sequence `seq`'s round from K (and V) in a paged pool: as
 * `kve_evictor_score_layer`, for a context configured with `paged = 1`
 * (`KVE_ERR_INVALID_ARGUMENT` otherwise, or for a pool dtype larger than
 * `paged_dtype`). The sequence's first `n_cells` tokens (the round's) are gathered into
 * the context and scored: kept sets bit-identical to the same K/V given strided. Table
 * errors as `kve_paged_gather`'s (`KVE_ERR_OUT_OF_BOUNDS`, `KVE_ERR_ALIASING`,
 * `KVE_ERR_SHAPE_MISMATCH` for a short table); a pool of other heads or dim
 * `KVE_ERR_SHAPE_MISMATCH`. Reads the pools, writes only the context.
 */
int32_t kve_evictor_score_layer_paged(struct kve_evictor *evictor,
                                      uint64_t seq,
                                      uint64_t layer,
                                      const struct kve_evictor_paged_layer *views);

/**
 * Score `layer` of sequence `seq`'s round (each layer once per round, any order) from
 * `views`, for the round's `n_cells`. Reads the tensors, writes only the context.
 */
int32_t kve_evictor_score_layer(struct kve_evictor *evictor,
                                uint64_t seq,
                                uint64_t layer,
                                const struct kve_evictor_layer *views);

/**
 * Select sequence `seq`'s kept set once every layer of its round is scored: over all its
 * cells, or with the keep ratio over the cells since the protected ones (kept).
 * `*kept_cells`: the cells some (layer, KV head) keeps (every one, token granularity).
 */
int32_t kve_evictor_select(struct kve_evictor *evictor, uint64_t seq, uint64_t *kept_cells);

/**
 * The cells some (layer, KV head) keeps in `seq`'s selected round, ascending, into
 * `cells` (`len` at least `kve_evictor_select`'s count), and their count.
 */
int32_t kve_evictor_kept_cells(struct kve_evictor *evictor,
                               uint64_t seq,
                               uint32_t *cells_out,
                               uint64_t len,
                               uint64_t *count);

/**
 * The cells no (layer, KV head) keeps, ascending (`n_cells` minus the kept count):
 * what an engine of shared cells removes (`llama_memory_seq_rm` per cell).
 */
int32_t kve_evictor_evicted_cells(struct kve_evictor *evictor,
                                  uint64_t seq,
                                  uint32_t *cells_out,
                                  uint64_t len,
                                  uint64_t *count);

/**
 * The per-(layer, KV head) kept lists of `seq`'s selected round, as `kve_select_model`
 * writes them: `offsets` (`layers * hkv + 1`), `indices` (`offsets[layers * hkv]`
 * cells; `layers * hkv * n_cells` always suffices).
 */
int32_t kve_evictor_kept_lists(struct kve_evictor *evictor,
                               uint64_t seq,
                               uint64_t *offsets,
                               uint64_t offsets_len,
                               uint32_t *indices,
                               uint64_t indices_len);

/**
 * Move `layer`'s kept rows of `kv` (K or V of sequence `seq`, `[Hkv, n_cells, d]`, host
 * memory, written through `kv->data`) to the front of each head, in place.
 */
int32_t kve_evictor_compact(struct kve_evictor *evictor,
                            uint64_t seq,
                            uint64_t layer,
                            const struct kve_tensor *kv);

/**
 * `kve_evictor_compact` for K or V in a paged pool (`kv`, the sequence's block table
 * `table`, the round's `n_cells` tokens): each head's kept tokens of `layer` move to the
 * front of the sequence's own blocks, in place, order kept (`kve_paged_compact`).
 * `*blocks_freed`: the trailing table entries of the sequence's `ceil(n_cells /
 * block_size)` that now hold nothing, for the engine's block manager to release (at
 * token granularity the same for every layer, K and V). Table errors as
 * `kve_evictor_score_layer_paged`'s; a context without `paged` works too (the table
 * check needs `max_cells` ids of the context's workspace). Everything is checked before
 * the first byte moves: on error the pool and `*blocks_freed` are as they were.
 */
int32_t kve_evictor_compact_paged(struct kve_evictor *evictor,
                                  uint64_t seq,
                                  uint64_t layer,
                                  const struct kve_paged_layout *kv,
                                  const uint32_t *table,
                                  uint64_t table_len,
                                  uint64_t *blocks_freed);

/**
 * Record that sequence `seq` now holds the kept cells of its selected round (the engine
 * removed the others): they are all protected from the keep ratio.
 */
int32_t kve_evictor_commit(struct kve_evictor *evictor, uint64_t seq);

/**
 * Forget sequence `seq` (ended or cleared): counters, protection, round, query rows.
 */
int32_t kve_evictor_seq_reset(struct kve_evictor *evictor, uint64_t seq);

/**
 * The engine changed sequence `seq`'s cells itself (removed or rewound some, or copied
 * others in): forget its protection (the keep ratio takes every cell as new again), its
 * round, raggedness and held cells; keep its query rows (`kve_evictor_observe_queries`)
 * and its eviction counters. `kve_evictor_seq_reset` forgets everything.
 */
int32_t kve_evictor_seq_unprotect(struct kve_evictor *evictor, uint64_t seq);

/**
 * Sequence `seq`'s counters into `out` (`struct_size` bytes:
 * `KVE_EVICTOR_STATS_V1_SIZE`).
 */
int32_t kve_evictor_get_stats(struct kve_evictor *evictor,
                              uint64_t seq,
                              struct kve_evictor_stats *out,
                              uint32_t struct_size);

/**
 * Workspace bytes of `kve_accumulate_value_links` for `n` tokens of dimension `dv`:
 * `n` in 1 .. 2^31 and `dv >= 1` (else `KVE_ERR_INVALID_ARGUMENT`). Writes only
 * `*out_bytes`.
 */
int32_t kve_value_links_workspace_size(uint64_t n, uint64_t dv, uint64_t *out_bytes);

/**
 * Add `sum over the Hkv heads of cos(v[h, i], v[h, i-1])` to `links[i]` for
 * `1 <= i < N` (`links[0]` untouched; a zero vector links nothing), `values`
 * `[Hkv, N, dv]` of one layer, any dtype and strides (V transposed included). Zero
 * `links` (`links_len >= N`), then call once per layer; pass the sums to
 * `kve_select_model_linked`. NaN/Inf in `values` or in `links[0..N]`, or a row whose
 * squared norm overflows f32, give `KVE_ERR_NON_FINITE`. Writes `links` and the
 * workspace; nothing on error.
 */
int32_t kve_accumulate_value_links(const struct kve_tensor *values,
                                   float *links,
                                   uint64_t links_len,
                                   void *workspace,
                                   uint64_t workspace_bytes);

/**
 * `x <- H x` on each block of `block` consecutive floats of `x` (`len` of them), in place:
 * H the orthonormal Walsh–Hadamard matrix (`ggml_gen_hadamard`'s; symmetric, `H H = I`).
 * An engine whose quantized cache stores K (or V) rows rotated so (llama.cpp's
 * `attn_rot_k`, `attn_rot_v`) rotates the window queries (or `Wo`'s inputs) before it
 * hands them to the evictor: the scores are those of the unrotated rows. `block` a power
 * of two and `len` a multiple of it (else `KVE_ERR_INVALID_ARGUMENT`). Results are
 * bit-identical to the plain f32 butterflies scaled by `1.0f / sqrtf(block)`. Writes `x`.
 */
int32_t kve_hadamard_blocks(float *x, uint64_t len, uint64_t block);

/**
 * Fill `*out` with the layout of one K or V tensor of an engine's pool:
 * `kind` a `KVE_PAGED_*` value, `data`/`len`/`dtype` the pool buffer (as `kve_tensor`),
 * `num_blocks`, `block_size` (tokens per block), `heads` (KV heads), `dim`.
 * `layers`/`layer` only for `KVE_PAGED_TRTLLM` (else 1 and 0); `kv` 0 (K) or 1 (V) only
 * for the stacked kinds (else 0): `KVE_ERR_INVALID_ARGUMENT` otherwise. The layout is
 * checked against the buffer as every paged call checks it; `*out` is written on success
 * only.
 */
int32_t kve_paged_layout_init(struct kve_paged_layout *out,
                              uint32_t kind,
                              const void *data,
                              uint64_t len,
                              uint32_t dtype,
                              uint64_t num_blocks,
                              uint64_t block_size,
                              uint64_t heads,
                              uint64_t dim,
                              uint64_t layers,
                              uint64_t layer,
                              uint32_t kv);

/**
 * Bytes of caller memory `kve_paged_gather` needs for a sequence of `n` tokens: the
 * table check (a bitmap over the pool's blocks) and the gathered `[heads, n, dim]` tensor.
 * Writes `*bytes` on success only.
 */
int32_t kve_paged_gather_size(const struct kve_paged_layout *layout, uint64_t n, uint64_t *bytes);

/**
 * Gather the first `n` tokens of a sequence (block table `table`, `table_len >=
 * ceil(n / block_size)` entries; entries past the sequence are not read) into `dst`
 * (`dst_bytes >= kve_paged_gather_size`), head-major `[heads, n, dim]` in the pool's
 * dtype (raw bits), and describe it in `*out`: a `kve_tensor` (strides `{n*dim, dim,
 * 1}`) to pass as `keys`/`values` to `kve_score_layer` and every other call that reads
 * K or V. Scores are bit-identical to the same data in any strided layout.
 * Table errors: an entry `>= num_blocks` `KVE_ERR_OUT_OF_BOUNDS`, a repeated entry
 * `KVE_ERR_ALIASING`, a table shorter than the sequence `KVE_ERR_SHAPE_MISMATCH`; `n = 0`
 * `KVE_ERR_INVALID_ARGUMENT`. `dst` and `out` must not overlap the pool, the table, the
 * layout or each other. `*out` is written on success only (`dst` is scratch on error).
 */
int32_t kve_paged_gather(const struct kve_paged_layout *layout,
                         const uint32_t *table,
                         uint64_t table_len,
                         uint64_t n,
                         void *dst,
                         uint64_t dst_bytes,
                         struct kve_tensor *out);

/**
 * Workspace bytes of `kve_paged_compact` (the table check: a bitmap over the blocks).
 */
int32_t kve_paged_compact_workspace_size(const struct kve_paged_layout *layout, uint64_t *bytes);

/**
 * Block-aligned compaction in place: the sequence's kept tokens move to the front of its
 * own blocks (tokens `0 .. count`, order kept), so its table entries
 * `table[ceil(max count / block_size) .. ceil(n / block_size)]` hold nothing any more:
 * `*blocks_freed` of them, for the engine's block manager to release.
 *
 * Kept lists as `kve_compact_in_place`'s (ascending, `< n`, offsets absolute into
 * `indices`): `offsets_len = heads + 1` (one list per head: `kve_select_model`'s
 * `offsets + l*hkv`), or `offsets_len = 2`: one list for every head (token granularity,
 * the one that frees blocks where a block holds every head). `positions` (NULL with 0, or
 * `n` entries: the tokens' original positions; NULL means token `i` is at position `i`)
 * and `kept_positions` (NULL with 0, or as many entries as the lists hold: receives the
 * kept tokens' positions in list order, for RoPE/position bookkeeping); `lengths` (NULL
 * with 0, or `heads` entries: the new lengths). Call it for K and V of every layer with
 * the same lists. Everything is checked before the first byte moves; on error nothing is
 * written (pool, outputs, `*blocks_freed`).
 */
int32_t kve_paged_compact(const struct kve_paged_layout *layout,
                          const uint32_t *table,
                          uint64_t table_len,
                          uint64_t n,
                          const uint64_t *offsets,
                          uint64_t offsets_len,
                          const uint32_t *indices,
                          uint64_t indices_len,
                          const uint32_t *positions,
                          uint64_t positions_len,
                          uint32_t *kept_positions,
                          uint64_t kept_positions_len,
                          uint32_t *lengths,
                          uint64_t lengths_len,
                          uint64_t *blocks_freed,
                          void *workspace,
                          uint64_t workspace_bytes);

/**
 * Fill `params` with the defaults of a scoring preset (`KVE_PRESET_*`).
 *
 * `struct_size`: `sizeof(kve_score_params)` as the caller sees it; the library writes
 * that many bytes. Returns `KVE_ERR_BAD_ENUM` for an unknown preset,
 * `KVE_ERR_INVALID_ARGUMENT` for a `struct_size` that is not a released size
 * (`KVE_SCORE_PARAMS_V1_SIZE`, `KVE_SCORE_PARAMS_V2_SIZE`). Writes only `params`.
 */
int32_t kve_score_params_init(struct kve_score_params *params,
                              uint32_t struct_size,
                              uint32_t preset);

/**
 * Fill `params` for an allocator (`KVE_ALLOCATOR_*`) at a granularity
 * (`KVE_GRANULARITY_*`) with the design §4 defaults: alpha 0.2, beta 20, layer-sum
 * normalisation, no post pooling. `budget`: average prefix tokens per (layer, KV head).
 * Writes only `params` (`struct_size` bytes).
 */
int32_t kve_select_params_init(struct kve_select_params *params,
                               uint32_t struct_size,
                               uint32_t allocator,
                               uint32_t granularity,
                               uint64_t budget);

/**
 * Fill `params` with LaProx-span's selection (design §3): global allocator, token
 * granularity (one token set for the whole model), forward post pooling (k = 9,
 * decay 1.0) with position 0 left out of it (`post_pool_sinks` = 1). Use with the
 * `KVE_PRESET_LAPROX_SPAN` scorer. Writes only `params`.
 */
int32_t kve_select_params_init_laprox_span(struct kve_select_params *params,
                                           uint32_t struct_size,
                                           uint64_t budget);

/**
 * Fill `params` with the selection preset `preset` (`KVE_PRESET_*`) gets by default
 * (the library's one preset table): LAVa's allocator for lava, the global one for laprox,
 * LaProx-span's selection for laprox-span and uniqueness, uniform per head otherwise.
 * `budget`: average prefix tokens per (layer, KV head). Writes only `params`.
 */
int32_t kve_select_params_init_preset(struct kve_select_params *params,
                                      uint32_t struct_size,
                                      uint32_t preset,
                                      uint64_t budget);

/**
 * Budget for a capacity `C` per KV head with the window inside it (SnapKV / AdaKV /
 * PyramidKV convention): `max(C - window, 0)`.
 */
uint64_t kve_budget_from_capacity(uint64_t capacity, uint64_t window);

/**
 * Budget keeping `floor(n * ratio)` tokens per head with the window counted inside that
 * total (kvpress convention): `max(floor(n * r) - min(window, n), 0)` with `r` the ratio
 * clamped to [0, 1]. `+INFINITY` counts as 1 (keep everything), `-INFINITY` and NaN as 0
 * (keep only the window).
 */
uint64_t kve_budget_keep_ratio_total(uint64_t n, uint64_t window, double ratio);

/**
 * Budget keeping `floor((n - window) * r)` prefix tokens (the window on top), `r` the
 * ratio clamped to [0, 1]: `+INFINITY` counts as 1, `-INFINITY` and NaN as 0.
 */
uint64_t kve_budget_keep_ratio_prefix(uint64_t n, uint64_t window, double ratio);

/**
 * Set everything in `round` absent and its `struct_size` (`KVE_EVICTOR_ROUND_V1_SIZE`
 * or `KVE_EVICTOR_ROUND_V2_SIZE`).
 * Writes only `round`.
 */
int32_t kve_evictor_round_init(struct kve_evictor_round *round, uint32_t struct_size);

/**
 * Run a whole round on sequence `seq` of a context configured with `paged = 1`
 * (`paged_dtype` at least the K/V element size; `KVE_ERR_INVALID_ARGUMENT` otherwise;
 * any context for `cells` NULL):
 * begin it over `round`'s cells, mark them, gather and score every layer (its tensors
 * from the arrays or from `fill`), select, and
 * write the kept cells (indices into `round->cells`, ascending: position order) to
 * `kept` (`len` at least `n_cells`, room for every cell, else `KVE_ERR_OUTPUT_TOO_SMALL`
 * before the round begins) and their count to `*count`. Kept sets and scores are bit-identical to the step-by-step
 * calls over the same cells given as strided views. The engine then drops the other
 * cells (or moves the kept ones) and calls `kve_evictor_commit`. Host memory only; per
 * layer `Wo` (`KVE_WO_EVERY_ROUND`) and row log-sum-exp are not taken (the step-by-step
 * calls take them). Every argument above is checked before the round begins: such an
 * error writes nothing. An error found once the round has begun — a layer's tensors from
 * `fill` refused, `fill` returning nonzero (`KVE_ERR_CALLBACK`: `fill` is not called
 * again), or what only a layer's scoring finds (queries the scorer refuses, too few window
 * queries observed, `Wo` not given) — leaves the round begun with the layers before it
 * scored, as the step-by-step calls would; `kept`/`count` are written only on success,
 * and the next round (or `kve_evictor_seq_reset`) starts clean.
 */
int32_t kve_evictor_run_round(struct kve_evictor *evictor,
                              uint64_t seq,
                              const struct kve_evictor_round *round,
                              uint32_t *kept,
                              uint64_t len,
                              uint64_t *count);

/**
 * Set every tensor of `inputs` absent and its `struct_size` (pass
 * `sizeof(kve_layer_inputs)`). Writes only `inputs`.
 */
int32_t kve_layer_inputs_init(struct kve_layer_inputs *inputs, uint32_t struct_size);

/**
 * Workspace bytes `kve_score_layer` needs for a layer of this shape: `hq` query heads,
 * `hkv` KV heads, `n` cached tokens (window included), key and value dims `dk`, `dv`
 * (pass `dv = dk` when the scorer reads no values). Writes only `*out_bytes`.
 */
int32_t kve_score_workspace_size(const struct kve_score_params *params,
                                 uint64_t hq,
                                 uint64_t hkv,
                                 uint64_t n,
                                 uint64_t dk,
                                 uint64_t dv,
                                 uint64_t *out_bytes);

/**
 * Floats `kve_score_layer` writes: `hkv * P` with `P = n - min(window, n)` prefix
 * tokens. Writes only `*out_len`.
 */
int32_t kve_score_output_len(const struct kve_score_params *params,
                             uint64_t hkv,
                             uint64_t n,
                             uint64_t *out_len);

/**
 * Score one layer: one f32 score per (KV head, prefix token), written to
 * `out[kh * P + i]` for `kh < Hkv`, `i < P = N - min(window, N)` (window tokens are
 * always kept and get no score). Larger = more worth keeping.
 *
 * `out_len` (floats) must be at least `kve_score_output_len`, `workspace_bytes` at least
 * `kve_score_workspace_size` (which includes room to stage the scores, so that `out` is
 * written only on success); the workspace is scratch (any alignment; its contents
 * after the call are unspecified). Reads the tensors of `inputs` only; writes `out`
 * (first `Hkv*P` floats) and the workspace. NaN/Inf in what the scorer reads gives
 * `KVE_ERR_NON_FINITE`; a window longer than the queries supplied,
 * `KVE_ERR_INVALID_ARGUMENT`.
 *
 * CriticalKV scores the `critical_first_stage` tokens its first stage forces as
 * `FLT_MAX` (kvpress's convention), the others `(s + 1e-4) * value_l1`: the forced ones
 * rank first in `kve_select_model`. Compare or select such scores as they are; scaling
 * them up overflows, and summing heads (layer granularity) saturates forced tokens to
 * +INF, which still ranks them first.
 */
int32_t kve_score_layer(const struct kve_score_params *params,
                        const struct kve_layer_inputs *inputs,
                        float *out,
                        uint64_t out_len,
                        void *workspace,
                        uint64_t workspace_bytes);

/**
 * Workspace bytes `kve_window_row_lse` needs: `hq` query heads, `hkv` KV heads, `n`
 * cached tokens, key dim `dk`, observation window `window` (>= 1). Writes only
 * `*out_bytes`.
 */
int32_t kve_window_row_lse_workspace_size(uint64_t hq,
                                          uint64_t hkv,
                                          uint64_t n,
                                          uint64_t dk,
                                          uint32_t window,
                                          uint64_t *out_bytes);

/**
 * The window rows' log-sum-exp, the `row_lse` input of `kve_layer_inputs`:
 * `out[h * w + j] = ln sum_{i visible} exp(q_{h,j} . k_{h/g,i} / sqrt(dk))` for query
 * heads `h < Hq` and the last `w = min(window, N)` rows `j` of `queries` (`[Hq, wq, dk]`,
 * `wq >= w`); `keys` `[Hkv, N, dk]`; keys `i <= N - w + j` are visible. The first of
 * the two passes over K that `kve_score_layer` makes without it, for engines that do not
 * get `softmax_lse` from flash attention. `out_len` >= `Hq * w` (only those are
 * written), `workspace_bytes` >= `kve_window_row_lse_workspace_size`. Rejects NaN/Inf in
 * the queries or keys before writing `out`.
 */
int32_t kve_window_row_lse(const struct kve_tensor *queries,
                           const struct kve_tensor *keys,
                           uint32_t window,
                           float *out,
                           uint64_t out_len,
                           void *workspace,
                           uint64_t workspace_bytes);

/**
 * Floats of the Gram output `[Hkv][blocks][dv][dv]`: `blocks = g` (`cross = 0`, for
 * LaProx's default sum GQA) or `g + g(g-1)/2` (`cross = 1`, for exact / mean-attn),
 * `g = hq / hkv`. `KVE_ERR_OVERFLOW` when their byte size does not fit `PTRDIFF_MAX`.
 * Writes only `*out_len`.
 */
int32_t kve_gram_len(uint64_t hq, uint64_t hkv, uint64_t dv, uint32_t cross, uint64_t *out_len);

/**
 * Workspace bytes of `kve_compute_gram` for value dim `dv` and model dim `d_model`.
 * Writes only `*out_bytes`.
 */
int32_t kve_gram_workspace_size(uint64_t dv, uint64_t d_model, uint64_t *out_bytes);

/**
 * LaProx's Gram matrices `G_ab = Wo_a Wo_bᵀ` of one layer, computed once per model
 * (f64 sums). `wo` is `[Hq, dv, D]` (head, row, col); for PyTorch's `o_proj.weight`
 * (`[D, Hq*dv]` row-major) use strides `{dv, 1, Hq*dv}`. `hkv` KV heads; `cross` 0/1 as
 * in `kve_gram_len`. Writes `out` (`kve_gram_len` floats) and the workspace; rejects
 * NaN/Inf in `wo`, and finite `wo` whose Gram entries overflow f32 (rows with
 * `|row|² > FLT_MAX`), with `KVE_ERR_NON_FINITE` before writing.
 */
int32_t kve_compute_gram(const struct kve_tensor *wo,
                         uint64_t hkv,
                         uint32_t cross,
                         float *out,
                         uint64_t out_len,
                         void *workspace,
                         uint64_t workspace_bytes);

/**
 * Floats of the value-form cache `[Hkv][blocks][N]` (blocks as in `kve_gram_len`).
 * `KVE_ERR_OVERFLOW` when their byte size does not fit `PTRDIFF_MAX` (no buffer could
 * hold them). Writes only `*out_len`.
 */
int32_t kve_value_forms_len(uint64_t hq,
                            uint64_t hkv,
                            uint64_t n,
                            uint32_t cross,
                            uint64_t *out_len);

/**
 * Fill token columns `t0 .. t1` of LaProx's value-form cache (`v G vᵀ` per token and
 * Gram block) from `values` (`[Hkv, N, dv]`) and a Gram from `kve_compute_gram` with
 * the same `hq` and `cross`. An engine can call it as tokens enter the cache; other
 * columns of `out` are not touched. Writes only those columns of `out`
 * (`kve_value_forms_len` floats). Rejects NaN/Inf in the values read and in the Gram,
 * and finite inputs whose forms overflow f32, with `KVE_ERR_NON_FINITE` before writing.
 */
int32_t kve_compute_value_forms(const struct kve_tensor *values,
                                const float *gram,
                                uint64_t gram_len,
                                uint64_t hq,
                                uint32_t cross,
                                uint64_t t0,
                                uint64_t t1,
                                float *out,
                                uint64_t out_len);

/**
 * Workspace bytes of `kve_compute_value_l1`. Writes only `*out_bytes`.
 */
int32_t kve_value_l1_workspace_size(uint64_t dv, uint64_t d_model, uint64_t *out_bytes);

/**
 * CriticalKV's value term `mean_{h in group} ||v_i Wo_h||_1` for every token:
 * `out[kh * N + i]`, `Hkv * N` floats. `values` `[Hkv, N, dv]`, `wo` `[Hq, dv, D]`.
 * Writes `out` and the workspace; rejects NaN/Inf in `values` and `wo`, and finite
 * inputs whose norms overflow f32, with `KVE_ERR_NON_FINITE` before writing.
 */
int32_t kve_compute_value_l1(const struct kve_tensor *values,
                             const struct kve_tensor *wo,
                             float *out,
                             uint64_t out_len,
                             void *workspace,
                             uint64_t workspace_bytes);

/**
 * Element counts of `kve_select_model`'s outputs: `*offsets_len = layers*hkv + 1`
 * (uint64) and `*indices_len` (uint32) enough for every kept position. Writes only the
 * two out-parameters.
 */
int32_t kve_select_output_len(const struct kve_select_params *params,
                              uint64_t layers,
                              uint64_t hkv,
                              uint64_t n,
                              uint64_t window,
                              uint64_t *offsets_len,
                              uint64_t *indices_len);

/**
 * Workspace bytes of `kve_select_model`. Writes only `*out_bytes`.
 */
int32_t kve_select_workspace_size(const struct kve_select_params *params,
                                  uint64_t layers,
                                  uint64_t hkv,
                                  uint64_t n,
                                  uint64_t window,
                                  uint64_t *out_bytes);

/**
 * Select the kept positions of every (layer, KV head) of the model in one call.
 *
 * Output, CSR: the kept positions of unit `u = l * hkv + kh` are
 * `indices[offsets[u] .. offsets[u+1]]`, ascending — chosen prefix tokens, then the whole
 * window; `offsets[layers*hkv]` is the total written. With a shared granularity every
 * head of a layer (layer) or of the model (token) has the same list. Budgets larger
 * than a unit's prefix keep all of it (clamped, never an error). Ties keep the later
 * position. Writes `offsets`, `indices` and the workspace; nothing on error.
 */
int32_t kve_select_model(const struct kve_select_params *params,
                         const struct kve_model_scores *scores,
                         uint64_t *offsets,
                         uint64_t offsets_len,
                         uint32_t *indices,
                         uint64_t indices_len,
                         void *workspace,
                         uint64_t workspace_bytes);

/**
 * `kve_select_model` whose forward post-pool carries each continuation on through linked
 * positions, so it never ends inside a run of similar values (a number longer than the
 * kernel): position `i` continues `i - 1` when `links[i] / (layers * hkv)` exceeds
 * `link_threshold` (LaProx-span: 0.5). `links`: exactly `n` floats, the sums written by
 * `kve_accumulate_value_links` over every layer of the scores (else
 * `KVE_ERR_SHAPE_MISMATCH`; NaN/Inf: `KVE_ERR_NON_FINITE`). The post-pool must be
 * `KVE_POOL_FORWARD` with decay 1 and the threshold finite (else
 * `KVE_ERR_INVALID_ARGUMENT`). Same workspace and outputs as `kve_select_model`; nothing
 * written on error. The device form: `kve_cuda_select_model_linked`; sharded:
 * `kve_search_count_shard_linked` and `kve_select_shard_linked`.
 */
int32_t kve_select_model_linked(const struct kve_select_params *params,
                                const struct kve_model_scores *scores,
                                const float *links,
                                uint64_t links_len,
                                float link_threshold,
                                uint64_t *offsets,
                                uint64_t offsets_len,
                                uint32_t *indices,
                                uint64_t indices_len,
                                void *workspace,
                                uint64_t workspace_bytes);

/**
 * Positions `p < prefix` missing from an ascending kept list: what an engine whose
 * cache cell serves every head and layer (llama.cpp) evicts, one
 * `llama_memory_seq_rm(mem, seq, p, p + 1)` each. `kept`: strictly ascending positions
 * (e.g. one unit's slice of `kve_select_model`'s `indices`; entries `>= prefix` are
 * ignored). `prefix <= 2^31`. Writes the ascending evicted positions to `out`
 * (`out_len` must hold them all: at most `prefix`) and their count to `*out_count`.
 */
int32_t kve_evicted_positions(const uint32_t *kept,
                              uint64_t kept_len,
                              uint64_t prefix,
                              uint32_t *out,
                              uint64_t out_len,
                              uint64_t *out_count);

/**
 * Start a search for the model of `layers` layers (all shards together). Sharded
 * selection supports the `KVE_ALLOCATOR_GLOBAL` allocator at head or layer granularity
 * (others: `KVE_ERR_INVALID_ARGUMENT`; they either need no cross-layer search or need
 * all scores in one place — use `kve_select_model`). The state records `layers`, `hkv`,
 * `n`, `min(window, n)` and the parameters. `search` must not overlap `params`
 * (`KVE_ERR_ALIASING`). Writes only `*search`.
 */
int32_t kve_search_init(struct kve_search *search,
                        const struct kve_select_params *params,
                        uint64_t layers,
                        uint64_t hkv,
                        uint64_t n,
                        uint64_t window);

/**
 * Zero a histogram (counts, round and layers). Writes only `*hist`.
 */
int32_t kve_histogram_clear(struct kve_histogram *hist);

/**
 * Workspace bytes of `kve_search_count_shard` and `kve_select_shard` for a shard of
 * `layers` layers. Writes only `*out_bytes`.
 */
int32_t kve_select_shard_workspace_size(const struct kve_select_params *params,
                                        uint64_t layers,
                                        uint64_t hkv,
                                        uint64_t n,
                                        uint64_t window,
                                        uint64_t *out_bytes);

/**
 * Add a shard's candidates to `hist` for the search's next digit. `shard` holds layers
 * `first_layer .. first_layer + shard->layers` of the model (global layer numbering
 * decides ties). Every shard of one round counts with the same `search`, into an empty
 * histogram or one counted for the same round (else `KVE_ERR_INVALID_ARGUMENT`); the
 * histogram records the round and the layers counted. `params` must be
 * `kve_search_init`'s (else `KVE_ERR_INVALID_ARGUMENT`), the shard of the same `hkv`,
 * `n` and window and inside the model's layers (else `KVE_ERR_SHAPE_MISMATCH`). `hist`
 * and the workspace must not overlap the scores or any struct argument. Writes `hist`
 * (added to, not cleared) and the workspace.
 */
int32_t kve_search_count_shard(const struct kve_select_params *params,
                               const struct kve_model_scores *shard,
                               uint64_t first_layer,
                               const struct kve_search *search,
                               struct kve_histogram *hist,
                               void *workspace,
                               uint64_t workspace_bytes);

/**
 * `kve_search_count_shard` for the linked selection (`kve_select_model_linked`'s
 * forward post-pool carried on through linked positions): `links`, exactly `n` floats,
 * are the sums over EVERY layer of the model — each shard accumulates its own layers
 * with `kve_accumulate_value_links`, the caller adds the shards' sums — and every shard
 * of the search passes the same `links` and `link_threshold` to this and to
 * `kve_select_shard_linked`. Link rules as `kve_select_model_linked`'s: length
 * `KVE_ERR_SHAPE_MISMATCH`, NaN/Inf `KVE_ERR_NON_FINITE`, a post-pool other than
 * forward with decay 1 or a non-finite threshold `KVE_ERR_INVALID_ARGUMENT`. With one
 * shard holding every layer the lists are `kve_select_model_linked`'s. `links` must not
 * overlap `hist` or the workspace. Writes `hist` and the workspace; nothing on error.
 */
int32_t kve_search_count_shard_linked(const struct kve_select_params *params,
                                      const struct kve_model_scores *shard,
                                      uint64_t first_layer,
                                      const struct kve_search *search,
                                      const float *links,
                                      uint64_t links_len,
                                      float link_threshold,
                                      struct kve_histogram *hist,
                                      void *workspace,
                                      uint64_t workspace_bytes);

/**
 * `dst.bins[i] += src.bins[i]` (saturating), and the layers counted. The two must not
 * overlap (`KVE_ERR_ALIASING`) and, unless one is empty, be counted for the same round
 * (`KVE_ERR_INVALID_ARGUMENT`). Writes only `dst`.
 */
int32_t kve_histogram_merge(struct kve_histogram *dst, const struct kve_histogram *src);

/**
 * Fix the next digit of the search from the histogram merged over every shard.
 * `*done` (may be NULL) becomes 1 when the threshold is known: then apply it with
 * `kve_select_shard`. At most 13 rounds, usually 4. While the search runs, `hist` must
 * be counted for its current round (else `KVE_ERR_INVALID_ARGUMENT`) over every layer
 * of the model exactly once (else `KVE_ERR_SHAPE_MISMATCH`); a finished search ignores
 * `hist`. Writes `*search` and `*done`.
 */
int32_t kve_search_step(struct kve_search *search, const struct kve_histogram *hist, int32_t *done);

/**
 * The threshold of a finished search as a (normalised) score: candidates scoring above
 * it are kept, ties at it are decided by position and unit. `-INFINITY` when every
 * candidate is kept, `+INFINITY` when none is. `KVE_ERR_INVALID_ARGUMENT` while the
 * search is running. Writes only `*score`.
 */
int32_t kve_search_threshold(const struct kve_search *search, float *score);

/**
 * Element counts always enough for `kve_select_shard`'s outputs: `layers*hkv + 1`
 * offsets and `layers*hkv*n` indices (the call accepts any `indices` that holds what it
 * keeps). Writes only the two out-parameters.
 */
int32_t kve_select_shard_output_len(uint64_t layers,
                                    uint64_t hkv,
                                    uint64_t n,
                                    uint64_t *offsets_len,
                                    uint64_t *indices_len);

/**
 * Apply a finished search to a shard: the kept positions of its (layer, KV head) pairs
 * as CSR, exactly as `kve_select_model` would report them for those layers (offsets
 * count from this call's `indices`). `params` and the shard are checked against the
 * search as in `kve_search_count_shard`. Writes `offsets`, `indices` and the workspace.
 */
int32_t kve_select_shard(const struct kve_select_params *params,
                         const struct kve_model_scores *shard,
                         uint64_t first_layer,
                         const struct kve_search *search,
                         uint64_t *offsets,
                         uint64_t offsets_len,
                         uint32_t *indices,
                         uint64_t indices_len,
                         void *workspace,
                         uint64_t workspace_bytes);

/**
 * `kve_select_shard` for the linked selection: `links` and `link_threshold` as given to
 * `kve_search_count_shard_linked` (the same rules and statuses). Writes `offsets`,
 * `indices` and the workspace; nothing on error.
 */
int32_t kve_select_shard_linked(const struct kve_select_params *params,
                                const struct kve_model_scores *shard,
                                uint64_t first_layer,
                                const struct kve_search *search,
                                const float *links,
                                uint64_t links_len,
                                float link_threshold,
                                uint64_t *offsets,
                                uint64_t offsets_len,
                                uint32_t *indices,
                                uint64_t indices_len,
                                void *workspace,
                                uint64_t workspace_bytes);

/**
 * Fill `params` with the defaults (max attention, GQA max, no pooling) and its
 * `struct_size` (pass `sizeof(kve_stream_score_params)`). Writes only `params`.
 */
int32_t kve_stream_score_params_init(struct kve_stream_score_params *params, uint32_t struct_size);

/**
 * Bytes of a stream state for a layer of `hq` query heads, `hkv` KV heads, `n` cached
 * tokens and key dim `dk` (`dk <= 1024`, `hq` a multiple of `hkv`). Writes only
 * `*out_bytes`. One rule for `state_bytes` in every stream call (init, feed, count,
 * stats, scores): fewer than this size for the state's shape is
 * `KVE_ERR_INVALID_ARGUMENT` (the buffer is not a state of that shape).
 */
int32_t kve_stream_state_size(uint64_t hq,
                              uint64_t hkv,
                              uint64_t n,
                              uint64_t dk,
                              uint64_t *out_bytes);

/**
 * Start an empty stream in `state` (8-byte aligned, `state_bytes` at least
 * `kve_stream_state_size`, else `KVE_ERR_INVALID_ARGUMENT` as every stream call). The state is plain bytes (no pointers): it may be copied,
 * saved and restored. Writes only `state`.
 */
int32_t kve_stream_init(void *state,
                        uint64_t state_bytes,
                        uint64_t hq,
                        uint64_t hkv,
                        uint64_t n,
                        uint64_t dk);

/**
 * Workspace bytes `kve_stream_feed` needs for chunks of up to `chunk` queries. Writes
 * only `*out_bytes`.
 */
int32_t kve_stream_feed_workspace_size(uint64_t hq,
                                       uint64_t hkv,
                                       uint64_t n,
                                       uint64_t dk,
                                       uint64_t chunk,
                                       uint64_t *out_bytes);

/**
 * Feed `c` queries into the stream: `queries` `[Hq, c, dk]` (post-RoPE), `positions[c]`
 * (`>= 0`, non-decreasing within the chunk and after every position fed before),
 * `keys` `[Hkv, N, dk]` with the shape the state was started for. A query at position
 * `p` sees keys `i <= min(p, N-1)`, softmax over them in f32 (design §2, scale 1/sqrt(dk)).
 * `row_lse` (NULL, 0 when absent): exactly `Hq*c` floats `[Hq][c]`, each row's natural-log
 * log-sum-exp over its visible keys (flash attention's `softmax_lse`); K is then read
 * once instead of twice. Errors, with the state unchanged: positions going backwards or
 * negative → `KVE_ERR_INVALID_ARGUMENT`; a state not started, or shorter than its shape's
 * `kve_stream_state_size` → `KVE_ERR_INVALID_ARGUMENT`; queries or keys of another shape
 * → `KVE_ERR_SHAPE_MISMATCH`; NaN/Inf in the queries, the
 * visible keys or `row_lse` → `KVE_ERR_NON_FINITE`. Writes `state` and the workspace.
 */
int32_t kve_stream_feed(void *state,
                        uint64_t state_bytes,
                        const struct kve_tensor *queries,
                        const int64_t *positions,
                        uint64_t positions_len,
                        const struct kve_tensor *keys,
                        const float *row_lse,
                        uint64_t row_lse_len,
                        void *workspace,
                        uint64_t workspace_bytes);

/**
 * Queries fed into `state` so far. A buffer that is not a started state, or is shorter
 * than its shape's `kve_stream_state_size` → `KVE_ERR_INVALID_ARGUMENT`. Writes only
 * `*out_count`.
 */
int32_t kve_stream_query_count(const void *state, uint64_t state_bytes, uint64_t *out_count);

/**
 * Workspace bytes `kve_stream_scores` needs. Writes only `*out_bytes`.
 */
int32_t kve_stream_scores_workspace_size(uint64_t hq,
                                         uint64_t hkv,
                                         uint64_t n,
                                         uint64_t dk,
                                         uint64_t *out_bytes);

/**
 * Finish the stream into `out[kh*N + i]`, one score per KV head and key, for all `N`
 * keys (the stream has no window: select with window 0; larger = keep). `out_len` at
 * least `hkv*N`. LaProx's value term (`KVE_STREAM_STAT_LAPROX` only, ignored otherwise):
 * `value_forms` `[Hkv][g][N]` from `kve_compute_value_forms` with `cross = 0`, or
 * `values` `[Hkv, N, dv]` (NULL for absent) with `gram` from `kve_compute_gram` with
 * `cross = 0`; `value_forms` beside `values` or `gram` is `KVE_ERR_INVALID_ARGUMENT`
 * (one value term, never one ignored, as `kve_layer_inputs`). `KVE_STREAM_STAT_MEAN`, `_MEAN_VISIBLE` and `_LAPROX` on a stream that has
 * seen no query give `KVE_ERR_INVALID_ARGUMENT`. Reads `state`; writes `out` (only on
 * success) and the workspace.
 */
int32_t kve_stream_scores(const void *state,
                          uint64_t state_bytes,
                          const struct kve_stream_score_params *params,
                          const struct kve_tensor *values,
                          const float *gram,
                          uint64_t gram_len,
                          const float *value_forms,
                          uint64_t value_forms_len,
                          float *out,
                          uint64_t out_len,
                          void *workspace,
                          uint64_t workspace_bytes);

/**
 * Copy the raw statistics of `state` out, for callers that finish them their own way:
 * `out_max`, `out_sum`, `out_sq` (`len` floats each, at least `Hq*N`; `[Hq][N]`:
 * `max_j A`, `Σ_j A`, `Σ_j A²` per query head and key) and `out_seen` (`seen_len` u64, at
 * least `N`: how many fed queries had key `i` as their last visible key, so that
 * `Σ_{i' >= i} seen[i']` queries saw key `i`). Writes the first `Hq*N` (`N`) elements of
 * each, only on success.
 */
int32_t kve_stream_stats(const void *state,
                         uint64_t state_bytes,
                         float *out_max,
                         float *out_sum,
                         float *out_sq,
                         uint64_t len,
                         uint64_t *out_seen,
                         uint64_t seen_len);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* KVEVICT_H */
