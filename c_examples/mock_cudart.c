/* Host stand-ins for the six CUDA runtime calls cuda_device.c makes, so that example runs
 * end to end against a library built with the plain-Rust test double of the kernels
 * (cargo feature `cuda-mock`), where "device" memory is host memory. Used by
 * tests/c_examples.rs in CI without a GPU; never link it with a real CUDA build. */
#define _POSIX_C_SOURCE 200112L
#include <stdlib.h>
#include <string.h>

int cudaMalloc(void** p, size_t bytes);
int cudaFree(void* p);
int cudaMemcpy(void* dst, const void* src, size_t bytes, int kind);
int cudaStreamCreate(void** s);
int cudaStreamSynchronize(void* s);
int cudaStreamDestroy(void* s);

int cudaMalloc(void** p, size_t bytes) {
    /* 256-byte alignment, as cudaMalloc gives */
    return posix_memalign(p, 256, bytes ? bytes : 1) == 0 ? 0 : 2;
}
int cudaFree(void* p) {
    free(p);
    return 0;
}
int cudaMemcpy(void* dst, const void* src, size_t bytes, int kind) {
    (void)kind;
    memcpy(dst, src, bytes);
    return 0;
}
int cudaStreamCreate(void** s) {
    *s = NULL;
    return 0;
}
int cudaStreamSynchronize(void* s) {
    (void)s;
    return 0;
}
int cudaStreamDestroy(void* s) {
    (void)s;
    return 0;
}
