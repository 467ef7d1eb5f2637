// One configuration end to end: memory, routing, layer times under the schedule, speed and throughput.
#include "epkit/plan/estimate.hpp"

#include <map>

#include "epkit/error.hpp"
#include "layer.hpp"
#include "schedule.hpp"

namespace epkit::plan {

namespace {

double sum_us(const std::vector<KernelCost>& ks) {
  double t = 0;
  for (const auto& k : ks) t += k.time_us;
  return t;
}

}  // namespace

PlanPoint estimate(const ModelSpec& m, const GpuSpec& g, const DeployConfig& c, const Efficiency& e,
                   const Calibration* cal) {
  validate(c, m, g);
  validate(e);
  PlanPoint p;
  p.model = m.name;
  p.gpu = g.name;
  p.config = c;
  p.dp = dp_groups(c);
  p.nodes = num_nodes(c, g);

  p.kv_bytes_per_token = kv_bytes_per_token(m);
  p.weights = weights_per_gpu(m, c.ep, c.tp);
  p.max_batch_per_gpu = max_batch_per_gpu(m, g, c);
  p.fits = c.batch <= p.max_batch_per_gpu;
  if (p.max_batch_per_gpu == 0) {
    p.infeasible_reason = detail::concat("weights ", p.weights.total() / 1e9, " GB + reserve ", g.reserved_gb,
                                         " GB exceed hbm_capacity_gb = ", g.hbm_capacity_gb);
  } else if (!p.fits) {
    p.infeasible_reason = detail::concat("batch = ", c.batch, " exceeds max_batch_per_gpu = ", p.max_batch_per_gpu,
                                         " at context ", c.context);
  }
  p.routing = routing_stats(m, c, c.batch);
  p.tokens_per_step = tokens_per_step(c);

  // MoE layer under the schedule. Micro-batching splits the DP group's requests into two halves.
  std::vector<MoeLayerOps> mbs;
  const bool shared_after_send = c.schedule != Schedule::kNoOverlap;
  if (c.schedule == Schedule::kMicroBatch) {
    mbs.push_back(moe_layer_ops(m, g, c, e, (c.batch + 1) / 2, shared_after_send, cal));
    mbs.push_back(moe_layer_ops(m, g, c, e, c.batch / 2, shared_after_send, cal));
  } else {
    mbs.push_back(moe_layer_ops(m, g, c, e, c.batch, shared_after_send, cal));
  }
  std::vector<const MoeLayerOps*> views;
  for (const auto& mb : mbs) views.push_back(&mb);
  const ScheduleResult sched = simulate_moe_layer(views);
  p.moe_layer_time_us = sched.layer_time_us;
  p.moe_breakdown_us = sched.breakdown_us;
  for (const auto& op : mbs[0].ops)
    if (op.kind == OpKind::kKernel) p.moe_kernels.push_back(op.kernel);

  if (m.num_dense_layers > 0) p.dense_layer_time_us = sum_us(dense_layer_kernels(m, g, c, e, c.batch));
  p.head_time_us = sum_us(head_kernels(m, g, c, e, c.batch));
  const int moe_layers = m.num_layers - m.num_dense_layers;
  p.step_time_us = m.num_dense_layers * p.dense_layer_time_us + moe_layers * p.moe_layer_time_us + p.head_time_us;

  p.output_tokens_per_s_per_request = p.tokens_per_step / (p.step_time_us * 1e-6);
  p.throughput_tokens_per_s_per_node =
      p.output_tokens_per_s_per_request * double(c.batch) * p.dp / p.nodes;

  // Report which terms came from measurements.
  const bool comm_measured = mbs[0].dispatch_measured;
  p.modelled_terms = {"gemm", "attention", "router", "shared_expert", "group_gemm", "elementwise", "memory"};
  if (c.tp > 1) p.modelled_terms.push_back("tp_allreduce");
  if (comm_measured) {
    const char* how = mbs[0].comm_interpolated ? " (interpolated)" : "";
    p.measured_terms = {std::string("dispatch") + how, std::string("combine") + how};
  } else {
    p.modelled_terms.push_back("dispatch");
    p.modelled_terms.push_back("combine");
  }
  return p;
}

}  // namespace epkit::plan
