/*
 * kvevict + llama.cpp: score the KV cache of a GGUF model with kvevict and evict the
 * lowest-value tokens with llama_memory_seq_rm, then generate.
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
 * What is read, and where from:
 *  - post-RoPE queries Qcur-L, keys Kcur-L (op GGML_OP_ROPE) and values Vcur-L (the
 *    reshape), through llama_context_params.cb_eval, for every micro-batch. Queries go
 *    to a ring of the last `window` positions per layer; keys to a per-layer store of
 *    f16 token rows in position order (exactly the bytes llama.cpp writes to its f16
 *    cache); values are reduced at once to LaProx's value forms v·G·vᵀ (9 floats per
 *    token and layer for SmolLM2) and not kept — only LAVa keeps them (f16 rows).
 *    Why a store and not the engine's cache_k_lL tensor: after the first eviction
 *    llama.cpp reuses freed cells for new tokens, so cell order stops being position
 *    order and the observation window is no longer "the last w rows"; a position-ordered
 *    store, compacted with kve_compact_in_place after each eviction, keeps every view a
 *    plain strided tensor. It also works unchanged when the cache lives on a GPU (the
 *    callback copies with ggml_backend_tensor_get). See README.md for reading
 *    cache_k_lL in place instead.
 *  - Wo = blk.L.attn_output.weight, read from the GGUF file with the gguf C API and
 *    dequantized with ggml's type traits, only to build LaProx's Gram matrices
 *    (kve_compute_gram, once per model).
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

enum method { M_FULL, M_LAPROX, M_LAPROX_SPAN, M_LAVA, M_SNAPKV, M_STREAMING, M_KNORM, M_UNIQUENESS };
static const char *METHOD_NAMES[] = {"full", "laprox", "laprox-span", "lava", "snapkv", "streamingllm", "knorm",
                                     "uniqueness"};

struct opts {
    const char *model;
    enum method methods[16];  /* one prefill serves them all (one-shot mode) */
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
    int post_k;             /* laprox-span's forward post pool: kernel (0 = preset's 8) */
    double post_decay;      /* ... and decay (preset's 0.9) */
    const char *score_layers; /* "all" or a list; NULL = the full-attention layers */
};

static void usage(void) {
    fprintf(stderr,
            "usage: kvevict_llama -m MODEL.gguf [options]\n"
            "  --method M[,M..]  full | laprox | laprox-span | lava | snapkv | streamingllm | knorm |\n"
            "                    uniqueness (question-agnostic: no queries)  (laprox-span);\n"
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
            "  --span-pool K:D   laprox-span's forward post pool (preset 8:0.9)\n"
            "  --show-kept       print the text of the cells kept (one-shot mode)\n"
            "  --repack          one-shot: after evicting, move the kept cells to the front of the cache\n"
            "                    (state save, clear, restore) so attention spans fewer cells\n"
            "  --score-layers L  layers whose scores choose the kept cells: all, or a list (0,5,11);\n"
            "                    default: every layer, but only the full-attention ones of a\n"
            "                    sliding-window model (Gemma 2/3, Cohere 2)\n"
            "  -v                verbose (llama.cpp's log)\n");
    exit(2);
}

static void parse_methods(const char *list, struct opts *o) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    o->n_methods = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int found = -1;
        for (int i = 0; i < (int)(sizeof METHOD_NAMES / sizeof *METHOD_NAMES); i++)
            if (!strcmp(tok, METHOD_NAMES[i])) found = i;
        if (found < 0) die("unknown method '%s'", tok);
        if (o->n_methods == 16) die("too many methods");
        o->methods[o->n_methods++] = (enum method)found;
    }
    if (!o->n_methods) die("--method needs at least one method");
}

static void parse_args(int argc, char **argv, struct opts *o) {
    memset(o, 0, sizeof *o);
    o->methods[0] = M_LAPROX_SPAN;
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
    if (o->max_cells && (o->n_methods != 1 || o->methods[0] == M_FULL))
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

/* --------------------------------------------------------------- capture (cb_eval) */

struct capture {
    int n_layer, hq, hkv, hd, g; /* n_layer: the scored layers, stored in model order */
    int n_model_layer;
    int *slot;       /* [n_model_layer] -> store index of a model layer, -1 = not scored */
    int *layer_of;   /* [n_layer] -> its model layer */
    int w;           /* query ring length = observation window */
    int cap;         /* store capacity in tokens */
    int n;           /* tokens in the stores (all layers agree between decode calls) */
    int on;          /* capture enabled */
    int keep_v;      /* LAVa: keep V rows */
    int forms;       /* LaProx: reduce V to value forms */
    int32_t *pos;    /* [cap] position of store row i */
    float **qring;   /* [L] -> [w][hq*hd], slot = pos % w */
    ggml_fp16_t **k; /* [L] -> [cap][hkv*hd] */
    ggml_fp16_t **v; /* [L] -> [cap][hkv*hd] (keep_v) */
    float **vf;      /* [L] -> [cap][hkv*g] (forms) */
    int *q_pos, *k_row, *v_row; /* [L] where the next micro-batch lands */
    float *tmp;      /* staging for ggml_backend_tensor_get */
    size_t tmp_len;
    float *ftmp;     /* [hkv][g][T] value forms of one micro-batch */
    size_t ftmp_len;
    float **gram;    /* [L] Gram blocks */
    uint64_t gram_len;
    double t_copy, t_forms; /* seconds in the callback: copies, value forms */
    double c_forms;  /* CPU seconds of the value forms */
    int n_kv;        /* cells the last graph's attention spans (cache_k_l0 view) */
};

static int match_layer(const char *name, const char *prefix) {
    size_t n = strlen(prefix);
    if (strncmp(name, prefix, n)) return -1;
    const char *p = name + n;
    if (!*p) return -1;
    int l = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        l = l * 10 + (*p - '0');
    }
    return l;
}

