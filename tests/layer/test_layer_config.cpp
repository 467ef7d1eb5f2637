// CPU tests of MoELayerConfig: validation names the field and its limit, the derived configs, and
// the weights check (shapes and dtypes of the checkpoint layout).
#include <gtest/gtest.h>

#include <string>

#include "epkit/error.hpp"
#include "epkit/moe_layer.hpp"

namespace epkit {
namespace {

MoELayerConfig deepseek(int W, MoESchedule s = MoESchedule::kNone) {
  MoELayerConfig c;
  c.hidden = 7168, c.intermediate = 2048, c.num_experts = 256, c.topk = 8;
  c.num_groups = 8, c.topk_groups = 4, c.routed_scaling = 2.5f;
  c.num_shared_experts = 1, c.shared_intermediate = 2048;
  c.world_size = W, c.rank = W - 1, c.max_tokens_per_rank = 128, c.schedule = s;
  return c;
}

std::string error_of(const MoELayerConfig& c) {
  try {
    validate(c);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(MoELayerConfig, DeepSeekV3IsValidAtEveryWorldSize) {
  for (int W : {1, 2, 4, 8, 16, 32, 64, 128, 256})
    for (MoESchedule s : {MoESchedule::kNone, MoESchedule::kDispatchOverlap, MoESchedule::kMicrobatch})
      EXPECT_EQ(error_of(deepseek(W, s)), "") << "W = " << W << ", " << schedule_name(s);
}

TEST(MoELayerConfig, BadFieldsNameTheValueAndTheLimit) {
  struct Case {
    const char* want;
    void (*edit)(MoELayerConfig&);
  };
  const Case cases[] = {
      {"hidden = 7000", [](MoELayerConfig& c) { c.hidden = 7000; }},
      {"intermediate = 100", [](MoELayerConfig& c) { c.intermediate = 100; }},
      {"num_shared_experts = 2", [](MoELayerConfig& c) { c.num_shared_experts = 2; }},
      {"shared_intermediate = 1000", [](MoELayerConfig& c) { c.shared_intermediate = 1000; }},
      {"max_tokens_per_rank = 0", [](MoELayerConfig& c) { c.max_tokens_per_rank = 0; }},
      {"expected_tokens = 500", [](MoELayerConfig& c) { c.expected_tokens = 500; }},
      {"17", [](MoELayerConfig& c) { c.topk = 17; }},
      {"num_groups", [](MoELayerConfig& c) { c.num_groups = 7; }},
      {"world_size", [](MoELayerConfig& c) { c.world_size = 3, c.rank = 0; }},
  };
  for (const Case& k : cases) {
    MoELayerConfig c = deepseek(2);
    k.edit(c);
    const std::string e = error_of(c);
    EXPECT_NE(e.find(k.want), std::string::npos) << "wanted '" << k.want << "' in: " << e;
  }
  MoELayerConfig m = deepseek(1, MoESchedule::kMicrobatch);
  m.max_tokens_per_rank = 1;
  EXPECT_NE(error_of(m).find("must be >= 2 with schedule microbatch"), std::string::npos) << error_of(m);
}

TEST(MoELayerConfig, DerivedConfigs) {
  const MoELayerConfig c = deepseek(8, MoESchedule::kMicrobatch);
  EXPECT_EQ(num_local_experts(c), 32);
  EXPECT_EQ(microbatch_split(c), 64);
  EXPECT_EQ(microbatch_split(deepseek(8)), 128);
  MoELayerConfig odd = c;
  odd.max_tokens_per_rank = 7;
  EXPECT_EQ(microbatch_split(odd), 4);  // half 0 takes ceil(M / 2)
  const AllToAllConfig a = all_to_all_config(c, microbatch_split(c));
  EXPECT_EQ(a.max_tokens_per_rank, 64);
  EXPECT_EQ(a.num_experts, 256);
  EXPECT_EQ(a.topk, 8);
  EXPECT_EQ(a.dispatch_dtype, DType::kFP8E4M3);
  EXPECT_EQ(a.combine_in_dtype, DType::kBF16);
  EXPECT_TRUE(a.weights_at_dispatch);  // the router's weights exist before dispatch
  EXPECT_EQ(a.world_size, 8);
  EXPECT_EQ(a.rank, 7);
  const moe::RouterConfig r = router_config(c);
  EXPECT_EQ(r.num_groups, 8);
  EXPECT_EQ(r.topk_groups, 4);
  EXPECT_FLOAT_EQ(r.routed_scaling, 2.5f);
  EXPECT_EQ(shared_intermediate(c), 2048);
  MoELayerConfig z = c;
  z.shared_intermediate = 0;
  EXPECT_EQ(shared_intermediate(z), 2048);  // 0 means intermediate
  EXPECT_EQ(parse_schedule("microbatch"), MoESchedule::kMicrobatch);
  EXPECT_THROW(parse_schedule("pipelined"), Error);
}

// The layer's rule for the fused gate + router: DeepSeek-V3's router at every world size (the gate
// covers all E experts), not below 128 experts, not for the softmax router, not for an empty half.
TEST(MoELayerConfig, GateRouterFitsTheWarpRoutersShapes) {
  for (int W : {1, 8}) EXPECT_TRUE(gate_router_fits(deepseek(W), 128)) << "W = " << W;
  EXPECT_TRUE(gate_router_fits(deepseek(1), 1));
  EXPECT_FALSE(gate_router_fits(deepseek(1), 0));
  MoELayerConfig c = deepseek(1);
  c.num_experts = 32, c.num_groups = 4, c.topk_groups = 2;
  EXPECT_FALSE(gate_router_fits(c, 32));
  c = deepseek(1);
  c.router_mode = moe::RouterMode::kSoftmaxTopK, c.num_groups = 1, c.topk_groups = 1;
  EXPECT_FALSE(gate_router_fits(c, 32));
}

// The GEMM tile is chosen for the fullest expert, not the mean one: mean + sqrt(2 mean ln L).
TEST(MoELayerConfig, ExpectedRowsPerExpertCoversTheFullestExpert) {
  MoELayerConfig one = deepseek(1);
  one.num_experts = 32;  // an EP8 rank's experts on one GPU
  EXPECT_EQ(expected_rows_per_expert(one, 128), 47);  // mean 32 + sqrt(64 ln 32) = 46.9
  EXPECT_EQ(expected_rows_per_expert(one, 256), 86);  // mean 64 + sqrt(128 ln 32) = 85.1
  EXPECT_EQ(expected_rows_per_expert(one, 0), 1);
  EXPECT_EQ(expected_rows_per_expert(deepseek(1), 1), 1);  // 8 of 256 experts: at most one row each
  // EP8: tokens from all 8 ranks (W / D = 8) over 32 local experts, the same mean as above.
  EXPECT_EQ(expected_rows_per_expert(deepseek(8), 128), 47);
  MoELayerConfig dp = deepseek(8);
  dp.dp_size = 2;  // 4 token groups
  EXPECT_EQ(expected_rows_per_expert(dp, 128), 27);  // 16 + sqrt(32 ln 32) = 26.5
  for (int t = 1; t < 4096; t *= 2)
    EXPECT_GE(expected_rows_per_expert(one, t), t * 8 / 32) << "never below the mean, tokens = " << t;
}

TEST(MoELayerConfig, WorkspaceGrowsWithTheLayoutAndHalves) {
  MoELayerConfig c = deepseek(1);
  EXPECT_EQ(c.layout, ExpertLayout::kPacked);  // the default: the layout that fits prefill
  c.max_tokens_per_rank = 64;
  c.layout = ExpertLayout::kMasked;
  const size_t masked = layer_workspace_bytes(c);
  c.layout = ExpertLayout::kPacked;
  const size_t packed = layer_workspace_bytes(c);
  // 256 experts on one GPU: masked holds 256 x 64 rows per expert tensor, packed 64 x 8 rows.
  EXPECT_LT(packed * 8, masked);
  EXPECT_GT(packed, 0u);
}

// Device pointers are never dereferenced by check_weights: any non-null value stands for a tensor.
Tensor fake(DType t, std::initializer_list<int64_t> dims) { return Tensor(reinterpret_cast<void*>(0x1000), t, dims); }

MoELayerWeights deepseek_weights(int L) {
  MoELayerWeights w;
  w.w13 = fake(DType::kFP8E4M3, {L, 4096, 7168});
  w.w13_scale = fake(DType::kFP32, {L, 32, 56});
  w.w2 = fake(DType::kFP8E4M3, {L, 7168, 2048});
  w.w2_scale = fake(DType::kFP32, {L, 56, 16});
  w.shared_w13 = fake(DType::kFP8E4M3, {4096, 7168});
  w.shared_w13_scale = fake(DType::kFP32, {32, 56});
  w.shared_w2 = fake(DType::kFP8E4M3, {7168, 2048});
  w.shared_w2_scale = fake(DType::kFP32, {56, 16});
  w.gate = fake(DType::kBF16, {256, 7168});
  w.gate_bias = fake(DType::kFP32, {256});
  return w;
}

TEST(MoELayerWeights, CheckpointLayoutAcceptedAndEveryDeviationNamed) {
  const MoELayerConfig c = deepseek(8);
  EXPECT_NO_THROW(check_weights(c, deepseek_weights(32)));
  auto error = [&](MoELayerWeights w) -> std::string {
    try {
      check_weights(c, w);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  MoELayerWeights w = deepseek_weights(32);
  w.w13 = fake(DType::kFP8E4M3, {256, 4096, 7168});  // every expert instead of the rank's 32
  EXPECT_NE(error(w).find("w13 has shape [256, 4096, 7168] but must be [32, 4096, 7168]"), std::string::npos) << error(w);
  w = deepseek_weights(32);
  w.w2 = fake(DType::kBF16, {32, 7168, 2048});
  EXPECT_NE(error(w).find("w2 is bf16 but must be fp8_e4m3"), std::string::npos) << error(w);
  w = deepseek_weights(32);
  w.w2_scale = Tensor();
  EXPECT_NE(error(w).find("w2_scale is missing"), std::string::npos) << error(w);
  w = deepseek_weights(32);
  w.gate = fake(DType::kBF16, {256, 7000});
  EXPECT_NE(error(w).find("gate has shape"), std::string::npos) << error(w);
  MoELayerConfig soft = c;
  soft.router_mode = moe::RouterMode::kSoftmaxTopK, soft.num_groups = 1, soft.topk_groups = 1;
  EXPECT_NE([&] {
    try {
      check_weights(soft, deepseek_weights(32));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  }().find("softmax router takes no bias"), std::string::npos);
}

}  // namespace
}  // namespace epkit
