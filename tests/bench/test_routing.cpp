// Routing generator invariants: distinct experts per token, normalised weights, determinism per DP
// group (ranks of one group must agree), and that `skewed` really is skewed.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "epkit/error.hpp"
#include "routing.hpp"

namespace epkit::bench {
namespace {

void expect_valid(const GroupRouting& r, const RoutingSpec& s) {
  ASSERT_EQ(r.topk_idx.size(), static_cast<size_t>(r.num_tokens) * s.topk);
  for (int t = 0; t < r.num_tokens; ++t) {
    std::set<int> seen;
    double wsum = 0;
    for (int k = 0; k < s.topk; ++k) {
      const int e = r.topk_idx[static_cast<size_t>(t) * s.topk + k];
      EXPECT_GE(e, 0);
      EXPECT_LT(e, s.num_experts);
      EXPECT_TRUE(seen.insert(e).second) << "duplicate expert " << e << " in token " << t;
      const float w = r.topk_weights[static_cast<size_t>(t) * s.topk + k];
      EXPECT_GT(w, 0.f);
      wsum += w;
    }
    EXPECT_NEAR(wsum, 1.0, 1e-5);
  }
}

TEST(BenchRouting, UniformAndSkewedHaveNoDuplicates) {
  for (RoutingKind kind : {RoutingKind::kUniform, RoutingKind::kSkewed}) {
    for (auto [E, K] : {std::pair{256, 8}, std::pair{64, 6}, std::pair{8, 8}, std::pair{16, 1}}) {
      RoutingSpec s{kind, E, K, 1.0, 7};
      expect_valid(make_group_routing(s, 0, 300), s);
    }
    RoutingSpec steep{kind, 32, 16, 8.0, 3};  // extreme skew still yields K distinct experts
    expect_valid(make_group_routing(steep, 1, 100), steep);
  }
}

TEST(BenchRouting, DeterministicPerGroup) {
  RoutingSpec s{RoutingKind::kUniform, 256, 8, 1.0, 42};
  const GroupRouting a = make_group_routing(s, 3, 64);
  const GroupRouting b = make_group_routing(s, 3, 64);  // another rank of group 3
  EXPECT_EQ(a.topk_idx, b.topk_idx);
  EXPECT_EQ(a.topk_weights, b.topk_weights);
  EXPECT_NE(make_group_routing(s, 4, 64).topk_idx, a.topk_idx);  // other groups differ
  s.seed = 43;
  EXPECT_NE(make_group_routing(s, 3, 64).topk_idx, a.topk_idx);
  EXPECT_TRUE(make_group_routing(s, 0, 0).topk_idx.empty());
}

TEST(BenchRouting, UniformCoversExpertsEvenly) {
  RoutingSpec s{RoutingKind::kUniform, 64, 6, 1.0, 5};
  const GroupRouting r = make_group_routing(s, 0, 4096);
  std::vector<int> count(64, 0);
  for (int e : r.topk_idx) ++count[e];
  const double expect = 4096.0 * 6 / 64;  // 384
  for (int c : count) EXPECT_NEAR(c, expect, 0.25 * expect);
}

TEST(BenchRouting, SkewedFollowsPopularity) {
  RoutingSpec s{RoutingKind::kSkewed, 256, 8, 1.0, 9};
  const std::vector<double> pop = expert_popularity(s);
  EXPECT_NEAR(std::accumulate(pop.begin(), pop.end(), 0.0), 1.0, 1e-12);
  const int hot = static_cast<int>(std::max_element(pop.begin(), pop.end()) - pop.begin());
  const GroupRouting r = make_group_routing(s, 0, 2000);
  std::vector<int> count(256, 0);
  for (int e : r.topk_idx) ++count[e];
  // The most popular expert is picked by most tokens; a uniform draw would give 2000 * 8 / 256 = 62.5.
  EXPECT_GT(count[hot], 1000);
  EXPECT_EQ(std::max_element(count.begin(), count.end()) - count.begin(), hot);
  // The hot expert is the same for every group (one permutation per seed).
  EXPECT_EQ(expert_popularity(s), pop);
  RoutingSpec u{RoutingKind::kUniform, 256, 8, 1.0, 9};
  for (double p : expert_popularity(u)) EXPECT_DOUBLE_EQ(p, 1.0 / 256);
}

TEST(BenchRouting, Errors) {
  EXPECT_THROW(make_group_routing({RoutingKind::kUniform, 4, 8, 1.0, 1}, 0, 1), epkit::Error);
  EXPECT_THROW(make_group_routing({RoutingKind::kUniform, 0, 1, 1.0, 1}, 0, 1), epkit::Error);
  EXPECT_THROW(make_group_routing({RoutingKind::kUniform, 8, 1, 1.0, 1}, 0, -1), epkit::Error);
}

}  // namespace
}  // namespace epkit::bench
