// Fault injection (docs/RELIABILITY.md): the last rank dies (--mode kill) or silently skips a call
// (--mode skip) in iteration 5. Every other rank must get an epkit::Error naming that rank within
// the timeout, return from main normally (no hang in teardown) and exit 3. tests/gpu/fault_test.sh
// runs this under epkit-run and checks exit codes, messages, timing and leftover processes.
#include <cuda_runtime.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>

#include "harness.hpp"

int main(int argc, char** argv) {
  using namespace epkit;
  using namespace epkit::test;
  const bool kill_mode = argc > 2 && !std::strcmp(argv[1], "--mode") && !std::strcmp(argv[2], "kill");
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("skipped: no GPU\n");
    return 77;
  }
  check_fast_codecs();
  Communicator comm = Communicator::from_env();
  const int victim = comm.world_size() - 1;
  // Survivors outlive the launcher's SIGTERM so that they can show their own timeout.
  if (comm.rank() != victim) std::signal(SIGTERM, SIG_IGN);
  AllToAllConfig cfg;
  cfg.world_size = comm.world_size();
  cfg.rank = comm.rank();
  cfg.num_experts = 4 * cfg.world_size;
  cfg.topk = 4;
  cfg.hidden = 256;
  cfg.max_tokens_per_rank = 8;
  AllToAll a2a(comm, cfg);
  RankBuffers b;
  b.allocate(cfg, DType::kInt32);
  cudaStream_t st;
  cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  for (int it = 0; it < 20; ++it) {
    const auto groups = make_inputs(cfg, Routing::kUniform, 8, case_seed(it));
    b.upload(cfg, groups[cfg.rank], st);
    if (it == 5 && comm.rank() == victim) {
      std::printf("rank %d: injecting fault (%s) in iteration %d\n", comm.rank(), kill_mode ? "kill" : "skip", it);
      std::fflush(stdout);
      if (kill_mode) std::raise(SIGKILL);
      a2a.dispatch(b.dispatch_args(cfg, 8, false), st);  // ...and never combines
      std::this_thread::sleep_for(std::chrono::seconds(60));
      return 0;
    }
    const auto t0 = std::chrono::steady_clock::now();
    try {
      a2a.dispatch(b.dispatch_args(cfg, 8, false), st);
      launch_expert(cfg, b, st);
      a2a.combine(b.combine_args(cfg, 8, false), st);
      cudaStreamSynchronize(st);
      a2a.check();
      const std::string p = check_combine(cfg, groups, b);
      if (!p.empty()) {
        std::printf("rank %d: wrong result before the fault: %s\n", comm.rank(), p.c_str());
        return 1;
      }
    } catch (const Error& e) {
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::printf("rank %d: iteration %d failed after %.0f ms: %s\n", comm.rank(), it, ms, e.what());
      std::fflush(stdout);
      return 3;  // destructors run: they must not block on the dead peer
    }
  }
  std::printf("rank %d: no fault was detected\n", comm.rank());
  return 1;
}
