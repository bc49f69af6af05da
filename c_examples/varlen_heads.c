/* LAVa with ragged per-head budgets over a head-major cache, then compaction for a
 * varlen attention kernel (flash-attention's varlen API, AdaKV's decode layout).
 *
 * Cache per layer: K and V as [Hkv][capacity][d] (head-major). LAVa scores every
 * (KV head, token), splits the model's budget over layers by score entropy and over
 * heads AdaKV-style, so heads keep different counts. Two ways to use the result:
 *  1. in place: each head's kept rows move to its front, `lengths[h]` is its new length;
 *  2. flattened: every head's kept rows back to back in one [Σ len, d] buffer plus
 *     `cu_seqlens[Hkv+1]` (int32) — the layout a varlen kernel reads.
 *
 * Build: cc -std=c99 -I include varlen_heads.c libkvevict.a -lpthread -ldl -lm
 */
#include "common.h"

enum { LAYERS = 3, HQ = 8, HKV = 4, D = 16, N = 96, WINDOW = 16, CAPACITY = 40 };

int main(void) {
    const uint64_t p = N - WINDOW;
    float* k[LAYERS];
    float* v[LAYERS];
    float* q[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        k[l] = xmalloc(sizeof(float) * HKV * N * D);
        v[l] = xmalloc(sizeof(float) * HKV * N * D);
        q[l] = xmalloc(sizeof(float) * HQ * WINDOW * D);
        for (int i = 0; i < HKV * N * D; i++) {
            k[l][i] = rnd();
            v[l][i] = rnd() * (1.0f + (float)((i / (N * D)) % HKV)); /* heads differ in scale */
        }
        for (int i = 0; i < HQ * WINDOW * D; i++) q[l][i] = 1.5f * rnd();
    }

    kve_score_params sp;
    CHECK(kve_score_params_init(&sp, (uint32_t)sizeof sp, KVE_PRESET_LAVA));
    sp.window = WINDOW;
    kve_select_params sel;
    /* capacity C = 40 per KV head on average, the window inside it */
    CHECK(kve_select_params_init(&sel, (uint32_t)sizeof sel, KVE_ALLOCATOR_LAVA, KVE_GRANULARITY_HEAD,
                                 kve_budget_from_capacity(CAPACITY, WINDOW)));

    /* ---- scores [L][Hkv][P] ---- */
    uint64_t slen, sws;
    CHECK(kve_score_output_len(&sp, HKV, N, &slen));
    CHECK(kve_score_workspace_size(&sp, HQ, HKV, N, D, D, &sws));
    float* scores = xmalloc(sizeof(float) * slen * LAYERS);
    void* ws = xmalloc(sws);
    for (int l = 0; l < LAYERS; l++) {
        kve_layer_inputs in;
        CHECK(kve_layer_inputs_init(&in, (uint32_t)sizeof in));
        kve_tensor tq = {q[l], (uint64_t)HQ * WINDOW * D, KVE_DTYPE_F32, 0, {HQ, WINDOW, D}, {WINDOW * D, D, 1}};
        kve_tensor tk = {k[l], (uint64_t)HKV * N * D, KVE_DTYPE_F32, 0, {HKV, N, D}, {N * D, D, 1}};
        kve_tensor tv = {v[l], (uint64_t)HKV * N * D, KVE_DTYPE_F32, 0, {HKV, N, D}, {N * D, D, 1}};
        in.queries = tq;
        in.keys = tk;
        in.values = tv;
        CHECK(kve_score_layer(&sp, &in, scores + l * slen, slen, ws, sws));
    }
    free(ws);

    /* ---- ragged selection ---- */
    kve_model_scores ms = {scores, slen * LAYERS, LAYERS, HKV, N, WINDOW};
    kept_lists sl = select_lists(&sel, &ms, 0);
    printf("LAVa, average capacity %d per head (window %d, prefix %llu): kept %llu rows of %d\n", CAPACITY,
           WINDOW, (unsigned long long)p, (unsigned long long)sl.offsets[LAYERS * HKV], LAYERS * HKV * N);

    int errors = 0;
    for (int l = 0; l < LAYERS; l++) {
        const uint64_t* lo = sl.offsets + l * HKV; /* this layer's HKV+1 offsets */
        float* k_before = xmalloc(sizeof(float) * HKV * N * D);
        memcpy(k_before, k[l], sizeof(float) * HKV * N * D);

        /* 2. flattened varlen copy (out of place, from the uncompacted cache) */
        uint64_t total = lo[HKV] - lo[0];
        float* flat = xmalloc(sizeof(float) * (total ? total : 1) * D);
        int32_t cu_seqlens[HKV + 1];
        kve_tensor src = {k[l], (uint64_t)HKV * N * D, KVE_DTYPE_F32, 0, {HKV, N, D}, {N * D, D, 1}};
        kve_tensor dst = {flat, total * D, KVE_DTYPE_F32, 0, {1, total, D}, {total * D, D, 1}};
        CHECK(kve_compact_varlen(&src, lo, HKV + 1, sl.indices, sl.idx_len, &dst, cu_seqlens, HKV + 1));

        /* 1. in place, K then V with the same lists */
        uint32_t lengths[HKV];
        kve_tensor tk = {k[l], (uint64_t)HKV * N * D, KVE_DTYPE_F32, 0, {HKV, N, D}, {N * D, D, 1}};
        kve_tensor tv = {v[l], (uint64_t)HKV * N * D, KVE_DTYPE_F32, 0, {HKV, N, D}, {N * D, D, 1}};
        CHECK(kve_compact_in_place(&tk, lo, HKV + 1, sl.indices, sl.idx_len, lengths, HKV));
        CHECK(kve_compact_in_place(&tv, lo, HKV + 1, sl.indices, sl.idx_len, NULL, 0));

        printf("layer %d: lengths", l);
        for (int h = 0; h < HKV; h++) printf(" %u", lengths[h]);
        printf(" | cu_seqlens");
        for (int h = 0; h <= HKV; h++) printf(" %d", cu_seqlens[h]);
        printf("\n");

        /* check: row r of head h is the r-th kept row, in both layouts */
        for (int h = 0; h < HKV; h++) {
            if ((int64_t)lengths[h] != (int64_t)(cu_seqlens[h + 1] - cu_seqlens[h])) errors++;
            for (uint32_t r = 0; r < lengths[h]; r++) {
                uint32_t t = sl.indices[lo[h] + r];
                const float* want = k_before + ((size_t)h * N + t) * D;
                if (memcmp(k[l] + ((size_t)h * N + r) * D, want, sizeof(float) * D) != 0) errors++;
                if (memcmp(flat + ((size_t)cu_seqlens[h] + r) * D, want, sizeof(float) * D) != 0) errors++;
            }
        }
        free(k_before);
        free(flat);
    }
    printf("compaction check: %s\n", errors ? "MISMATCH" : "ok");

    for (int l = 0; l < LAYERS; l++) {
        free(k[l]); free(v[l]); free(q[l]);
    }
    free(scores); free(sl.offsets); free(sl.indices);
    return errors != 0;
}