/* kind: 0 = Q, 1 = K, 2 = V; layer in *layer; -1 when not wanted */
static int wanted(const struct capture *c, const struct ggml_tensor *t, int *layer) {
    int l;
    int kind = -1;
    if (t->op == GGML_OP_ROPE) {
        if ((l = match_layer(t->name, "Qcur-")) >= 0) kind = 0;
        else if ((l = match_layer(t->name, "Kcur-")) >= 0) kind = 1;
    } else if (t->op == GGML_OP_RESHAPE && (c->keep_v || c->forms)) {
        if ((l = match_layer(t->name, "Vcur-")) >= 0) kind = 2;
    }
    if (kind < 0 || l >= c->n_model_layer || c->slot[l] < 0) return -1; /* a layer not scored */
    *layer = c->slot[l];
    return kind;
}

static void ensure_tmp(float **buf, size_t *len, size_t need) {
    if (*len < need) {
        free(*buf);
        *buf = xmalloc(need * sizeof(float));
        *len = need;
    }
}

static bool capture_cb(struct ggml_tensor *t, bool ask, void *ud) {
    struct capture *c = ud;
    if (ask && t->op == GGML_OP_VIEW && !strcmp(t->name, "cache_k_l0 (view)")) c->n_kv = (int)t->ne[2];
    if (!c->on) return ask ? false : true;
    int l = -1;
    int kind = wanted(c, t, &l);
    if (ask) return kind >= 0 && l < c->n_layer;
    if (kind < 0 || l >= c->n_layer) return true;
    double t0 = now_s();
    const int heads = kind == 0 ? c->hq : c->hkv;
    if (t->type != GGML_TYPE_F32 || t->ne[0] != c->hd || t->ne[1] != heads || t->ne[3] != 1)
        die("unexpected shape/type for %s: [%lld,%lld,%lld,%lld] type %d", t->name, (long long)t->ne[0],
            (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3], (int)t->type);
    const int T = (int)t->ne[2];
    const size_t row = (size_t)heads * c->hd;
    ensure_tmp(&c->tmp, &c->tmp_len, row * T);
    if (ggml_is_contiguous(t)) {
        ggml_backend_tensor_get(t, c->tmp, 0, row * T * sizeof(float));
    } else {
        for (int i = 0; i < T; i++) /* rows of heads*hd floats, nb[2] apart */
            for (int h = 0; h < heads; h++)
                ggml_backend_tensor_get(t, c->tmp + (size_t)i * row + (size_t)h * c->hd, i * t->nb[2] + h * t->nb[1],
                                        c->hd * sizeof(float));
    }
    if (kind == 0) {
        for (int i = 0; i < T; i++) {
            int p = c->q_pos[l] + i;
            memcpy(c->qring[l] + (size_t)(p % c->w) * row, c->tmp + (size_t)i * row, row * sizeof(float));
        }
        c->q_pos[l] += T;
    } else if (kind == 1) {
        if (c->k_row[l] + T > c->cap) die("key store full (%d + %d > %d)", c->k_row[l], T, c->cap);
        ggml_fp32_to_fp16_row(c->tmp, c->k[l] + (size_t)c->k_row[l] * row, (int64_t)row * T);
        c->k_row[l] += T;
    } else {
        int r0 = c->v_row[l];
        if (r0 + T > c->cap) die("value store full");
        if (c->keep_v) ggml_fp32_to_fp16_row(c->tmp, c->v[l] + (size_t)r0 * row, (int64_t)row * T);
        if (c->forms) {
            double t1 = now_s(), c1 = cpu_s();
            /* v·G·vᵀ for the T new tokens: values [Hkv, T, hd] token-major rows */
            kve_tensor vt = {.data = c->tmp, .len = row * T, .dtype = KVE_DTYPE_F32,
                             .extent = {(uint64_t)c->hkv, (uint64_t)T, (uint64_t)c->hd},
                             .stride = {(uint64_t)c->hd, row, 1}};
            size_t fl = (size_t)c->hkv * c->g * T;
            ensure_tmp(&c->ftmp, &c->ftmp_len, fl);
            KVE(kve_compute_value_forms(&vt, c->gram[l], c->gram_len, (uint64_t)c->hq, 0, 0, (uint64_t)T, c->ftmp, fl));
            const int nf = c->hkv * c->g; /* [Hkv][g][T] -> rows [T][Hkv*g] */
            for (int i = 0; i < T; i++)
                for (int b = 0; b < nf; b++) c->vf[l][(size_t)(r0 + i) * nf + b] = c->ftmp[(size_t)b * T + i];
            c->t_forms += now_s() - t1;
            c->c_forms += cpu_s() - c1;
        }
        c->v_row[l] += T;
    }
    c->t_copy += now_s() - t0;
    return true;
}

