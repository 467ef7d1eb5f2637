// CPU tests of the fused SiLU-mul + FP8 quantization: argument validation (both layouts), and the
// host reference on hand-computed rows.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "epkit/moe/activation.hpp"
#include "reference/moe/reference.hpp"
#include "expect_error.hpp"
#include "host_testing.hpp"
#include "reference/moe/numerics.hpp"

namespace epkit::moe {
namespace {

using host_test::bf16;
using host_test::fake;

SiluMulQuantArgs masked(int L, int cap, int I) {
  SiluMulQuantArgs a;
  a.layout = ExpertLayout::kMasked;
  a.in = Tensor(fake(0x10000), DType::kBF16, {L, cap, 2 * I});
  a.out = Tensor(fake(0x20000), DType::kFP8E4M3, {L, cap, I});
  a.scale = Tensor(fake(0x30000), DType::kFP32, {L, cap, I / 128});
  a.expert_num_tokens = Tensor(fake(0x40000), DType::kInt32, {L});
  return a;
}

SiluMulQuantArgs packed(int L, int R, int I) {
  SiluMulQuantArgs a;
  a.layout = ExpertLayout::kPacked;
  a.in = Tensor(fake(0x10000), DType::kBF16, {R, 2 * I});
  a.out = Tensor(fake(0x20000), DType::kFP8E4M3, {R, I});
  a.scale = Tensor(fake(0x30000), DType::kFP32, {R, I / 128});
  a.expert_num_tokens = Tensor(fake(0x40000), DType::kInt32, {L});
  a.expert_offsets = Tensor(fake(0x50000), DType::kInt32, {L + 1});
  return a;
}

TEST(SiluMulQuantValidate, Masked) {
  EXPECT_NO_THROW(check_silu_mul_quant_args(masked(32, 256, 2048)));
  EXPECT_NO_THROW(check_silu_mul_quant_args(masked(4, 0, 128)));  // no capacity at all
  SiluMulQuantArgs a = masked(4, 8, 128);
  a.in.shape[2] = 2 * 192;
  EXPECT_EPKIT_ERROR(check_silu_mul_quant_args(a), "2I = 384", "multiple of 256");
  a = masked(4, 8, 128), a.in.ndim = 2;
  EXPECT_EPKIT_ERROR(check_silu_mul_quant_args(a), "expected [L, cap, 2I] (masked)");
  a = masked(4, 8, 128), a.out.shape[2] = 256;
  EXPECT_EPKIT_ERROR(check_silu_mul_quant_args(a), "out has shape [4, 8, 256]", "expected 128");
  a = masked(4, 8, 128), a.out.shape[1] = 9;
  EXPECT_EPKIT_ERROR(check_silu_mul_quant_args(a), "out has shape [4, 9, 128]", "expected 8");
  a = masked(4, 8, 256), a.scale.shape[2] = 1;
  EXPECT_EPKIT_ERROR(check_silu_mul_quant_args(a), "scale has shape [4, 8, 1]", "expected 2");
  a = masked(4, 8, 128), a.in.dtype = DType::kFP16;
  EXPECT_EPKIT_ERROR(check_silu_mul_quant_args(a), "in has dtype fp16", "bf16");
  a = masked(4, 8, 128), a.out.dtype = DType::kBF16;
  EXPECT_EPKIT_ERROR(check_silu_mul_quant_args(a), "out has dtype bf16", "fp8_e4m3");
  a = masked(4, 8, 128), a.expert_num_tokens.dtype = DType::kInt64;
  EXPECT_EPKIT_ERROR(check_silu_mul_quant_args(a), "expert_num_tokens has dtype int64", "int32");
  a = masked(4, 8, 128), a.expert_num_tokens.shape[0] = 3;
  EXPECT_EPKIT_ERROR(check_silu_mul_quant_args(a), "expert_num_tokens has shape [3]", "expected 4");
  a = masked(4, 8, 128), a.expert_num_tokens.data = nullptr;
  EXPECT_EPKIT_ERROR(check_silu_mul_quant_args(a), "expert_num_tokens is missing");
  a = masked(4, 8, 128), a.in.data = fake(0x10004);
  EXPECT_EPKIT_ERROR(check_silu_mul_quant_args(a), "in data pointer is not 16-byte aligned");
  a = masked(4, 8, 128), a.out.data = fake(0x20008);
  EXPECT_EPKIT_ERROR(check_silu_mul_quant_args(a), "out data pointer is not 16-byte aligned");
  a = masked(4, 8, 128), a.expert_offsets = Tensor(fake(0x50000), DType::kInt32, {5});
  EXPECT_EPKIT_ERROR(check_silu_mul_quant_args(a), "expert_offsets given", "masked layout has no offsets");
  a = masked(1025, 1, 128);
  EXPECT_EPKIT_ERROR(check_silu_mul_quant_args(a), "L = 1025", "1024");
  a = masked(0, 1, 128);
  EXPECT_EPKIT_ERROR(check_silu_mul_quant_args(a), "L = 0");
  a = masked(4, 8, 128), a.layout = static_cast<ExpertLayout>(5);
  EXPECT_EPKIT_ERROR(check_silu_mul_quant_args(a), "layout = 5");
}

TEST(SiluMulQuantValidate, Packed) {
  EXPECT_NO_THROW(check_silu_mul_quant_args(packed(32, 4096, 2048)));
  SiluMulQuantArgs a = packed(4, 64, 128);
  a.expert_offsets = Tensor();
  EXPECT_EPKIT_ERROR(check_silu_mul_quant_args(a), "expert_offsets [L + 1] is required");
  a = packed(4, 64, 128), a.expert_offsets.shape[0] = 4;
  EXPECT_EPKIT_ERROR(check_silu_mul_quant_args(a), "expert_offsets has shape [4]", "expected 5");
  a = packed(4, 64, 128), a.expert_offsets.dtype = DType::kInt64;
  EXPECT_EPKIT_ERROR(check_silu_mul_quant_args(a), "expert_offsets has dtype int64", "int32");
  a = packed(4, 64, 128), a.out.shape[0] = 63;
  EXPECT_EPKIT_ERROR(check_silu_mul_quant_args(a), "out has shape [63, 128]", "expected 64");
  a = packed(4, 64, 128), a.in.ndim = 3;
  EXPECT_EPKIT_ERROR(check_silu_mul_quant_args(a), "expected [R, 2I] (packed)");
  a = packed(4, 64, 128), a.expert_num_tokens.ndim = 2;
  EXPECT_EPKIT_ERROR(check_silu_mul_quant_args(a), "expert_num_tokens has shape", "expected [L]");
  a = packed(1025, 64, 128);
  EXPECT_EPKIT_ERROR(check_silu_mul_quant_args(a), "L = 1025", "1024");
}

TEST(SiluMulQuantReference, HandComputedRow) {
  const int I = 256;
  std::vector<float> in(2 * I, 0.0f);
  // Block 0: h = silu(64) * 7 = 448 (e^-64 vanishes next to 1) sets the scale to 1;
  // silu(0) * 5 = 0; silu(-100) * 3 = -0 (e^100 overflows to inf).
  in[0] = 64.0f, in[I + 0] = 7.0f;
  in[1] = 0.0f, in[I + 1] = 5.0f;
  in[2] = -100.0f, in[I + 2] = 3.0f;
  in[3] = 1.0f, in[I + 3] = 1.0f;  // silu(1) = 0.7310586
  // Block 1: only the up half is non-zero, so h = silu(0) * u = 0 everywhere: the eps scale.
  for (int j = 128; j < 256; ++j) in[I + j] = 2.0f;
  const std::vector<uint16_t> h = bf16(in);
  std::vector<uint8_t> q(I);
  float s[2];
  ref::silu_mul_quantize_row(I, h.data(), false, q.data(), s);
  EXPECT_EQ(s[0], 1.0f);
  EXPECT_EQ(q[0], 0x7e);
  EXPECT_EQ(q[1], 0x00);
  EXPECT_EQ(q[2], 0x80);
  EXPECT_EQ(ref::e4m3_to_float(q[3]), 0.75f);  // 0.731 between 0.6875 and 0.75, nearer 0.75
  EXPECT_EQ(s[1], 1e-10f / 448.0f);
  for (int j = 128; j < 256; ++j) EXPECT_EQ(q[j], 0x00) << j;
  // The gate is the first half: swapping the halves changes the result.
  std::vector<uint16_t> swapped(2 * I);
  for (int j = 0; j < I; ++j) swapped[j] = h[I + j], swapped[I + j] = h[j];
  ref::silu_mul_quantize_row(I, swapped.data(), false, q.data(), s);
  EXPECT_NE(s[0], 1.0f);  // silu(7) * 64 = 447.4
}

TEST(SiluMulQuantReference, Ue8m0) {
  const int I = 128;
  std::vector<float> in(2 * I, 0.0f);
  in[0] = 64.0f, in[I] = 9.0f;  // h = 576: 576 / 448 = 1.29 -> 2
  const std::vector<uint16_t> h = bf16(in);
  std::vector<uint8_t> q(I);
  float s;
  ref::silu_mul_quantize_row(I, h.data(), true, q.data(), &s);
  EXPECT_EQ(s, 2.0f);
  EXPECT_EQ(ref::e4m3_to_float(q[0]), 288.0f);
}

}  // namespace
}  // namespace epkit::moe
