/* Helpers shared by the examples: deterministic data, f16 conversion, status checks. */
#ifndef KVE_EXAMPLES_COMMON_H
#define KVE_EXAMPLES_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvevict.h"

/* Abort with the library's description of a status. */
#define CHECK(call)                                                                   \
    do {                                                                              \
        int32_t st_ = (call);                                                         \
        if (st_ != KVE_OK) {                                                          \
            fprintf(stderr, "%s:%d: %s -> %s (%s)\n", __FILE__, __LINE__, #call,       \
                    kve_status_name(st_), kve_status_message(st_));                   \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

/* xorshift64: the same numbers on every platform. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static inline float rnd(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
}

/* float -> IEEE half, round to nearest even (what an engine's f16 cache holds). */
static inline uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    int32_t e = (int32_t)((x >> 23) & 0xFF) - 127 + 15;
    uint32_t m = x & 0x7FFFFFu;
    if (((x >> 23) & 0xFF) == 0xFF) return (uint16_t)(sign | 0x7C00u | (m ? 0x200u : 0)); /* inf/nan */
    if (e >= 31) return (uint16_t)(sign | 0x7C00u);                                         /* overflow */
    if (e <= 0) {                                                                           /* subnormal */
        if (e < -10) return (uint16_t)sign;
        m |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (m >> 13);
    uint32_t rem = m & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++; /* may carry into the exponent: fine */
    return (uint16_t)(sign | h);
}

static inline void* xmalloc(size_t bytes) {
    void* p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

/* The kept lists of kve_select_model over `ms`, in buffers of the sizes the library asks for:
 * unit u keeps indices[offsets[u] .. offsets[u + 1]]. With `keep_ws` the workspace stays
 * allocated (`ws`, `ws_bytes`) for another selection over the same scores, else it is freed
 * (`ws` NULL); the caller frees the rest. */
typedef struct {
    uint64_t* offsets;
    uint64_t off_len;
    uint32_t* indices;
    uint64_t idx_len;
    void* ws;
    uint64_t ws_bytes;
} kept_lists;

static inline kept_lists select_lists(const kve_select_params* sel, const kve_model_scores* ms,
                                      int keep_ws) {
    kept_lists k;
    CHECK(kve_select_output_len(sel, ms->layers, ms->hkv, ms->n, ms->window, &k.off_len, &k.idx_len));
    CHECK(kve_select_workspace_size(sel, ms->layers, ms->hkv, ms->n, ms->window, &k.ws_bytes));
    k.offsets = xmalloc(sizeof(uint64_t) * k.off_len);
    k.indices = xmalloc(sizeof(uint32_t) * k.idx_len);
    k.ws = xmalloc(k.ws_bytes);
    CHECK(kve_select_model(sel, ms, k.offsets, k.off_len, k.indices, k.idx_len, k.ws, k.ws_bytes));
    if (!keep_ws) {
        free(k.ws);
        k.ws = NULL;
    }
    return k;
}

#endif
