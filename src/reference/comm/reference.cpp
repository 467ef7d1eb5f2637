#include "reference/comm/reference.hpp"

#include <algorithm>
#include <cmath>

#include "epkit/error.hpp"

namespace epkit::ref {

namespace {
bool valid_expert(const AllToAllConfig& cfg, int32_t e) { return e >= 0 && e < cfg.num_experts; }
}  // namespace

std::vector<std::vector<Slot>> dispatch_slots(const AllToAllConfig& cfg, int rank,
                                              const std::vector<GroupRouting>& groups) {
  EPKIT_CHECK(static_cast<int>(groups.size()) == num_dp_groups(cfg), "reference: ", groups.size(),
              " group routings given, expected W / D = ", num_dp_groups(cfg));
  const int L = num_local_experts(cfg), K = cfg.topk, W = cfg.world_size, D = cfg.dp_size;
  for (int g = 0; g < static_cast<int>(groups.size()); ++g)
    EPKIT_CHECK(groups[g].topk_idx.size() >= static_cast<size_t>(groups[g].num_tokens) * K, "reference: group ", g,
                " has ", groups[g].topk_idx.size(), " indices for ", groups[g].num_tokens, " tokens x K = ", K);
  std::vector<std::vector<Slot>> out(L);
  for (int i = 0; i < W; ++i) {
    const int s = (rank + i) % W, g = s / D;  // sender s sends tokens t of group g with t % D == s % D
    const auto& r = groups[g];
    for (int t = s % D; t < r.num_tokens; t += D)
      for (int k = 0; k < K; ++k) {
        const int32_t e = r.topk_idx[static_cast<size_t>(t) * K + k];
        if (!valid_expert(cfg, e) || e / L != rank) continue;
        out[e % L].push_back(Slot{g, t, k});
      }
  }
  return out;
}

std::vector<int> expert_counts(const AllToAllConfig& cfg, int rank, const std::vector<GroupRouting>& groups) {
  auto slots = dispatch_slots(cfg, rank, groups);
  std::vector<int> c(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) c[i] = static_cast<int>(slots[i].size());
  return c;
}

ExpertPlacement expert_placement(const AllToAllConfig& cfg, int rank, const std::vector<GroupRouting>& groups) {
  return ExpertPlacement::make(cfg, expert_counts(cfg, rank, groups));
}

Drops dispatch_drops(const AllToAllConfig& cfg, const std::vector<GroupRouting>& groups) {
  Drops d;
  for (int rank = 0; rank < cfg.world_size; ++rank) {
    const auto slots = dispatch_slots(cfg, rank, groups);
    const ExpertPlacement pl = ExpertPlacement::make(cfg, expert_counts(cfg, rank, groups));
    for (size_t el = 0; el < slots.size(); ++el) {
      const auto& v = slots[el];
      const size_t placed = static_cast<size_t>(pl.count[el]);
      for (size_t lo = 0; lo < v.size();) {  // one run per sender
        const int sender = dp_sender_rank(cfg, v[lo].group, v[lo].token);
        size_t hi = lo;
        while (hi < v.size() && dp_sender_rank(cfg, v[hi].group, v[hi].token) == sender) ++hi;
        if (hi > placed) {
          auto& into = lo >= placed ? d.dropped : d.maybe_dropped;
          into.insert(into.end(), v.begin() + lo, v.begin() + hi);
        }
        lo = hi;
      }
    }
  }
  return d;
}

std::vector<int> destination_ranks(const AllToAllConfig& cfg, const int32_t* row) {
  const int L = num_local_experts(cfg);
  std::vector<int> d;
  for (int k = 0; k < cfg.topk; ++k)
    if (valid_expert(cfg, row[k])) d.push_back(row[k] / L);
  std::sort(d.begin(), d.end());
  d.erase(std::unique(d.begin(), d.end()), d.end());
  return d;
}

// One pass over each token's valid entries, in double, calling f once per entry: sum_k w * y and
// sum_k |w * y|. combine and combine_abs return one of the two.
CombineSums combine_with_abs(const AllToAllConfig& cfg, const GroupRouting& r, const std::vector<float>& w,
                             const std::function<void(int, int, float*)>& f) {
  const int K = cfg.topk, H = cfg.hidden;
  EPKIT_CHECK(w.size() >= static_cast<size_t>(r.num_tokens) * K, "reference: ", w.size(), " weights for ",
              r.num_tokens, " tokens x K = ", K);
  CombineSums s;
  s.sum.assign(static_cast<size_t>(r.num_tokens) * H, 0.f);
  s.abs.assign(static_cast<size_t>(r.num_tokens) * H, 0.f);
  std::vector<double> acc(H), acc_abs(H);
  std::vector<float> y(H);
  for (int t = 0; t < r.num_tokens; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0);
    std::fill(acc_abs.begin(), acc_abs.end(), 0.0);
    for (int k = 0; k < K; ++k) {
      const int32_t e = r.topk_idx[static_cast<size_t>(t) * K + k];
      if (!valid_expert(cfg, e)) continue;
      f(e, t, y.data());
      const double wk = w[static_cast<size_t>(t) * K + k];
      for (int h = 0; h < H; ++h) {
        const double v = wk * y[h];
        acc[h] += v;
        acc_abs[h] += std::abs(v);
      }
    }
    for (int h = 0; h < H; ++h) {
      s.sum[static_cast<size_t>(t) * H + h] = static_cast<float>(acc[h]);
      s.abs[static_cast<size_t>(t) * H + h] = static_cast<float>(acc_abs[h]);
    }
  }
  return s;
}

std::vector<float> combine(const AllToAllConfig& cfg, const GroupRouting& r, const std::vector<float>& w,
                           const std::function<void(int, int, float*)>& f) {
  return combine_with_abs(cfg, r, w, f).sum;
}

std::vector<float> combine_abs(const AllToAllConfig& cfg, const GroupRouting& r, const std::vector<float>& w,
                               const std::function<void(int, int, float*)>& f) {
  return combine_with_abs(cfg, r, w, f).abs;
}

}  // namespace epkit::ref
