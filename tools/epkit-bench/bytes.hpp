// Algorithmic bytes: the one definition of "bytes moved" that every bandwidth number of epkit-bench
// uses (docs/BENCH.md restates it). It counts the data the MoE layer must move between ranks, not
// what any implementation actually sends, so epkit and the dense baselines are divided by the same
// numerator and their GB/s compare directly.
//
//   dispatch: for every (token, remote destination rank) pair, the token's payload plus its block
//             scales: H * sizeof(dispatch dtype) + ceil(H/128) * 4 (fp8 only). A token counts once per
//             distinct destination rank holding at least one of its experts, and not at all for its
//             own rank.
//   combine:  the same pairs, each bringing back H * sizeof(combine out dtype).
//
// With dp_size D > 1 the D ranks of a group hold the same m tokens and each token leaves the group
// once, from the group member epkit::dp_sender_rank names (round-robin), so "own rank" is that sender. Delivering the combined result
// to the other D-1 group members is the library's business and is not counted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "epkit/config.hpp"
#include "epkit/types.hpp"

namespace epkit::bench {

// Bytes of one token in the dispatch direction: payload plus fp32 scales per 128 elements (fp8).
inline size_t dispatch_token_bytes(const AllToAllConfig& cfg) {
  size_t bytes = static_cast<size_t>(cfg.hidden) * dtype_size(cfg.dispatch_dtype);
  if (cfg.dispatch_dtype == DType::kFP8E4M3) {
    bytes += static_cast<size_t>((cfg.hidden + kScaleBlock - 1) / kScaleBlock) * sizeof(float);
  }
  return bytes;
}

// Bytes of one token in the combine direction: the combined output row.
inline size_t combine_token_bytes(const AllToAllConfig& cfg) {
  return static_cast<size_t>(cfg.hidden) * dtype_size(cfg.combine_out_dtype);
}

// Rank holding expert e (config.hpp: expert e lives on rank e / (E / W)).
inline int expert_owner_rank(const AllToAllConfig& cfg, int expert) {
  return expert / (cfg.num_experts / cfg.world_size);
}

// Distinct destination ranks of one token's top-k row other than `sender`. Indices outside [0, E)
// mean "no expert" and are skipped.
inline int remote_destinations(const AllToAllConfig& cfg, const int32_t* topk_row, int sender) {
  int dests[kMaxTopK];
  int n = 0;
  for (int k = 0; k < cfg.topk; ++k) {
    const int e = topk_row[k];
    if (e < 0 || e >= cfg.num_experts) continue;
    const int r = expert_owner_rank(cfg, e);
    if (r == sender) continue;
    bool seen = false;
    for (int i = 0; i < n; ++i) seen = seen || dests[i] == r;
    if (!seen) dests[n++] = r;
  }
  return n;
}

struct AlgorithmicBytes {
  uint64_t pairs = 0;          // (token, remote destination rank) pairs over all ranks
  uint64_t dispatch = 0;       // over all ranks
  uint64_t combine = 0;        // over all ranks
  double dispatch_per_rank = 0;  // dispatch / W: what GB/s and % of ceiling are computed from
  double combine_per_rank = 0;   // combine / W
};

// Sums the pairs of every DP group. group_topk[g] is group g's routing, row-major [num_tokens][K].
inline AlgorithmicBytes algorithmic_bytes(const AllToAllConfig& cfg,
                                          const std::vector<std::vector<int32_t>>& group_topk,
                                          int num_tokens) {
  AlgorithmicBytes b;
  for (size_t g = 0; g < group_topk.size(); ++g) {
    for (int t = 0; t < num_tokens; ++t) {
      const int sender = epkit::dp_sender_rank(cfg, static_cast<int>(g), t);
      b.pairs += static_cast<uint64_t>(
          remote_destinations(cfg, group_topk[g].data() + static_cast<size_t>(t) * cfg.topk, sender));
    }
  }
  b.dispatch = b.pairs * dispatch_token_bytes(cfg);
  b.combine = b.pairs * combine_token_bytes(cfg);
  b.dispatch_per_rank = static_cast<double>(b.dispatch) / cfg.world_size;
  b.combine_per_rank = static_cast<double>(b.combine) / cfg.world_size;
  return b;
}

// Dense padded baseline: bytes one rank sends to each rank (itself included), for a buffer laid out
// [W][E/W][M][token_bytes] as a padded torch all_to_all_single for MoE uses it.
inline size_t dense_bytes_per_peer(const AllToAllConfig& cfg, size_t token_bytes) {
  return static_cast<size_t>(cfg.num_experts / cfg.world_size) * static_cast<size_t>(cfg.max_tokens_per_rank) *
         token_bytes;
}

// GB/s (1e9 bytes per second) for `bytes` moved in `us` microseconds.
inline double gb_per_s(double bytes, double us) { return us > 0 ? bytes / us * 1e-3 : 0.0; }

}  // namespace epkit::bench