/* `layers`: the L model layers scored (ascending), of `n_model_layer`. */
static void capture_init(struct capture *c, const int *layers, int L, int n_model_layer, int hq, int hkv, int hd, int w,
                         int cap, int keep_v, int forms) {
    memset(c, 0, sizeof *c);
    c->n_layer = L; c->hq = hq; c->hkv = hkv; c->hd = hd; c->g = hq / hkv;
    c->n_model_layer = n_model_layer;
    c->slot = xmalloc((size_t)n_model_layer * sizeof(int));
    for (int l = 0; l < n_model_layer; l++) c->slot[l] = -1;
    c->layer_of = xmalloc((size_t)L * sizeof(int));
    for (int i = 0; i < L; i++) { c->layer_of[i] = layers[i]; c->slot[layers[i]] = i; }
    c->w = w; c->cap = cap; c->keep_v = keep_v; c->forms = forms;
    c->pos = xcalloc((size_t)cap, sizeof(int32_t));
    c->qring = xcalloc((size_t)L, sizeof(float *));
    c->k = xcalloc((size_t)L, sizeof(ggml_fp16_t *));
    c->v = xcalloc((size_t)L, sizeof(ggml_fp16_t *));
    c->vf = xcalloc((size_t)L, sizeof(float *));
    c->q_pos = xcalloc((size_t)L, sizeof(int));
    c->k_row = xcalloc((size_t)L, sizeof(int));
    c->v_row = xcalloc((size_t)L, sizeof(int));
    for (int l = 0; l < L; l++) {
        c->qring[l] = xcalloc((size_t)w * hq * hd, sizeof(float));
        c->k[l] = xmalloc((size_t)cap * hkv * hd * sizeof(ggml_fp16_t));
        if (keep_v) c->v[l] = xmalloc((size_t)cap * hkv * hd * sizeof(ggml_fp16_t));
        if (forms) c->vf[l] = xmalloc((size_t)cap * hkv * c->g * sizeof(float));
    }
}

/* Before llama_decode of `nt` tokens at positions p0..p0+nt-1. */
static void capture_begin(struct capture *c, int p0, int nt) {
    if (c->n + nt > c->cap) die("capture stores full (%d + %d > %d)", c->n, nt, c->cap);
    for (int l = 0; l < c->n_layer; l++) {
        c->q_pos[l] = p0;
        c->k_row[l] = c->v_row[l] = c->n;
    }
    for (int i = 0; i < nt; i++) c->pos[c->n + i] = p0 + i;
}

/* After llama_decode: every layer must have seen exactly nt tokens. */
static void capture_end(struct capture *c, int nt) {
    for (int l = 0; l < c->n_layer; l++) {
        if (c->k_row[l] != c->n + nt)
            die("layer %d: captured %d keys, expected %d", c->layer_of[l], c->k_row[l] - c->n, nt);
        if ((c->keep_v || c->forms) && c->v_row[l] != c->n + nt) die("layer %d: values not captured", c->layer_of[l]);
    }
    c->n += nt;
}

/* ----------------------------------------------------------------- Wo and the Gram */

/* Gram blocks of every layer from blk.L.attn_output.weight (read from the file, only
 * those tensors, dequantized with ggml's type traits). Returns seconds spent. */
