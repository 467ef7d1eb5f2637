// CPU tests of the router: RouterConfig / RouterArgs validation, the gate projection's validation,
// and the host reference (epkit::ref::route) on small hand-computed cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "epkit/moe/gate.hpp"
#include "reference/moe/reference.hpp"
#include "epkit/moe/router.hpp"
#include "moe/moe_math.hpp"
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

// --- the fused gate + router: where it applies, and its one validation ---

TEST(GateRouterValidate, AppliesToDeepSeekDecode) {
  const RouterConfig c = deepseek();
  const char* why = nullptr;
  EXPECT_TRUE(gate_router_applies(GateShape{7168, 256, 32}, c, &why)) << why;
  EXPECT_TRUE(gate_router_applies(GateShape{7168, 256, 1}, c));
  EXPECT_TRUE(gate_router_applies(GateShape{512, 256, 8}, c));
  RouterConfig e512 = c;
  e512.num_experts = 512, e512.num_groups = 16;
  EXPECT_TRUE(gate_router_applies(GateShape{4096, 512, 32}, e512));

  EXPECT_FALSE(gate_router_applies(GateShape{7168, 256, 33}, c, &why));
  EXPECT_NE(std::string(why).find("max_tokens must be in [1, 32]"), std::string::npos) << why;
  EXPECT_FALSE(gate_router_applies(GateShape{7000, 256, 32}, c, &why));
  EXPECT_NE(std::string(why).find("hidden must be a multiple of 512"), std::string::npos) << why;
  EXPECT_FALSE(gate_router_applies(GateShape{7168, 128, 32}, c, &why));
  EXPECT_NE(std::string(why).find("num_experts differs"), std::string::npos) << why;
  RouterConfig e64 = c;
  e64.num_experts = 64;
  EXPECT_FALSE(gate_router_applies(GateShape{7168, 64, 32}, e64, &why));
  EXPECT_NE(std::string(why).find("128, 256 or 512"), std::string::npos) << why;
  EXPECT_FALSE(gate_router_applies(GateShape{4096, 8, 32}, mixtral(), &why));
  EXPECT_NE(std::string(why).find("grouped_topk only"), std::string::npos) << why;
  RouterConfig v2 = c;
  v2.num_experts = 160, v2.topk = 6, v2.topk_groups = 3;
  EXPECT_FALSE(gate_router_applies(GateShape{5120, 160, 32}, v2, &why));
}

TEST(GateRouterValidate, ChecksTheGemmAndTheRouterArguments) {
  const RouterConfig c = deepseek();
  const GateShape s{7168, 256, 32};
  RouterTensors t(c, 16, 16);
  t.a.logits.dtype = DType::kFP32;
  const Tensor x(fake(0x50000), DType::kBF16, {16, 7168}), w(fake(0x60000), DType::kBF16, {256, 7168});
  EXPECT_NO_THROW(check_gate_router_args(s, c, x, w, t.a));

  RouterArgs a = t.a;
  a.logits.dtype = DType::kBF16;  // the kernel writes fp32 logits
  EXPECT_EPKIT_ERROR(check_gate_router_args(s, c, x, w, a), "logits has dtype bf16", "fp32");
  a = t.a, a.logits.data = fake(0x10004);
  EXPECT_EPKIT_ERROR(check_gate_router_args(s, c, x, w, a), "logits data pointer is not 16-byte aligned");
  Tensor x2 = x;
  x2.shape[1] = 4096;
  EXPECT_EPKIT_ERROR(check_gate_router_args(s, c, x2, w, t.a), "x has shape [16, 4096]", "expected 7168");
  x2 = x, x2.shape[0] = 8;
  EXPECT_EPKIT_ERROR(check_gate_router_args(s, c, x2, w, t.a), "m = 16", "rows of x = 8");
  Tensor w2 = w;
  w2.dtype = DType::kFP8E4M3;
  EXPECT_EPKIT_ERROR(check_gate_router_args(s, c, x, w2, t.a), "w has dtype fp8_e4m3", "bf16");
  EXPECT_EPKIT_ERROR(check_gate_router_args(GateShape{7168, 256, 8}, c, x, w, t.a), "m = 16",
                     "max_tokens = 8");
  RouterTensors big(c, 64, 64);  // 64 rows: a host m <= 32 is fine, a device m could exceed 32
  big.a.logits.dtype = DType::kFP32;
  const Tensor xb(fake(0x50000), DType::kBF16, {64, 7168});
  big.a.num_tokens = 20;
  EXPECT_NO_THROW(check_gate_router_args(s, c, xb, w, big.a));
  int32_t dev_m = 0;
  big.a.num_tokens = -1, big.a.num_tokens_device = &dev_m;
  EXPECT_EPKIT_ERROR(check_gate_router_args(s, c, xb, w, big.a), "with m on the device, the 64 rows",
                     "max_tokens = 32");
  RouterConfig soft = mixtral();
  EXPECT_EPKIT_ERROR(check_gate_router_args(GateShape{7168, 8, 32}, soft, x, w, t.a), "grouped_topk only");
}

