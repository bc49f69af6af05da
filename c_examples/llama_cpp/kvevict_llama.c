/*
 * kvevict + llama.cpp: score the KV cache of a GGUF model with kvevict's evictor and evict
 * the lowest-value tokens with llama_memory_seq_rm, then generate.
 *
 * Two modes:
 *  - one-shot (default): prefill the prompt, compress the cache once to a keep ratio,
 *    generate. Question-aware (the question is inside the observation window: prefill
 *    context + question minus its last token, compress, decode the last token) or
 *    question-agnostic (--agnostic: prefill the context alone, compress, then decode the
 *    question).
 *  - decode-time (--max-cells C): the prompt is fed in chunks and the answer generated
 *    token by token; whenever the next batch would not fit in C cells, the cache is
 *    scored and shrunk to --evict-to of C (instead of llama.cpp's context shift).
 *
 * The eviction is kvevict's evictor (kve_evictor_*): it holds the method (a preset name,
 * the library's one table), tells what to capture (kve_evictor_get_requirements), keeps
 * the window's queries, LaProx's Gram blocks and the budget policy (keep ratio or cell
 * budget), scores, selects and compacts. This file only feeds it: every line between
 * "kvevict: begin" and "kvevict: end" (tests/c_examples.rs counts them: at most 150).
 *
 * What is read, and where from:
 *  - post-RoPE queries Qcur-L, keys Kcur-L (op GGML_OP_ROPE) and values Vcur-L (the
 *    reshape), through llama_context_params.cb_eval, for every micro-batch. Queries go
 *    to the evictor (kve_evictor_observe_queries: it keeps the last `window` rows per
 *    layer); keys, and values when the method reads them, to a per-layer store of f16
 *    token rows in position order (exactly the bytes llama.cpp writes to its f16 cache).
 *    Why a store and not the engine's cache_k_lL tensor: after the first eviction
 *    llama.cpp reuses freed cells for new tokens, so cell order stops being position
 *    order and the observation window is no longer "the last w rows"; a position-ordered
 *    store, compacted by the evictor after each eviction, keeps every view a plain
 *    strided tensor. It also works unchanged when the cache lives on a GPU (the callback
 *    copies with ggml_backend_tensor_get). See README.md for reading cache_k_lL in place.
 *  - Wo = blk.L.attn_output.weight, read from the GGUF file with the gguf C API and
 *    dequantized with ggml's type traits, for the methods that read it (LaProx: once, its
 *    Gram blocks stay in the evictor; CriticalKV: every round).
 *
 * Flash attention does not matter for any of this (everything is captured before the
 * attention op); --flash-attn on|off|auto sets it (default off).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"
#include "kvevict.h"
#include "llama.h"

/* ------------------------------------------------------------------ small helpers */

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kvevict_llama: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(2);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) die("out of memory (%zu bytes)", n);
    return p;
}

static void *xcalloc(size_t n, size_t s) {
    void *p = calloc(n ? n : 1, s ? s : 1);
    if (!p) die("out of memory (%zu x %zu bytes)", n, s);
    return p;
}

#define KVE(call)                                                                       \
    do {                                                                                \
        int32_t st_ = (call);                                                           \
        if (st_ != KVE_OK)                                                              \
            die("%s failed: %s (%s)", #call, kve_status_name(st_), kve_status_message(st_)); \
    } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU seconds of the whole process (all threads): on a shared machine, a run with -t 1
 * gets comparable costs from this even when wall time is inflated by other load. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------------------- options */

struct opts {
    const char *model;
    const char *methods[16]; /* "full" or a kvevict preset; one prefill serves them all (one-shot) */
    int n_methods;
    double keep;            /* one-shot: fraction of the cache kept, window inside (kvpress) */
    int window;             /* observation window (0 = the preset's) */
    int agnostic;           /* question-agnostic compression */
    int n_predict;
    int threads;
    int flash_attn;         /* -1 auto, 0 off, 1 on */
    int max_cells;          /* decode-time mode: cache budget in cells (0 = one-shot) */
    double evict_to;        /* decode-time: fraction of max_cells kept after an eviction */
    int chunk;              /* decode-time: prompt tokens per llama_decode */
    /* prompt */
    const char *context_file;
    const char *question;
    int needle;             /* generate a needle prompt */
    double depth;
    int seed;
    int ctx_tokens;
    const char *key;
    int verbose;
    int show_kept;          /* print the text of the kept cells */
    int repack;             /* one-shot: re-pack the kept cells to the front of the cache */
    int post_k;             /* the selection's forward post pool: kernel (0 = the preset's) */
    double post_decay;      /* ... and decay */
    const char *score_layers; /* "all" or a list; NULL = the full-attention layers */
};

static void usage(void) {
    fprintf(stderr, "usage: kvevict_llama -m MODEL.gguf [options]\n  --method M[,M..]  full |");
    for (uint32_t i = 0; i < kve_preset_count(); i++) fprintf(stderr, " %s", kve_preset_name(i));
    fprintf(stderr,
            "  (laprox-span);\n"
            "                    one-shot mode runs every listed method on one prefill (state snapshot)\n"
            "  --keep R          one-shot: keep ratio of the cache, window inside it (kvpress) (0.1)\n"
            "  --window W        observation window (the preset's: 8 for laprox-span and uniqueness, 32 for the others)\n"
            "  --agnostic        question-agnostic: compress the context before the question is decoded\n"
            "  --max-cells C     decode-time mode: evict whenever the cache would exceed C cells\n"
            "  --evict-to F      decode-time: keep F*C cells after an eviction (0.75)\n"
            "  --chunk T         decode-time: prompt tokens per llama_decode (64)\n"
            "  -n N              tokens to generate (8)\n"
            "  -t N              threads (2)\n"
            "  --flash-attn on|off|auto   (off)\n"
            " prompt (one of):\n"
            "  --needle DEPTH    built-in needle prompt, needle at DEPTH in [0,1]\n"
            "      --seed S      filler seed (0)   --ctx-tokens N  prompt length (1000)   --key K  pass key\n"
            "  -f FILE -q TEXT   context from FILE, question TEXT\n"
            "  --span-pool K:D   the selection's forward post pool (laprox-span's preset: 9:1.0)\n"
            "  --show-kept       print the text of the cells kept (one-shot mode)\n"
            "  --repack          one-shot: after evicting, move the kept cells to the front of the cache\n"
            "                    (state save, clear, restore) so attention spans fewer cells\n"
            "  --score-layers L  layers whose scores choose the kept cells: all, or a list (0,5,11);\n"
            "                    default: every layer, but only the full-attention ones of a\n"
            "                    sliding-window model (Gemma 2/3, Cohere 2)\n"
            "  -v                verbose (llama.cpp's log)\n");
    exit(2);
}

/* Method names: "full" or a preset name of the library (kve_preset_from_name). */
static void parse_methods(const char *list, struct opts *o) {
    static char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    o->n_methods = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        uint32_t preset;
        if (strcmp(tok, "full") && kve_preset_from_name(tok, &preset) != KVE_OK) die("unknown method '%s'", tok);
        if (o->n_methods == 16) die("too many methods");
        o->methods[o->n_methods++] = tok;
    }
    if (!o->n_methods) die("--method needs at least one method");
}

