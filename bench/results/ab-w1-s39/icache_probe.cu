// Session 39 probe (issue 15): what a kernel pays to fetch its instructions, hot and cold.
// One warp runs a straight chain of N dependent IMADs, each with its own immediate (N 16-byte
// instructions: N / 8 lines of 128 bytes), timed with clock64 around the chain. Scenarios:
//   hot:   the same kernel launched just before, on the same SM (checked by %smid)
//   cold:  an evictor kernel (different code, E instructions) ran on every SM in between
//   survive: the same kernel ran on the SM, then a kernel of E instructions of other code on every
//            SM, then this one again: does its code survive E other instructions? (The benchmark's
//            loop alternates a 28 KB dispatch and a 55 KB combine on the same SMs.)
// cycles per instruction hot ~ the IMAD chain's latency; the excess cold is instruction fetch.
// A second timed chain right after the first, in the same launch, re-runs the first chain's code
// (a loop of two trips over the same instructions): the second trip is warm by construction.
// Build: nvcc -O3 -arch=sm_90 -std=c++17 icache_probe.cu -o icache_probe
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); std::exit(1); } } while (0)

__device__ __forceinline__ unsigned smid() { unsigned s; asm volatile("mov.u32 %0, %%smid;" : "=r"(s)); return s; }

// N dependent IMADs with distinct immediates (K keys the code apart between kernels).
template <int N, unsigned K>
__device__ __forceinline__ unsigned chain(unsigned x, unsigned y) {
#pragma unroll
  for (int i = 0; i < N; ++i) x = x * y + (static_cast<unsigned>(i) * 2654435761u + K);
  return x;
}

struct Rec { long long c1, c2; unsigned sm; unsigned x; };

// Two trips over the same chain: trip 0's time (fetch + execute), trip 1's (execute, warm).
template <int N, unsigned K>
__global__ void timed(Rec* out, unsigned y, int slot) {
  unsigned x = threadIdx.x;
  long long t[3];
#pragma unroll 1
  for (int trip = 0; trip < 2; ++trip) {
    __syncwarp();
    t[trip] = clock64();
    x = chain<N, K>(x, y);
    __syncwarp();
  }
  t[2] = clock64();
  if (threadIdx.x == 0) out[slot] = Rec{t[1] - t[0], t[2] - t[1], smid(), x};
}

// Evictor: E instructions of other code on every SM (grid of many one-warp blocks).
template <int E>
__global__ void evict(unsigned* sink, unsigned y) {
  unsigned x = chain<E, 0x9e3779b9u>(threadIdx.x + blockIdx.x, y);
  if (x == 0x12345678u) sink[blockIdx.x] = x;
}

