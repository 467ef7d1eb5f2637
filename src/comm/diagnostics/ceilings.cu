// Device ceilings for epkit-bench: P2P copy bandwidth and put-with-signal latency (probes.hpp).
#include <nvshmem.h>
#include <nvshmemx.h>

#include <cstdint>
#include <string>
#include <vector>

#include "epkit/error.hpp"
#include "epkit/diagnostics.hpp"

namespace epkit::probes {

namespace {

void cuda_check(cudaError_t e, const char* what) {
  EPKIT_CHECK(e == cudaSuccess, "probe: ", what, " failed: ", cudaGetErrorString(e));
}

// Events of one timed region; destroyed with the object so an exception leaks nothing.
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    cuda_check(cudaEventCreate(&start), "cudaEventCreate");
    cuda_check(cudaEventCreate(&stop), "cudaEventCreate");
  }
  ~EventPair() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  double elapsed_us() const {
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    return 1000.0 * ms;
  }
};

// Symmetric allocation released on scope exit (collective on both ends).
struct SymmetricBuffer {
  const Communicator& comm;
  void* ptr;
  SymmetricBuffer(const Communicator& c, size_t bytes) : comm(c), ptr(c.symmetric_malloc(bytes)) {}
  ~SymmetricBuffer() { comm.symmetric_free(ptr); }
};

// Device allocation released on scope exit.
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { cuda_check(cudaMalloc(&ptr, bytes), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// One warp. Rank `initiator` puts first and waits for the answer; the other waits, then answers.
// The signal carries the round-trip number, so a late or lost put stalls instead of passing.
__global__ void ping_pong_kernel(uint8_t* dst, const uint8_t* src, uint64_t* flag, size_t bytes, int peer,
                                 int round_trips, uint64_t first_seq, bool initiator) {
  for (int i = 0; i < round_trips; ++i) {
    const uint64_t seq = first_seq + static_cast<uint64_t>(i);
    if (initiator) {
      nvshmemx_putmem_signal_nbi_warp(dst, src, bytes, flag, seq, NVSHMEM_SIGNAL_SET, peer);
      if (threadIdx.x == 0) nvshmem_uint64_wait_until(flag, NVSHMEM_CMP_GE, seq);
      __syncwarp();
    } else {
      if (threadIdx.x == 0) nvshmem_uint64_wait_until(flag, NVSHMEM_CMP_GE, seq);
      __syncwarp();
      nvshmemx_putmem_signal_nbi_warp(dst, src, bytes, flag, seq, NVSHMEM_SIGNAL_SET, peer);
    }
  }
  // Proxy transports complete non-blocking puts only on quiet; P2P ones are already done.
  if (threadIdx.x == 0) nvshmem_quiet();
}

__global__ void __launch_bounds__(512, 1) empty_kernel() {}

__global__ void gate_kernel(const volatile unsigned* counter, unsigned target) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    if (*counter >= target) return;
    __nanosleep(200);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < 10000000000ull);
}

// Block 0, thread d < W: store `seq` into peer d's flag slot for this rank, then wait for peer d's.
// Other blocks exit at once (they are there so the launch costs what the library's launches cost).
__global__ void __launch_bounds__(512, 1)
    flag_exchange_kernel(uint64_t* const* peer_flags, uint64_t* my_flags, int me, int world, uint64_t seq) {
  if (blockIdx.x != 0) return;
  const int d = threadIdx.x;
  if (d < world) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(peer_flags[d] + me), "l"(seq) : "memory");
    uint64_t v = 0, t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {  // bounded: a peer that never stores makes this sample slow, not the process hang
      asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(my_flags + d) : "memory");
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (v < seq && t - t0 < 10000000000ull);
  }
}

}  // namespace

HostGate::HostGate() {
  unsigned* h = nullptr;
  cuda_check(cudaHostAlloc(&h, sizeof(unsigned), cudaHostAllocMapped), "cudaHostAlloc");
  *h = 0;
  host_ = h;
  cuda_check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_), h, 0), "cudaHostGetDevicePointer");
}
HostGate::~HostGate() {
  if (host_) cudaFreeHost(const_cast<unsigned*>(host_));
}
void HostGate::close(cudaStream_t stream) {
  gate_kernel<<<1, 1, 0, stream>>>(dev_, ++target_);
  cuda_check(cudaGetLastError(), "gate kernel launch");
}
void HostGate::open() {
  // The counter only grows, so a gate kernel that starts late still sees its target reached.
  __atomic_store_n(const_cast<unsigned*>(host_), target_, __ATOMIC_RELEASE);
}

void* peer_address(const Communicator& comm, const void* symmetric_ptr, int peer) {
  EPKIT_CHECK(peer >= 0 && peer < comm.world_size(), "peer_address: peer ", peer, " is outside [0, ",
              comm.world_size(), ")");
  return nvshmem_ptr(symmetric_ptr, peer);
}

