#include "routing.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "epkit/error.hpp"

namespace epkit::bench {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Our own generator and conversion: std:: distributions differ between standard libraries, and the
// ranks of a group must agree bit for bit.
struct Rng {
  uint64_t state;
  uint64_t next() { return state = splitmix64(state); }
  double uniform_open() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }  // (0, 1)
};

void check_spec(const RoutingSpec& spec) {
  EPKIT_CHECK(spec.num_experts >= 1, "routing: num_experts ", spec.num_experts, " must be >= 1");
  EPKIT_CHECK(spec.topk >= 1 && spec.topk <= spec.num_experts, "routing: topk ", spec.topk,
              " must be in [1, num_experts = ", spec.num_experts, "]");
}

}  // namespace

uint64_t mix_seed(uint64_t seed, uint64_t stream) { return splitmix64(splitmix64(seed) ^ (stream + 1)); }

std::vector<double> expert_popularity(const RoutingSpec& spec) {
  check_spec(spec);
  const int E = spec.num_experts;
  std::vector<double> w(E, 1.0 / E);
  if (spec.kind == RoutingKind::kUniform) return w;
  // Zipf weights by popularity rank, assigned to experts through a seeded shuffle (stream 0 of the seed
  // is reserved for it; groups use streams 1..).
  std::vector<int> order(E);
  std::iota(order.begin(), order.end(), 0);
  Rng rng{mix_seed(spec.seed, 0)};
  for (int i = E - 1; i > 0; --i) std::swap(order[i], order[rng.next() % static_cast<uint64_t>(i + 1)]);
  double sum = 0;
  for (int i = 0; i < E; ++i) sum += 1.0 / std::pow(i + 1.0, spec.zipf_s);
  for (int i = 0; i < E; ++i) w[order[i]] = 1.0 / std::pow(i + 1.0, spec.zipf_s) / sum;
  return w;
}

GroupRouting make_group_routing(const RoutingSpec& spec, int group, int num_tokens) {
  check_spec(spec);
  EPKIT_CHECK(num_tokens >= 0, "routing: num_tokens ", num_tokens, " must be >= 0");
  const int E = spec.num_experts, K = spec.topk;
  const std::vector<double> pop = expert_popularity(spec);
  std::vector<double> log_w(E);
  for (int e = 0; e < E; ++e) log_w[e] = std::log(pop[e]);

  GroupRouting r;
  r.num_tokens = num_tokens;
  r.topk_idx.resize(static_cast<size_t>(num_tokens) * K);
  r.topk_weights.resize(static_cast<size_t>(num_tokens) * K);
  Rng rng{mix_seed(spec.seed, static_cast<uint64_t>(group) + 1)};
  std::vector<std::pair<double, int>> keys(E);
  for (int t = 0; t < num_tokens; ++t) {
    // Efraimidis-Spirakis: the K largest keys log(u)/w are a weighted sample without replacement
    // (compared as log(-log u) - log w to stay finite for tiny weights). Equal weights give a
    // uniformly random K-subset.
    for (int e = 0; e < E; ++e) keys[e] = {std::log(-std::log(rng.uniform_open())) - log_w[e], e};
    std::partial_sort(keys.begin(), keys.begin() + K, keys.end());
    double wsum = 0;
    for (int k = 0; k < K; ++k) {
      const size_t i = static_cast<size_t>(t) * K + k;
      r.topk_idx[i] = keys[k].second;
      r.topk_weights[i] = static_cast<float>(rng.uniform_open());
      wsum += r.topk_weights[i];
    }
    for (int k = 0; k < K; ++k) {
      float& w = r.topk_weights[static_cast<size_t>(t) * K + k];
      w = static_cast<float>(w / wsum);
    }
  }
  return r;
}

}  // namespace epkit::bench
