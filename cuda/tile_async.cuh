// Asynchronous global -> shared tile loads (cp.async, sm_80+): the window kernels issue
// the next K tile before computing on the current one. A thread's copies land when it
// waits for their group (__pipeline_wait_prior); other threads see them after that wait
// and a barrier. Layouts off the 16-byte path load synchronously (load_tile): the same
// pipeline code is then merely not overlapped.
#pragma once

#include <cuda_pipeline.h>
#include "tile_loads.cuh"

namespace kve {

// load_tile's contract (rows >= nrows_valid and dims >= dim zero up to dim_pad), with
// the 16-byte vectors copied by cp.async where the layout takes load_tile's fast path
// and dst rows keep 16-byte alignment; zero vectors are plain shared stores.
template <typename T>
__device__ __forceinline__ void load_tile_async(T* __restrict__ dst, int ld, const View& v,
                                                int64_t h, int64_t t0, int nrows_valid,
                                                int rows_pad, int dim_pad) {
    constexpr int VN = Vec16<T>::N;
    const int dim = (int)v.dim;
    const T* base = elem_ptr<T>(v, h, t0, 0);
    if (!(v.sd == 1 && dim % VN == 0 && dim_pad % VN == 0 && v.st % VN == 0 && aligned16(base) &&
          aligned16(dst) && ld % VN == 0)) {
        load_tile<T>(dst, ld, v, h, t0, nrows_valid, rows_pad, dim_pad);
        return;
    }
    const int vpr = dim_pad / VN;
    const int nv = rows_pad * vpr;
    const int64_t st = v.st;
    for (int e = threadIdx.x; e < nv; e += blockDim.x) {
        const int r = e / vpr, d = (e - r * vpr) * VN;
        T* out = dst + r * ld + d;
        if (r < nrows_valid && d < dim)
            __pipeline_memcpy_async(out, base + r * st + d, 16);
        else
            *reinterpret_cast<uint4*>(out) = make_uint4(0u, 0u, 0u, 0u);
    }
}

// load_g_cols' contract (columns [c0, c0 + CB) of a dense [dv, dv] matrix, zero past dv;
// with tri zero above the diagonal), with whole vectors on or below the diagonal copied
// by cp.async; vectors wholly above it or past dv are zero stores, the one a row may
// have across the diagonal a masked synchronous load. Off the 16-byte path: load_g_cols.
template <typename T, int NT, int CB, int DVP>
__device__ __forceinline__ void load_g_cols_async(T* __restrict__ G, int ldg,
                                                  const T* __restrict__ src, int dv, int c0,
                                                  int tri) {
    constexpr int VN = Vec16<T>::N;
    if (!(dv % VN == 0 && aligned16(src) && aligned16(G) && ldg % VN == 0)) {
        load_g_cols<T, NT, CB, DVP>(G, ldg, src, dv, c0, tri);
        return;
    }
    constexpr int VPR = CB / VN;  // vectors per row
    constexpr int NV = DVP * VPR;
    for (int e = threadIdx.x; e < NV; e += NT) {
        const int kr = e / VPR, cv = e - kr * VPR, cs = c0 + cv * VN;
        T* out = G + kr * ldg + cv * VN;
        const int k = tri ? kr - cs + 1 : VN;  // elements on or below the diagonal
        if (kr >= dv || cs >= dv || k <= 0) {
            *reinterpret_cast<uint4*>(out) = make_uint4(0u, 0u, 0u, 0u);
        } else if (k >= VN) {
            __pipeline_memcpy_async(out, src + (int64_t)kr * dv + cs, 16);
        } else {
            *reinterpret_cast<uint4*>(out) = keep_first<T>(ldg16(src + (int64_t)kr * dv + cs), k);
        }
    }
}

}  // namespace kve