// --- which kernel route() runs ---

// kAuto takes the warp kernel wherever it applies (router.hpp); a forced kernel is taken as is.
TEST(RouterKernelChoice, WarpKernelWhereItApplies) {
  RouterConfig c = deepseek();
  RouterTensors t(c, 64, 64);
  EXPECT_TRUE(warp_router_applies(c, t.a));
  EXPECT_EQ(choose_router_kernel(c, t.a), RouterKernel::kWarpGrouped);  // kAuto
  c.kernel = RouterKernel::kWarpGrouped;
  EXPECT_EQ(choose_router_kernel(c, t.a), RouterKernel::kWarpGrouped);
  c.kernel = RouterKernel::kGeneral;
  EXPECT_EQ(choose_router_kernel(c, t.a), RouterKernel::kGeneral);
  c.kernel = RouterKernel::kAuto;
  t.a.logits.dtype = DType::kFP32;  // either dtype
  EXPECT_TRUE(warp_router_applies(c, t.a));
  EXPECT_EQ(choose_router_kernel(c, t.a), RouterKernel::kWarpGrouped);
  for (int E : {64, 128, 512}) {  // 2, 4, 16 experts per lane
    RouterConfig d = deepseek();
    d.num_experts = E, d.num_groups = 8, d.topk_groups = 4;
    RouterTensors u(d, 4, 4);
    EXPECT_TRUE(warp_router_applies(d, u.a)) << "E " << E;
    EXPECT_EQ(choose_router_kernel(d, u.a), RouterKernel::kWarpGrouped) << "E " << E;
  }
  for (int G : {1, 2, 4, 16, 32}) {  // groups of whole lanes
    RouterConfig d = deepseek();
    d.num_groups = G, d.topk_groups = std::max(1, G / 2), d.topk = std::min(8, d.topk_groups * (256 / G));
    RouterTensors u(d, 4, 4);
    EXPECT_TRUE(warp_router_applies(d, u.a)) << "G " << G;
  }
  RouterConfig d = deepseek();
  d.num_groups = 64, d.topk_groups = 64;  // every group kept: no group step, any group size
  RouterTensors u(d, 4, 4);
  EXPECT_TRUE(warp_router_applies(d, u.a));
}

TEST(RouterKernelChoice, GeneralKernelOtherwiseAndWhy) {
  const char* why = nullptr;
  RouterConfig c = mixtral();
  RouterTensors t(c, 8, 8);
  EXPECT_FALSE(warp_router_applies(c, t.a, &why));
  EXPECT_NE(std::string(why).find("grouped_topk only"), std::string::npos) << why;
  EXPECT_EQ(choose_router_kernel(c, t.a), RouterKernel::kGeneral);

  c = deepseek(), c.num_experts = 160, c.num_groups = 8, c.topk_groups = 3, c.topk = 6;  // DeepSeek-V2
  RouterTensors v2(c, 8, 8);
  EXPECT_FALSE(warp_router_applies(c, v2.a, &why));
  EXPECT_NE(std::string(why).find("64, 128, 256 or 512"), std::string::npos) << why;
  EXPECT_EQ(choose_router_kernel(c, v2.a), RouterKernel::kGeneral);

  c = deepseek(), c.num_groups = 64, c.topk_groups = 8;  // groups of 4 experts: half a lane
  RouterTensors g(c, 8, 8);
  EXPECT_FALSE(warp_router_applies(c, g.a, &why));
  EXPECT_NE(std::string(why).find("power of two <= 32"), std::string::npos) << why;
  EXPECT_EQ(choose_router_kernel(c, g.a), RouterKernel::kGeneral);

  c = deepseek();
  RouterTensors mis(c, 8, 8);
  mis.a.logits.data = fake(0x10004);  // 4-byte aligned: valid, but not for 16-byte loads
  EXPECT_NO_THROW(check_router_args(c, mis.a));
  EXPECT_FALSE(warp_router_applies(c, mis.a, &why));
  EXPECT_EQ(choose_router_kernel(c, mis.a), RouterKernel::kGeneral);
}

