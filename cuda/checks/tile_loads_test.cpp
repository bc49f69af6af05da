// Host test of cuda/tile_loads.cuh (no GPU, plain g++): runs load_tile, load_q_rows
// and load_g_cols for every thread of an emulated block, one thread after another
// (the loaders have no barrier and each thread writes its own elements), over
// layouts that take the 16-byte path and layouts that fall back to the element
// loop, and compares every padded element with a scalar reference; elements past
// the padded width must stay untouched. A shim below stands in for the CUDA headers:
// the loaders only copy bits, so f16 / bf16 are 16-bit payloads here.
// Build and run: see cuda/ptx_check.sh (g++ with -Icuda and the CUDA include dir).
#define __CUDA_RUNTIME_H__
#define __CUDA_FP16_H__
#define __CUDA_BF16_H__
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

// ------------------------------------------------------------------- shim --
struct uint3 {
    unsigned x, y, z;
};
struct uint4 {
    unsigned x, y, z, w;
};
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
    return uint4{x, y, z, w};
}
static uint3 threadIdx, blockDim;
static long g_vec_loads = 0;  // 16-byte loads issued: tells which path ran
static inline uint4 __ldg(const uint4* p) {
    if (((uintptr_t)p & 15u) != 0) {
        fprintf(stderr, "misaligned 16-byte load at %p\n", (const void*)p);
        abort();
    }
    ++g_vec_loads;
    return *p;
}
struct __half {
    uint16_t b;
};
struct __nv_bfloat16 {
    uint16_t b;
};
[[noreturn]] static void unused(const char* f) {
    fprintf(stderr, "shim: %s is not used by the loaders\n", f);
    abort();
}
static inline float __half2float(__half) { unused("__half2float"); }
static inline float __bfloat162float(__nv_bfloat16) { unused("__bfloat162float"); }
// zero_val<T>() is the only conversion the loaders make
static inline __half __float2half_rn(float x) {
    if (x != 0.0f) unused("__float2half_rn(x != 0)");
    return __half{0};
}
static inline __nv_bfloat16 __float2bfloat16_rn(float x) {
    if (x != 0.0f) unused("__float2bfloat16_rn(x != 0)");
    return __nv_bfloat16{0};
}
static inline float __shfl_xor_sync(unsigned, float, int) { unused("__shfl_xor_sync"); }
static inline double __shfl_xor_sync(unsigned, double, int) { unused("__shfl_xor_sync"); }
static inline unsigned __ballot_sync(unsigned, int) { unused("__ballot_sync"); }
static inline int __popc(unsigned) { unused("__popc"); }
static inline void __syncthreads() { unused("__syncthreads"); }
static inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
typedef void* cudaStream_t;
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1 };
enum cudaDeviceAttr { cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaStreamCaptureMode { cudaStreamCaptureModeRelaxed = 2 };
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct cudaLaunchConfig_t {
    dim3 gridDim, blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
};
template <typename... P, typename... A>
static inline cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t*, void (*)(P...), A&&...) {
    unused("cudaLaunchKernelEx");
}
static inline cudaError_t cudaGetDevice(int*) { unused("cudaGetDevice"); }
static inline cudaError_t cudaDeviceGetAttribute(int*, cudaDeviceAttr, int) {
    unused("cudaDeviceGetAttribute");
}
static inline cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode*) {
    unused("cudaThreadExchangeStreamCaptureMode");
}
static inline cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute, int) {
    unused("cudaFuncSetAttribute");
}

#include "tile_loads.cuh"

using namespace kve;

// -------------------------------------------------------------- harness --
static int g_fail = 0, g_cases = 0, g_vec_cases = 0;

// Bits of element type T (4 or 2 bytes) as uint32.
template <typename T> static uint32_t bits(const T& x) {
    uint32_t u = 0;
    memcpy(&u, &x, sizeof(T));
    return u;
}
template <typename T> static T from_bits(uint32_t u) {
    T x;
    memcpy(&x, &u, sizeof(T));
    return x;
}

// A 16-byte aligned buffer of n elements starting `shift` elements past alignment,
// filled with nonzero, position-dependent bits.
template <typename T> struct Buf {
    std::vector<unsigned char> raw;
    T* p;
    Buf(size_t n, int shift, uint32_t seed) : raw((n + shift) * sizeof(T) + 64) {
        uintptr_t a = ((uintptr_t)raw.data() + 15) & ~(uintptr_t)15;
        p = reinterpret_cast<T*>(a) + shift;
        for (size_t i = 0; i < n; ++i) {
            uint32_t v = (uint32_t)(i * 2654435761u + seed) | 1u;
            if (sizeof(T) == 2) v = (v & 0x7fffu) | 1u;
            p[i] = from_bits<T>(v);
        }
    }
};

