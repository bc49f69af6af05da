// kvevict CUDA emulator: nvcuda::wmma (16x16x16, f16/bf16 operands, f32 accumulate).
// Every lane's fragment holds the whole tile (the device spreads it over the warp): same
// results, 32x the work. load/store are warp collectives here as on the device: all
// lanes of the warp meet before any lane loads or stores, so a lane running ahead
// cannot overwrite an operand a peer has not loaded yet.
#pragma once

#include "cuda_runtime.h"
#include "cuda_fp16.h"
#include "cuda_bf16.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K> struct Shape;
template <int M, int N, int K> struct Shape<matrix_a, M, N, K> { static constexpr int R = M, C = K; };
template <int M, int N, int K> struct Shape<matrix_b, M, N, K> { static constexpr int R = K, C = N; };
template <int M, int N, int K> struct Shape<accumulator, M, N, K> { static constexpr int R = M, C = N; };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
    static constexpr int R = Shape<Use, M, N, K>::R, C = Shape<Use, M, N, K>::C;
    static constexpr int num_elements = R * C;
    float x[R * C];  // row-major R x C, whatever the memory layout
};

template <typename U, int M, int N, int K, typename T, typename L>
inline void fill_fragment(fragment<U, M, N, K, T, L>& f, float v) {
    for (int i = 0; i < f.R * f.C; ++i) f.x[i] = v;
}

template <typename T> inline float emu_val(T v) { return (float)v; }

template <typename U, int M, int N, int K, typename T, typename L, typename P>
inline void load_matrix_sync(fragment<U, M, N, K, T, L>& f, const P* p, unsigned ldm) {
    static_assert(!std::is_same<U, accumulator>::value, "accumulator loads take a layout");
    kve_emu::sync_warp(0xffffffffu);
    const bool row = std::is_same<L, row_major>::value;
    for (int r = 0; r < f.R; ++r)
        for (int c = 0; c < f.C; ++c)
            f.x[r * f.C + c] = emu_val(row ? p[(size_t)r * ldm + c] : p[r + (size_t)c * ldm]);
}
template <int M, int N, int K, typename T>
inline void load_matrix_sync(fragment<accumulator, M, N, K, T>& f, const float* p, unsigned ldm,
                             layout_t l) {
    kve_emu::sync_warp(0xffffffffu);
    for (int r = 0; r < f.R; ++r)
        for (int c = 0; c < f.C; ++c)
            f.x[r * f.C + c] = l == mem_row_major ? p[(size_t)r * ldm + c] : p[r + (size_t)c * ldm];
}
template <int M, int N, int K, typename T>
inline void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, T>& f, unsigned ldm,
                              layout_t l) {
    kve_emu::sync_warp(0xffffffffu);
    for (int r = 0; r < f.R; ++r)
        for (int c = 0; c < f.C; ++c)
            (l == mem_row_major ? p[(size_t)r * ldm + c] : p[r + (size_t)c * ldm]) = f.x[r * f.C + c];
}
template <int M, int N, int K, typename T, typename LA, typename LB, typename TC>
inline void mma_sync(fragment<accumulator, M, N, K, TC>& d, const fragment<matrix_a, M, N, K, T, LA>& a,
                     const fragment<matrix_b, M, N, K, T, LB>& b,
                     const fragment<accumulator, M, N, K, TC>& c) {
    float out[M * N];
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
            float s = c.x[i * N + j];
            for (int k = 0; k < K; ++k) s += a.x[i * K + k] * b.x[k * N + j];
            out[i * N + j] = s;
        }
    for (int i = 0; i < M * N; ++i) d.x[i] = out[i];
}

}  // namespace wmma
}  // namespace nvcuda
