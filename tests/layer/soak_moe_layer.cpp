// Soak of the MoE layer (`make soak`): forward after forward, the way a serving engine calls it.
//   soak_moe_layer [--minutes F] [--check-every N] [--json FILE] [--dp D] [gtest flags]
// Run under epkit-run (world size 1 single-process with EPKIT_TEST_SINGLE_PROCESS=1, or several PEs).
// One layer object per schedule (none, dispatch_overlap, microbatch) and layout (masked, packed),
// each with one CUDA graph captured with m on the device. Each iteration picks a layer and a call
// mode (the same on every rank), eager with m on the host, eager with m on the device, or a replay
// of the layer's graph, and a random m in [0, M] per DP group, with fresh tokens. Every N-th output
// is checked against the host reference (layer_model.hpp: logits, routing exactly, output within the
// suite's tolerance, rows >= m untouched); check() runs after every iteration. Device memory is
// sampled (cudaMemGetInfo, at a barrier of all ranks) after a warm-up pass over every layer and
// mode, every 30 s, and at the end: any drop of free memory after the warm-up is growth.
// Fails on any mismatch, any error raised, or any growth. --json writes the report (rank 0).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "epkit/moe_layer.hpp"
#include "epkit/version.hpp"
#include "harness.hpp"
#include "layer_model.hpp"

namespace epkit::test {
namespace {

double g_minutes = 1.0;
int g_check_every = 8;
int g_dp = 1;
std::string g_json;

const char* kModeNames[] = {"eager_host_m", "eager_device_m", "graph_replay"};

struct LayerCase {
  MoESchedule sched;
  ExpertLayout layout;
  std::unique_ptr<Model> md;
  DeviceModel dm;
  std::unique_ptr<MoELayer> layer;
  DeviceBuffer xd, out, mdev;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  int64_t iterations = 0, checks = 0;
  std::string name() const { return std::string(schedule_name(sched)) + "/" + layout_name(layout); }
};

int64_t free_bytes() {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) throw Error("cudaMemGetInfo failed");
  return static_cast<int64_t>(free_b);
}

// Device free memory at a point every rank reaches (no rank allocates or frees in between).
int64_t sample_free() {
  if (cudaDeviceSynchronize() != cudaSuccess) throw Error("cudaDeviceSynchronize failed");
  comm().barrier();
  const int64_t f = free_bytes();
  comm().barrier();
  return f;
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (c == '\n') { o += "\\n"; continue; }
    o += c;
  }
  return o;
}