static double load_gram(struct capture *c, const char *path, int d_model) {
    double t0 = now_s();
    struct ggml_context *meta = NULL;
    struct gguf_init_params gp = {.no_alloc = true, .ctx = &meta};
    struct gguf_context *g = gguf_init_from_file(path, gp);
    if (!g) die("gguf_init_from_file(%s) failed", path);
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open %s", path);
    const int dv = c->hd, in = c->hq * dv;
    KVE(kve_gram_len((uint64_t)c->hq, (uint64_t)c->hkv, (uint64_t)dv, 0, &c->gram_len));
    uint64_t wsb;
    KVE(kve_gram_workspace_size((uint64_t)dv, (uint64_t)d_model, &wsb));
    void *ws = xmalloc(wsb);
    float *w = xmalloc((size_t)in * d_model * sizeof(float));
    c->gram = xcalloc((size_t)c->n_layer, sizeof(float *));
    for (int l = 0; l < c->n_layer; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.attn_output.weight", c->layer_of[l]);
        int64_t id = gguf_find_tensor(g, name);
        if (id < 0) die("%s not in %s", name, path);
        struct ggml_tensor *t = ggml_get_tensor(meta, name);
        if (!t || t->ne[0] != in || t->ne[1] != d_model)
            die("%s: unexpected shape (want [%d, %d])", name, in, d_model);
        size_t sz = gguf_get_tensor_size(g, id);
        void *raw = xmalloc(sz);
        if (fseek(f, (long)(gguf_get_data_offset(g) + gguf_get_tensor_offset(g, id)), SEEK_SET) ||
            fread(raw, 1, sz, f) != sz)
            die("cannot read %s", name);
        enum ggml_type ty = gguf_get_tensor_type(g, id);
        if (ty == GGML_TYPE_F32) memcpy(w, raw, (size_t)in * d_model * sizeof(float));
        else {
            const struct ggml_type_traits *tr = ggml_get_type_traits(ty);
            if (!tr->to_float) die("%s: cannot dequantize type %s", name, ggml_type_name(ty));
            tr->to_float(raw, w, (int64_t)in * d_model);
        }
        free(raw);
        /* ggml row r = output feature r holds the inputs h*dv + j: Wo[h][j][r] = w[r*in + h*dv + j] */
        kve_tensor wo = {.data = w, .len = (uint64_t)in * d_model, .dtype = KVE_DTYPE_F32,
                         .extent = {(uint64_t)c->hq, (uint64_t)dv, (uint64_t)d_model},
                         .stride = {(uint64_t)dv, 1, (uint64_t)in}};
        c->gram[l] = xmalloc(c->gram_len * sizeof(float));
        KVE(kve_compute_gram(&wo, (uint64_t)c->hkv, 0, c->gram[l], c->gram_len, ws, wsb));
    }
    free(w);
    free(ws);
    fclose(f);
    gguf_free(g);
    ggml_free(meta);
    return now_s() - t0;
}

/* ------------------------------------------------------------------ scoring, eviction */

struct scorer {
    enum method method;
    kve_score_params sp;
    kve_select_params sel;
    int window;
    float *scores; size_t scores_len;
    float *q; size_t q_len;     /* [w][hq*hd] linearised ring */
    float *f; size_t f_len;     /* [Hkv][g][n] value forms */
    void *ws; size_t ws_len;
    uint64_t *offsets; size_t offsets_len;
    uint32_t *indices; size_t indices_len;
    uint32_t *evicted; size_t evicted_len;
    /* totals */
    int evictions;
    long long cells_evicted;
    double t_score, t_select, t_rm, t_compact;
    double c_total; /* CPU seconds of all of the above */
};

static void scorer_init(struct scorer *s, enum method m, int window, int post_k, double post_decay) {
    memset(s, 0, sizeof *s);
    s->method = m;
    uint32_t preset = m == M_LAPROX ? KVE_PRESET_LAPROX : m == M_LAPROX_SPAN ? KVE_PRESET_LAPROX_SPAN
                    : m == M_LAVA ? KVE_PRESET_LAVA : m == M_SNAPKV ? KVE_PRESET_SNAPKV
                    : m == M_STREAMING ? KVE_PRESET_STREAMINGLLM : m == M_UNIQUENESS ? KVE_PRESET_UNIQUENESS
                    : KVE_PRESET_KNORM;
    KVE(kve_score_params_init(&s->sp, sizeof s->sp, preset));
    if (window > 0) s->sp.window = (uint32_t)window;
    s->window = (int)s->sp.window;
    /* llama.cpp's cell holds one token for every layer and head: token granularity,
     * one global top-K over the layer-normalised sum of scores. */
    if (m == M_LAPROX_SPAN || m == M_UNIQUENESS) {
        KVE(kve_select_params_init_laprox_span(&s->sel, sizeof s->sel, 0));
        if (post_k > 0) {
            s->sel.post_pool_kernel = (uint32_t)post_k;
            s->sel.post_pool_decay = (float)post_decay;
        }
    }
    else KVE(kve_select_params_init(&s->sel, sizeof s->sel, KVE_ALLOCATOR_GLOBAL, KVE_GRANULARITY_TOKEN, 0));
}

#define GROW(ptr, len, need)                                        \
    do {                                                            \
        if ((len) < (size_t)(need)) {                               \
            free(ptr);                                              \
            (len) = (size_t)(need);                                 \
            (ptr) = xmalloc((len) * sizeof *(ptr));                 \
        }                                                           \
    } while (0)

