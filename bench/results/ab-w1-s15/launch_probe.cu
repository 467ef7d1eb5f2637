// Session 15 (issue 15): where the W = 1 decode pair's time above the harness floor goes. Times, with
// epkit-bench's method (samples queued behind a host gate in batches of 16; event, kernel(s), event;
// median of 400), empty kernels of the library's shapes and parameter block, with and without the
// programmatic-launch attribute, kernels with one and two dependent global round trips, and a pair
// of kernels with and without an event between them. Standalone: nvcc -O2 -arch=sm_90a -I src.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>

#include "kernels/kernel_params.hpp"

using namespace epkit::kernels;

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("%s: %s\n", #x, cudaGetErrorString(e_)); return 1; } } while (0)

__global__ void gate_kernel(volatile unsigned* flag, unsigned target) {
  while (*flag < target) __nanosleep(1000);
}
__global__ void empty_kernel() {}
__global__ void params_kernel(const __grid_constant__ CommParams p, const __grid_constant__ DispatchIO io) {
  if (p.rank == 12345 && io.idx_type == 777) *p.err = ErrorRecord{};  // never true; keeps the parameters
}
__global__ void params_wait_kernel(const __grid_constant__ CommParams p, const __grid_constant__ DispatchIO io) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (p.rank == 12345 && io.idx_type == 777) *p.err = ErrorRecord{};
}
// Warp 0 of each block: one 16-byte load, then its store (one round trip), or an index load, the
// data load it selects, then the store (two round trips).
__global__ void one_trip_kernel(const __grid_constant__ CommParams p, const __grid_constant__ DispatchIO io) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (threadIdx.x >= 32) return;
  const int4* src = reinterpret_cast<const int4*>(io.x);
  int4* dst = reinterpret_cast<int4*>(io.expert_x);
  const int i = blockIdx.x * 32 + threadIdx.x;
  dst[i] = __ldg(src + i);
}
__global__ void two_trip_kernel(const __grid_constant__ CommParams p, const __grid_constant__ DispatchIO io) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (threadIdx.x >= 32) return;
  const int k = __ldg(static_cast<const int*>(io.topk_idx) + threadIdx.x % 6);
  const int4* src = reinterpret_cast<const int4*>(io.x);
  int4* dst = reinterpret_cast<int4*>(io.expert_x);
  const int i = blockIdx.x * 32 + threadIdx.x;
  dst[(k & 7) * 4096 + i] = __ldg(src + i);
}

// Instruction fetch: the two-trip kernel after N integer multiply-adds (8 chains), as N
// straight-line instructions (kStraight: N * 16 bytes of code the warp runs through once), as a loop
// over the same adds (kLoop: the same work in ~100 bytes of code), or straight-line but branched
// over (kSkipped: the code sits between the index load and the data load, not executed).
enum FetchMode { kStraight, kLoop, kSkipped };
template <int N, int kMode>
__global__ void fetch_kernel(const __grid_constant__ CommParams p, const __grid_constant__ DispatchIO io) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (threadIdx.x >= 32) return;
  unsigned a[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) a[j] = threadIdx.x + j;
  const int k = __ldg(static_cast<const int*>(io.topk_idx) + threadIdx.x % 6);
  auto adds = [&] {
#pragma unroll
    for (int j = 0; j < 8; ++j) asm volatile("mad.lo.u32 %0, %0, %0, %1;" : "+r"(a[j]) : "r"(a[(j + 1) % 8]));
  };
  if constexpr (kMode == kStraight) {
#pragma unroll
    for (int i = 0; i < N / 8; ++i) adds();
  } else if constexpr (kMode == kLoop) {
#pragma unroll 1
    for (int i = 0; i < N / 8; ++i) adds();
  } else {
    if (k == 0x7fffffff) {  // never: the indices are zero
#pragma unroll
      for (int i = 0; i < N / 8; ++i) adds();
    }
  }
  unsigned h = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) h ^= a[j];
  const int4* src = reinterpret_cast<const int4*>(io.x);
  int4* dst = reinterpret_cast<int4*>(io.expert_x);
  const int i = blockIdx.x * 32 + threadIdx.x;
  int4 v = __ldg(src + i);
  v.x ^= static_cast<int>(h == 0x12345u);
  dst[(k & 7) * 4096 + i] = v;
}