static void parse_args(int argc, char **argv, struct opts *o) {
    memset(o, 0, sizeof *o);
    o->methods[0] = "laprox-span";
    o->n_methods = 1;
    o->keep = 0.1;
    o->n_predict = 8;
    o->threads = 2;
    o->flash_attn = 0;
    o->evict_to = 0.75;
    o->chunk = 64;
    o->depth = -1;
    o->ctx_tokens = 1000;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
#define NEXT() (i + 1 < argc ? argv[++i] : (usage(), ""))
        if (!strcmp(a, "-m")) o->model = NEXT();
        else if (!strcmp(a, "--method")) parse_methods(NEXT(), o);
        else if (!strcmp(a, "--keep")) o->keep = atof(NEXT());
        else if (!strcmp(a, "--window")) o->window = atoi(NEXT());
        else if (!strcmp(a, "--agnostic")) o->agnostic = 1;
        else if (!strcmp(a, "--max-cells")) o->max_cells = atoi(NEXT());
        else if (!strcmp(a, "--evict-to")) o->evict_to = atof(NEXT());
        else if (!strcmp(a, "--chunk")) o->chunk = atoi(NEXT());
        else if (!strcmp(a, "-n")) o->n_predict = atoi(NEXT());
        else if (!strcmp(a, "-t")) o->threads = atoi(NEXT());
        else if (!strcmp(a, "--flash-attn")) {
            const char *v = NEXT();
            o->flash_attn = !strcmp(v, "on") ? 1 : !strcmp(v, "off") ? 0 : -1;
        } else if (!strcmp(a, "--needle")) { o->needle = 1; o->depth = atof(NEXT()); }
        else if (!strcmp(a, "--seed")) o->seed = atoi(NEXT());
        else if (!strcmp(a, "--ctx-tokens")) o->ctx_tokens = atoi(NEXT());
        else if (!strcmp(a, "--key")) o->key = NEXT();
        else if (!strcmp(a, "-f")) o->context_file = NEXT();
        else if (!strcmp(a, "-q")) o->question = NEXT();
        else if (!strcmp(a, "-v")) o->verbose = 1;
        else if (!strcmp(a, "--show-kept")) o->show_kept = 1;
        else if (!strcmp(a, "--repack")) o->repack = 1;
        else if (!strcmp(a, "--score-layers")) o->score_layers = NEXT();
        else if (!strcmp(a, "--span-pool")) {
            if (sscanf(NEXT(), "%d:%lf", &o->post_k, &o->post_decay) != 2) die("--span-pool wants K:DECAY");
        }
        else usage();
#undef NEXT
    }
    if (!o->model) usage();
    if (!o->needle && !o->context_file) usage();
    if (o->keep <= 0 || o->keep > 1) die("--keep must be in (0, 1]");
    if (o->max_cells && (o->evict_to <= 0 || o->evict_to >= 1)) die("--evict-to must be in (0, 1)");
    if (o->max_cells && (o->n_methods != 1 || !strcmp(o->methods[0], "full")))
        die("--max-cells takes exactly one method, not full");
    if (o->chunk < 1) die("--chunk must be >= 1");
}

/* ------------------------------------------------------------------ needle prompts */
/* The grammar of eval/needle.py (no digits in the filler); the random stream is our own
 * (splitmix64), so prompts are deterministic but not identical to the Python ones. */

static const char *SUBJECTS[] = {"The old miller", "A curious child", "The night watchman", "The young painter",
    "A quiet traveller", "The river pilot", "A clever merchant", "The village baker", "The tired soldier",
    "A wandering poet", "The shepherd", "The ship's cook", "An elderly teacher", "The blacksmith",
    "A stranger in a grey coat", "The innkeeper"};
static const char *VERBS[] = {"walked past", "remembered", "painted", "looked at", "dreamed of", "sang about",
    "repaired", "visited", "waited beside", "talked about", "cleaned", "wrote a letter about", "searched for",
    "admired", "forgot about", "returned to"};
static const char *OBJECTS[] = {"the tall lighthouse", "the apple orchard", "the narrow harbour", "the green hills",
    "the dusty road", "the sleepy town", "the northern forest", "the stone bridge", "the quiet library",
    "the windy meadow", "the frozen lake", "the crowded market", "the old chapel", "the red barn",
    "the broken mill", "the silver river"};
static const char *TAILS[] = {"on a cold evening", "in the early morning", "before the storm", "after a long day",
    "without saying a word", "with great patience", "during the festival", "under a grey sky",
    "while the bells rang", "for the last time", "as the sun went down", "in the spring rain"};
static const char *SHORT[] = {"Life went on as usual.", "Nobody seemed to notice.", "The air smelled of rain.",
    "The story was told many times.", "Everyone agreed it was a good idea.", "It was a peaceful place.",
    "The wind kept blowing.", "Some things never change."};
#define NELEM(a) ((int)(sizeof(a) / sizeof *(a)))

static uint64_t rng_state;
static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static int rng_int(int n) { return (int)(rng_next() % (uint64_t)n); }

static const char *QUESTION = "\nQuestion: what is the pass key?\nAnswer: The pass key is";

static int count_tokens(const struct llama_vocab *vocab, const char *text) {
    int n = -llama_tokenize(vocab, text, (int32_t)strlen(text), NULL, 0, false, false);
    return n < 0 ? -n : n;
}

