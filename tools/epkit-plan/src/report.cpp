// JSON, CSV and text forms of planner results.
#include "epkit/plan/report.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "epkit/plan/sweep.hpp"

namespace epkit::plan {

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

Json string_array(const std::vector<std::string>& v) {
  Json a = Json::array();
  for (const auto& s : v) a.push(s);
  return a;
}

Json layer_check_json(const LayerCheck& lc) {
  const LayerMeasurement& r = lc.row;
  Json row = Json::object();
  row.set("source", r.source).set("device", r.device).set("world_size", r.world_size).set("experts", r.experts)
      .set("batch", r.batch).set("query_len", r.query_len).set("tokens", r.tokens).set("schedule", r.schedule)
      .set("layout", r.layout).set("us_median", r.us).set("graph_us_median", r.graph_us);
  Json steps = Json::array();
  for (const auto& s : lc.steps) {
    Json js = Json::object();
    js.set("step", s.step).set("measured_us", s.measured_us)
        .set("modelled_us", s.modelled_us >= 0 ? Json(s.modelled_us) : Json());
    steps.push(js);
  }
  Json j = Json::object();
  j.set("match", lc.match).set("row", row).set("measured_us", r.graph_us).set("modelled_us", lc.modelled_us)
      .set("measured_over_modelled", lc.ratio).set("steps", steps);
  return j;
}

std::string mapping_text(const LayerCheck& lc, const PlanPoint& p) {
  if (lc.match == "exact")
    return "exact: the row is this point (W = EP = " + std::to_string(p.config.ep) + ", " +
           std::to_string(lc.row.experts) + " experts per GPU)";
  return "W=1 proxy: one GPU holding this EP" + std::to_string(p.config.ep) + " rank's " +
         std::to_string(lc.row.experts) + " experts and its " + std::to_string(lc.row.tokens) +
         " tokens (the rank's rows per expert, no network)";
}

}  // namespace

Json to_json(const PlanPoint& p) {
  const auto& c = p.config;
  Json cfg = Json::object();
  cfg.set("ep", c.ep).set("dp", p.dp).set("tp", c.tp).set("nodes", p.nodes).set("batch", c.batch)
      .set("query_len", c.query_len).set("acceptance", c.acceptance).set("context", c.context)
      .set("schedule", to_string(c.schedule));
  Json weights = Json::object();
  weights.set("attention", p.weights.attention).set("dense_mlp", p.weights.dense_mlp)
      .set("routed_experts", p.weights.routed_experts).set("shared_experts", p.weights.shared_experts)
      .set("router", p.weights.router).set("embedding", p.weights.embedding);
  Json breakdown = Json::object();
  for (const auto& [k, v] : p.moe_breakdown_us) breakdown.set(k, v);
  Json kernels = Json::array();
  for (const auto& k : p.moe_kernels) {
    Json jk = Json::object();
    jk.set("name", k.name).set("class", to_string(k.cls)).set("flop", k.flop).set("bytes", k.bytes)
        .set("intensity_flop_per_byte", k.intensity()).set("time_us", k.time_us)
        .set("bound", k.flop == 0 ? "memory" : (k.compute_bound ? "compute" : "memory"))
        .set("source", k.measured ? "measured" : "modelled");
    if (!k.note.empty()) jk.set("note", k.note);
    kernels.push(jk);
  }
  Json j = Json::object();
  j.set("model", p.model).set("gpu", p.gpu).set("config", cfg)
      .set("kv_bytes_per_token", p.kv_bytes_per_token)
      .set("weights_bytes_per_gpu", p.weights.total())
      .set("weights_bytes_per_gpu_by_part", weights)
      .set("max_batch_per_gpu", p.max_batch_per_gpu)
      .set("fits", p.fits)
      .set("infeasible_reason", p.infeasible_reason)
      .set("tokens_per_expert", p.routing.tokens_per_expert)
      .set("experts_per_gpu", p.routing.experts_per_gpu)
      .set("active_experts_per_gpu", p.routing.active_experts_per_gpu)
      .set("tokens_per_active_expert", p.routing.tokens_per_active_expert)
      .set("tokens_per_step", p.tokens_per_step)
      .set("layer_time_us", p.moe_layer_time_us)
      .set("moe_block_time_us", p.moe_block_time_us)
      .set("dense_layer_time_us", p.dense_layer_time_us)
      .set("head_time_us", p.head_time_us)
      .set("step_time_us", p.step_time_us)
      .set("output_tokens_per_s_per_request", p.output_tokens_per_s_per_request)
      .set("throughput_tokens_per_s_per_node", p.throughput_tokens_per_s_per_node)
      .set("layer_breakdown_us", breakdown)
      .set("kernels", kernels)
      .set("measured_terms", string_array(p.measured_terms))
      .set("modelled_terms", string_array(p.modelled_terms))
      .set("layer_check", p.layer_check ? layer_check_json(*p.layer_check) : Json());
  if (!p.layer_check_note.empty()) j.set("layer_check_note", p.layer_check_note);
  return j;
}

