#include <nvshmem.h>
#include <nvshmemx.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "epkit/communicator.hpp"
#include "epkit/error.hpp"
#include "transport/control.cuh"
#include "common/cuda_check.hpp"

namespace epkit::transport {

namespace {

struct ControlBlock {
  uint8_t* sym = nullptr;     // symmetric: [ctr u64 | pad][src chunk][dst W * chunk]
  uint64_t* epoch = nullptr;  // local device memory: collectives completed
  int32_t* timed_out = nullptr;  // host-mapped: set by a wait that gave up
  int32_t* timed_out_dev = nullptr;
  int world = 0;
  cudaStream_t stream = nullptr;
  uint64_t timeout_ns = 0;
};
ControlBlock g;

constexpr size_t kCtrBytes = 256;

uint64_t collective_timeout_ns() {
  // Host collectives also absorb start-up skew between ranks, so they get a longer default bound.
  long ms = 120000;
  if (const char* e = std::getenv("EPKIT_COLLECTIVE_TIMEOUT_MS"); e && *e) ms = std::strtol(e, nullptr, 10);
  return static_cast<uint64_t>(ms > 0 ? ms : 120000) * 1000000ull;
}

__global__ void collective_kernel(uint8_t* sym, uint64_t* epoch, int32_t* timed_out, size_t n, uint64_t timeout_ns) {
  const int me = nvshmem_my_pe(), W = nvshmem_n_pes();
  uint64_t* ctr = reinterpret_cast<uint64_t*>(sym);
  const uint8_t* src = sym + kCtrBytes;
  uint8_t* dst = sym + kCtrBytes + kControlChunk;
  const uint64_t target = (*epoch + 1) * static_cast<uint64_t>(W);
  // Data and arrival travel together: the signal lands after the payload.
  for (int d = threadIdx.x; d < W; d += blockDim.x) {
    if (n > 0)
      nvshmem_putmem_signal_nbi(dst + static_cast<size_t>(me) * kControlChunk, src, n, ctr, 1, NVSHMEM_SIGNAL_ADD, d);
    else
      nvshmemx_signal_op(ctr, 1, NVSHMEM_SIGNAL_ADD, d);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    uint64_t start = 0, now = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    while (true) {
      uint64_t v;
      asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(ctr) : "memory");
      if (v >= target) break;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
      if (now - start > timeout_ns) {
        *reinterpret_cast<volatile int32_t*>(timed_out) = 1;
        __threadfence_system();
        break;
      }
    }
    *epoch += 1;
  }
}

void launch(size_t n, cudaStream_t st) {
  collective_kernel<<<1, 128, 0, st>>>(g.sym, g.epoch, g.timed_out_dev, n, g.timeout_ns);
  EPKIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void control_init(int world_size) {
  g.world = world_size;
  g.timeout_ns = collective_timeout_ns();
  g.sym = static_cast<uint8_t*>(nvshmem_malloc(kCtrBytes + kControlChunk * (1 + static_cast<size_t>(world_size))));
  EPKIT_CHECK(g.sym != nullptr, "nvshmem_malloc of the control block failed");
  EPKIT_CUDA_CHECK(cudaMemset(g.sym, 0, kCtrBytes));
  EPKIT_CUDA_CHECK(cudaMalloc(&g.epoch, sizeof(uint64_t)));
  EPKIT_CUDA_CHECK(cudaMemset(g.epoch, 0, sizeof(uint64_t)));
  EPKIT_CUDA_CHECK(cudaHostAlloc(&g.timed_out, sizeof(int32_t), cudaHostAllocMapped));
  *g.timed_out = 0;
  EPKIT_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&g.timed_out_dev), g.timed_out, 0));
  EPKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking));
  EPKIT_CUDA_CHECK(cudaDeviceSynchronize());
  // No peer may signal into a counter that is not zeroed yet (its signal would be wiped and the
  // first barrier would wait forever). nvshmem_malloc is collective and synchronising, so a
  // throw-away allocation after the memset orders every rank's zeroing before any first signal.
  void* fence = nvshmem_malloc(256);
  EPKIT_CHECK(fence != nullptr, "nvshmem_malloc of 256 bytes failed");
  nvshmem_free(fence);
  control_barrier();
}

bool control_maps_peer(int pe) { return g.sym != nullptr && nvshmem_ptr(g.sym, pe) != nullptr; }

void control_finalize() {
  if (!g.sym) return;
  if (!peers_unreachable()) {
    try {
      control_barrier();
      nvshmem_free(g.sym);
    } catch (const Error&) {
    }
  }
  cudaFree(g.epoch);
  cudaFreeHost(g.timed_out);
  cudaStreamDestroy(g.stream);
  g = ControlBlock{};
}

void control_check() {
  if (g.timed_out && *reinterpret_cast<volatile int32_t*>(g.timed_out)) {
    mark_peers_unreachable();
    EPKIT_FAIL("epkit collective barrier timed out after ", g.timeout_ns / 1000000,
               " ms: at least one rank never arrived (dead, stuck, or not calling the same collectives)");
  }
}

void control_barrier_on_stream(cudaStream_t stream) {
  EPKIT_CHECK(g.sym != nullptr, "no Communicator is initialised");
  control_check();
  launch(0, stream);
}

void control_barrier() {
  EPKIT_CHECK(g.sym != nullptr, "no Communicator is initialised");
  control_check();
  launch(0, g.stream);
  EPKIT_CUDA_CHECK(cudaStreamSynchronize(g.stream));
  control_check();
}

void control_allgather(const void* data, size_t n, void* out) {
  EPKIT_CHECK(g.sym != nullptr, "no Communicator is initialised");
  control_check();
  std::vector<uint8_t> chunk(kControlChunk * g.world);
  for (size_t off = 0; off < n || (n == 0 && off == 0); off += kControlChunk) {
    const size_t len = n - off < kControlChunk ? n - off : kControlChunk;
    EPKIT_CUDA_CHECK(cudaMemcpyAsync(g.sym + kCtrBytes, static_cast<const uint8_t*>(data) + off, len,
                                     cudaMemcpyHostToDevice, g.stream));
    launch(len, g.stream);
    EPKIT_CUDA_CHECK(cudaMemcpyAsync(chunk.data(), g.sym + kCtrBytes + kControlChunk, chunk.size(),
                                     cudaMemcpyDeviceToHost, g.stream));
    EPKIT_CUDA_CHECK(cudaStreamSynchronize(g.stream));
    control_check();
    for (int r = 0; r < g.world; ++r)
      std::memcpy(static_cast<uint8_t*>(out) + static_cast<size_t>(r) * n + off, chunk.data() + r * kControlChunk, len);
    // The next round overwrites peers' destination slots: wait until everyone has read this one.
    control_barrier();
    if (n == 0) break;
  }
}

}  // namespace epkit::transport
