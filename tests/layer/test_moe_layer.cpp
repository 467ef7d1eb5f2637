// GPU suite of MoELayer against the host reference of the same math (ref::moe_layer), run as N
// processes under epkit-run (several PEs on one GPU give world sizes 2 and 4 there).
//   test_moe_layer [--dp D] [--deepseek] [--quick] [gtest flags]
// --quick (scripts/sanitize.sh): one host m and two graph replays per case instead of four and four.
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
#include "epkit/moe_layer.hpp"
#include "harness.hpp"
#include "layer_model.hpp"

namespace epkit::test {
namespace {

int g_dp = 1;
bool g_deepseek = false;
bool g_quick = false;  // --quick: fewer m per case (the sanitizer runs)

MoELayerConfig base_config(MoESchedule sched, ExpertLayout layout) {
  return epkit::test::base_config(sched, layout, g_deepseek, g_dp, comm().world_size(), comm().rank());
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
  // Host m: 0, 1, an odd count, all rows (--quick: the odd count).
  const std::vector<int> host_ms = g_quick ? std::vector<int>{(M / 2) | 1} : std::vector<int>{0, 1, (M / 2) | 1, M};
  for (int m : host_ms) {
    CUDA_OK(cudaMemsetAsync(out.ptr, 0xff, out.bytes, st));  // on st: see the graph replays below
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
  const std::vector<int> graph_ms = g_quick ? std::vector<int>{M, 0} : std::vector<int>{M, 1, 0, M - 3};
  for (int m : graph_ms) {
    // The poison and m go on st, the graph's stream: a memset or a pageable cudaMemcpy on the legacy
    // stream is not ordered before a non-blocking stream's work (the copy may return before its DMA
    // lands), and the replay could read the previous m or be overwritten by the poison.
    CUDA_OK(cudaMemsetAsync(out.ptr, 0xff, out.bytes, st));
    CUDA_OK(cudaMemcpyAsync(mdev.ptr, &m, 4, cudaMemcpyHostToDevice, st));
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
    CUDA_OK(cudaMemcpyAsync(mdev.ptr, &bad, 4, cudaMemcpyHostToDevice, st));
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
    else if (!std::strcmp(argv[i], "--quick")) g_quick = true;
  }
}

}  // namespace
}  // namespace epkit::test

int main(int argc, char** argv) { return epkit::test::gpu_test_main(argc, argv, epkit::test::parse); }
