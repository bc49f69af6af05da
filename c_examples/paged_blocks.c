/* A paged KV cache as vLLM / FlashInfer keep it: per layer one f16 pool
 * [NUM_BLOCKS][2][BLOCK][HKV][D] (K and V stacked in each block: KVE_PAGED_NHD_KV_INNER),
 * two sequences with shuffled block tables. Sequence 0 is scored question-agnostically
 * (uniqueness: keys and values only) through the paged views, one token set is selected
 * for the whole model (token granularity: the only one that frees blocks, since a block
 * holds every head), every layer's K and V are compacted in place in the sequence's own
 * blocks, and the trailing blocks go back to the engine's free list.
 *
 * Build: cc -std=c99 -I include paged_blocks.c libkvevict.a -lpthread -ldl -lm
 */
#include "common.h"

enum { LAYERS = 2, HKV = 2, D = 16, BLOCK = 16, NUM_BLOCKS = 24, N0 = 150, N1 = 70 };

int main(void) {
    const uint64_t pool_len = (uint64_t)NUM_BLOCKS * 2 * BLOCK * HKV * D;
    uint16_t* pool[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        pool[l] = xmalloc(sizeof(uint16_t) * pool_len);
        for (uint64_t i = 0; i < pool_len; i++) pool[l][i] = f32_to_f16(rnd());
    }
    /* the engine's block tables: sequence 0 holds 10 blocks, sequence 1 holds 5 */
    const uint32_t table0[10] = {17, 3, 9, 22, 0, 14, 6, 19, 11, 1};
    const uint32_t table1[5] = {5, 20, 8, 2, 12};
    const uint64_t blocks0 = (N0 + BLOCK - 1) / BLOCK;
    uint16_t* seq1_before = xmalloc(sizeof(uint16_t) * pool_len);
    memcpy(seq1_before, pool[1], sizeof(uint16_t) * pool_len);

    /* ---- one layout per (layer, K or V) ---- */
    kve_paged_layout kl[LAYERS][2];
    for (int l = 0; l < LAYERS; l++)
        for (uint32_t kv = 0; kv < 2; kv++)
            CHECK(kve_paged_layout_init(&kl[l][kv], KVE_PAGED_NHD_KV_INNER, pool[l], pool_len, KVE_DTYPE_F16,
                                        NUM_BLOCKS, BLOCK, HKV, D, 1, 0, kv));

    /* ---- score sequence 0: gather K and V of each layer, score as strided views ---- */
    kve_score_params sp;
    CHECK(kve_score_params_init(&sp, (uint32_t)sizeof sp, KVE_PRESET_UNIQUENESS));
    const uint64_t w = sp.window, p = N0 - w;
    uint64_t gbytes, slen, sws;
    CHECK(kve_paged_gather_size(&kl[0][0], N0, &gbytes));
    CHECK(kve_score_output_len(&sp, HKV, N0, &slen));
    CHECK(kve_score_workspace_size(&sp, HKV, HKV, N0, D, D, &sws));
    void* gk = xmalloc(gbytes);
    void* gv = xmalloc(gbytes);
    void* ws = xmalloc(sws);
    float* scores = xmalloc(sizeof(float) * slen * LAYERS);
    uint16_t* before[LAYERS][2]; /* the gathered rows, to check the compaction against */
    for (int l = 0; l < LAYERS; l++) {
        kve_layer_inputs in;
        CHECK(kve_layer_inputs_init(&in, (uint32_t)sizeof in));
        CHECK(kve_paged_gather(&kl[l][0], table0, 10, N0, gk, gbytes, &in.keys));
        CHECK(kve_paged_gather(&kl[l][1], table0, 10, N0, gv, gbytes, &in.values));
        CHECK(kve_score_layer(&sp, &in, scores + l * slen, slen, ws, sws));
        for (int kv = 0; kv < 2; kv++) {
            const kve_tensor* t = kv ? &in.values : &in.keys;
            before[l][kv] = xmalloc(sizeof(uint16_t) * t->len);
            memcpy(before[l][kv], t->data, sizeof(uint16_t) * t->len);
        }
    }

    /* ---- one token set for the model, 25 % of the prefix kept ---- */
    kve_select_params sel;
    CHECK(kve_select_params_init_laprox_span(&sel, (uint32_t)sizeof sel, kve_budget_keep_ratio_prefix(N0, w, 0.25)));
    kve_model_scores ms = {scores, slen * LAYERS, LAYERS, HKV, N0, w};
    kept_lists sl = select_lists(&sel, &ms, 0);
    const uint64_t kept = sl.offsets[1] - sl.offsets[0];

    /* ---- compact every layer's K and V in place; release the trailing blocks ---- */
    uint64_t cws_bytes, freed = 0;
    CHECK(kve_paged_compact_workspace_size(&kl[0][0], &cws_bytes));
    void* cws = xmalloc(cws_bytes);
    uint32_t* kept_pos = xmalloc(sizeof(uint32_t) * kept);
    for (int l = 0; l < LAYERS; l++)
        for (int kv = 0; kv < 2; kv++)
            CHECK(kve_paged_compact(&kl[l][kv], table0, 10, N0, sl.offsets + l * HKV, 2, sl.indices, sl.idx_len, NULL, 0,
                                    kept_pos, kept, NULL, 0, &freed, cws, cws_bytes));
    printf("kept %llu of %d tokens (window %llu, prefix %llu)\n", (unsigned long long)kept, N0,
           (unsigned long long)w, (unsigned long long)p);
    printf("blocks freed: %llu of %llu: table0[%llu..%llu] back to the free list\n", (unsigned long long)freed,
           (unsigned long long)blocks0, (unsigned long long)(blocks0 - freed), (unsigned long long)blocks0);

    /* ---- check: the kept tokens, in order, are the rows gathered before ---- */
    int ok = 1;
    for (int l = 0; l < LAYERS; l++)
        for (int kv = 0; kv < 2; kv++) {
            kve_tensor t;
            CHECK(kve_paged_gather(&kl[l][kv], table0, 10, kept, gk, gbytes, &t));
            const uint16_t* now = t.data;
            for (uint64_t h = 0; h < HKV; h++)
                for (uint64_t r = 0; r < kept; r++)
                    ok &= memcmp(now + (h * kept + r) * D, before[l][kv] + (h * N0 + kept_pos[r]) * D,
                                 sizeof(uint16_t) * D) == 0;
        }
    /* sequence 1's blocks untouched */
    for (int b = 0; b < 5; b++)
        ok &= memcmp(pool[1] + (uint64_t)table1[b] * 2 * BLOCK * HKV * D,
                     seq1_before + (uint64_t)table1[b] * 2 * BLOCK * HKV * D,
                     sizeof(uint16_t) * 2 * BLOCK * HKV * D) == 0;
    printf("compaction check: %s\n", ok ? "ok" : "FAILED");
    printf("first kept positions: %u %u %u ... last %u\n", kept_pos[0], kept_pos[1], kept_pos[2], kept_pos[kept - 1]);
    return ok ? 0 : 1;
}