std::string explain_text(const PlanPoint& p) {
  const auto& c = p.config;
  std::ostringstream os;
  os << p.model << " on " << p.nodes << " node(s) of " << p.gpu << ": EP" << c.ep << " DP" << p.dp << " TP" << c.tp
     << ", batch " << c.batch << " per DP group, query length " << c.query_len << ", context " << c.context
     << ", schedule " << to_string(c.schedule) << "\n\n";
  os << "memory per GPU\n";
  os << "  KV bytes per token      " << fmt("%.0f", p.kv_bytes_per_token) << "\n";
  os << "  weights                 " << fmt("%.1f GB", p.weights.total() / 1e9) << "  (routed experts "
     << fmt("%.1f", p.weights.routed_experts / 1e9) << ", attention " << fmt("%.1f", p.weights.attention / 1e9)
     << ", shared " << fmt("%.1f", p.weights.shared_experts / 1e9) << ", dense MLP "
     << fmt("%.1f", p.weights.dense_mlp / 1e9) << ", embedding " << fmt("%.1f", p.weights.embedding / 1e9) << ")\n";
  os << "  max batch at context    " << p.max_batch_per_gpu << "\n";
  os << "  fits                    " << (p.fits ? "yes" : "no: " + p.infeasible_reason) << "\n\n";
  os << "routing (whole batch)\n";
  os << "  tokens per expert (m)   " << fmt("%.1f", p.routing.tokens_per_expert) << "\n";
  os << "  active experts per GPU  " << fmt("%.2f", p.routing.active_experts_per_gpu) << " of "
     << fmt("%.0f", p.routing.experts_per_gpu) << "\n\n";
  os << "one MoE layer: " << fmt("%.1f us", p.moe_layer_time_us) << "\n";
  for (const auto& [k, v] : p.moe_breakdown_us)
    os << "  " << k << std::string(16 - std::min<size_t>(15, k.size()), ' ') << fmt("%8.1f us", v)
       << fmt("  %5.1f%%", p.moe_layer_time_us > 0 ? 100 * v / p.moe_layer_time_us : 0) << "\n";
  os << "MoE block alone: " << fmt("%.1f us", p.moe_block_time_us)
     << " (gate GEMM to combine-receive and the shared expert, as one MoELayer forward)\n";
  os << "\nkernels of one MoE layer, one " << (c.schedule == Schedule::kMicroBatch ? "micro-batch" : "batch") << "\n";
  for (const auto& k : p.moe_kernels)
    os << "  " << k.name << std::string(16 - std::min<size_t>(15, k.name.size()), ' ') << fmt("%8.1f us", k.time_us)
       << "  AI " << fmt("%7.1f", k.intensity()) << " FLOP/B  " << (k.compute_bound ? "compute" : "memory")
       << (k.measured ? "  measured" + (k.note.empty() ? "" : " (" + k.note + ")") : (k.note.empty() ? "" : "  " + k.note))
       << "\n";
  os << "\ndense layer " << fmt("%.1f us", p.dense_layer_time_us) << ", head " << fmt("%.1f us", p.head_time_us)
     << ", step " << fmt("%.1f us", p.step_time_us) << ", tokens per step " << fmt("%.2f", p.tokens_per_step) << "\n";
  os << "output speed per request  " << fmt("%.1f tokens/s", p.output_tokens_per_s_per_request) << "\n";
  os << "throughput per node       " << fmt("%.0f tokens/s", p.throughput_tokens_per_s_per_node) << "\n";
  os << "measured terms: ";
  for (const auto& t : p.measured_terms) os << t << " ";
  if (p.measured_terms.empty()) os << "(none)";
  os << "\nmodelled terms: ";
  for (const auto& t : p.modelled_terms) os << t << " ";
  os << "\n";
  if (p.layer_check) {
    const LayerCheck& lc = *p.layer_check;
    const LayerMeasurement& r = lc.row;
    os << "\nmeasured MoE layer (epkit-moe, " << (r.source.empty() ? "calibration" : r.source) << ")\n";
    os << "  row        W=" << r.world_size << ", " << r.experts << " experts, batch " << r.batch << ", query_len "
       << r.query_len << ", schedule " << r.schedule << ", layout " << r.layout
       << (r.device.empty() ? "" : ", " + r.device) << "\n";
    os << "  mapping    " << mapping_text(lc, p) << "\n";
    os << "  measured   " << fmt("%.1f us", r.graph_us) << " replayed from a CUDA graph (" << fmt("%.1f us", r.us)
       << " launched from the host)\n";
    os << "  modelled   " << fmt("%.1f us", lc.modelled_us) << ", the planner's MoE block for the row's configuration\n";
    os << "  measured / modelled  " << fmt("%.3f", lc.ratio) << "\n";
    if (!lc.steps.empty()) {
      os << "  step                 measured   modelled\n";
      for (const auto& st : lc.steps) {
        char line[160];
        std::snprintf(line, sizeof line, "  %-18s %10.1f %10s%s\n", st.step.c_str(), st.measured_us,
                      st.modelled_us >= 0 ? fmt("%.1f", st.modelled_us).c_str() : "-",
                      st.modelled_us >= 0 ? "" : "  (no planner kernel)");
        os << line;
      }
    }
  } else if (!p.layer_check_note.empty()) {
    os << "\nmeasured MoE layer: none (" << p.layer_check_note << ")\n";
  }
  return os.str();
}

