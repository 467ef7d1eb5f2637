// Session 35 probe: what __match_any_sync costs against ballots over the key's bits, in the shape
// the decode send half uses them (lane i: entry i of n = tokens x K <= 32; three dependent matches:
// entries of one expert, a token's entries for one rank, the messages to one rank).
// Each variant runs kIters times in a dependent chain (the next keys depend on the last results
// through a runtime zero), in 1..14 warps of one block at once; cycles per iteration of warp 0.
// Every variant's results are checked against the matches' on fresh random keys first.
// Call 1 ran variants 0-3 of the first version (commit 9be48d6); call 2 this one: besides, the
// matches with one shared sentinel for the lanes that take no part (MATCH.ANY's time grows with the
// number of distinct keys in the warp, call 1), ballots four bits at a time (the library's
// match_key_bits since call 2), twelve ballots unrolled, and the rank key alone (the combine's token
// side).
// Build: nvcc -O3 -arch=sm_90 -std=c++17 match_probe.cu -o match_probe
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include <cuda_runtime.h>

constexpr int kIters = 256;
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); std::exit(1); } } while (0)

// __match_any_sync for keys in [0, 2^bits); a negative key matches only its own lane.
// kChunk 1: one ballot per bit in a rolled loop (call 1's library version); 4: four bits per pass,
// the passes rolled (the library's since call 2); 12: twelve ballots unrolled, bits ignored.
template <int kChunk>
__device__ __forceinline__ unsigned match_bits(int key, int bits) {
  const int lane = threadIdx.x % 32;
  unsigned m = __ballot_sync(0xffffffffu, key >= 0);
  if (kChunk == 12) bits = 12;
#pragma unroll 1
  for (int b0 = 0; b0 < bits; b0 += kChunk) {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      const int b = b0 + i;
      const bool x = b < bits && ((key >> b) & 1);
      const unsigned v = __ballot_sync(0xffffffffu, x);
      m &= x ? v : ~v;
    }
  }
  return key >= 0 ? m : 1u << lane;
}

struct Out { int rk, lead, j, tot; };

