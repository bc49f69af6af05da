// The evictor's device form (src/evictor/device.rs): the three moves the stage launchers
// do not make. All stream-ordered, no allocation, no synchronisation, graph-capturable.
//  - ring_put: the last rows of a query micro-batch (any dtype and strides) into a
//    mirrored ring of the same dtype, [heads][2·cap][dim] contiguous: row s lands at slots s % cap and s % cap + cap,
//    so the last w <= cap rows are always one contiguous view (no wrap to undo).
//  - span_rows: rows of a score matrix cut to columns [start, start + count) and packed
//    (the keep ratio's selection over the cells new since the last compression).
//  - shift_lists: kept lists over that span as lists over every cell: the protected
//    cells 0 .. start-1 first, then each index + start.
#include "common.cuh"

namespace kve {
namespace {

template <typename T>
__global__ void ring_put_kernel(View q, int64_t first, int64_t rows, T* __restrict__ ring,
                                int64_t cap, int64_t seen) {
    const int64_t h = blockIdx.y;
    for (int64_t j = blockIdx.x; j < rows; j += gridDim.x) {
        const int64_t slot = (seen + j) % cap;
        T* a = ring + (h * 2 * cap + slot) * q.dim;
        T* b = ring + (h * 2 * cap + slot + cap) * q.dim;
        for (int64_t d = threadIdx.x; d < q.dim; d += blockDim.x) {
            const T x = *elem_ptr<T>(q, h, first + j, d);
            a[d] = x;
            b[d] = x;
        }
    }
}

__global__ void span_rows_kernel(const float* __restrict__ src, int64_t ld, int64_t start,
                                 int64_t count, float* __restrict__ dst) {
    const int64_t r = blockIdx.y;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[r * count + i] = src[r * ld + start + i];
}

__global__ void shift_lists_kernel(const int32_t* __restrict__ src_counts,
                                   const int32_t* __restrict__ src_idx, int64_t src_ld,
                                   int64_t rows, int32_t start, int32_t* __restrict__ counts,
                                   int32_t* __restrict__ idx, int64_t idx_ld) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t c = src_counts[r];
        if (c < 0) c = 0;
        if (c > src_ld) c = src_ld;
        if (c > idx_ld - start) c = idx_ld - start;
        for (int64_t t = threadIdx.x; t < start + c; t += blockDim.x)
            idx[r * idx_ld + t] = t < start ? (int32_t)t : src_idx[r * src_ld + (t - start)] + start;
        if (threadIdx.x == 0) counts[r] = (int32_t)(start + c);
    }
}

}  // namespace
}  // namespace kve

using namespace kve;

extern "C" int kve_cuda_ring_put(const kve_cuda_view* q, int64_t first, int64_t rows, void* ring,
                                 int64_t cap, int64_t seen, void* stream) {
    if (!view_ok(q) || first < 0 || rows < 0 || cap < 1 || seen < 0) return (int)cudaErrorInvalidValue;
    if (rows > cap || first + rows > q->tokens || q->heads > 65535) return (int)cudaErrorInvalidValue;
    if (rows == 0 || q->heads == 0 || q->dim == 0) return 0;
    if (!ring) return (int)cudaErrorInvalidValue;
    const View v = to_view(*q);
    const dim3 grid((unsigned)(rows > 65535 ? 65535 : rows), (unsigned)q->heads);
    const unsigned nt = q->dim >= 256 ? 256 : (q->dim >= 64 ? 64 : 32);
    switch (q->dtype) {
    case KVE_CUDA_F32:
        KVE_CHECK(launch_kernel(ring_put_kernel<float>, grid, nt, 0, KVE_STREAM(stream), v, first, rows,
                                static_cast<float*>(ring), cap, seen));
        break;
    case KVE_CUDA_F16:
        KVE_CHECK(launch_kernel(ring_put_kernel<__half>, grid, nt, 0, KVE_STREAM(stream), v, first, rows,
                                static_cast<__half*>(ring), cap, seen));
        break;
    default:
        KVE_CHECK(launch_kernel(ring_put_kernel<__nv_bfloat16>, grid, nt, 0, KVE_STREAM(stream), v, first,
                                rows, static_cast<__nv_bfloat16*>(ring), cap, seen));
    }
    return 0;
}

extern "C" int kve_cuda_span_rows(const float* src, int64_t rows, int64_t ld, int64_t start,
                                  int64_t count, float* dst, void* stream) {
    if (rows < 0 || ld < 0 || start < 0 || count < 0 || start + count > ld || rows > 65535)
        return (int)cudaErrorInvalidValue;
    if (rows == 0 || count == 0) return 0;
    if (!src || !dst) return (int)cudaErrorInvalidValue;
    const int64_t blocks = ceil_div(count, 256);
    const dim3 grid((unsigned)(blocks > 65535 ? 65535 : blocks), (unsigned)rows);
    KVE_CHECK(launch_kernel(span_rows_kernel, grid, 256, 0, KVE_STREAM(stream), src, ld, start, count, dst));
    return 0;
}

extern "C" int kve_cuda_shift_lists(const int32_t* src_counts, const int32_t* src_idx, int64_t src_ld,
                                    int64_t rows, int64_t start, int32_t* counts, int32_t* idx,
                                    int64_t idx_ld, void* stream) {
    if (rows < 0 || src_ld < 0 || start < 0 || idx_ld < start || idx_ld > ((int64_t)1 << 31) - 1)
        return (int)cudaErrorInvalidValue;
    if (rows == 0) return 0;
    if (!src_counts || !src_idx || !counts || !idx) return (int)cudaErrorInvalidValue;
    KVE_CHECK(launch_kernel(shift_lists_kernel, (unsigned)(rows > 65535 ? 65535 : rows), 256, 0,
                            KVE_STREAM(stream), src_counts, src_idx, src_ld, rows, (int32_t)start, counts, idx,
                            idx_ld));
    return 0;
}

extern "C" int kve_cuda_upload(void* dst, const void* src, size_t bytes, void* stream) {
    if (bytes == 0) return 0;
    if (!dst || !src) return (int)cudaErrorInvalidValue;
    KVE_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, KVE_STREAM(stream)));
    return (int)cudaStreamSynchronize(KVE_STREAM(stream));
}

extern "C" int kve_cuda_download(void* dst, const void* src, size_t bytes, void* stream) {
    if (bytes == 0) return 0;
    if (!dst || !src) return (int)cudaErrorInvalidValue;
    KVE_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, KVE_STREAM(stream)));
    return (int)cudaStreamSynchronize(KVE_STREAM(stream));
}
