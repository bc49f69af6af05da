// Device discovery.
#include "common.cuh"

extern "C" int kve_cuda_device_count(int* out) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        n = 0;
        (void)cudaGetLastError();  // clear the non-sticky error for later calls
    }
    if (out) *out = n;
    return (int)e;
}
