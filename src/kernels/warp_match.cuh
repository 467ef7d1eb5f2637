// Warp-level grouping of equal keys without MATCH.ANY. Header-only and free of the library's other
// device code, so that a GPU test (tests/gpu/test_warp_match.cu) compiles it on its own.
#pragma once

#include <cuda_runtime.h>

namespace epkit::kernels {

// __match_any_sync(0xffffffff, key) for keys in [0, 2^bits), from one ballot per bit: lane i is in
// lane l's mask when every bit of their keys agrees. A negative key matches only its own lane (the
// library's callers ignore such lanes' masks). bits <= 12 covers any expert (kMaxExperts = 4096)
// and any rank (kMaxWorldSize = 1024; config.cpp). Every lane of the warp must call it, with the
// same bits.
// Why not MATCH.ANY: its time grows with the number of distinct keys in the warp (session 35's probe,
// bench/results/ab-w1-s35/match_probe.cu, one H100: 156 cycles for 9 distinct keys, 387 for 33),
// and the ballots' does not. Four ballots a pass, independent of each other (one per pass, rolled,
// was about 40 cycles a bit: each waited for the last; all twelve unrolled cost what a key of a
// few bits does not need). docs/perf-notes/2026-12-06-ballot-matches-s35.md has what it gave.
__device__ __forceinline__ unsigned match_key_bits(int key, int bits) {
  unsigned m = __ballot_sync(0xffffffffu, key >= 0);
#pragma unroll 1
  for (int b0 = 0; b0 < bits; b0 += 4) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int b = b0 + i;
      const bool x = b < bits && ((key >> b) & 1);  // past bits: every lane false, m unchanged
      const unsigned v = __ballot_sync(0xffffffffu, x);
      m &= x ? v : ~v;
    }
  }
  return key >= 0 ? m : 1u << (threadIdx.x % 32);
}

// The bits match_key_bits needs for keys in [0, n).
__device__ __forceinline__ int match_key_width(int n) { return n <= 1 ? 0 : 32 - __clz(n - 1); }

// The lanes of token u when lane i holds entry i % K of token i / K (1 <= K, u * K < 32).
__device__ __forceinline__ unsigned token_lanes(int u, int K) {
  return (K >= 32 ? 0xffffffffu : (1u << K) - 1u) << (u * K);
}

}  // namespace epkit::kernels
