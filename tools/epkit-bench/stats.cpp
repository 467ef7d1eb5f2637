#include "stats.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "epkit/error.hpp"

namespace epkit::bench {

double percentile_sorted(const std::vector<double>& sorted, double q) {
  EPKIT_CHECK(!sorted.empty(), "percentile of an empty sample set");
  EPKIT_CHECK(q > 0 && q <= 100, "percentile ", q, " is out of range (0, 100]");
  const double rank = std::ceil(q / 100.0 * static_cast<double>(sorted.size()));
  const size_t i = static_cast<size_t>(std::max(rank, 1.0)) - 1;
  return sorted[std::min(i, sorted.size() - 1)];
}

Summary summarize(std::vector<double> samples) {
  EPKIT_CHECK(!samples.empty(), "summary of an empty sample set");
  std::sort(samples.begin(), samples.end());
  Summary s;
  s.count = samples.size();
  const size_t n = samples.size();
  s.median = n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
  s.p99 = percentile_sorted(samples, 99.0);
  s.mean = std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(n);
  s.min = samples.front();
  s.max = samples.back();
  return s;
}

std::vector<double> max_over_ranks(const std::vector<std::vector<double>>& per_rank) {
  EPKIT_CHECK(!per_rank.empty(), "max over ranks of no ranks");
  std::vector<double> out = per_rank[0];
  for (size_t r = 1; r < per_rank.size(); ++r) {
    EPKIT_CHECK(per_rank[r].size() == out.size(), "rank ", r, " has ", per_rank[r].size(),
                " samples, rank 0 has ", out.size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = std::max(out[i], per_rank[r][i]);
  }
  return out;
}

}  // namespace epkit::bench
