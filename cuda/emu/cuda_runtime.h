// kvevict CUDA emulator (feature `cuda-emu`): the subset of the CUDA runtime and device
// language that cuda/*.cu uses, for the HOST C++ compiler. The real kernels compile
// unchanged against these headers and run on the CPU: every block in turn, its threads as
// coroutines switched at __syncthreads and warp collectives (cuda/emu/emu.cpp). What it
// proves: indexing, barriers, warp collectives, shared-memory sizes, launch limits, the
// stream/graph-capture rules and the arithmetic, against the CPU core, in CI without a
// GPU. What it cannot: timing, memory-model races between unsynchronised threads (threads
// run one at a time), and device-vs-host pointer mix-ups (both are host memory here;
// the emulator refuses a kernel pointer outside every cudaMalloc allocation and every
// range given to cudaHostRegister, as a GPU faults on an unmapped host pointer).
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <cmath>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

// ------------------------------------------------------------ qualifiers --
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
// Blocks run one after another on one OS thread (launches are serialised), so a
// function-static is exactly one block's shared variable.
#define __shared__ static
#define __constant__ static

// ----------------------------------------------------------- vector types --
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};
struct uint3 { unsigned x, y, z; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) double2 { double x, y; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
static inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
static inline float2 make_float2(float x, float y) { return {x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static inline double2 make_double2(double x, double y) { return {x, y}; }
static inline int2 make_int2(int x, int y) { return {x, y}; }

// ------------------------------------------------------------ error codes --
// The values are the CUDA runtime's.
enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorHostMemoryAlreadyRegistered = 712,
    cudaErrorHostMemoryNotRegistered = 713,
    cudaErrorLaunchFailure = 719,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureMerge = 902,
    cudaErrorStreamCaptureUnmatched = 903,
    cudaErrorStreamCaptureUnjoined = 904,
    cudaErrorStreamCaptureIsolation = 905,
    cudaErrorStreamCaptureImplicit = 906,
    cudaErrorStreamCaptureWrongThread = 908,
    cudaErrorIllegalState = 915,
    cudaErrorUnknown = 999,
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
    cudaStreamCaptureStatusNone = 0,
    cudaStreamCaptureStatusActive = 1,
    cudaStreamCaptureStatusInvalidated = 2,
};
enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrWarpSize = 10,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};
#define cudaHostRegisterDefault 0x00
#define cudaHostRegisterPortable 0x01
#define cudaHostRegisterMapped 0x02
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01

struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;
struct CUgraph_st;
typedef struct CUgraph_st* cudaGraph_t;
struct CUgraphExec_st;
typedef struct CUgraphExec_st* cudaGraphExec_t;
struct CUevent_st;
typedef struct CUevent_st* cudaEvent_t;

struct cudaLaunchAttribute {
    int id;
    char pad[4];
    unsigned char val[64];
};
struct cudaLaunchConfig_t {
    dim3 gridDim;
    dim3 blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    cudaLaunchAttribute* attrs;
    unsigned int numAttrs;
};

// ------------------------------------------------------------- host API --
extern "C" {
cudaError_t cudaMalloc(void** p, size_t bytes);
cudaError_t cudaFree(void* p);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, int kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, int kind, cudaStream_t s);
cudaError_t cudaMemset(void* p, int v, size_t bytes);
cudaError_t cudaMemsetAsync(void* p, int v, size_t bytes, cudaStream_t s);
// Host memory made visible to kernels, as with unified addressing on a GPU (where the
// device pointer of mapped, registered memory is its host pointer): kernels and copies
// may then use [p, p + bytes) as device memory. Ranges may not overlap (712); a range
// stays registered until cudaHostUnregister(p) (713 if p starts none).
cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned flags);
cudaError_t cudaHostUnregister(void* p);
cudaError_t cudaHostGetDevicePointer(void** dev, void* host, unsigned flags);
// Not CUDA: on != 0 makes every host address device memory (no registration needed; the
// pointer checks of kernels and copies then pass any non-null pointer), for a harness that
// cannot register its buffers (the llama.cpp fork's device path on its CPU cache,
// llama_fork/cuda_emu.sh); 0 restores the checks.
void kveEmuHostMemoryAsDevice(int on);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaGetDeviceCount(int* n);
cudaError_t cudaGetDevice(int* d);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaDeviceGetAttribute(int* v, enum cudaDeviceAttr a, int dev);
cudaError_t cudaFuncSetAttribute(const void* fn, enum cudaFuncAttribute a, int v);
cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus* st);
cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode* mode);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* e, cudaGraph_t g, unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char* cudaGetErrorString(cudaError_t e);
const char* cudaGetErrorName(cudaError_t e);
}

// ------------------------------------------------------- emulator core --
namespace kve_emu {
// Runs (or, on a capturing stream, records) one launch of `body` over the grid.
cudaError_t launch(const cudaLaunchConfig_t* cfg, const void* fn, std::function<void()> body);
// The current block's dynamic shared memory.
unsigned char* dyn_smem();
// Collectives: the calling thread waits here until its peers arrive.
void sync_block();
int sync_block_and(int pred);
int sync_block_or(int pred);
int sync_block_count(int pred);
void sync_warp(unsigned mask);
uint64_t shfl(unsigned mask, uint64_t v, int op, int arg, int width);
unsigned ballot(unsigned mask, int pred);
// cp.async: queued per thread, landing at the thread's wait for the group (or its exit).
void async_copy(void* dst, const void* src, size_t size, size_t zfill);
void async_commit();
void async_wait(size_t prior);
// Aborts with a message when a non-null kernel pointer argument is outside every allocation.
void check_kernel_pointer(const void* p, int index);
// Pointer arguments, and the `data` pointer of a struct argument that has one (a view).
template <typename T, typename = void> struct has_data_ptr : std::false_type {};
template <typename T>
struct has_data_ptr<T, std::void_t<decltype(std::declval<const T&>().data)>>
    : std::is_pointer<decltype(std::declval<const T&>().data)> {};
template <typename T> inline void check_arg(const T& a, int i) {
    if constexpr (std::is_pointer<T>::value)
        check_kernel_pointer(reinterpret_cast<const void*>(a), i);
    else if constexpr (has_data_ptr<T>::value)
        check_kernel_pointer(reinterpret_cast<const void*>(a.data), i);
}
}  // namespace kve_emu

extern uint3 threadIdx;
extern uint3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;
static constexpr int warpSize = 32;

template <typename... P, typename... A>
static inline cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t* cfg, void (*k)(P...),
                                             A&&... args) {
    // Arguments are copied at launch, as the driver copies them (a captured graph keeps its copy).
    auto tup = std::make_shared<std::tuple<typename std::decay<P>::type...>>(
        std::forward<A>(args)...);
    std::apply([](const auto&... a) {
        int i = 0;
        (kve_emu::check_arg(a, i++), ...);
    }, *tup);
    return kve_emu::launch(cfg, reinterpret_cast<const void*>(k),
                           [k, tup]() { std::apply(k, *tup); });
}

#include "emu_device.h"
