// Session 39 probe (issue 15): what a kernel pays to fetch its instructions, hot and cold.
// One warp runs a straight chain of N dependent IMADs, each with its own immediate (N 16-byte
// instructions: N / 8 lines of 128 bytes), timed with clock64 around the chain. Scenarios:
//   hot:   the same kernel launched just before, on the same SM (checked by %smid)
//   cold:  an evictor kernel (different code, E instructions) ran on every SM in between
//   survive: the same kernel ran on the SM, then a kernel of E instructions of other code on every
//            SM, then this one again: does its code survive E other instructions? (The benchmark's
//            loop alternates a 28 KB dispatch and a 55 KB combine on the same SMs.)
// cycles per instruction hot ~ the IMAD chain's latency; the excess cold is instruction fetch.
// A second trip over the same code in the same launch is warm by construction. Cold and survive
// time the first trip of a launch, on the SM where the launch before ran the same code.
// Build: nvcc -O3 -arch=sm_90 -std=c++17 icache_probe.cu -o icache_probe
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); std::exit(1); } } while (0)

__device__ __forceinline__ unsigned smid() { unsigned s; asm volatile("mov.u32 %0, %%smid;" : "=r"(s)); return s; }

// The timed code, as a body type with run(x, y). Straight: N dependent IMADs with distinct
// immediates (K keys the code apart between kernels). Branchy: NB blocks of B executed IMADs, each
// followed by a never-taken branch body (y is never equal to the key), so that part of the lines a
// warp fetches through are skipped code and every block starts at a branch target, as in real
// kernels with error paths inline. kExec: the IMADs executed per trip.
// Both split in halves down to 16 steps (Off: the first step's index) instead of one unrolled loop:
// an unrolled loop of 8,192 steps became a loop of two trips over 4,096 steps whose immediates were
// computed at run time (SASS, CUDA 13.0), half the distinct code, the second trip already warm.
template <int N, unsigned K, unsigned Off = 0>
struct Straight {
  static constexpr int kExec = N;
  __device__ __forceinline__ static unsigned run(unsigned x, unsigned y) {
    if constexpr (N <= 16) {
#pragma unroll
      for (int i = 0; i < N; ++i) x = x * y + ((Off + static_cast<unsigned>(i)) * 2654435761u + K);
    } else {
      x = Straight<N / 2, K, Off>::run(x, y);
      x = Straight<N - N / 2, K, Off + N / 2>::run(x, y);
    }
    return x;
  }
};
template <int NB, int B, unsigned K, unsigned Off = 0>
struct Branchy {
  static constexpr int kExec = NB * B;
  __device__ __forceinline__ static unsigned run(unsigned x, unsigned y) {
    if constexpr (NB == 1) {
      x = Straight<B, K, Off * B>::run(x, y);
      if (y == 0x7fff0000u + Off) {
#pragma unroll
        for (int i = 0; i < B; ++i) x = x * (y + i) ^ ((Off * B + static_cast<unsigned>(i)) * 40503u + K);
        asm volatile("" : "+r"(x));
      }
    } else {
      x = Branchy<NB / 2, B, K, Off>::run(x, y);
      x = Branchy<NB - NB / 2, B, K, Off + NB / 2>::run(x, y);
    }
    return x;
  }
};

struct Rec { long long c1, c2; unsigned sm; unsigned x; };

// Two trips over the same code: trip 0's time (fetch + execute), trip 1's (execute, warm).
template <typename Body>
__global__ void timed(Rec* out, unsigned y, int slot) {
  unsigned x = threadIdx.x;
  long long t[3];
#pragma unroll 1
  for (int trip = 0; trip < 2; ++trip) {
    __syncwarp();
    t[trip] = clock64();
    x = Body::run(x, y);
    __syncwarp();
  }
  t[2] = clock64();
  if (threadIdx.x == 0) out[slot] = Rec{t[1] - t[0], t[2] - t[1], smid(), x};
}

