// Validation and derived quantities of a deployment config.
#include "epkit/plan/config.hpp"

#include <cmath>

#include "epkit/error.hpp"

namespace epkit::plan {

std::string to_string(Schedule s) {
  switch (s) {
    case Schedule::kNoOverlap: return "none";
    case Schedule::kDispatchOverlap: return "dispatch";
    case Schedule::kMicroBatch: return "microbatch";
  }
  return "?";
}

Schedule parse_schedule(const std::string& s) {
  if (s == "none" || s == "no-overlap") return Schedule::kNoOverlap;
  if (s == "dispatch" || s == "dispatch-overlap") return Schedule::kDispatchOverlap;
  if (s == "microbatch" || s == "micro-batch") return Schedule::kMicroBatch;
  EPKIT_FAIL("unknown schedule '", s, "': expected none, dispatch or microbatch");
}

void validate(const Efficiency& e) {
  auto check = [](double v, const char* name) {
    EPKIT_CHECK(std::isfinite(v) && v > 0 && v <= 1, "efficiency ", name, " = ", v, " must be in (0, 1]");
  };
  check(e.gemm_memory, "gemm_memory");
  check(e.gemm_compute, "gemm_compute");
  check(e.attention_memory, "attention_memory");
  check(e.attention_compute, "attention_compute");
  check(e.elementwise_memory, "elementwise_memory");
  check(e.comm, "comm");
}

void validate(const DeployConfig& c, const ModelSpec& m, const GpuSpec& g) {
  EPKIT_CHECK(c.ep >= 1, "ep = ", c.ep, " must be >= 1");
  EPKIT_CHECK(c.tp >= 1, "tp = ", c.tp, " must be >= 1");
  EPKIT_CHECK(c.ep <= m.num_routed_experts, "ep = ", c.ep, " exceeds num_routed_experts = ", m.num_routed_experts,
              " of ", m.name);
  EPKIT_CHECK(m.num_routed_experts % c.ep == 0, "ep = ", c.ep, " must divide num_routed_experts = ",
              m.num_routed_experts);
  EPKIT_CHECK(c.ep % c.tp == 0, "tp = ", c.tp, " must divide ep = ", c.ep, " (EP = DP x TP)");
  // Engine instances never span nodes (the deployment study), so a TP group lives inside one node.
  EPKIT_CHECK(c.tp <= g.gpus_per_node, "tp = ", c.tp, " exceeds gpus_per_node = ", g.gpus_per_node);
  EPKIT_CHECK(g.gpus_per_node % c.tp == 0, "tp = ", c.tp, " must divide gpus_per_node = ", g.gpus_per_node);
  EPKIT_CHECK(c.ep <= g.gpus_per_node || c.ep % g.gpus_per_node == 0, "ep = ", c.ep,
              " must be <= or a multiple of gpus_per_node = ", g.gpus_per_node);
  EPKIT_CHECK(m.num_heads % c.tp == 0, "tp = ", c.tp, " must divide num_heads = ", m.num_heads);
  EPKIT_CHECK(c.batch >= 1 && c.batch <= 1 << 20, "batch = ", c.batch, " must be in [1, 1048576]");
  EPKIT_CHECK(c.query_len >= 1 && c.query_len <= 64, "query_len = ", c.query_len, " must be in [1, 64]");
  EPKIT_CHECK(c.acceptance >= 0 && c.acceptance <= 1, "acceptance = ", c.acceptance, " must be in [0, 1]");
  EPKIT_CHECK(c.context >= 1 && c.context <= 10'000'000, "context = ", c.context, " must be in [1, 10000000]");
  EPKIT_CHECK(c.schedule != Schedule::kMicroBatch || c.batch >= 2, "batch = ", c.batch,
              " must be >= 2 for the micro-batch schedule (two halves of at least one request)");
}

int dp_groups(const DeployConfig& c) { return c.ep / c.tp; }

int num_nodes(const DeployConfig& c, const GpuSpec& g) { return (c.ep + g.gpus_per_node - 1) / g.gpus_per_node; }

double tokens_per_step(const DeployConfig& c) {
  // Chain speculation: draft token i is kept only if drafts 1..i are all accepted; the verify pass
  // always yields one token of its own.
  double total = 0, p = 1;
  for (int i = 0; i < c.query_len; ++i, p *= c.acceptance) total += p;
  return total;
}

}  // namespace epkit::plan
