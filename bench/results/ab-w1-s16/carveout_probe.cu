// Session 16 (issue 15): does a change of the SM's shared-memory carveout between two kernels cost
// the W = 1 decode pair time? The library's 1-token dispatch asks for a few KB of dynamic shared
// memory and its combine for none, so consecutive kernels may run in different L1 / shared-memory
// configurations. Times, with epkit-bench's method (samples queued behind a host gate in batches of
// 16; event, kernel, event, kernel, event; median of 400), a pair of one-trip kernels (24 blocks,
// then 8, 512 threads) where the first does or does not use dynamic shared memory, with and without
// the second asking for the same amount, and with an explicit carveout preference on both.
// Standalone: nvcc -O2 -std=c++17 -arch=sm_90a.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("%s: %s\n", #x, cudaGetErrorString(e_)); return 1; } } while (0)

__global__ void gate_kernel(volatile unsigned* flag, unsigned target) {
  while (*flag < target) __nanosleep(1000);
}
__global__ void empty_kernel() {}
// Warp 0: a 16-byte load and its store. kSmem: block 0 also zeroes and reads back `words` ints of
// dynamic shared memory across two barriers (as the library's tiny dispatch counts in block 0).
template <bool kSmem>
__global__ void __launch_bounds__(512, 1) trip_kernel(const int4* src, int4* dst, int* cnt, int words) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  extern __shared__ int sm[];
  if (threadIdx.x < 32) {
    const int i = blockIdx.x * 32 + threadIdx.x;
    dst[i] = __ldg(src + i);
  }
  if constexpr (kSmem) {
    if (blockIdx.x != 0) return;
    for (int x = threadIdx.x; x < words; x += blockDim.x) sm[x] = 0;
    __syncthreads();
    if (threadIdx.x < 6) atomicAdd(&sm[threadIdx.x * 7 % words], 1);
    __syncthreads();
    for (int x = threadIdx.x; x < 64; x += blockDim.x) cnt[x] = sm[x];
  }
}

int main() {
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  unsigned* hflag;
  CK(cudaHostAlloc(&hflag, 4, cudaHostAllocMapped));
  *hflag = 0;
  unsigned* dflag;
  CK(cudaHostGetDevicePointer(&dflag, hflag, 0));
  int4 *x, *y, *y2;
  int* cnt;
  CK(cudaMalloc(&x, 1 << 20));
  CK(cudaMalloc(&y, 1 << 20));
  CK(cudaMalloc(&y2, 1 << 20));
  CK(cudaMalloc(&cnt, 4096));
  CK(cudaMemset(x, 1, 1 << 20));
  auto launch = [&](auto kernel, int blocks, size_t smem, int4* dst) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(512);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kernel, static_cast<const int4*>(x), dst, cnt, static_cast<int>(smem / 4));
  };
  unsigned target = 0;
  const int samples = 400, batch = 16;
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
          CK(cudaEventRecord(ev[i * marks + s + 1], st));
        }
      }
      __atomic_store_n(hflag, target, __ATOMIC_SEQ_CST);
    }
    CK(cudaStreamSynchronize(st));
    CK(cudaGetLastError());
    std::vector<std::vector<double>> us(marks);  // [0]: whole sample, [s]: step s
    for (int i = 8; i < samples + 8; ++i) {
      float ms;
      CK(cudaEventElapsedTime(&ms, ev[i * marks], ev[i * marks + marks - 1]));
      us[0].push_back(1000.0 * ms);
      for (int s = 1; s < marks && marks > 2; ++s) {
        CK(cudaEventElapsedTime(&ms, ev[i * marks + s - 1], ev[i * marks + s]));
        us[s].push_back(1000.0 * ms);
      }
    }
    for (auto& u : us) std::sort(u.begin(), u.end());
    std::printf("%-66s median %6.2f us", name, us[0][us[0].size() / 2]);
    for (int s = 1; s < marks && marks > 2; ++s) std::printf("  step%d %5.2f", s, us[s][us[s].size() / 2]);
    std::printf("  (p10 %5.2f p90 %5.2f)\n", us[0][us[0].size() / 10], us[0][us[0].size() * 9 / 10]);
    for (auto& e : ev) cudaEventDestroy(e);
    return 0;
  };
  auto with = trip_kernel<true>, without = trip_kernel<false>;
  for (int round = 0; round < 3; ++round) {
    std::printf("round %d\n", round + 1);
    CK(cudaFuncSetAttribute(with, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutDefault));
    CK(cudaFuncSetAttribute(without, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutDefault));
    time("empty <<<64, 512>>> (the bench's floor)", {[&] { empty_kernel<<<64, 512, 0, st>>>(); }});
    time("single: trip, no smem, 24 blocks", {[&] { launch(without, 24, 0, y); }});
    time("single: trip + 4 KB smem, 24 blocks", {[&] { launch(with, 24, 4096, y); }});
    time("pair: trip 24 (no smem), trip 8 (no smem)", {[&] { launch(without, 24, 0, y); }, [&] { launch(without, 8, 0, y2); }});
    time("pair: trip 24 + 4 KB smem, trip 8 (no smem)", {[&] { launch(with, 24, 4096, y); }, [&] { launch(without, 8, 0, y2); }});
    time("pair: trip 24 + 4 KB smem, trip 8 asking 4 KB (unused)", {[&] { launch(with, 24, 4096, y); }, [&] { launch(without, 8, 4096, y2); }});
    time("pair: trip 24 + 32 KB smem, trip 8 (no smem)", {[&] { launch(with, 24, 32768, y); }, [&] { launch(without, 8, 0, y2); }});
    CK(cudaFuncSetAttribute(with, cudaFuncAttributePreferredSharedMemoryCarveout, 50));
    CK(cudaFuncSetAttribute(without, cudaFuncAttributePreferredSharedMemoryCarveout, 50));
    time("carveout 50% on both: trip 24 + 4 KB smem, trip 8 (no smem)", {[&] { launch(with, 24, 4096, y); }, [&] { launch(without, 8, 0, y2); }});
    time("carveout 50% on both: pair without smem", {[&] { launch(without, 24, 0, y); }, [&] { launch(without, 8, 0, y2); }});
    CK(cudaFuncSetAttribute(with, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxL1));
    CK(cudaFuncSetAttribute(without, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxL1));
    time("carveout MaxL1 on both: trip 24 + 4 KB smem, trip 8 (no smem)", {[&] { launch(with, 24, 4096, y); }, [&] { launch(without, 8, 0, y2); }});
  }
  return 0;
}
