// Global -> shared tile loads of the window and vonorm kernels: 16-byte vector
// loads (ld.global.nc.v4, LOAD_UNROLL in flight per thread) when the layout allows
// it, the scalar element loop otherwise; the same zero padding either way. Which
// path runs is decided per call from block-uniform values only (no divergence).
// cuda/checks/tile_loads_test.cpp runs these on the host against a scalar reference.
#pragma once

#include "common.cuh"

namespace kve {

// ------------------------------------------------------- 16-byte vectors --
// Elements of T in one 16-byte vector (uint4): 8 for f16/bf16, 4 for f32.
template <typename T> struct Vec16 {
    static constexpr int N = 16 / (int)sizeof(T);
};

__device__ __forceinline__ bool aligned16(const void* p) {
    return ((uintptr_t)p & 15u) == 0;
}

// One 16-byte load through the read-only path (ld.global.nc.v4): the kernels that
// use it never write the source during the launch.
__device__ __forceinline__ uint4 ldg16(const void* p) {
    return __ldg(reinterpret_cast<const uint4*>(p));
}

// Zeroes the elements k.. of a vector of T (k clipped to [0, N]); 0.0 is the
// all-zero bit pattern in f32, f16 and bf16.
template <typename T>
__device__ __forceinline__ uint4 keep_first(uint4 x, int k) {
    uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if (sizeof(T) == 4) {
            if (i >= k) w[i] = 0u;
        } else {
            if (2 * i >= k) w[i] &= 0xffff0000u;
            if (2 * i + 1 >= k) w[i] &= 0x0000ffffu;
        }
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// Stores a vector of T at dst: one 16-byte store when dst is 16-byte aligned,
// else element by element (f32 tiles pad rows by one element).
template <typename T>
__device__ __forceinline__ void store_vec(T* dst, uint4 x, bool st16) {
    if (st16) {
        *reinterpret_cast<uint4*>(dst) = x;
    } else {
        const uint32_t w[4] = {x.x, x.y, x.z, x.w};
        if (sizeof(T) == 4) {
#pragma unroll
            for (int i = 0; i < 4; ++i) reinterpret_cast<uint32_t*>(dst)[i] = w[i];
        } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                reinterpret_cast<uint16_t*>(dst)[2 * i] = (uint16_t)(w[i] & 0xffffu);
                reinterpret_cast<uint16_t*>(dst)[2 * i + 1] = (uint16_t)(w[i] >> 16);
            }
        }
    }
}

// Vectors a thread loads before it stores any: enough bytes in flight per SM to
// approach HBM bandwidth (4 x 16 B x 256 threads = 16 KiB per block).
constexpr int LOAD_UNROLL = 4;

// The 16-byte tile path of load_tile / load_q_chunk: rows r < rows_pad of dim_pad
// elements (dim_pad, dim multiples of Vec16<T>::N), row r read from row_ptr(r)
// (16-byte aligned) for r < nrows_valid and d < dim, zero elsewhere; written to
// dst[r * ld + d]. Loads of LOAD_UNROLL vectors are issued before their stores.
template <typename T, typename RowPtr>
__device__ __forceinline__ void load_rows_vec(T* __restrict__ dst, int ld, RowPtr row_ptr,
                                              int nrows_valid, int rows_pad, int dim, int dim_pad,
                                              bool st16) {
    constexpr int VN = Vec16<T>::N;
    const int vpr = dim_pad / VN;  // vectors per row
    const int nv = rows_pad * vpr;
    const int step = blockDim.x;
    for (int e0 = threadIdx.x; e0 < nv; e0 += LOAD_UNROLL * step) {
        uint4 buf[LOAD_UNROLL];
#pragma unroll
        for (int u = 0; u < LOAD_UNROLL; ++u) {
            const int e = e0 + u * step;
            const int r = e / vpr, d = (e - r * vpr) * VN;
            buf[u] = make_uint4(0u, 0u, 0u, 0u);
            if (e < nv && r < nrows_valid && d < dim) buf[u] = ldg16(row_ptr(r) + d);
        }
#pragma unroll
        for (int u = 0; u < LOAD_UNROLL; ++u) {
            const int e = e0 + u * step;
            const int r = e / vpr, d = (e - r * vpr) * VN;
            if (e < nv) store_vec<T>(dst + r * ld + d, buf[u], st16);
        }
    }
}

