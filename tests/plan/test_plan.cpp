// The model's pieces and the must-reproduce numbers of the deployment study (memory, routing, roofline, MTP).
#include <gtest/gtest.h>

#include <cmath>

#include "epkit/error.hpp"
#include "epkit/plan/estimate.hpp"
#include "epkit/plan/memory.hpp"
#include "epkit/plan/roofline.hpp"
#include "epkit/plan/routing.hpp"
#include "epkit/plan/specs.hpp"
#include "plan/plan_testing.hpp"

using namespace epkit::plan;
using namespace epkit::plan::testing_util;


TEST(PlanSpecs, BuiltinsLoadByNameAndAlias) {
  EXPECT_EQ(load_model("deepseek-v3").num_layers, 61);
  EXPECT_EQ(load_model("DeepSeek-R1").name, "deepseek-v3");
  EXPECT_EQ(load_model("mixtral-8x7b").num_routed_experts, 8);
  EXPECT_EQ(load_gpu("h100").name, "h100-sxm");
  EXPECT_DOUBLE_EQ(load_gpu("h200").hbm_capacity_gb, 141);
  EXPECT_THROW(load_gpu("a100"), epkit::Error);
}

TEST(PlanSpecs, DeepSeekV3IsTheIssueModel) {
  const ModelSpec m = load_model("deepseek-v3");
  EXPECT_EQ(m.num_dense_layers, 3);
  EXPECT_EQ(m.hidden, 7168);
  EXPECT_EQ(m.q_lora_rank, 1536);
  EXPECT_EQ(m.kv_lora_rank, 512);
  EXPECT_EQ(m.qk_rope_head_dim, 64);
  EXPECT_EQ(m.num_heads, 128);
  EXPECT_EQ(m.moe_inter, 2048);
  EXPECT_EQ(m.num_routed_experts, 256);
  EXPECT_EQ(m.num_shared_experts, 1);
  EXPECT_EQ(m.top_k, 8);
  EXPECT_EQ(m.dense_inter, 18432);
  EXPECT_EQ(m.vocab, 129280);
  EXPECT_DOUBLE_EQ(m.weight_bytes, 1.0);
}

TEST(PlanSpecs, JsonRoundTripAndUnknownFieldsRejected) {
  const ModelSpec m = load_model("deepseek-v3");
  EXPECT_EQ(to_json(model_from_json(to_json(m))).dump(), to_json(m).dump());
  const GpuSpec g = load_gpu("h200");
  EXPECT_EQ(to_json(gpu_from_json(to_json(g))).dump(), to_json(g).dump());
  Json bad = to_json(g);
  bad.set("hbm_bandwith_tb_per_s", 5.0);  // misspelt
  EXPECT_THROW(gpu_from_json(bad), epkit::Error);
  Json neg = to_json(g);
  neg.set("hbm_capacity_gb", -1.0);
  EXPECT_THROW(gpu_from_json(neg), epkit::Error);
}

TEST(PlanMemory, KvBytesPerTokenIs70272) {
  EXPECT_DOUBLE_EQ(kv_bytes_per_token(load_model("deepseek-v3")), 70272.0);
  // Mixtral: 32 layers x K and V x 8 KV heads x 128 x BF16.
  EXPECT_DOUBLE_EQ(kv_bytes_per_token(load_model("mixtral-8x7b")), 32.0 * 2 * 8 * 128 * 2);
  // MLA keeps the whole latent cache on every TP rank; GQA splits KV heads.
  EXPECT_DOUBLE_EQ(kv_bytes_per_token_per_gpu(load_model("deepseek-v3"), 8), 70272.0);
  EXPECT_DOUBLE_EQ(kv_bytes_per_token_per_gpu(load_model("mixtral-8x7b"), 4), 32.0 * 2 * 8 * 128 * 2 / 4);
}

TEST(PlanMemory, Ep8OnH200HoldsAbout100GBOfWeights) {
  const ModelSpec m = load_model("deepseek-v3");
  const WeightBytes w = weights_per_gpu(m, 8, 1);
  EXPECT_GT(w.total(), 95e9);
  EXPECT_LT(w.total(), 105e9);
  // 32 routed experts of 3 x 7168 x 2048 FP8 bytes in each of 58 MoE layers, plus block scales.
  EXPECT_NEAR(w.routed_experts, 58.0 * 32 * 3 * 7168 * 2048, 0.01 * w.routed_experts);
  // The whole model on 8 GPUs: about 671 B parameters (FP8, embeddings BF16).
  const WeightBytes one = weights_per_gpu(m, 1, 1);
  EXPECT_NEAR(one.total() - one.embedding / 2, 671e9, 10e9);
}