/* Merge evicted store rows into position runs and remove them from llama.cpp's cache. */
static void remove_rows(struct llama_context *ctx, const struct capture *c, const uint32_t *rows, size_t n) {
    llama_memory_t mem = llama_get_memory(ctx);
    size_t i = 0;
    while (i < n) {
        int p0 = c->pos[rows[i]], p1 = p0 + 1;
        size_t j = i + 1;
        while (j < n && c->pos[rows[j]] == p1) { p1++; j++; }
        if (!llama_memory_seq_rm(mem, 0, p0, p1)) die("llama_memory_seq_rm(%d, %d) failed", p0, p1);
        i = j;
    }
}

/* Score the stored tokens, keep `budget` prefix tokens plus the window, evict the rest
 * from llama.cpp and compact the stores. Returns the number of cells evicted. */
static int compress(struct scorer *s, struct capture *c, struct llama_context *ctx, uint64_t budget) {
    const int n = c->n, L = c->n_layer, hkv = c->hkv, hq = c->hq, hd = c->hd, g = c->g;
    const int w = s->window < n ? s->window : n;
    const int P = n - w;
    if (P <= 0 || budget >= (uint64_t)P) return 0;
    double t0 = now_s(), c0 = cpu_s();
    const size_t krow = (size_t)hkv * hd;
    uint64_t per_layer, wsb = 0;
    KVE(kve_score_output_len(&s->sp, (uint64_t)hkv, (uint64_t)n, &per_layer));
    KVE(kve_score_workspace_size(&s->sp, (uint64_t)hq, (uint64_t)hkv, (uint64_t)n, (uint64_t)hd, (uint64_t)hd, &wsb));
    GROW(s->scores, s->scores_len, per_layer * L);
    GROW(s->q, s->q_len, (size_t)s->window * hq * hd);
    GROW(s->f, s->f_len, (size_t)hkv * g * n);
    if (s->ws_len < wsb) { free(s->ws); s->ws = xmalloc(wsb); s->ws_len = wsb; }
    const int needs_q = s->method != M_STREAMING && s->method != M_KNORM && s->method != M_UNIQUENESS;
    for (int l = 0; l < L; l++) {
        kve_layer_inputs in;
        KVE(kve_layer_inputs_init(&in, sizeof in));
        in.keys = (kve_tensor){.data = c->k[l], .len = (uint64_t)n * krow, .dtype = KVE_DTYPE_F16,
                               .extent = {(uint64_t)hkv, (uint64_t)n, (uint64_t)hd},
                               .stride = {(uint64_t)hd, krow, 1}};
        if (needs_q) {
            /* the window's queries, oldest first: positions pos[n-w] .. pos[n-1] */
            const size_t qrow = (size_t)hq * hd;
            for (int j = 0; j < w; j++)
                memcpy(s->q + (size_t)j * qrow, c->qring[l] + (size_t)(c->pos[n - w + j] % c->w) * qrow,
                       qrow * sizeof(float));
            in.queries = (kve_tensor){.data = s->q, .len = (uint64_t)w * qrow, .dtype = KVE_DTYPE_F32,
                                      .extent = {(uint64_t)hq, (uint64_t)w, (uint64_t)hd},
                                      .stride = {(uint64_t)hd, qrow, 1}};
        }
        if (c->keep_v)
            in.values = (kve_tensor){.data = c->v[l], .len = (uint64_t)n * krow, .dtype = KVE_DTYPE_F16,
                                     .extent = {(uint64_t)hkv, (uint64_t)n, (uint64_t)hd},
                                     .stride = {(uint64_t)hd, krow, 1}};
        if (c->forms) {
            const int nf = hkv * g; /* rows [n][Hkv*g] -> [Hkv][g][n] */
            for (int b = 0; b < nf; b++)
                for (int i = 0; i < n; i++) s->f[(size_t)b * n + i] = c->vf[l][(size_t)i * nf + b];
            in.value_forms = s->f;
            in.value_forms_len = (uint64_t)nf * n;
        }
        KVE(kve_score_layer(&s->sp, &in, s->scores + (size_t)l * per_layer, per_layer, s->ws, wsb));
    }
    double t1 = now_s();
    s->t_score += t1 - t0;

    s->sel.budget = budget;
    uint64_t no, ni, swsb;
    KVE(kve_select_output_len(&s->sel, (uint64_t)L, (uint64_t)hkv, (uint64_t)n, (uint64_t)w, &no, &ni));
    KVE(kve_select_workspace_size(&s->sel, (uint64_t)L, (uint64_t)hkv, (uint64_t)n, (uint64_t)w, &swsb));
    GROW(s->offsets, s->offsets_len, no);
    GROW(s->indices, s->indices_len, ni);
    GROW(s->evicted, s->evicted_len, (size_t)P);
    if (s->ws_len < swsb) { free(s->ws); s->ws = xmalloc(swsb); s->ws_len = swsb; }
    kve_model_scores ms = {.scores = s->scores, .len = per_layer * L, .layers = (uint64_t)L,
                           .hkv = (uint64_t)hkv, .n = (uint64_t)n, .window = (uint64_t)w};
    KVE(kve_select_model(&s->sel, &ms, s->offsets, no, s->indices, ni, s->ws, swsb));
    /* token granularity: every (layer, head) holds the same list; take unit 0 */
    const uint32_t *kept = s->indices + s->offsets[0];
    const uint64_t nkept = s->offsets[1] - s->offsets[0];
    uint64_t ne = 0;
    KVE(kve_evicted_positions(kept, nkept, (uint64_t)P, s->evicted, (uint64_t)P, &ne));
    double t2 = now_s();
    s->t_select += t2 - t1;

    remove_rows(ctx, c, s->evicted, (size_t)ne);
    double t3 = now_s();
    s->t_rm += t3 - t2;

    /* compact the stores: token rows viewed as one head, kept rows to the front */
    uint64_t off2[2] = {0, nkept};
    uint32_t len1;
    for (int l = 0; l < L; l++) {
        kve_tensor kt = {.data = c->k[l], .len = (uint64_t)n * krow, .dtype = KVE_DTYPE_F16,
                         .extent = {1, (uint64_t)n, krow}, .stride = {(uint64_t)n * krow, krow, 1}};
        KVE(kve_compact_in_place(&kt, off2, 2, kept, nkept, &len1, 1));
        if (c->keep_v) {
            kt.data = c->v[l];
            KVE(kve_compact_in_place(&kt, off2, 2, kept, nkept, &len1, 1));
        }
        if (c->forms) {
            const uint64_t nf = (uint64_t)hkv * g;
            kve_tensor ft = {.data = c->vf[l], .len = (uint64_t)n * nf, .dtype = KVE_DTYPE_F32,
                             .extent = {1, (uint64_t)n, nf}, .stride = {(uint64_t)n * nf, nf, 1}};
            KVE(kve_compact_in_place(&ft, off2, 2, kept, nkept, &len1, 1));
        }
    }
    for (uint64_t i = 0; i < nkept; i++) c->pos[i] = c->pos[kept[i]];
    c->n = (int)nkept;
    s->t_compact += now_s() - t3;
    s->c_total += cpu_s() - c0;
    s->evictions++;
    s->cells_evicted += (long long)ne;
    return (int)ne;
}