std::string csv(const std::vector<PlanPoint>& points, const std::vector<size_t>& rows) {
  std::ostringstream os;
  os << "model,gpu,ep,dp,tp,nodes,batch,schedule,fits,max_batch_per_gpu,weights_gb_per_gpu,tokens_per_expert,"
        "active_experts_per_gpu,layer_time_us,step_time_us,output_tokens_per_s_per_request,"
        "throughput_tokens_per_s_per_node,measured_terms";
  // Fixed breakdown columns so that every row has the same shape; absent categories are 0.
  static const char* kCategories[] = {"attention", "gemm", "group_gemm", "shared_expert", "router",
                                      "elementwise", "dispatch", "combine", "tp_allreduce"};
  for (const char* k : kCategories) os << "," << k << "_us";
  // The MoE block and, with a layer calibration, its measured counterpart (empty when none matched).
  os << ",moe_block_us,layer_match,measured_layer_us,modelled_layer_us,measured_over_modelled\n";
  for (size_t i : rows) {
    const auto& p = points[i];
    std::string measured;
    for (const auto& t : p.measured_terms) measured += (measured.empty() ? "" : ";") + t;
    os << p.model << "," << p.gpu << "," << p.config.ep << "," << p.dp << "," << p.config.tp << "," << p.nodes << ","
       << p.config.batch << "," << to_string(p.config.schedule) << "," << (p.fits ? 1 : 0) << ","
       << p.max_batch_per_gpu << "," << fmt("%.3f", p.weights.total() / 1e9) << ","
       << fmt("%.3f", p.routing.tokens_per_expert) << "," << fmt("%.3f", p.routing.active_experts_per_gpu) << ","
       << fmt("%.2f", p.moe_layer_time_us) << "," << fmt("%.2f", p.step_time_us) << ","
       << fmt("%.3f", p.output_tokens_per_s_per_request) << "," << fmt("%.1f", p.throughput_tokens_per_s_per_node)
       << "," << measured;
    for (const char* k : kCategories) {
      double v = 0;
      for (const auto& [name, us] : p.moe_breakdown_us)
        if (name == k) v = us;
      os << "," << fmt("%.2f", v);
    }
    os << "," << fmt("%.2f", p.moe_block_time_us);
    if (p.layer_check) {
      os << "," << p.layer_check->match << "," << fmt("%.2f", p.layer_check->row.graph_us) << ","
         << fmt("%.2f", p.layer_check->modelled_us) << "," << fmt("%.4f", p.layer_check->ratio);
    } else {
      os << ",,,,";
    }
    os << "\n";
  }
  return os.str();
}

std::string pareto_table(const std::vector<PlanPoint>& points, const std::vector<int>& eps) {
  std::ostringstream os;
  for (int ep : eps) {
    const auto front = pareto_frontier(points, ep);
    if (front.empty()) {
      os << "EP" << ep << ": no feasible point\n\n";
      continue;
    }
    const auto& p0 = points[front[0]];
    os << "EP" << ep << " (" << p0.nodes << " x " << p0.gpu << ") Pareto frontier\n";
    os << "   TP  batch  schedule     tok/s/req  tok/s/node  layer_us  step_ms\n";
    for (size_t i : front) {
      const auto& p = points[i];
      char line[160];
      std::snprintf(line, sizeof line, "  %3d  %5d  %-10s  %10.1f  %10.0f  %8.1f  %7.2f\n", p.config.tp, p.config.batch,
                    to_string(p.config.schedule).c_str(), p.output_tokens_per_s_per_request,
                    p.throughput_tokens_per_s_per_node, p.moe_layer_time_us, p.step_time_us / 1e3);
      os << line;
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace epkit::plan