TEST(PlanMemory, About100RequestsOf5000TokensAndBatch128DoesNotFit) {
  const ModelSpec m = load_model("deepseek-v3");
  const GpuSpec g = load_gpu("h200");
  const int max_batch = max_batch_per_gpu(m, g, cfg(8, 1, 1));
  EXPECT_GE(max_batch, 90);
  EXPECT_LE(max_batch, 115);
  const PlanPoint p = estimate(m, g, cfg(8, 1, 128));
  EXPECT_FALSE(p.fits);
  EXPECT_NE(p.infeasible_reason.find("128"), std::string::npos);
  EXPECT_TRUE(estimate(m, g, cfg(8, 1, 64)).fits);
  // EP8 does not fit on 80 GB H100s at all (the deployment study: the model exceeds 8 x 80 GB).
  EXPECT_EQ(max_batch_per_gpu(m, load_gpu("h100"), cfg(8, 1, 1)), 0);
  // EP128 on H100 holds batch 128 (the deployment study measured it).
  EXPECT_TRUE(estimate(m, load_gpu("h100"), cfg(128, 1, 128)).fits);
}

TEST(PlanRouting, TokensPerExpertIs1024AtEp128Batch128QueryLen2) {
  const RoutingStats r = routing_stats(load_model("deepseek-v3"), cfg(128, 1, 128), 128);
  EXPECT_DOUBLE_EQ(r.tokens_per_expert, 1024.0);  // 128 * 2 * 8 * 128 / 256
  EXPECT_DOUBLE_EQ(r.experts_per_gpu, 2.0);
  EXPECT_NEAR(r.active_experts_per_gpu, 2.0, 1e-9);  // 32768 tokens touch every expert
  EXPECT_NEAR(r.tokens_per_active_expert, 1024.0, 1e-6);
}

TEST(PlanRouting, DistinctExpertsNotOnlyTheMean) {
  const ModelSpec m = load_model("deepseek-v3");
  // The deployment study: EP8 TP8 batch 1 -> 2 tokens -> at most 16 experts in the system, about 2 per GPU.
  const RoutingStats r = routing_stats(m, cfg(8, 8, 1), 1);
  const double expected_total = 256 * (1 - std::pow(1 - 8.0 / 256, 2));
  EXPECT_NEAR(r.active_experts_per_gpu * 8, expected_total, 1e-9);
  EXPECT_LT(r.active_experts_per_gpu, 2.0);
  // Loads per touched expert exceed the plain mean when few experts are touched.
  const RoutingStats r1 = routing_stats(m, cfg(8, 1, 1), 1);
  EXPECT_GT(r1.tokens_per_active_expert, r1.tokens_per_expert);
  EXPECT_DOUBLE_EQ(expected_active_experts(32, 256, 8, 0), 0.0);
  EXPECT_NEAR(expected_active_experts(32, 256, 8, 1e5), 32.0, 1e-9);
}

TEST(PlanRoofline, MaxOfComputeAndMemoryPlusLaunch) {
  bool cb = false;
  // 1 TFLOP at 1000 TFLOP/s = 1000 µs; 1 GB at 1 TB/s = 1000 µs; halve efficiency doubles.
  EXPECT_NEAR(roofline_us(1e12, 1e6, 1000, 1, 1, 1, 0, &cb), 1000, 1e-9);
  EXPECT_TRUE(cb);
  EXPECT_NEAR(roofline_us(1e6, 1e9, 1000, 1, 1, 0.5, 3, &cb), 2003, 1e-9);
  EXPECT_FALSE(cb);
}

