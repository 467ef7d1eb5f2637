// Host-side number formats of the MoE compute, written out bit by bit so that the reference
// (the test oracle) does not borrow the rounding of the code it checks. All conversions round to
// nearest, ties to even; fp8 is e4m3fn (max 448, no infinities, NaN = 0x7f / 0xff) with
// saturation of finite values, as __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace epkit::ref {

inline float bits_to_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t float_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

inline float bf16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }
inline uint16_t float_to_bf16(float f) {
  const uint32_t u = float_to_bits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN, sign kept
  const uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16);
}

inline constexpr float kE4M3Max = 448.0f;

inline float e4m3_to_float(uint8_t q) {
  const int sign = q >> 7, exp = (q >> 3) & 0xf, man = q & 7;
  if (exp == 0xf && man == 7) return std::nanf("");
  const float mag = exp == 0 ? std::ldexp(static_cast<float>(man), -9)               // subnormal: man/8 * 2^-6
                             : std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
  return sign ? -mag : mag;
}

inline uint8_t float_to_e4m3(float x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(static_cast<double>(x));
  if (std::isinf(a)) return static_cast<uint8_t>(sign | 0x7e);  // satfinite: infinities saturate too
  if (a < std::ldexp(1.0, -6)) {  // subnormal range: steps of 2^-9; q == 8 is the smallest normal
    const double q = std::nearbyint(std::ldexp(a, 9));
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(q));
  }
  int e = 0;
  const double fr = std::frexp(a, &e);  // a = fr * 2^e, fr in [0.5, 1)
  int ex = e - 1;                        // a = (2 fr) * 2^ex, 2 fr in [1, 2)
  double q = std::nearbyint((2.0 * fr - 1.0) * 8.0);
  if (q == 8.0) q = 0.0, ++ex;
  if (ex > 8 || (ex == 8 && q > 6.0)) return static_cast<uint8_t>(sign | 0x7e);  // saturate to 448
  return static_cast<uint8_t>(sign | static_cast<uint8_t>((ex + 7) << 3) | static_cast<uint8_t>(q));
}

}  // namespace epkit::ref
