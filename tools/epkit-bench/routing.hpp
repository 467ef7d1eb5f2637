// Synthetic routing for the benchmark: seeded, reproducible, identical on every rank of a DP group.
//
// uniform: each token picks K distinct experts, every K-subset equally likely.
// skewed:  expert popularity follows a Zipf law: the i-th most popular expert has weight 1/(i+1)^s
//          (s = --zipf-s, default 1). Which experts are popular is one seeded permutation shared by
//          all groups, so the same ranks are hot everywhere (the case that loads one rank's links).
//          Each token draws K distinct experts by weighted sampling without replacement.
#pragma once

#include <cstdint>
#include <vector>

#include "options.hpp"

namespace epkit::bench {

struct RoutingSpec {
  RoutingKind kind = RoutingKind::kUniform;
  int num_experts = 0;  // E
  int topk = 0;         // K <= E
  double zipf_s = 1.0;  // skewed only
  uint64_t seed = 1;
};

struct GroupRouting {
  int num_tokens = 0;
  std::vector<int32_t> topk_idx;    // [num_tokens][K], distinct experts per token
  std::vector<float> topk_weights;  // [num_tokens][K], positive, each row sums to 1
};

// Popularity weight of every expert (sums to 1). Uniform: 1/E each.
std::vector<double> expert_popularity(const RoutingSpec& spec);

// Routing of DP group `group`. Depends only on (spec, group, num_tokens): every rank of the group,
// and every other rank that needs it for byte counting, computes the same tokens.
GroupRouting make_group_routing(const RoutingSpec& spec, int group, int num_tokens);

// A seed derived from (seed, stream): splitmix64 of both, so nearby inputs give unrelated streams.
uint64_t mix_seed(uint64_t seed, uint64_t stream);

}  // namespace epkit::bench