/* Filler sentences around "The pass key is KEY. Remember it." until the context plus the
 * question reach about `target` tokens. Returns a malloc'ed context. */
static char *make_needle(const struct llama_vocab *vocab, const struct opts *o, char key[16]) {
    rng_state = 0x6b76657669637400ULL ^ ((uint64_t)(uint32_t)o->seed * 0x100000001b3ULL);
    if (o->key) snprintf(key, 16, "%s", o->key);
    else snprintf(key, 16, "%d", 10000 + rng_int(90000));
    char needle[64];
    snprintf(needle, sizeof needle, "The pass key is %s. Remember it.", key);
    int budget = o->ctx_tokens - count_tokens(vocab, QUESTION) - count_tokens(vocab, needle) - 2;
    int cap = 64, n = 0, used = 0;
    char **sent = xmalloc(sizeof(char *) * cap);
    for (;;) {
        char buf[256];
        if (rng_int(5) == 0) snprintf(buf, sizeof buf, "%s", SHORT[rng_int(NELEM(SHORT))]);
        else {
            int s = rng_int(NELEM(SUBJECTS)), v = rng_int(NELEM(VERBS)), ob = rng_int(NELEM(OBJECTS)),
                t = rng_int(NELEM(TAILS));
            snprintf(buf, sizeof buf, "%s %s %s %s.", SUBJECTS[s], VERBS[v], OBJECTS[ob], TAILS[t]);
        }
        char spaced[260];
        snprintf(spaced, sizeof spaced, " %s", buf);
        int k = count_tokens(vocab, spaced);
        if (used + k > budget) break;
        if (n == cap) sent = realloc(sent, sizeof(char *) * (cap *= 2));
        sent[n++] = strdup(buf);
        used += k;
    }
    int at = (int)lround(o->depth * n);
    if (at < 0) at = 0;
    if (at > n) at = n;
    size_t len = strlen(needle) + 2;
    for (int i = 0; i < n; i++) len += strlen(sent[i]) + 1;
    char *ctx = xmalloc(len);
    ctx[0] = 0;
    for (int i = 0; i <= n; i++) {
        if (i == at) {
            if (ctx[0]) strcat(ctx, " ");
            strcat(ctx, needle);
        }
        if (i < n) {
            if (ctx[0]) strcat(ctx, " ");
            strcat(ctx, sent[i]);
            free(sent[i]);
        }
    }
    free(sent);
    return ctx;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open %s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = xmalloc((size_t)n + 1);
    if (fread(s, 1, (size_t)n, f) != (size_t)n) die("cannot read %s", path);
    s[n] = 0;
    fclose(f);
    return s;
}

static llama_token *tokenize(const struct llama_vocab *vocab, const char *text, int add_special, int *n_out) {
    int len = (int)strlen(text);
    int n = -llama_tokenize(vocab, text, len, NULL, 0, add_special, false);
    if (n <= 0) n = len + 8;
    llama_token *t = xmalloc(sizeof(llama_token) * (size_t)n);
    int m = llama_tokenize(vocab, text, len, t, n, add_special, false);
    if (m < 0) die("tokenize failed");
    *n_out = m;
    return t;
}

/* --------------------------------------------------------------- the engine's weights */

struct gguf_file { struct gguf_context *g; struct ggml_context *meta; FILE *f; };

static void gguf_open(struct gguf_file *w, const char *path) {
    struct gguf_init_params gp = {.no_alloc = true, .ctx = &w->meta};
    w->g = gguf_init_from_file(path, gp);
    w->f = fopen(path, "rb");
    if (!w->g || !w->f) die("cannot read %s", path);
}

static void gguf_close(struct gguf_file *w) {
    fclose(w->f);
    gguf_free(w->g);
    ggml_free(w->meta);
}

/* Tensor `name` of ggml shape [ne0, ne1] as f32 (dequantized with ggml's type traits). */
static float *gguf_read_f32(const struct gguf_file *w, const char *name, int64_t ne0, int64_t ne1) {
    int64_t id = gguf_find_tensor(w->g, name);
    struct ggml_tensor *t = ggml_get_tensor(w->meta, name);
    if (id < 0 || !t || t->ne[0] != ne0 || t->ne[1] != ne1)
        die("%s: missing, or not [%lld, %lld]", name, (long long)ne0, (long long)ne1);
    size_t sz = gguf_get_tensor_size(w->g, id), len = (size_t)ne0 * (size_t)ne1;
    void *raw = xmalloc(sz);
    float *out = xmalloc(len * sizeof(float));
    if (fseek(w->f, (long)(gguf_get_data_offset(w->g) + gguf_get_tensor_offset(w->g, id)), SEEK_SET) ||
        fread(raw, 1, sz, w->f) != sz)
        die("cannot read %s", name);
    enum ggml_type ty = gguf_get_tensor_type(w->g, id);
    if (ty == GGML_TYPE_F32) memcpy(out, raw, len * sizeof(float));
    else if (ggml_get_type_traits(ty)->to_float) ggml_get_type_traits(ty)->to_float(raw, out, (int64_t)len);
    else die("%s: cannot dequantize type %s", name, ggml_type_name(ty));
    free(raw);
    return out;
}

/* A cb_eval tensor [hd, heads, T] (f32, any strides, any backend) as host rows
 * [T][heads*hd] in `*buf` (grown as needed). Returns T. */
static int host_rows(const struct ggml_tensor *t, int heads, int hd, float **buf, size_t *len) {
    const int T = (int)t->ne[2];
    const size_t row = (size_t)heads * hd;
    if (t->type != GGML_TYPE_F32 || t->ne[0] != hd || t->ne[1] != heads || t->ne[3] != 1)
        die("unexpected shape/type for %s: [%lld,%lld,%lld] type %d", t->name, (long long)t->ne[0],
            (long long)t->ne[1], (long long)t->ne[2], (int)t->type);
    if (*len < row * T) { free(*buf); *buf = xmalloc(row * T * sizeof(float)); *len = row * T; }
    for (int i = 0; i < T; i++)
        for (int h = 0; h < heads; h++)
            ggml_backend_tensor_get(t, *buf + i * row + (size_t)h * hd, i * t->nb[2] + h * t->nb[1], hd * sizeof(float));
    return T;
}

