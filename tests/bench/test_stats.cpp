// Median / nearest-rank p99 and the per-sample maximum over ranks.
#include <gtest/gtest.h>

#include <numeric>

#include "epkit/error.hpp"
#include "stats.hpp"

namespace epkit::bench {
namespace {

TEST(BenchStats, MedianOddAndEven) {
  EXPECT_DOUBLE_EQ(summarize({3, 1, 2}).median, 2.0);
  EXPECT_DOUBLE_EQ(summarize({4, 1, 3, 2}).median, 2.5);
  EXPECT_DOUBLE_EQ(summarize({7}).median, 7.0);
}

TEST(BenchStats, P99NearestRank) {
  std::vector<double> v(200);
  std::iota(v.begin(), v.end(), 1.0);  // 1..200, shuffled order must not matter
  std::reverse(v.begin(), v.end());
  const Summary s = summarize(v);
  EXPECT_EQ(s.count, 200u);
  EXPECT_DOUBLE_EQ(s.p99, 198.0);  // ceil(0.99 * 200) = 198th smallest
  EXPECT_DOUBLE_EQ(s.min, 1.0);
  EXPECT_DOUBLE_EQ(s.max, 200.0);
  EXPECT_DOUBLE_EQ(s.mean, 100.5);
  EXPECT_DOUBLE_EQ(s.median, 100.5);
  std::vector<double> hundred(100);
  std::iota(hundred.begin(), hundred.end(), 1.0);
  EXPECT_DOUBLE_EQ(summarize(hundred).p99, 99.0);
  EXPECT_DOUBLE_EQ(summarize({5}).p99, 5.0);
}

TEST(BenchStats, Errors) {
  EXPECT_THROW(summarize({}), epkit::Error);
  EXPECT_THROW(percentile_sorted({1.0}, 0.0), epkit::Error);
  EXPECT_THROW(percentile_sorted({1.0}, 101.0), epkit::Error);
}

TEST(BenchStats, MaxOverRanks) {
  EXPECT_EQ(max_over_ranks({{1, 5, 3}, {2, 4, 3}}), (std::vector<double>{2, 5, 3}));
  EXPECT_THROW(max_over_ranks({{1, 2}, {1}}), epkit::Error);
  EXPECT_THROW(max_over_ranks({}), epkit::Error);
}

}  // namespace
}  // namespace epkit::bench