TEST(RouterKernelChoice, AForcedKernelIsTakenOrRejected) {
  RouterConfig c = deepseek();
  RouterTensors t(c, 64, 64);
  c.kernel = RouterKernel::kGeneral;
  EXPECT_EQ(choose_router_kernel(c, t.a), RouterKernel::kGeneral);
  EXPECT_NO_THROW(check_router_args(c, t.a));
  c.kernel = RouterKernel::kWarpGrouped;
  EXPECT_EQ(choose_router_kernel(c, t.a), RouterKernel::kWarpGrouped);
  EXPECT_NO_THROW(check_router_args(c, t.a));
  RouterConfig m = mixtral();
  m.kernel = RouterKernel::kWarpGrouped;
  RouterTensors u(m, 8, 8);
  EXPECT_EPKIT_ERROR(check_router_args(m, u.a), "kernel = warp_grouped cannot run this call", "grouped_topk only");
  m.kernel = static_cast<RouterKernel>(9);
  EXPECT_EPKIT_ERROR(validate(m), "kernel = 9", "not a RouterKernel");
  EXPECT_STREQ(router_kernel_name(RouterKernel::kWarpGrouped), "warp_grouped");
  EXPECT_STREQ(router_kernel_name(RouterKernel::kGeneral), "general");
}

// --- the warp kernel's algorithm, lane by lane, against the reference ---
//
// A host model of warp_router_kernel (src/moe/router.cu): 32 lanes of V scores each, every shuffle
// and warp reduction written out over the lanes. It checks the algorithm (each lane's top two, the
// xor merge over a group's lanes, the group key made from keys, the rank by shuffles, the arg-max
// tree and rounds) against ref::route bit for bit, on the CPU.
namespace m = math;

void warp_model(const RouterConfig& c, const float* l, const float* bias, int32_t* idx, float* w) {
  const int E = c.num_experts, V = E / 32, K = c.topk, G = c.num_groups;
  const bool use_groups = c.topk_groups < G;
  const int lpg = use_groups ? 32 / G : 32;
  std::vector<float> s(E);
  std::vector<uint32_t> key(E);
  for (int e = 0; e < E; ++e) {
    s[e] = m::sigmoid(l[e]);
    key[e] = m::order_key(m::fadd(s[e], bias ? bias[e] : 0.0f));
  }
  if (use_groups) {
    uint32_t k1[32], k2[32], gkey[32];
    for (int lane = 0; lane < 32; ++lane) {
      k1[lane] = k2[lane] = 0;
      for (int j = 0; j < V; ++j) {
        const uint32_t x = key[lane * V + j];
        k2[lane] = std::max(k2[lane], std::min(k1[lane], x));
        k1[lane] = std::max(k1[lane], x);
      }
    }
    for (int off = 1; off < lpg; off <<= 1) {
      uint32_t n1[32], n2[32];
      for (int lane = 0; lane < 32; ++lane) {
        const uint32_t o1 = k1[lane ^ off], o2 = k2[lane ^ off];
        n2[lane] = std::max(std::min(k1[lane], o1), std::max(k2[lane], o2));
        n1[lane] = std::max(k1[lane], o1);
      }
      std::memcpy(k1, n1, sizeof k1), std::memcpy(k2, n2, sizeof k2);
    }
    for (int lane = 0; lane < 32; ++lane) gkey[lane] = m::order_key(m::fadd(m::key_value(k1[lane]), m::key_value(k2[lane])));
    for (int lane = 0; lane < 32; ++lane) {
      int better = 0;
      for (int h = 0; h < 32 / lpg; ++h) {
        const uint32_t kh = gkey[h * lpg];
        better += (kh > gkey[lane]) | ((kh == gkey[lane]) & (h < lane / lpg));
      }
      if (better >= c.topk_groups)
        for (int j = 0; j < V; ++j) key[lane * V + j] = 0;
    }
  }
  auto lane_best = [&](int lane, uint32_t& bk, int& bj, float& bs) {
    std::vector<uint32_t> k(key.begin() + lane * V, key.begin() + lane * V + V);
    std::vector<int> j(V);
    std::vector<float> v(s.begin() + lane * V, s.begin() + lane * V + V);
    for (int i = 0; i < V; ++i) j[i] = i;
    for (int step = 1; step < V; step *= 2)
      for (int i = 0; i < V; i += 2 * step)
        if (k[i + step] > k[i]) k[i] = k[i + step], j[i] = j[i + step], v[i] = v[i + step];
    bk = k[0], bj = j[0], bs = v[0];
  };
  uint32_t bk[32];
  int bj[32];
  float bs[32];
  for (int lane = 0; lane < 32; ++lane) lane_best(lane, bk[lane], bj[lane], bs[lane]);
  float sum = 0.0f, my_s[32] = {};
  for (int k = 0; k < K; ++k) {
    const uint32_t best = *std::max_element(bk, bk + 32);
    int win = 0;
    while (bk[win] != best) ++win;  // the lowest lane of the ballot
    sum = m::fadd(sum, bs[win]);
    idx[k] = win * V + bj[win], my_s[k] = bs[win];
    key[win * V + bj[win]] = 0;
    lane_best(win, bk[win], bj[win], bs[win]);
  }
  for (int k = 0; k < K; ++k) w[k] = m::fmul(m::fdiv(my_s[k], sum), c.routed_scaling);
}

