// The fp32 arithmetic that the MoE kernels and their host references share, written so that both
// produce the same bits: every operation is one correctly rounded IEEE operation (add, sub, mul,
// div, fma), spelled as a CUDA _rn intrinsic on the device (never contracted, never approximated)
// and as the plain operator / std::fma on the host (the reference TUs are built with
// -ffp-contract=off, so the host compiler does not fuse them either). No fast-math intrinsic
// (__expf, rcp.approx, ex2.approx) appears here: their results are not specified bit by bit.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define EPKIT_HD __host__ __device__ __forceinline__
#else
#define EPKIT_HD inline
#endif

namespace epkit::moe::math {

EPKIT_HD float fadd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
EPKIT_HD float fsub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
EPKIT_HD float fmul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
EPKIT_HD float fdiv(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
EPKIT_HD float ffma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
EPKIT_HD uint32_t bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
EPKIT_HD float from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

EPKIT_HD float bf16_bits_to_float(uint32_t h) { return from_bits(h << 16); }

EPKIT_HD float fclamp(float x, float lo, float hi) {  // a NaN x gives lo
#if defined(__CUDA_ARCH__)
  return fminf(fmaxf(x, lo), hi);
#else
  return std::fmin(std::fmax(x, lo), hi);
#endif
}

// e^x to within about one ulp (the polynomial alone is within 0.65 ulp of 2^-23 relative).
// x = n ln2 + r with |r| <= ln2/2 (Cody-Waite, ln2 in two parts), e^r by a degree-6 polynomial
// interpolating e^r at the Chebyshev nodes of [-0.3467, 0.3467] (coefficients rounded to fp32), and
// 2^n put into the exponent field. Results below e^-87 (1.6e-38, the edge of the normal range)
// are flushed to 0; x > 88.72 gives +inf; NaN stays NaN. Branch-free: the edges are selected after
// computing on the clamped argument, so that the kernels interleave the elements of a thread.
EPKIT_HD float exp(float x) {
  const float xc = fclamp(x, -87.0f, 88.72f);
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: x log2(e) + kMagic rounds to an integer (RNE)
  const float t = ffma(xc, 1.44269502f, kMagic);
  const float j = fsub(t, kMagic);
  const uint32_t n = bits(t) - bits(kMagic);  // j as a two's complement integer
  float r = ffma(j, -0.693145751953125f, xc);  // ln2, high 15 bits
  r = ffma(j, -1.42860677e-06f, r);            // ln2, the rest
  float p = 1.394113875e-03f;
  p = ffma(p, r, 8.375150152e-03f);
  p = ffma(p, r, 4.166635126e-02f);
  p = ffma(p, r, 1.666641533e-01f);
  p = ffma(p, r, 0.5f);
  p = ffma(p, r, 1.0f);
  p = ffma(p, r, 1.0f);
  // p in [0.70, 1.42] and n in [-126, 128] with p < 1 when n = 128 and p > 1 when n = -126: the
  // exponent field stays in [1, 254], so adding n to it is exact.
  float y = from_bits(bits(p) + (n << 23));
  y = x > 88.72f ? from_bits(0x7f800000u) : y;
  y = x < -87.0f ? 0.0f : y;
  return x != x ? x : y;
}

// 1 / (1 + e^-x).
EPKIT_HD float sigmoid(float x) { return fdiv(1.0f, fadd(1.0f, exp(-x))); }

// silu(g) * u = g / (1 + e^-g) * u.
EPKIT_HD float silu_mul(float g, float u) { return fmul(fdiv(g, fadd(1.0f, exp(-g))), u); }

// A total order of fp32 values as unsigned integers, for top-k selection: larger key = larger
// value; -0 ranks as +0; NaN ranks below every number (key 1); key 0 is left for "not a candidate".
EPKIT_HD uint32_t order_key(float v) {
  if (v != v) return 1u;
  const uint32_t u = bits(v == 0.0f ? 0.0f : v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
// The value a key was made from (canonical: +0 for a zero, a quiet NaN for key 1).
EPKIT_HD float key_value(uint32_t k) {
  if (k <= 1u) return from_bits(0x7fc00000u);
  return from_bits((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// FP8 e4m3 block quantization: the largest finite e4m3 value, and the floor on a block's amax so
// that an all-zero block gets a finite scale. 1e-10 is the eps of SGLang's and vLLM's
// per_token_group_quant_fp8 (DeepSeek-V3 1x128 activation quant).
inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kQuantEps = 1e-10f;

// The smallest power of two >= s, by bit manipulation (s positive and normal; inf/NaN kept).
EPKIT_HD float ceil_pow2(float s) {
  uint32_t u = bits(s);
  if ((u & 0x7f800000u) == 0x7f800000u) return s;
  if (u & 0x007fffffu) u = (u & 0xff800000u) + 0x00800000u;
  return from_bits(u);
}

// The dequantisation scale of a block: max(amax, eps) / 448, or its power-of-two ceiling (UE8M0).
// A NaN amax gives a NaN scale. Elements quantise as e4m3_satfinite_rn(x * (1 / scale)), with the
// reciprocal rounded once per block (as DeepGEMM-style kernels do).
EPKIT_HD float block_scale(float amax, bool ue8m0) {
  const float a = amax < kQuantEps ? kQuantEps : amax;
  const float s = fdiv(a, kE4M3Max);
  return ue8m0 ? ceil_pow2(s) : s;
}
EPKIT_HD float block_inv_scale(float scale) { return fdiv(1.0f, scale); }

}  // namespace epkit::moe::math
