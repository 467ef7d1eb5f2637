// Routing expectation: how many tokens each expert gets, and how many distinct experts a GPU touches.
#pragma once

#include "epkit/plan/config.hpp"
#include "epkit/plan/specs.hpp"

namespace epkit::plan {

// Expected routing load of one MoE layer on one GPU, for one (micro-)batch.
struct RoutingStats {
  double tokens_in_system = 0;          // tokens routed by all DP groups together
  double copies_per_gpu = 0;            // expected (token, expert) pairs one GPU receives
  double tokens_per_expert = 0;         // the deployment study's m: tokens_in_system * top_k / num_routed_experts
  double experts_per_gpu = 0;           // num_routed_experts / ep
  double active_experts_per_gpu = 0;    // expected distinct experts touched on one GPU
  double tokens_per_active_expert = 0;  // copies_per_gpu / active_experts_per_gpu: the GroupGEMM's m
};

// Routing expectation for `batch` requests per DP group of `query_len` tokens. Assumes a balanced
// router: each token picks top_k distinct experts uniformly, independently of other tokens.
RoutingStats routing_stats(const ModelSpec& m, const DeployConfig& c, int batch);

// Expected distinct experts touched among `local_experts` of `num_experts` when `tokens` tokens each pick
// `top_k` distinct experts uniformly: local_experts * (1 - (1 - top_k/num_experts)^tokens).
double expected_active_experts(double local_experts, int num_experts, int top_k, double tokens);

}  // namespace epkit::plan
