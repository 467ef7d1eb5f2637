// Config validation: every bad field gets an epkit::Error naming the field, its value and the limit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>

#include "epkit/config.hpp"
#include "epkit/error.hpp"
#include "epkit/shapes.hpp"

namespace epkit {
namespace {

AllToAllConfig good() {
  AllToAllConfig c;
  c.world_size = 8;
  c.rank = 3;
  c.dp_size = 2;
  c.num_experts = 256;
  c.topk = 8;
  c.hidden = 7168;
  c.max_tokens_per_rank = 128;
  c.dispatch_dtype = DType::kFP8E4M3;
  return c;
}

void expect_error(const std::function<void(AllToAllConfig&)>& mutate, const std::string& needle) {
  AllToAllConfig c = good();
  mutate(c);
  try {
    validate(c);
    FAIL() << "expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Config, GoodConfigValidates) { EXPECT_NO_THROW(validate(good())); }

TEST(Config, RejectsEachBadField) {
  expect_error([](auto& c) { c.world_size = 0; }, "world_size = 0");
  expect_error([](auto& c) { c.rank = 8; }, "rank = 8 must be in [0, world_size = 8)");
  expect_error([](auto& c) { c.rank = -1; }, "rank = -1");
  expect_error([](auto& c) { c.dp_size = 3; }, "dp_size = 3 must be >= 1 and divide world_size = 8");
  expect_error([](auto& c) { c.num_experts = 100; }, "num_experts = 100 must be a multiple of world_size = 8");
  expect_error([](auto& c) { c.topk = 17; }, "topk = 17 must be in [1, 16]");
  expect_error([](auto& c) { c.topk = 0; }, "topk = 0");
  expect_error([](auto& c) { c.hidden = 7170; }, "hidden = 7170 must be a multiple of 16");
  expect_error([](auto& c) { c.max_tokens_per_rank = 0; }, "max_tokens_per_rank = 0");
  expect_error([](auto& c) { c.dispatch_dtype = DType::kFP32; }, "dispatch_dtype = fp32");
  expect_error([](auto& c) { c.combine_in_dtype = DType::kFP8E4M3; }, "combine_in_dtype = fp8_e4m3");
  expect_error([](auto& c) { c.combine_out_dtype = DType::kFP32; }, "combine_out_dtype = fp32 must be bf16 or fp16");
  expect_error([](auto& c) { c.capacity = 513; }, "capacity = 513 must be in [0, M * (W / D) = 512]");
  expect_error([](auto& c) { c.num_sms = -2; }, "num_sms = -2");
  expect_error([](auto& c) { c.timeout_ms = 0; }, "timeout_ms = 0");
  expect_error([](auto& c) { c.layout = static_cast<ExpertLayout>(2); }, "layout = 2 must be kMasked (0) or kPacked (1)");
  expect_error([](auto& c) { c.packed_rows = 64; }, "apply to layout = packed only");
  expect_error([](auto& c) { c.packed_row_align = 128; }, "apply to layout = packed only");
}

TEST(Config, PackedLayoutFields) {
  auto packed = [] {
    AllToAllConfig c = good();
    c.layout = ExpertLayout::kPacked;
    return c;
  };
  EXPECT_NO_THROW(validate(packed()));
  expect_error([&](auto& c) { c = packed(), c.capacity = 64; }, "capacity = 64 applies to layout = masked only");
  expect_error([&](auto& c) { c = packed(), c.packed_row_align = 0; }, "packed_row_align = 0 must be in [1, 1024]");
  expect_error([&](auto& c) { c = packed(), c.packed_row_align = 2048; }, "packed_row_align = 2048");
  expect_error([&](auto& c) { c = packed(), c.packed_rows = -1; }, "packed_rows = -1 must be in [0, packed_row_bound = ");
  // M * (W / D) * min(K, L) = 128 * 4 * 8 = 4096 rows at alignment 1.
  expect_error([&](auto& c) { c = packed(), c.packed_rows = 4097; }, "packed_rows = 4097 must be in [0, packed_row_bound = 4096]");
  expect_error([&](auto& c) { c = packed(), c.packed_row_align = 128, c.packed_rows = 200; },
               "packed_rows = 200 must be a multiple of packed_row_align = 128");
  AllToAllConfig c = packed();
  c.packed_rows = 1000;
  EXPECT_NO_THROW(validate(c));
  c.packed_row_align = 8;
  EXPECT_NO_THROW(validate(c));
  EXPECT_NE(to_string(c).find("layout=packed, capacity=0, packed_rows=1000, packed_row_align=8"), std::string::npos)
      << to_string(c);
  EXPECT_NE(to_string(good()).find("layout=masked"), std::string::npos);
}

// DeepGEMM's MN-major scales: masked fp8 only; rank-local (the layout of one rank's own output).
TEST(Config, MnMajorScalesOnlyWithMaskedFp8) {
  AllToAllConfig c = good();
  c.expert_scales_mn_major = true;
  EXPECT_NO_THROW(validate(c));
  EXPECT_NE(to_string(c).find("expert_scales_mn_major=1"), std::string::npos) << to_string(c);
  const ExpertShapes s = ExpertShapes::make(c);
  EXPECT_EQ(s.expert_x_scale[0], num_local_experts(c));
  EXPECT_EQ(s.expert_x_scale[1], scales_per_token(c));
  EXPECT_EQ(s.expert_x_scale[2], effective_capacity(c));
  AllToAllConfig r = c;
  r.expert_scales_mn_major = false;
  EXPECT_EQ(agreement_fields(c), agreement_fields(r));
  expect_error([](auto& x) { x.dispatch_dtype = DType::kBF16, x.expert_scales_mn_major = true; },
               "expert_scales_mn_major = true needs layout = masked and dispatch_dtype = fp8_e4m3 (got layout = masked, "
               "dispatch_dtype = bf16)");
  expect_error([](auto& x) { x.dispatch_dtype = DType::kFP8E4M3, x.layout = ExpertLayout::kPacked, x.expert_scales_mn_major = true; },
               "(got layout = packed, dispatch_dtype = fp8_e4m3)");
}

TEST(Config, DerivedQuantities) {
  const AllToAllConfig c = good();
  EXPECT_EQ(num_local_experts(c), 32);
  EXPECT_EQ(num_dp_groups(c), 4);
  EXPECT_EQ(scales_per_token(c), 56);
  EXPECT_EQ(effective_capacity(c), 128 * 4);
  EXPECT_EQ(max_tokens_per_sender(c), 64);
  AllToAllConfig odd = c;
  odd.max_tokens_per_rank = 7;
  odd.hidden = 2064;  // not a multiple of 128: the last scale block is partial
  EXPECT_EQ(max_tokens_per_sender(odd), 4);
  EXPECT_EQ(scales_per_token(odd), 17);
  odd.dispatch_dtype = DType::kBF16;
  EXPECT_EQ(scales_per_token(odd), 0);
  odd.capacity = 9;
  EXPECT_EQ(effective_capacity(odd), 9);
}

TEST(Config, TimeoutFromEnv) {
  AllToAllConfig c = good();
  unsetenv("EPKIT_TIMEOUT_MS");
  EXPECT_EQ(resolved_timeout_ms(c), 10000);
  setenv("EPKIT_TIMEOUT_MS", "2500", 1);
  EXPECT_EQ(resolved_timeout_ms(c), 2500);
  c.timeout_ms = 70;
  EXPECT_EQ(resolved_timeout_ms(c), 70);  // the field wins over the env
  c.timeout_ms = -1;
  setenv("EPKIT_TIMEOUT_MS", "soon", 1);
  EXPECT_THROW(resolved_timeout_ms(c), Error);
  unsetenv("EPKIT_TIMEOUT_MS");
}

TEST(Config, AgreementFieldsLeaveOutRankLocalChoices) {
  AllToAllConfig a = good(), b = good();
  b.rank = 5;
  b.num_sms = 20;
  b.timeout_ms = 99;
  EXPECT_EQ(agreement_fields(a), agreement_fields(b));
  b.hidden = 2048;
  EXPECT_NE(agreement_fields(a), agreement_fields(b));
  // The layout and its row fields are agreed on, like capacity.
  for (auto set : {+[](AllToAllConfig& c) { c.layout = ExpertLayout::kPacked; },
                   +[](AllToAllConfig& c) { c.packed_rows = 256; }, +[](AllToAllConfig& c) { c.packed_row_align = 8; }}) {
    AllToAllConfig d = good();
    set(d);
    EXPECT_NE(agreement_fields(a), agreement_fields(d));
  }
}

TEST(Types, DtypeNamesRoundTrip) {
  for (DType t : {DType::kBF16, DType::kFP16, DType::kFP32, DType::kFP8E4M3, DType::kInt32, DType::kInt64,
                  DType::kUInt32, DType::kUInt8})
    EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  EXPECT_EQ(dtype_size(DType::kFP8E4M3), 1u);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kInt64), 8u);
  EXPECT_THROW(parse_dtype("fp4"), Error);
}

}  // namespace
}  // namespace epkit
