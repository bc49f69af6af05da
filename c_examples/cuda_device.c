/* The same pipeline on device memory with a CUDA stream: score (SnapKV), select
 * (uniform per head) and compact in place, all enqueued on the engine's stream, then
 * the scores are compared with the host path.
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

enum { HQ = 8, HKV = 2, D = 64, N = 1024, WINDOW = 32, BUDGET = 96 };

int main(void) {
    int32_t devices = 0;
    int32_t st = kve_cuda_get_device_count(&devices);
    if (st == KVE_ERR_NOT_BUILT_WITH_CUDA) {
        printf("skipped: library built without CUDA (%s)\n", kve_status_name(st));
        return 0;
    }
    CHECK(st);
    if (devices == 0) {
        printf("skipped: no CUDA device\n");
        return 0;
    }
#ifndef KVE_EXAMPLE_WITH_CUDA
    printf("skipped: example built without KVE_EXAMPLE_WITH_CUDA\n");
    return 0;
#else
    const uint64_t p = N - WINDOW;
    float* q = xmalloc(sizeof(float) * HQ * WINDOW * D);
    uint16_t* k = xmalloc(sizeof(uint16_t) * HKV * N * D);
    for (int i = 0; i < HQ * WINDOW * D; i++) q[i] = rnd();
    for (int i = 0; i < HKV * N * D; i++) k[i] = f32_to_f16(rnd());
    /* queries in f16 too (the device window kernel wants one dtype) */
    uint16_t* q16 = xmalloc(sizeof(uint16_t) * HQ * WINDOW * D);
    for (int i = 0; i < HQ * WINDOW * D; i++) q16[i] = f32_to_f16(q[i]);

    kve_score_params sp;
    CHECK(kve_score_params_init(&sp, (uint32_t)sizeof sp, KVE_PRESET_SNAPKV));
    kve_select_params sel;
    CHECK(kve_select_params_init(&sel, (uint32_t)sizeof sel, KVE_ALLOCATOR_UNIFORM, KVE_GRANULARITY_HEAD, BUDGET));

    /* host reference */
    kve_layer_inputs in;
    CHECK(kve_layer_inputs_init(&in, (uint32_t)sizeof in));
    kve_tensor tq = {q16, (uint64_t)HQ * WINDOW * D, KVE_DTYPE_F16, 0, {HQ, WINDOW, D}, {WINDOW * D, D, 1}};
    kve_tensor tk = {k, (uint64_t)HKV * N * D, KVE_DTYPE_F16, 0, {HKV, N, D}, {N * D, D, 1}};
    in.queries = tq;
    in.keys = tk;
    uint64_t slen, hws;
    CHECK(kve_score_output_len(&sp, HKV, N, &slen));
    CHECK(kve_score_workspace_size(&sp, HQ, HKV, N, D, D, &hws));
    float* host_scores = xmalloc(sizeof(float) * slen);
    void* ws = xmalloc(hws);
    CHECK(kve_score_layer(&sp, &in, host_scores, slen, ws, hws));
    free(ws);

    /* device */
    cudaStream_t stream;
    CUDA(cudaStreamCreate(&stream));
    void* dq = dev_upload(q16, sizeof(uint16_t) * HQ * WINDOW * D);
    void* dk = dev_upload(k, sizeof(uint16_t) * HKV * N * D);
    float* dscores = dev_upload(NULL, sizeof(float) * slen);
    uint64_t dws_bytes;
    CHECK(kve_cuda_score_workspace_size(&sp, HQ, HKV, N, D, D, &dws_bytes));
    void* dws = dev_upload(NULL, dws_bytes);
    kve_layer_inputs din = in;
    din.queries.data = dq;
    din.keys.data = dk;
    CHECK(kve_cuda_score_layer(&sp, &din, dscores, slen, dws, dws_bytes, stream));

    uint64_t sel_ws;
    CHECK(kve_cuda_select_model_workspace_size(&sel, 1, HKV, N, WINDOW, &sel_ws));
    void* dsel_ws = dev_upload(NULL, sel_ws);
    int32_t* dcounts = dev_upload(NULL, sizeof(int32_t) * HKV);
    int32_t* didx = dev_upload(NULL, sizeof(int32_t) * HKV * p);
    kve_model_scores ms = {dscores, slen, 1, HKV, N, WINDOW};
    CHECK(kve_cuda_select_model(&sel, &ms, dcounts, HKV, didx, p, HKV * p, dsel_ws, sel_ws, stream));

    uint64_t cws;
    CHECK(kve_cuda_compact_in_place_workspace_size(&din.keys, BUDGET, &cws));
    void* dcws = dev_upload(NULL, cws);
    CHECK(kve_cuda_compact_in_place(&din.keys, didx, p, dcounts, BUDGET, dcws, cws, stream));
    CUDA(cudaStreamSynchronize(stream));

    float* dev_scores = xmalloc(sizeof(float) * slen);
    int32_t counts[HKV];
    CUDA(cudaMemcpy(dev_scores, dscores, sizeof(float) * slen, D2H));
    CUDA(cudaMemcpy(counts, dcounts, sizeof counts, D2H));
    double max_rel = 0;
    for (uint64_t i = 0; i < slen; i++) {
        double d = fabs((double)dev_scores[i] - host_scores[i]) / (fabs(host_scores[i]) + 1e-6);
        if (d > max_rel) max_rel = d;
    }
    printf("device scores vs host: max relative difference %.2e\n", max_rel);
    printf("kept per head on device: %d %d (budget %d)\n", counts[0], counts[1], BUDGET);
    cudaFree(dq); cudaFree(dk); cudaFree(dscores); cudaFree(dws); cudaFree(dsel_ws);
    cudaFree(dcounts); cudaFree(didx); cudaFree(dcws);
    cudaStreamDestroy(stream);
    free(q); free(q16); free(k); free(host_scores); free(dev_scores);
    return max_rel < 1e-2 ? 0 : 1;
#endif
}
