/* LaProx-span token eviction over a cache laid out the way llama.cpp keeps it.
 *
 * Per layer llama.cpp stores K as rows [kv_size][Hkv*d] and, by default, V transposed
 * as [Hkv*d][kv_size], both f16. One cache cell (a position of a sequence) serves every
 * head and every layer, so the selection is at token granularity: one set of positions
 * for the whole model, and the engine frees the others.
 *
 * The library only reads the cache. It needs, per layer, the post-RoPE queries of the
 * last `window` positions (an engine captures them while decoding the prompt's tail:
 * llama.cpp's `Qcur` after `ggml_rope_ext`, e.g. through a ggml eval callback) and, for
 * LaProx, the layer's output projection `wo` (ggml `[n_embd_head*n_head, n_embd]`, i.e.
 * row-major `[D][Hq*d]` like PyTorch's o_proj.weight) turned into Gram matrices once.
 *
 * The selection's continuation runs on through value links (how much each cell's value
 * continues the previous one's), so a value longer than the continuation is kept whole.
 *
 * Build: cc -std=c99 -I include llama_cpp_layout.c libkvevict.a -lpthread -ldl -lm
 */
#include "common.h"

enum { LAYERS = 4, HQ = 4, HKV = 2, D_HEAD = 16, D_MODEL = 64, KV_SIZE = 200, WINDOW = 32 };
/* A "needle" the window's queries look at: these cells must survive. */
enum { NEEDLE_AT = 40, NEEDLE_LEN = 3 };
/* After it, a value no query reads, longer than the selection's 9-cell continuation (a
 * long number): its cells have similar values, which the value links see. */
enum { RUN_AT = 43, RUN_LEN = 12 };

