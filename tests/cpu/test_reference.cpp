// The reference oracle's own invariants, on random routings.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <cmath>
#include <set>
#include <tuple>

#include "reference/comm/reference.hpp"

namespace epkit {
namespace {

AllToAllConfig cfg(int W, int D, int E, int K, int H, int M) {
  AllToAllConfig c;
  c.world_size = W, c.rank = 0, c.dp_size = D, c.num_experts = E, c.topk = K, c.hidden = H;
  c.max_tokens_per_rank = M;
  return c;
}

std::vector<ref::GroupRouting> random_routing(const AllToAllConfig& c, std::mt19937& rng) {
  std::vector<ref::GroupRouting> g(num_dp_groups(c));
  for (auto& r : g) {
    r.num_tokens = rng() % (c.max_tokens_per_rank + 1);
    r.topk_idx.resize(static_cast<size_t>(c.max_tokens_per_rank) * c.topk);
    for (auto& v : r.topk_idx) {
      const int u = rng() % 20;
      v = u == 0 ? -1 : (u == 1 ? c.num_experts + 3 : static_cast<int>(rng() % c.num_experts));
    }
  }
  return g;
}

TEST(Reference, EveryValidEntryLandsExactlyOnceOnItsExpertsRank) {
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 100; ++trial) {
    const int W = 1 << (rng() % 4), D = 1 << (rng() % (1 + __builtin_ctz(W)));
    const AllToAllConfig c = cfg(W, D, W * (1 + rng() % 8), 1 + rng() % 8, 16, 1 + rng() % 40);
    if (c.topk > c.num_experts) continue;
    const auto g = random_routing(c, rng);
    size_t valid = 0;
    for (const auto& r : g)
      for (int t = 0; t < r.num_tokens; ++t)
        for (int k = 0; k < c.topk; ++k) {
          const int e = r.topk_idx[t * c.topk + k];
          valid += e >= 0 && e < c.num_experts;
        }
    std::set<std::tuple<int, int, int>> seen;
    size_t total = 0;
    for (int rank = 0; rank < W; ++rank) {
      const auto slots = ref::dispatch_slots(c, rank, g);
      const auto counts = ref::expert_counts(c, rank, g);
      ASSERT_EQ(static_cast<int>(slots.size()), num_local_experts(c));
      for (size_t el = 0; el < slots.size(); ++el) {
        ASSERT_EQ(counts[el], static_cast<int>(slots[el].size()));
        for (const auto& s : slots[el]) {
          const int e = g[s.group].topk_idx[s.token * c.topk + s.k];
          EXPECT_EQ(e, rank * num_local_experts(c) + static_cast<int>(el));
          EXPECT_LT(s.token, g[s.group].num_tokens);
          EXPECT_TRUE(seen.insert({s.group, s.token, s.k}).second);
          ++total;
        }
      }
    }
    EXPECT_EQ(total, valid);
  }
}

// expert_x's runs: the receiving rank's own tokens first, then the other senders going up from it
// (wrapping); the reference lists each sender's entries in (token, k) order.
TEST(Reference, SlotOrderStartsWithOwnTokensThenSendersAfterUs) {
  using S = ref::Slot;
  const AllToAllConfig c = cfg(2, 1, 4, 2, 16, 4);  // experts 0-1 on rank 0, 2-3 on rank 1
  std::vector<ref::GroupRouting> g(2);
  g[0] = {2, {0, 2, /**/ 2, 1}};
  g[1] = {2, {3, 2, /**/ 2, 0}};
  const auto r1 = ref::dispatch_slots(c, 1, g);
  EXPECT_EQ(r1[0], (std::vector<S>{{1, 0, 1}, {1, 1, 0}, {0, 0, 1}, {0, 1, 0}}));  // expert 2: group 1 first
  EXPECT_EQ(r1[1], (std::vector<S>{{1, 0, 0}}));
  const auto r0 = ref::dispatch_slots(c, 0, g);
  EXPECT_EQ(r0[0], (std::vector<S>{{0, 0, 0}, {1, 1, 1}}));  // expert 0: rank 0's own token first
  EXPECT_EQ(r0[1], (std::vector<S>{{0, 1, 1}}));

  // dp_size 2: rank 2 (group 1, even tokens) takes its own tokens, then rank 3's (group 1, odd),
  // rank 0's (group 0, even) and rank 1's (group 0, odd).
  const AllToAllConfig d = cfg(4, 2, 4, 1, 16, 4);  // expert 2 on rank 2
  std::vector<ref::GroupRouting> h(2);
  h[0] = {4, {2, 2, 2, 2}};
  h[1] = {3, {2, 2, 2}};
  EXPECT_EQ(ref::dispatch_slots(d, 2, h)[0],
            (std::vector<S>{{1, 0, 0}, {1, 2, 0}, {1, 1, 0}, {0, 0, 0}, {0, 2, 0}, {0, 1, 0}, {0, 3, 0}}));
  // Rank 1 (group 0, odd tokens) starts with its own tokens, then ranks 2, 3 and 0.
  std::vector<ref::GroupRouting> h1(2);
  h1[0] = {4, {1, 1, 1, 1}};
  h1[1] = {2, {1, 1}};
  EXPECT_EQ(ref::dispatch_slots(d, 1, h1)[0],
            (std::vector<S>{{0, 1, 0}, {0, 3, 0}, {1, 0, 0}, {1, 1, 0}, {0, 0, 0}, {0, 2, 0}}));
}

TEST(Reference, DestinationRanksAreDistinctSortedAndSkipInvalid) {
  const AllToAllConfig c = cfg(4, 1, 16, 6, 16, 4);
  const int32_t row[6] = {15, -1, 3, 2, 99, 14};
  EXPECT_EQ(ref::destination_ranks(c, row), (std::vector<int>{0, 3}));
}

TEST(Reference, CombineIsTheWeightedSumAndLinear) {
  std::mt19937 rng(std::random_device{}());
  const AllToAllConfig c = cfg(2, 1, 8, 3, 32, 5);
  ref::GroupRouting r;
  r.num_tokens = 5;
  r.topk_idx = {0, 1, 2, 7, -1, 7, 3, 3, 3, -1, -1, -1, 4, 9, 5};  // duplicates, masks, one index >= E
  std::vector<float> w(15);
  for (auto& x : w) x = std::uniform_real_distribution<float>(-1, 1)(rng);
  auto f = [&](int e, int t, float* y) {
    for (int h = 0; h < c.hidden; ++h) y[h] = static_cast<float>(e * 100 + t * 10 + h);
  };
  const auto out = ref::combine(c, r, w, f);
  for (int t = 0; t < 5; ++t)
    for (int h = 0; h < c.hidden; ++h) {
      double want = 0;
      for (int k = 0; k < 3; ++k) {
        const int e = r.topk_idx[t * 3 + k];
        if (e >= 0 && e < 8) want += w[t * 3 + k] * (e * 100 + t * 10 + h);
      }
      EXPECT_NEAR(out[t * c.hidden + h], want, 1e-3 * (1 + std::abs(want)));
    }
  // Token 3 has no valid expert: zeros.
  for (int h = 0; h < c.hidden; ++h) EXPECT_EQ(out[3 * c.hidden + h], 0.f);
  // Doubling the weights doubles the result; |w*y| bounds |sum|.
  std::vector<float> w2(w);
  for (auto& x : w2) x *= 2;
  const auto out2 = ref::combine(c, r, w2, f);
  const auto mag = ref::combine_abs(c, r, w, f);
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_NEAR(out2[i], 2 * out[i], 1e-3 * (1 + std::abs(out[i])));
    EXPECT_LE(std::abs(out[i]), mag[i] * (1 + 1e-6) + 1e-6);
  }
  // Both sums in one pass: the same values bit for bit, and the expert function called once per
  // valid entry (10 of the 15 here) instead of once per sum.
  int calls = 0;
  auto counted = [&](int e, int t, float* y) {
    ++calls;
    f(e, t, y);
  };
  const ref::CombineSums both = ref::combine_with_abs(c, r, w, counted);
  EXPECT_EQ(calls, 10);
  ASSERT_EQ(both.sum.size(), out.size());
  ASSERT_EQ(both.abs.size(), mag.size());
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(both.sum[i], out[i]) << i;
    EXPECT_EQ(both.abs[i], mag[i]) << i;
  }
}

