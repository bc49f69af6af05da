// Self-test of the CUDA emulator (cuda/emu): `selftest CASE` runs one case; tests/cuda_emu.rs
// runs every case and checks its exit status and message. The good cases check results
// (exit 0, "ok"); the bad ones must be caught (abort with the emulator's message, or the
// CUDA status a GPU returns).
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>
#include <cuda_pipeline.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x)                                                                          \
    do {                                                                               \
        cudaError_t e_ = (x);                                                          \
        if (e_ != cudaSuccess) {                                                       \
            printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorName(e_));  \
            exit(3);                                                                   \
        }                                                                              \
    } while (0)
#define EXPECT(c)                                                  \
    do {                                                           \
        if (!(c)) {                                                \
            printf("%s:%d expected %s\n", __FILE__, __LINE__, #c); \
            exit(4);                                               \
        }                                                          \
    } while (0)

template <typename... P, typename... A>
static cudaError_t go(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                      A&&... a) {
    cudaLaunchConfig_t c = {};
    c.gridDim = grid;
    c.blockDim = block;
    c.dynamicSmemBytes = smem;
    c.stream = s;
    return cudaLaunchKernelEx(&c, k, static_cast<A&&>(a)...);
}

// ------------------------------------------------------------------ good --
// Per block of 64: a shared-memory exchange across a barrier, a warp sum, a ballot,
// __syncthreads_and / _count, shared atomics and dynamic shared memory.
__global__ void collectives(int* out) {
    __shared__ int sh[64];
    __shared__ unsigned hits;
    int* dyn = reinterpret_cast<int*>(kve_emu::dyn_smem());
    const int t = threadIdx.x, lane = t & 31;
    if (t == 0) hits = 0;
    sh[t] = t * 3 + (int)blockIdx.x;
    dyn[t] = t;
    __syncthreads();
    const int nb = sh[(t + 1) % 64] + dyn[63 - t];
    int s = t;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    const unsigned b = __ballot_sync(0xffffffffu, lane & 1);
    const int all = __syncthreads_and(t < 64);
    const int cnt = __syncthreads_count(t % 4 == 0);
    atomicAdd(&hits, 1u);
    __syncthreads();
    int* o = out + (blockIdx.x * 64 + t) * 6;
    o[0] = nb;
    o[1] = s;
    o[2] = (int)b;
    o[3] = all;
    o[4] = cnt;
    o[5] = (int)hits;
}

static int good() {
    const int blocks = 3;
    int* d = nullptr;
    CK(cudaMalloc((void**)&d, blocks * 64 * 6 * sizeof(int)));
    CK(go(collectives, dim3(blocks), dim3(64), 64 * sizeof(int), nullptr, d));
    std::vector<int> h(blocks * 64 * 6);
    CK(cudaMemcpy(h.data(), d, h.size() * sizeof(int), cudaMemcpyDeviceToHost));
    for (int bl = 0; bl < blocks; ++bl)
        for (int t = 0; t < 64; ++t) {
            const int* o = &h[(bl * 64 + t) * 6];
            const int w0 = t / 32 * 32;
            EXPECT(o[0] == ((t + 1) % 64) * 3 + bl + (63 - t));
            EXPECT(o[1] == 32 * w0 + 496);
            EXPECT((unsigned)o[2] == 0xAAAAAAAAu);
            EXPECT(o[3] == 1);
            EXPECT(o[4] == 16);
            EXPECT(o[5] == 64);
        }
    CK(cudaFree(d));
    // memory from cudaMalloc starts as NaN (all-ones bytes)
    float* f = nullptr;
    CK(cudaMalloc((void**)&f, 4 * sizeof(float)));
    float hf[4];
    CK(cudaMemcpy(hf, f, sizeof hf, cudaMemcpyDeviceToHost));
    EXPECT(hf[0] != hf[0]);
    CK(cudaFree(f));
    return 0;
}

// WMMA 16x16x16 against a plain product (f16 operands: exact products, f32 sums).
__global__ void wmma_tile(const __half* a, const __half* b, float* c) {
    using namespace nvcuda;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::fill_fragment(fc, 1.0f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}

static int wmma() {
    std::vector<__half> a(256), b(256);
    for (int i = 0; i < 256; ++i) {
        a[i] = __float2half_rn((float)((i * 7) % 11) - 5.0f);
        b[i] = __float2half_rn(0.5f * (float)((i * 5) % 9) - 2.0f);
    }
    __half *da, *db;
    float* dc;
    CK(cudaMalloc((void**)&da, 512));
    CK(cudaMalloc((void**)&db, 512));
    CK(cudaMalloc((void**)&dc, 1024));
    CK(cudaMemcpy(da, a.data(), 512, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, b.data(), 512, cudaMemcpyHostToDevice));
    CK(go(wmma_tile, dim3(1), dim3(32), 0, nullptr, (const __half*)da, (const __half*)db, dc));
    float c[256];
    CK(cudaMemcpy(c, dc, 1024, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 16; ++j) {
            float s = 1.0f;
            // B col-major: element (k, j) at b[k + 16 j]
            for (int k = 0; k < 16; ++k) s += __half2float(a[i * 16 + k]) * __half2float(b[k + 16 * j]);
            EXPECT(c[i * 16 + j] == s);
        }
    return 0;
}

// f16 conversions against the compiler's _Float16 (IEEE binary16, round to nearest even);
// bf16 against its definition (the top 16 bits, rounded to nearest even).
static int conversions() {
    for (uint32_t h = 0; h < 65536; ++h) {
        _Float16 r;
        uint16_t hb = (uint16_t)h;
        memcpy(&r, &hb, 2);
        const float f = kve_emu::f16_bits_to_f32(hb), fr = (float)r;
        EXPECT(memcmp(&f, &fr, 4) == 0 || (f != f && fr != fr));
        const float g = kve_emu::bf16_bits_to_f32(hb);
        uint32_t gu;
        memcpy(&gu, &g, 4);
        EXPECT(gu == h << 16);
        if (g == g) EXPECT(kve_emu::f32_to_bf16_bits(g) == hb);
    }
    uint64_t x = 12345;
    for (long i = 0; i < 20000000; ++i) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint32_t u = (uint32_t)x;
        if (i % 4 == 0) u = (u & 0x80000000u) | (0x33000000u + (u & 0x0fffffffu));  // near f16's range
        float f;
        memcpy(&f, &u, 4);
        if (f != f) continue;
        _Float16 r = (_Float16)f;
        uint16_t rb;
        memcpy(&rb, &r, 2);
        EXPECT(kve_emu::f32_to_f16_bits(f) == rb);
        // bf16: RNE on the low 16 bits
        const uint32_t lo = u & 0xffffu, hi = u >> 16;
        const uint32_t want = (lo > 0x8000u || (lo == 0x8000u && (hi & 1u))) ? hi + 1 : hi;
        EXPECT(kve_emu::f32_to_bf16_bits(f) == (uint16_t)want);
    }
    return 0;
}

// Launch limits: dynamic shared memory against the opt-in, block and grid shapes.
__global__ void touch_smem(int* out, int n) {
    int* dyn = reinterpret_cast<int*>(kve_emu::dyn_smem());
    for (int i = threadIdx.x; i < n; i += blockDim.x) dyn[i] = i;
    __syncthreads();
    if (threadIdx.x == 0) out[0] = dyn[n - 1];
}

static int limits() {
    int* d;
    CK(cudaMalloc((void**)&d, 4));
    const int n = 64 * 1024 / 4;
    EXPECT(go(touch_smem, dim3(1), dim3(128), 64 * 1024, nullptr, d, n) == cudaErrorInvalidValue);
    EXPECT(cudaGetLastError() == cudaErrorInvalidValue);
    EXPECT(cudaGetLastError() == cudaSuccess);
    CK(cudaFuncSetAttribute((const void*)touch_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));
    CK(go(touch_smem, dim3(1), dim3(128), 64 * 1024, nullptr, d, n));
    int h = 0;
    CK(cudaMemcpy(&h, d, 4, cudaMemcpyDeviceToHost));
    EXPECT(h == n - 1);
    int optin = 0;
    CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    EXPECT(cudaFuncSetAttribute((const void*)touch_smem, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                optin + 1) == cudaErrorInvalidValue);
    EXPECT(go(touch_smem, dim3(1), dim3(1025), 0, nullptr, d, 1) == cudaErrorInvalidConfiguration);
    EXPECT(go(touch_smem, dim3(1, 65536), dim3(32), 0, nullptr, d, 1) == cudaErrorInvalidConfiguration);
    EXPECT(go(touch_smem, dim3(0), dim3(32), 0, nullptr, d, 1) == cudaErrorInvalidConfiguration);
    printf("optin %d\n", optin);
    CK(cudaFree(d));
    return 0;
}

// Stream capture: what a GPU refuses during a capture, and the graph replaying the work.
__global__ void add_one(int* p) { p[threadIdx.x] += 1; }

static int capture() {
    int* d;
    CK(cudaMalloc((void**)&d, 32 * 4));
    CK(cudaMemset(d, 0, 32 * 4));
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    // 1. an unsafe call (cudaMalloc) in the capturing thread invalidates a global capture
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    void* p = nullptr;
    EXPECT(cudaMalloc(&p, 16) == cudaErrorStreamCaptureUnsupported);
    cudaGraph_t g = nullptr;
    EXPECT(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
    // 2. ... but not after exchanging this thread's mode to relaxed
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
    CK(cudaThreadExchangeStreamCaptureMode(&m));
    CK(cudaMalloc(&p, 16));
    CK(cudaThreadExchangeStreamCaptureMode(&m));
    CK(go(add_one, dim3(1), dim3(32), 0, s, d));
    CK(cudaStreamEndCapture(s, &g));
    // 3. the legacy stream during a capture on a blocking stream
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    EXPECT(go(add_one, dim3(1), dim3(32), 0, nullptr, d) == cudaErrorStreamCaptureImplicit);
    cudaGraph_t g2 = nullptr;
    EXPECT(cudaStreamEndCapture(s, &g2) == cudaErrorStreamCaptureInvalidated);
    // 4. syncing a capturing stream
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    EXPECT(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported);
    EXPECT(cudaStreamEndCapture(s, &g2) == cudaErrorStreamCaptureInvalidated);
    // the graph of 2 ran nothing while captured, and adds one per replay
    int h[32];
    CK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    EXPECT(h[0] == 0 && h[31] == 0);
    cudaGraphExec_t x;
    CK(cudaGraphInstantiate(&x, g, 0));
    CK(cudaGraphLaunch(x, s));
    CK(cudaGraphLaunch(x, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    EXPECT(h[0] == 2 && h[31] == 2);
    CK(cudaGraphExecDestroy(x));
    CK(cudaGraphDestroy(g));
    CK(cudaStreamDestroy(s));
    EXPECT(cudaStreamSynchronize(s) == cudaErrorInvalidResourceHandle);
    CK(cudaFree(p));
    CK(cudaFree(d));
    return 0;
}

// cp.async: a copy lands at its thread's wait for its group, not before; zero-fill.
__global__ void async_copies(const int* src, int* out) {
    __shared__ int4 buf[2];
    const int t = threadIdx.x;
    if (t == 0) {
        buf[0] = int4{-1, -1, -1, -1};
        buf[1] = int4{-1, -1, -1, -1};
        __pipeline_memcpy_async(&buf[0], src, 16);
        __pipeline_commit();
        __pipeline_memcpy_async(&buf[1], src + 4, 16, 8);  // 8 bytes copied, 8 zeroed
        __pipeline_commit();
        out[0] = buf[0].x;  // not landed yet
        __pipeline_wait_prior(1);
        out[1] = buf[0].x;  // the older group landed
        out[2] = buf[1].x;  // the newer one not yet
        __pipeline_wait_prior(0);
        out[3] = buf[1].y;
        out[4] = buf[1].z;
    }
}

static int pipeline() {
    int h[8] = {10, 11, 12, 13, 20, 21, 22, 23};
    int *d, *o;
    CK(cudaMalloc((void**)&d, sizeof h));
    CK(cudaMalloc((void**)&o, 5 * sizeof(int)));
    CK(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice));
    CK(go(async_copies, dim3(1), dim3(32), 0, nullptr, (const int*)d, o));
    int r[5];
    CK(cudaMemcpy(r, o, sizeof r, cudaMemcpyDeviceToHost));
    EXPECT(r[0] == -1 && r[1] == 10 && r[2] == -1 && r[3] == 21 && r[4] == 0);
    return 0;
}

// ------------------------------------------------------------------- bad --
__global__ void barrier_vs_shuffle(int* out) {
    int x = (int)threadIdx.x;
    if ((threadIdx.x & 31) < 16) __syncthreads();
    else x = __shfl_xor_sync(0xffffffffu, x, 1);
    out[threadIdx.x] = x;
}
__global__ void shuffle_after_exit(int* out) {
    if (threadIdx.x == 3) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}
__global__ void write_past_end(float* p, int n) {
    if (threadIdx.x == 0) p[n] = 1.0f;
}
__global__ void write_far_past_end(float* p, int n) {
    if (threadIdx.x == 0) p[n + 4096] = 1.0f;
}

struct ViewArg {
    float* data;
    int n;
};
__global__ void view_kernel(ViewArg v) {
    if (threadIdx.x == 0 && v.n > 0) v.data[0] = 1.0f;
}

// Host memory given to cudaHostRegister is device memory to kernels and copies (its
// device pointer is its address), until cudaHostUnregister; ranges do not overlap.
static int host_register() {
    static int host[64];
    static float hf[4];
    for (int i = 0; i < 64; ++i) host[i] = i;
    CK(cudaHostRegister(host, sizeof host, cudaHostRegisterMapped));
    CK(cudaHostRegister(hf, sizeof hf, cudaHostRegisterDefault));
    void* dp = nullptr;
    CK(cudaHostGetDevicePointer(&dp, host + 5, 0));
    EXPECT(dp == host + 5);
    CK(go(add_one, dim3(1), dim3(32), 0, nullptr, host + 32));  // inside the range
    CK(go(view_kernel, dim3(1), dim3(32), 0, nullptr, ViewArg{hf, 4}));
    EXPECT(host[0] == 0 && host[32] == 33 && host[63] == 64 && hf[0] == 1.0f);
    int* d;
    CK(cudaMalloc((void**)&d, sizeof host));
    CK(cudaMemcpy(d, host, sizeof host, cudaMemcpyDeviceToDevice));
    CK(cudaMemset(host, 0, 16));
    EXPECT(host[3] == 0 && host[4] == 4);
    EXPECT(cudaHostRegister(host + 8, 4, 0) == cudaErrorHostMemoryAlreadyRegistered);
    EXPECT(cudaHostRegister(d, 16, 0) == cudaErrorInvalidValue);  // device memory
    EXPECT(cudaHostRegister(host, 0, 0) == cudaErrorInvalidValue);
    EXPECT(cudaFree(host) == cudaErrorInvalidValue);
    EXPECT(cudaHostUnregister(host + 1) == cudaErrorHostMemoryNotRegistered);
    CK(cudaHostUnregister(host));
    CK(cudaHostUnregister(hf));
    EXPECT(cudaHostUnregister(host) == cudaErrorHostMemoryNotRegistered);
    EXPECT(cudaHostGetDevicePointer(&dp, host, 0) == cudaErrorInvalidValue);
    EXPECT(cudaMemset(host, 0, 16) == cudaErrorInvalidValue);  // no longer visible
    (void)cudaGetLastError();
    return 0;
}

// kveEmuHostMemoryAsDevice(1): any host address is device memory to kernels and copies,
// with no registration (the fork's device path on its CPU cache); 0 restores the checks.
static int host_as_device() {
    static int host[64];
    static float hf[4];
    for (int i = 0; i < 64; ++i) host[i] = i;
    kveEmuHostMemoryAsDevice(1);
    CK(go(add_one, dim3(1), dim3(32), 0, nullptr, host + 32));
    CK(go(view_kernel, dim3(1), dim3(32), 0, nullptr, ViewArg{hf, 4}));
    CK(cudaMemsetAsync(host, 0, 16, nullptr));
    CK(cudaMemcpy(host + 8, host + 32, 4 * sizeof(int), cudaMemcpyDeviceToDevice));
    EXPECT(host[3] == 0 && host[4] == 4 && host[8] == 33 && host[63] == 64 && hf[0] == 1.0f);
    EXPECT(cudaMemset(nullptr, 0, 16) == cudaErrorInvalidValue);  // null is still no memory
    kveEmuHostMemoryAsDevice(0);
    EXPECT(cudaMemset(host, 0, 16) == cudaErrorInvalidValue);  // checked again
    (void)cudaGetLastError();
    return 0;
}

static int bad(const char* what) {
    int* d;
    CK(cudaMalloc((void**)&d, 64 * 4));
    if (!strcmp(what, "deadlock")) {
        go(barrier_vs_shuffle, dim3(1), dim3(64), 0, nullptr, d);
    } else if (!strcmp(what, "exited_lane")) {
        go(shuffle_after_exit, dim3(1), dim3(32), 0, nullptr, d);
    } else if (!strcmp(what, "host_pointer")) {
        static int host[64];
        go(add_one, dim3(1), dim3(32), 0, nullptr, host);
    } else if (!strcmp(what, "host_view")) {
        static float host[4];
        go(view_kernel, dim3(1), dim3(32), 0, nullptr, ViewArg{host, 4});
    } else if (!strcmp(what, "unregistered")) {
        // once unregistered, a host range is a host pointer again
        static int host[64];
        CK(cudaHostRegister(host, sizeof host, 0));
        CK(go(add_one, dim3(1), dim3(32), 0, nullptr, host));
        CK(cudaHostUnregister(host));
        go(add_one, dim3(1), dim3(32), 0, nullptr, host);
    } else if (!strcmp(what, "host_as_device_off")) {
        // the mode switched off again: a host pointer is caught as before
        static int host[64];
        kveEmuHostMemoryAsDevice(1);
        CK(go(add_one, dim3(1), dim3(32), 0, nullptr, host));
        kveEmuHostMemoryAsDevice(0);
        go(add_one, dim3(1), dim3(32), 0, nullptr, host);
    } else if (!strcmp(what, "past_registered")) {
        // one past a registered range is outside it
        static int host[64];
        CK(cudaHostRegister(host, 32 * sizeof(int), 0));
        go(add_one, dim3(1), dim3(32), 0, nullptr, host + 33);
    } else if (!strcmp(what, "overrun")) {
        float* f;
        CK(cudaMalloc((void**)&f, 10 * sizeof(float)));
        CK(go(write_past_end, dim3(1), dim3(32), 0, nullptr, f, 10));
        cudaFree(f);
    } else if (!strcmp(what, "far_overrun")) {
        float* f;
        CK(cudaMalloc((void**)&f, 10 * sizeof(float)));
        CK(go(write_far_past_end, dim3(1), dim3(32), 0, nullptr, f, 10));
    } else {
        printf("unknown case %s\n", what);
        return 2;
    }
    printf("not caught: %s\n", what);
    return 5;
}

int main(int argc, char** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: selftest CASE\n");
        return 2;
    }
    const char* c = argv[1];
    int rc;
    if (!strcmp(c, "good")) rc = good();
    else if (!strcmp(c, "wmma")) rc = wmma();
    else if (!strcmp(c, "conversions")) rc = conversions();
    else if (!strcmp(c, "limits")) rc = limits();
    else if (!strcmp(c, "capture")) rc = capture();
    else if (!strcmp(c, "pipeline")) rc = pipeline();
    else if (!strcmp(c, "host_register")) rc = host_register();
    else if (!strcmp(c, "host_as_device")) rc = host_as_device();
    else rc = bad(c);
    if (rc == 0) printf("ok\n");
    return rc;
}