std::string nvshmem_version() {
  int major = 0, minor = 0, patch = 0;
  nvshmemx_vendor_get_version_info(&major, &minor, &patch);
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

namespace {

// opt.warmup untimed calls of copy, then opt.samples timed ones, each after an on-stream barrier
// so that every rank copies at the same time; per-sample microseconds (CUDA events).
template <typename Copy>
std::vector<double> time_copies(const Communicator& comm, const CopyProbeOptions& opt, cudaStream_t stream, Copy copy) {
  for (int i = 0; i < opt.warmup; ++i) copy();
  std::vector<double> us;
  EventPair ev;
  for (int i = 0; i < opt.samples; ++i) {
    comm.barrier_on_stream(stream);
    cuda_check(cudaEventRecord(ev.start, stream), "cudaEventRecord");
    copy();
    cuda_check(cudaEventRecord(ev.stop, stream), "cudaEventRecord");
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    us.push_back(ev.elapsed_us());
  }
  comm.barrier_on_stream(stream);
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return us;
}

}  // namespace

CopyProbeResult measure_copy_bandwidth(const Communicator& comm, const CopyProbeOptions& opt, cudaStream_t stream) {
  EPKIT_CHECK(opt.bytes > 0, "measure_copy_bandwidth: bytes must be > 0");
  EPKIT_CHECK(opt.samples >= 1, "measure_copy_bandwidth: samples ", opt.samples, " must be >= 1");
  CopyProbeResult r;
  r.bytes = opt.bytes;
  if (comm.world_size() < 2) {
    r.method = "none: one rank has no peer";
    return r;
  }
  r.peer = (comm.rank() + 1) % comm.world_size();
  // Source and destination are both symmetric so the non-P2P path (put) can use registered memory.
  SymmetricBuffer src(comm, opt.bytes), dst(comm, opt.bytes);
  cuda_check(cudaMemsetAsync(src.ptr, 0x5a, opt.bytes, stream), "cudaMemsetAsync");
  void* peer_dst = nvshmem_ptr(dst.ptr, r.peer);
  r.p2p = peer_dst != nullptr;
  r.method = r.p2p ? "cudaMemcpyAsync to the nvshmem_ptr peer address, all ranks to rank+1 at once"
                   : "nvshmemx_putmem_on_stream + quiet (peer not P2P), all ranks to rank+1 at once";
  auto copy = [&] {
    if (r.p2p) {
      cuda_check(cudaMemcpyAsync(peer_dst, src.ptr, opt.bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
    } else {
      nvshmemx_putmem_on_stream(dst.ptr, src.ptr, opt.bytes, r.peer, stream);
      nvshmemx_quiet_on_stream(stream);
    }
  };
  r.sample_us = time_copies(comm, opt, stream, copy);
  return r;
}

CopyProbeResult measure_local_copy_bandwidth(const Communicator& comm, const CopyProbeOptions& opt,
                                             cudaStream_t stream) {
  EPKIT_CHECK(opt.bytes > 0, "measure_local_copy_bandwidth: bytes must be > 0");
  EPKIT_CHECK(opt.samples >= 1, "measure_local_copy_bandwidth: samples ", opt.samples, " must be >= 1");
  CopyProbeResult r;
  r.bytes = opt.bytes;
  r.peer = comm.rank();
  r.method = "cudaMemcpyAsync device to device within each GPU, all ranks at once; bandwidth = 2 x bytes / time";
  DeviceBuffer src(opt.bytes), dst(opt.bytes);
  cuda_check(cudaMemsetAsync(src.ptr, 0x5a, opt.bytes, stream), "cudaMemsetAsync");
  auto copy = [&] {
    cuda_check(cudaMemcpyAsync(dst.ptr, src.ptr, opt.bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
  };
  r.sample_us = time_copies(comm, opt, stream, copy);
  return r;
}

PingPongResult measure_put_signal_latency(const Communicator& comm, const PingPongOptions& opt, cudaStream_t stream) {
  EPKIT_CHECK(opt.bytes > 0, "measure_put_signal_latency: bytes must be > 0");
  EPKIT_CHECK(opt.round_trips >= 1 && opt.samples >= 1, "measure_put_signal_latency: round_trips ",
              opt.round_trips, " and samples ", opt.samples, " must be >= 1");
  PingPongResult r;
  r.bytes = opt.bytes;
  r.round_trips = opt.round_trips;
  if (comm.world_size() < 2) return r;
  const int me = comm.rank();
  const bool plays = me < 2;
  if (plays) r.peer = 1 - me;
  // [flag: 128 B][dst: bytes][src: bytes], all symmetric.
  const size_t flag_bytes = 128;
  SymmetricBuffer buf(comm, flag_bytes + 2 * opt.bytes);
  auto* base = static_cast<uint8_t*>(buf.ptr);
  auto* flag = reinterpret_cast<uint64_t*>(base);
  uint8_t* dst = base + flag_bytes;
  const uint8_t* src = dst + opt.bytes;
  cuda_check(cudaMemsetAsync(base, 0, flag_bytes + 2 * opt.bytes, stream), "cudaMemsetAsync");
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  comm.barrier();

  EventPair ev;
  uint64_t next_seq = 1;
  for (int s = 0; s <= opt.samples; ++s) {  // sample 0 is the untimed warm-up
    comm.barrier_on_stream(stream);
    cuda_check(cudaEventRecord(ev.start, stream), "cudaEventRecord");
    if (plays) {
      ping_pong_kernel<<<1, 32, 0, stream>>>(dst, src, flag, opt.bytes, r.peer, opt.round_trips, next_seq, me == 0);
      cuda_check(cudaGetLastError(), "ping_pong_kernel launch");
    }
    cuda_check(cudaEventRecord(ev.stop, stream), "cudaEventRecord");
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    next_seq += static_cast<uint64_t>(opt.round_trips);
    if (s > 0 && me == 0) r.one_way_us.push_back(ev.elapsed_us() / (2.0 * opt.round_trips));
  }
  comm.barrier_on_stream(stream);
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return r;
}

LaunchFloorResult measure_launch_floor(const Communicator& comm, const LaunchFloorOptions& opt,
                                       cudaStream_t stream) {
  EPKIT_CHECK(opt.blocks >= 1 && opt.samples >= 1, "measure_launch_floor: blocks ", opt.blocks, " and samples ",
              opt.samples, " must be >= 1");
  LaunchFloorResult r;
  r.blocks = opt.blocks;
  const int W = comm.world_size(), me = comm.rank();
  SymmetricBuffer flags(comm, static_cast<size_t>(W) * sizeof(uint64_t));
  cuda_check(cudaMemsetAsync(flags.ptr, 0, static_cast<size_t>(W) * sizeof(uint64_t), stream), "cudaMemsetAsync");
  std::vector<uint64_t*> peers(W);
  bool all_p2p = true;
  for (int d = 0; d < W; ++d) {
    peers[d] = static_cast<uint64_t*>(nvshmem_ptr(flags.ptr, d));
    all_p2p &= peers[d] != nullptr;
  }
  uint64_t** peers_dev = nullptr;
  cuda_check(cudaMalloc(&peers_dev, W * sizeof(uint64_t*)), "cudaMalloc");
  struct Free {
    void* p;
    ~Free() { cudaFree(p); }
  } free_peers{peers_dev};
  cuda_check(cudaMemcpy(peers_dev, peers.data(), W * sizeof(uint64_t*), cudaMemcpyHostToDevice), "cudaMemcpy");
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  comm.barrier();
  auto* my_flags = static_cast<uint64_t*>(flags.ptr);
  const int warmup = 5;
  // Queued ahead behind a gate like the bench's samples; events read after one sync at the end.
  HostGate gate;
  auto time_kernel = [&](std::vector<double>& out, auto&& launch) {
    std::vector<EventPair> ev(static_cast<size_t>(opt.samples + warmup));
    queue_gated(gate, stream, static_cast<int>(ev.size()), 16, [&](int i) {
      comm.barrier_on_stream(stream);
      cuda_check(cudaEventRecord(ev[i].start, stream), "cudaEventRecord");
      launch();
      cuda_check(cudaGetLastError(), "probe kernel launch");
      cuda_check(cudaEventRecord(ev[i].stop, stream), "cudaEventRecord");
    });
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    for (size_t i = warmup; i < ev.size(); ++i) out.push_back(ev[i].elapsed_us());
  };
  time_kernel(r.empty_us, [&] { empty_kernel<<<opt.blocks, 512, 0, stream>>>(); });
  time_kernel(r.empty_one_warp_us, [&] { empty_kernel<<<1, 32, 0, stream>>>(); });
  // Every rank must make the same choice: the exchange waits on every peer.
  const int mine = all_p2p ? 1 : 0;
  std::vector<int> everyone(W);
  comm.allgather(&mine, sizeof mine, everyone.data());
  for (int v : everyone) all_p2p &= v == 1;
  if (all_p2p && W > 1) {
    uint64_t seq = 0;
    time_kernel(r.exchange_us,
                [&] { flag_exchange_kernel<<<opt.blocks, 512, 0, stream>>>(peers_dev, my_flags, me, W, ++seq); });
  }
  comm.barrier_on_stream(stream);
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return r;
}

}  // namespace epkit::probes
