// Measurement probes: small collective experiments that need NVSHMEM device code or nvshmem_ptr.
// They live in libepkit.so because NVSHMEM's device state is initialised there; epkit-bench calls
// them to measure the device ceilings it reports bandwidth and latency against. Each returns raw
// per-sample times of this rank; the caller combines ranks and computes statistics.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <vector>

#include "epkit/communicator.hpp"

namespace epkit::probes {

// The address at which this rank can load/store/cudaMemcpy `peer`'s copy of `symmetric_ptr` (a
// pointer from Communicator::symmetric_malloc); nullptr when the peer is not reachable by P2P.
void* peer_address(const Communicator& comm, const void* symmetric_ptr, int peer);

// "major.minor.patch" of the NVSHMEM library loaded at run time.
std::string nvshmem_version();

struct CopyProbeOptions {
  size_t bytes = size_t{256} << 20;  // bytes per copy
  int warmup = 3;                    // untimed copies
  int samples = 20;                  // timed copies
};

struct CopyProbeResult {
  int peer = -1;                  // rank this rank copied to: (rank + 1) % W; -1 with one rank
  bool p2p = false;               // true: cudaMemcpyAsync to the peer address; false: nvshmemx_putmem_on_stream
  std::string method;             // human-readable description of what was timed
  size_t bytes = 0;
  std::vector<double> sample_us;  // this rank's time per copy (CUDA events, after an on-stream barrier)
};

// Collective. Every rank copies `bytes` from local device memory into the symmetric buffer of rank
// (rank + 1) % W at the same time, so with two ranks each link carries traffic both ways: the
// per-direction bandwidth under the load dispatch and combine put on it. Peers without P2P are
// written with nvshmemx_putmem_on_stream + quiet instead. Empty samples with one rank.
CopyProbeResult measure_copy_bandwidth(const Communicator& comm, const CopyProbeOptions& opt, cudaStream_t stream);

// Collective. Every rank copies `bytes` between two buffers of its own device memory (cudaMemcpyAsync
// device to device) at the same time: the device memory's copy rate, which bounds the kernels'
// local work (the fan-out into expert_x, the expert-side reads of combine). A copy moves 2 x bytes
// through memory (read + write). Ranks that share a GPU share its memory, as in a real run.
CopyProbeResult measure_local_copy_bandwidth(const Communicator& comm, const CopyProbeOptions& opt, cudaStream_t stream);

struct PingPongOptions {
  size_t bytes = 8;      // payload per put
  int round_trips = 200; // per timed kernel
  int samples = 20;      // timed kernels (one untimed before them)
};

struct PingPongResult {
  int peer = -1;                      // rank 0 plays with rank 1; -1 with one rank
  size_t bytes = 0;
  int round_trips = 0;
  std::vector<double> one_way_us;     // per timed kernel: kernel time / (2 * round_trips); rank 0 only
};

// Collective. Ranks 0 and 1 bounce `bytes` with nvshmemx_putmem_signal_nbi_warp, each waiting with
// nvshmem_uint64_wait_until for the other's signal before answering (one warp each); other ranks
// only join the barriers. Empty one_way_us with one rank and on ranks other than 0.
PingPongResult measure_put_signal_latency(const Communicator& comm, const PingPongOptions& opt, cudaStream_t stream);

// Holds a stream behind a spinning kernel while the host queues a batch of timed samples, then
// lets it go. Without it a fast device drains the queue and waits for the host between launches,
// and CUDA events then time the host's launch rate (several microseconds per launch) rather than
// the device work. The kernel gives up after 10 s so a host that never opens the gate cannot hang
// the stream. Keep a batch under ~100 queued operations (the launch queue has a fixed depth).
class HostGate {
 public:
  HostGate();
  ~HostGate();
  HostGate(const HostGate&) = delete;
  HostGate& operator=(const HostGate&) = delete;
  void close(cudaStream_t stream);  // work queued on `stream` after this waits for open()
  void open();                      // lets the stream run

 private:
  volatile unsigned* host_ = nullptr;
  unsigned* dev_ = nullptr;
  unsigned target_ = 0;
};

// Queues `samples` calls of sample(i) on `stream` in gated batches of `batch` (see HostGate).
template <typename F>
void queue_gated(HostGate& gate, cudaStream_t stream, int samples, int batch, F&& sample) {
  for (int i0 = 0; i0 < samples; i0 += batch) {
    gate.close(stream);
    for (int i = i0; i < samples && i < i0 + batch; ++i) sample(i);
    gate.open();
  }
}

struct LaunchFloorOptions {
  int blocks = 64;     // grid of the probe kernels (512 threads each, like the library's kernels)
  int samples = 200;   // timed kernels of each kind (a few untimed before them)
};

struct LaunchFloorResult {
  int blocks = 0;
  std::vector<double> empty_us;     // barrier, event, empty kernel, event: the harness floor of one call
                                    // (samples queued ahead behind a HostGate, as epkit-bench does)
  std::vector<double> empty_one_warp_us;  // same with a 1-block, 32-thread kernel: does the grid matter?
  std::vector<double> exchange_us;  // same, kernel = every rank stores one flag to every P2P peer
                                    // (st.release.sys) and spins on theirs (ld.acquire.sys): the floor
                                    // of one phase that needs a signal from each peer
};

// Collective. The floor every timed epkit call pays in epkit-bench's harness: what an empty kernel
// of the library's block shape costs between two events, and what one all-peer flag exchange costs.
// exchange_us is empty on every rank when some rank has a peer that is not P2P-reachable.
LaunchFloorResult measure_launch_floor(const Communicator& comm, const LaunchFloorOptions& opt, cudaStream_t stream);

}  // namespace epkit::probes
