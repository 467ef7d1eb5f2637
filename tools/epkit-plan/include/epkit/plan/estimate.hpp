// The planner's main entry: evaluate one deployment and return its speed, throughput, memory and breakdown.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "epkit/plan/calibration.hpp"
#include "epkit/plan/config.hpp"
#include "epkit/plan/memory.hpp"
#include "epkit/plan/roofline.hpp"
#include "epkit/plan/routing.hpp"
#include "epkit/plan/specs.hpp"

namespace epkit::plan {

// One step of epkit-moe's layer breakdown next to the planner's time for the same work.
struct StepCheck {
  std::string step;         // epkit-moe's step name: gate, router, quantize, dispatch, gemm_w13, ...
  double measured_us = 0;   // the step alone in a CUDA graph (epkit-moe)
  double modelled_us = -1;  // the planner's kernels for that work, µs; -1 when it has none (quantize, add_shared)
};

// A measured MoE layer (epkit-moe layer JSON) next to the planner's model of the same configuration.
struct LayerCheck {
  std::string match;         // "exact": the row is this point; "w1_proxy": one GPU with this EP's local experts and tokens
  LayerMeasurement row;      // the measured row (graph_us is the number compared)
  double modelled_us = 0;    // the planner's MoE block for the row's configuration, µs
  double ratio = 0;          // row.graph_us / modelled_us
  std::vector<StepCheck> steps;  // in the row's breakdown order (schedule none rows have one)
};

// Everything the planner says about one configuration.
struct PlanPoint {
  std::string model;
  std::string gpu;
  DeployConfig config;
  int dp = 0;
  int nodes = 0;
  // memory
  double kv_bytes_per_token = 0;     // whole model, bytes
  WeightBytes weights;               // per GPU
  int max_batch_per_gpu = 0;         // requests per DP group at config.context
  bool fits = false;                 // config.batch <= max_batch_per_gpu
  std::string infeasible_reason;     // empty when fits
  // routing (whole batch; micro-batches see half)
  RoutingStats routing;
  // time
  double tokens_per_step = 0;        // expected accepted tokens per request per step
  double moe_layer_time_us = 0;      // one MoE layer under the schedule, µs
  double moe_block_time_us = 0;      // its MoE block alone (gate GEMM to combine, shared expert) as one
                                     // MoELayer::forward: no attention to overlap with, µs
  double dense_layer_time_us = 0;    // one dense layer, µs (0 when the model has none)
  double head_time_us = 0;           // LM head and sampling once per step, µs
  double step_time_us = 0;           // one decode step, µs
  double output_tokens_per_s_per_request = 0;
  double throughput_tokens_per_s_per_node = 0;
  // Per-category time of one MoE layer, µs; sums to moe_layer_time_us. Communication categories hold the
  // send/receive kernels plus the time the GPU waits for the transfer.
  std::vector<std::pair<std::string, double>> moe_breakdown_us;
  std::vector<KernelCost> moe_kernels;  // kernels of one MoE layer for one (micro-)batch
  std::vector<std::string> measured_terms;
  std::vector<std::string> modelled_terms;
  // With layer rows in the calibration: the measured layer for this point, or why there is none.
  std::optional<LayerCheck> layer_check;
  std::string layer_check_note;
};

// Evaluates one configuration. Throws epkit::Error when the config is invalid (validate()); a config that is
// valid but does not fit in memory is returned with fits = false and still timed.
PlanPoint estimate(const ModelSpec& m, const GpuSpec& g, const DeployConfig& c, const Efficiency& e = {},
                   const Calibration* cal = nullptr);

}  // namespace epkit::plan
