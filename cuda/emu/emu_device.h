// kvevict CUDA emulator: device intrinsics of cuda/*.cu on the host (see cuda_runtime.h).
// Rounding intrinsics (__fmul_rn, ...) are the IEEE operations themselves: the emulator is
// compiled with -ffp-contract=off, so nothing is fused that the device code does not fuse.
#pragma once

#include <stdint.h>
#include <string.h>
#include <math.h>

// -------------------------------------------------------------- barriers --
static inline void __syncthreads() { kve_emu::sync_block(); }
static inline int __syncthreads_and(int p) { return kve_emu::sync_block_and(p); }
static inline int __syncthreads_or(int p) { return kve_emu::sync_block_or(p); }
static inline int __syncthreads_count(int p) { return kve_emu::sync_block_count(p); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { kve_emu::sync_warp(mask); }

// ------------------------------------------------------ warp collectives --
template <typename T>
static inline uint64_t kve_emu_bits(T v) {
    static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof(T));
    return u;
}
template <typename T>
static inline T kve_emu_from_bits(uint64_t u) {
    T v;
    memcpy(&v, &u, sizeof(T));
    return v;
}
enum { KVE_EMU_SHFL_XOR = 0, KVE_EMU_SHFL_IDX = 1, KVE_EMU_SHFL_DOWN = 2, KVE_EMU_SHFL_UP = 3 };
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return kve_emu_from_bits<T>(kve_emu::shfl(mask, kve_emu_bits(v), KVE_EMU_SHFL_XOR, lane_mask, width));
}
template <typename T>
static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return kve_emu_from_bits<T>(kve_emu::shfl(mask, kve_emu_bits(v), KVE_EMU_SHFL_IDX, src, width));
}
template <typename T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
    return kve_emu_from_bits<T>(kve_emu::shfl(mask, kve_emu_bits(v), KVE_EMU_SHFL_DOWN, (int)d, width));
}
template <typename T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
    return kve_emu_from_bits<T>(kve_emu::shfl(mask, kve_emu_bits(v), KVE_EMU_SHFL_UP, (int)d, width));
}
static inline unsigned __ballot_sync(unsigned mask, int p) { return kve_emu::ballot(mask, p); }
static inline int __any_sync(unsigned mask, int p) { return kve_emu::ballot(mask, p) != 0; }
static inline int __all_sync(unsigned mask, int p) { return kve_emu::ballot(mask, p) == (mask & kve_emu::ballot(mask, 1)); }

// --------------------------------------------------------------- atomics --
// Threads never interleave between two emulator switch points, so a plain
// read-modify-write is atomic.
template <typename T> static inline T atomicAdd(T* p, T v) { T o = *p; *p = o + v; return o; }
template <typename T> static inline T atomicSub(T* p, T v) { T o = *p; *p = o - v; return o; }
template <typename T> static inline T atomicMax(T* p, T v) { T o = *p; if (v > o) *p = v; return o; }
template <typename T> static inline T atomicMin(T* p, T v) { T o = *p; if (v < o) *p = v; return o; }
template <typename T> static inline T atomicExch(T* p, T v) { T o = *p; *p = v; return o; }
template <typename T> static inline T atomicCAS(T* p, T c, T v) { T o = *p; if (o == c) *p = v; return o; }
template <typename T> static inline T atomicOr(T* p, T v) { T o = *p; *p = o | v; return o; }
template <typename T> static inline T atomicAnd(T* p, T v) { T o = *p; *p = o & v; return o; }
static inline void __threadfence() {}
static inline void __threadfence_block() {}

// ----------------------------------------------------------------- loads --
template <typename T> static inline T __ldg(const T* p) { return *p; }

// -------------------------------------------------------------- bit casts --
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline int __float_as_int(float f) { int u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline long long __double_as_longlong(double d) { long long u; memcpy(&u, &d, 8); return u; }
static inline double __longlong_as_double(long long u) { double d; memcpy(&d, &u, 8); return d; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }

// --------------------------------------------------- IEEE-rounded arithmetic --
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __ull2double_rn(unsigned long long x) { return (double)x; }
static inline double __ll2double_rn(long long x) { return (double)x; }
static inline float __int2float_rn(int x) { return (float)x; }
// Fast-math intrinsics: the accurate function (the device's is within 2 ulp plus
// scale-dependent error; tolerances of the tests cover both). glibc declares __expf and
// __logf itself (without exporting them), hence the renaming.
static inline float kve_emu_expf(float x) { return expf(x); }
static inline float kve_emu_logf(float x) { return logf(x); }
#define __expf kve_emu_expf
#define __logf kve_emu_logf
static inline float __fdividef(float a, float b) { return a / b; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

// ------------------------------------------------------ min / max overloads --
// The device library's overloads (integer and floating), in the global namespace.
#define KVE_EMU_MINMAX(T)                                      \
    static inline T min(T a, T b) { return a < b ? a : b; }    \
    static inline T max(T a, T b) { return a < b ? b : a; }
KVE_EMU_MINMAX(int)
KVE_EMU_MINMAX(unsigned)
KVE_EMU_MINMAX(long)
KVE_EMU_MINMAX(unsigned long)
KVE_EMU_MINMAX(long long)
KVE_EMU_MINMAX(unsigned long long)
#undef KVE_EMU_MINMAX
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }
