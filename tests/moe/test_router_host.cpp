// CPU tests of the router: RouterConfig / RouterArgs validation, the gate projection's validation,
// and the host reference (epkit::ref::route) on small hand-computed cases.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "epkit/moe/gate.hpp"
#include "reference/moe/reference.hpp"
#include "epkit/moe/router.hpp"
#include "expect_error.hpp"
#include "host_testing.hpp"

namespace epkit::moe {
namespace {

using host_test::deepseek;
using host_test::fake;
using host_test::mixtral;

TEST(RouterValidate, AcceptsDeepSeekAndMixtral) {
  EXPECT_NO_THROW(validate(deepseek()));
  EXPECT_NO_THROW(validate(mixtral()));
  RouterConfig c = deepseek();
  c.num_experts = 512, c.topk = 16, c.num_groups = 512, c.topk_groups = 16;
  EXPECT_NO_THROW(validate(c));
}

TEST(RouterValidate, RejectsLimitsNamingValueAndLimit) {
  RouterConfig c = deepseek();
  c.num_experts = 513;
  EXPECT_EPKIT_ERROR(validate(c), "num_experts = 513", "512");
  c.num_experts = 0;
  EXPECT_EPKIT_ERROR(validate(c), "num_experts = 0");
  c = deepseek(), c.topk = 17;
  EXPECT_EPKIT_ERROR(validate(c), "topk = 17", "16");
  c = deepseek(), c.topk = 0;
  EXPECT_EPKIT_ERROR(validate(c), "topk = 0");
  c = mixtral(), c.num_experts = 4, c.topk = 5;
  EXPECT_EPKIT_ERROR(validate(c), "topk = 5", "num_experts = 4");
  c = deepseek(), c.num_groups = 7;
  EXPECT_EPKIT_ERROR(validate(c), "num_groups = 7", "does not divide", "256");
  c = deepseek(), c.num_groups = 0;
  EXPECT_EPKIT_ERROR(validate(c), "num_groups = 0");
  c = deepseek(), c.topk_groups = 9;
  EXPECT_EPKIT_ERROR(validate(c), "topk_groups = 9", "num_groups = 8");
  c = deepseek(), c.topk_groups = 0;
  EXPECT_EPKIT_ERROR(validate(c), "topk_groups = 0");
  c = deepseek(), c.topk_groups = 1, c.topk = 16, c.num_groups = 32;  // 1 group of 8 experts
  EXPECT_EPKIT_ERROR(validate(c), "topk = 16", "8 experts of the topk_groups = 1");
  c = deepseek(), c.renormalize = false;
  EXPECT_EPKIT_ERROR(validate(c), "renormalize = false");
  c = deepseek(), c.routed_scaling = 0.0f;
  EXPECT_EPKIT_ERROR(validate(c), "routed_scaling = 0");
  c = deepseek(), c.routed_scaling = NAN;
  EXPECT_EPKIT_ERROR(validate(c), "routed_scaling");
  c = mixtral(), c.num_groups = 2;
  EXPECT_EPKIT_ERROR(validate(c), "softmax_topk has no expert groups", "num_groups = 2");
  c = mixtral(), c.mode = static_cast<RouterMode>(7);
  EXPECT_EPKIT_ERROR(validate(c), "mode = 7");
}

struct RouterTensors {
  RouterArgs a;
  RouterTensors(const RouterConfig& c, int rows, int m) {
    a.logits = Tensor(fake(0x10000), DType::kBF16, {rows, c.num_experts});
    a.topk_idx = Tensor(fake(0x20000), DType::kInt32, {rows, c.topk});
    a.topk_weights = Tensor(fake(0x30000), DType::kFP32, {rows, c.topk});
    a.num_tokens = m;
  }
};

TEST(RouterValidate, ChecksEveryTensor) {
  const RouterConfig c = deepseek();
  RouterTensors t(c, 64, 64);
  EXPECT_NO_THROW(check_router_args(c, t.a));
  t.a.logits.dtype = DType::kFP32;
  EXPECT_NO_THROW(check_router_args(c, t.a));
  t.a.bias = Tensor(fake(0x40000), DType::kFP32, {256});
  EXPECT_NO_THROW(check_router_args(c, t.a));

  RouterArgs a = t.a;
  a.logits.dtype = DType::kFP16;
  EXPECT_EPKIT_ERROR(check_router_args(c, a), "logits has dtype fp16", "bf16 or fp32");
  a = t.a, a.logits.shape[1] = 255;
  EXPECT_EPKIT_ERROR(check_router_args(c, a), "logits has shape [64, 255]", "expected 256");
  a = t.a, a.logits.data = nullptr;
  EXPECT_EPKIT_ERROR(check_router_args(c, a), "logits is missing");
  a = t.a, a.logits.data = fake(0x10002);
  EXPECT_EPKIT_ERROR(check_router_args(c, a), "logits data pointer is not 4-byte aligned");
  a = t.a, a.bias = Tensor(fake(0x40000), DType::kFP32, {128});
  EXPECT_EPKIT_ERROR(check_router_args(c, a), "bias has shape [128]", "expected 256");
  a = t.a, a.bias.dtype = DType::kBF16;
  EXPECT_EPKIT_ERROR(check_router_args(c, a), "bias has dtype bf16", "fp32");
  a = t.a, a.topk_idx.dtype = DType::kInt64;
  EXPECT_EPKIT_ERROR(check_router_args(c, a), "topk_idx has dtype int64", "int32");
  a = t.a, a.topk_idx.shape[1] = 4;
  EXPECT_EPKIT_ERROR(check_router_args(c, a), "topk_idx has shape [64, 4]", "expected 8");
  a = t.a, a.topk_weights.ndim = 1;
  EXPECT_EPKIT_ERROR(check_router_args(c, a), "topk_weights has shape", "expected 2 dims");
  a = t.a, a.topk_weights.data = nullptr;
  EXPECT_EPKIT_ERROR(check_router_args(c, a), "topk_weights is missing");

  a = t.a, a.topk_weights.shape[0] = 32;  // m = 64 > the smallest rows
  EXPECT_EPKIT_ERROR(check_router_args(c, a), "num_tokens = 64", "rows = 32");
  a = t.a, a.num_tokens = -1;
  EXPECT_EPKIT_ERROR(check_router_args(c, a), "num_tokens = -1", "num_tokens_device");
  int32_t dev_m = 0;
  a = t.a, a.num_tokens_device = &dev_m;
  EXPECT_EPKIT_ERROR(check_router_args(c, a), "either on the host", "not both");
  a.num_tokens = -1;
  EXPECT_NO_THROW(check_router_args(c, a));

  RouterConfig bad = c;
  bad.topk = 0;
  EXPECT_EPKIT_ERROR(check_router_args(bad, t.a), "topk = 0");
}

TEST(RouterValidate, SoftmaxTakesNoBiasAndEmptyTensorsMayBeNull) {
  const RouterConfig c = mixtral();
  RouterTensors t(c, 0, 0);
  t.a.logits.data = t.a.topk_idx.data = t.a.topk_weights.data = nullptr;  // m = 0: torch gives null
  EXPECT_NO_THROW(check_router_args(c, t.a));
  RouterTensors u(c, 4, 4);
  u.a.bias = Tensor(fake(0x40000), DType::kFP32, {8});
  EXPECT_EPKIT_ERROR(check_router_args(c, u.a), "bias given", "softmax_topk takes no correction bias");
}

TEST(GateValidate, ShapesAndArguments) {
  EXPECT_NO_THROW(validate(GateShape{7168, 256, 4096}));
  EXPECT_EPKIT_ERROR(validate(GateShape{7170, 256, 1}), "hidden = 7170", "multiple of 8");
  EXPECT_EPKIT_ERROR(validate(GateShape{64, 513, 1}), "num_experts = 513", "512");
  EXPECT_EPKIT_ERROR(validate(GateShape{64, 8, 0}), "max_tokens = 0");
  const GateShape s{64, 8, 16};
  const Tensor x(fake(0x10000), DType::kBF16, {16, 64}), w(fake(0x20000), DType::kBF16, {8, 64}),
      l(fake(0x30000), DType::kFP32, {16, 8});
  EXPECT_NO_THROW(check_gate_args(s, x, w, l, 16));
  EXPECT_NO_THROW(check_gate_args(s, x, w, l, 0));
  EXPECT_EPKIT_ERROR(check_gate_args(s, x, w, l, 17), "m = 17", "max_tokens = 16");
  Tensor x2 = x;
  x2.shape[0] = 8;
  EXPECT_EPKIT_ERROR(check_gate_args(s, x2, w, l, 9), "m = 9", "rows of x = 8");
  Tensor l2 = l;
  l2.shape[0] = 4;
  EXPECT_EPKIT_ERROR(check_gate_args(s, x, w, l2, 5), "m = 5", "rows of logits = 4");
  Tensor w2 = w;
  w2.shape[1] = 32;
  EXPECT_EPKIT_ERROR(check_gate_args(s, x, w2, l, 1), "w has shape [8, 32]", "expected 64");
  w2 = w, w2.dtype = DType::kFP8E4M3;
  EXPECT_EPKIT_ERROR(check_gate_args(s, x, w2, l, 1), "w has dtype fp8_e4m3", "bf16");
  x2 = x, x2.data = fake(0x10008);
  EXPECT_EPKIT_ERROR(check_gate_args(s, x2, w, l, 1), "x data pointer is not 16-byte aligned");
  l2 = l, l2.dtype = DType::kBF16;
  EXPECT_EPKIT_ERROR(check_gate_args(s, x, w, l2, 1), "logits has dtype bf16", "fp32");
}

// --- the reference on hand-computed cases ---

TEST(RouterReference, SoftmaxTopKTiesGoToTheLowerIndex) {
  RouterConfig c = mixtral();
  c.num_experts = 4;
  const std::vector<float> l = {1.0f, 3.0f, 2.0f, 3.0f};
  int32_t idx[2];
  float w[2];
  ref::route(c, 1, l.data(), nullptr, idx, w);
  EXPECT_EQ(idx[0], 1);
  EXPECT_EQ(idx[1], 3);
  EXPECT_EQ(w[0], 0.5f);  // e^0 / (e^0 + e^0)
  EXPECT_EQ(w[1], 0.5f);
  c.renormalize = false;
  ref::route(c, 1, l.data(), nullptr, idx, w);
  const double total = 2.0 + std::exp(-1.0) + std::exp(-2.0);
  EXPECT_NEAR(w[0], 1.0 / total, 1e-6);
  EXPECT_NEAR(w[1], 1.0 / total, 1e-6);
  c.renormalize = true, c.routed_scaling = 3.0f;
  ref::route(c, 1, l.data(), nullptr, idx, w);
  EXPECT_EQ(w[0], 1.5f);
}

TEST(RouterReference, SoftmaxWeightsFollowTheLogits) {
  RouterConfig c = mixtral();
  c.num_experts = 3, c.topk = 2;
  const std::vector<float> l = {0.0f, std::log(3.0f), -5.0f};  // e = 1, 3, tiny
  int32_t idx[2];
  float w[2];
  ref::route(c, 1, l.data(), nullptr, idx, w);
  EXPECT_EQ(idx[0], 1);
  EXPECT_EQ(idx[1], 0);
  EXPECT_NEAR(w[0], 0.75f, 1e-7f);  // 1 / (1 + 1/3)
  EXPECT_NEAR(w[1], 0.25f, 1e-7f);  // e^(0 - ln 3) = 1/3, over the same sum
}

TEST(RouterReference, GroupedKeepsTheBestGroupsAndWeighsByUnbiasedScores) {
  // Logits 0: s = 1/2 for every expert exactly, so only the bias tells experts apart.
  RouterConfig c = deepseek();
  c.num_experts = 8, c.num_groups = 4, c.topk_groups = 2, c.topk = 2;
  const std::vector<float> l(8, 0.0f);
  // s' per group: {0.6, 0.5} = 1.1, {0.8, 0.5} = 1.3, {0.7, 0.7} = 1.4, {0.5, 0.55} = 1.05.
  const std::vector<float> bias = {0.1f, 0.0f, 0.3f, 0.0f, 0.2f, 0.2f, 0.0f, 0.05f};
  int32_t idx[2];
  float w[2];
  ref::route(c, 1, l.data(), bias.data(), idx, w);
  EXPECT_EQ(idx[0], 2);  // 0.8, in group 1
  EXPECT_EQ(idx[1], 4);  // 0.7, tied with expert 5: the lower index
  EXPECT_EQ(w[0], 1.25f);  // s = 0.5 each: 0.5 / 1.0 * 2.5
  EXPECT_EQ(w[1], 1.25f);
  // Expert 0 (0.6) beats 4 and 5 on its own but its group (1.1) is dropped.
  c.topk = 3;
  int32_t idx3[3];
  float w3[3];
  ref::route(c, 1, l.data(), bias.data(), idx3, w3);
  EXPECT_EQ(idx3[2], 5);
}

TEST(RouterReference, GroupedTiesGoToTheLowerGroup) {
  RouterConfig c = deepseek();
  c.num_experts = 6, c.num_groups = 3, c.topk_groups = 1, c.topk = 1;
  const std::vector<float> l(6, 0.0f);
  const std::vector<float> bias = {0.0f, 0.0f, 0.25f, 0.0f, 0.0f, 0.25f};  // groups 1 and 2 tie
  int32_t idx;
  float w;
  ref::route(c, 1, l.data(), bias.data(), &idx, &w);
  EXPECT_EQ(idx, 2);
  EXPECT_EQ(w, 2.5f);  // one expert: s / s * 2.5
}

TEST(RouterReference, GroupedWeightsUseSigmoidNotBias) {
  RouterConfig c = deepseek();
  c.num_experts = 4, c.num_groups = 1, c.topk_groups = 1, c.topk = 2, c.routed_scaling = 1.0f;
  const std::vector<float> l = {0.0f, 0.0f, 100.0f, 0.0f};  // s = 0.5, 0.5, 1, 0.5
  const std::vector<float> bias = {0.0f, 1.0f, 0.0f, 2.0f};   // s' = 0.5, 1.5, 1, 2.5
  int32_t idx[2];
  float w[2];
  ref::route(c, 1, l.data(), bias.data(), idx, w);
  EXPECT_EQ(idx[0], 3);
  EXPECT_EQ(idx[1], 1);
  EXPECT_EQ(w[0], 0.5f);
  EXPECT_EQ(w[1], 0.5f);
  // Without the bias, expert 2 (s = 1) leads: 1 / 1.5 and 0.5 / 1.5.
  ref::route(c, 1, l.data(), nullptr, idx, w);
  EXPECT_EQ(idx[0], 2);
  EXPECT_EQ(idx[1], 0);
  EXPECT_EQ(w[0], 1.0f / 1.5f);
  EXPECT_EQ(w[1], 0.5f / 1.5f);
}

TEST(RouterReference, OneExpertGroupsScoreTheirOnlyExpert) {
  RouterConfig c = deepseek();
  c.num_experts = 4, c.num_groups = 4, c.topk_groups = 2, c.topk = 2;
  const std::vector<float> l = {-1.0f, 2.0f, 1.0f, 3.0f, /* token 1 */ 3.0f, 1.0f, 2.0f, -1.0f};
  int32_t idx[4];
  float w[4];
  ref::route(c, 2, l.data(), nullptr, idx, w);
  EXPECT_EQ(idx[0], 3);
  EXPECT_EQ(idx[1], 1);
  EXPECT_EQ(idx[2], 0);
  EXPECT_EQ(idx[3], 2);
  EXPECT_FLOAT_EQ(w[0] + w[1], 2.5f);
}

}  // namespace
}  // namespace epkit::moe
