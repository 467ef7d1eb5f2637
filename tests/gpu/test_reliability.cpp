// Reliability suite (docs/RELIABILITY.md): bad input gets a clear error and leaves the object usable; device-
// side errors are reported, never written past a buffer; a long randomized stress run matches the
// reference on every iteration.
//   test_reliability [--stress N] [gtest flags]      (run under epkit-run)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include "harness.hpp"

namespace epkit::test {
namespace {

int g_stress_iters = 10000;

AllToAllConfig small_config(int dp, int capacity = 0) {
  AllToAllConfig c;
  c.world_size = comm().world_size();
  c.rank = comm().rank();
  c.dp_size = dp;
  c.num_experts = 4 * c.world_size;
  c.topk = 4;
  c.hidden = 256;
  c.max_tokens_per_rank = 16;
  c.dispatch_dtype = DType::kFP8E4M3;
  c.capacity = capacity;
  return c;
}

// Runs one checked layer; returns "" or the problem.
std::string good_layer(AllToAll& a2a, const AllToAllConfig& cfg, RankBuffers& b, cudaStream_t st, uint64_t seed,
                       int m = 9) {
  try {
    const auto groups = make_inputs(cfg, Routing::kUniform, m, seed);
    b.upload(cfg, groups[cfg.rank / cfg.dp_size], st);
    a2a.dispatch(b.dispatch_args(cfg, m, false), st);
    launch_expert(cfg, b, st);
    a2a.combine(b.combine_args(cfg, m, false), st);
    if (cudaStreamSynchronize(st) != cudaSuccess) return "stream sync failed";
    a2a.check();
    std::string p = check_dispatch(cfg, groups, b);
    return p.empty() ? check_combine(cfg, groups, b) : p;
  } catch (const std::exception& e) {
    return e.what();
  }
}

// Runs dispatch, expert and combine with the given arguments, then check(). A recoverable error
// may surface from combine (after it launched) or from check(); either way the stream is drained
// first, so the caller can read the outputs.
void layer_then_check(AllToAll& a2a, const AllToAllConfig& cfg, const RankBuffers& b, int m, bool device_m,
                      cudaStream_t st) {
  a2a.dispatch(b.dispatch_args(cfg, m, device_m), st);
  launch_expert(cfg, b, st);
  try {
    a2a.combine(b.combine_args(cfg, m, device_m), st);
  } catch (...) {
    cudaStreamSynchronize(st);
    throw;
  }
  cudaStreamSynchronize(st);
  a2a.check();
}

// Expects fn to throw epkit::Error whose message contains `needle`.
std::string expect_error(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
  } catch (const Error& e) {
    if (std::string(e.what()).find(needle) == std::string::npos)
      return std::string("error message '") + e.what() + "' lacks '" + needle + "'";
    return "";
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "expected an epkit::Error containing '" + needle + "', nothing was thrown";
}

TEST(Reliability, BadHostInputThrowsAndObjectStaysUsable) {
  const AllToAllConfig cfg = small_config(1);
  auto a2a_owner = make_all_to_all(cfg);
  AllToAll& a2a = *a2a_owner;
  RankBuffers b;
  b.allocate(cfg, DType::kInt32);
  cudaStream_t st;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  const int M = cfg.max_tokens_per_rank, H = cfg.hidden, K = cfg.topk;
  std::string problem = good_layer(a2a, cfg, b, st, case_seed(1));
  int cases = 0;
  auto bad = [&](const std::function<void(DispatchArgs&, CombineArgs&)>& mutate, bool on_dispatch,
                 const std::string& needle) {
    if (!problem.empty()) return;
    DispatchArgs d = b.dispatch_args(cfg, 5, false);
    CombineArgs c = b.combine_args(cfg, 5, false);
    mutate(d, c);
    problem = on_dispatch ? expect_error([&] { a2a.dispatch(d, st); }, needle)
                          : expect_error([&] {
                              a2a.dispatch(b.dispatch_args(cfg, 5, false), st);
                              try {
                                a2a.combine(c, st);
                              } catch (...) {  // leave the object ready for the next layer
                                a2a.combine(b.combine_args(cfg, 5, false), st);
                                throw;
                              }
                            }, needle);
    ++cases;
    if (problem.empty()) problem = good_layer(a2a, cfg, b, st, case_seed(100 + cases));
  };
  bad([&](auto& d, auto&) { d.x.dtype = DType::kBF16; }, true, "x has dtype bf16, expected fp8_e4m3");
  bad([&](auto& d, auto&) { d.x.shape[1] = H + 16; }, true, "x has shape");
  bad([&](auto& d, auto&) { d.topk_idx.shape[1] = K + 1; }, true, "topk_idx has shape");
  bad([&](auto& d, auto&) { d.topk_idx.dtype = DType::kFP32; }, true, "topk_idx has dtype fp32");
  bad([&](auto& d, auto&) { d.num_tokens = M + 1; }, true, "exceeds max_tokens_per_rank");
  bad([&](auto& d, auto&) { d.num_tokens = -3; }, true, "num_tokens = -3");
  bad([&](auto& d, auto&) { d.x.shape[0] = 3; }, true, "exceeds the tensors' first dimension = 3");
  bad([&](auto& d, auto&) { d.x_scale = Tensor(); }, true, "x_scale is missing");
  bad([&](auto& d, auto&) { d.num_tokens_device = b.m_dev.as<int32_t>(); }, true, "not both");
  bad([&](auto& d, auto&) { d.expert_x.shape[1] = 7; }, true, "expert_x has shape");
  bad([&](auto& d, auto&) { d.expert_num_tokens.dtype = DType::kInt64; }, true, "expert_num_tokens has dtype");
  bad([&](auto&, auto& c) { c.out.dtype = DType::kFP32; }, false, "out has dtype fp32, expected bf16 or fp16");
  bad([&](auto&, auto& c) { c.topk_weights.dtype = DType::kBF16; }, false, "topk_weights has dtype bf16");
  bad([&](auto&, auto& c) { c.expert_y.shape[2] = H / 2; }, false, "expert_y has shape");
  bad([&](auto&, auto& c) { c.expert_y.data = nullptr; }, false, "expert_y is missing");
  // Calls out of order.
  if (problem.empty()) {
    problem = expect_error([&] { a2a.combine(b.combine_args(cfg, 5, false), st); }, "out of order");
    ++cases;
  }
  if (problem.empty()) {
    problem = expect_error([&] { a2a.dispatch_recv(b.dispatch_args(cfg, 5, false), st); }, "out of order");
    ++cases;
  }
  if (problem.empty()) problem = good_layer(a2a, cfg, b, st, case_seed(999));
  cudaStreamDestroy(st);
  AGREE_OR_FAIL(problem, "bad host input");
  if (comm().rank() == 0) std::printf("BadHostInput: %d bad inputs rejected, object usable after each\n", cases);
}

TEST(Reliability, BadConfigsAreRejectedOnEveryRank) {
  std::string problem;
  AllToAllConfig c = small_config(1);
  c.topk = 17;
  problem = expect_error([&] { auto a_owner = make_all_to_all(c);
  AllToAll& a = *a_owner; }, "topk = 17 must be in [1, 16]");
  if (problem.empty() && comm().world_size() > 1) {  // a disagreement needs two ranks
    c = small_config(1);
    c.hidden = comm().rank() == 0 ? 256 : 512;
    problem = expect_error([&] { auto a_owner = make_all_to_all(c);
  AllToAll& a = *a_owner; }, "config mismatch on field 'hidden'");
  }
  if (problem.empty() && comm().world_size() > 1) {  // every E is a multiple of world size 1
    c = small_config(1);
    c.num_experts = 4 * c.world_size + 1;
    problem = expect_error([&] { auto a_owner = make_all_to_all(c);
  AllToAll& a = *a_owner; }, "must be a multiple of world_size");
  }
  AGREE_OR_FAIL(problem, "bad configs");
}

TEST(Reliability, DeviceSideErrorsAreReportedNotWritten) {
  cudaStream_t st;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  const int G = comm().world_size();
  // 1) An expert index >= E on the token the sender of group 0, token 0 owns. At world size 1, 6
  // tokens (24 entries) and 16 (64) take the two small dispatches (local.cu: tiny and scan).
  for (const int m : {6, 16}) {
    const AllToAllConfig cfg = small_config(1);
    auto a2a_owner = make_all_to_all(cfg);
    AllToAll& a2a = *a2a_owner;
    RankBuffers b;
    b.allocate(cfg, DType::kInt64);
    std::string problem;
    try {
      auto groups = make_inputs(cfg, Routing::kUniform, m, case_seed(7 + 1000 * m));
      groups[0].topk_idx[1] = cfg.num_experts + 5;
      b.upload(cfg, groups[cfg.rank / cfg.dp_size], st);
      const bool owner = cfg.rank == dp_sender_rank(cfg, 0, 0);
      // Raised at the end of the layer (after combine launched) or by check(), never mid-layer.
      auto layer = [&] { layer_then_check(a2a, cfg, b, m, false, st); };
      std::string err;
      if (owner) err = expect_error(layer, "but num_experts = " + std::to_string(cfg.num_experts));
      else layer();
      // The bad entry is skipped everywhere; everything else must still match the reference (which
      // skips indices outside [0, E) too).
      problem = err.empty() ? check_dispatch(cfg, groups, b) : err;
      if (problem.empty()) problem = check_combine(cfg, groups, b);
    } catch (const std::exception& e) {
      problem = e.what();
    }
    const std::string after = good_layer(a2a, cfg, b, st, case_seed(8));  // every rank, always
    if (problem.empty()) problem = after;
    AGREE_OR_FAIL(problem, "expert index out of range, m = " + std::to_string(m));
  }
  // 2) Device-side m larger than max_tokens_per_rank: clamped to M and reported.
  {
    const AllToAllConfig cfg = small_config(1);
    auto a2a_owner = make_all_to_all(cfg);
    AllToAll& a2a = *a2a_owner;
    RankBuffers b;
    b.allocate(cfg, DType::kInt32);
    std::string problem;
    try {
      const int M = cfg.max_tokens_per_rank;
      const auto groups = make_inputs(cfg, Routing::kUniform, M, case_seed(9));
      b.upload(cfg, groups[cfg.rank / cfg.dp_size], st);
      const int32_t too_many = M + 3;
      cudaMemcpyAsync(b.m_dev.ptr, &too_many, 4, cudaMemcpyHostToDevice, st);  // ordered before the layer on st
      problem = expect_error([&] { layer_then_check(a2a, cfg, b, 0, true, st); },
                             "num_tokens_device holds m = " + std::to_string(M + 3));
      if (problem.empty()) problem = check_dispatch(cfg, groups, b);  // clamped to M: the full batch
      if (problem.empty()) problem = check_combine(cfg, groups, b);
    } catch (const std::exception& e) {
      problem = e.what();
    }
    const std::string after = good_layer(a2a, cfg, b, st, case_seed(10));  // every rank, always
    if (problem.empty()) problem = after;
    AGREE_OR_FAIL(problem, "device m > M");
  }
  // 3) Capacity overflow: capacity = number of groups and every token also routed to expert 0, so
  // expert 0 (on rank 0) overflows and, with this routing, most other experts do too. Every rank
  // whose experts overflow must report it; every count must be clamped to capacity.
  {
    const AllToAllConfig cfg = small_config(1, G);
    auto a2a_owner = make_all_to_all(cfg);
    AllToAll& a2a = *a2a_owner;
    RankBuffers b;
    b.allocate(cfg, DType::kUInt32);
    std::string problem;
    try {
      const int M = cfg.max_tokens_per_rank, K = cfg.topk, L = num_local_experts(cfg);
      auto groups = make_inputs(cfg, Routing::kUniform, M, case_seed(11));
      for (auto& g : groups)
        for (int t = 0; t < M; ++t) g.topk_idx[t * K] = 0;  // expert 0 lives on rank 0
      std::vector<ref::GroupRouting> routing(groups.size());
      for (size_t g = 0; g < groups.size(); ++g) routing[g] = {groups[g].m, groups[g].topk_idx};
      const std::vector<int> want = ref::expert_counts(cfg, cfg.rank, routing);
      bool overflows = false;
      for (int c : want) overflows |= c > G;
      b.upload(cfg, groups[cfg.rank / cfg.dp_size], st);
      auto layer = [&] { layer_then_check(a2a, cfg, b, M, false, st); };
      if (overflows)
        problem = expect_error(layer, "capacity overflow in dispatch_recv on rank " + std::to_string(cfg.rank));
      else
        layer();
      if (cfg.rank == 0 && !overflows) problem = "expert 0 should have overflowed";
      std::vector<int32_t> got(L);
      cudaMemcpy(got.data(), b.expert_num_tokens.ptr, L * 4, cudaMemcpyDeviceToHost);
      for (int el = 0; el < L && problem.empty(); ++el)
        if (got[el] != std::min(want[el], G))
          problem = "expert_num_tokens[" + std::to_string(el) + "] = " + std::to_string(got[el]) + ", expected min(" +
                    std::to_string(want[el]) + ", capacity " + std::to_string(G) + ")";
    } catch (const std::exception& e) {
      problem = e.what();
    }
    // Every rank runs the next layer, whatever happened above, so that none is left waiting.
    const std::string after = good_layer(a2a, cfg, b, st, case_seed(12), 1);  // m = 1 fits capacity
    if (problem.empty()) problem = after;
    AGREE_OR_FAIL(problem, "capacity overflow");
  }
  cudaStreamDestroy(st);
}

// --stress N iterations (10,000 by default; `make test` runs a few hundred): random m and routing (uniform, skewed, masked), alternating between a dp=1 and a
// dp=2 object with their layers interleaved, each result checked against the reference.
TEST(Reliability, StressAgainstReference) {
  const bool dp2_ok = comm().world_size() % 2 == 0;
  const AllToAllConfig c1 = small_config(1);
  const AllToAllConfig c2 = small_config(dp2_ok ? 2 : 1);
  auto a1_owner = make_all_to_all(c1), a2_owner = make_all_to_all(c2);
  AllToAll &a1 = *a1_owner, &a2 = *a2_owner;
  RankBuffers b1, b2;
  b1.allocate(c1, DType::kInt32);
  b2.allocate(c2, DType::kInt64);
  cudaStream_t st;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  const Routing kinds[] = {Routing::kUniform, Routing::kOneExpert, Routing::kOneRank, Routing::kMasked};
  int mismatches = 0, iters = 0;
  std::string first_problem;
  for (int it = 0; it < g_stress_iters; it += 2) {
    const uint64_t s1 = case_seed(200000 + it), s2 = case_seed(200001 + it);
    const int m1 = static_cast<int>(s1 % (c1.max_tokens_per_rank + 1));
    const int m2 = static_cast<int>(s2 % (c2.max_tokens_per_rank + 1));
    std::string p1, p2;
    try {
      const auto g1 = make_inputs(c1, kinds[(s1 >> 8) % 4], m1, s1);
      const auto g2 = make_inputs(c2, kinds[(s2 >> 8) % 4], m2, s2);
      b1.upload(c1, g1[c1.rank / c1.dp_size], st);
      b2.upload(c2, g2[c2.rank / c2.dp_size], st);
      const bool dev = (it / 2) % 2 == 1;
      // Interleaved: both objects' dispatches are in flight before either combines.
      a1.dispatch(b1.dispatch_args(c1, m1, dev), st);
      a2.dispatch_send(b2.dispatch_args(c2, m2, dev), st);
      a2.dispatch_recv(b2.dispatch_args(c2, m2, dev), st);
      launch_expert(c1, b1, st);
      launch_expert(c2, b2, st);
      a2.combine(b2.combine_args(c2, m2, dev), st);
      a1.combine_send(b1.combine_args(c1, m1, dev), st);
      a1.combine_recv(b1.combine_args(c1, m1, dev), st);
      if (cudaStreamSynchronize(st) != cudaSuccess) throw Error("stream sync failed");
      a1.check();
      a2.check();
      p1 = check_dispatch(c1, g1, b1);
      if (p1.empty()) p1 = check_combine(c1, g1, b1);
      p2 = check_dispatch(c2, g2, b2);
      if (p2.empty()) p2 = check_combine(c2, g2, b2);
    } catch (const std::exception& e) {
      p1 = e.what();
    }
    iters += 2;
    mismatches += !p1.empty() + !p2.empty();
    if (first_problem.empty() && !(p1 + p2).empty()) first_problem = "iteration " + std::to_string(it) + ": " + p1 + p2;
    if (!first_problem.empty() && first_problem.find("timed out") != std::string::npos) break;
  }
  cudaStreamDestroy(st);
  AGREE_OR_FAIL(first_problem, "stress");
  if (comm().rank() == 0)
    std::printf("Stress: %d iterations (dp %d and %d interleaved), %d mismatches\n", iters, c1.dp_size, c2.dp_size,
                mismatches);
}

}  // namespace
}  // namespace epkit::test

int main(int argc, char** argv) {
  return epkit::test::gpu_test_main(argc, argv, [](int n, char** v) {
    for (int i = 1; i < n; ++i)
      if (!std::strcmp(v[i], "--stress") && i + 1 < n) epkit::test::g_stress_iters = std::atoi(v[++i]);
  });
}