int main(void) {
    const uint64_t n = KV_SIZE, w = WINDOW, p = KV_SIZE - WINDOW;
    printf("kvevict %s, llama.cpp layout: %d layers, Hq=%d, Hkv=%d, d=%d, %d cells, window %d\n",
           kve_version_string(), LAYERS, HQ, HKV, D_HEAD, KV_SIZE, WINDOW);

    /* ---- the engine's cache and tensors (synthetic) ---- */
    uint16_t* k_cache[LAYERS]; /* [kv_size][Hkv*d] f16 */
    uint16_t* v_cache[LAYERS]; /* [Hkv*d][kv_size] f16, transposed */
    float* q_win[LAYERS];      /* [Hq][window][d] post-RoPE queries */
    float* wo[LAYERS];         /* [D_MODEL][Hq*d] */
    for (int l = 0; l < LAYERS; l++) {
        k_cache[l] = xmalloc(sizeof(uint16_t) * KV_SIZE * HKV * D_HEAD);
        v_cache[l] = xmalloc(sizeof(uint16_t) * KV_SIZE * HKV * D_HEAD);
        q_win[l] = xmalloc(sizeof(float) * HQ * WINDOW * D_HEAD);
        wo[l] = xmalloc(sizeof(float) * D_MODEL * HQ * D_HEAD);
        for (int i = 0; i < HQ * WINDOW * D_HEAD; i++) q_win[l][i] = rnd();
        for (int i = 0; i < D_MODEL * HQ * D_HEAD; i++) wo[l][i] = 0.2f * rnd();
        float dir[HKV * D_HEAD]; /* the run's common value direction */
        for (int i = 0; i < HKV * D_HEAD; i++) dir[i] = rnd();
        for (int t = 0; t < KV_SIZE; t++)
            for (int h = 0; h < HKV; h++)
                for (int c = 0; c < D_HEAD; c++) {
                    float kv = 0.5f * rnd();
                    float vv = rnd();
                    if (t >= RUN_AT && t < RUN_AT + RUN_LEN) vv = dir[h * D_HEAD + c] + 0.1f * rnd();
                    /* needle keys point along the first query head of their group */
                    if (t >= NEEDLE_AT && t < NEEDLE_AT + NEEDLE_LEN)
                        kv = 2.0f * q_win[l][((h * (HQ / HKV)) * WINDOW + WINDOW - 1) * D_HEAD + c];
                    k_cache[l][t * HKV * D_HEAD + h * D_HEAD + c] = f32_to_f16(kv);
                    v_cache[l][(h * D_HEAD + c) * KV_SIZE + t] = f32_to_f16(vv);
                }
    }

    /* ---- configuration: LaProx-span, keep 10% of the prefix ---- */
    kve_score_params sp;
    CHECK(kve_score_params_init(&sp, (uint32_t)sizeof sp, KVE_PRESET_LAPROX_SPAN));
    sp.window = WINDOW;
    kve_select_params sel;
    uint64_t budget = kve_budget_keep_ratio_prefix(n, w, 0.10);
    CHECK(kve_select_params_init_laprox_span(&sel, (uint32_t)sizeof sel, budget));
    printf("budget: keep %llu of %llu prefix cells (+%llu window cells)\n",
           (unsigned long long)budget, (unsigned long long)p, (unsigned long long)w);

    /* ---- once per model: Gram matrices of wo (LaProx's value-output norms) ---- */
    uint64_t gram_len, gram_ws;
    CHECK(kve_gram_len(HQ, HKV, D_HEAD, 0, &gram_len));
    CHECK(kve_gram_workspace_size(D_HEAD, D_MODEL, &gram_ws));
    float* gram[LAYERS];
    void* ws = xmalloc(gram_ws);
    for (int l = 0; l < LAYERS; l++) {
        kve_tensor t_wo = {wo[l], (uint64_t)D_MODEL * HQ * D_HEAD, KVE_DTYPE_F32, 0,
                           {HQ, D_HEAD, D_MODEL}, {D_HEAD, 1, HQ * D_HEAD}};
        gram[l] = xmalloc(sizeof(float) * gram_len);
        CHECK(kve_compute_gram(&t_wo, HKV, 0, gram[l], gram_len, ws, gram_ws));
    }
    free(ws);

    /* ---- per layer: scores [L][Hkv][P] and the value links [n] ---- */
    uint64_t score_len, score_ws, links_ws;
    CHECK(kve_score_output_len(&sp, HKV, n, &score_len));
    CHECK(kve_score_workspace_size(&sp, HQ, HKV, n, D_HEAD, D_HEAD, &score_ws));
    CHECK(kve_value_links_workspace_size(n, D_HEAD, &links_ws));
    float* scores = xmalloc(sizeof(float) * score_len * LAYERS);
    float* links = xmalloc(sizeof(float) * n);
    for (uint64_t i = 0; i < n; i++) links[i] = 0.0f;
    ws = xmalloc(score_ws > links_ws ? score_ws : links_ws);
    for (int l = 0; l < LAYERS; l++) {
        kve_layer_inputs in;
        CHECK(kve_layer_inputs_init(&in, (uint32_t)sizeof in));
        kve_tensor q = {q_win[l], (uint64_t)HQ * WINDOW * D_HEAD, KVE_DTYPE_F32, 0,
                        {HQ, WINDOW, D_HEAD}, {WINDOW * D_HEAD, D_HEAD, 1}};
        /* K rows [kv_size][Hkv*d]: (head, token, dim) strides {d, Hkv*d, 1} */
        kve_tensor k = {k_cache[l], (uint64_t)KV_SIZE * HKV * D_HEAD, KVE_DTYPE_F16, 0,
                        {HKV, KV_SIZE, D_HEAD}, {D_HEAD, HKV * D_HEAD, 1}};
        /* V transposed [Hkv*d][kv_size]: strides {d*kv_size, 1, kv_size} */
        kve_tensor v = {v_cache[l], (uint64_t)KV_SIZE * HKV * D_HEAD, KVE_DTYPE_F16, 0,
                        {HKV, KV_SIZE, D_HEAD}, {D_HEAD * KV_SIZE, 1, KV_SIZE}};
        in.queries = q;
        in.keys = k;
        in.values = v;
        in.gram = gram[l];
        in.gram_len = gram_len;
        CHECK(kve_score_layer(&sp, &in, scores + l * score_len, score_len, ws, score_ws));
        CHECK(kve_accumulate_value_links(&v, links, n, ws, links_ws));
    }
    free(ws);

    /* ---- one token set for the whole model ---- */
    kve_model_scores ms = {scores, score_len * LAYERS, LAYERS, HKV, n, w};
    /* without the links first, for comparison */
    kept_lists sl = select_lists(&sel, &ms, 1);
    int run_plain = 0;
    for (uint64_t i = sl.offsets[0]; i < sl.offsets[1]; i++)
        if (sl.indices[i] >= RUN_AT && sl.indices[i] < RUN_AT + RUN_LEN) run_plain++;
    /* LaProx-span's threshold: mean link over layers and heads above 0.5 */
    CHECK(kve_select_model_linked(&sel, &ms, links, n, 0.5f, sl.offsets, sl.off_len, sl.indices,
                                  sl.idx_len, sl.ws, sl.ws_bytes));
    free(sl.ws);

    /* every unit holds the same list at token granularity: take (layer 0, head 0) */
    const uint32_t* kept = sl.indices + sl.offsets[0];
    uint64_t kept_len = sl.offsets[1] - sl.offsets[0];
    printf("kept prefix cells:");
    for (uint64_t i = 0; i < kept_len && kept[i] < p; i++) printf(" %u", kept[i]);
    printf("\n");

    uint32_t* evict = xmalloc(sizeof(uint32_t) * p);
    uint64_t n_evict;
    CHECK(kve_evicted_positions(kept, kept_len, p, evict, p, &n_evict));
    printf("evicting %llu of %d cells:", (unsigned long long)n_evict, KV_SIZE);
    for (uint64_t i = 0; i < n_evict; i++) {
        printf(" %u", evict[i]);
        /* The engine frees each cell without shifting positions (no RoPE re-rotation):
         *     llama_memory_t mem = llama_get_memory(ctx);
         *     llama_memory_seq_rm(mem, seq_id, evict[i], evict[i] + 1);
         * Consecutive positions can be merged into one call with a wider range. */
    }
    printf("\n");

    int needle_kept = 0;
    for (uint64_t i = 0; i < kept_len; i++)
        if (kept[i] >= NEEDLE_AT && kept[i] < NEEDLE_AT + NEEDLE_LEN) needle_kept++;
    printf("needle cells kept: %d of %d\n", needle_kept, NEEDLE_LEN);
    int run_kept = 0;
    for (uint64_t i = 0; i < kept_len; i++)
        if (kept[i] >= RUN_AT && kept[i] < RUN_AT + RUN_LEN) run_kept++;
    printf("value run cells kept: %d of %d (without value links: %d)\n", run_kept, RUN_LEN,
           run_plain);

    for (int l = 0; l < LAYERS; l++) {
        free(k_cache[l]); free(v_cache[l]); free(q_win[l]); free(wo[l]); free(gram[l]);
    }
    free(scores); free(links); free(sl.offsets); free(sl.indices); free(evict);
    return 0;
}
