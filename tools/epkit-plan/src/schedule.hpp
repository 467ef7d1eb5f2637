// Layer time under an overlap schedule: replays the ops of one or two micro-batches on one GPU queue.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "epkit/plan/config.hpp"
#include "layer.hpp"

namespace epkit::plan {

struct ScheduleResult {
  double layer_time_us = 0;                                 // steady-state time of one MoE layer, µs
  std::vector<std::pair<std::string, double>> breakdown_us; // per category, sums to layer_time_us
};

// One micro-batch (none/dispatch overlap) runs stages 1..5 in order. Two micro-batches (micro-batch schedule)
// run interleaved with a 3-stage offset: A1 B4 A2 B5 A3 B1 A4 B2 A5 B3, layer after layer, so each half's
// transfers proceed while the other half computes. Kernels are serial on the GPU; transfers are not.
ScheduleResult simulate_moe_layer(const std::vector<const MoeLayerOps*>& micro_batches);

// The MoE block alone (in_moe_block: gate GEMM to combine-receive and the shared expert), one forward as
// epkit's MoELayer runs it: one micro-batch's stages in order, or for two the MoE-only interleaving
// A-route A-send B-route B-send A-experts B-experts A-combine B-combine. No attention hides anything.
ScheduleResult simulate_moe_block(const std::vector<const MoeLayerOps*>& micro_batches);

}  // namespace epkit::plan