// Drops against the placement: with room for everything nothing drops; with too little, the entries
// surely dropped plus those maybe dropped cover exactly the shortfall's runs, per layout.
TEST(Reference, DropsFollowThePlacement) {
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 200; ++trial) {
    const int W = 1 << (rng() % 3);
    AllToAllConfig c = cfg(W, 1, W * (1 + rng() % 4), 1 + rng() % 3, 16, 1 + rng() % 12);
    if (c.topk > c.num_experts) continue;
    const bool packed = rng() % 2;
    if (packed) {
      c.layout = ExpertLayout::kPacked;
      c.packed_row_align = 1 + rng() % 4;
    }
    auto g = random_routing(c, rng);
    for (auto& r : g)  // distinct experts per token (or none), for which the defaults cannot overflow
      for (int t = 0; t < c.max_tokens_per_rank; ++t)
        for (int k = 0; k < c.topk; ++k) {
          int32_t& e = r.topk_idx[t * c.topk + k];
          e = rng() % 3 == 0 ? -1 : (t + k) % c.num_experts;
        }
    validate(c);
    EXPECT_TRUE(ref::dispatch_drops(c, g).dropped.empty());  // the defaults never overflow
    EXPECT_TRUE(ref::dispatch_drops(c, g).maybe_dropped.empty());
    if (packed) {
      const int64_t rows = c.packed_row_align * static_cast<int64_t>(1 + rng() % 4);
      c.packed_rows = static_cast<int>(std::min(rows, packed_row_bound(c) / c.packed_row_align * c.packed_row_align));
    } else {
      c.capacity = 1 + static_cast<int>(rng() % std::min(3, c.max_tokens_per_rank * W));
    }
    validate(c);
    const ref::Drops d = ref::dispatch_drops(c, g);
    size_t lost = 0;
    for (int rank = 0; rank < W; ++rank) {
      const ExpertPlacement pl = ref::expert_placement(c, rank, g);
      const auto want = ref::expert_counts(c, rank, g);
      for (size_t el = 0; el < want.size(); ++el) {
        EXPECT_LE(pl.count[el], want[el]);
        lost += want[el] - pl.count[el];
        if (packed) EXPECT_LE(pl.first_row[el] + pl.count[el], effective_packed_rows(c));
      }
    }
    EXPECT_LE(d.dropped.size(), lost);
    EXPECT_GE(d.dropped.size() + d.maybe_dropped.size(), lost);
    EXPECT_EQ(lost == 0, d.dropped.empty() && d.maybe_dropped.empty());
  }
}

}  // namespace
}  // namespace epkit