/* ------------------------------------------------------------------------ decoding */

struct run {
    struct llama_context *ctx;
    struct capture *cap;   /* NULL for the full cache */
    double t_decode, c_decode; /* wall and CPU seconds in llama_decode */
    int pos;               /* next position */
};

static void decode(struct run *r, llama_token *toks, int nt) {
    if (r->cap) capture_begin(r->cap, r->pos, nt);
    struct llama_batch b = llama_batch_get_one(toks, nt);
    double t0 = now_s(), c0 = cpu_s();
    int rc = llama_decode(r->ctx, b);
    r->t_decode += now_s() - t0;
    r->c_decode += cpu_s() - c0;
    if (rc) die("llama_decode failed (%d) at position %d with %d tokens", rc, r->pos, nt);
    if (r->cap) capture_end(r->cap, nt);
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
    size_t state_len;
    int n;
    int32_t *pos;
    ggml_fp16_t **k, **v;
    float **vf;
};

static void snapshot_take(struct snapshot *s, struct llama_context *ctx, const struct capture *c) {
    s->state_len = llama_state_seq_get_size(ctx, 0);
    s->state = xmalloc(s->state_len);
    if (llama_state_seq_get_data(ctx, s->state, s->state_len, 0) != s->state_len) die("state snapshot failed");
    s->n = c->n;
    s->pos = xmalloc(sizeof(int32_t) * (size_t)c->n);
    memcpy(s->pos, c->pos, sizeof(int32_t) * (size_t)c->n);
    const size_t row = (size_t)c->hkv * c->hd, nf = (size_t)c->hkv * c->g;
    s->k = xcalloc((size_t)c->n_layer, sizeof *s->k);
    s->v = xcalloc((size_t)c->n_layer, sizeof *s->v);
    s->vf = xcalloc((size_t)c->n_layer, sizeof *s->vf);
    for (int l = 0; l < c->n_layer; l++) {
        s->k[l] = xmalloc(row * c->n * sizeof(ggml_fp16_t));
        memcpy(s->k[l], c->k[l], row * c->n * sizeof(ggml_fp16_t));
        if (c->keep_v) {
            s->v[l] = xmalloc(row * c->n * sizeof(ggml_fp16_t));
            memcpy(s->v[l], c->v[l], row * c->n * sizeof(ggml_fp16_t));
        }
        if (c->forms) {
            s->vf[l] = xmalloc(nf * c->n * sizeof(float));
            memcpy(s->vf[l], c->vf[l], nf * c->n * sizeof(float));
        }
    }
}

