// The seed-001 sweep and its Pareto frontiers.
#include "epkit/plan/sweep.hpp"

#include <algorithm>
#include <cmath>

#include "epkit/error.hpp"

namespace epkit::plan {

std::vector<PlanPoint> sweep(const SweepSpec& s, const Calibration* cal) {
  validate(s.efficiency);
  std::vector<PlanPoint> out;
  for (int ep : s.eps) {
    const GpuSpec& g = ep <= s.single_node_gpu.gpus_per_node ? s.single_node_gpu : s.multi_node_gpu;
    for (int tp : s.tps)
      for (int batch : s.batches)
        for (Schedule sched : s.schedules) {
          DeployConfig c{ep, tp, batch, s.query_len, s.acceptance, s.context, sched};
          try {
            validate(c, s.model, g);
          } catch (const Error&) {
            continue;  // not a point of this design space (documented in sweep.hpp)
          }
          out.push_back(estimate(s.model, g, c, s.efficiency, cal));
        }
  }
  return out;
}

std::vector<size_t> pareto_frontier(const std::vector<PlanPoint>& points, int ep) {
  std::vector<size_t> idx;
  for (size_t i = 0; i < points.size(); ++i)
    if (points[i].config.ep == ep && points[i].fits) idx.push_back(i);
  // Sort by speed (desc), then throughput (desc); a point is on the frontier when its throughput beats
  // every faster-or-equal point's.
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    const auto &pa = points[a], &pb = points[b];
    if (pa.output_tokens_per_s_per_request != pb.output_tokens_per_s_per_request)
      return pa.output_tokens_per_s_per_request > pb.output_tokens_per_s_per_request;
    return pa.throughput_tokens_per_s_per_node > pb.throughput_tokens_per_s_per_node;
  });
  std::vector<size_t> front;
  double best = -1;
  for (size_t i : idx) {
    if (points[i].throughput_tokens_per_s_per_node > best) {
      front.push_back(i);
      best = points[i].throughput_tokens_per_s_per_node;
    }
  }
  return front;
}

double throughput_at_speed(const std::vector<PlanPoint>& points, int ep, double speed) {
  double best = 0;
  for (const auto& p : points)
    if (p.config.ep == ep && p.fits && p.output_tokens_per_s_per_request >= speed)
      best = std::max(best, p.throughput_tokens_per_s_per_node);
  return best;
}

}  // namespace epkit::plan

namespace epkit::plan {

BandRatio band_ratio(const std::vector<PlanPoint>& points, int ep_a, int ep_b, double lo, double hi) {
  EPKIT_CHECK(lo > 0 && hi >= lo, "speed band [", lo, ", ", hi, "] must have 0 < lo <= hi");
  BandRatio r;
  double log_sum = 0;
  for (double s = lo; s <= hi + 1e-9; s += 1.0) {
    const double a = throughput_at_speed(points, ep_a, s), b = throughput_at_speed(points, ep_b, s);
    if (a <= 0 || b <= 0) continue;
    const double q = a / b;
    r.min = r.samples == 0 ? q : std::min(r.min, q);
    r.max = r.samples == 0 ? q : std::max(r.max, q);
    log_sum += std::log(q);
    ++r.samples;
  }
  if (r.samples > 0) r.geomean = std::exp(log_sum / r.samples);
  return r;
}

std::vector<MicroBatchGain> microbatch_gains(const std::vector<PlanPoint>& points, int ep, int tp) {
  std::vector<MicroBatchGain> out;
  for (const auto& mb : points) {
    if (mb.config.ep != ep || mb.config.tp != tp || mb.config.schedule != Schedule::kMicroBatch) continue;
    for (const auto& d : points) {
      if (d.config.ep != ep || d.config.tp != tp || d.config.batch != mb.config.batch ||
          d.config.schedule != Schedule::kDispatchOverlap)
        continue;
      out.push_back({mb.config.batch, d.moe_layer_time_us, mb.moe_layer_time_us,
                     d.moe_layer_time_us / mb.moe_layer_time_us - 1.0});
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.batch < b.batch; });
  return out;
}

}  // namespace epkit::plan
