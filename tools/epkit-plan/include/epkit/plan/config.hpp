// One deployment to evaluate, and the efficiency factors that turn roofline bounds into times.
#pragma once

#include <string>

#include "epkit/plan/specs.hpp"

namespace epkit::plan {

// How a MoE layer overlaps communication with compute (the deployment study, "Overlap").
enum class Schedule {
  kNoOverlap,        // every kernel and transfer in sequence
  kDispatchOverlap,  // the shared expert runs between dispatch-send and dispatch-receive
  kMicroBatch,       // two half batches, offset by 3 of 5 stages; dense layers keep the whole batch
};

// "none", "dispatch", "microbatch".
std::string to_string(Schedule s);
// Parses the names above (also "no-overlap", "dispatch-overlap", "micro-batch"); throws epkit::Error otherwise.
Schedule parse_schedule(const std::string& s);

// Fraction of a roofline bound a real kernel reaches. 1.0 is the roofline itself. These are the terms
// that calibration can replace; defaults are documented in docs/PLANNER.md.
struct Efficiency {
  double gemm_memory = 0.8;        // GEMM/GroupGEMM/BMM: fraction of HBM bandwidth
  double gemm_compute = 0.7;       // GEMM/GroupGEMM/BMM: fraction of tensor-core peak
  double attention_memory = 0.8;   // decode attention: fraction of HBM bandwidth while reading KV
  double attention_compute = 0.5;  // decode attention: fraction of BF16 peak
  double elementwise_memory = 0.7; // norms, activations, packing copies: fraction of HBM bandwidth
  double comm = 0.5;               // dispatch/combine/all-reduce: fraction of link bandwidth (the deployment study: ~1/2 of IB)
};

// Checks every factor is in (0, 1]; throws epkit::Error naming the factor.
void validate(const Efficiency& e);

// One point of the design space. `batch` counts requests per DP group (an engine instance); with TP1 it is
// the batch per GPU, as in the deployment study.
struct DeployConfig {
  int ep = 8;                 // expert-parallel ranks = DP * TP
  int tp = 1;                 // tensor-parallel ranks per DP group (attention only)
  int batch = 1;              // concurrent requests per DP group
  int query_len = 2;          // tokens per request per step (1 + MTP draft tokens)
  double acceptance = 0.6;    // probability that each draft token is accepted
  int context = 5000;         // KV-cache length per request, tokens
  Schedule schedule = Schedule::kNoOverlap;
};

// Checks the config against the model and GPU (divisibility, node boundaries, ranges); throws epkit::Error
// whose message names the bad value and its limit.
void validate(const DeployConfig& c, const ModelSpec& m, const GpuSpec& g);

// DP groups: ep / tp.
int dp_groups(const DeployConfig& c);
// Nodes the deployment spans: ceil(ep / gpus_per_node).
int num_nodes(const DeployConfig& c, const GpuSpec& g);
// Expected tokens emitted per request per step with MTP: 1 + a + a^2 + ... + a^(query_len-1).
double tokens_per_step(const DeployConfig& c);

}  // namespace epkit::plan
