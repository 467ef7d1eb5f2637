// GPU tests of the router against the host reference: indices and weights compared bit for bit
// (softmax without renormalisation: a stated tolerance), on random and tie-heavy logits, DeepSeek
// and Mixtral shapes, random configurations, m = 0, m from the device counter (clamped and
// reported above rows), and one captured graph replayed at several m. Grouped cases run each
// kernel route() has (RouterConfig::kernel): the general one and, where it applies, warp_grouped.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "reference/moe/reference.hpp"
#include "epkit/moe/router.hpp"
#include "host_testing.hpp"
#include "moe_testing.hpp"
#include "reference/moe/numerics.hpp"

namespace epkit::moe {
namespace {

using host_test::deepseek;
using host_test::mixtral;
using moe_test::case_seed;
using moe_test::DeviceArray;

std::string describe(const RouterConfig& c, DType dt, int rows, int m) {
  return std::string(router_mode_name(c.mode)) + " kernel=" + router_kernel_name(c.kernel) +
         " E=" + std::to_string(c.num_experts) + " K=" + std::to_string(c.topk) +
         " G=" + std::to_string(c.num_groups) + " TG=" + std::to_string(c.topk_groups) +
         " renorm=" + std::to_string(c.renormalize) + " " + dtype_name(dt) + " rows=" + std::to_string(rows) +
         " m=" + std::to_string(m);
}

// Logits for `rows` tokens: normal(0, 2) or, with ties, drawn from {-2, -1.5, ..., 2} (exact in
// bf16), so that equal scores, equal group scores and equal weights are common.
struct Inputs {
  std::vector<float> logits;  // the values the router sees (bf16-rounded when dt is bf16)
  std::vector<float> bias;
  DeviceArray<uint8_t> d_logits;
  DeviceArray<float> d_bias;
};

Inputs make_inputs(const RouterConfig& c, DType dt, int rows, bool ties, bool with_bias, std::mt19937_64& rng) {
  const int E = c.num_experts;
  Inputs in;
  in.logits.resize(static_cast<size_t>(rows) * E);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::uniform_int_distribution<int> pick(-4, 4);
  for (float& v : in.logits) {
    v = ties ? 0.5f * pick(rng) : nd(rng);
    if (dt == DType::kBF16) v = ref::bf16_to_float(ref::float_to_bf16(v));
  }
  std::vector<uint8_t> bytes(in.logits.size() * dtype_size(dt));
  if (dt == DType::kBF16) {
    for (size_t i = 0; i < in.logits.size(); ++i) {
      const uint16_t h = ref::float_to_bf16(in.logits[i]);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
  } else {
    std::memcpy(bytes.data(), in.logits.data(), bytes.size());
  }
  in.d_logits = DeviceArray<uint8_t>(bytes);
  if (with_bias) {
    std::uniform_int_distribution<int> bpick(0, 2);
    std::normal_distribution<float> bn(0.0f, 0.05f);
    in.bias.resize(E);
    for (float& b : in.bias) b = ties ? 0.125f * bpick(rng) : bn(rng);
    in.d_bias = DeviceArray<float>(in.bias);
  }
  return in;
}

struct Outputs {
  DeviceArray<int32_t> idx;
  DeviceArray<float> w;
  Outputs(int rows, int K) : idx(static_cast<size_t>(rows) * K), w(static_cast<size_t>(rows) * K) {}
  void poison() { idx.poison(), w.poison(); }
};

RouterArgs args_for(const RouterConfig& c, DType dt, int rows, Inputs& in, Outputs& out) {
  RouterArgs a;
  a.logits = Tensor(in.d_logits.get(), dt, {rows, c.num_experts});
  if (!in.bias.empty()) a.bias = Tensor(in.d_bias.get(), DType::kFP32, {c.num_experts});
  a.topk_idx = Tensor(out.idx.get(), DType::kInt32, {rows, c.topk});
  a.topk_weights = Tensor(out.w.get(), DType::kFP32, {rows, c.topk});
  return a;
}

// Rows [0, m) equal the reference (weights bit for bit unless `tol_rel` > 0); rows [m, rows) are
// still poison (idx -1, weight bits 0xffffffff).
void expect_routed(const RouterConfig& c, const Inputs& in, const Outputs& out, int rows, int m, float tol_rel,
                   const std::string& what) {
  const int K = c.topk;
  std::vector<int32_t> want_idx(static_cast<size_t>(m) * K);
  std::vector<float> want_w(static_cast<size_t>(m) * K);
  ref::route(c, m, in.logits.data(), in.bias.empty() ? nullptr : in.bias.data(), want_idx.data(), want_w.data());
  const std::vector<int32_t> idx = out.idx.download();
  const std::vector<float> w = out.w.download();
  int bad = 0;
  for (int t = 0; t < rows && bad < 8; ++t) {
    for (int k = 0; k < K; ++k) {
      const size_t o = static_cast<size_t>(t) * K + k;
      if (t >= m) {
        if (idx[o] != -1 || ref::float_to_bits(w[o]) != 0xffffffffu) {
          ADD_FAILURE() << what << ": row " << t << " >= m was written (idx " << idx[o] << ")";
          ++bad;
        }
        continue;
      }
      const bool idx_ok = idx[o] == want_idx[o];
      const bool w_ok = tol_rel > 0 ? std::fabs(w[o] - want_w[o]) <= tol_rel * std::fabs(want_w[o])
                                    : ref::float_to_bits(w[o]) == ref::float_to_bits(want_w[o]);
      if (!idx_ok || !w_ok) {
        ADD_FAILURE() << what << ": token " << t << " k " << k << ": got expert " << idx[o] << " weight " << w[o]
                      << ", want expert " << want_idx[o] << " weight " << want_w[o];
        ++bad;
      }
    }
  }
}

// The softmax sum over all E experts runs in another order in the kernel: each order's relative
// error is below (E - 1) 2^-24, so the two denominators differ by less than 2 E 2^-24, plus the
// rounding of the quotient and the scaling on each side.
float softmax_tolerance(const RouterConfig& c) {
  return c.mode == RouterMode::kSoftmaxTopK && !c.renormalize ? (2.0f * c.num_experts + 4.0f) * std::ldexp(1.0f, -24)
                                                              : 0.0f;
}

// The kernels a configuration can run: kAuto, kGeneral and, where it applies, kWarpGrouped.
std::vector<RouterConfig> with_each_kernel(RouterConfig c) {
  std::vector<RouterConfig> out;
  for (RouterKernel k : {RouterKernel::kAuto, RouterKernel::kGeneral, RouterKernel::kWarpGrouped}) {
    c.kernel = k;
    RouterArgs probe;
    probe.logits = Tensor(reinterpret_cast<void*>(0x10000), DType::kFP32, {1, c.num_experts});
    if (k != RouterKernel::kWarpGrouped || warp_router_applies(c, probe)) out.push_back(c);
  }
  return out;
}

void run_case(const RouterConfig& c, DType dt, int rows, int m, bool ties, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const bool bias = c.mode == RouterMode::kGroupedTopK && (rng() & 3) != 0;
  Inputs in = make_inputs(c, dt, rows, ties, bias, rng);
  Outputs out(rows, c.topk);
  out.poison();
  RouterArgs a = args_for(c, dt, rows, in, out);
  a.num_tokens = m;
  route(c, a, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  expect_routed(c, in, out, rows, m, softmax_tolerance(c),
                describe(c, dt, rows, m) + (ties ? " ties" : "") + (bias ? " bias" : ""));
}

TEST(Router, DeepSeekGroupedTopK) {
  const std::vector<RouterConfig> cs = with_each_kernel(deepseek());
  ASSERT_EQ(cs.size(), 3u);
  for (const RouterConfig& c : cs)
    for (DType dt : {DType::kBF16, DType::kFP32})
      for (bool ties : {false, true}) run_case(c, dt, 4096, 4093, ties, case_seed(1 + ties + 2 * (dt == DType::kFP32)));
}

// More tokens than the persistent grid has warps (132 SMs x 16 blocks x 4 warps on an H100/H200):
// each warp routes several tokens.
TEST(Router, WarpKernelLoopsOverTokensBeyondTheGrid) {
  RouterConfig c = deepseek();
  c.kernel = RouterKernel::kWarpGrouped;
  run_case(c, DType::kFP32, 20000, 19999, false, case_seed(5));
  run_case(c, DType::kBF16, 20000, 20000, true, case_seed(6));
}

// Every shape the warp kernel takes: 2, 4, 8 and 16 experts per lane, groups of 1 to 32 lanes or
// no group step, both dtypes, ties.
TEST(Router, WarpKernelEveryLaneLayout) {
  std::mt19937_64 rng(case_seed(50));
  for (int E : {64, 128, 256, 512})
    for (int G : {1, 2, 4, 8, 16, 32, 64}) {
      if (E % G) continue;
      for (int keep : {1, G / 2, G}) {
        if (keep < 1 || (G == 64 && keep != G)) continue;  // 64 groups: the warp kernel only without a group step
        RouterConfig c = deepseek();
        c.num_experts = E, c.num_groups = G, c.topk_groups = keep;
        c.topk = 1 + static_cast<int>(rng() % std::min(kMaxTopK, keep * (E / G)));
        c.kernel = RouterKernel::kWarpGrouped;
        const DType dt = rng() % 2 ? DType::kBF16 : DType::kFP32;
        SCOPED_TRACE(describe(c, dt, 300, 257));
        run_case(c, dt, 300, 257, rng() % 2, rng());
      }
    }
}

TEST(Router, MixtralSoftmaxTopK) {
  RouterConfig c = mixtral();
  for (bool renorm : {true, false}) {
    c.renormalize = renorm;
    for (bool ties : {false, true}) run_case(c, DType::kBF16, 1000, 999, ties, case_seed(10 + ties + 2 * renorm));
  }
}

TEST(Router, RandomConfigurations) {
  std::mt19937_64 rng(case_seed(100));
  const int experts[] = {1, 2, 3, 8, 16, 32, 33, 60, 64, 96, 128, 160, 256, 320, 384, 512};
  for (int trial = 0; trial < 60; ++trial) {
    RouterConfig c;
    c.num_experts = experts[rng() % (sizeof(experts) / sizeof(experts[0]))];
    const int E = c.num_experts;
    c.mode = rng() % 2 ? RouterMode::kGroupedTopK : RouterMode::kSoftmaxTopK;
    if (c.mode == RouterMode::kGroupedTopK) {
      std::vector<int> divisors;
      for (int g = 1; g <= E; ++g)
        if (E % g == 0) divisors.push_back(g);
      c.num_groups = divisors[rng() % divisors.size()];
      c.topk_groups = 1 + static_cast<int>(rng() % c.num_groups);
      const int candidates = c.topk_groups * (E / c.num_groups);
      c.topk = 1 + static_cast<int>(rng() % std::min(candidates, kMaxTopK));
      c.routed_scaling = 0.5f + static_cast<float>(rng() % 8) * 0.25f;
    } else {
      c.topk = 1 + static_cast<int>(rng() % std::min(E, kMaxTopK));
      c.renormalize = rng() % 2;
    }
    const DType dt = rng() % 2 ? DType::kBF16 : DType::kFP32;
    const int rows = 1 + static_cast<int>(rng() % 700);
    const int m = static_cast<int>(rng() % (rows + 1));
    const bool ties = rng() % 2;
    const uint64_t seed = rng();
    for (const RouterConfig& ck : with_each_kernel(c)) {
      SCOPED_TRACE(describe(ck, dt, rows, m));
      run_case(ck, dt, rows, m, ties, seed);
    }
  }
}

TEST(Router, ZeroTokensWritesNothing) {
  for (const RouterConfig& c : with_each_kernel(deepseek())) run_case(c, DType::kBF16, 16, 0, false, case_seed(200));
  run_case(mixtral(), DType::kFP32, 16, 0, false, case_seed(201));
}

class RouterKernels : public ::testing::TestWithParam<RouterKernel> {
 protected:
  RouterConfig config() const {
    RouterConfig c = deepseek();
    c.kernel = GetParam();
    return c;
  }
};

INSTANTIATE_TEST_SUITE_P(EachKernel, RouterKernels,
                         ::testing::Values(RouterKernel::kGeneral, RouterKernel::kWarpGrouped),
                         [](const ::testing::TestParamInfo<RouterKernel>& i) { return router_kernel_name(i.param); });

TEST_P(RouterKernels, DeviceTokenCountIsReadOnDeviceAndClampedWhenAboveRows) {
  const RouterConfig c = config();
  const int rows = 300;
  std::mt19937_64 rng(case_seed(300));
  Inputs in = make_inputs(c, DType::kBF16, rows, false, true, rng);
  Outputs out(rows, c.topk);
  ErrorRecord rec;
  DeviceArray<int32_t> dm(1);
  RouterArgs a = args_for(c, DType::kBF16, rows, in, out);
  a.num_tokens = -1;
  a.num_tokens_device = dm.get();
  a.error = rec.device();
  for (int m : {0, 1, 77, 300}) {
    dm.upload({m});
    out.poison();
    route(c, a, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_FALSE(rec.pending()) << rec.message();
    expect_routed(c, in, out, rows, m, 0.0f, "device m = " + std::to_string(m));
  }
  for (int m : {301, 100000, -5}) {
    dm.upload({m});
    out.poison();
    route(c, a, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    ASSERT_TRUE(rec.pending()) << "device m = " << m << " was not reported";
    const std::string msg = rec.message();
    EXPECT_NE(msg.find("router"), std::string::npos) << msg;
    EXPECT_NE(msg.find("m = " + std::to_string(m)), std::string::npos) << msg;
    EXPECT_NE(msg.find("300 rows"), std::string::npos) << msg;
    rec.reset();
    expect_routed(c, in, out, rows, m < 0 ? 0 : rows, 0.0f, "clamped device m = " + std::to_string(m));
  }
}

TEST_P(RouterKernels, OneCapturedGraphServesEveryM) {
  const RouterConfig c = config();
  const int rows = 512;
  std::mt19937_64 rng(case_seed(400));
  Inputs in = make_inputs(c, DType::kBF16, rows, false, true, rng);
  Outputs out(rows, c.topk);
  DeviceArray<int32_t> dm(1);
  ErrorRecord rec;
  RouterArgs a = args_for(c, DType::kBF16, rows, in, out);
  a.num_tokens = -1;
  a.num_tokens_device = dm.get();
  a.error = rec.device();
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  route(c, a, s);
  CUDA_OK(cudaStreamEndCapture(s, &g));
  CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
  for (int m : {512, 3, 0, 129, 511}) {
    // New logits too: the graph reads whatever the buffers hold at replay.
    Inputs fresh = make_inputs(c, DType::kBF16, rows, m % 2, true, rng);
    CUDA_OK(cudaMemcpy(in.d_logits.get(), fresh.d_logits.get(), fresh.d_logits.bytes(), cudaMemcpyDeviceToDevice));
    CUDA_OK(cudaMemcpy(in.d_bias.get(), fresh.d_bias.get(), fresh.d_bias.bytes(), cudaMemcpyDeviceToDevice));
    in.logits = fresh.logits, in.bias = fresh.bias;
    dm.upload({m});
    out.poison();
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaGraphLaunch(ge, s));
    CUDA_OK(cudaStreamSynchronize(s));
    EXPECT_FALSE(rec.pending()) << rec.message();
    expect_routed(c, in, out, rows, m, 0.0f, "graph replay, m = " + std::to_string(m));
  }
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace epkit::moe