static void snapshot_restore(const struct snapshot *s, struct llama_context *ctx, struct capture *c) {
    llama_memory_seq_rm(llama_get_memory(ctx), 0, -1, -1);
    if (llama_state_seq_set_data(ctx, s->state, s->state_len, 0) != s->state_len) die("state restore failed");
    c->n = s->n;
    memcpy(c->pos, s->pos, sizeof(int32_t) * (size_t)s->n);
    const size_t row = (size_t)c->hkv * c->hd, nf = (size_t)c->hkv * c->g;
    for (int l = 0; l < c->n_layer; l++) {
        memcpy(c->k[l], s->k[l], row * s->n * sizeof(ggml_fp16_t));
        if (c->keep_v) memcpy(c->v[l], s->v[l], row * s->n * sizeof(ggml_fp16_t));
        if (c->forms) memcpy(c->vf[l], s->vf[l], nf * s->n * sizeof(float));
    }
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
    enum method method;
    int window, scored, cells_kept, evictions, max_used, correct, recovered;
    long long evicted;
    double t_kve, t_score, t_select, t_rm, t_compact, t_repack, ms_per_token, c_kve;
    int n_kv, generated;
    char answer[512];
};

/* Greedy decoding from the logits of the last decoded token. `budget_cb` (decode-time
 * mode) runs before each token is decoded. */
