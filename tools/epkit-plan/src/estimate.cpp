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

double block_us(const std::vector<MoeLayerOps>& mbs) {
  std::vector<const MoeLayerOps*> views;
  for (const auto& mb : mbs) views.push_back(&mb);
  return simulate_moe_block(views).layer_time_us;
}

// A kernel category is measured when all its kernels in the layer are, modelled when none is, and on
// both lists, with the kernel names, when some are: "router[topk] (interpolated)" and "router[gate]".
// No commas or semicolons, so that a term is one item of the CSV's ';'-separated list.
void classify(const std::vector<KernelCost>& ks, KernelClass cls, PlanPoint& p) {
  std::string measured, modelled;
  bool interpolated = false;
  for (const auto& k : ks) {
    if (k.cls != cls) continue;
    std::string& list = k.measured ? measured : modelled;
    list += (list.empty() ? "" : "+") + k.name;
    interpolated = interpolated || k.interpolated;
  }
  const std::string name = to_string(cls);
  if (measured.empty()) {
    p.modelled_terms.push_back(name);
  } else if (modelled.empty()) {
    p.measured_terms.push_back(name + (interpolated ? " (interpolated)" : ""));
  } else {
    p.measured_terms.push_back(name + "[" + measured + "]" + (interpolated ? " (interpolated)" : ""));
    p.modelled_terms.push_back(name + "[" + modelled + "]");
  }
}

// The measured layer for this point, next to the planner's model of the row's own configuration: this
// point for an exact row; for a W = 1 proxy, one GPU whose routed experts are this EP rank's E/ep (top-k
// of them, this rank's tokens: the rank's rows per expert, without the network).
void check_layer(PlanPoint& p, const ModelSpec& m, const GpuSpec& g, const DeployConfig& c, const Efficiency& e,
                 const Calibration& cal, const std::vector<MoeLayerOps>& own) {
  const LayerMatch match = find_layer_row(cal, m, g.name, c.ep, c.tp, c.batch, c.query_len, c.schedule);
  if (match.row == nullptr) {
    p.layer_check_note = match.why;
    return;
  }
  LayerCheck lc;
  lc.match = match.kind;
  lc.row = *match.row;
  std::vector<MoeLayerOps> proxy;
  const std::vector<MoeLayerOps>* twin = &own;
  if (match.kind == "w1_proxy") {
    ModelSpec one_gpu = m;
    one_gpu.num_routed_experts = match.row->experts;
    DeployConfig c1 = c;
    c1.ep = 1;
    validate(c1, one_gpu, g);
    proxy = moe_layer_batches(one_gpu, g, c1, e, &cal);
    twin = &proxy;
  }
  lc.modelled_us = block_us(*twin);
  lc.ratio = lc.row.graph_us / lc.modelled_us;
  const auto modelled_steps = moe_block_steps(twin->front());
  for (const auto& s : lc.row.breakdown) {
    StepCheck sc{s.step, s.us, -1};
    for (const auto& [name, us] : modelled_steps)
      if (name == s.step) sc.modelled_us = us;
    lc.steps.push_back(sc);
  }
  p.layer_check = std::move(lc);
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
  const std::vector<MoeLayerOps> mbs = moe_layer_batches(m, g, c, e, cal);
  std::vector<const MoeLayerOps*> views;
  for (const auto& mb : mbs) views.push_back(&mb);
  const ScheduleResult sched = simulate_moe_layer(views);
  p.moe_layer_time_us = sched.layer_time_us;
  p.moe_breakdown_us = sched.breakdown_us;
  for (const auto& op : mbs[0].ops)
    if (op.kind == OpKind::kKernel) p.moe_kernels.push_back(op.kernel);
  p.moe_block_time_us = block_us(mbs);

  if (m.num_dense_layers > 0) p.dense_layer_time_us = sum_us(dense_layer_kernels(m, g, c, e, c.batch));
  p.head_time_us = sum_us(head_kernels(m, g, c, e, c.batch));
  const int moe_layers = m.num_layers - m.num_dense_layers;
  p.step_time_us = m.num_dense_layers * p.dense_layer_time_us + moe_layers * p.moe_layer_time_us + p.head_time_us;

  p.output_tokens_per_s_per_request = p.tokens_per_step / (p.step_time_us * 1e-6);
  p.throughput_tokens_per_s_per_node =
      p.output_tokens_per_s_per_request * double(c.batch) * p.dp / p.nodes;

  // Report which terms came from measurements.
  const bool comm_measured = mbs[0].dispatch_measured;
  if (comm_measured) {
    const char* how = mbs[0].comm_interpolated ? " (interpolated)" : "";
    p.measured_terms = {std::string("dispatch") + how, std::string("combine") + how};
  }
  p.modelled_terms = {"gemm", "attention"};
  for (KernelClass k : {KernelClass::kRouter, KernelClass::kSharedExpert, KernelClass::kGroupGemm})
    classify(p.moe_kernels, k, p);
  p.modelled_terms.push_back("elementwise");
  p.modelled_terms.push_back("memory");
  if (c.tp > 1) p.modelled_terms.push_back("tp_allreduce");
  if (!comm_measured) {
    p.modelled_terms.push_back("dispatch");
    p.modelled_terms.push_back("combine");
  }
  if (cal != nullptr && !cal->layers.empty()) check_layer(p, m, g, c, e, *cal, mbs);
  return p;
}

}  // namespace epkit::plan