// Copies a [rows x dim] tile of a view (head h, tokens t0.., dims 0..dim) into
// shared memory as row-major [rows_pad x ld] (same element type), zero-filling
// rows >= nrows_valid and dims >= dim up to dim_pad. Coalesces along the unit
// stride of the view (dim or token). All threads of the block participate.
// Fast path: 16-byte loads when the dim stride is 1, dim and the token stride are
// multiples of the vector and the tile's first row is 16-byte aligned (every
// operand of the test is the same in every thread: no divergence).
template <typename T>
__device__ __forceinline__ void load_tile(T* __restrict__ dst, int ld, const View& v, int64_t h,
                                          int64_t t0, int nrows_valid, int rows_pad, int dim_pad) {
    constexpr int VN = Vec16<T>::N;
    const int dim = (int)v.dim;
    const int n = rows_pad * dim_pad;
    const T* base = elem_ptr<T>(v, h, t0, 0);
    if (v.sd == 1 && dim % VN == 0 && dim_pad % VN == 0 && v.st % VN == 0 && aligned16(base)) {
        const int64_t st = v.st;
        const bool st16 = aligned16(dst) && ld % VN == 0;
        load_rows_vec<T>(
            dst, ld, [=](int r) { return base + r * st; }, nrows_valid, rows_pad, dim,
            dim_pad, st16);
    } else if (v.sd == 1 || v.st != 1) {
        // dim fastest
        for (int e = threadIdx.x; e < n; e += blockDim.x) {
            const int r = e / dim_pad, d = e - r * dim_pad;
            T x = zero_val<T>();
            if (r < nrows_valid && d < dim) x = *elem_ptr<T>(v, h, t0 + r, d);
            dst[r * ld + d] = x;
        }
    } else {
        // tokens fastest (transposed layouts)
        for (int e = threadIdx.x; e < n; e += blockDim.x) {
            const int d = e / rows_pad, r = e - d * rows_pad;
            T x = zero_val<T>();
            if (r < nrows_valid && d < dim) x = *elem_ptr<T>(v, h, t0 + r, d);
            dst[r * ld + d] = x;
        }
    }
}

// Query rows of one window chunk, positions j0.. j0+jn and heads h0.. h0+hn of KV
// group hk: row r = jj*hn + hh is q[hk*g + h0 + hh, j0 + jj, :]; into Qs [rcp x ldq]
// with rows >= jn*hn and dims >= dk zero up to dkp. 16-byte loads when the dim
// stride is 1, dk, the head and token strides are multiples of the vector and the
// chunk's first row is 16-byte aligned.
template <typename T>
__device__ __forceinline__ void load_q_rows(T* __restrict__ Qs, int ldq, int dkp, const View& q,
                                            int hk, int g, int h0, int hn, int64_t j0, int jn,
                                            int rcp) {
    constexpr int VN = Vec16<T>::N;
    const int dk = (int)q.dim;
    const int rows = jn * hn;
    const T* base = elem_ptr<T>(q, (int64_t)hk * g + h0, j0, 0);
    if (q.sd == 1 && dk % VN == 0 && dkp % VN == 0 && q.st % VN == 0 && q.sh % VN == 0 &&
        aligned16(base)) {
        const int64_t sh = q.sh, st = q.st;
        const bool st16 = aligned16(Qs) && ldq % VN == 0;
        load_rows_vec<T>(
            Qs, ldq, [=](int r) { return base + (r % hn) * sh + (r / hn) * st; }, rows, rcp, dk,
            dkp, st16);
        return;
    }
    for (int e = threadIdx.x; e < rcp * dkp; e += blockDim.x) {
        const int r = e / dkp, d = e - r * dkp;
        T x = zero_val<T>();
        if (r < rows && d < dk) {
            const int hh = r % hn, jj = r / hn;
            x = *elem_ptr<T>(q, (int64_t)hk * g + h0 + hh, j0 + jj, d);
        }
        Qs[r * ldq + d] = x;
    }
}

// Columns [c0, c0 + CB) of a dense row-major [dv, dv] matrix into G [DVP x ldg]
// (rows >= dv and columns >= dv zero); with tri (a Cholesky factor) also zero
// above the diagonal (column > row). Blocks of NT threads. 16-byte loads when dv
// is a multiple of the vector and src, G and ldg keep 16-byte alignment (vectors
// wholly above the diagonal are not read); the element loop otherwise.
template <typename T, int NT, int CB, int DVP>
__device__ __forceinline__ void load_g_cols(T* __restrict__ G, int ldg, const T* __restrict__ src,
                                            int dv, int c0, int tri) {
    constexpr int VN = Vec16<T>::N;
    static_assert(CB % VN == 0, "column chunks are whole vectors");
    if (dv % VN == 0 && aligned16(src) && aligned16(G) && ldg % VN == 0) {
        constexpr int VPR = CB / VN;  // vectors per row
        constexpr int NV = DVP * VPR;
        constexpr int PER = (NV + NT - 1) / NT;
        uint4 buf[PER];
#pragma unroll
        for (int u = 0; u < PER; ++u) {
            const int e = threadIdx.x + u * NT;
            const int kr = e / VPR, cs = c0 + (e - kr * VPR) * VN;
            buf[u] = make_uint4(0u, 0u, 0u, 0u);
            const int k = tri ? kr - cs + 1 : VN;  // elements on or below the diagonal
            if (e < NV && kr < dv && cs < dv && k > 0) {
                buf[u] = ldg16(src + (int64_t)kr * dv + cs);
                if (k < VN) buf[u] = keep_first<T>(buf[u], k);
            }
        }
#pragma unroll
        for (int u = 0; u < PER; ++u) {
            const int e = threadIdx.x + u * NT;
            const int kr = e / VPR, cv = e - kr * VPR;
            if (e < NV) *reinterpret_cast<uint4*>(G + kr * ldg + cv * VN) = buf[u];
        }
        return;
    }
    for (int e = threadIdx.x; e < DVP * CB; e += NT) {
        const int kr = e / CB, c = e - kr * CB;
        const bool ok = kr < dv && c0 + c < dv && (!tri || kr >= c0 + c);
        G[kr * ldg + c] = ok ? src[(int64_t)kr * dv + c0 + c] : zero_val<T>();
    }
}

}  // namespace kve