TEST(MoELayerSoak, ForwardAfterForward) {
  const int W = comm().world_size(), rank = comm().rank();
  cudaStream_t st;
  CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::vector<std::unique_ptr<LayerCase>> cases;
  for (MoESchedule sched : {MoESchedule::kNone, MoESchedule::kDispatchOverlap, MoESchedule::kMicrobatch})
    for (ExpertLayout layout : {ExpertLayout::kMasked, ExpertLayout::kPacked}) {
      auto c = std::make_unique<LayerCase>();
      c->sched = sched, c->layout = layout;
      const MoELayerConfig cfg = base_config(sched, layout, false, g_dp, W, rank);
      c->md = std::make_unique<Model>(make_model(cfg, case_seed(10 + cases.size()), 0.f));
      make_device_model(*c->md, c->dm);
      c->layer = make_layer(cfg, c->dm.views);
      const int M = cfg.max_tokens_per_rank;
      c->xd = DeviceBuffer(static_cast<size_t>(M) * cfg.hidden * 2);
      c->out = DeviceBuffer(static_cast<size_t>(M) * cfg.hidden * 2);
      c->mdev = DeviceBuffer(4);
      CUDA_OK(cudaMemset(c->xd.ptr, 0, c->xd.bytes));
      cases.push_back(std::move(c));
    }
  const MoELayerConfig cfg0 = cases[0]->md->cfg;
  const int M = cfg0.max_tokens_per_rank, H = cfg0.hidden, group = rank / cfg0.dp_size;

  auto batch = [&](LayerCase& c, int mode, int m) {
    MoEBatch b;
    b.x = Tensor(c.xd.ptr, DType::kBF16, {M, H});
    b.out = Tensor(c.out.ptr, DType::kBF16, {M, H});
    b.num_tokens = mode == 0 ? m : -1;
    b.num_tokens_device = mode == 0 ? nullptr : static_cast<const int32_t*>(c.mdev.ptr);
    return b;
  };
  // One iteration on one layer; returns "" or what went wrong (a raised error or a mismatch).
  int64_t checks = 0, mismatches = 0, errors = 0;
  std::vector<std::string> problems;
  auto iterate = [&](LayerCase& c, int mode, int m, uint64_t token_seed, bool check) -> void {
    std::string problem;
    bool raised = false;
    try {
      const std::vector<uint16_t> x = group_tokens(c.md->cfg, M, token_seed);
      // On st, the layer's stream: a copy or memset on the legacy stream is not ordered before work on
      // a non-blocking stream (a pageable cudaMemcpy may return before its DMA lands).
      CUDA_OK(cudaMemcpyAsync(c.xd.ptr, x.data(), x.size() * 2, cudaMemcpyHostToDevice, st));
      if (check) CUDA_OK(cudaMemsetAsync(c.out.ptr, 0xff, c.out.bytes, st));
      if (mode != 0) CUDA_OK(cudaMemcpyAsync(c.mdev.ptr, &m, 4, cudaMemcpyHostToDevice, st));
      if (mode == 2) {
        if (cudaGraphLaunch(c.exec, st) != cudaSuccess) throw Error("cudaGraphLaunch failed");
      } else {
        c.layer->forward(batch(c, mode, m), st);
      }
      if (cudaStreamSynchronize(st) != cudaSuccess) throw Error("stream synchronize failed");
      c.layer->check();
      if (check) {
        ++checks, ++c.checks;
        problem = check_forward(*c.layer, *c.md, x, m, M, mode != 0, c.out);
      }
    } catch (const std::exception& e) {
      problem = e.what();
      raised = true;
    }
    ++c.iterations;
    if (!problem.empty()) {
      (raised ? errors : mismatches)++;
      if (problems.size() < 10)
        problems.push_back(c.name() + " " + kModeNames[mode] + " m=" + std::to_string(m) + ": " + problem);
    }
  };

  // Warm-up: every layer in every mode (the graphs are captured here) and at every m (a first call at
  // an m may set things up, e.g. the gate GEMM's cuBLASLt choice), checked at M; then the baseline.
  for (auto& c : cases) {
    for (int m = 0; m < M; ++m) iterate(*c, 0, m, case_seed(499) + group, false);
    iterate(*c, 0, M, case_seed(500) + group, true);
    CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    c->layer->forward(batch(*c, 1, 0), st);
    CUDA_OK(cudaStreamEndCapture(st, &c->graph));
    CUDA_OK(cudaGraphInstantiate(&c->exec, c->graph, 0));
    iterate(*c, 1, M / 2, case_seed(501) + group, true);
    iterate(*c, 2, 1, case_seed(502) + group, true);
  }
  const int64_t free0 = sample_free();
  int64_t free_min = free0;
  std::vector<std::pair<double, int64_t>> samples{{0.0, free0}};

  std::mt19937_64 shared(case_seed(1000));               // layer, mode, token seed: the same on every rank
  std::mt19937_64 mine(case_seed(2000 + group));          // m: per DP group
  const auto t0 = std::chrono::steady_clock::now();
  const double seconds = g_minutes * 60.0;
  double next_sample = 30.0;
  int64_t it = 0, per_mode[3] = {0, 0, 0};
  for (;;) {
    if (it % 16 == 0) {  // every rank stops at the same iteration: the first check past the deadline
      const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!all_ranks(el < seconds)) break;
      if (el >= next_sample) {
        const int64_t f = sample_free();
        samples.push_back({el, f});
        free_min = std::min(free_min, f);
        next_sample += 30.0;
      }
    }
    ++it;
    LayerCase& c = *cases[shared() % cases.size()];
    const int mode = static_cast<int>(shared() % 3);
    const uint64_t token_seed = shared() + group;
    const int m = static_cast<int>(mine() % (M + 1));
    ++per_mode[mode];
    iterate(c, mode, m, token_seed, it % g_check_every == 0);
  }
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t free1 = sample_free();
  free_min = std::min(free_min, free1);
  samples.push_back({elapsed, free1});
  const int64_t growth = free0 - free_min;

  // Every rank's counts on rank 0.
  const int64_t mine_counts[5] = {checks, mismatches, errors, free0, growth};
  std::vector<int64_t> all(5 * W);
  comm().allgather(mine_counts, sizeof(mine_counts), all.data());
  for (const std::string& p : problems) std::printf("rank %d: %s\n", rank, p.c_str());
  if (rank == 0) {
    int64_t tc = 0, tm = 0, te = 0, tg = 0;
    for (int r = 0; r < W; ++r) tc += all[5 * r], tm += all[5 * r + 1], te += all[5 * r + 2], tg = std::max(tg, all[5 * r + 4]);
    cudaDeviceProp prop{};
    int dev = 0;
    cudaGetDevice(&dev);
    cudaGetDeviceProperties(&prop, dev);
    char date[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    std::printf("soak: W=%d dp=%d %.1f min, %lld iterations (eager host m %lld, eager device m %lld, graph replay %lld), "
                "%lld checks, %lld mismatches, %lld errors, device memory growth %lld bytes (free %lld after warm-up)\n",
                W, g_dp, elapsed / 60, static_cast<long long>(it), static_cast<long long>(per_mode[0]),
                static_cast<long long>(per_mode[1]), static_cast<long long>(per_mode[2]), static_cast<long long>(tc),
                static_cast<long long>(tm), static_cast<long long>(te), static_cast<long long>(tg),
                static_cast<long long>(free0));
    if (!g_json.empty()) {
      std::ofstream f(g_json);
      f << "{\n  \"date\": \"" << date << "\",\n  \"commit\": \"" << epkit::git_commit() << "\",\n"
        << "  \"gpu\": \"" << json_escape(prop.name) << "\",\n  \"world_size\": " << W << ",\n  \"dp_size\": " << g_dp
        << ",\n  \"single_process\": " << (comm().single_process() ? "true" : "false") << ",\n"
        << "  \"minutes\": " << elapsed / 60 << ",\n  \"iterations\": " << it << ",\n"
        << "  \"iterations_by_mode\": {\"eager_host_m\": " << per_mode[0] << ", \"eager_device_m\": " << per_mode[1]
        << ", \"graph_replay\": " << per_mode[2] << "},\n  \"iterations_by_layer\": {";
      for (size_t i = 0; i < cases.size(); ++i)
        f << (i ? ", " : "") << "\"" << cases[i]->name() << "\": " << cases[i]->iterations;
      f << "},\n  \"check_every\": " << g_check_every << ",\n  \"checks\": " << tc << ",\n  \"mismatches\": " << tm
        << ",\n  \"errors\": " << te << ",\n  \"device_free_bytes_after_warmup\": " << free0
        << ",\n  \"device_memory_growth_bytes\": " << tg << ",\n  \"free_bytes_samples_rank0\": [";
      for (size_t i = 0; i < samples.size(); ++i)
        f << (i ? ", " : "") << "[" << samples[i].first << ", " << samples[i].second << "]";
      f << "],\n  \"problems_rank0\": [";
      for (size_t i = 0; i < problems.size(); ++i) f << (i ? ", " : "") << "\"" << json_escape(problems[i]) << "\"";
      f << "]\n}\n";
    }
  }
  for (auto& c : cases) {
    if (c->exec) cudaGraphExecDestroy(c->exec);
    if (c->graph) cudaGraphDestroy(c->graph);
  }
  cudaStreamDestroy(st);
  EXPECT_EQ(mismatches, 0) << "outputs that differ from the host reference (first ones printed above)";
  EXPECT_EQ(errors, 0) << "errors raised (first ones printed above)";
  EXPECT_LE(growth, 0) << "device free memory dropped by " << growth << " bytes after the warm-up";
}

void parse(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--minutes") && i + 1 < argc) g_minutes = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--check-every") && i + 1 < argc) g_check_every = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) g_json = argv[++i];
    else if (!std::strcmp(argv[i], "--dp") && i + 1 < argc) g_dp = std::atoi(argv[++i]);
  }
}

}  // namespace
}  // namespace epkit::test

int main(int argc, char** argv) { return epkit::test::gpu_test_main(argc, argv, epkit::test::parse); }
