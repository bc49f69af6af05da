/* A toy inference engine in plain C (a few attention layers with random weights, its own
 * K/V cache, a prefill then a decode loop) that evicts with kvevict's evictor.
 *
 * The integration is every line between a "kvevict: begin" and a "kvevict: end" marker,
 * and each line marked kvevict in the engine's code (tests/c_examples.rs counts them: at
 * most 100); the rest is the engine, and a check
 * that the first eviction equals the stage calls by hand (kve_score_layer ->
 * kve_select_model).
 *
 * Policy: decode-time cell budget, past HIGH cells evict down to LOW (the prompt too). */
#include "kvevict.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { L = 4, HQ = 4, HKV = 2, D = 16, DM = HQ * D, CAP = 256, VOCAB = 97 };
enum { PROMPT = 200, DECODE = 150, HIGH = 128, LOW = 96 };

static float wq[L][DM][HQ * D], wk[L][DM][HKV * D], wv[L][DM][HKV * D];
static float wo[L][HQ * D][DM], embed[VOCAB][DM];
static float kc[L][HKV][CAP][D], vc[L][HKV][CAP][D]; /* the cache: head-major */
static float qb[L][HQ][PROMPT][D];                    /* one ubatch's queries */
static int pos[CAP], n_cells, max_held, evictions, check_first;

static unsigned rng = 12345;
static float rnd(void) {
    rng = rng * 1664525u + 1013904223u;
    return (float)((rng >> 8) & 0xFFFF) / 32768.0f - 1.0f;
}
static void fill(float *p, int n, float scale) {
    int i;
    for (i = 0; i < n; i++) p[i] = rnd() * scale;
}
static void die(const char *what, int st) {
    fprintf(stderr, "%s: %s\n", what, kve_status_name(st));
    exit(1);
}
#define CHECK(call) do { int st_ = (call); if (st_ != KVE_OK) die(#call, st_); } while (0)

/* kvevict: begin */
static kve_evictor *ev;
static kve_evictor_requirements req;
static kve_tensor f32_view(const void *p, uint64_t len, uint64_t a, uint64_t b, uint64_t c,
                           uint64_t sa, uint64_t sb) {
    kve_tensor t = {p, len, KVE_DTYPE_F32, 0, {a, b, c}, {sa, sb, 1}};
    return t;
}
static kve_tensor cache_view(float (*x)[CAP][D], int n) {
    return f32_view(x, HKV * CAP * D, HKV, (uint64_t)n, D, CAP * D, D);
}
static void evictor_setup(const char *method) {
    kve_evictor_config cfg;
    uint32_t preset;
    uint64_t bytes;
    int l;
    CHECK(kve_preset_from_name(method, &preset));
    CHECK(kve_evictor_config_init(&cfg, sizeof cfg, preset));
    cfg.layers = L; cfg.hq = HQ; cfg.hkv = HKV; cfg.dk = D; cfg.dv = D; cfg.d_model = DM;
    cfg.max_cells = CAP; cfg.granularity = KVE_GRANULARITY_TOKEN;
    cfg.policy = KVE_POLICY_CELLS; cfg.high = HIGH; cfg.low = LOW;
    CHECK(kve_evictor_size(&cfg, &bytes));
    CHECK(kve_evictor_init(malloc(bytes), bytes, &cfg, &ev));
    CHECK(kve_evictor_get_requirements(ev, &req, sizeof req));
    for (l = 0; l < L && req.wo == KVE_WO_ONCE; l++) {
        kve_tensor w = f32_view(wo[l], HQ * D * DM, HQ, D, DM, D * DM, DM);
        CHECK(kve_evictor_set_output_projection(ev, l, &w));
    }
}
static void evictor_observe(int l, int c) {
    kve_tensor q;
    if (!req.queries) return;
    q = f32_view(qb[l], HQ * PROMPT * D, HQ, (uint64_t)c, D, PROMPT * D, D);
    CHECK(kve_evictor_observe_queries(ev, 0, l, &q));
}
static void check_by_hand(uint64_t target, const uint32_t *kept, uint64_t n_kept);
static void evictor_step(void) {
    static uint32_t cells[CAP];
    uint64_t target, n_kept;
    int l, i;
    CHECK(kve_evictor_plan(ev, 0, n_cells, &target));
    if (target >= (uint64_t)n_cells) return;
    CHECK(kve_evictor_begin(ev, 0, n_cells, target));
    for (l = 0; l < L; l++) {
        kve_evictor_layer views;
        CHECK(kve_evictor_layer_init(&views, sizeof views));
        views.keys = cache_view(kc[l], n_cells);
        views.values = cache_view(vc[l], n_cells); /* queries: the ones observed */
        if (req.wo == KVE_WO_EVERY_ROUND) views.wo = f32_view(wo[l], HQ * D * DM, HQ, D, DM, D * DM, DM);
        CHECK(kve_evictor_score_layer(ev, 0, l, &views));
    }
    CHECK(kve_evictor_select(ev, 0, &n_kept));
    CHECK(kve_evictor_kept_cells(ev, 0, cells, CAP, &n_kept));
    if (check_first) { check_first = 0; check_by_hand(target, cells, n_kept); } /* a check */
    for (l = 0; l < L; l++) {
        kve_tensor k = cache_view(kc[l], n_cells), v = cache_view(vc[l], n_cells);
        CHECK(kve_evictor_compact(ev, 0, l, &k));
        CHECK(kve_evictor_compact(ev, 0, l, &v));
    }
    for (i = 0; i < (int)n_kept; i++) pos[i] = pos[cells[i]];
    n_cells = (int)n_kept;
    CHECK(kve_evictor_commit(ev, 0));
}
/* kvevict: end */