/* Whether t is called fmt's name ("Kcur-%d%n": any layer, into *l). */
static int named(const struct ggml_tensor *t, const char *fmt, int *l) {
    int end = 0;
    return sscanf(t->name, fmt, l, &end) == 1 && end > 0 && !t->name[end];
}

/* ------------------------------------------------------------------------- eviction */

/* kvevict: begin */
struct method { const char *name; kve_evictor *ev; kve_evictor_requirements req; double t_kve, c_kve; }; /* "full": no ev */

struct capture {
    int n_layer, n_model_layer, hq, hkv, hd, d_model; /* n_layer: the scored layers, in model order */
    int cap, n, on, keep_v, read_wo, n_kv; /* store rows, rows held, capture on, V stored, Wo read, cells attention spans */
    const int *slot, *layer_of; /* model layer -> scored layer (-1: not scored), and back */
    int nt, seen;          /* the batch being decoded: its tokens, the K/V tensors captured */
    int32_t *pos;          /* [cap] position of store row i */
    uint32_t *cells;       /* [cap] an eviction's kept cells, then its evicted ones */
    ggml_fp16_t *k, *v;    /* [L][cap][hkv*hd] rows, as llama.cpp's f16 cache holds them */
    float **wo, *tmp;      /* [L] -> Wo (when a method reads it); the callback's rows */
    size_t tmp_len;
    struct method *m; int n_m;
    double t_copy;         /* seconds in the callback */
};

static kve_tensor view3(const void *p, uint32_t dt, uint64_t a, uint64_t b, uint64_t c, uint64_t sa, uint64_t sb, uint64_t sc) {
    kve_tensor t = {p, 1 + (a - 1) * sa + (b - 1) * sb + (c - 1) * sc, dt, 0, {a, b, c}, {sa, sb, sc}};
    return t;
}
static kve_tensor rows(const struct capture *c, const ggml_fp16_t *store, int l, int n) { /* layer l as [Hkv, n, hd] */
    return view3(store + (size_t)l * c->cap * c->hkv * c->hd, KVE_DTYPE_F16, c->hkv, n, c->hd, c->hd, (uint64_t)c->hkv * c->hd, 1);
}
static kve_tensor wo_view(const struct capture *c, const float *w) { /* ggml row r: Wo[h][j][r] = w[r*Hq*hd + h*hd + j] */
    return view3(w, KVE_DTYPE_F32, c->hq, c->hd, c->d_model, c->hd, 1, (uint64_t)c->hq * c->hd);
}

/* One evictor for `name` over the scored layers, with the run's policy. */
static void method_init(struct method *m, const char *name, const struct opts *o, const struct capture *c) {
    kve_evictor_config cfg; kve_select_params sel;
    uint32_t preset; uint64_t bytes;
    KVE(kve_preset_from_name(name, &preset));
    KVE(kve_evictor_config_init(&cfg, sizeof cfg, preset));
    cfg.layers = c->n_layer; cfg.hq = c->hq; cfg.hkv = c->hkv; cfg.dk = cfg.dv = c->hd; cfg.d_model = c->d_model;
    cfg.max_cells = c->cap; cfg.window = o->window;
    cfg.granularity = KVE_GRANULARITY_TOKEN; /* a llama.cpp cell holds one token for every layer and head */
    if (o->post_k > 0) {
        KVE(kve_select_params_init_preset(&sel, sizeof sel, preset, 0));
        sel.post_pool_kernel = (uint32_t)o->post_k; sel.post_pool_decay = (float)o->post_decay;
        cfg.select = &sel;
    }
    if (o->max_cells) { cfg.policy = KVE_POLICY_CELLS; cfg.high = o->max_cells; cfg.low = (uint64_t)(o->max_cells * o->evict_to); }
    else { cfg.policy = KVE_POLICY_KEEP_RATIO; cfg.keep_ratio = o->keep; }
    KVE(kve_evictor_size(&cfg, &bytes));
    KVE(kve_evictor_init(xmalloc(bytes), bytes, &cfg, &m->ev));
    KVE(kve_evictor_get_requirements(m->ev, &m->req, sizeof m->req));
}

/* The evictors of the methods (names in m[i].name) and the stores of the scored layers. */
static void capture_init(struct capture *c, struct method *m, int n_m, const struct opts *o) {
    const size_t store = (size_t)c->n_layer * c->cap * c->hkv * c->hd * sizeof(ggml_fp16_t);
    c->m = m; c->n_m = n_m;
    for (int i = 0; i < n_m; i++) {
        if (strcmp(m[i].name, "full")) method_init(&m[i], m[i].name, o, c);
        c->keep_v |= m[i].ev && m[i].req.values; c->read_wo |= m[i].ev && m[i].req.wo != KVE_WO_NONE;
    }
    c->pos = xmalloc((size_t)c->cap * sizeof(int32_t)); c->cells = xmalloc((size_t)c->cap * sizeof(uint32_t));
    c->k = xmalloc(store); c->v = c->keep_v ? xmalloc(store) : NULL;
    c->wo = xcalloc((size_t)c->n_layer, sizeof *c->wo);
}

/* Wo of every scored layer (the engine's weights), for the methods that read it. */
static void load_wo(struct capture *c, const char *path) {
    if (!c->read_wo) return;
    struct gguf_file w;
    gguf_open(&w, path);
    for (int l = 0; l < c->n_layer; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.attn_output.weight", c->layer_of[l]);
        c->wo[l] = gguf_read_f32(&w, name, (int64_t)c->hq * c->hd, c->d_model);
        kve_tensor wo = wo_view(c, c->wo[l]);
        for (int i = 0; i < c->n_m; i++)
            if (c->m[i].ev && c->m[i].req.wo == KVE_WO_ONCE) KVE(kve_evictor_set_output_projection(c->m[i].ev, l, &wo));
    }
    gguf_close(&w);
}

