// Event replay of the MoE layer schedules (the deployment study, "Overlap").
#include "schedule.hpp"

#include <algorithm>
#include <map>
#include <utility>

#include "epkit/error.hpp"

namespace epkit::plan {

namespace {

// GPU timeline with per-category accounting. Waiting for a transfer is charged to that transfer's
// category, as a profiler would show the receive kernel spinning.
struct Replay {
  double now = 0;
  std::map<std::string, double> spent;
  struct Pending {
    double dispatch_ready = 0, combine_ready = 0;
  };
  std::vector<Pending> pending;

  bool block_only = false;  // replay only the MoE block (in_moe_block), as MoELayer::forward runs it

  void run_stage(const MoeLayerOps& mb, size_t mb_idx, int stage) {
    for (const Op& op : mb.ops) {
      if (op.stage != stage || (block_only && !in_moe_block(op))) continue;
      switch (op.kind) {
        case OpKind::kKernel:
          now += op.kernel.time_us;
          spent[to_string(op.kernel.cls)] += op.kernel.time_us;
          break;
        case OpKind::kStartDispatch: pending[mb_idx].dispatch_ready = now + mb.dispatch_transfer_us; break;
        case OpKind::kStartCombine: pending[mb_idx].combine_ready = now + mb.combine_transfer_us; break;
        case OpKind::kWaitDispatch: wait(pending[mb_idx].dispatch_ready, "dispatch"); break;
        case OpKind::kWaitCombine: wait(pending[mb_idx].combine_ready, "combine"); break;
      }
    }
  }
  void wait(double ready, const char* cat) {
    spent[cat] += std::max(0.0, ready - now);  // make sure the category exists even when nothing waits
    now = std::max(now, ready);
  }
};

}  // namespace

ScheduleResult simulate_moe_layer(const std::vector<const MoeLayerOps*>& mbs) {
  EPKIT_CHECK(mbs.size() == 1 || mbs.size() == 2, "schedule replay takes 1 or 2 micro-batches, got ", mbs.size());
  Replay r;
  r.pending.resize(mbs.size());
  ScheduleResult out;
  if (mbs.size() == 1) {
    for (int s = 1; s <= 5; ++s) r.run_stage(*mbs[0], 0, s);
    out.layer_time_us = r.now;
    for (const auto& [k, v] : r.spent) out.breakdown_us.emplace_back(k, v);
    return out;
  }
  // Two micro-batches: B runs 3 stages behind A. Replay enough layers to reach the steady state and
  // measure the second half only, so pipeline fill does not count.
  constexpr int kLayers = 8, kWarm = 4;
  double t0 = 0;
  std::map<std::string, double> spent0;
  const MoeLayerOps &a = *mbs[0], &b = *mbs[1];
  for (int layer = 0; layer < kLayers; ++layer) {
    if (layer == kWarm) {
      t0 = r.now;
      spent0 = r.spent;
    }
    r.run_stage(a, 0, 1);
    if (layer > 0) r.run_stage(b, 1, 4);
    r.run_stage(a, 0, 2);
    if (layer > 0) r.run_stage(b, 1, 5);
    r.run_stage(a, 0, 3);
    r.run_stage(b, 1, 1);
    r.run_stage(a, 0, 4);
    r.run_stage(b, 1, 2);
    r.run_stage(a, 0, 5);
    r.run_stage(b, 1, 3);
  }
  const int measured = kLayers - kWarm;
  out.layer_time_us = (r.now - t0) / measured;
  for (const auto& [k, v] : r.spent) out.breakdown_us.emplace_back(k, (v - spent0[k]) / measured);
  return out;
}

ScheduleResult simulate_moe_block(const std::vector<const MoeLayerOps*>& mbs) {
  EPKIT_CHECK(mbs.size() == 1 || mbs.size() == 2, "MoE block replay takes 1 or 2 micro-batches, got ", mbs.size());
  Replay r;
  r.block_only = true;
  r.pending.resize(mbs.size());
  if (mbs.size() == 1) {
    for (int s = 2; s <= 5; ++s) r.run_stage(*mbs[0], 0, s);
  } else {
    // MoELayer::forward's MoE-only interleaving (src/layer/moe_layer.cu): route and send both halves,
    // then both halves' experts, then both combine-receives.
    static constexpr std::pair<int, int> kOrder[] = {{0, 2}, {0, 3}, {1, 2}, {1, 3}, {0, 4}, {1, 4}, {0, 5}, {1, 5}};
    for (const auto& [mb, stage] : kOrder) r.run_stage(*mbs[mb], mb, stage);
  }
  ScheduleResult out;
  out.layer_time_us = r.now;
  for (const auto& [k, v] : r.spent) out.breakdown_us.emplace_back(k, v);
  return out;
}

}  // namespace epkit::plan
