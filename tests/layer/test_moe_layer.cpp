// GPU suite of MoELayer against the host reference of the same math (ref::moe_layer), run as N
// processes under epkit-run (several PEs on one GPU give world sizes 2 and 4 there).
//   test_moe_layer [--dp D] [--deepseek] [gtest flags]
// For every schedule and both expert layouts, and m in {0, 1, odd, max} on the host and through a
// device count inside one captured graph, each rank checks:
//   1. the gate logits against a double-precision host GEMM of the same bf16 inputs;
//   2. the routing exactly against ref::route of the device's logits (the router's math is shared
//      bit for bit with the reference);
//   3. the output against ref::moe_layer with that routing (tolerance below), rows >= m untouched.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "epkit/all_to_all.hpp"
#include "reference/moe/reference.hpp"
#include "reference/moe/reference_layer.hpp"
#include "epkit/moe_layer.hpp"
#include "harness.hpp"
#include "reference/moe/numerics.hpp"

namespace epkit::test {
namespace {

// A MoELayer of the test's world: collective, or the single-process one (EPKIT_TEST_SINGLE_PROCESS).
std::unique_ptr<MoELayer> make_layer(const MoELayerConfig& cfg, const MoELayerWeights& w) {
  const Communicator* c = communicator();
  return c ? std::make_unique<MoELayer>(*c, cfg, w) : std::make_unique<MoELayer>(cfg, w);
}

int g_dp = 1;
bool g_deepseek = false;

// A random e4m3 code of magnitude <= 3.75 (exponent field <= 8): no NaN, no saturation.
uint8_t random_code(std::mt19937_64& rng) {
  const uint64_t r = rng();
  return static_cast<uint8_t>(((r & 1) << 7) | ((r >> 1) % 9) << 3 | ((r >> 8) & 7));
}

// All E experts (every rank generates the same from the shared seed and uploads its local ones).
struct Model {
  MoELayerConfig cfg;
  std::vector<std::vector<uint8_t>> w13, w2;
  std::vector<std::vector<float>> w13s, w2s;
  std::vector<uint8_t> sw13, sw2;
  std::vector<float> sw13s, sw2s;
  std::vector<uint16_t> gate;  // [E, H] bf16 bits
  std::vector<float> bias;     // [E]
  std::vector<ref::Fp8Expert> experts;
  ref::Fp8Expert shared;
};

void fill_expert(std::mt19937_64& rng, int n, int k, std::vector<uint8_t>& q, std::vector<float>& s) {
  q.resize(static_cast<size_t>(n) * k);
  for (auto& c : q) c = random_code(rng);
  s.resize(static_cast<size_t>((n + 127) / 128) * ((k + 127) / 128));
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  for (auto& v : s) v = u(rng) / std::sqrt(static_cast<float>(k)) * 0.5f;
}

Model make_model(const MoELayerConfig& cfg, uint64_t seed, float skew_bias) {
  Model md;
  md.cfg = cfg;
  std::mt19937_64 rng(seed);
  const int E = cfg.num_experts, H = cfg.hidden, I = cfg.intermediate, Is = shared_intermediate(cfg);
  md.w13.resize(E), md.w2.resize(E), md.w13s.resize(E), md.w2s.resize(E);
  for (int e = 0; e < E; ++e) {
    fill_expert(rng, 2 * I, H, md.w13[e], md.w13s[e]);
    fill_expert(rng, H, I, md.w2[e], md.w2s[e]);
  }
  if (cfg.num_shared_experts) {
    fill_expert(rng, 2 * Is, H, md.sw13, md.sw13s);
    fill_expert(rng, H, Is, md.sw2, md.sw2s);
  }
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  md.gate.resize(static_cast<size_t>(E) * H);
  for (auto& g : md.gate) g = ref::float_to_bf16(u(rng) * 2.0f / std::sqrt(static_cast<float>(H)));
  md.bias.resize(E);
  for (int e = 0; e < E; ++e) md.bias[e] = 0.05f * u(rng) + (e < cfg.topk ? skew_bias : 0.f);
  for (int e = 0; e < E; ++e) md.experts.push_back({md.w13[e].data(), md.w13s[e].data(), md.w2[e].data(), md.w2s[e].data()});
  md.shared = {md.sw13.data(), md.sw13s.data(), md.sw2.data(), md.sw2s.data()};
  return md;
}

// This rank's weights on the device.
struct DeviceModel {
  DeviceBuffer w13, w13s, w2, w2s, sw13, sw13s, sw2, sw2s, gate, bias;
  MoELayerWeights views;
};

template <typename T>
DeviceBuffer upload(const T* p, size_t n) {
  DeviceBuffer b(n * sizeof(T));
  if (n) EXPECT_EQ(cudaMemcpy(b.ptr, p, n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return b;
}

void make_device_model(const Model& md, DeviceModel& d) {
  const MoELayerConfig& c = md.cfg;
  const int L = num_local_experts(c), e0 = c.rank * L, H = c.hidden, I = c.intermediate, Is = shared_intermediate(c);
  std::vector<uint8_t> w13, w2;
  std::vector<float> w13s, w2s;
  for (int e = e0; e < e0 + L; ++e) {
    w13.insert(w13.end(), md.w13[e].begin(), md.w13[e].end());
    w2.insert(w2.end(), md.w2[e].begin(), md.w2[e].end());
    w13s.insert(w13s.end(), md.w13s[e].begin(), md.w13s[e].end());
    w2s.insert(w2s.end(), md.w2s[e].begin(), md.w2s[e].end());
  }
  d.w13 = upload(w13.data(), w13.size()), d.w2 = upload(w2.data(), w2.size());
  d.w13s = upload(w13s.data(), w13s.size()), d.w2s = upload(w2s.data(), w2s.size());
  const int64_t b = 128;
  auto blk = [&](int64_t n) { return (n + b - 1) / b; };
  d.views.w13 = Tensor(d.w13.ptr, DType::kFP8E4M3, {L, 2 * I, H});
  d.views.w13_scale = Tensor(d.w13s.ptr, DType::kFP32, {L, blk(2 * I), blk(H)});
  d.views.w2 = Tensor(d.w2.ptr, DType::kFP8E4M3, {L, H, I});
  d.views.w2_scale = Tensor(d.w2s.ptr, DType::kFP32, {L, blk(H), blk(I)});
  if (c.num_shared_experts) {
    d.sw13 = upload(md.sw13.data(), md.sw13.size()), d.sw2 = upload(md.sw2.data(), md.sw2.size());
    d.sw13s = upload(md.sw13s.data(), md.sw13s.size()), d.sw2s = upload(md.sw2s.data(), md.sw2s.size());
    d.views.shared_w13 = Tensor(d.sw13.ptr, DType::kFP8E4M3, {2 * Is, H});
    d.views.shared_w13_scale = Tensor(d.sw13s.ptr, DType::kFP32, {blk(2 * Is), blk(H)});
    d.views.shared_w2 = Tensor(d.sw2.ptr, DType::kFP8E4M3, {H, Is});
    d.views.shared_w2_scale = Tensor(d.sw2s.ptr, DType::kFP32, {blk(H), blk(Is)});
  }
  d.gate = upload(md.gate.data(), md.gate.size());
  d.bias = upload(md.bias.data(), md.bias.size());
  d.views.gate = Tensor(d.gate.ptr, DType::kBF16, {c.num_experts, H});
  d.views.gate_bias = Tensor(d.bias.ptr, DType::kFP32, {c.num_experts});
}

template <typename T>
std::vector<T> download(const void* p, size_t n) {
  std::vector<T> h(n);
  if (n) EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

// Tolerance of the layer output, relative to the norm of sum_k |w y| + |shared| (out_abs):
// the device differs from the reference only in the GEMMs' fp32 accumulation order (vs double).
// That moves a bf16-rounded GEMM output by one bf16 step (2^-8) for a small fraction of elements
// (those within ~1e-6 of a rounding boundary), which can move one e4m3 code of the activation by one
// step (2^-3 of that element) or, through the block's amax, one 128-element block's scale; one such
// event changes an output row by well under 1e-2 of its norm, and they are rare. Across ranks the
// partials are also rounded to bf16 once more (2^-9). So: 1e-2 on the Frobenius norm over all rows,
// 3e-2 per row (a wrong expert or a permuted token gives errors of order 1). The aggregate bound
// needs rows to average over: with fewer than kFrobMinRows rows the per-row bound alone applies (one
// token with every top-k expert's block scales moved has been seen at 1.08e-2, skewed routing, m = 1).
constexpr double kFrobTol = 1e-2, kRowTol = 3e-2;
constexpr int kFrobMinRows = 4;

struct CaseResult {
  std::string problem;
};

// Checks one forward of m tokens of DP group g: logits, routing, output and the untouched rows.
std::string check_forward(MoELayer& layer, const Model& md, const std::vector<uint16_t>& x, int m, int rows,
                          bool device_m, const DeviceBuffer& out_dev) {
  const MoELayerConfig& c = md.cfg;
  const int E = c.num_experts, K = c.topk, H = c.hidden;
  // kMicrobatch: half 0 holds the first ceil(n / 2) rows, n = m on the host or the rows of x.
  const int halves = c.schedule == MoESchedule::kMicrobatch ? 2 : 1, split = ((device_m ? rows : m) + 1) / 2;
  // Gather the routing of both halves into token order.
  std::vector<float> logits(static_cast<size_t>(m) * E);
  std::vector<int32_t> idx(static_cast<size_t>(m) * K);
  std::vector<float> w(static_cast<size_t>(m) * K);
  for (int h = 0; h < halves; ++h) {
    const int t0 = halves == 1 ? 0 : (h == 0 ? 0 : split);
    const int n = halves == 1 ? m : (h == 0 ? std::min(m, split) : std::max(0, m - split));
    if (n == 0) continue;
    const MoELayer::Routing r = layer.routing(h);
    auto lg = download<float>(r.logits.data, static_cast<size_t>(n) * E);
    auto ix = download<int32_t>(r.topk_idx.data, static_cast<size_t>(n) * K);
    auto ww = download<float>(r.topk_weights.data, static_cast<size_t>(n) * K);
    std::copy(lg.begin(), lg.end(), logits.begin() + static_cast<size_t>(t0) * E);
    std::copy(ix.begin(), ix.end(), idx.begin() + static_cast<size_t>(t0) * K);
    std::copy(ww.begin(), ww.end(), w.begin() + static_cast<size_t>(t0) * K);
  }
  // 1. Logits: bf16 inputs are exact, fp32 accumulation over H terms: |err| <= H * 2^-23 * sum|x g|.
  for (int t = 0; t < m; ++t)
    for (int e = 0; e < E; ++e) {
      double acc = 0, mag = 0;
      for (int k = 0; k < H; ++k) {
        const double p = static_cast<double>(ref::bf16_to_float(x[static_cast<size_t>(t) * H + k])) *
                         ref::bf16_to_float(md.gate[static_cast<size_t>(e) * H + k]);
        acc += p, mag += std::fabs(p);
      }
      const double got = logits[static_cast<size_t>(t) * E + e];
      if (!(std::fabs(got - acc) <= 1e-5 * mag + 1e-6))
        return "logit[" + std::to_string(t) + "][" + std::to_string(e) + "] = " + std::to_string(got) + ", host " +
               std::to_string(acc);
    }
  // 2. Routing: exact, against the reference router on the device's own logits.
  std::vector<int32_t> ridx(idx.size());
  std::vector<float> rw(w.size());
  ref::route(router_config(c), m, logits.data(),
             c.router_mode == moe::RouterMode::kGroupedTopK ? md.bias.data() : nullptr, ridx.data(), rw.data());
  for (size_t i = 0; i < idx.size(); ++i)
    if (idx[i] != ridx[i] || ref::float_to_bits(w[i]) != ref::float_to_bits(rw[i]))
      return "routing entry " + std::to_string(i) + ": device (" + std::to_string(idx[i]) + ", " + std::to_string(w[i]) +
             "), reference (" + std::to_string(ridx[i]) + ", " + std::to_string(rw[i]) + ")";
  // 3. Output.
  ref::LayerReferenceShape rs;
  rs.hidden = H, rs.intermediate = c.intermediate, rs.topk = K, rs.ue8m0 = c.ue8m0_scales;
  rs.shared_intermediate = c.num_shared_experts ? shared_intermediate(c) : 0;
  std::vector<float> want(static_cast<size_t>(m) * H), mag(want.size());
  ref::moe_layer(rs, m, x.data(), idx.data(), w.data(), md.experts, md.shared, want.data(), mag.data());
  const auto out = download<uint16_t>(out_dev.ptr, static_cast<size_t>(rows) * H);
  double err2 = 0, mag2 = 0;
  for (int t = 0; t < m; ++t) {
    double e2 = 0, m2 = 0;
    for (int i = 0; i < H; ++i) {
      const size_t k = static_cast<size_t>(t) * H + i;
      const float got = ref::bf16_to_float(out[k]);
      if (!std::isfinite(got)) {
        // Which rows were left unwritten tells the schedule's halves apart.
        int unwritten = 0, first = -1, last = -1;
        for (int r = 0; r < m; ++r)
          if (!std::isfinite(ref::bf16_to_float(out[static_cast<size_t>(r) * H]))) {
            ++unwritten, last = r;
            if (first < 0) first = r;
          }
        return "out[" + std::to_string(t) + "][" + std::to_string(i) + "] is not finite (" + std::to_string(unwritten) +
               " of " + std::to_string(m) + " rows unwritten, rows " + std::to_string(first) + ".." +
               std::to_string(last) + ")";
      }
      e2 += (got - want[k]) * static_cast<double>(got - want[k]);
      m2 += static_cast<double>(mag[k]) * mag[k];
    }
    if (std::sqrt(e2) > kRowTol * std::sqrt(m2) + 1e-6)
      return "row " + std::to_string(t) + ": relative error " + std::to_string(std::sqrt(e2 / std::max(m2, 1e-30))) +
             " > " + std::to_string(kRowTol);
    err2 += e2, mag2 += m2;
  }
  if (m >= kFrobMinRows && std::sqrt(err2) > kFrobTol * std::sqrt(mag2))
    return "relative Frobenius error " + std::to_string(std::sqrt(err2 / mag2)) + " > " + std::to_string(kFrobTol);
  // Rows >= m keep their poison (0xffff: a bf16 NaN pattern).
  for (size_t k = static_cast<size_t>(m) * H; k < out.size(); ++k)
    if (out[k] != 0xffff) return "row " + std::to_string(k / H) + " >= m = " + std::to_string(m) + " was written";
  return "";
}

MoELayerConfig base_config(MoESchedule sched, ExpertLayout layout) {
  MoELayerConfig c;
  if (g_deepseek) {
    c.hidden = 7168, c.intermediate = 2048, c.num_experts = 8 * comm().world_size(), c.topk = 4;
    c.num_groups = 4, c.topk_groups = 2, c.routed_scaling = 2.5f, c.shared_intermediate = 2048;
    c.max_tokens_per_rank = 6;
  } else {
    c.hidden = 512, c.intermediate = 256, c.num_experts = 16, c.topk = 4;
    c.num_groups = 4, c.topk_groups = 2, c.routed_scaling = 2.5f, c.shared_intermediate = 384;
    c.max_tokens_per_rank = 24;
  }
  c.router_mode = moe::RouterMode::kGroupedTopK;
  c.num_shared_experts = 1;
  c.world_size = comm().world_size(), c.rank = comm().rank(), c.dp_size = g_dp;
  c.schedule = sched;
  c.layout = layout;
  return c;
}

// The tokens of this rank's DP group (identical on the group's ranks).
std::vector<uint16_t> group_tokens(const MoELayerConfig& c, int rows, uint64_t seed) {
  std::mt19937_64 rng(seed + static_cast<uint64_t>(c.rank / c.dp_size) * 7919);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<uint16_t> x(static_cast<size_t>(rows) * c.hidden);
  for (auto& v : x) v = ref::float_to_bf16(u(rng));
  return x;
}

// One layer object, checked for host m in `host_ms`, then inside one captured graph (device m)
// replayed for every m in `graph_ms`. borrowed_wad >= 0: the layer borrows AllToAll objects of
// all_to_all_config() with weights_at_dispatch = borrowed_wad (the layer follows their choice),
// else it owns its own.
void run_case(MoESchedule sched, ExpertLayout layout, float skew, uint64_t case_id, bool shared_concurrent = true,
              int borrowed_wad = -1) {
  MoELayerConfig cfg = base_config(sched, layout);
  cfg.shared_concurrent = shared_concurrent;
  const std::string what = std::string("schedule ") + schedule_name(sched) + ", layout " + layout_name(layout) +
                           (shared_concurrent ? "" : ", shared expert in stream order") +
                           ", W " + std::to_string(cfg.world_size) + ", dp " + std::to_string(cfg.dp_size) +
                           (skew > 0 ? ", skewed routing" : "") +
                           (borrowed_wad < 0 ? ""
                                             : ", borrowed objects with weights_at_dispatch = " +
                                                   std::to_string(borrowed_wad));
  const uint64_t seed = case_seed(case_id);
  const Model md = make_model(cfg, seed, skew);
  DeviceModel dm;
  make_device_model(md, dm);
  std::vector<std::unique_ptr<AllToAll>> objects;
  std::vector<AllToAll*> borrowed;
  if (borrowed_wad >= 0) {
    AllToAllConfig a = all_to_all_config(cfg, microbatch_split(cfg));
    a.weights_at_dispatch = borrowed_wad == 1;
    for (int h = 0; h < (sched == MoESchedule::kMicrobatch ? 2 : 1); ++h) {
      objects.push_back(make_all_to_all(a));
      borrowed.push_back(objects.back().get());
    }
  }
  std::unique_ptr<MoELayer> owner = borrowed_wad >= 0 ? std::make_unique<MoELayer>(borrowed, cfg, dm.views)
                                                      : make_layer(cfg, dm.views);
  MoELayer& layer = *owner;
  const int M = cfg.max_tokens_per_rank;
  const std::vector<uint16_t> x = group_tokens(cfg, M, seed);
  DeviceBuffer xd = upload(x.data(), x.size()), out(static_cast<size_t>(M) * cfg.hidden * 2), mdev(4);
  cudaStream_t st;
  CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  MoEBatch b;
  b.x = Tensor(xd.ptr, DType::kBF16, {M, cfg.hidden});
  b.out = Tensor(out.ptr, DType::kBF16, {M, cfg.hidden});
  // Host m: 0, 1, an odd count, all rows.
  for (int m : {0, 1, (M / 2) | 1, M}) {
    CUDA_OK(cudaMemset(out.ptr, 0xff, out.bytes));
    b.num_tokens = m, b.num_tokens_device = nullptr;
    std::string problem;
    try {
      layer.forward(b, st);
      CUDA_OK(cudaStreamSynchronize(st));
      layer.check();
      problem = check_forward(layer, md, x, m, M, false, out);
    } catch (const std::exception& e) {
      problem = std::string("threw: ") + e.what();
    }
    AGREE_OR_FAIL(problem, what + ", host m = " + std::to_string(m));
  }
  // Device m, one graph, replayed with changing m.
  b.num_tokens = -1, b.num_tokens_device = static_cast<const int32_t*>(mdev.ptr);
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ge = nullptr;
  std::string cap_problem;
  try {
    CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    layer.forward(b, st);
    CUDA_OK(cudaStreamEndCapture(st, &g));
    CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
  } catch (const std::exception& e) {
    cap_problem = std::string("capture threw: ") + e.what();
    cudaStreamEndCapture(st, &g);
  }
  AGREE_OR_FAIL(cap_problem, what + ", capture");
  for (int m : {M, 1, 0, M - 3}) {
    CUDA_OK(cudaMemset(out.ptr, 0xff, out.bytes));
    CUDA_OK(cudaMemcpy(mdev.ptr, &m, 4, cudaMemcpyHostToDevice));
    std::string problem;
    try {
      CUDA_OK(cudaGraphLaunch(ge, st));
      CUDA_OK(cudaStreamSynchronize(st));
      layer.check();
      problem = check_forward(layer, md, x, m, M, true, out);
    } catch (const std::exception& e) {
      problem = std::string("threw: ") + e.what();
    }
    AGREE_OR_FAIL(problem, what + ", graph replay with device m = " + std::to_string(m));
  }
  // A device m above the rows is clamped and reported (not written past the buffers).
  {
    const int bad = M + 5;
    CUDA_OK(cudaMemcpy(mdev.ptr, &bad, 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaGraphLaunch(ge, st));
    CUDA_OK(cudaStreamSynchronize(st));
    std::string problem = "device m = " + std::to_string(bad) + " above the rows was not reported";
    try {
      layer.check();
    } catch (const Error& e) {
      problem = std::string(e.what()).find(std::to_string(bad)) == std::string::npos
                    ? std::string("the report does not name m: ") + e.what()
                    : "";
    }
    AGREE_OR_FAIL(problem, what + ", device m above the rows");
  }
  if (ge) cudaGraphExecDestroy(ge);
  if (g) cudaGraphDestroy(g);
  cudaStreamDestroy(st);
}

class MoELayerTest : public ::testing::TestWithParam<std::tuple<MoESchedule, ExpertLayout>> {};

TEST_P(MoELayerTest, MatchesReference) {
  const auto [sched, layout] = GetParam();
  run_case(sched, layout, 0.f, 100 + static_cast<int>(sched) * 2 + static_cast<int>(layout));
}

TEST_P(MoELayerTest, SkewedRoutingUpToCapacity) {
  if (g_deepseek) GTEST_SKIP() << "covered by the small shapes";
  // A large correction bias on experts 0..K-1: every token of every group picks them, so each of
  // them receives M * (W / D) tokens, the default capacity.
  const auto [sched, layout] = GetParam();
  run_case(sched, layout, 50.f, 200 + static_cast<int>(sched) * 2 + static_cast<int>(layout));
}

INSTANTIATE_TEST_SUITE_P(Schedules, MoELayerTest,
                         ::testing::Combine(::testing::Values(MoESchedule::kNone, MoESchedule::kDispatchOverlap,
                                                              MoESchedule::kMicrobatch),
                                            ::testing::Values(ExpertLayout::kMasked, ExpertLayout::kPacked)),
                         [](const auto& info) {
                           return std::string(schedule_name(std::get<0>(info.param))) + "_" +
                                  layout_name(std::get<1>(info.param));
                         });

// Schedule none with the shared expert in stream order (shared_concurrent = false; the default runs
// it on a branch of its own, covered above).
TEST(MoELayerSharedInStream, MatchesReference) {
  run_case(MoESchedule::kNone, ExpertLayout::kMasked, 0.f, 300, false);
}

// Borrowed AllToAll objects (one set of symmetric buffers for several layers): the layer sends the
// router weights where the objects take them, with dispatch (all_to_all_config's choice) or with
// combine. Two halves under kMicrobatch, so both objects are used.
TEST(MoELayerBorrowed, FollowsTheObjectsWeightsChoice) {
  if (g_deepseek) GTEST_SKIP() << "covered by the small shapes";
  for (int wad : {1, 0}) run_case(MoESchedule::kMicrobatch, ExpertLayout::kMasked, 0.f, 400 + wad, true, wad);
}

TEST(MoELayerBorrowed, MismatchedObjectRejected) {
  const MoELayerConfig c = base_config(MoESchedule::kNone, ExpertLayout::kMasked);
  AllToAllConfig a = all_to_all_config(c, microbatch_split(c));
  a.max_tokens_per_rank += 1;
  auto obj_owner = make_all_to_all(a);
  AllToAll& obj = *obj_owner;
  Model md = make_model(c, 2, 0.f);
  DeviceModel dm;
  make_device_model(md, dm);
  try {
    MoELayer layer(std::vector<AllToAll*>{&obj}, c, dm.views);
    ADD_FAILURE() << "an AllToAll of another max_tokens_per_rank was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_tokens_per_rank"), std::string::npos) << e.what();
  }
}

TEST(MoELayerConfigChecks, BadConfigRejectedBeforeLaunch) {
  MoELayerConfig c = base_config(MoESchedule::kNone, ExpertLayout::kMasked);
  c.hidden = 500;
  EXPECT_THROW(validate(c), Error);
  c = base_config(MoESchedule::kNone, ExpertLayout::kMasked);
  Model md = make_model(c, 1, 0.f);
  DeviceModel dm;
  make_device_model(md, dm);
  MoELayerWeights w = dm.views;
  w.w2.shape[1] += 1;
  try {
    auto layer_owner = make_layer(c, w);
    MoELayer& layer = *layer_owner;
    ADD_FAILURE() << "a w2 of the wrong shape was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("w2"), std::string::npos) << e.what();
  }
}

void parse(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--dp") && i + 1 < argc) g_dp = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--deepseek")) g_deepseek = true;
  }
}

}  // namespace
}  // namespace epkit::test

int main(int argc, char** argv) { return epkit::test::gpu_test_main(argc, argv, epkit::test::parse); }