constexpr uint32_t SENTINEL = 0xABCD;

// Runs `body` once per thread of a block of nt threads.
template <typename F> static void run_block(int nt, F body) {
    blockDim = uint3{(unsigned)nt, 1, 1};
    for (int t = 0; t < nt; ++t) {
        threadIdx = uint3{(unsigned)t, 0, 0};
        body();
    }
}

// Compares dst [rows x ld] with want(r, d) for d < width, and the sentinel past it.
template <typename T, typename W>
static void check(const char* what, const T* dst, int rows, int ld, int width, bool want_vec,
                  W want) {
    ++g_cases;
    int bad = 0;
    for (int r = 0; r < rows && bad < 3; ++r)
        for (int d = 0; d < ld && bad < 3; ++d) {
            const uint32_t got = bits(dst[r * ld + d]);
            const uint32_t exp = d < width ? want(r, d) : SENTINEL;
            if (got != exp) {
                fprintf(stderr, "FAIL %s: [%d][%d] = %#x, want %#x\n", what, r, d, got, exp);
                ++bad;
            }
        }
    const bool vec = g_vec_loads > 0;
    if (vec != want_vec) {
        fprintf(stderr, "FAIL %s: %s path ran, expected the %s path\n", what,
                vec ? "16-byte" : "element", want_vec ? "16-byte" : "element");
        ++bad;
    }
    if (want_vec) ++g_vec_cases;
    if (bad) g_fail = 1;
}

// load_tile over a [heads, tokens, dim] view in several layouts.
template <typename T> static void test_tile(const char* tn) {
    constexpr int VN = 16 / (int)sizeof(T);
    const int pad = sizeof(T) == 2 ? 8 : 1;
    for (int dim_pad : {64, 128, 256})
        for (int dim : {dim_pad, dim_pad - VN, dim_pad - 3, VN, 1})
            for (int layout = 0; layout < 5; ++layout)
                for (int nvalid : {64, 59, 1, 0})
                    for (int ldpad : {pad, 4, 8}) {
                        if (dim < 1) continue;
                        const int heads = 2, tokens = 200, rows_pad = 64, h = 1;
                        const int64_t t0 = 70;
                        View v;
                        int shift = 0;
                        // 0 contiguous, 1 padded token stride, 2 odd token stride,
                        // 3 base off alignment, 4 transposed (token stride 1)
                        int64_t st = dim + (layout == 1 ? 8 : layout == 2 ? 3 : 0);
                        v.sd = 1;
                        v.st = st;
                        v.sh = st * tokens;
                        if (layout == 3) shift = 1;
                        if (layout == 4) {
                            v.st = 1;
                            v.sd = tokens;
                            v.sh = (int64_t)tokens * dim;
                        }
                        const size_t n = (size_t)heads * (layout == 4 ? tokens * dim : st * tokens);
                        Buf<T> src(n, shift, (uint32_t)(dim * 131 + layout));
                        v.data = src.p;
                        v.heads = heads;
                        v.tokens = tokens;
                        v.dim = dim;
                        const int ld = dim_pad + ldpad;
                        Buf<T> dst((size_t)rows_pad * ld, 0, 0);
                        for (int i = 0; i < rows_pad * ld; ++i) dst.p[i] = from_bits<T>(SENTINEL);
                        g_vec_loads = 0;
                        run_block(256, [&] {
                            load_tile<T>(dst.p, ld, v, h, t0, nvalid, rows_pad, dim_pad);
                        });
                        const bool want_vec = layout <= 1 && dim % VN == 0 && nvalid > 0 &&
                                              (layout == 0 || (st % VN == 0));
                        char what[160];
                        snprintf(what, sizeof what, "load_tile<%s> dim_pad %d dim %d layout %d "
                                 "rows %d ld %d", tn, dim_pad, dim, layout, nvalid, ld);
                        check(what, dst.p, rows_pad, ld, dim_pad, want_vec, [&](int r, int d) {
                            if (r >= nvalid || d >= dim) return 0u;
                            return bits(src.p[h * v.sh + (t0 + r) * v.st + d * v.sd]);
                        });
                    }
}