TEST(PlanRoofline, GemmAndGroupGemmFollowTheSeedFormulas) {
  const GpuSpec g = load_gpu("h100");
  Efficiency e;
  // With one byte per element the byte count is the deployment study's m*k + n*k + m*n.
  KernelCost k = gemm_cost("x", KernelClass::kGemm, 64, 7168, 2048, 1, 1, 1, g, e);
  EXPECT_DOUBLE_EQ(k.flop, 2.0 * 64 * 7168 * 2048);
  EXPECT_DOUBLE_EQ(k.bytes, 64.0 * 7168 + 2048.0 * 7168 + 64.0 * 2048);
  KernelCost gg = group_gemm_cost("y", 2, 2 * 1024, 7168, 4096, 1, 1, 1, g, e);
  EXPECT_DOUBLE_EQ(gg.flop, 2.0 * 2 * 1024 * 7168 * 4096);
  EXPECT_DOUBLE_EQ(gg.bytes, 2.0 * (1024.0 * 7168 + 4096.0 * 7168 + 1024.0 * 4096));
  // Larger m -> higher arithmetic intensity (the deployment study, "GroupGEMM").
  EXPECT_GT(group_gemm_cost("y", 2, 2 * 1024, 7168, 4096, 1, 1, 2, g, e).intensity(),
            group_gemm_cost("y", 32, 32 * 64, 7168, 4096, 1, 1, 2, g, e).intensity());
}

TEST(PlanConfig, MtpTokensPerStep) {
  DeployConfig c;
  c.query_len = 2;
  c.acceptance = 0.6;
  EXPECT_DOUBLE_EQ(tokens_per_step(c), 1.6);
  c.query_len = 1;
  EXPECT_DOUBLE_EQ(tokens_per_step(c), 1.0);
  c.query_len = 3;
  EXPECT_DOUBLE_EQ(tokens_per_step(c), 1.0 + 0.6 + 0.36);
}

TEST(PlanConfig, ValidationNamesValueAndLimit) {
  const ModelSpec m = load_model("deepseek-v3");
  const GpuSpec g = load_gpu("h100");
  auto message = [&](DeployConfig c) {
    try {
      validate(c, m, g);
    } catch (const epkit::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(cfg(12, 1, 1)).find("ep = 12"), std::string::npos);
  EXPECT_NE(message(cfg(12, 1, 1)).find("256"), std::string::npos);
  EXPECT_NE(message(cfg(16, 16, 1)).find("gpus_per_node = 8"), std::string::npos);
  EXPECT_NE(message(cfg(8, 1, 1, Schedule::kMicroBatch)).find("batch = 1"), std::string::npos);
  EXPECT_NE(message(cfg(512, 1, 1)).find("num_routed_experts = 256"), std::string::npos);
  EXPECT_THROW(validate(cfg(16, 1, 1), load_model("mixtral"), g), epkit::Error);
  Efficiency e;
  e.comm = 1.5;
  EXPECT_THROW(validate(e), epkit::Error);
}

TEST(PlanEstimate, BreakdownSumsToLayerTimeForEverySchedule) {
  const ModelSpec m = load_model("deepseek-v3");
  for (Schedule s : {Schedule::kNoOverlap, Schedule::kDispatchOverlap, Schedule::kMicroBatch})
    for (int ep : {8, 128}) {
      const PlanPoint p = estimate(m, load_gpu(ep == 8 ? "h200" : "h100"), cfg(ep, 1, 32, s));
      double sum = 0;
      for (const auto& [k, v] : p.moe_breakdown_us) sum += v;
      EXPECT_NEAR(sum, p.moe_layer_time_us, 1e-6 * p.moe_layer_time_us) << to_string(s) << " EP" << ep;
      EXPECT_NEAR(p.step_time_us, 3 * p.dense_layer_time_us + 58 * p.moe_layer_time_us + p.head_time_us, 1e-6);
      EXPECT_NEAR(p.output_tokens_per_s_per_request, 1.6e6 / p.step_time_us, 1e-9);
    }
}

TEST(PlanEstimate, DispatchOverlapNeverSlowerThanNoOverlap) {
  const ModelSpec m = load_model("deepseek-v3");
  for (int ep : {8, 16, 128})
    for (int b : {1, 8, 64}) {
      const GpuSpec g = load_gpu(ep == 8 ? "h200" : "h100");
      EXPECT_LE(estimate(m, g, cfg(ep, 1, b, Schedule::kDispatchOverlap)).moe_layer_time_us,
                estimate(m, g, cfg(ep, 1, b, Schedule::kNoOverlap)).moe_layer_time_us + 1e-9);
    }
}

TEST(PlanEstimate, MixtralRunsOnOneNode) {
  const PlanPoint p = estimate(load_model("mixtral-8x7b"), load_gpu("h100"), cfg(8, 1, 16));
  EXPECT_TRUE(p.fits);
  EXPECT_GT(p.output_tokens_per_s_per_request, 0);
  EXPECT_DOUBLE_EQ(p.routing.tokens_per_expert, 16.0 * 2 * 2 * 8 / 8);
}
