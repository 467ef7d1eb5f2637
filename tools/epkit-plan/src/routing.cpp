// Expected expert load under a balanced router (the deployment study, "GroupGEMM").
#include "epkit/plan/routing.hpp"

#include <algorithm>
#include <cmath>

namespace epkit::plan {

double expected_active_experts(double local_experts, int num_experts, int top_k, double tokens) {
  // A token misses a given expert with probability 1 - top_k/num_experts; tokens are independent.
  const double miss = 1.0 - double(top_k) / num_experts;
  return local_experts * (1.0 - std::pow(miss, tokens));
}

RoutingStats routing_stats(const ModelSpec& m, const DeployConfig& c, int batch) {
  RoutingStats r;
  const double tokens_per_group = double(batch) * c.query_len;
  r.tokens_in_system = tokens_per_group * dp_groups(c);
  r.copies_per_gpu = r.tokens_in_system * m.top_k / c.ep;
  r.tokens_per_expert = r.tokens_in_system * m.top_k / m.num_routed_experts;
  r.experts_per_gpu = double(m.num_routed_experts) / c.ep;
  r.active_experts_per_gpu = expected_active_experts(r.experts_per_gpu, m.num_routed_experts, m.top_k,
                                                     r.tokens_in_system);
  // The GroupGEMM only loads weights of touched experts, and its m is the load per touched expert.
  r.tokens_per_active_expert = r.copies_per_gpu / std::max(r.active_experts_per_gpu, 1e-12);
  return r;
}

}  // namespace epkit::plan