/* One ubatch of c tokens through every layer; returns the next token. */
static int forward(const int *tok, int c) {
    static float x[PROMPT][DM], o[HQ * D], p[CAP];
    int l, i, h, j, d, e, t;
    for (i = 0; i < c; i++) memcpy(x[i], embed[tok[i]], sizeof x[i]);
    for (l = 0; l < L; l++) {
        for (i = 0; i < c; i++) { /* projections; K and V appended to the cache */
            for (h = 0; h < HQ * D; h++) {
                float s = 0;
                for (e = 0; e < DM; e++) s += x[i][e] * wq[l][e][h];
                qb[l][h / D][i][h % D] = s;
            }
            for (h = 0; h < HKV * D; h++) {
                float sk = 0, sv = 0;
                for (e = 0; e < DM; e++) { sk += x[i][e] * wk[l][e][h]; sv += x[i][e] * wv[l][e][h]; }
                kc[l][h / D][n_cells + i][h % D] = sk;
                vc[l][h / D][n_cells + i][h % D] = sv;
            }
        }
        evictor_observe(l, c); /* kvevict */
        for (i = 0; i < c; i++) { /* causal attention over the cache, then Wo, residual */
            int seen = n_cells + i + 1;
            for (h = 0; h < HQ; h++) {
                int kh = h / (HQ / HKV);
                float m = -1e30f, z = 0;
                for (j = 0; j < seen; j++) {
                    float s = 0;
                    for (d = 0; d < D; d++) s += qb[l][h][i][d] * kc[l][kh][j][d];
                    p[j] = s / sqrtf((float)D);
                    if (p[j] > m) m = p[j];
                }
                for (j = 0; j < seen; j++) z += p[j] = expf(p[j] - m);
                for (d = 0; d < D; d++) {
                    float s = 0;
                    for (j = 0; j < seen; j++) s += p[j] * vc[l][kh][j][d];
                    o[h * D + d] = s / z;
                }
            }
            for (e = 0; e < DM; e++) {
                float s = 0;
                for (h = 0; h < HQ * D; h++) s += o[h] * wo[l][h][e];
                x[i][e] += s;
            }
        }
    }
    for (i = 0; i < c; i++) pos[n_cells + i] = (n_cells ? pos[n_cells - 1] + 1 : 0) + i;
    n_cells += c;
    for (t = 0, e = 1; e < DM; e++) if (x[c - 1][e] > x[c - 1][t]) t = e;
    return (t * 31 + n_cells) % VOCAB;
}

