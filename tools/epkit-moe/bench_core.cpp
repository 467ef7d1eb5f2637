#include "bench_core.hpp"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "epkit/error.hpp"

namespace epkit::moebench {

void finish_row(Row& r, double hbm_GBps, double fp8_TFLOPs) {
  const double s = r.us_median * 1e-6;
  if (s <= 0) return;
  r.GBps = r.bytes / s / 1e9;
  r.weight_GBps = r.weight_bytes / s / 1e9;
  r.TFLOPs = r.flops / s / 1e12;
  const double bw = (r.weight_bytes > 0 ? r.weight_GBps : r.GBps) / hbm_GBps;
  const double fl = fp8_TFLOPs > 0 ? r.TFLOPs / fp8_TFLOPs : 0;
  r.bound = fl > bw ? "fp8" : "hbm";
  r.pct_of_ceiling = 100.0 * std::max(bw, fl);
}

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

std::vector<int> ints(const std::string& opt, const std::string& s, int lo, int hi) {
  std::vector<int> out;
  for (const std::string& t : split(s)) {
    char* end = nullptr;
    const long v = std::strtol(t.c_str(), &end, 10);
    EPKIT_CHECK(end && *end == 0, opt, ": '", t, "' is not an integer");
    EPKIT_CHECK(v >= lo && v <= hi, opt, ": ", v, " is outside [", lo, ", ", hi, "]");
    out.push_back(static_cast<int>(v));
  }
  EPKIT_CHECK(!out.empty(), opt, " needs at least one value");
  return out;
}

}  // namespace

std::string usage() {
  return "usage: epkit-moe [kernels|layer] [--kernels router,gate_router,quantize,silu_mul_quantize,grouped_gemm]\n"
         "                 [--groups 2,8,16,32,64] [--m 1,4,...,4096] [--sweep-configs]\n"
         "                 [--router-kernels auto,general,warp_grouped] [--rounds N]\n"
         "                 [--batches 1,4,16,32,64,128] [--query-lens 1,2] [--experts 256,32]\n"
         "                 [--schedules none,dispatch_overlap,microbatch] [--quick] [--json FILE] [--merge FILE]\n";
}

Options parse_options(const std::vector<std::string>& args) {
  Options o;
  size_t i = 0;
  if (i < args.size() && (args[i] == "kernels" || args[i] == "layer")) o.mode = args[i++];
  auto value = [&](const std::string& opt) -> std::string {
    EPKIT_CHECK(i + 1 < args.size(), opt, " needs a value");
    return args[++i];
  };
  static const std::vector<std::string> kKernels = {"router", "gate_router", "quantize", "silu_mul_quantize",
                                                    "grouped_gemm"};
  static const std::vector<std::string> kSchedules = {"none", "dispatch_overlap", "microbatch"};
  static const std::vector<std::string> kRouterKernels = {"auto", "general", "warp_grouped"};
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--kernels") {
      o.kernels = split(value(a));
      for (const auto& k : o.kernels)
        EPKIT_CHECK(std::find(kKernels.begin(), kKernels.end(), k) != kKernels.end(), "--kernels: '", k,
                    "' is not one of router, gate_router, quantize, silu_mul_quantize, grouped_gemm");
    } else if (a == "--groups") {
      o.groups = ints(a, value(a), 1, 512);
    } else if (a == "--m") {
      o.m = ints(a, value(a), 0, 1 << 20);
    } else if (a == "--batches") {
      o.batches = ints(a, value(a), 0, 1 << 16);
    } else if (a == "--query-lens") {
      o.query_lens = ints(a, value(a), 1, 16);
    } else if (a == "--experts") {
      o.experts = ints(a, value(a), 1, 512);
    } else if (a == "--schedules") {
      o.schedules = split(value(a));
      for (const auto& s : o.schedules)
        EPKIT_CHECK(std::find(kSchedules.begin(), kSchedules.end(), s) != kSchedules.end(), "--schedules: '", s,
                    "' is not one of none, dispatch_overlap, microbatch");
    } else if (a == "--router-kernels") {
      o.router_kernels = split(value(a));
      EPKIT_CHECK(!o.router_kernels.empty(), a, " needs at least one value");
      for (const auto& k : o.router_kernels)
        EPKIT_CHECK(std::find(kRouterKernels.begin(), kRouterKernels.end(), k) != kRouterKernels.end(),
                    "--router-kernels: '", k, "' is not one of auto, general, warp_grouped");
    } else if (a == "--rounds") {
      o.rounds = ints(a, value(a), 1, 100).front();
    } else if (a == "--sweep-configs") {
      o.sweep_configs = true;
    } else if (a == "--quick") {
      o.quick = true;
    } else if (a == "--json") {
      o.json = value(a);
    } else if (a == "--merge") {
      o.merge = value(a);
    } else if (a == "-h" || a == "--help") {
      throw Error(usage());
    } else {
      EPKIT_FAIL("unknown option '", a, "'\n", usage());
    }
  }
  return o;
}

