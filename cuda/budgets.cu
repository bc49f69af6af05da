// Budget allocation on the device (design §4), so a whole selection can run without
// a host round trip: the per-layer and per-unit budgets of the allocators
// (uniform, PyramidKV, AdaKV's safeguard floor, LAVa's entropy split), computed by
// one thread exactly as the core's select_model (src/math/budget: pyramid.rs,
// lava.rs, ada.rs): u128 integer arithmetic, f64 with explicit round-to-nearest
// intrinsics (no FMA contraction), Rust's saturating float-to-int casts; then the
// AdaKV/LAVa safeguard marks (forced entries to +inf before kve_cuda_select) and
// the broadcast of kept lists for the shared granularities.
#include "common.cuh"

namespace kve {
namespace {

typedef unsigned __int128 u128;

// Rust's `x as u64` for an f64: NaN and negatives 0, saturating at u64::MAX.
__device__ __forceinline__ uint64_t sat_u64(double x) {
    if (!(x > 0.0)) return 0;
    if (x >= 18446744073709551616.0) return ~0ull;
    return (uint64_t)x;
}

// src/math/budget/pyramid.rs pyramid_budget
__device__ uint64_t pyramid_budget_dev(uint64_t b64, uint32_t beta, uint64_t l64,
                                       uint64_t layers64) {
    if (layers64 <= 1) return b64;
    const u128 b = b64, l = l64, layers = layers64;
    const u128 mn = b / (u128)beta;
    const u128 mx = 2 * b - mn;
    const u128 r = mx - l * (mx - mn) / (layers - 1);
    return r > (u128)(~0ull) ? ~0ull : (uint64_t)r;
}

// src/math/budget/ada.rs: floor((alpha as f64) * (total as f64 / per_layer as f64)) as u64
__device__ __forceinline__ uint64_t ada_floor(float alpha, uint64_t total, uint64_t per_layer) {
    const double q = __ddiv_rn(__ull2double_rn(total), __ull2double_rn(per_layer));
    return sat_u64(floor(__dmul_rn((double)alpha, q)));
}

// src/math/budget/lava.rs lava_budgets with caps[l] = cap for every layer. The core's
// `mark` scratch is bit 63 of out[l] (every value stays below 2^63: the launcher
// checks layers·per_layer·p < 2^62). Returns what could not be placed.
constexpr uint64_t MARK = 1ull << 63;

__device__ __forceinline__ double lava_share(const double* w, int64_t l, double wsum,
                                             uint64_t left, int64_t active) {
    if (wsum > 0.0)
        return __dmul_rn(__ddiv_rn(fmax(w[l], 0.0), wsum), __ull2double_rn(left));
    return __ddiv_rn(__ull2double_rn(left), __ll2double_rn(active));
}

__device__ uint64_t lava_budgets_dev(const double* w, int64_t n, uint64_t total, uint64_t cap,
                                     uint64_t* out) {
    for (int64_t l = 0; l < n; ++l) out[l] = 0;
    uint64_t left = total;
    for (;;) {
        int64_t active = 0;
        for (int64_t l = 0; l < n; ++l) active += out[l] < cap;
        if (left == 0 || active == 0) return left;
        // Σ over open layers in layer order (Rust's f64 Sum: a left fold)
        double wsum = -0.0;
        for (int64_t l = 0; l < n; ++l)
            if (out[l] < cap) wsum = __dadd_rn(wsum, fmax(w[l], 0.0));
        for (int64_t l = 0; l < n; ++l)
            if (out[l] < cap) out[l] |= MARK;
        uint64_t given = 0;
        for (int64_t l = 0; l < n; ++l) {
            if (out[l] & MARK) {
                const uint64_t f = sat_u64(floor(lava_share(w, l, wsum, left, active)));
                out[l] += f;
                given += f;
            }
        }
        // largest remainders, one token each, ties to the lower layer
        uint64_t rest = left > given ? left - given : 0;
        while (rest > 0) {
            int64_t best = -1;
            double bf = -1.0;
            for (int64_t l = 0; l < n; ++l) {
                if (out[l] & MARK) {
                    const double s = lava_share(w, l, wsum, left, active);
                    const double fr = __dsub_rn(s, floor(s));
                    if (fr > bf) {
                        bf = fr;
                        best = l;
                    }
                }
            }
            if (best < 0) break;
            out[best] = (out[best] & ~MARK) + 1;
            rest -= 1;
        }
        for (int64_t l = 0; l < n; ++l) out[l] &= ~MARK;
        uint64_t excess = rest;
        for (int64_t l = 0; l < n; ++l) {
            if (out[l] > cap) {
                excess += out[l] - cap;
                out[l] = cap;
            }
        }
        if (excess == left) return left;  // nothing could be placed
        left = excess;
    }
}

struct BudgetArgs {
    int mode;
    const double* weights;
    int64_t layers, per_layer, p;
    uint64_t budget;
    uint32_t beta;
    float alpha;
    int64_t* k_layer;
    int64_t* k_unit;
};

__global__ void layer_budgets_kernel(BudgetArgs a) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const uint64_t p = (uint64_t)a.p, per = (uint64_t)a.per_layer;
    const uint64_t bb = a.budget < p ? a.budget : p;  // B = min(budget, p)
    uint64_t* kl = reinterpret_cast<uint64_t*>(a.k_layer);
    if (a.mode == KVE_CUDA_BUDGET_LAVA) {
        const uint64_t units = (uint64_t)a.layers * per;
        // saturating (cannot saturate under the launcher's bound, kept for the letter)
        const u128 t = (u128)units * bb;
        const uint64_t total = t > (u128)(~0ull) ? ~0ull : (uint64_t)t;
        lava_budgets_dev(a.weights, a.layers, total, per * p, kl);
    }
    for (int64_t l = 0; l < a.layers; ++l) {
        uint64_t unit;
        switch (a.mode) {
            case KVE_CUDA_BUDGET_UNIFORM:
                unit = bb;
                kl[l] = per * bb;
                break;
            case KVE_CUDA_BUDGET_PYRAMID: {
                uint64_t b = pyramid_budget_dev(a.budget, a.beta, (uint64_t)l, (uint64_t)a.layers);
                unit = b < p ? b : p;
                kl[l] = per * unit;
                break;
            }
            case KVE_CUDA_BUDGET_ADA:
                kl[l] = per * bb;
                unit = ada_floor(a.alpha, kl[l], per);
                break;
            default:  // LAVa: the safeguard follows the layer's budget
                unit = ada_floor(a.alpha, kl[l], per);
                break;
        }
        if (a.k_unit)
            for (int64_t u = l * a.per_layer; u < (l + 1) * a.per_layer; ++u)
                a.k_unit[u] = (int64_t)unit;
    }
}

// scores[r*ld + idx[r*idx_ld + t]] = +inf for t < counts[r]; positions outside
// [0, ld) are skipped (they would leave the row).
__global__ void mark_forced_kernel(float* __restrict__ scores, int64_t ld, int64_t rows,
                                   const int32_t* __restrict__ counts,
                                   const int32_t* __restrict__ idx, int64_t idx_ld) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int64_t c = counts[r];
        for (int64_t t = threadIdx.x; t < c; t += blockDim.x) {
            const int64_t i = idx[r * idx_ld + t];
            if (i >= 0 && i < ld) scores[r * ld + i] = INFINITY;
        }
    }
}

