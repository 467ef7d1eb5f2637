// The host number formats of the MoE reference (src/reference/numerics.hpp) against the CUDA
// headers' own host conversions, on every fp8 code, every rounding midpoint and random floats.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "reference/moe/numerics.hpp"

namespace epkit::ref {
namespace {

uint8_t cuda_e4m3(float x) { return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)); }

TEST(Numerics, EveryE4M3CodeDecodesAndRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const uint8_t q = static_cast<uint8_t>(c);
    const float f = e4m3_to_float(q);
    __nv_fp8_e4m3 h;
    h.__x = q;
    const float want = static_cast<float>(h);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f)) << "code " << c;
      continue;
    }
    EXPECT_EQ(float_to_bits(f), float_to_bits(want)) << "code " << c;
    EXPECT_EQ(float_to_e4m3(f), q) << "code " << c;
  }
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
}

TEST(Numerics, MidpointsRoundToEvenAndLargeValuesSaturate) {
  // Between every pair of neighbouring positive codes, the midpoint and its float neighbours.
  for (int c = 0; c < 0x7e; ++c) {
    const float lo = e4m3_to_float(static_cast<uint8_t>(c)), hi = e4m3_to_float(static_cast<uint8_t>(c + 1));
    const float mid = 0.5f * (lo + hi);
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), -mid}) {
      EXPECT_EQ(float_to_e4m3(x), cuda_e4m3(x)) << "x = " << x << " between codes " << c << " and " << c + 1;
    }
  }
  for (float x : {448.0f, 449.0f, 464.0f, 465.0f, 1e30f, -1e30f, INFINITY, -INFINITY})
    EXPECT_EQ(float_to_e4m3(x), cuda_e4m3(x)) << "x = " << x;
  EXPECT_EQ(float_to_e4m3(NAN) & 0x7f, 0x7f);
}

TEST(Numerics, RandomFloatsMatchCudaConversions) {
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_int_distribution<uint32_t> bits;
  std::uniform_real_distribution<float> mag(-12.0f, 10.0f);
  for (int i = 0; i < 2000000; ++i) {
    // Half of them uniform over the fp8 range's exponents, half arbitrary bit patterns.
    const float x = i % 2 ? std::ldexp(bits(rng) % 2 ? 1.0f : -1.0f, 0) * std::exp2(mag(rng))
                          : bits_to_float(bits(rng));
    if (std::isnan(x)) continue;
    ASSERT_EQ(float_to_e4m3(x), cuda_e4m3(x)) << "x = " << x << " (bits " << std::hex << float_to_bits(x) << ")";
    const __nv_bfloat16 b = __float2bfloat16_rn(x);
    uint16_t bb;
    std::memcpy(&bb, &b, 2);
    ASSERT_EQ(float_to_bf16(x), bb) << "x = " << x;
    ASSERT_EQ(float_to_bits(bf16_to_float(bb)), float_to_bits(__bfloat162float(b)));
  }
}

}  // namespace
}  // namespace epkit::ref