// Evictor: E instructions of other code on every SM (grid of many one-warp blocks).
template <int E>
__global__ void evict(unsigned* sink, unsigned y) {
  unsigned x = Straight<E, 0x9e3779b9u>::run(threadIdx.x + blockIdx.x, y);
  if (x == 0x12345678u) sink[blockIdx.x] = x;
}

double median(std::vector<double> v) {
  if (v.empty()) return -1.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Medians over reps of the cycles per executed instruction of Body's launch after Before() (trip
// 0: "first") and of its warm trip 1, where the launch before Before() was Body too (the SM it ran
// on is where its code is warm: only reps where both launches shared an SM count).
struct Times { double first, warm; size_t n; };
template <typename Body, typename BeforeFn>
Times time_after(Rec* d, int reps, BeforeFn before) {
  std::vector<double> first, warm;
  Rec h[2];
  for (int r = 0; r < reps; ++r) {
    timed<Body><<<1, 32>>>(d, 3u, 0);
    before();
    timed<Body><<<1, 32>>>(d, 3u, 1);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
    if (h[0].sm != h[1].sm) continue;
    first.push_back(double(h[1].c1) / Body::kExec);
    warm.push_back(double(h[1].c2) / Body::kExec);
  }
  return Times{median(first), median(warm), first.size()};
}

// cold (256 KB of other code ran on every SM first), hot (the same kernel just before), warm.
// The cold excess is also given per unit (a 128-byte line of straight code, a branchy block).
template <typename Body>
void cold_hot(const char* what, int units, const char* unit, unsigned* sink, Rec* d, int nsm, int reps) {
  const Times cold = time_after<Body>(d, reps, [&] { evict<16384><<<nsm * 8, 32>>>(sink, 1u); });
  const Times hot = time_after<Body>(d, reps, [] {});
  const double excess = (cold.first - cold.warm) * Body::kExec;
  std::printf("%s: cycles per executed instruction  cold %.2f  hot %.2f  warm %.2f   excess cold-warm %.0f cycles"
              " = %.1f per %s  (samples %zu, %zu)\n",
              what, cold.first, hot.first, hot.warm, excess, excess / units, unit, cold.n, hot.n);
}

template <int N>
void run(Rec* d, unsigned* sink, int nsm, int reps) {
  char what[64];
  std::snprintf(what, sizeof what, "N %5d (%3d KB, %4d lines)", N, N * 16 / 1024, N / 8);
  cold_hot<Straight<N, 1u>>(what, N / 8, "line", sink, d, nsm, reps);
}

// survive: the kernel warm on its SM, then E instructions of other code on every SM, then the kernel.
template <int N, int E>
void survive(Rec* d, unsigned* sink, int nsm, int reps) {
  const Times t = time_after<Straight<N, 7u>>(d, reps, [&] { evict<E><<<nsm * 8, 32>>>(sink, 1u); });
  const double excess = (t.first - t.warm) * N;
  std::printf("survive: N %5d (%3d KB) after %5d other instructions (%3d KB) on its SM: cycles/instr %.2f"
              " (warm %.2f), excess %.0f cycles = %.1f per line  (samples %zu)\n",
              N, N * 16 / 1024, E, E * 16 / 1024, t.first, t.warm, excess, excess / (N / 8.0), t.n);
}

// Per block: the skipped bodies' size is ptxas's (2B-4B instructions, SASS, CUDA 13.0).
template <int NB, int B>
void run_branchy(Rec* d, unsigned* sink, int nsm, int reps) {
  char what[96];
  std::snprintf(what, sizeof what, "branchy %4d blocks of %2d (+ a skipped body)", NB, B);
  cold_hot<Branchy<NB, B, 5u>>(what, NB, "block", sink, d, nsm, reps);
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
  CK(cudaMalloc(&d, 2 * sizeof(Rec)));
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