// Row u = r*reps + j gets source row r's count and list.
__global__ void broadcast_lists_kernel(const int32_t* __restrict__ src_counts,
                                       const int32_t* __restrict__ src_idx, int64_t src_ld,
                                       int64_t reps, int64_t rows_out,
                                       int32_t* __restrict__ counts, int32_t* __restrict__ idx,
                                       int64_t idx_ld) {
    for (int64_t u = blockIdx.x; u < rows_out; u += gridDim.x) {
        const int64_t r = u / reps;
        const int32_t c = src_counts[r];
        if (threadIdx.x == 0) counts[u] = c;
        for (int64_t t = threadIdx.x; t < c; t += blockDim.x)
            idx[u * idx_ld + t] = src_idx[r * src_ld + t];
    }
}

// Row r's list gets start, start+1, .. start+count-1 after its counts[r] entries.
// One block per row: the count is read once, before any thread writes it.
__global__ void append_range_kernel(int32_t* __restrict__ counts, int32_t* __restrict__ idx,
                                    int64_t idx_ld, int64_t rows, int32_t start,
                                    int32_t count) {
    __shared__ int32_t c0;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        if (threadIdx.x == 0) c0 = counts[r];
        __syncthreads();
        const int32_t c = c0;
        for (int32_t t = threadIdx.x; t < count; t += blockDim.x)
            if ((int64_t)c + t < idx_ld) idx[r * idx_ld + c + t] = start + t;
        __syncthreads();
        if (threadIdx.x == 0) counts[r] = c + count;
    }
}

}  // namespace
}  // namespace kve

using namespace kve;