static bool capture_cb(struct ggml_tensor *t, bool ask, void *ud) {
    struct capture *c = ud;
    int l = -1, kind = -1; /* 0 = Q, 1 = K, 2 = V */
    if (ask && t->op == GGML_OP_VIEW && !strcmp(t->name, "cache_k_l0 (view)")) c->n_kv = (int)t->ne[2];
    if (!c->on) return !ask;
    if (t->op == GGML_OP_ROPE) kind = named(t, "Qcur-%d%n", &l) ? 0 : named(t, "Kcur-%d%n", &l) ? 1 : -1;
    else if (t->op == GGML_OP_RESHAPE && c->keep_v && named(t, "Vcur-%d%n", &l)) kind = 2;
    if (kind < 0 || l < 0 || l >= c->n_model_layer || (l = c->slot[l]) < 0) return !ask; /* not scored */
    if (ask) return true;
    double t0 = now_s();
    const int heads = kind == 0 ? c->hq : c->hkv, T = host_rows(t, heads, c->hd, &c->tmp, &c->tmp_len);
    const size_t row = (size_t)heads * c->hd;
    if (T != c->nt) die("%s: %d tokens in a batch of %d (a split micro-batch)", t->name, T, c->nt);
    if (kind == 0) {
        kve_tensor q = view3(c->tmp, KVE_DTYPE_F32, c->hq, T, c->hd, c->hd, row, 1);
        for (int i = 0; i < c->n_m; i++)
            if (c->m[i].ev && c->m[i].req.queries) KVE(kve_evictor_observe_queries(c->m[i].ev, 0, l, &q));
    } else {
        ggml_fp16_t *store = (kind == 1 ? c->k : c->v) + (size_t)l * c->cap * row;
        ggml_fp32_to_fp16_row(c->tmp, store + (size_t)c->n * row, (int64_t)row * T);
        c->seen++;
    }
    c->t_copy += now_s() - t0;
    return true;
}

/* Around llama_decode of `nt` tokens at positions p0..: every scored layer's K (and V) seen. */
static void capture_begin(struct capture *c, int p0, int nt) {
    if (c->n + nt > c->cap) die("store full (%d + %d > %d)", c->n, nt, c->cap);
    for (int i = 0; i < nt; i++) c->pos[c->n + i] = p0 + i;
    c->nt = nt; c->seen = 0;
}
static void capture_end(struct capture *c) {
    if (c->seen != c->n_layer * (1 + c->keep_v)) die("%d of %d K/V tensors captured", c->seen, c->n_layer * (1 + c->keep_v));
    c->n += c->nt;
}

/* Before a batch of `nt` tokens (0: now): when the evictor's policy says so, score the
 * stored rows, remove the cells it evicts from llama.cpp and compact the stores. */
static void maybe_evict(struct method *m, struct capture *c, struct llama_context *ctx, int nt) {
    uint64_t target, kept, ne, n = (uint64_t)c->n;
    KVE(kve_evictor_plan(m->ev, 0, n + nt, &target));
    if (target >= n) return;
    double t0 = now_s(), c0 = cpu_s();
    KVE(kve_evictor_begin(m->ev, 0, n, target));
    for (int l = 0; l < c->n_layer; l++) {
        kve_evictor_layer in; /* queries: the ones observed */
        KVE(kve_evictor_layer_init(&in, sizeof in));
        in.keys = rows(c, c->k, l, c->n);
        if (m->req.values) in.values = rows(c, c->v, l, c->n);
        if (m->req.wo == KVE_WO_EVERY_ROUND) in.wo = wo_view(c, c->wo[l]);
        KVE(kve_evictor_score_layer(m->ev, 0, l, &in));
    }
    uint32_t *cells = c->cells;
    KVE(kve_evictor_select(m->ev, 0, &kept));
    KVE(kve_evictor_kept_cells(m->ev, 0, cells, n, &kept));
    KVE(kve_evictor_evicted_cells(m->ev, 0, cells + kept, n - kept, &ne));
    for (uint64_t i = kept; i < n; i++)
        if (!llama_memory_seq_rm(llama_get_memory(ctx), 0, c->pos[cells[i]], c->pos[cells[i]] + 1)) die("seq_rm failed");
    for (int l = 0; l < c->n_layer; l++) {
        kve_tensor k = rows(c, c->k, l, c->n);
        KVE(kve_evictor_compact(m->ev, 0, l, &k));
        if (c->keep_v) { kve_tensor v = rows(c, c->v, l, c->n); KVE(kve_evictor_compact(m->ev, 0, l, &v)); }
    }
    for (uint64_t i = 0; i < kept; i++) c->pos[i] = c->pos[cells[i]];
    c->n = (int)kept;
    KVE(kve_evictor_commit(m->ev, 0));
    m->t_kve += now_s() - t0; m->c_kve += cpu_s() - c0;
}
/* kvevict: end */

/* ------------------------------------------------------------------------ decoding */

struct run {
    struct llama_context *ctx;
    struct capture *cap;   /* NULL: nothing captured */
    struct method *evict;  /* decode-time mode: asked before every batch */
    double t_decode, c_decode; /* wall and CPU seconds in llama_decode */
    int pos;               /* next position */
    int max_used;          /* most cells held after a batch */
};

static void decode(struct run *r, llama_token *toks, int nt) {
    if (r->evict) maybe_evict(r->evict, r->cap, r->ctx, nt); /* kvevict */
    if (r->cap) capture_begin(r->cap, r->pos, nt); /* kvevict */
    struct llama_batch b = llama_batch_get_one(toks, nt);
    double t0 = now_s(), c0 = cpu_s();
    int rc = llama_decode(r->ctx, b);
    r->t_decode += now_s() - t0;
    r->c_decode += cpu_s() - c0;
    if (rc) die("llama_decode failed (%d) at position %d with %d tokens", rc, r->pos, nt);
    if (r->cap) capture_end(r->cap); /* kvevict */
    if (r->cap && r->cap->n > r->max_used) r->max_used = r->cap->n;
    r->pos += nt;
}

/* Feed tokens in batches of at most `step`. */
static void feed(struct run *r, llama_token *toks, int nt, int step) {
    for (int i = 0; i < nt; i += step) decode(r, toks + i, nt - i < step ? nt - i : step);
}

static int piece(const struct llama_vocab *vocab, llama_token t, char *buf, int len) {
    int n = llama_token_to_piece(vocab, t, buf, len - 1, 0, false);
    if (n < 0) n = 0;
    buf[n] = 0;
    return n;
}

/* ------------------------------------------------- snapshot: one prefill, many methods */

struct snapshot {
    uint8_t *state;   /* llama_state_seq_get_data of sequence 0 */
    size_t state_len, store;
    int n;
    int32_t *pos;
    ggml_fp16_t *k, *v;
};

