// Fault injection (docs/RELIABILITY.md): the last rank stops in iteration 5, and every other rank
// must get an epkit::Error naming that rank and the phase it waited in, within the timeout, return
// from main normally (no hang in teardown) and exit 3. tests/gpu/fault_test.sh runs this under
// epkit-run and checks exit codes, messages, timing and leftover processes.
//   test_fault --mode M [--api all_to_all|layer]
// Modes (how the victim stops, and so where the others wait):
//   kill            dies (SIGKILL) before its dispatch: the others time out in dispatch
//   skip-dispatch   stays alive but never dispatches: dispatch
//   skip            dispatches, then never combines (alive): combine
//   kill-combine    dispatches, then dies before combine: combine
// --api layer runs an epkit::MoELayer (schedule dispatch_overlap, through its stage calls) instead of
// a bare AllToAll; the victim stops after stage_route (dispatch modes) or after stage_dispatch_send
// (combine modes). After the error each survivor calls forward() again, which must raise at once
// ("unusable") without launching: the line "rank R: reuse raised after X ms: ..." reports it.
#include <cuda_runtime.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "harness.hpp"
#include "layer_model.hpp"

namespace {

using namespace epkit;
using namespace epkit::test;

struct Mode {
  bool kill = false;            // the victim dies (else it stays alive and does nothing)
  bool after_dispatch = false;  // ...after its dispatch (else before it)
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

[[noreturn]] void stop_here(int rank, const char* mode, int it, bool kill) {
  std::printf("rank %d: injecting fault (%s) in iteration %d\n", rank, mode, it);
  std::fflush(stdout);
  if (kill) std::raise(SIGKILL);
  std::this_thread::sleep_for(std::chrono::seconds(60));
  std::exit(0);
}

int run_all_to_all(const Communicator& comm, const Mode& mode, const char* mode_name, int victim) {
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
      if (mode.after_dispatch) {
        a2a.dispatch(b.dispatch_args(cfg, 8, false), st);
        cudaStreamSynchronize(st);
      }
      stop_here(comm.rank(), mode_name, it, mode.kill);
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
      std::printf("rank %d: iteration %d failed after %.0f ms: %s\n", comm.rank(), it, ms_since(t0), e.what());
      std::fflush(stdout);
      return 3;  // destructors run: they must not block on the dead peer
    }
  }
  std::printf("rank %d: no fault was detected\n", comm.rank());
  return 1;
}

int run_layer(const Communicator& comm, const Mode& mode, const char* mode_name, int victim) {
  // test_fault has its own main (no TestWorld): the world comes from the Communicator.
  const MoELayerConfig cfg =
      base_config(MoESchedule::kDispatchOverlap, ExpertLayout::kPacked, false, 1, comm.world_size(), comm.rank());
  const Model md = make_model(cfg, case_seed(7), 0.f);
  DeviceModel dm;
  make_device_model(md, dm);
  MoELayer layer(comm, cfg, dm.views);
  const int M = cfg.max_tokens_per_rank, H = cfg.hidden;
  DeviceBuffer xd(static_cast<size_t>(M) * H * 2), out(static_cast<size_t>(M) * H * 2);
  MoEBatch b;
  b.x = Tensor(xd.ptr, DType::kBF16, {M, H});
  b.out = Tensor(out.ptr, DType::kBF16, {M, H});
  b.num_tokens = M;
  cudaStream_t st;
  cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  for (int it = 0; it < 20; ++it) {
    const std::vector<uint16_t> x = group_tokens(cfg, M, case_seed(100 + it));
    cudaMemcpyAsync(xd.ptr, x.data(), x.size() * 2, cudaMemcpyHostToDevice, st);  // ordered before the layer on st
    cudaMemsetAsync(out.ptr, 0xff, out.bytes, st);
    if (it == 5 && comm.rank() == victim) {
      layer.begin(b, st);
      layer.stage_route(0, st);
      if (mode.after_dispatch) layer.stage_dispatch_send(0, st);
      cudaStreamSynchronize(st);
      stop_here(comm.rank(), mode_name, it, mode.kill);
    }
    const auto t0 = std::chrono::steady_clock::now();
    try {
      layer.forward(b, st);
      cudaStreamSynchronize(st);
      layer.check();
      const std::string p = check_forward(layer, md, x, M, M, false, out);
      if (!p.empty()) {
        std::printf("rank %d: wrong result before the fault: %s\n", comm.rank(), p.c_str());
        return 1;
      }
    } catch (const Error& e) {
      std::printf("rank %d: iteration %d failed after %.0f ms: %s\n", comm.rank(), it, ms_since(t0), e.what());
      // The layer must now refuse to run, at once and without launching: no garbage output.
      cudaMemset(out.ptr, 0xff, out.bytes);
      cudaDeviceSynchronize();
      const auto t1 = std::chrono::steady_clock::now();
      try {
        layer.forward(b, st);
        std::printf("rank %d: reuse after the error did not raise\n", comm.rank());
        return 1;
      } catch (const Error& again) {
        const double ms = ms_since(t1);
        cudaDeviceSynchronize();
        const auto o = download<uint16_t>(out.ptr, static_cast<size_t>(M) * H);
        for (uint16_t v : o)
          if (v != 0xffff) {
            std::printf("rank %d: the refused forward wrote its output\n", comm.rank());
            return 1;
          }
        std::printf("rank %d: reuse raised after %.0f ms: %s\n", comm.rank(), ms, again.what());
      }
      std::fflush(stdout);
      return 3;
    }
  }
  std::printf("rank %d: no fault was detected\n", comm.rank());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode_name = "kill", api = "all_to_all";
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--mode")) mode_name = argv[++i];
    else if (!std::strcmp(argv[i], "--api")) api = argv[++i];
  }
  Mode mode;
  if (mode_name == "kill") mode = {true, false};
  else if (mode_name == "skip-dispatch") mode = {false, false};
  else if (mode_name == "skip") mode = {false, true};
  else if (mode_name == "kill-combine") mode = {true, true};
  else {
    std::printf("unknown --mode %s (kill, skip-dispatch, skip, kill-combine)\n", mode_name.c_str());
    return 2;
  }
  if (api != "all_to_all" && api != "layer") {
    std::printf("unknown --api %s (all_to_all, layer)\n", api.c_str());
    return 2;
  }
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
  return api == "layer" ? run_layer(comm, mode, mode_name.c_str(), victim)
                        : run_all_to_all(comm, mode, mode_name.c_str(), victim);
}