// Parameter reads: the two-trip kernel whose addresses also depend on 14 parameter words, spread over
// the 480-byte parameter block as the library's kernels read theirs (kSpread: 8 different 64-byte
// lines of the constant bank) or all within the first 64 bytes of CommParams (kCompact). Each term
// is zero at run time but cannot be folded.
template <bool kSpread>
__global__ void params_read_kernel(const __grid_constant__ CommParams p, const __grid_constant__ DispatchIO io) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (threadIdx.x >= 32) return;
  int z;
  if constexpr (kSpread) {
    z = (p.capacity == 77777) + (p.payload_bytes == 77777) + (p.timeout_ns == 77777) + (p.sym == nullptr) +
        (p.off_dispatch_recv == 77777) + (p.off_combine_flag == 77777) + (p.state == nullptr) +
        (p.recv_map != nullptr) + (p.err == nullptr) + (p.packed == 77777) + (p.rank_div == 77777u) +
        (io.expert_num_tokens == nullptr) + (io.x_scale != nullptr) + (io.m.host_m == 77777);
  } else {
    z = (p.rank == 77777) + (p.world_size == 77777) + (p.dp_size == 77777) + (p.num_experts == 77777) +
        (p.num_local_experts == 77777) + (p.topk == 77777) + (p.hidden == 77777) + (p.max_tokens == 77777) +
        (p.max_msgs_per_src == 77777) + (p.capacity == 77777) + (p.num_scales == 77777) + (p.msg_bytes == 77777) +
        (p.header_bytes == 77777) + (p.payload_bytes == 77777);
  }
  const int k = __ldg(static_cast<const int*>(io.topk_idx) + threadIdx.x % 6 + z);
  const int4* src = reinterpret_cast<const int4*>(io.x);
  int4* dst = reinterpret_cast<int4*>(io.expert_x);
  const int i = blockIdx.x * 32 + threadIdx.x;
  dst[(k & 7) * 4096 + i + z] = __ldg(src + i + z);
}

// The 1-token dispatch's shape without its code: lane i of warp 0 in every block loads index i of
// n = 6 and ranks it with __match_any_sync, each block's warp 0 stores one 512-byte piece into the
// row of its entry; with kTail, block 0 then meets at two block barriers, counts in shared memory
// and stores the counts (local_dispatch_tiny's last steps).
template <bool kTail>
__global__ void tiny_shape_kernel(const __grid_constant__ CommParams p, const __grid_constant__ DispatchIO io) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  __shared__ int cnt[64];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n = 6;
  int e = -1;
  int4 v{};
  if (warp == 0) {
    e = lane < n ? __ldg(static_cast<const int*>(io.topk_idx) + lane) + lane : -1;
    v = __ldg(reinterpret_cast<const int4*>(io.x) + blockIdx.x % 4 * 32 + lane);
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int rk = __popc(peers & ((1u << lane) - 1u));
    const int row = __shfl_sync(0xffffffffu, e * 64 + rk, blockIdx.x % n);
    reinterpret_cast<int4*>(io.expert_x)[static_cast<size_t>(row) * 128 + blockIdx.x % 4 * 32 + lane] = v;
  }
  if (!kTail || blockIdx.x != 0) return;
  for (int x = threadIdx.x; x < 64; x += blockDim.x) cnt[x] = 0;
  __syncthreads();
  if (warp == 0 && lane < n) atomicAdd(&cnt[e & 63], 1);
  __syncthreads();
  for (int x = threadIdx.x; x < 64; x += blockDim.x) io.expert_num_tokens[x] = cnt[x];
}