/* The sequence and the stores after the prefill (each method has its own evictor). */
static void snapshot_take(struct snapshot *s, struct llama_context *ctx, const struct capture *c) {
    s->state_len = llama_state_seq_get_size(ctx, 0);
    s->state = xmalloc(s->state_len);
    if (llama_state_seq_get_data(ctx, s->state, s->state_len, 0) != s->state_len) die("state snapshot failed");
    s->n = c->n;
    s->pos = xmalloc(sizeof(int32_t) * (size_t)c->cap);
    memcpy(s->pos, c->pos, sizeof(int32_t) * (size_t)c->cap);
    s->store = (size_t)c->n_layer * c->cap * c->hkv * c->hd * sizeof(ggml_fp16_t);
    s->k = xmalloc(s->store);
    memcpy(s->k, c->k, s->store);
    if (c->keep_v) {
        s->v = xmalloc(s->store);
        memcpy(s->v, c->v, s->store);
    }
}

static void snapshot_restore(const struct snapshot *s, struct llama_context *ctx, struct capture *c) {
    llama_memory_seq_rm(llama_get_memory(ctx), 0, -1, -1);
    if (llama_state_seq_set_data(ctx, s->state, s->state_len, 0) != s->state_len) die("state restore failed");
    c->n = s->n;
    memcpy(c->pos, s->pos, sizeof(int32_t) * (size_t)c->cap);
    memcpy(c->k, s->k, s->store);
    if (c->keep_v) memcpy(c->v, s->v, s->store);
}

/* ---------------------------------------------------------------------------- main */

static void quiet_log(enum ggml_log_level level, const char *text, void *ud) {
    (void)ud;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

/* eval/needle.py's rule: the first run of digits in the answer is the key. With
 * `prefix`, the run only has to start with the key (the key recovered, but the model
 * did not stop after it). */
static int first_digits_match(const char *text, const char *key, int prefix) {
    const char *p = text;
    while (*p && (*p < '0' || *p > '9')) p++;
    size_t n = 0, k = strlen(key);
    while (p[n] >= '0' && p[n] <= '9') n++;
    return n > 0 && (prefix ? n >= k : n == k) && !strncmp(p, key, k);
}

/* The kept cells as text, gaps marked with a bullet. */
static void print_kept(const struct llama_vocab *vocab, const llama_token *toks, const struct capture *c) {
    printf("  kept text: ");
    for (int i = 0; i < c->n; i++) {
        if (i > 0 && c->pos[i] != c->pos[i - 1] + 1) printf(" \u2022 ");
        char buf[128];
        piece(vocab, toks[c->pos[i]], buf, sizeof buf);
        for (char *q = buf; *q; q++) if (*q == '\n') *q = ' ';
        printf("%s", buf);
    }
    printf("\n");
}

static void json_escape(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
        else if (*s == '\n') fputs("\\n", f);
        else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", *s);
        else fputc(*s, f);
    }
}

struct outcome {
    const char *method;
    int window, scored, cells_kept, evictions, max_used, correct, recovered;
    long long evicted;
    double t_kve, t_repack, ms_per_token, c_kve;
    int n_kv, generated;
    char answer[512];
};

/* Greedy decoding from the logits of the last decoded token. */
static int generate(struct run *r, struct llama_sampler *smpl, const struct llama_vocab *vocab, int n_predict,
                    char *answer, size_t cap) {
    size_t alen = 0;
    answer[0] = 0;
    int n = 0;
    for (int i = 0; i < n_predict; i++) {
        llama_token t = llama_sampler_sample(smpl, r->ctx, -1);
        if (llama_vocab_is_eog(vocab, t)) break;
        char buf[128];
        int k = piece(vocab, t, buf, sizeof buf);
        if (alen + (size_t)k < cap - 1) { memcpy(answer + alen, buf, (size_t)k); alen += (size_t)k; answer[alen] = 0; }
        n++;
        if (i + 1 == n_predict) break;
        decode(r, &t, 1);
    }
    return n;
}


/* The layers whose scores choose the kept cells. A sliding-window layer never attends
 * past its window, so its scores of older tokens describe attention that does not happen
 * (its far logits are unmasked RoPE extrapolation); only full-attention layers see them.
 * llama.cpp's pattern n makes layer l full-attention when l % n == n - 1; the pattern is
 * in the code, not the GGUF, for these architectures. Returns the count, layers in `out`. */
static int scored_layers(const struct llama_model *model, int L, const char *opt, int *out, int *swa) {
    *swa = llama_model_n_swa(model);
    int n = 0;
    if (opt && strcmp(opt, "all")) {
        char buf[1024];
        snprintf(buf, sizeof buf, "%s", opt);
        for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
            char *end;
            long l = strtol(t, &end, 10);
            if (*end || l < 0 || l >= L || (n && l <= out[n - 1])) die("--score-layers: want ascending layers in 0..%d", L - 1);
            out[n++] = (int)l;
        }
        if (!n) die("--score-layers: no layer");
        return n;
    }
    if (opt || *swa <= 0) {
        for (int l = 0; l < L; l++) out[n++] = l;
        return n;
    }
    static const struct { const char *arch; int pattern; } KNOWN[] = {{"gemma2", 2}, {"gemma3", 6}, {"cohere2", 4}};
    char arch[64] = "";
    llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch);
    int pattern = 0;
    for (size_t i = 0; i < sizeof KNOWN / sizeof *KNOWN; i++)
        if (!strcmp(arch, KNOWN[i].arch)) pattern = KNOWN[i].pattern;
    if (!pattern)
        die("%s has sliding-window layers (window %d) in a pattern this example does not know: pass --score-layers "
            "with its full-attention layers (or all)", arch, *swa);
    for (int l = 0; l < L; l++)
        if (l % pattern == pattern - 1) out[n++] = l;
    return n;
}

/* Head dim from the GGUF metadata: n_embd / n_head is wrong for Gemma 3, Qwen3 and others
 * (Gemma 3 270M: n_embd 640, 4 heads of 256). Keys and values must share it here. */