plan::Json row_json(const Row& r) {
  plan::Json j = plan::Json::object();
  j.set("kernel", r.kernel).set("system", r.system).set("variant", r.variant);
  j.set("G", r.G).set("m", r.m).set("N", r.N).set("K", r.K);
  j.set("us_median", r.us_median).set("us_p99", r.us_p99);
  j.set("bytes", r.bytes).set("weight_bytes", r.weight_bytes).set("flops", r.flops);
  j.set("GBps", r.GBps).set("weight_GBps", r.weight_GBps).set("TFLOPs", r.TFLOPs);
  j.set("pct_of_ceiling", r.pct_of_ceiling).set("bound", r.bound);
  j.set("calls", r.calls).set("replays", r.replays);
  if (!r.note.empty()) j.set("note", r.note);
  return j;
}

plan::Json results_json(const plan::Json& meta, double hbm_GBps, double fp8_TFLOPs, const std::string& fp8_note,
                        const std::vector<Row>& rows, const plan::Json* keep_rows_from) {
  plan::Json doc = plan::Json::object();
  doc.set("meta", meta);
  plan::Json c = plan::Json::object();
  c.set("hbm_read_GBps", hbm_GBps).set("fp8_dense_TFLOPs", fp8_TFLOPs).set("fp8_method", fp8_note);
  doc.set("ceilings", c);
  plan::Json arr = plan::Json::array();
  // Rows of other systems (the torch script) are kept; this run's systems replace their own.
  if (keep_rows_from && keep_rows_from->find("rows")) {
    for (const plan::Json& old : keep_rows_from->at("rows").as_array("rows")) {
      const std::string& sys = old.at("system").as_string("rows[].system");
      const bool replaced = std::any_of(rows.begin(), rows.end(), [&](const Row& r) { return r.system == sys; });
      if (!replaced) arr.push(old);
    }
  }
  for (const Row& r : rows) arr.push(row_json(r));
  doc.set("rows", arr);
  return doc;
}

plan::Json layer_row_json(const LayerRow& r) {
  plan::Json j = plan::Json::object();
  j.set("kernel", "moe_layer").set("system", "epkit").set("schedule", r.schedule).set("layout", r.layout);
  j.set("shared", r.shared).set("gate_router", r.gate_router);
  j.set("world_size", r.world_size).set("experts", r.experts).set("batch", r.batch).set("query_len", r.query_len);
  j.set("tokens", r.tokens).set("us_median", r.us_median).set("us_p99", r.us_p99);
  j.set("graph_us_median", r.graph_us_median).set("graph_us_p99", r.graph_us_p99);
  j.set("steps_us_sum", r.steps_us_sum).set("graph_over_steps", r.graph_over_steps);
  j.set("weight_bytes_touched", r.weight_bytes_touched).set("weight_bound_us", r.weight_bound_us);
  if (!r.steps.empty()) {
    plan::Json b = plan::Json::array();
    for (const LayerStep& s : r.steps) {
      plan::Json x = plan::Json::object();
      x.set("step", s.name).set("us_median", s.us_median);
      b.push(x);
    }
    j.set("breakdown", b);
  }
  if (!r.note.empty()) j.set("note", r.note);
  return j;
}

plan::Json layer_results_json(const plan::Json& meta, double hbm_GBps, double fp8_TFLOPs,
                              const std::vector<LayerRow>& rows) {
  plan::Json doc = plan::Json::object();
  doc.set("meta", meta);
  plan::Json c = plan::Json::object();
  c.set("hbm_read_GBps", hbm_GBps).set("fp8_dense_TFLOPs", fp8_TFLOPs);
  doc.set("ceilings", c);
  plan::Json arr = plan::Json::array();
  for (const LayerRow& r : rows) arr.push(layer_row_json(r));
  doc.set("rows", arr);
  return doc;
}

std::vector<int32_t> uneven_counts(int G, int m) {
  std::vector<int32_t> h(G, 0);
  const int active = G - G / 4;
  long sum = 0;
  for (int g = 0; g < active; ++g) sum += h[g] = g % 2 ? 2 * m : (2 * m) / 3;
  // Move the difference to G * m onto the smaller groups, none above 2m or below 0.
  for (int g = 0; sum != long(G) * m; g = (g + 2) % std::max(active, 1)) {
    const int step = sum < long(G) * m ? 1 : -1;
    if ((step > 0 && h[g] < 2 * m) || (step < 0 && h[g] > 0)) h[g] += step, sum += step;
  }
  return h;
}

}  // namespace epkit::moebench
