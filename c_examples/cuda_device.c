/* LaProx-span on device memory, with the engine's CUDA stream: a 4-layer model whose
 * cache is laid out as llama.cpp's (f16 K rows [N][Hkv*d], transposed V [Hkv*d][N]).
 * Per layer kve_cuda_score_layer (LaProx, value norms through the Gram on tensor
 * cores); one kve_cuda_select_model for the whole model (token granularity: one set of
 * cells for every layer and head, forward post-pooling); kve_cuda_compact_in_place of
 * each layer's K rows. Everything is enqueued on one stream with no host round trip;
 * then the kept set is compared with the host path's.
 *
 * Built against a library with feature `cuda` define KVE_EXAMPLE_WITH_CUDA and link the
 * CUDA runtime. Without a GPU it prints "skipped: no CUDA device"; against a library
 * built without CUDA, "skipped: library built without CUDA".
 */
#include "common.h"

#ifdef KVE_EXAMPLE_WITH_CUDA
/* The few CUDA runtime calls used (declared here so no CUDA header is needed). */
typedef int cudaError_t;
typedef void* cudaStream_t;
extern cudaError_t cudaMalloc(void** p, size_t bytes);
extern cudaError_t cudaFree(void* p);
extern cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, int kind);
extern cudaError_t cudaStreamCreate(cudaStream_t* s);
extern cudaError_t cudaStreamSynchronize(cudaStream_t s);
extern cudaError_t cudaStreamDestroy(cudaStream_t s);
enum { H2D = 1, D2H = 2 };
#define CUDA(call)                                                            \
    do {                                                                      \
        if ((call) != 0) {                                                    \
            fprintf(stderr, "%s:%d: %s failed\n", __FILE__, __LINE__, #call); \
            exit(1);                                                          \
        }                                                                     \
    } while (0)

static void* dev_upload(const void* host, size_t bytes) {
    void* d = NULL;
    CUDA(cudaMalloc(&d, bytes ? bytes : 1));
    if (host) CUDA(cudaMemcpy(d, host, bytes, H2D));
    return d;
}
#endif

enum { L = 4, HQ = 8, HKV = 2, D = 64, DM = 256, N = 1024, WQ = 32, BUDGET = 96 };

int main(void) {
    int32_t devices = 0;
    int32_t st = kve_cuda_get_device_count(&devices);
    if (st == KVE_ERR_NOT_BUILT_WITH_CUDA) {
        printf("skipped: library built without CUDA (%s)\n", kve_status_name(st));
        return 0;
    }
    CHECK(st);
    if (devices == 0) {
        /* cuda/check.sh sets KVEVICT_REQUIRE_GPU where a GPU is listed: no skipping there */
        const char* req = getenv("KVEVICT_REQUIRE_GPU");
        if (req && *req && strcmp(req, "0") != 0) {
            fprintf(stderr, "KVEVICT_REQUIRE_GPU is set but the CUDA runtime sees no device\n");
            return 1;
        }
        printf("skipped: no CUDA device\n");
        return 0;
    }
#ifndef KVE_EXAMPLE_WITH_CUDA
    printf("skipped: example built without KVE_EXAMPLE_WITH_CUDA\n");
    return 0;
#else
    kve_score_params sp;
    CHECK(kve_score_params_init(&sp, (uint32_t)sizeof sp, KVE_PRESET_LAPROX_SPAN));
    kve_select_params sel;
    CHECK(kve_select_params_init_laprox_span(&sel, (uint32_t)sizeof sel, BUDGET));
    const uint64_t w = sp.window, p = N - w, row = (uint64_t)HKV * D;

    /* the model: per layer Q (last WQ rows), K rows, transposed V (f16), Wo (f32) */
    const size_t nq = (size_t)HQ * WQ * D, nkv = (size_t)N * row, nwo = (size_t)HQ * D * DM;
    uint16_t* q = xmalloc(2 * nq * L);
    uint16_t* k = xmalloc(2 * nkv * L);
    uint16_t* v = xmalloc(2 * nkv * L);
    float* wo = xmalloc(4 * nwo);
    for (size_t i = 0; i < nq * L; i++) q[i] = f32_to_f16(rnd());
    for (size_t i = 0; i < nkv * L; i++) k[i] = f32_to_f16(rnd());
    for (size_t i = 0; i < nkv * L; i++) v[i] = f32_to_f16(rnd());
    for (size_t i = 0; i < nwo; i++) wo[i] = 0.1f * rnd();

    /* Gram of Wo, once per model (host; the same for every layer here) */
    uint64_t glen, gws;
    CHECK(kve_gram_len(HQ, HKV, D, 0, &glen));
    CHECK(kve_gram_workspace_size(D, DM, &gws));
    float* gram = xmalloc(4 * glen);
    void* ws = xmalloc(gws);
    kve_tensor two = {wo, nwo, KVE_DTYPE_F32, 0, {HQ, D, DM}, {D * DM, DM, 1}};
    CHECK(kve_compute_gram(&two, HKV, 0, gram, glen, ws, gws));
    free(ws);

    /* one layer's tensors (host or device pointers; the same strides) */
    kve_layer_inputs in;
    CHECK(kve_layer_inputs_init(&in, (uint32_t)sizeof in));
    in.queries = (kve_tensor){NULL, nq, KVE_DTYPE_F16, 0, {HQ, WQ, D}, {WQ * D, D, 1}};
    in.keys = (kve_tensor){NULL, nkv, KVE_DTYPE_F16, 0, {HKV, N, D}, {D, row, 1}};   /* rows */
    in.values = (kve_tensor){NULL, nkv, KVE_DTYPE_F16, 0, {HKV, N, D}, {D * N, 1, N}}; /* V^T */
    in.gram_len = glen;

    /* host reference: score every layer, select */
    const uint64_t slen = HKV * p;
    uint64_t hws;
    CHECK(kve_score_workspace_size(&sp, HQ, HKV, N, D, D, &hws));
    float* host_scores = xmalloc(4 * slen * L);
    ws = xmalloc(hws);
    for (int l = 0; l < L; l++) {
        in.queries.data = q + nq * l;
        in.keys.data = k + nkv * l;
        in.values.data = v + nkv * l;
        in.gram = gram;
        CHECK(kve_score_layer(&sp, &in, host_scores + slen * l, slen, ws, hws));
    }
    free(ws);
    kve_model_scores ms = {host_scores, slen * L, L, HKV, N, w};
    kept_lists sl = select_lists(&sel, &ms, 0);

    /* device: everything on one stream */
    cudaStream_t stream;
    CUDA(cudaStreamCreate(&stream));
    uint16_t* dq = dev_upload(q, 2 * nq * L);
    uint16_t* dk = dev_upload(k, 2 * nkv * L);
    uint16_t* dv = dev_upload(v, 2 * nkv * L);
    float* dgram = dev_upload(gram, 4 * glen);
    float* dscores = dev_upload(NULL, 4 * slen * L);
    uint64_t dws_bytes;
    CHECK(kve_cuda_score_workspace_size(&sp, HQ, HKV, N, D, D, &dws_bytes));
    void* dws = dev_upload(NULL, dws_bytes); /* one workspace serves every layer */
    kve_layer_inputs din = in;
    din.gram = dgram;
    for (int l = 0; l < L; l++) {
        din.queries.data = dq + nq * l;
        din.keys.data = dk + nkv * l;
        din.values.data = dv + nkv * l;
        CHECK(kve_cuda_score_layer(&sp, &din, dscores + slen * l, slen, dws, dws_bytes, stream));
    }
    uint64_t dsel_bytes;
    CHECK(kve_cuda_select_model_workspace_size(&sel, L, HKV, N, w, &dsel_bytes));
    void* dsel_ws = dev_upload(NULL, dsel_bytes);
    int32_t* dcounts = dev_upload(NULL, 4 * L * HKV);
    /* lists as the host's: the chosen prefix cells, then the window (row stride N) */
    int32_t* didx = dev_upload(NULL, 4 * L * HKV * N);
    kve_model_scores dms = {dscores, slen * L, L, HKV, N, w};
    CHECK(kve_cuda_select_model(&sel, &dms, dcounts, L * HKV, didx, N, L * HKV * N, dsel_ws,
                                dsel_bytes, stream));
    /* token granularity: one list for the whole model; K rows of each layer move whole
       (one "head" of Hkv*d columns per token row), the window after the kept prefix */
    uint64_t cws;
    kve_tensor rows = {NULL, nkv, KVE_DTYPE_F16, 0, {1, N, row}, {0, row, 1}};
    rows.data = dk;
    CHECK(kve_cuda_compact_in_place_workspace_size(&rows, N, &cws));
    void* dcws = dev_upload(NULL, cws);
    for (int l = 0; l < L; l++) {
        rows.data = dk + nkv * l;
        CHECK(kve_cuda_compact_in_place(&rows, didx, 0, dcounts, N, dcws, cws, stream));
    }
    CUDA(cudaStreamSynchronize(stream));

    /* compare: the kept cells of unit 0 (every unit has the same list) */
    int32_t count = 0;
    int32_t* idx = xmalloc(4 * N);
    CUDA(cudaMemcpy(&count, dcounts, 4, D2H));
    CUDA(cudaMemcpy(idx, didx, 4 * N, D2H));
    uint64_t host_count = sl.offsets[1] - sl.offsets[0];
    uint64_t same = 0;
    for (int32_t t = 0, h = (int32_t)sl.offsets[0]; t < count; t++) {
        while ((uint64_t)h < sl.offsets[1] && sl.indices[h] < (uint32_t)idx[t]) h++;
        same += (uint64_t)h < sl.offsets[1] && sl.indices[h] == (uint32_t)idx[t];
    }
    /* and the compacted K rows of layer 0: row t holds original row idx[t] */
    uint16_t* k0 = xmalloc(2 * row * (size_t)count);
    CUDA(cudaMemcpy(k0, dk, 2 * row * (size_t)count, D2H));
    int rows_ok = 1;
    for (int32_t t = 0; t < count; t++)
        rows_ok &= memcmp(k0 + row * t, k + row * (size_t)idx[t], 2 * row) == 0;
    printf("LaProx-span on the device: kept %d of %d cells (host %llu), %llu in common; "
           "compacted K rows %s\n",
           count, N, (unsigned long long)host_count, (unsigned long long)same,
           rows_ok ? "correct" : "WRONG");
    cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dgram); cudaFree(dscores); cudaFree(dws);
    cudaFree(dsel_ws); cudaFree(dcounts); cudaFree(didx); cudaFree(dcws);
    cudaStreamDestroy(stream);
    free(q); free(k); free(v); free(wo); free(gram); free(host_scores); free(sl.offsets); free(sl.indices);
    free(idx); free(k0);
    /* near-ties may fall either way between the two paths; a few differences are fine */
    return rows_ok && (uint64_t)count == host_count && same + 2 >= host_count ? 0 : 1;
#endif
}