static int model_head_dim(const struct llama_model *model, int fallback) {
    char arch[64], key[160], kv[32], vv[32];
    if (llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch) < 0) return fallback;
    snprintf(key, sizeof key, "%s.attention.key_length", arch);
    if (llama_model_meta_val_str(model, key, kv, sizeof kv) < 0) return fallback;
    snprintf(key, sizeof key, "%s.attention.value_length", arch);
    if (llama_model_meta_val_str(model, key, vv, sizeof vv) >= 0 && atoi(vv) != atoi(kv))
        die("key length %s != value length %s: not supported by this example", kv, vv);
    return atoi(kv) > 0 ? atoi(kv) : fallback;
}

int main(int argc, char **argv) {
    struct opts o;
    parse_args(argc, argv, &o);
    if (!o.verbose) llama_log_set(quiet_log, NULL);
    llama_backend_init();
    if (kve_version() != KVE_VERSION_NUMBER) die("kvevict header/library version mismatch");

    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(o.model, mp);
    if (!model) die("cannot load %s", o.model);
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const int L = llama_model_n_layer(model), hq = llama_model_n_head(model), hkv = llama_model_n_head_kv(model);
    const int D = llama_model_n_embd(model), hd = model_head_dim(model, D / hq);
    int *score_l = xmalloc((size_t)L * sizeof(int)), *slot = xmalloc((size_t)L * sizeof(int)), swa = 0;
    const int n_score_l = scored_layers(model, L, o.score_layers, score_l, &swa);
    for (int l = 0; l < L; l++) slot[l] = -1;
    for (int i = 0; i < n_score_l; i++) slot[score_l[i]] = i;

    /* prompt */
    char key[16] = "";
    char *context = o.needle ? make_needle(vocab, &o, key) : read_file(o.context_file);
    const char *question = o.question ? o.question : QUESTION;
    int n_ctx_tok, n_q_tok;
    llama_token *ctx_tok = tokenize(vocab, context, 1, &n_ctx_tok);
    llama_token *q_tok = tokenize(vocab, question, 0, &n_q_tok);
    const int n_prompt = n_ctx_tok + n_q_tok;
    llama_token *prompt = xmalloc(sizeof(llama_token) * (size_t)n_prompt);
    memcpy(prompt, ctx_tok, sizeof(llama_token) * (size_t)n_ctx_tok);
    memcpy(prompt + n_ctx_tok, q_tok, sizeof(llama_token) * (size_t)n_q_tok);

    const int decode_time = o.max_cells > 0;
    const int n_cells = decode_time ? o.max_cells : n_prompt + o.n_predict + 1;
    if (decode_time && o.max_cells < 2 * o.chunk) die("--max-cells must be at least twice --chunk");

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n_cells;
    cp.n_batch = cp.n_ubatch = 512;
    cp.n_threads = cp.n_threads_batch = o.threads;
    cp.flash_attn_type = o.flash_attn < 0 ? LLAMA_FLASH_ATTN_TYPE_AUTO
                       : o.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.no_perf = true;

    /* one evictor per method ("full": none), fed by the capture callback */
    struct method *ms = xcalloc((size_t)o.n_methods, sizeof *ms);
    int any = 0;
    for (int i = 0; i < o.n_methods; i++) any |= strcmp(ms[i].name = o.methods[i], "full") != 0;
    struct capture cap = {.n_layer = n_score_l, .n_model_layer = L, .hq = hq, .hkv = hkv, .hd = hd, .d_model = D,
                          .cap = n_cells, .slot = slot, .layer_of = score_l}; /* kvevict */
    double t_gram = 0;
    if (any) {
        capture_init(&cap, ms, o.n_methods, &o); /* kvevict */
        t_gram = now_s();
        load_wo(&cap, o.model); /* kvevict */
        t_gram = now_s() - t_gram;
        cp.cb_eval = capture_cb; cp.cb_eval_user_data = &cap; /* kvevict */
    }
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) die("cannot create a llama.cpp context");
    struct run r = {.ctx = ctx, .cap = any ? &cap : NULL};
    cap.on = any; /* kvevict */

    /* cache bytes per cell: K and V rows of every layer */
    const size_t kv_bytes_per_cell = (size_t)L * hkv * hd * (ggml_type_size(cp.type_k) + ggml_type_size(cp.type_v));
    struct llama_sampler *smpl = llama_sampler_init_greedy();
    struct outcome *out = xcalloc((size_t)o.n_methods, sizeof *out);
    double t_prefill = 0, c_prefill = 0;

    if (!decode_time) {
        /* Question-aware: the prefill stops one token short of the prompt so that the
         * answer's first token is computed on the compressed cache; the question is in the
         * observation window. Question-agnostic: the context alone is prefilled and
         * compressed, the question is decoded afterwards. */
        const int n_pre = o.agnostic ? n_ctx_tok : n_prompt - 1;
        feed(&r, prompt, n_pre, 512);
        t_prefill = r.t_decode;
        c_prefill = r.c_decode;
        cap.on = 0; /* kvevict */
        r.cap = NULL;
        struct snapshot snap = {0};
        if (o.n_methods > 1) {
            if (!any) die("listing only 'full' twice makes no sense");
            snapshot_take(&snap, ctx, &cap);
        }
        for (int i = 0; i < o.n_methods; i++) {
            struct outcome *oc = &out[i];
            oc->method = ms[i].name;
            if (i > 0) snapshot_restore(&snap, ctx, &cap);
            r.pos = n_pre;
            oc->scored = n_pre;
            if (ms[i].ev) maybe_evict(&ms[i], &cap, ctx, 0); /* kvevict */
            oc->cells_kept = ms[i].ev ? cap.n : n_pre;
            if (o.show_kept && ms[i].ev) {
                printf("%s:\n", ms[i].name);
                print_kept(vocab, prompt, &cap);
            }
            if (o.repack && ms[i].ev) {
                /* llama.cpp leaves evicted cells as holes: attention still spans up to the
                 * highest used cell. A sequence's saved state holds only its cells, so
                 * save + clear + restore packs them at the front (positions kept). */
                double t0 = now_s();
                size_t len = llama_state_seq_get_size(ctx, 0);
                uint8_t *buf = xmalloc(len);
                if (llama_state_seq_get_data(ctx, buf, len, 0) != len) die("state save failed");
                llama_memory_seq_rm(llama_get_memory(ctx), 0, -1, -1);
                if (llama_state_seq_set_data(ctx, buf, len, 0) != len) die("state restore failed");
                free(buf);
                oc->t_repack = now_s() - t0;
            }
            feed(&r, prompt + n_pre, n_prompt - n_pre, 512);
            oc->max_used = oc->cells_kept + (n_prompt - n_pre) + o.n_predict - 1;
            double t0 = r.t_decode;
            oc->generated = generate(&r, smpl, vocab, o.n_predict, oc->answer, sizeof oc->answer);
            oc->n_kv = cap.n_kv;
            const int decodes = oc->generated == o.n_predict ? oc->generated - 1 : oc->generated;
            if (decodes > 0) oc->ms_per_token = 1e3 * (r.t_decode - t0) / decodes;
        }
    } else {
        /* decode-time: before every batch the evictor's cell budget decides (maybe_evict) */
        struct outcome *oc = &out[0];
        oc->method = ms[0].name;
        r.evict = &ms[0]; /* kvevict */
        for (int i = 0; i < n_prompt; i += o.chunk) decode(&r, prompt + i, n_prompt - i < o.chunk ? n_prompt - i : o.chunk);
        t_prefill = r.t_decode;
        c_prefill = r.c_decode;
        generate(&r, smpl, vocab, o.n_predict, oc->answer, sizeof oc->answer);
        oc->scored = r.pos;
        oc->cells_kept = cap.n;
        oc->max_used = r.max_used;
    }

    const char *fa = cp.flash_attn_type == LLAMA_FLASH_ATTN_TYPE_ENABLED ? "on"
                   : cp.flash_attn_type == LLAMA_FLASH_ATTN_TYPE_DISABLED ? "off" : "auto";
    printf("model      %s  (L=%d Hq=%d Hkv=%d hd=%d D=%d)\n", o.model, L, hq, hkv, hd, D);
    if (n_score_l < L) {
        printf("scored     %d of %d layers:", n_score_l, L);
        for (int i = 0; i < n_score_l; i++) printf("%s%d", i ? "," : " ", score_l[i]);
        printf("%s\n", swa > 0 ? " (full attention; the others slide over a window)" : "");
    }
    printf("prompt     %d tokens (context %d, question %d)%s%s\n", n_prompt, n_ctx_tok, n_q_tok,
           key[0] ? ", pass key " : "", key);
    if (decode_time)
        printf("mode       decode-time: at most %d cells, evict down to %d, prompt chunks of %d, flash-attn %s\n",
               o.max_cells, (int)(o.max_cells * o.evict_to), o.chunk, fa);
    else
        printf("mode       one-shot, question-%s, keep %.3f of the cache (window inside), flash-attn %s\n",
               o.agnostic ? "agnostic" : "aware", o.keep, fa);
    printf("prefill    %.1f ms, %.1f ms CPU (of it in the capture callback: %.1f ms); Wo %.1f ms once per model\n",
           1e3 * t_prefill, 1e3 * c_prefill, 1e3 * cap.t_copy, 1e3 * t_gram);
    for (int i = 0; i < o.n_methods; i++) {
        struct outcome *oc = &out[i];
        kve_evictor_stats st = {0};
        if (ms[i].ev) KVE(kve_evictor_get_stats(ms[i].ev, 0, &st, sizeof st)); /* kvevict */
        oc->window = ms[i].ev ? (int)ms[i].req.window : 0;
        oc->evictions = (int)st.evictions;
        oc->evicted = (long long)st.cells_evicted;
        oc->t_kve = ms[i].t_kve;
        oc->c_kve = ms[i].c_kve;
        oc->correct = key[0] ? first_digits_match(oc->answer, key, 0) : -1;
        oc->recovered = key[0] ? first_digits_match(oc->answer, key, 1) : -1;
        printf("%-13s kept %4d of %4d cells, %lld evicted (%.2f MiB of KV freed) in %d eviction(s); "
               "kvevict %.1f ms, %.1f ms CPU",
               oc->method, oc->cells_kept, oc->scored, oc->evicted,
               (double)oc->evicted * (double)kv_bytes_per_cell / (1024.0 * 1024.0), oc->evictions, 1e3 * oc->t_kve,
               1e3 * oc->c_kve);
        if (o.repack && ms[i].ev) printf(", repack %.1f ms", 1e3 * oc->t_repack);
        if (oc->n_kv) printf("; attention spans %d cells, %.1f ms/token", oc->n_kv, oc->ms_per_token);
        printf("; answer \"");
        json_escape(stdout, oc->answer);
        printf("\"%s\n", oc->correct < 0 ? "" : oc->correct ? " [correct]" : oc->recovered ? " [key, then more digits]" : " [wrong]");
    }
    for (int i = 0; i < o.n_methods; i++) { /* machine-readable lines */
        struct outcome *oc = &out[i];
        printf("RESULT {\"method\":\"%s\",\"keep\":%.4f,\"agnostic\":%d,\"max_cells\":%d,\"window\":%d,"
               "\"layers_scored\":%d,\"prompt\":%d,\"scored\":%d,\"cells_kept\":%d,\"evicted\":%lld,\"kv_bytes_freed\":%lld,"
               "\"evictions\":%d,\"max_used\":%d,\"key\":\"%s\",\"correct\":%d,\"recovered\":%d,\"prefill_ms\":%.2f,"
               "\"capture_ms\":%.2f,\"wo_ms\":%.2f,\"kvevict_ms\":%.2f,\"repack_ms\":%.2f,\"n_kv\":%d,"
               "\"ms_per_token\":%.2f,\"prefill_cpu_ms\":%.2f,\"kvevict_cpu_ms\":%.2f,\"answer\":\"",
               oc->method, o.keep, o.agnostic, o.max_cells, oc->window, n_score_l, n_prompt, oc->scored,
               oc->cells_kept, oc->evicted, oc->evicted * (long long)kv_bytes_per_cell, oc->evictions, oc->max_used,
               key, oc->correct, oc->recovered, 1e3 * t_prefill, 1e3 * cap.t_copy, 1e3 * t_gram, 1e3 * oc->t_kve,
               1e3 * oc->t_repack, oc->n_kv, oc->ms_per_token, 1e3 * c_prefill, 1e3 * oc->c_kve);
        json_escape(stdout, oc->answer);
        printf("\"}\n");
    }

    llama_sampler_free(smpl);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    free(context); free(ctx_tok); free(q_tok); free(prompt); free(score_l); free(slot);
    return 0;
}
