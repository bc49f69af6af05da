// Block-level shared-memory matrix products used by window.cu and vonorm.cu:
// tensor cores (WMMA 16x16x16, f32 accumulate) for f16/bf16, a SIMT f32 path
// for f32 tiles. All threads of the block call these; the caller synchronises
// before (operands written) and after (result read).
#pragma once

#include <mma.h>
#include "common.cuh"

namespace kve {

// Row padding (elements) of shared-memory operand tiles: keeps WMMA's 32-byte
// alignment / ldm % 8 rule for 16-bit types, breaks bank conflicts for f32.
template <typename T> struct Pad { static constexpr int value = 8; };
template <> struct Pad<float> { static constexpr int value = 1; };

template <typename T, bool IS16 = (sizeof(T) == 2)> struct MM;

// ---------------------------------------------------------- tensor cores --
template <typename T> struct MM<T, true> {
    // C[M x N] (f32, row-major, ldc) = A[M x KD] (row-major, lda) · B[N x KD]ᵀ
    // (B stored row-major as [N][KD], ldb). M, N multiples of 16.
    template <int KD>
    __device__ static void abt(float* C, int ldc, const T* A, int lda, const T* B, int ldb,
                               int M, int N) {
        using namespace nvcuda;
        const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
        const int mt = M / 16, nt = N / 16;
        if (nw % mt == 0) {
            // every output tile of this warp is in row tile warp % mt: its A fragments
            // are loaded once and kept in registers for all of them
            if (warp >= mt * nt) return;  // warp-uniform
            const int m0 = (warp % mt) * 16;
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a[KD / 16];
#pragma unroll
            for (int k = 0; k < KD / 16; ++k) wmma::load_matrix_sync(a[k], A + m0 * lda + k * 16, lda);
            for (int f = warp; f < mt * nt; f += nw) {
                const int n0 = (f / mt) * 16;
                wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
                wmma::fill_fragment(c, 0.0f);
#pragma unroll
                for (int k = 0; k < KD / 16; ++k) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b;
                    wmma::load_matrix_sync(b, B + n0 * ldb + k * 16, ldb);
                    wmma::mma_sync(c, a[k], b, c);
                }
                wmma::store_matrix_sync(C + m0 * ldc + n0, c, ldc, wmma::mem_row_major);
            }
            return;
        }
        for (int f = warp; f < mt * nt; f += nw) {
            const int m0 = (f % mt) * 16, n0 = (f / mt) * 16;
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
            wmma::fill_fragment(c, 0.0f);
#pragma unroll
            for (int k0 = 0; k0 < KD; k0 += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b;
                wmma::load_matrix_sync(a, A + m0 * lda + k0, lda);
                wmma::load_matrix_sync(b, B + n0 * ldb + k0, ldb);
                wmma::mma_sync(c, a, b, c);
            }
            wmma::store_matrix_sync(C + m0 * ldc + n0, c, ldc, wmma::mem_row_major);
        }
    }
    // C[M x N] = A[M x KD] · (B1 + B2)[KD x N] (B row-major [KD][N], ldb; B2 may
    // be null), the inner dimension from k_begin (a multiple of 16; rows of B
    // above it are taken as zero). M, N multiples of 16.
    template <int KD>
    __device__ static void ab(float* C, int ldc, const T* A, int lda, const T* B1, const T* B2,
                              int ldb, int M, int N, int k_begin = 0) {
        using namespace nvcuda;
        const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
        const int mt = M / 16, nt = N / 16;
        for (int f = warp; f < mt * nt; f += nw) {
            const int m0 = (f % mt) * 16, n0 = (f / mt) * 16;
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
            wmma::fill_fragment(c, 0.0f);
#pragma unroll 4
            for (int k0 = k_begin; k0 < KD; k0 += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b;
                wmma::load_matrix_sync(a, A + m0 * lda + k0, lda);
                wmma::load_matrix_sync(b, B1 + k0 * ldb + n0, ldb);
                wmma::mma_sync(c, a, b, c);
                if (B2) {
                    wmma::load_matrix_sync(b, B2 + k0 * ldb + n0, ldb);
                    wmma::mma_sync(c, a, b, c);
                }
            }
            wmma::store_matrix_sync(C + m0 * ldc + n0, c, ldc, wmma::mem_row_major);
        }
    }
};

// ------------------------------------------------------------- SIMT f32 --
template <> struct MM<float, false> {
    // C[M x N] = A[M x KD] · B where load_b(k, n) is B's element (k, n), the inner
    // dimension from k_begin: a thread a 4x4 tile, each element its FMA chain over k in
    // order. M, N multiples of 4.
    template <int KD, class LoadB>
    __device__ static void tiles(float* C, int ldc, const float* A, int lda, int M, int N,
                                 int k_begin, LoadB load_b) {
        const int tm = M / 4, tn = N / 4;
        for (int t = threadIdx.x; t < tm * tn; t += blockDim.x) {
            const int m0 = (t / tn) * 4, n0 = (t % tn) * 4;
            float acc[4][4];
#pragma unroll
            for (int r = 0; r < 4; ++r)
#pragma unroll
                for (int c = 0; c < 4; ++c) acc[r][c] = 0.0f;
#pragma unroll 4
            for (int k = k_begin; k < KD; ++k) {
                float a[4], b[4];
#pragma unroll
                for (int r = 0; r < 4; ++r) a[r] = A[(m0 + r) * lda + k];
#pragma unroll
                for (int c = 0; c < 4; ++c) b[c] = load_b(k, n0 + c);
#pragma unroll
                for (int r = 0; r < 4; ++r)
#pragma unroll
                    for (int c = 0; c < 4; ++c) acc[r][c] = fmaf(a[r], b[c], acc[r][c]);
            }
#pragma unroll
            for (int r = 0; r < 4; ++r)
#pragma unroll
                for (int c = 0; c < 4; ++c) C[(m0 + r) * ldc + n0 + c] = acc[r][c];
        }
    }
    template <int KD>
    __device__ static void abt(float* C, int ldc, const float* A, int lda, const float* B,
                               int ldb, int M, int N) {
        tiles<KD>(C, ldc, A, lda, M, N, 0, [=](int k, int n) { return B[n * ldb + k]; });
    }
    template <int KD>
    __device__ static void ab(float* C, int ldc, const float* A, int lda, const float* B1,
                              const float* B2, int ldb, int M, int N, int k_begin = 0) {
        tiles<KD>(C, ldc, A, lda, M, N, k_begin, [=](int k, int n) {
            return B1[k * ldb + n] + (B2 ? B2[k * ldb + n] : 0.0f);
        });
    }
};

}  // namespace kve
