// Session 35 probe: what __match_any_sync costs against ballots over the key's bits, in the shape
// the decode send half uses them (lane i: entry i of n = tokens x K <= 32; three dependent matches:
// entries of one expert, a token's entries for one rank, the messages to one rank).
// Each variant runs kIters times in a dependent chain (the next keys depend on the last results
// through a runtime zero), in 1..14 warps of one block at once; cycles per iteration of warp 0.
// Every variant's results are checked against the matches' on fresh random keys first.
// Build: nvcc -O3 -arch=sm_90 -std=c++17 match_probe.cu -o match_probe
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include <cuda_runtime.h>

constexpr int kIters = 256;
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); std::exit(1); } } while (0)

// __match_any_sync for keys in [0, 2^bits); a negative key matches only its own lane.
__device__ __forceinline__ unsigned match_bits(int key, int bits) {
  const int lane = threadIdx.x % 32;
  unsigned m = __ballot_sync(0xffffffffu, key >= 0);
#pragma unroll 1  // as the library's match_key_bits (device_common.cuh)
  for (int b = 0; b < bits; ++b) {
    const bool x = (key >> b) & 1;
    const unsigned v = __ballot_sync(0xffffffffu, x);
    m &= x ? v : ~v;
  }
  return key >= 0 ? m : 1u << lane;
}

struct Out { int rk, lead, j, tot; };

// The send half's three matches (dispatch.cu, dispatch_send_decode).
__device__ __forceinline__ Out three_matches(int e, int lu, int L, int W) {
  const int lane = threadIdx.x % 32;
  const unsigned below = (1u << lane) - 1u;
  const int r = e >= 0 ? e / L : -1;
  const unsigned peers = __match_any_sync(0xffffffffu, e);
  const int rk = __popc(peers & below);
  const unsigned same_msg = __match_any_sync(0xffffffffu, e >= 0 ? lu * W + r : -1 - lane);
  const bool lead = e >= 0 && (same_msg & below) == 0;
  const unsigned dst = __match_any_sync(0xffffffffu, lead ? r : -1 - lane);
  return {rk, lead, lead ? __popc(dst & below) : -1, __popc(dst)};
}
// The same from ballots: one key set for the expert, one for the rank; the token's lanes by mask.
__device__ __forceinline__ Out ballots(int e, int lu, int K, int L, int ebits, int wbits) {
  const int lane = threadIdx.x % 32;
  const unsigned below = (1u << lane) - 1u;
  const int r = e >= 0 ? e / L : -1;
  const unsigned peers = match_bits(e, ebits);
  const int rk = __popc(peers & below);
  const unsigned same_r = match_bits(r, wbits);
  const unsigned tok = (K == 32 ? 0xffffffffu : ((1u << K) - 1u)) << (lu * K);
  const bool lead = e >= 0 && (same_r & tok & below) == 0;
  const unsigned dst = same_r & __ballot_sync(0xffffffffu, lead);
  return {rk, lead, lead ? __popc(dst & below) : -1, lead ? __popc(dst) : 1};
}
__device__ __forceinline__ Out one_match(int e) {
  const int lane = threadIdx.x % 32;
  const unsigned peers = __match_any_sync(0xffffffffu, e);
  return {__popc(peers & ((1u << lane) - 1u)), 0, 0, __popc(peers)};
}
__device__ __forceinline__ Out one_ballot(int e, int ebits) {
  const int lane = threadIdx.x % 32;
  const unsigned peers = match_bits(e, ebits);
  return {__popc(peers & ((1u << lane) - 1u)), 0, 0, __popc(peers)};
}

struct Args { const int* keys; int n, K, L, W, ebits, wbits, nwarps; const int* zero; Out* out; long long* cyc; };

template <int V>
__global__ void probe(Args a) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (warp >= a.nwarps) return;
  const int z = *a.zero;
  int e = lane < a.n ? a.keys[lane] : -1;
  const int lu = lane < a.n ? lane / a.K : 0;
  Out o{};
  const auto run = [&]() {
    if (V == 0) o = three_matches(e, lu, a.L, a.W);
    if (V == 1) o = ballots(e, lu, a.K, a.L, a.ebits, a.wbits);
    if (V == 2) o = one_match(e);
    if (V == 3) o = one_ballot(e, a.ebits);
  };
  run();
  if (warp == 0) a.out[lane] = o;
  __syncwarp();
  const long long t0 = clock64();
  for (int i = 0; i < kIters; ++i) {
    e += (o.rk + o.j + o.tot) & z;  // a dependent chain: z is a runtime 0
    run();
  }
  const long long t1 = clock64();
  if (lane == 0) a.cyc[warp] = t1 - t0 + (o.rk & z);
}