float special_or(std::mt19937_64& rng, float v) {
  switch (rng() % 24) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return INFINITY;
    case 3: return -INFINITY;
    case 4: return NAN;
    case 5: return 100.0f;  // sigmoid 1
    case 6: return -100.0f;  // sigmoid 0 (a group of zeros)
    default: return v;
  }
}

TEST(RouterWarpModel, MatchesTheReferenceBitForBit) {
  std::mt19937_64 rng(12345);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::uniform_int_distribution<int> pick(-4, 4);
  int cases = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    RouterConfig c = deepseek();
    c.num_experts = 64 << (rng() % 4);
    const int G = 1 << (rng() % 6);
    c.num_groups = G;
    c.topk_groups = 1 + static_cast<int>(rng() % G);
    c.topk = 1 + static_cast<int>(rng() % std::min(kMaxTopK, c.topk_groups * (c.num_experts / G)));
    c.routed_scaling = 0.5f + 0.25f * static_cast<float>(rng() % 8);
    RouterTensors t(c, 1, 1);
    ASSERT_TRUE(warp_router_applies(c, t.a));
    const int E = c.num_experts, mode = static_cast<int>(rng() % 3);  // random, ties, specials
    std::vector<float> l(E), bias(E);
    for (float& v : l) v = mode == 1 ? 0.5f * pick(rng) : mode == 2 ? special_or(rng, nd(rng)) : nd(rng);
    for (float& b : bias) b = mode == 1 ? 0.125f * static_cast<float>(rng() % 3) : 0.05f * nd(rng);
    const bool with_bias = rng() % 4 != 0;
    std::vector<int32_t> want_i(c.topk), got_i(c.topk);
    std::vector<float> want_w(c.topk), got_w(c.topk);
    ref::route(c, 1, l.data(), with_bias ? bias.data() : nullptr, want_i.data(), want_w.data());
    warp_model(c, l.data(), with_bias ? bias.data() : nullptr, got_i.data(), got_w.data());
    ASSERT_EQ(got_i, want_i) << "E " << E << " G " << G << " TG " << c.topk_groups << " K " << c.topk << " mode " << mode;
    for (int k = 0; k < c.topk; ++k)
      ASSERT_EQ(ref::float_to_bits(got_w[k]), ref::float_to_bits(want_w[k])) << "k " << k << " mode " << mode;
    ++cases;
  }
  EXPECT_EQ(cases, 3000);
}

// A group's key from its two best keys: a key names its value up to the sign of a zero and a NaN's
// payload, and neither changes the key of the sum.
TEST(RouterWarpModel, GroupKeyFromKeysEqualsTheKeyOfTheSum) {
  const float vals[] = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, 1e-38f, -1e-38f, 3.4e38f, -3.4e38f, INFINITY, -INFINITY, NAN,
                        -NAN, 1e-45f, -1e-45f, 0.25f};
  for (float a : vals)
    for (float b : vals) {
      const uint32_t want = m::order_key(m::fadd(a, b));
      const uint32_t got = m::order_key(m::fadd(m::key_value(m::order_key(a)), m::key_value(m::order_key(b))));
      EXPECT_EQ(got, want) << a << " + " << b;
    }
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
