// Host reference of dispatch/combine semantics: the oracle the GPU tests compare against.
// Pure C++; no CUDA. Token identity is (DP group, token index); the D ranks of a group hold the same
// tokens, so inputs are given per group.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "epkit/config.hpp"
#include "common/buffer_layout.hpp"

namespace epkit::ref {

// Routing of one DP group: m tokens, K indices each (row-major [m][K]); negative = no expert.
struct GroupRouting {
  int num_tokens = 0;
  std::vector<int32_t> topk_idx;
};

// One dispatched (token, k) pair as seen by the expert that receives it.
struct Slot {
  int group = 0;  // source DP group
  int token = 0;  // token index within the group
  int k = 0;      // which of the token's top-k entries routed it here
  bool operator==(const Slot& o) const { return group == o.group && token == o.token && k == o.k; }
};

// For rank `rank`, the (token, k) pairs each local expert receives, grouped as expert_x's slots are:
// by sending rank, starting with `rank` itself and going up from it (rank, rank + 1, ..., W - 1, 0,
// ..., rank - 1; the sender of group g's token t is dp_sender_rank(cfg, g, t)). Within one sender
// the list is in (token, k) order; the kernels guarantee only the grouping, not that order.
// Entries with an index outside [0, E) are skipped, as the kernels skip and report them.
std::vector<std::vector<Slot>> dispatch_slots(const AllToAllConfig& cfg, int rank,
                                              const std::vector<GroupRouting>& groups);

// Number of (token, k) pairs each local expert of `rank` receives (the size of each dispatch_slots list).
std::vector<int> expert_counts(const AllToAllConfig& cfg, int rank, const std::vector<GroupRouting>& groups);

// Where dispatch on `rank` puts each local expert's rows, in the config's layout: the placement of
// expert_counts (layout.hpp), with the packed offsets and what fits below capacity or R.
ExpertPlacement expert_placement(const AllToAllConfig& cfg, int rank, const std::vector<GroupRouting>& groups);

// The entries dispatch drops for lack of room, over every rank. A sender's run (dispatch_slots) that
// lies wholly past an expert's placed count is dropped; one that straddles it is partly dropped, and
// which of its entries is unspecified (the order within a run is). Both are empty without overflow.
struct Drops {
  std::vector<Slot> dropped;        // surely dropped: they contribute nothing to combine
  std::vector<Slot> maybe_dropped;  // in a straddling run
};
Drops dispatch_drops(const AllToAllConfig& cfg, const std::vector<GroupRouting>& groups);

// The destination ranks of one token: each rank holding at least one of its valid experts, ascending.
std::vector<int> destination_ranks(const AllToAllConfig& cfg, const int32_t* topk_row);

// Combine for one group: out[t][h] = sum_k w[t][k] * y(idx[t][k], t)[h], accumulated in double.
// `expert_output(expert, token, y)` fills y[0..H) with the expert's output for that token.
// Tokens with no valid expert give zeros.
std::vector<float> combine(const AllToAllConfig& cfg, const GroupRouting& routing,
                           const std::vector<float>& topk_weights,
                           const std::function<void(int expert, int token, float* y)>& expert_output);

// Same sum over |w * y|: the scale that combine tolerances are stated against.
std::vector<float> combine_abs(const AllToAllConfig& cfg, const GroupRouting& routing,
                               const std::vector<float>& topk_weights,
                               const std::function<void(int expert, int token, float* y)>& expert_output);

// Both at once, calling expert_output once per entry instead of once per sum (the GPU suite's
// checks of large calls spent most of their time in the expert function).
struct CombineSums {
  std::vector<float> sum;  // combine
  std::vector<float> abs;  // combine_abs
};
CombineSums combine_with_abs(const AllToAllConfig& cfg, const GroupRouting& routing,
                             const std::vector<float>& topk_weights,
                             const std::function<void(int expert, int token, float* y)>& expert_output);

}  // namespace epkit::ref
