// CPU tests of the FP8 block quantizers: argument validation, and the host reference on small
// hand-computed blocks and tiles (scales, codes, partial blocks, zero blocks, UE8M0).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "epkit/moe/quant.hpp"
#include "reference/moe/reference.hpp"
#include "expect_error.hpp"
#include "host_testing.hpp"
#include "reference/moe/numerics.hpp"

namespace epkit::moe {
namespace {

using host_test::bf16;
using host_test::fake;

ActQuantArgs act_args(int rows, int h, int m) {
  ActQuantArgs a;
  a.x = Tensor(fake(0x10000), DType::kBF16, {rows, h});
  a.out = Tensor(fake(0x20000), DType::kFP8E4M3, {rows, h});
  a.scale = Tensor(fake(0x30000), DType::kFP32, {rows, num_scale_blocks(h)});
  a.num_tokens = m;
  return a;
}

TEST(QuantValidate, Activations) {
  EXPECT_NO_THROW(check_act_quant_args(act_args(128, 7168, 128)));
  EXPECT_NO_THROW(check_act_quant_args(act_args(4, 144, 3)));  // a partial last block
  EXPECT_NO_THROW(check_act_quant_args(act_args(4, 16, 0)));
  EXPECT_EQ(num_scale_blocks(144), 2);
  ActQuantArgs a = act_args(4, 136, 4);
  EXPECT_EPKIT_ERROR(check_act_quant_args(a), "H = 136", "multiple of 16");
  a = act_args(4, 128, 4), a.x.dtype = DType::kFP32;
  EXPECT_EPKIT_ERROR(check_act_quant_args(a), "x has dtype fp32", "bf16");
  a = act_args(4, 128, 4), a.out.dtype = DType::kUInt8;
  EXPECT_EPKIT_ERROR(check_act_quant_args(a), "out has dtype uint8", "fp8_e4m3");
  a = act_args(4, 128, 4), a.out.shape[1] = 64;
  EXPECT_EPKIT_ERROR(check_act_quant_args(a), "out has shape [4, 64]", "expected 128");
  a = act_args(4, 144, 4), a.scale.shape[1] = 1;
  EXPECT_EPKIT_ERROR(check_act_quant_args(a), "scale has shape [4, 1]", "expected 2");
  a = act_args(4, 128, 4), a.scale.dtype = DType::kBF16;
  EXPECT_EPKIT_ERROR(check_act_quant_args(a), "scale has dtype bf16", "fp32");
  a = act_args(4, 128, 4), a.x.data = fake(0x10008);
  EXPECT_EPKIT_ERROR(check_act_quant_args(a), "x data pointer is not 16-byte aligned");
  a = act_args(4, 128, 4), a.out.data = fake(0x20004);
  EXPECT_EPKIT_ERROR(check_act_quant_args(a), "out data pointer is not 16-byte aligned");
  a = act_args(4, 128, 4), a.scale.data = nullptr;
  EXPECT_EPKIT_ERROR(check_act_quant_args(a), "scale is missing");
  a = act_args(4, 128, 4), a.x.ndim = 3;
  EXPECT_EPKIT_ERROR(check_act_quant_args(a), "expected [rows, H]");
  a = act_args(4, 128, 5);
  EXPECT_EPKIT_ERROR(check_act_quant_args(a), "num_tokens = 5", "rows = 4");
  a = act_args(8, 128, 5), a.scale.shape[0] = 4;
  EXPECT_EPKIT_ERROR(check_act_quant_args(a), "num_tokens = 5", "rows = 4");
  int32_t dev_m = 0;
  a = act_args(4, 128, -1), a.num_tokens_device = &dev_m;
  EXPECT_NO_THROW(check_act_quant_args(a));
  a.num_tokens = 2;
  EXPECT_EPKIT_ERROR(check_act_quant_args(a), "not both");
}

TEST(QuantValidate, Weights) {
  WeightQuantArgs a;
  a.w = Tensor(fake(0x10000), DType::kBF16, {4, 576, 7168});
  a.out = Tensor(fake(0x20000), DType::kFP8E4M3, {4, 576, 7168});
  a.scale_inv = Tensor(fake(0x30000), DType::kFP32, {4, 5, 56});
  EXPECT_NO_THROW(check_weight_quant_args(a));
  WeightQuantArgs b = a;
  b.scale_inv.shape[1] = 4;
  EXPECT_EPKIT_ERROR(check_weight_quant_args(b), "scale_inv has shape [4, 4, 56]", "expected 5");
  b = a, b.out.shape[0] = 3;
  EXPECT_EPKIT_ERROR(check_weight_quant_args(b), "out has shape [3, 576, 7168]", "expected 4");
  b = a, b.w.dtype = DType::kFP16;
  EXPECT_EPKIT_ERROR(check_weight_quant_args(b), "w has dtype fp16", "bf16");
  b = a, b.w.ndim = 1;
  EXPECT_EPKIT_ERROR(check_weight_quant_args(b), "expected [N, K] or [G, N, K]");
  b = a, b.out.dtype = DType::kBF16;
  EXPECT_EPKIT_ERROR(check_weight_quant_args(b), "out has dtype bf16", "fp8_e4m3");
  b = a, b.scale_inv.data = nullptr;
  EXPECT_EPKIT_ERROR(check_weight_quant_args(b), "scale_inv is missing");
  // 2-D, odd K (the scalar path), and a 3-D scale for a 2-D weight.
  WeightQuantArgs c;
  c.w = Tensor(fake(0x10002), DType::kBF16, {130, 131});
  c.out = Tensor(fake(0x20001), DType::kFP8E4M3, {130, 131});
  c.scale_inv = Tensor(fake(0x30000), DType::kFP32, {2, 2});
  EXPECT_NO_THROW(check_weight_quant_args(c));
  c.scale_inv = Tensor(fake(0x30000), DType::kFP32, {1, 2, 2});
  EXPECT_EPKIT_ERROR(check_weight_quant_args(c), "scale_inv has shape [1, 2, 2]", "expected 2 dims");
}

TEST(QuantReference, ScaleIsAmaxOver448AndCodesRoundToNearest) {
  std::vector<float> x(128, 0.0f);
  x[0] = 448.0f, x[1] = -448.0f, x[2] = 1.0f, x[3] = 0.5f, x[4] = -0.0f, x[5] = 17.0f, x[6] = 1e-3f;
  const std::vector<uint16_t> h = bf16(x);
  std::vector<uint8_t> q(128);
  float s = 0;
  ref::quantize_activations(1, 128, h.data(), false, q.data(), &s);
  EXPECT_EQ(s, 1.0f);
  EXPECT_EQ(q[0], 0x7e);
  EXPECT_EQ(q[1], 0xfe);
  EXPECT_EQ(q[2], 0x38);
  EXPECT_EQ(q[3], 0x30);
  EXPECT_EQ(q[4], 0x80);
  EXPECT_EQ(q[5], 0x58);  // 17 is halfway between 16 (0x58) and 18 (0x59): ties to even
  EXPECT_EQ(ref::e4m3_to_float(q[6]), std::ldexp(1.0f, -9));  // the smallest subnormal
  EXPECT_EQ(q[7], 0x00);
}

TEST(QuantReference, PartialBlocksZeroBlocksAndHugeValues) {
  // H = 144: blocks [0, 128) and [128, 144); row 1 is all zero.
  std::vector<float> x(2 * 144, 0.0f);
  x[5] = -3.0f;
  x[130] = 1e30f;
  x[143] = -2e30f;
  const std::vector<uint16_t> h = bf16(x);
  std::vector<uint8_t> q(2 * 144);
  std::vector<float> s(4);
  ref::quantize_activations(2, 144, h.data(), false, q.data(), s.data());
  EXPECT_EQ(s[0], 3.0f / 448.0f);
  EXPECT_EQ(q[5], 0xfe);  // -3 / (3/448) rounds to -448
  const float big = ref::bf16_to_float(h[143]);
  EXPECT_EQ(s[1], -big / 448.0f);
  EXPECT_EQ(q[143], 0xfe);
  EXPECT_EQ(s[2], 1e-10f / 448.0f);
  EXPECT_EQ(s[3], 1e-10f / 448.0f);
  for (int i = 144; i < 288; ++i) EXPECT_EQ(q[i], 0x00);
}

TEST(QuantReference, Ue8m0ScalesArePowersOfTwoAndCodesUseThem) {
  std::vector<float> x(128, 0.0f);
  x[0] = 1344.0f;  // amax / 448 = 3 -> 4
  x[1] = 336.0f;   // 84 exactly
  const std::vector<uint16_t> h = bf16(x);
  std::vector<uint8_t> q(128);
  float s = 0;
  ref::quantize_activations(1, 128, h.data(), true, q.data(), &s);
  EXPECT_EQ(s, 4.0f);
  EXPECT_EQ(ref::e4m3_to_float(q[0]), 320.0f);  // 336 is halfway between 320 and 352: even mantissa
  EXPECT_EQ(ref::e4m3_to_float(q[1]), 80.0f);   // 84 is halfway between 80 and 88: even mantissa
  EXPECT_EQ(ref::block_scale(448.0f, true), 1.0f);
  EXPECT_EQ(ref::quantize_value(-896.0f, 2.0f), 0xfe);
}

TEST(QuantReference, WeightTilesHavePerTileScalesIncludingPartialEdges) {
  // N = 130, K = 136: tiles [0,128)x[0,128), [0,128)x[128,136), [128,130)x[0,128), [128,130)x[128,136).
  const int N = 130, K = 136;
  std::vector<float> w(N * K, 0.0f);
  w[0 * K + 0] = 448.0f;         // tile (0, 0)
  w[5 * K + 130] = -44.8f;       // tile (0, 1)
  w[129 * K + 3] = 4.48f;        // tile (1, 0)
  w[128 * K + 135] = -0.25f;     // tile (1, 1)
  w[129 * K + 100] = 2.0f;       // tile (1, 0), smaller than its amax
  const std::vector<uint16_t> h = bf16(w);
  std::vector<uint8_t> q(N * K);
  std::vector<float> s(4);
  ref::quantize_weights(N, K, h.data(), false, q.data(), s.data());
  EXPECT_EQ(s[0], 1.0f);
  EXPECT_EQ(s[1], ref::bf16_to_float(ref::float_to_bf16(44.8f)) / 448.0f);
  EXPECT_EQ(s[2], ref::bf16_to_float(ref::float_to_bf16(4.48f)) / 448.0f);
  EXPECT_EQ(s[3], 0.25f / 448.0f);
  EXPECT_EQ(q[0], 0x7e);
  EXPECT_EQ(q[5 * K + 130], 0xfe);
  EXPECT_EQ(q[129 * K + 3], 0x7e);
  EXPECT_EQ(q[128 * K + 135], 0xfe);
  EXPECT_EQ(q[129 * K + 100], ref::float_to_e4m3(2.0f * (1.0f / s[2])));
  EXPECT_EQ(q[1], 0x00);
}

}  // namespace
}  // namespace epkit::moe