static int generate(struct run *r, struct llama_sampler *smpl, const struct llama_vocab *vocab, int n_predict,
                    char *answer, size_t cap, struct scorer *sc, int max_cells, uint64_t budget, int *max_used) {
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
        if (max_cells && r->cap->n + 1 > max_cells) compress(sc, r->cap, r->ctx, budget);
        decode(r, &t, 1);
        if (r->cap && r->cap->n > *max_used) *max_used = r->cap->n;
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
    int *score_l = xmalloc((size_t)L * sizeof(int)), swa = 0;
    const int n_score_l = scored_layers(model, L, o.score_layers, score_l, &swa);

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

    /* what the listed methods need captured */
    int any = 0, keep_v = 0, forms = 0, ring = 1;
    struct scorer *sc = xcalloc((size_t)o.n_methods, sizeof *sc);
    for (int i = 0; i < o.n_methods; i++) {
        enum method m = o.methods[i];
        if (m == M_FULL) continue;
        any = 1;
        scorer_init(&sc[i], m, o.window, o.post_k, o.post_decay);
        if (sc[i].window > ring) ring = sc[i].window;
        keep_v |= m == M_LAVA || m == M_UNIQUENESS;
        forms |= m == M_LAPROX || m == M_LAPROX_SPAN;
    }

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n_cells;
    cp.n_batch = cp.n_ubatch = 512;
    cp.n_threads = cp.n_threads_batch = o.threads;
    cp.flash_attn_type = o.flash_attn < 0 ? LLAMA_FLASH_ATTN_TYPE_AUTO
                       : o.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.no_perf = true;

    struct capture cap;
    memset(&cap, 0, sizeof cap);
    double t_gram = 0;
    if (any) {
        capture_init(&cap, score_l, n_score_l, L, hq, hkv, hd, ring, n_cells, keep_v, forms);
        if (forms) t_gram = load_gram(&cap, o.model, D);
        cp.cb_eval = capture_cb;
        cp.cb_eval_user_data = &cap;
    }
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) die("cannot create a llama.cpp context");
    struct run r = {.ctx = ctx, .cap = any ? &cap : NULL, .t_decode = 0, .pos = 0};
    cap.on = any;

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
        cap.on = 0;
        r.cap = NULL;
        struct snapshot snap = {0};
        if (o.n_methods > 1) {
            if (!any) die("listing only 'full' twice makes no sense");
            snapshot_take(&snap, ctx, &cap);
        }
        for (int i = 0; i < o.n_methods; i++) {
            struct outcome *oc = &out[i];
            oc->method = o.methods[i];
            if (i > 0) snapshot_restore(&snap, ctx, &cap);
            r.pos = n_pre;
            oc->scored = n_pre;
            oc->cells_kept = n_pre;
            if (oc->method != M_FULL) {
                const int w = sc[i].window < cap.n ? sc[i].window : cap.n;
                const uint64_t budget = kve_budget_keep_ratio_total((uint64_t)cap.n, (uint64_t)w, o.keep);
                compress(&sc[i], &cap, ctx, budget);
                oc->cells_kept = cap.n;
                oc->window = sc[i].window;
                if (o.show_kept) {
                    printf("%s:\n", METHOD_NAMES[oc->method]);
                    print_kept(vocab, prompt, &cap);
                }
            }
            if (o.repack && oc->method != M_FULL) {
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
            oc->generated = generate(&r, smpl, vocab, o.n_predict, oc->answer, sizeof oc->answer, NULL, 0, 0, NULL);
            oc->n_kv = cap.n_kv;
            const int decodes = oc->generated == o.n_predict ? oc->generated - 1 : oc->generated;
            if (decodes > 0) oc->ms_per_token = 1e3 * (r.t_decode - t0) / decodes;
        }
    } else {
        /* decode-time: evict whenever the next batch would not fit in max_cells */
        struct outcome *oc = &out[0];
        struct scorer *s = &sc[0];
        oc->method = o.methods[0];
        oc->window = s->window;
        const int target = (int)(o.max_cells * o.evict_to);
        if (target <= s->window + 1) die("--max-cells * --evict-to must exceed the window");
        const uint64_t budget = (uint64_t)(target - s->window);
        for (int i = 0; i < n_prompt;) {
            int nt = n_prompt - i < o.chunk ? n_prompt - i : o.chunk;
            if (cap.n + nt > o.max_cells) compress(s, &cap, ctx, budget);
            decode(&r, prompt + i, nt);
            if (cap.n > oc->max_used) oc->max_used = cap.n;
            i += nt;
        }
        t_prefill = r.t_decode;
        c_prefill = r.c_decode;
        generate(&r, smpl, vocab, o.n_predict, oc->answer, sizeof oc->answer, s, o.max_cells, budget, &oc->max_used);
        oc->scored = r.pos;
        oc->cells_kept = cap.n;
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
    printf("prefill    %.1f ms, %.1f ms CPU (of it in the capture callback: %.1f ms, LaProx value forms %.1f ms, "
           "%.1f ms CPU); Gram %.1f ms once per model\n",
           1e3 * t_prefill, 1e3 * c_prefill, 1e3 * cap.t_copy, 1e3 * cap.t_forms, 1e3 * cap.c_forms, 1e3 * t_gram);
    for (int i = 0; i < o.n_methods; i++) {
        struct outcome *oc = &out[i];
        struct scorer *s = &sc[i];
        oc->evictions = s->evictions;
        oc->evicted = s->cells_evicted;
        oc->t_score = s->t_score; oc->t_select = s->t_select; oc->t_rm = s->t_rm; oc->t_compact = s->t_compact;
        oc->t_kve = oc->t_score + oc->t_select + oc->t_rm + oc->t_compact;
        oc->c_kve = s->c_total;
        oc->correct = key[0] ? first_digits_match(oc->answer, key, 0) : -1;
        oc->recovered = key[0] ? first_digits_match(oc->answer, key, 1) : -1;
        printf("%-13s kept %4d of %4d cells, %lld evicted (%.2f MiB of KV freed) in %d eviction(s); "
               "kvevict %.1f ms, %.1f ms CPU (score %.1f, select %.1f, seq_rm %.1f, compact %.1f)",
               METHOD_NAMES[oc->method], oc->cells_kept, oc->scored, oc->evicted,
               (double)oc->evicted * (double)kv_bytes_per_cell / (1024.0 * 1024.0), oc->evictions, 1e3 * oc->t_kve,
               1e3 * oc->c_kve, 1e3 * oc->t_score, 1e3 * oc->t_select, 1e3 * oc->t_rm, 1e3 * oc->t_compact);
        if (o.repack && oc->method != M_FULL) printf(", repack %.1f ms", 1e3 * oc->t_repack);
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
               "\"capture_ms\":%.2f,\"forms_ms\":%.2f,\"gram_ms\":%.2f,\"kvevict_ms\":%.2f,\"score_ms\":%.2f,"
               "\"select_ms\":%.2f,\"seq_rm_ms\":%.2f,\"compact_ms\":%.2f,\"repack_ms\":%.2f,\"n_kv\":%d,"
               "\"ms_per_token\":%.2f,\"prefill_cpu_ms\":%.2f,\"forms_cpu_ms\":%.2f,\"kvevict_cpu_ms\":%.2f,"
               "\"answer\":\"",
               METHOD_NAMES[oc->method], o.keep, o.agnostic, o.max_cells, oc->window, n_score_l, n_prompt, oc->scored,
               oc->cells_kept, oc->evicted, oc->evicted * (long long)kv_bytes_per_cell, oc->evictions, oc->max_used,
               key, oc->correct, oc->recovered, 1e3 * t_prefill, 1e3 * cap.t_copy, 1e3 * cap.t_forms, 1e3 * t_gram,
               1e3 * oc->t_kve, 1e3 * oc->t_score, 1e3 * oc->t_select, 1e3 * oc->t_rm, 1e3 * oc->t_compact,
               1e3 * oc->t_repack, oc->n_kv, oc->ms_per_token, 1e3 * c_prefill, 1e3 * cap.c_forms, 1e3 * oc->c_kve);
        json_escape(stdout, oc->answer);
        printf("\"}\n");
    }

    llama_sampler_free(smpl);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    free(context); free(ctx_tok); free(q_tok); free(prompt); free(score_l);
    return 0;
}
