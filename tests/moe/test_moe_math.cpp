// The shared fp32 arithmetic of the MoE kernels and references (src/moe/moe_math.hpp): accuracy
// of exp / sigmoid / silu against double precision, its edges, and the order keys of top-k.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "moe/moe_math.hpp"

namespace epkit::moe::math {
namespace {

double ulps(float got, double want) {
  const double ulp = std::ldexp(1.0, std::ilogb(static_cast<float>(want)) - 23);
  return std::fabs(got - want) / ulp;
}

TEST(MoeMath, ExpIsWithinTwoUlpOverTheNormalRange) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> lin(-87.0f, 88.72f), mag(-40.0f, std::log2(87.0f));
  double worst = 0;
  float worst_x = 0;
  for (int i = 0; i < 8000000; ++i) {
    // Half uniform over the range, half log-uniform magnitudes (dense near 0), both signs.
    const float x = i % 2 ? lin(rng) : (i % 4 ? 1.0f : -1.0f) * std::exp2(mag(rng));
    const double u = ulps(exp(x), std::exp(static_cast<double>(x)));
    if (u > worst) worst = u, worst_x = x;
  }
  EXPECT_LE(worst, 2.0) << "at x = " << worst_x;
  EXPECT_EQ(exp(0.0f), 1.0f);
}

TEST(MoeMath, ExpEdges) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isfinite(exp(88.72f)));
  EXPECT_EQ(exp(88.73f), inf);
  EXPECT_EQ(exp(inf), inf);
  EXPECT_EQ(exp(-87.01f), 0.0f);  // below e^-87: flushed
  EXPECT_EQ(exp(-inf), 0.0f);
  EXPECT_GT(exp(-87.0f), 1.6e-38f);
  EXPECT_TRUE(std::isnan(exp(std::nanf(""))));
}

TEST(MoeMath, SigmoidAndSiluMatchDoublePrecision) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> d(-30.0f, 30.0f);
  for (int i = 0; i < 200000; ++i) {
    const float x = d(rng), u = d(rng);
    const double s = 1.0 / (1.0 + std::exp(-static_cast<double>(x)));
    // exp within 2 ulp, then one rounded add, one rounded divide: 4 ulp covers it.
    ASSERT_LE(ulps(sigmoid(x), s), 4.0) << "x = " << x;
    const double h = x * s * u;
    if (std::fabs(h) > 1e-30) ASSERT_LE(ulps(silu_mul(x, u), h), 5.0) << "g = " << x << " u = " << u;
  }
  EXPECT_EQ(sigmoid(0.0f), 0.5f);
  EXPECT_EQ(sigmoid(100.0f), 1.0f);
  EXPECT_EQ(sigmoid(-100.0f), 0.0f);
  EXPECT_EQ(silu_mul(64.0f, 7.0f), 448.0f);  // e^-64 vanishes next to 1
}

TEST(MoeMath, OrderKeysOrderValuesWithNanLowestAndSignedZerosEqual) {
  const float inf = std::numeric_limits<float>::infinity();
  const float v[] = {-inf, -std::numeric_limits<float>::max(), -1.0f, -1e-40f, 0.0f, 1e-40f, 1.0f, 2.0f, inf};
  for (size_t i = 0; i + 1 < sizeof(v) / sizeof(v[0]); ++i) EXPECT_LT(order_key(v[i]), order_key(v[i + 1])) << v[i];
  EXPECT_EQ(order_key(-0.0f), order_key(0.0f));
  EXPECT_EQ(order_key(std::nanf("")), 1u);
  EXPECT_EQ(order_key(-std::nanf("")), 1u);
  EXPECT_GT(order_key(-inf), 1u);
  for (float x : {-inf, -3.5f, 0.0f, 1e-30f, 7.0f, inf}) EXPECT_EQ(key_value(order_key(x)), x);
}

TEST(MoeMath, BlockScaleAndPowerOfTwoCeiling) {
  EXPECT_EQ(block_scale(448.0f, false), 1.0f);
  EXPECT_EQ(block_scale(0.0f, false), 1e-10f / 448.0f);
  EXPECT_EQ(block_scale(896.0f, true), 2.0f);    // already a power of two
  EXPECT_EQ(block_scale(897.0f, true), 4.0f);    // 897/448 rounds up to 4
  EXPECT_EQ(block_scale(1.0f, true), std::ldexp(1.0f, -8));  // 1/448 in (2^-9, 2^-8]
  EXPECT_TRUE(std::isnan(block_scale(std::nanf(""), false)));
  EXPECT_TRUE(std::isnan(block_scale(std::nanf(""), true)));
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> e(-40.0f, 40.0f);
  for (int i = 0; i < 100000; ++i) {
    const float s = std::exp2(e(rng));
    const float c = ceil_pow2(s);
    int ex = 0;
    ASSERT_EQ(std::frexp(c, &ex), 0.5f) << s;  // a power of two
    ASSERT_GE(c, s);
    ASSERT_LT(c * 0.5f, s);
  }
}

}  // namespace
}  // namespace epkit::moe::math