int main() {
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  unsigned* hflag;
  CK(cudaHostAlloc(&hflag, 4, cudaHostAllocMapped));
  *hflag = 0;
  unsigned* dflag;
  CK(cudaHostGetDevicePointer(&dflag, hflag, 0));
  void *x, *y, *idx;
  CK(cudaMalloc(&x, 1 << 22));
  CK(cudaMalloc(&y, 1 << 24));
  CK(cudaMalloc(&idx, 4096));
  CK(cudaMemset(x, 1, 1 << 22));
  CK(cudaMemset(idx, 0, 4096));
  ErrorRecord* err;
  CK(cudaMalloc(&err, sizeof(ErrorRecord)));
  CommParams p{};
  p.rank = 0;
  p.err = err;
  DispatchIO io{};
  io.x = static_cast<const uint8_t*>(x);
  io.expert_x = static_cast<uint8_t*>(y);
  io.topk_idx = idx;
  int32_t* counts;
  CK(cudaMalloc(&counts, 256));
  io.expert_num_tokens = counts;
  std::printf("sizeof(CommParams) %zu, sizeof(DispatchIO) %zu\n", sizeof(CommParams), sizeof(DispatchIO));
  auto pdl = [&](auto kernel, int blocks) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(512);
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kernel, p, io);
  };
  unsigned target = 0;
  const int samples = 400, batch = 16;
  // marks: events per sample (2 or 3); steps: what runs between them
  auto time = [&](const char* name, std::vector<std::function<void()>> steps) -> int {
    const int marks = static_cast<int>(steps.size()) + 1;
    std::vector<cudaEvent_t> ev(static_cast<size_t>(samples + 8) * marks);
    for (auto& e : ev) CK(cudaEventCreate(&e));
    for (int i0 = 0; i0 < samples + 8; i0 += batch) {
      gate_kernel<<<1, 1, 0, st>>>(dflag, ++target);
      for (int i = i0; i < std::min(samples + 8, i0 + batch); ++i) {
        CK(cudaEventRecord(ev[i * marks], st));
        for (int s = 0; s < marks - 1; ++s) {
          steps[s]();
          if (s == marks - 2 || name[0] != '*') CK(cudaEventRecord(ev[i * marks + s + 1], st));  // '*': no middle events
        }
      }
      __atomic_store_n(hflag, target, __ATOMIC_SEQ_CST);
    }
    CK(cudaStreamSynchronize(st));
    CK(cudaGetLastError());
    std::vector<double> us;
    for (int i = 8; i < samples + 8; ++i) {
      float ms;
      CK(cudaEventElapsedTime(&ms, ev[i * marks], ev[i * marks + marks - 1]));
      us.push_back(1000.0 * ms);
    }
    std::sort(us.begin(), us.end());
    std::printf("%-58s median %6.2f us  p10 %6.2f  p90 %6.2f\n", name, us[us.size() / 2], us[us.size() / 10],
                us[us.size() * 9 / 10]);
    for (auto& e : ev) cudaEventDestroy(e);
    return 0;
  };
  for (int round = 0; round < 2; ++round) {
    std::printf("round %d\n", round + 1);
    time("empty <<<1, 32>>>", {[&] { empty_kernel<<<1, 32, 0, st>>>(); }});
    time("empty <<<64, 512>>> (the bench's floor)", {[&] { empty_kernel<<<64, 512, 0, st>>>(); }});
    for (int b : {8, 24, 112}) {
      char n[96];
      std::snprintf(n, sizeof n, "empty <<<%d, 512>>>", b);
      time(n, {[&] { empty_kernel<<<b, 512, 0, st>>>(); }});
      std::snprintf(n, sizeof n, "params (CommParams, DispatchIO) <<<%d, 512>>>", b);
      time(n, {[&] { params_kernel<<<b, 512, 0, st>>>(p, io); }});
      std::snprintf(n, sizeof n, "params, launched with the PDL attribute, %d blocks", b);
      time(n, {[&] { pdl(params_kernel, b); }});
      std::snprintf(n, sizeof n, "params + griddepcontrol, PDL, %d blocks", b);
      time(n, {[&] { pdl(params_wait_kernel, b); }});
      std::snprintf(n, sizeof n, "one round trip (load, store), PDL, %d blocks", b);
      time(n, {[&] { pdl(one_trip_kernel, b); }});
      std::snprintf(n, sizeof n, "two round trips (index, load, store), PDL, %d blocks", b);
      time(n, {[&] { pdl(two_trip_kernel, b); }});
    }
    {
      char n[96];
      auto fetch = [&](auto kernel, const char* what, int N) {
        std::snprintf(n, sizeof n, "two-trip + %d IMADs %s, PDL, 24 blocks", N, what);
        time(n, {[&] { pdl(kernel, 24); }});
      };
      fetch(fetch_kernel<256, kStraight>, "straight (4 KB)", 256);
      fetch(fetch_kernel<256, kLoop>, "in a loop", 256);
      fetch(fetch_kernel<256, kSkipped>, "skipped (4 KB)", 256);
      fetch(fetch_kernel<1024, kStraight>, "straight (16 KB)", 1024);
      fetch(fetch_kernel<1024, kLoop>, "in a loop", 1024);
      fetch(fetch_kernel<1024, kSkipped>, "skipped (16 KB)", 1024);
      fetch(fetch_kernel<2048, kStraight>, "straight (32 KB)", 2048);
      fetch(fetch_kernel<2048, kLoop>, "in a loop", 2048);
      fetch(fetch_kernel<2048, kSkipped>, "skipped (32 KB)", 2048);
    }
    time("tiny-dispatch shape (6 indices, match, 512 B stores), 24 blocks", {[&] { pdl(tiny_shape_kernel<false>, 24); }});
    time("tiny-dispatch shape + block 0's barriers and counts, 24 blocks", {[&] { pdl(tiny_shape_kernel<true>, 24); }});
    time("two-trip + 14 parameter words on 8 lines, PDL, 24 blocks", {[&] { pdl(params_read_kernel<true>, 24); }});
    time("two-trip + 14 parameter words on 1 line, PDL, 24 blocks", {[&] { pdl(params_read_kernel<false>, 24); }});
    time("pair: ev, two-trip 24, ev, one-trip 8, ev", {[&] { pdl(two_trip_kernel, 24); }, [&] { pdl(one_trip_kernel, 8); }});
    time("*pair without the middle event: ev, two-trip 24, one-trip 8, ev",
         {[&] { pdl(two_trip_kernel, 24); }, [&] { pdl(one_trip_kernel, 8); }});
  }
  return 0;
}