extern "C" int kve_cuda_layer_budgets(int mode, const double* weights, int64_t layers,
                                      int64_t per_layer, int64_t p, uint64_t budget,
                                      uint32_t beta, float alpha, int64_t* k_layer,
                                      int64_t* k_unit, void* stream) {
    if (mode < KVE_CUDA_BUDGET_UNIFORM || mode > KVE_CUDA_BUDGET_LAVA)
        return (int)cudaErrorInvalidValue;
    if (layers < 0 || per_layer < 1 || p < 0) return (int)cudaErrorInvalidValue;
    // layers·per_layer·p < 2^62: every budget, cap and total fits (and LAVa's mark bit)
    const unsigned __int128 cells = (unsigned __int128)layers * (uint64_t)per_layer * (uint64_t)p;
    if (cells >= ((unsigned __int128)1 << 62) ||
        (unsigned __int128)layers * (uint64_t)per_layer >= ((unsigned __int128)1 << 62))
        return (int)cudaErrorInvalidValue;
    // the core's SelectConfig::validate: beta >= 1 (a divisor), 0 <= alpha <= 1
    if (mode == KVE_CUDA_BUDGET_PYRAMID && beta == 0) return (int)cudaErrorInvalidValue;
    if ((mode == KVE_CUDA_BUDGET_ADA || mode == KVE_CUDA_BUDGET_LAVA) &&
        !(alpha >= 0.0f && alpha <= 1.0f))
        return (int)cudaErrorInvalidValue;
    if (layers == 0) return 0;
    if (!k_layer || (mode == KVE_CUDA_BUDGET_LAVA && !weights)) return (int)cudaErrorInvalidValue;
    const double* w = mode == KVE_CUDA_BUDGET_LAVA ? weights : nullptr;
    const BudgetArgs a{mode, w, layers, per_layer, p, budget, beta, alpha, k_layer, k_unit};
    KVE_CHECK(launch_kernel(layer_budgets_kernel, 1, 1, 0, KVE_STREAM(stream), a));
    return 0;
}

extern "C" int kve_cuda_mark_forced(float* scores, int64_t ld, int64_t rows, const int32_t* counts,
                                    const int32_t* idx, int64_t idx_ld, void* stream) {
    if (rows < 0 || ld < 0 || idx_ld < 0) return (int)cudaErrorInvalidValue;
    if (rows == 0 || ld == 0) return 0;
    if (!scores || !counts || !idx) return (int)cudaErrorInvalidValue;
    const unsigned blocks = (unsigned)(rows > 65535 ? 65535 : rows);
    KVE_CHECK(launch_kernel(mark_forced_kernel, blocks, 256, 0, KVE_STREAM(stream), scores, ld,
        rows, counts, idx, idx_ld));
    return 0;
}

extern "C" int kve_cuda_broadcast_lists(const int32_t* src_counts, const int32_t* src_idx,
                                        int64_t src_ld, int64_t src_rows, int64_t reps,
                                        int32_t* counts, int32_t* idx, int64_t idx_ld,
                                        void* stream) {
    if (src_rows < 0 || reps < 0 || src_ld < 0 || idx_ld < 0) return (int)cudaErrorInvalidValue;
    if (src_rows == 0 || reps == 0) return 0;
    if ((unsigned __int128)src_rows * (uint64_t)reps >= ((unsigned __int128)1 << 62))
        return (int)cudaErrorInvalidValue;
    if (!src_counts || !src_idx || !counts || !idx) return (int)cudaErrorInvalidValue;
    if ((const void*)counts == (const void*)src_counts || (const void*)idx == (const void*)src_idx ||
        (const void*)counts == (const void*)src_idx || (const void*)idx == (const void*)src_counts)
        return (int)cudaErrorInvalidValue;
    const int64_t rows_out = src_rows * reps;
    const unsigned blocks = (unsigned)(rows_out > 65535 ? 65535 : rows_out);
    KVE_CHECK(launch_kernel(broadcast_lists_kernel, blocks, 256, 0, KVE_STREAM(stream), src_counts,
        src_idx, src_ld, reps, rows_out, counts, idx, idx_ld));
    return 0;
}

extern "C" int kve_cuda_append_range(int32_t* counts, int32_t* idx, int64_t idx_ld, int64_t rows,
                                     int64_t start, int64_t count, void* stream) {
    if (rows < 0 || idx_ld < 0 || start < 0 || count < 0) return (int)cudaErrorInvalidValue;
    if (rows == 0 || count == 0) return 0;
    if (start + count > ((int64_t)1 << 31) - 1 || count > idx_ld) return (int)cudaErrorInvalidValue;
    if (!counts || !idx) return (int)cudaErrorInvalidValue;
    const unsigned blocks = (unsigned)(rows > 65535 ? 65535 : rows);
    KVE_CHECK(launch_kernel(append_range_kernel, blocks, 256, 0, KVE_STREAM(stream), counts, idx,
        idx_ld, rows, (int32_t)start, (int32_t)count));
    return 0;
}