/* The first eviction again with the stage calls by hand: LaProx-span over the cache
 * before compaction, the window's queries from the prefill. */
static void check_by_hand(uint64_t target, const uint32_t *kept, uint64_t n_kept) {
    static float scores[L][HKV * CAP], gram[HQ * HQ * D * D];
    static uint32_t idx[L * HKV * CAP];
    static uint64_t off[L * HKV + 1];
    static unsigned char ws[1 << 20];
    kve_score_params sp;
    kve_select_params sel;
    kve_model_scores ms;
    uint64_t len, w, i, same = 0;
    int l;
    CHECK(kve_score_params_init(&sp, sizeof sp, KVE_PRESET_LAPROX_SPAN));
    w = sp.window;
    for (l = 0; l < L; l++) {
        kve_layer_inputs in;
        kve_tensor w_o = f32_view(wo[l], HQ * D * DM, HQ, D, DM, D * DM, DM);
        CHECK(kve_gram_len(HQ, HKV, D, 0, &len));
        CHECK(kve_compute_gram(&w_o, HKV, 0, gram, len, ws, sizeof ws));
        CHECK(kve_layer_inputs_init(&in, sizeof in));
        in.queries = f32_view(qb[l][0][PROMPT - w], HQ * PROMPT * D - (PROMPT - w) * D, HQ, w, D,
                              PROMPT * D, D);
        in.keys = cache_view(kc[l], n_cells);
        in.values = cache_view(vc[l], n_cells);
        in.gram = gram; in.gram_len = len;
        CHECK(kve_score_layer(&sp, &in, scores[0] + l * HKV * (n_cells - w), HKV * CAP, ws,
                              sizeof ws));
    }
    CHECK(kve_select_params_init_laprox_span(&sel, sizeof sel, target - w));
    ms.scores = scores[0]; ms.len = L * HKV * (n_cells - w); ms.layers = L; ms.hkv = HKV;
    ms.n = n_cells; ms.window = w;
    CHECK(kve_select_model(&sel, &ms, off, L * HKV + 1, idx, L * HKV * CAP, ws, sizeof ws));
    for (i = 0; i < n_kept && off[1] == n_kept; i++) same += idx[i] == kept[i];
    printf("stage calls by hand: %s (%llu of %llu cells)\n", same == n_kept ? "same kept set" : "DIFFERENT",
           (unsigned long long)same, (unsigned long long)n_kept);
}

int main(int argc, char **argv) {
    int tok[PROMPT], i, next;
    const char *method;
    fill(&wq[0][0][0], L * DM * HQ * D, 0.3f);
    fill(&wk[0][0][0], L * DM * HKV * D, 0.3f);
    fill(&wv[0][0][0], L * DM * HKV * D, 0.3f);
    fill(&wo[0][0][0], L * HQ * D * DM, 0.05f);
    fill(&embed[0][0], VOCAB * DM, 1.0f);
    for (i = 0; i < PROMPT; i++) tok[i] = (int)((unsigned)(i * 7 + 3) % VOCAB);
    method = argc > 1 ? argv[1] : "laprox-span";
    check_first = strcmp(method, "laprox-span") == 0;
    evictor_setup(method); /* kvevict */
    next = forward(tok, PROMPT);
    evictor_step(); /* kvevict */
    max_held = n_cells;
    printf("prefill: %d tokens, %d cells held\n", PROMPT, n_cells);
    for (i = 0; i < DECODE; i++) {
        next = forward(&next, 1);
        evictor_step(); /* kvevict */
        if (n_cells > max_held) max_held = n_cells;
    }
    {
        kve_evictor_stats st;
        CHECK(kve_evictor_get_stats(ev, 0, &st, sizeof st));
        evictions = (int)st.evictions;
        printf("decoded %d tokens: %d cells held, at most %d after a step (budget %d)\n", DECODE,
               n_cells, max_held, HIGH);
        printf("evictions: %d, cells evicted: %llu\n", evictions,
               (unsigned long long)st.cells_evicted);
    }
    printf("oldest and newest positions held: %d %d\n", pos[0], pos[n_cells - 1]);
    return 0;
}
