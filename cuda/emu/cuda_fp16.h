// kvevict CUDA emulator: __half and __half2 (IEEE binary16), round-to-nearest-even
// conversions in software, bit-exact with the device's cvt.rn.f16.f32.
#pragma once

#include <stdint.h>
#include <string.h>
#include "cuda_runtime.h"

namespace kve_emu {
static inline uint16_t f32_to_f16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    u &= 0x7fffffffu;
    if (u >= 0x7f800000u) return sign | (u > 0x7f800000u ? 0x7e00u : 0x7c00u);
    const uint32_t e = u >> 23;
    uint32_t m = u & 0x7fffffu;
    if (e >= 113) {  // a normal half (or overflow to inf through the carry)
        if (e > 142) return sign | 0x7c00u;
        uint32_t h = ((e - 112) << 10) | (m >> 13);
        const uint32_t rem = m & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
        return (uint16_t)(sign | (h >= 0x7c00u ? 0x7c00u : h));
    }
    if (e == 0) return sign;  // float subnormal: far below half's smallest subnormal
    m |= 0x800000u;
    const uint32_t s = 126 - e;  // value = m * 2^(e-150); half subnormal unit 2^-24
    if (s >= 32) return sign;
    uint32_t h = m >> s;
    const uint32_t rem = m & ((1u << s) - 1u), half = 1u << (s - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return (uint16_t)(sign | h);
}
static inline float f16_bits_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t u;
    if (e == 0) {
        float v = (float)m * 5.9604644775390625e-8f;  // 2^-24, exact
        return sign ? -v : v;
    } else if (e == 31) {
        u = sign | 0x7f800000u | (m << 13);
    } else {
        u = sign | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}
}  // namespace kve_emu

struct __half {
    uint16_t __x;
    __half() = default;
    __half(float f) : __x(kve_emu::f32_to_f16_bits(f)) {}
    operator float() const { return kve_emu::f16_bits_to_f32(__x); }
};
struct alignas(4) __half2 {
    __half x, y;
};
struct __half_raw {
    unsigned short x;
};

static inline float __half2float(__half h) { return kve_emu::f16_bits_to_f32(h.__x); }
static inline __half __float2half_rn(float f) {
    __half h;
    h.__x = kve_emu::f32_to_f16_bits(f);
    return h;
}
static inline __half __float2half(float f) { return __float2half_rn(f); }
static inline float2 __half22float2(__half2 h) { return make_float2(__half2float(h.x), __half2float(h.y)); }
static inline __half2 __floats2half2_rn(float a, float b) { return __half2{__float2half_rn(a), __float2half_rn(b)}; }
static inline unsigned short __half_as_ushort(__half h) { return h.__x; }
static inline __half __ushort_as_half(unsigned short u) {
    __half h;
    h.__x = u;
    return h;
}