// load_q_rows: rows r = jj*hn + hh of q [Hq, w, dk], heads h0.. h0+hn of the group.
template <typename T> static void test_q(const char* tn) {
    constexpr int VN = 16 / (int)sizeof(T);
    const int pad = sizeof(T) == 2 ? 8 : 1;
    for (int dkp : {64, 128})
        for (int dk : {dkp, dkp - VN, dkp - 5})
            for (int g : {1, 4, 5})
                for (int layout = 0; layout < 3; ++layout)
                    for (int jn : {1, 7})
                    for (int part = 0; part < (g > 1 ? 2 : 1); ++part) {
                        // the whole group, or heads 1.. g-1 (a head chunk)
                        const int h0 = part, hn = g - part;
                        const int hkv = 2, hk = 1, w = 24;
                        const int64_t j0 = 9;
                        const int rcp = (jn * hn + 15) / 16 * 16 + 16;  // extra zero rows too
                        // 0 contiguous [Hq, w, dk], 1 token-major [w, Hq, dk] (head
                        // stride dk), 2 base off alignment
                        View q;
                        q.heads = hkv * g;
                        q.tokens = w;
                        q.dim = dk;
                        q.sd = 1;
                        if (layout == 1) {
                            q.sh = dk;
                            q.st = (int64_t)dk * q.heads;
                        } else {
                            q.st = dk;
                            q.sh = (int64_t)dk * w;
                        }
                        Buf<T> src((size_t)q.heads * w * dk, layout == 2 ? 1 : 0,
                                   (uint32_t)(dk * 7 + g));
                        q.data = src.p;
                        const int ld = dkp + pad;
                        Buf<T> dst((size_t)rcp * ld, 0, 0);
                        for (int i = 0; i < rcp * ld; ++i) dst.p[i] = from_bits<T>(SENTINEL);
                        g_vec_loads = 0;
                        run_block(256, [&] {
                            load_q_rows<T>(dst.p, ld, dkp, q, hk, g, h0, hn, j0, jn, rcp);
                        });
                        const bool want_vec = layout <= 1 && dk % VN == 0;
                        char what[160];
                        snprintf(what, sizeof what, "load_q_rows<%s> dkp %d dk %d g %d h0 %d "
                                 "layout %d jn %d", tn, dkp, dk, g, h0, layout, jn);
                        check(what, dst.p, rcp, ld, dkp, want_vec, [&](int r, int d) {
                            if (r >= jn * hn || d >= dk) return 0u;
                            const int hh = h0 + r % hn, jj = r / hn;
                            return bits(src.p[((int64_t)hk * g + hh) * q.sh + (j0 + jj) * q.st + d]);
                        });
                    }
}

// load_g_cols: column chunks of a dense [dv, dv] matrix, full or lower triangle.
template <typename T, int DVP> static void test_g(const char* tn) {
    constexpr int VN = 16 / (int)sizeof(T);
    constexpr int NT = 256, CB = 32;
    const int ldg = CB + (sizeof(T) == 2 ? 8 : 4);
    for (int dv : {DVP, DVP - VN, DVP - 3, DVP / 2 + 5})
        for (int shift : {0, 1})
            for (int tri = 0; tri < 2; ++tri)
                for (int c0 = 0; c0 < dv; c0 += CB) {
                    Buf<T> src((size_t)dv * dv, shift, (uint32_t)(dv + 3 * tri));
                    Buf<T> dst((size_t)DVP * ldg, 0, 0);
                    for (int i = 0; i < DVP * ldg; ++i) dst.p[i] = from_bits<T>(SENTINEL);
                    g_vec_loads = 0;
                    run_block(NT, [&] {
                        load_g_cols<T, NT, CB, DVP>(dst.p, ldg, src.p, dv, c0, tri);
                    });
                    const bool want_vec = dv % VN == 0 && shift == 0;
                    char what[160];
                    snprintf(what, sizeof what, "load_g_cols<%s, %d> dv %d shift %d tri %d c0 %d",
                             tn, DVP, dv, shift, tri, c0);
                    check(what, dst.p, DVP, ldg, CB, want_vec, [&](int kr, int c) {
                        const bool ok = kr < dv && c0 + c < dv && (!tri || kr >= c0 + c);
                        return ok ? bits(src.p[(int64_t)kr * dv + c0 + c]) : 0u;
                    });
                }
}

int main() {
    test_tile<float>("f32");
    test_tile<__half>("f16");
    test_tile<__nv_bfloat16>("bf16");
    test_q<float>("f32");
    test_q<__half>("f16");
    test_q<__nv_bfloat16>("bf16");
    test_g<float, 64>("f32");
    test_g<float, 128>("f32");
    test_g<float, 256>("f32");
    test_g<__half, 64>("f16");
    test_g<__half, 128>("f16");
    test_g<__half, 256>("f16");
    test_g<__nv_bfloat16, 128>("bf16");
    printf("tile_loads_test: %d cases (%d on the 16-byte path), %s\n", g_cases, g_vec_cases,
           g_fail ? "FAILED" : "all match the scalar reference");
    return g_fail;
}