// The send half's three matches (dispatch.cu, dispatch_send_decode until session 35): lanes outside
// a group keyed -1 - lane (kShared false: unique keys) or all -1 (kShared).
template <bool kShared>
__device__ __forceinline__ Out three_matches(int e, int lu, int L, int W) {
  const int lane = threadIdx.x % 32;
  const unsigned below = (1u << lane) - 1u;
  const int r = e >= 0 ? e / L : -1;
  const int none = kShared ? -1 : -1 - lane;
  const unsigned peers = __match_any_sync(0xffffffffu, e);
  const int rk = __popc(peers & below);
  const unsigned same_msg = __match_any_sync(0xffffffffu, e >= 0 ? lu * W + r : none);
  const bool lead = e >= 0 && (same_msg & below) == 0;
  const unsigned dst = __match_any_sync(0xffffffffu, lead ? r : none);
  return {rk, lead, lead ? __popc(dst & below) : -1, __popc(dst)};
}
// The same from ballots: one key set for the expert, one for the rank; the token's lanes by mask.
// kMatchE: the expert's groups by MATCH.ANY (shared sentinel) instead.
template <int kChunk, bool kMatchE = false>
__device__ __forceinline__ Out ballots(int e, int lu, int K, int L, int ebits, int wbits) {
  const int lane = threadIdx.x % 32;
  const unsigned below = (1u << lane) - 1u;
  const int r = e >= 0 ? e / L : -1;
  const unsigned peers = kMatchE ? __match_any_sync(0xffffffffu, e) : match_bits<kChunk>(e, ebits);
  const int rk = __popc(peers & below);
  const unsigned same_r = match_bits<kChunk>(r, wbits);
  const unsigned tok = (K == 32 ? 0xffffffffu : ((1u << K) - 1u)) << (lu * K);
  const bool lead = e >= 0 && (same_r & tok & below) == 0;
  const unsigned dst = same_r & __ballot_sync(0xffffffffu, lead);
  return {rk, lead, lead ? __popc(dst & below) : -1, lead ? __popc(dst) : 1};
}
// One key's groups: kChunk 0 MATCH.ANY, else match_bits<kChunk>.
template <int kChunk>
__device__ __forceinline__ Out one_key(int key, int bits) {
  const int lane = threadIdx.x % 32;
  const unsigned peers = kChunk == 0 ? __match_any_sync(0xffffffffu, key) : match_bits<kChunk>(key, bits);
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
  const int rkey = e >= 0 ? e / a.L : -1;
  const auto run = [&]() {
    if (V == 0) o = three_matches<false>(e, lu, a.L, a.W);
    if (V == 1) o = three_matches<true>(e, lu, a.L, a.W);
    if (V == 2) o = ballots<1>(e, lu, a.K, a.L, a.ebits, a.wbits);
    if (V == 3) o = ballots<4>(e, lu, a.K, a.L, a.ebits, a.wbits);
    if (V == 4) o = ballots<4, true>(e, lu, a.K, a.L, a.ebits, a.wbits);
    if (V == 5) o = one_key<0>(e, a.ebits);
    if (V == 6) o = one_key<1>(e, a.ebits);
    if (V == 7) o = one_key<4>(e, a.ebits);
    if (V == 8) o = one_key<12>(e, a.ebits);
    if (V == 9) o = one_key<0>(rkey + (e & z), a.wbits);
    if (V == 10) o = one_key<4>(rkey + (e & z), a.wbits);
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

using Kernel = void (*)(Args);
constexpr Kernel kVariants[] = {probe<0>, probe<1>, probe<2>, probe<3>, probe<4>, probe<5>,
                                probe<6>, probe<7>, probe<8>, probe<9>, probe<10>};
const char* const kNames[] = {"3 matches (unique sentinels)", "3 matches (shared sentinel)", "3 by ballots, rolled",
                              "3 by ballots, 4 bits a pass", "expert match + rank ballots (4)", "expert: match",
                              "expert: ballots rolled", "expert: ballots 4 a pass", "expert: 12 ballots unrolled",
                              "rank: match", "rank: ballots 4 a pass"};
constexpr int kNumVariants = 11;
// The variant each is checked against: the three-match ones against 0, the expert ones against 5,
// the rank one against 9.
constexpr int kRef[kNumVariants] = {0, 0, 0, 0, 0, 5, 5, 5, 5, 9, 9};

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
      Out res[kNumVariants][32];
      for (int v = 0; v < kNumVariants; ++v) {
        Args a{keys, n, s.K, L, s.W, ebits, wbits, 1, zero, out, cyc};
        CK(cudaMemset(out, 0x5a, 32 * sizeof(Out)));
        kVariants[v]<<<1, 32>>>(a);
        CK(cudaGetLastError());
        CK(cudaMemcpy(res[v], out, sizeof res[v], cudaMemcpyDeviceToHost));
      }
      for (int v = 0; v < kNumVariants; ++v) {
        const Out* ref = res[kRef[v]];
        const Out* got = res[v];
        for (int l = 0; l < n; ++l) {
          const bool three = kRef[v] == 0;
          const bool bad = ref[l].rk != got[l].rk ||
                           (three ? ref[l].lead != got[l].lead || ref[l].j != got[l].j || (ref[l].lead && ref[l].tot != got[l].tot)
                                  : ref[l].tot != got[l].tot);
          if (bad && fails++ < 5)
            std::printf("MISMATCH %s variant %d lane %d: rk %d/%d lead %d/%d j %d/%d tot %d/%d\n", s.name, v, l, ref[l].rk,
                        got[l].rk, ref[l].lead, got[l].lead, ref[l].j, got[l].j, ref[l].tot, got[l].tot);
        }
      }
    }
    std::printf("%s (ebits %d, wbits %d): cycles per call, warp 0, with 1 / 3 / 6 / 14 warps at once\n", s.name, ebits, wbits);
    for (int v = 0; v < kNumVariants; ++v) {
      std::printf("  %-34s", kNames[v]);
      for (int nw : {1, 3, 6, 14}) {
        Args a{keys, n, s.K, L, s.W, ebits, wbits, nw, zero, out, cyc};
        long long best = 1ll << 60;
        for (int rep = 0; rep < 5; ++rep) {
          kVariants[v]<<<1, 448>>>(a);
          CK(cudaDeviceSynchronize());
          long long hc;
          CK(cudaMemcpy(&hc, cyc, 8, cudaMemcpyDeviceToHost));
          best = std::min(best, hc);
        }
        std::printf(" %7.1f", static_cast<double>(best) / kIters);
      }
      std::printf("\n");
    }
  }
  std::printf(fails ? "CHECK FAILED: %d mismatches\n" : "check passed (200 random key sets per shape, every variant)\n", fails);
  return fails ? 1 : 0;
}
