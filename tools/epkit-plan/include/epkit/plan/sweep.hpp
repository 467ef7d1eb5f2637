// The design-space sweep of the deployment study and the Pareto frontier of output speed against throughput.
#pragma once

#include <vector>

#include "epkit/plan/estimate.hpp"

namespace epkit::plan {

// What to sweep. EPs up to the single-node GPU's node size run on `single_node_gpu`, larger EPs on
// `multi_node_gpu` (the deployment study: 8xH200 against up to 16 nodes of 8xH100).
struct SweepSpec {
  ModelSpec model;
  GpuSpec single_node_gpu;
  GpuSpec multi_node_gpu;
  std::vector<int> eps{8, 16, 32, 64, 128};
  std::vector<int> tps{1, 2, 4, 8};
  std::vector<int> batches{1, 2, 4, 8, 16, 32, 64, 128};
  std::vector<Schedule> schedules{Schedule::kNoOverlap, Schedule::kDispatchOverlap, Schedule::kMicroBatch};
  int query_len = 2;
  double acceptance = 0.6;
  int context = 5000;
  Efficiency efficiency;
};

// Every valid point of the sweep, feasible or not. Combinations that validate() rejects (e.g. more EP ranks
// than experts, TP above the node size, a micro-batch of one request) are left out.
std::vector<PlanPoint> sweep(const SweepSpec& s, const Calibration* cal = nullptr);

// Indices of the feasible points with config.ep == ep that no other feasible point of that EP beats in both
// output speed and throughput per node; sorted by output speed, fastest first.
std::vector<size_t> pareto_frontier(const std::vector<PlanPoint>& points, int ep);

// Highest throughput per node among feasible points of `ep` whose output speed is at least `speed`
// tokens/s per request (0 when none): the frontier read at a given speed.
double throughput_at_speed(const std::vector<PlanPoint>& points, int ep, double speed);

// Ratio of two EPs' frontiers over a band of output speeds, sampled every tokens/s.
struct BandRatio {
  double min = 0, max = 0, geomean = 0;  // of throughput_at_speed(ep_a) / throughput_at_speed(ep_b)
  int samples = 0;                       // speeds where both frontiers have a point
};

// Compares the frontiers of `ep_a` and `ep_b` for speeds in [lo, hi] tokens/s per request.
BandRatio band_ratio(const std::vector<PlanPoint>& points, int ep_a, int ep_b, double lo, double hi);

// Micro-batching's gain over dispatch overlap at one batch size: layer_time(dispatch) / layer_time(microbatch) - 1.
struct MicroBatchGain {
  int batch = 0;
  double dispatch_overlap_us = 0;
  double microbatch_us = 0;
  double gain = 0;  // > 0: micro-batching is faster
};

// Gains for every batch of the sweep where both schedules exist for (ep, tp).
std::vector<MicroBatchGain> microbatch_gains(const std::vector<PlanPoint>& points, int ep, int tp);

}  // namespace epkit::plan