int main() {
  struct Shape { const char* name; int E, K, W, tokens; };
  const Shape shapes[] = {{"V3 W=1 1tok", 256, 8, 1, 1}, {"V3 W=1 4tok", 256, 8, 1, 4}, {"V3 W=8 1tok", 256, 8, 8, 1},
                          {"V3 W=8 4tok", 256, 8, 8, 4}, {"V2L W=1 1tok", 64, 6, 1, 1}, {"V3 W=32 4tok", 256, 8, 32, 4},
                          {"E4096 K16 W2 2tok", 4096, 16, 2, 2}};
  int *keys, *zero;
  Out* out;
  long long* cyc;
  CK(cudaMalloc(&keys, 32 * 4)); CK(cudaMalloc(&zero, 4)); CK(cudaMalloc(&out, 32 * sizeof(Out))); CK(cudaMalloc(&cyc, 32 * 8));
  CK(cudaMemset(zero, 0, 4));
  std::mt19937 rng(std::random_device{}());
  int fails = 0;
  for (const Shape& s : shapes) {
    const int n = s.tokens * s.K, L = s.E / s.W;
    int ebits = 0, wbits = 0;
    while ((1 << ebits) < s.E) ++ebits;
    while ((1 << wbits) < s.W) ++wbits;
    // Check: 200 fresh random key sets (a token's K experts distinct, as top-k gives), outputs poisoned.
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<int> h(32, -1);
      for (int t = 0; t < s.tokens; ++t)
        for (int k = 0; k < s.K; ++k) {
          int x;
          bool dup;
          do {
            x = static_cast<int>(rng() % (trial % 3 == 0 ? std::min(s.E, 2 * s.K) : s.E));  // some with many repeats
            dup = false;
            for (int q = 0; q < k; ++q) dup |= h[t * s.K + q] == x;
          } while (dup);
          h[t * s.K + k] = x;
        }
      CK(cudaMemcpy(keys, h.data(), 32 * 4, cudaMemcpyHostToDevice));
      Out ref[32], got[32];
      for (int pair = 0; pair < 2; ++pair) {
        Args a{keys, n, s.K, L, s.W, ebits, wbits, 1, zero, out, cyc};
        CK(cudaMemset(out, 0x5a, 32 * sizeof(Out)));
        if (pair == 0) { probe<0><<<1, 32>>>(a); CK(cudaMemcpy(ref, out, sizeof ref, cudaMemcpyDeviceToHost));
                         CK(cudaMemset(out, 0x5a, 32 * sizeof(Out))); probe<1><<<1, 32>>>(a); }
        else { probe<2><<<1, 32>>>(a); CK(cudaMemcpy(ref, out, sizeof ref, cudaMemcpyDeviceToHost));
               CK(cudaMemset(out, 0x5a, 32 * sizeof(Out))); probe<3><<<1, 32>>>(a); }
        CK(cudaGetLastError());
        CK(cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost));
        for (int l = 0; l < n; ++l) {
          const bool bad = ref[l].rk != got[l].rk || (pair == 0 && (ref[l].lead != got[l].lead || ref[l].j != got[l].j ||
                                                                    (ref[l].lead && ref[l].tot != got[l].tot))) ||
                           (pair == 1 && ref[l].tot != got[l].tot);
          if (bad && fails++ < 5)
            std::printf("MISMATCH %s pair %d lane %d: rk %d/%d lead %d/%d j %d/%d tot %d/%d\n", s.name, pair, l, ref[l].rk,
                        got[l].rk, ref[l].lead, got[l].lead, ref[l].j, got[l].j, ref[l].tot, got[l].tot);
        }
      }
    }
    for (int nw : {1, 3, 6, 14}) {
      double c[4];
      for (int v = 0; v < 4; ++v) {
        Args a{keys, n, s.K, L, s.W, ebits, wbits, nw, zero, out, cyc};
        long long best = 1ll << 60;
        for (int rep = 0; rep < 5; ++rep) {
          if (v == 0) probe<0><<<1, 448>>>(a);
          if (v == 1) probe<1><<<1, 448>>>(a);
          if (v == 2) probe<2><<<1, 448>>>(a);
          if (v == 3) probe<3><<<1, 448>>>(a);
          CK(cudaDeviceSynchronize());
          long long h;
          CK(cudaMemcpy(&h, cyc, 8, cudaMemcpyDeviceToHost));
          best = std::min(best, h);
        }
        c[v] = static_cast<double>(best) / kIters;
      }
      std::printf("%-18s warps %2d: three matches %6.1f cyc, ballots %6.1f cyc | one match %6.1f, ballots %6.1f (ebits %d wbits %d)\n",
                  s.name, nw, c[0], c[1], c[2], c[3], ebits, wbits);
    }
  }
  std::printf(fails ? "CHECK FAILED: %d mismatches\n" : "check passed (200 random key sets per shape, both pairs)\n", fails);
  return fails ? 1 : 0;
}
