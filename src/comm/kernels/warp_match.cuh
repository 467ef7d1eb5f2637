// Warp-level grouping of equal keys without MATCH.ANY. Header-only and free of the library's other
// device code, so that a GPU test (tests/gpu/test_warp_match.cu) compiles it on its own.
#pragma once

#include <cuda_runtime.h>

namespace epkit::kernels {

// __match_any_sync(0xffffffff, key) for keys in [0, 2^bits), from one ballot per bit: lane i is in
// lane l's mask when every bit of their keys agrees. A negative key matches only its own lane.
// bits <= 12 covers any expert (kMaxExperts = 4096) and any rank (kMaxWorldSize = 1024;
// config.cpp). Every lane of the warp must call it, with the same bits. Four ballots a pass,
// independent of each other: one ballot a pass in a rolled loop was about 40 cycles a bit (each
// waited for the last), all twelve unrolled cost what a key of a few bits does not need.
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

// The lanes holding the same key as this one, keys in [0, 2^bits) or negative (the masks of lanes
// with a negative key are not defined: the callers ignore them), by whichever of MATCH.ANY and
// match_key_bits is faster when the warp holds at most `distinct` distinct keys (negative keys
// counted as one; warp-uniform, like bits). MATCH.ANY's time grows with the distinct keys, about 10
// cycles each; match_key_bits' with the bits, about 60 cycles per pass of four. Measured with a
// probe (one H100, cycles per call with ~70 of loop around it): experts of one V3 token (9 keys) 156
// against 191, of four tokens (33 keys) 376 against 191; ranks at W = 1 (2 keys) 89 against 72, at
// W = 32 (33 keys) 298 against 201. This rule picks the faster one in each of the probe's shapes.
__device__ __forceinline__ unsigned match_groups(int key, int bits, int distinct) {
  return distinct < 6 * ((bits + 3) / 4) ? __match_any_sync(0xffffffffu, key) : match_key_bits(key, bits);
}

// The bits match_key_bits needs for keys in [0, n).
__device__ __forceinline__ int match_key_width(int n) { return n <= 1 ? 0 : 32 - __clz(n - 1); }

// The lanes of token u when lane i holds entry i % K of token i / K (1 <= K, u * K < 32).
__device__ __forceinline__ unsigned token_lanes(int u, int K) {
  return (K >= 32 ? 0xffffffffu : (1u << K) - 1u) << (u * K);
}

}  // namespace epkit::kernels
