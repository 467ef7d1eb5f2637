// Session 42 (issue 15): is the immediate-constant cache (IMC: the cache behind c[bank][offset]
// operands, where kernel parameters are read) private to each SM sub-partition, and how large is it?
//
// Why: ncu warp sampling of the general decode kernels (session 41, bench/results/ab-w1-s41/) put
// 121 of the dispatch's ~700 non-barrier samples on IMC misses, some of them late in the kernel on
// parameter lines that the kernels' parameter touch (device_common.cuh, touch_param_lines) had
// loaded. The touch runs on one warp per block, so on one sub-partition. NVIDIA's forum answer on
// constant caches says the indexed constant cache (LDC) "is shared by all SM sub-partitions"; Huerta
// et al. (arXiv 2503.20481, section 5.4) found an L0 constant cache for fixed-latency operands. If
// the IMC is per sub-partition, a touch on one warp fills it for a quarter of the warps only.
//
// Method: one block of 256 threads on one SM; warps are assumed to sit on sub-partition warp % 4.
// A "warmer" warp reads word 0 of NW parameter lines (64 B apart; ULDCs, their sum used as a shared
// address). After a block barrier and a 20,000-cycle spin, a "reader" warp reads word 1 of line 0
// (one ULDC) and stores its product with the thread index to shared memory; its two clock reads
// around that are the latency.
// Each case is a fresh launch (fresh parameter buffer: cold constant caches), 41 launches, median.
// SASS check (CUDA 13.0): in every case the reader's one ULDC sits between its two clock reads.
//
// Standalone: nvcc -O3 -std=c++17 -arch=sm_90a const_probe.cu -o const_probe
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));            \
      return 1;                                                                                 \
    }                                                                                           \
  } while (0)

namespace {

constexpr int kLines = 64;  // 4 KB of parameters (the limit is 32,764 B since CUDA 12.1)
struct Big {
  uint32_t w[kLines * 16];
};

__device__ __forceinline__ uint32_t clk() {
  uint32_t c;
  asm volatile("mov.u32 %0, %%clock;" : "=r"(c)::"memory");
  return c;
}

// kWarmer < 0: nobody warms. kNW: lines the warmer reads (0..kNW-1). kReader reads line kR0.
template <int kWarmer, int kNW, int kReader, int kR0>
__global__ void __launch_bounds__(256, 1) probe(const __grid_constant__ Big p, uint32_t* out) {
  __shared__ volatile uint32_t sink[8];
  const int warp = threadIdx.x / 32;
  const uint32_t tid = threadIdx.x;  // read before the clock
  if (warp == kWarmer) {
    uint32_t x = 0;
#pragma unroll
    for (int i = 0; i < kNW; ++i) x += p.w[i * 16];
    sink[x & 7] = 0;  // a uniform shared address: the words are read by ULDC (the IMC), not LDC
  }
  __syncthreads();
  const uint32_t s0 = clk();
  while (clk() - s0 < 20000u) {
  }
  __syncthreads();
  if (warp == kReader) {
    const uint32_t t0 = clk();
    const uint32_t x = p.w[kR0 * 16 + 1];  // word 1 of line kR0: the warmer read word 0 of the same line
    sink[1] = x * tid;  // ULDC, IMAD, STS: the STS waits for the ULDC (SASS checked, CUDA 13.0)
    const uint32_t t1 = clk();
    if (threadIdx.x % 32 == 0) out[0] = t1 - t0;
  }
}

template <typename F>
int run_case(const char* name, F kernel, const Big& big, uint32_t* d_out) {
  std::vector<uint32_t> v;
  for (int it = 0; it < 41; ++it) {
    kernel<<<1, 256>>>(big, d_out);
    CK(cudaGetLastError());
    uint32_t h = 0;
    CK(cudaMemcpy(&h, d_out, 4, cudaMemcpyDeviceToHost));
    v.push_back(h);
  }
  std::sort(v.begin(), v.end());
  std::printf("%-58s median %5u cycles  (min %5u, max %5u)\n", name, v[v.size() / 2], v.front(), v.back());
  return 0;
}

}  // namespace

int main() {
  Big big{};
  for (int i = 0; i < kLines * 16; ++i) big.w[i] = 0x9e3779b9u * (i + 1);
  uint32_t* d_out = nullptr;
  CK(cudaMalloc(&d_out, 64));
  int clk_khz = 0;
  CK(cudaDeviceGetAttribute(&clk_khz, cudaDevAttrClockRate, 0));
  std::printf("const_probe: SM clock %d MHz (attribute); reader latency of one parameter read (ULDC), cycles\n",
              clk_khz / 1000);
  int rc = 0;
  rc |= run_case("cold: nobody warmed, reader warp 1", probe<-1, 0, 1, 0>, big, d_out);
  rc |= run_case("warmer warp 1 (lines 0-3), reader warp 1 (same warp)", probe<1, 4, 1, 0>, big, d_out);
  rc |= run_case("warmer warp 1, reader warp 5 (same sub-partition)", probe<1, 4, 5, 0>, big, d_out);
  rc |= run_case("warmer warp 1, reader warp 2 (other sub-partition)", probe<1, 4, 2, 0>, big, d_out);
  rc |= run_case("warmer warp 1, reader warp 3 (other sub-partition)", probe<1, 4, 3, 0>, big, d_out);
  rc |= run_case("warmer warp 1, reader warp 4 (other sub-partition)", probe<1, 4, 4, 0>, big, d_out);
  // Capacity: the warmer reads lines 0..NW-1 (64 B apart), the reader then reads line 0.
  rc |= run_case("capacity: warp 1 reads 8 lines (512 B), then line 0", probe<1, 8, 1, 0>, big, d_out);
  rc |= run_case("capacity: warp 1 reads 16 lines (1 KB), then line 0", probe<1, 16, 1, 0>, big, d_out);
  rc |= run_case("capacity: warp 1 reads 32 lines (2 KB), then line 0", probe<1, 32, 1, 0>, big, d_out);
  rc |= run_case("capacity: warp 1 reads 64 lines (4 KB), then line 0", probe<1, 64, 1, 0>, big, d_out);
  rc |= run_case("capacity: warp 1 reads 64 lines, warp 5 reads line 0", probe<1, 64, 5, 0>, big, d_out);
  rc |= run_case("capacity: warp 1 reads 64 lines, warp 2 reads line 0", probe<1, 64, 2, 0>, big, d_out);
  CK(cudaFree(d_out));
  return rc;
}