template <int N>
void run(Rec* d, unsigned* sink, int nsm, int reps) {
  std::vector<double> hot1, hot2, cold1;
  Rec h[2];
  for (int r = 0; r < reps; ++r) {
    // cold: evictor on every SM, then the kernel
    evict<16384><<<nsm * 8, 32>>>(sink, 1u);
    timed<N, 1u><<<1, 32>>>(d, 3u, 0);
    // hot: the same kernel again
    timed<N, 1u><<<1, 32>>>(d, 3u, 1);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
    if (h[0].sm != h[1].sm) continue;  // hot only counts on the same SM
    cold1.push_back(double(h[0].c1));
    hot1.push_back(double(h[1].c1));
    hot2.push_back(double(h[1].c2));
  }
  auto med = [](std::vector<double> v) { if (v.empty()) return -1.0; std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
  const double n = N;
  std::printf("N %5d (%3d KB, %4d lines): cycles/instr  cold %.2f  hot %.2f  warm(trip 2) %.2f"
              "   excess cold-warm %.0f cycles = %.1f per line  (samples %zu)\n",
              N, N * 16 / 1024, N / 8, med(cold1) / n, med(hot1) / n, med(hot2) / n,
              med(cold1) - med(hot2), (med(cold1) - med(hot2)) / (n / 8), cold1.size());
}

// survive: the kernel warm on its SM, then E instructions of other code on every SM, then the kernel.
template <int N, int E>
void survive(Rec* d, unsigned* sink, int nsm, int reps) {
  std::vector<double> after, hot;
  Rec h[2];
  for (int r = 0; r < reps; ++r) {
    timed<N, 7u><<<1, 32>>>(d, 3u, 0);
    evict<E><<<nsm * 8, 32>>>(sink, 1u);
    timed<N, 7u><<<1, 32>>>(d, 3u, 1);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
    if (h[0].sm != h[1].sm) continue;
    after.push_back(double(h[1].c1));
    hot.push_back(double(h[1].c2));
  }
  auto med = [](std::vector<double> v) { if (v.empty()) return -1.0; std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
  std::printf("survive: N %5d (%3d KB) after %5d other instructions (%3d KB) on its SM: cycles/instr %.2f"
              " (warm %.2f), excess %.0f cycles = %.1f per line  (samples %zu)\n",
              N, N * 16 / 1024, E, E * 16 / 1024, med(after) / N, med(hot) / N, med(after) - med(hot),
              (med(after) - med(hot)) / (N / 8.0), after.size());
}

// Branchy code: blocks of B executed IMADs, each followed by a never-taken branch body of B other
// IMADs (y is never equal to the key), so half of the lines a warp fetches through are skipped code
// and every block starts at a branch target, as in real kernels with error paths inline.
template <int NB, int B, unsigned K>
__device__ __forceinline__ unsigned branchy(unsigned x, unsigned y) {
#pragma unroll
  for (int b = 0; b < NB; ++b) {
#pragma unroll
    for (int i = 0; i < B; ++i) x = x * y + (static_cast<unsigned>(b * B + i) * 2654435761u + K);
    if (y == 0x7fff0000u + b) {
#pragma unroll
      for (int i = 0; i < B; ++i) x = x * (y + i) ^ (static_cast<unsigned>(b * B + i) * 40503u + K);
      asm volatile("" : "+r"(x));
    }
  }
  return x;
}
template <int NB, int B, unsigned K>
__global__ void timed_branchy(Rec* out, unsigned y, int slot) {
  unsigned x = threadIdx.x;
  long long t[3];
#pragma unroll 1
  for (int trip = 0; trip < 2; ++trip) {
    __syncwarp();
    t[trip] = clock64();
    x = branchy<NB, B, K>(x, y);
    __syncwarp();
  }
  t[2] = clock64();
  if (threadIdx.x == 0) out[slot] = Rec{t[1] - t[0], t[2] - t[1], smid(), x};
}
template <int NB, int B>
void run_branchy(Rec* d, unsigned* sink, int nsm, int reps) {
  std::vector<double> hot1, hot2, cold1;
  Rec h[2];
  for (int r = 0; r < reps; ++r) {
    evict<16384><<<nsm * 8, 32>>>(sink, 1u);
    timed_branchy<NB, B, 5u><<<1, 32>>>(d, 3u, 0);
    timed_branchy<NB, B, 5u><<<1, 32>>>(d, 3u, 1);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
    if (h[0].sm != h[1].sm) continue;
    cold1.push_back(double(h[0].c1)); hot1.push_back(double(h[1].c1)); hot2.push_back(double(h[1].c2));
  }
  auto med = [](std::vector<double> v) { if (v.empty()) return -1.0; std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
  const double n = NB * B;  // executed IMADs
  std::printf("branchy %4d blocks of %2d (+ a skipped body of ~2x%d): cycles per executed IMAD  cold %.2f  hot %.2f  warm %.2f"
              "   excess cold-warm %.0f cycles = %.1f per block  (samples %zu)\n",
              NB, B, B, med(cold1) / n, med(hot1) / n, med(hot2) / n, med(cold1) - med(hot2), (med(cold1) - med(hot2)) / NB, cold1.size());
}

int main() {
  int dev = 0, nsm = 0, clk = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  std::printf("%s, %d SMs, clock %d MHz\n", prop.name, nsm, clk / 1000);
  Rec* d;
  unsigned* sink;
  CK(cudaMalloc(&d, 4 * sizeof(Rec)));
  CK(cudaMalloc(&sink, nsm * 8 * sizeof(unsigned)));
  // warm-up: load every module
  run<64>(d, sink, nsm, 3);
  const int reps = 41;
  run<64>(d, sink, nsm, reps);
  run<256>(d, sink, nsm, reps);
  run<512>(d, sink, nsm, reps);
  run<1024>(d, sink, nsm, reps);
  run<2048>(d, sink, nsm, reps);
  run<4096>(d, sink, nsm, reps);
  run<8192>(d, sink, nsm, reps);
  survive<2048, 1024>(d, sink, nsm, reps);
  survive<2048, 2048>(d, sink, nsm, reps);
  survive<2048, 4096>(d, sink, nsm, reps);
  survive<2048, 8192>(d, sink, nsm, reps);
  survive<512, 4096>(d, sink, nsm, reps);
  survive<512, 8192>(d, sink, nsm, reps);
  run_branchy<64, 8>(d, sink, nsm, reps);
  run_branchy<256, 8>(d, sink, nsm, reps);
  run_branchy<64, 32>(d, sink, nsm, reps);
  run_branchy<256, 32>(d, sink, nsm, reps);
  std::printf("done\n");
  return 0;
}
