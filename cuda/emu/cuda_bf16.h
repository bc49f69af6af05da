// kvevict CUDA emulator: __nv_bfloat16 and __nv_bfloat162, round-to-nearest-even
// conversions in software, bit-exact with the device's cvt.rn.bf16.f32.
#pragma once

#include <stdint.h>
#include <string.h>
#include "cuda_runtime.h"

namespace kve_emu {
static inline uint16_t f32_to_bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float bf16_bits_to_f32(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
}  // namespace kve_emu

struct __nv_bfloat16 {
    uint16_t __x;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f) : __x(kve_emu::f32_to_bf16_bits(f)) {}
    operator float() const { return kve_emu::bf16_bits_to_f32(__x); }
};
struct alignas(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

static inline float __bfloat162float(__nv_bfloat16 h) { return kve_emu::bf16_bits_to_f32(h.__x); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    __nv_bfloat16 h;
    h.__x = kve_emu::f32_to_bf16_bits(f);
    return h;
}
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline float2 __bfloat1622float2(__nv_bfloat162 h) {
    return make_float2(__bfloat162float(h.x), __bfloat162float(h.y));
}
