// Sample statistics of the benchmark. One definition of median and p99, used for every number.
#pragma once

#include <cstddef>
#include <vector>

namespace epkit::bench {

struct Summary {
  size_t count = 0;
  double median = 0;  // middle sample; mean of the two middle ones for an even count
  double p99 = 0;     // nearest rank: the ceil(0.99 * n)-th smallest sample
  double mean = 0;
  double min = 0;
  double max = 0;
};

// Throws epkit::Error on an empty sample set.
Summary summarize(std::vector<double> samples);

// Nearest-rank percentile q in (0, 100] of samples sorted ascending. Throws on empty input or q out of range.
double percentile_sorted(const std::vector<double>& sorted, double q);

// Element-wise maximum over ranks: per_rank[r][i] is rank r's sample i; all ranks hold the same count.
// A step is done when its slowest rank is, so every reported sample is this maximum.
std::vector<double> max_over_ranks(const std::vector<std::vector<double>>& per_rank);

}  // namespace epkit::bench
