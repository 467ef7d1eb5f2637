// The grouped router of one token on one warp, everything in registers (RouterKernel::kWarpGrouped):
// shared by the router kernel and the fused gate + router kernel. Lane l holds the scores of
// experts [l V, l V + V) (E = 32 V). Semantics and bits: epkit/moe/router.hpp.
//
// A group's score comes from each lane's top two keys merged across the group's lanes by xor
// shuffles (groups are whole sets of lanes_per_group lanes); each lane ranks its group against the
// others' scores by shuffles; K rounds of warp arg-max (redux.sync max over order keys, then the
// lowest lane holding the maximum, whose lowest slot holds it: the lowest expert index) keep the
// unbiased score beside each key, so nothing is recomputed in the rounds. No shared memory, no
// barrier. Every lane of the warp must call it (full-mask collectives).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "moe/kernel_util.cuh"
#include "moe/moe_math.hpp"

namespace epkit::moe::detail {

struct WarpRoute {
  int topk;             // K <= 32
  int topk_groups;
  int lanes_per_group;  // a power of two: 32 / num_groups when groups are dropped, else 32
  bool use_groups;      // topk_groups < num_groups
  float scaling;
  int32_t* topk_idx;    // [rows, K]
  float* topk_weights;  // [rows, K]
};

// Lane `lane`'s V scores of one row (V sizeof(T) bytes at byte offset lane V sizeof(T)), in the
// widest loads the row's alignment allows (the row is 16-byte aligned: checked on the host).
template <typename T, int V>
__device__ __forceinline__ void load_lane_scores(const T* row, int lane, float (&x)[V]) {
  constexpr int kBytes = V * static_cast<int>(sizeof(T));
  constexpr int kWords = kBytes / 4;
  uint32_t w[kWords];
  const char* src = reinterpret_cast<const char*>(row) + static_cast<size_t>(lane) * kBytes;
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(src) + i);
      w[4 * i] = u.x, w[4 * i + 1] = u.y, w[4 * i + 2] = u.z, w[4 * i + 3] = u.w;
    }
  } else if constexpr (kBytes == 8) {
    const uint2 u = __ldg(reinterpret_cast<const uint2*>(src));
    w[0] = u.x, w[1] = u.y;
  } else {
    static_assert(kBytes == 4, "2 to 16 scores per lane");
    w[0] = __ldg(reinterpret_cast<const unsigned int*>(src));
  }
  if constexpr (sizeof(T) == 2) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      x[2 * i] = __uint_as_float(w[i] << 16);
      x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) x[i] = __uint_as_float(w[i]);
  }
}

// The lane's V correction biases (0 without a bias).
template <int V>
__device__ __forceinline__ void load_lane_bias(const float* bias, int lane, float (&b)[V]) {
#pragma unroll
  for (int j = 0; j < V; ++j) b[j] = bias != nullptr ? __ldg(bias + lane * V + j) : 0.0f;
}

// The lane's best candidate: the largest key, the lowest slot among equal keys, and its unbiased
// score. A tree over adjacent slots (the left operand always holds the lower slots, so a tie keeps
// it): log2(V) levels deep.
template <int V>
__device__ __forceinline__ void lane_best(const uint32_t (&key)[V], const float (&s)[V], uint32_t& bk, int& bj,
                                          float& bs) {
  uint32_t k[V];
  int j[V];
  float v[V];
#pragma unroll
  for (int i = 0; i < V; ++i) k[i] = key[i], j[i] = i, v[i] = s[i];
#pragma unroll
  for (int step = 1; step < V; step *= 2) {
#pragma unroll
    for (int i = 0; i < V; i += 2 * step) {
      const bool take = k[i + step] > k[i];
      k[i] = take ? k[i + step] : k[i];
      j[i] = take ? j[i + step] : j[i];
      v[i] = take ? v[i + step] : v[i];
    }
  }
  bk = k[0], bj = j[0], bs = v[0];
}

// Routes token t from its logits (s, overwritten with the sigmoid scores) and writes its K indices
// and weights.
template <int V>
__device__ __forceinline__ void warp_route_token(const WarpRoute& p, int lane, int t, float (&s)[V],
                                                 const float (&bias)[V]) {
  namespace m = math;
  uint32_t key[V];  // order keys of s' = s + bias; 0 = not a candidate
#pragma unroll
  for (int j = 0; j < V; ++j) {
    s[j] = m::sigmoid(s[j]);
    key[j] = m::order_key(m::fadd(s[j], bias[j]));
  }
  if (p.use_groups) {
    // The group's two largest keys: each lane's top two, merged over the group's lanes. A key
    // names its value up to the sign of a zero and the payload of a NaN, neither of which changes
    // the key of the sum, so the group key equals the reference's.
    const int lpg = p.lanes_per_group;
    uint32_t k1 = 0u, k2 = 0u;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      k2 = max(k2, min(k1, key[j]));
      k1 = max(k1, key[j]);
    }
    for (int off = 1; off < lpg; off <<= 1) {
      const uint32_t o1 = __shfl_xor_sync(kFullMask, k1, off), o2 = __shfl_xor_sync(kFullMask, k2, off);
      k2 = max(min(k1, o1), max(k2, o2));
      k1 = max(k1, o1);
    }
    const uint32_t gkey = m::order_key(m::fadd(m::key_value(k1), m::key_value(k2)));
    // The group's rank: the groups with a larger score, or an equal one and a lower index.
    const int groups = 32 / lpg, my_group = lane / lpg;
    int better = 0;
#pragma unroll 8
    for (int h = 0; h < groups; ++h) {
      const uint32_t kh = __shfl_sync(kFullMask, gkey, h * lpg);
      better += (kh > gkey) | ((kh == gkey) & (h < my_group));
    }
    if (better >= p.topk_groups) {
#pragma unroll
      for (int j = 0; j < V; ++j) key[j] = 0u;
    }
  }

  uint32_t bk;
  int bj;
  float bs;
  lane_best<V>(key, s, bk, bj, bs);
  int my_idx = 0;
  float my_s = 0.0f, sum = 0.0f;
  for (int k = 0; k < p.topk; ++k) {
    const uint32_t best = __reduce_max_sync(kFullMask, bk);
    const int w = __ffs(__ballot_sync(kFullMask, bk == best)) - 1;
    const int wj = __shfl_sync(kFullMask, bj, w);
    const float ws = __shfl_sync(kFullMask, bs, w);
    sum = m::fadd(sum, ws);
    if (lane == k) my_idx = w * V + wj, my_s = ws;
    const bool mine = lane == w;
#pragma unroll
    for (int j = 0; j < V; ++j) key[j] = mine && j == bj ? 0u : key[j];
    lane_best<V>(key, s, bk, bj, bs);
  }
  if (lane < p.topk) {
    const size_t o = static_cast<size_t>(t) * p.topk + lane;
    p.topk_idx[o] = my_idx;
    p.topk_weights[o] = m::fmul(m::fdiv(my_s, sum), p.scaling);
  }
}

}  // namespace epkit::moe::detail
