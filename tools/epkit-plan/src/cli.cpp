// epkit-plan: argument parsing and the four subcommands.
#include "epkit/plan/cli.hpp"

#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "epkit/error.hpp"
#include "epkit/plan/report.hpp"
#include "epkit/plan/sweep.hpp"
#include "layer.hpp"

namespace epkit::plan {

namespace {

// Options that may be given several times; every other option is allowed once.
const std::set<std::string> kRepeatable = {"--calibrate"};

// Parsed flags: "--name value" pairs and bare switches.
class Args {
 public:
  Args(const std::vector<std::string>& args, size_t first, const std::set<std::string>& with_value,
       const std::set<std::string>& switches) {
    for (size_t i = first; i < args.size(); ++i) {
      const std::string& a = args[i];
      if (switches.count(a)) {
        EPKIT_CHECK(!values_.count(a), "option ", a, " given twice");
        values_[a] = "";
      } else if (with_value.count(a)) {
        EPKIT_CHECK(i + 1 < args.size(), "option ", a, " needs a value");
        EPKIT_CHECK(!values_.count(a) || kRepeatable.count(a), "option ", a, " given twice");
        values_[a] = args[++i];
        all_[a].push_back(values_[a]);
      } else {
        EPKIT_FAIL("unknown option '", a, "' (see epkit-plan --help)");
      }
    }
  }
  bool has(const std::string& k) const { return values_.count(k) != 0; }
  // Every value of a repeatable option, in command-line order.
  std::vector<std::string> all(const std::string& k) const { return all_.count(k) ? all_.at(k) : std::vector<std::string>{}; }
  std::string str(const std::string& k, const std::string& def) const { return has(k) ? values_.at(k) : def; }
  int integer(const std::string& k, int def, int lo, int hi) const {
    if (!has(k)) return def;
    const std::string& s = values_.at(k);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(s, &used);
    } catch (const std::exception&) {
      EPKIT_FAIL(k, " = '", s, "' is not an integer");
    }
    EPKIT_CHECK(used == s.size(), k, " = '", s, "' is not an integer");
    EPKIT_CHECK(v >= lo && v <= hi, k, " = ", v, " must be in [", lo, ", ", hi, "]");
    return static_cast<int>(v);
  }
  double number(const std::string& k, double def, double lo, double hi) const {
    if (!has(k)) return def;
    const std::string& s = values_.at(k);
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(s, &used);
    } catch (const std::exception&) {
      EPKIT_FAIL(k, " = '", s, "' is not a number");
    }
    EPKIT_CHECK(used == s.size() && std::isfinite(v), k, " = '", s, "' is not a number");
    EPKIT_CHECK(v >= lo && v <= hi, k, " = ", v, " must be in [", lo, ", ", hi, "]");
    return v;
  }
  std::vector<int> int_list(const std::string& k, std::vector<int> def, int lo, int hi) const {
    if (!has(k)) return def;
    std::vector<int> out;
    std::string s = values_.at(k), item;
    size_t start = 0;
    while (start <= s.size()) {
      size_t comma = s.find(',', start);
      item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      Args one({k, item}, 0, {k}, {});
      out.push_back(one.integer(k, 0, lo, hi));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    return out;
  }

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<std::string>> all_;
};

const std::set<std::string> kCommon = {"--model", "--query-len", "--acceptance", "--context", "--calibrate",
                                       "--calibrate-system", "--eff"};

// --eff NAME=VALUE[,NAME=VALUE...] overrides efficiency factors.
Efficiency parse_efficiency(const Args& a) {
  Efficiency e;
  if (!a.has("--eff")) return e;
  const std::map<std::string, double Efficiency::*> fields = {
      {"gemm_memory", &Efficiency::gemm_memory},         {"gemm_compute", &Efficiency::gemm_compute},
      {"attention_memory", &Efficiency::attention_memory}, {"attention_compute", &Efficiency::attention_compute},
      {"elementwise_memory", &Efficiency::elementwise_memory}, {"comm", &Efficiency::comm}};
  std::string s = a.str("--eff", "");
  size_t start = 0;
  while (start < s.size()) {
    size_t comma = s.find(',', start);
    std::string kv = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t eq = kv.find('=');
    EPKIT_CHECK(eq != std::string::npos, "--eff item '", kv, "' must be NAME=VALUE");
    auto it = fields.find(kv.substr(0, eq));
    EPKIT_CHECK(it != fields.end(), "--eff: unknown efficiency '", kv.substr(0, eq),
                "' (gemm_memory, gemm_compute, attention_memory, attention_compute, elementwise_memory, comm)");
    Args one({"--eff", kv.substr(eq + 1)}, 0, {"--eff"}, {});
    e.*(it->second) = one.number("--eff", 0, 1e-6, 1.0);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  validate(e);
  return e;
}

std::optional<Calibration> parse_calibration(const Args& a, const ModelSpec& m) {
  if (!a.has("--calibrate")) return std::nullopt;
  return load_calibrations(a.all("--calibrate"), m, a.str("--calibrate-system", "epkit"));
}

Json calibration_json(const std::optional<Calibration>& cal) {
  Json j = Json::object();
  Json sources = Json::array();
  if (cal)
    for (const auto& s : cal->sources) sources.push(s);
  // rows_used counts epkit-bench rows (the field predates the epkit-moe files).
  j.set("source", cal ? cal->source : "").set("sources", sources)
      .set("rows_used", cal ? double(cal->comm.size()) : 0.0)
      .set("kernel_rows_used", cal ? double(cal->kernels.size()) : 0.0)
      .set("kernel_rows_ignored", cal ? cal->kernel_rows_ignored : 0)
      .set("layer_rows_ignored", cal ? cal->layer_rows_ignored : 0)
      .set("layer_rows_used", cal ? double(cal->layers.size()) : 0.0);
  return j;
}

std::string calibration_line(const Calibration& cal) {
  return detail::concat("calibration: ", cal.comm.size(), " epkit-bench rows (dispatch/combine), ", cal.kernels.size(),
                        " epkit-moe kernel rows (", cal.kernel_rows_ignored, " ignored), ", cal.layers.size(),
                        " epkit-moe layer rows (", cal.layer_rows_ignored, " ignored), from ", cal.source, "\n");
}

int cmd_explain(const std::vector<std::string>& args, std::ostream& out) {
  std::set<std::string> vals = kCommon;
  vals.insert({"--gpu", "--nodes", "--ep", "--tp", "--batch", "--schedule"});
  Args a(args, 1, vals, {"--json"});
  const ModelSpec m = load_model(a.str("--model", "deepseek-v3"));
  const GpuSpec g = load_gpu(a.str("--gpu", "h200"));
  DeployConfig c;
  c.ep = a.integer("--ep", 8, 1, 1 << 16);
  c.tp = a.integer("--tp", 1, 1, 1 << 10);
  c.batch = a.integer("--batch", 1, 1, 1 << 20);
  c.query_len = a.integer("--query-len", 1 + m.mtp_draft_tokens, 1, 64);
  c.acceptance = a.number("--acceptance", 0.6, 0, 1);
  c.context = a.integer("--context", 5000, 1, 10'000'000);
  c.schedule = parse_schedule(a.str("--schedule", "none"));
  const int nodes = a.integer("--nodes", num_nodes(c, g), 1, 1 << 16);
  EPKIT_CHECK(nodes == num_nodes(c, g), "--nodes = ", nodes, " does not match --ep = ", c.ep, " on ", g.name,
              " with ", g.gpus_per_node, " GPUs per node (needs ", num_nodes(c, g), ")");
  const Efficiency e = parse_efficiency(a);
  const auto cal = parse_calibration(a, m);
  const PlanPoint p = estimate(m, g, c, e, cal ? &*cal : nullptr);
  if (a.has("--json")) {
    Json j = to_json(p);
    j.set("calibration", calibration_json(cal));
    out << j.dump(2) << "\n";
  } else {
    out << explain_text(p);
    if (cal) out << "\n" << calibration_line(*cal);
  }
  return 0;
}

int cmd_sweep(const std::vector<std::string>& args, size_t first, std::ostream& out) {
  std::set<std::string> vals = kCommon;
  vals.insert({"--gpu", "--single-gpu", "--multi-gpu", "--ep", "--tp", "--batch", "--schedule"});
  Args a(args, first, vals, {"--json", "--csv", "--all"});
  EPKIT_CHECK(!(a.has("--json") && a.has("--csv")), "--json and --csv are exclusive");
  SweepSpec s;
  s.model = load_model(a.str("--model", "deepseek-v3"));
  s.single_node_gpu = load_gpu(a.str("--single-gpu", a.str("--gpu", "h200")));
  s.multi_node_gpu = load_gpu(a.str("--multi-gpu", a.str("--gpu", "h100")));
  s.eps = a.int_list("--ep", s.eps, 1, 1 << 16);
  s.tps = a.int_list("--tp", s.tps, 1, 1 << 10);
  s.batches = a.int_list("--batch", s.batches, 1, 1 << 20);
  if (a.has("--schedule")) {
    s.schedules.clear();
    std::string list = a.str("--schedule", "");
    size_t start = 0;
    while (true) {
      size_t comma = list.find(',', start);
      s.schedules.push_back(parse_schedule(list.substr(start, comma == std::string::npos ? comma : comma - start)));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  s.query_len = a.integer("--query-len", 1 + s.model.mtp_draft_tokens, 1, 64);
  s.acceptance = a.number("--acceptance", 0.6, 0, 1);
  s.context = a.integer("--context", 5000, 1, 10'000'000);
  s.efficiency = parse_efficiency(a);
  const auto cal = parse_calibration(a, s.model);
  const auto points = sweep(s, cal ? &*cal : nullptr);
  EPKIT_CHECK(!points.empty(), "the sweep has no valid point for ", s.model.name,
              " (check --ep against num_routed_experts = ", s.model.num_routed_experts, ")");

  if (a.has("--csv")) {
    std::vector<size_t> rows;
    if (a.has("--all")) {
      for (size_t i = 0; i < points.size(); ++i) rows.push_back(i);
    } else {
      for (int ep : s.eps)
        for (size_t i : pareto_frontier(points, ep)) rows.push_back(i);
    }
    out << csv(points, rows);
    return 0;
  }
  if (!a.has("--json")) {
    out << pareto_table(points, s.eps);
    if (s.eps.size() > 1) {
      const BandRatio r = band_ratio(points, s.eps.back(), s.eps.front(), 40, 80);
      if (r.samples > 0)
        out << "EP" << s.eps.back() << " / EP" << s.eps.front() << " throughput per node at equal speed, 40-80 tok/s: "
            << "geomean " << r.geomean << "x (min " << r.min << "x, max " << r.max << "x, " << r.samples
            << " speeds)\n";
    }
    if (cal) out << calibration_line(*cal);
    return 0;
  }
  Json j = Json::object();
  j.set("model", to_json(s.model)).set("single_node_gpu", to_json(s.single_node_gpu))
      .set("multi_node_gpu", to_json(s.multi_node_gpu)).set("calibration", calibration_json(cal));
  Json pts = Json::array();
  for (const auto& p : points) {
    Json pj = to_json(p);
    pj.set("kernels", Json());  // the sweep output stays small; explain shows kernels
    pts.push(pj);
  }
  j.set("points", pts);
  Json pareto = Json::object();
  for (int ep : s.eps) {
    Json idx = Json::array();
    for (size_t i : pareto_frontier(points, ep)) idx.push(double(i));
    pareto.set("ep" + std::to_string(ep), idx);
  }
  j.set("pareto", pareto);
  Json summary = Json::object();
  if (s.eps.size() > 1) {
    const BandRatio r = band_ratio(points, s.eps.back(), s.eps.front(), 40, 80);
    Json br = Json::object();
    br.set("ep_a", s.eps.back()).set("ep_b", s.eps.front()).set("lo", 40).set("hi", 80).set("geomean", r.geomean)
        .set("min", r.min).set("max", r.max).set("samples", r.samples);
    summary.set("band_ratio_40_80", br);
  }
  Json gains = Json::object();
  for (int ep : s.eps) {
    Json list = Json::array();
    for (const auto& mg : microbatch_gains(points, ep, 1)) {
      Json gj = Json::object();
      gj.set("batch", mg.batch).set("dispatch_overlap_us", mg.dispatch_overlap_us).set("microbatch_us", mg.microbatch_us)
          .set("gain", mg.gain);
      list.push(gj);
    }
    gains.set("ep" + std::to_string(ep) + "_tp1", list);
  }
  summary.set("microbatch_gain", gains);
  j.set("summary", summary);
  out << j.dump(1) << "\n";
  return 0;
}

// GEMM and GroupGEMM points of the MoE layer for the roofline plot (the deployment study figures), TP1.
int cmd_roofline(const std::vector<std::string>& args, std::ostream& out) {
  std::set<std::string> vals = kCommon;
  vals.insert({"--gpus", "--ep", "--batch"});
  Args a(args, 1, vals, {"--json"});
  const ModelSpec m = load_model(a.str("--model", "deepseek-v3"));
  std::vector<GpuSpec> gpus;
  {
    std::string list = a.str("--gpus", "h100,h200");
    size_t start = 0;
    while (true) {
      size_t comma = list.find(',', start);
      gpus.push_back(load_gpu(list.substr(start, comma == std::string::npos ? comma : comma - start)));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  const auto eps = a.int_list("--ep", {8, 16, 32, 64, 128}, 1, 1 << 16);
  const auto batches = a.int_list("--batch", {1, 2, 4, 8, 16, 32, 64, 128}, 1, 1 << 20);
  const Efficiency e = parse_efficiency(a);
  const auto cal = parse_calibration(a, m);
  Json j = Json::object();
  Json roofs = Json::array();
  Json pts = Json::array();
  for (const auto& g : gpus) {
    Json r = Json::object();
    r.set("gpu", g.name).set("peak_fp8_tflops", g.peak_fp8_tflops).set("peak_bf16_tflops", g.peak_bf16_tflops)
        .set("hbm_bandwidth_tb_per_s", g.hbm_bandwidth_tb_per_s);
    roofs.push(r);
    for (int ep : eps)
      for (int b : batches) {
        DeployConfig c;
        c.ep = ep;
        c.batch = b;
        c.query_len = a.integer("--query-len", 1 + m.mtp_draft_tokens, 1, 64);
        c.context = a.integer("--context", 5000, 1, 10'000'000);
        validate(c, m, g);
        const auto ops = moe_layer_ops(m, g, c, e, b, true, cal ? &*cal : nullptr);
        for (const auto& op : ops.ops) {
          if (op.kind != OpKind::kKernel || op.kernel.flop == 0) continue;
          const auto& k = op.kernel;
          if (k.cls != KernelClass::kGemm && k.cls != KernelClass::kGroupGemm) continue;
          // The roofline plot shows the kernel body; a measured time has no separable launch cost.
          const double t = k.measured ? k.time_us : k.time_us - g.kernel_launch_us;
          Json pj = Json::object();
          pj.set("gpu", g.name).set("ep", ep).set("batch", b).set("kernel", k.name).set("class", to_string(k.cls))
              .set("intensity_flop_per_byte", k.intensity()).set("tflops", k.flop / (t * 1e-6) / 1e12)
              .set("time_us", k.time_us).set("source", k.measured ? "measured" : "modelled");
          pts.push(pj);
        }
      }
  }
  j.set("model", m.name).set("rooflines", roofs).set("points", pts);
  if (a.has("--json")) {
    out << j.dump(1) << "\n";
  } else {
    out << "gpu       EP  batch  kernel        AI(FLOP/B)  TFLOP/s\n";
    for (const auto& pj : j.at("points").as_array()) {
      char line[160];
      std::snprintf(line, sizeof line, "%-8s %3.0f  %5.0f  %-12s %10.1f  %7.1f\n", pj.at("gpu").as_string().c_str(),
                    pj.at("ep").as_number(), pj.at("batch").as_number(), pj.at("kernel").as_string().c_str(),
                    pj.at("intensity_flop_per_byte").as_number(), pj.at("tflops").as_number());
      out << line;
    }
  }
  return 0;
}

int cmd_specs(const std::vector<std::string>& args, std::ostream& out) {
  Args a(args, 1, {}, {"--json"});
  Json j = Json::object();
  Json gpus = Json::array(), models = Json::array();
  for (const auto& n : builtin_gpu_names()) gpus.push(to_json(load_gpu(n)));
  for (const auto& n : builtin_model_names()) models.push(to_json(load_model(n)));
  j.set("gpus", gpus).set("models", models);
  out << j.dump(2) << "\n";
  return 0;
}

}  // namespace

std::string cli_usage() {
  return R"(epkit-plan: choose an expert-parallel MoE deployment before owning the hardware (CPU only).

  epkit-plan [sweep] [--model NAME|FILE] [--gpu G | --single-gpu G --multi-gpu G] [--ep LIST] [--tp LIST]
             [--batch LIST] [--schedule none,dispatch,microbatch] [--query-len N] [--acceptance A]
             [--context N] [--calibrate FILE ... [--calibrate-system epkit|nccl|nvshmem]]
             [--eff NAME=V,...] [--csv [--all] | --json]
      Sweeps EP x TP x batch x schedule and prints the Pareto frontier per EP. EPs up to the node size run
      on --single-gpu (default h200), larger ones on --multi-gpu (default h100-sxm).
  epkit-plan explain --model M --gpu G --nodes N --ep E --tp T --batch B [--query-len Q] [--context 5000]
             [--schedule none|dispatch|microbatch] [--calibrate FILE ...] [--json]
      Per-layer breakdown of one configuration. --batch counts requests per DP group (= per GPU at TP1).
      --calibrate (repeatable) reads epkit-bench JSON (measured dispatch/combine), epkit-moe kernel JSON
      (measured GroupGEMM, router, SiLU-mul kernels) and epkit-moe layer JSON (the measured MoE layer,
      printed next to the modelled one).
      --query-len defaults to 1 + the model's MTP draft tokens (2 for DeepSeek-V3, 1 for Mixtral).
  epkit-plan roofline [--gpus h100,h200] [--ep LIST] [--batch LIST] [--calibrate FILE ...] [--json]
      GEMM and GroupGEMM points of a MoE layer on the rooflines.
  epkit-plan specs
      The built-in GPU and model specs as JSON (a template for user files).
)";
}

int run_cli(const std::vector<std::string>& args, std::ostream& out) {
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h" || args[0] == "help")) {
    out << cli_usage();
    return 0;
  }
  if (!args.empty() && args[0] == "explain") return cmd_explain(args, out);
  if (!args.empty() && args[0] == "roofline") return cmd_roofline(args, out);
  if (!args.empty() && args[0] == "specs") return cmd_specs(args, out);
  const size_t first = (!args.empty() && args[0] == "sweep") ? 1 : 0;
  return cmd_sweep(args, first, out);
}

}  // namespace epkit::plan
