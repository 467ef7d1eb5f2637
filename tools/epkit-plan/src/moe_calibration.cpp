// epkit-moe rows (tools/epkit-moe: kernel and layer JSON) and their lookups: measured kernel times at
// the planner's shapes, and the measured layer for a planner point.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <set>

#include "calibration_rows.hpp"
#include "epkit/error.hpp"
#include "epkit/plan/calibration.hpp"

namespace epkit::plan {

namespace detail {

MoeFile moe_file(const Json& doc) {
  MoeFile f;
  if (const Json* meta = doc.find("meta"))
    if (meta->is_object())
      if (const Json* d = meta->find("device")) f.device = d->as_string("meta.device");
  return f;
}

void read_ceilings(const Json& doc, MoeFile& f) {
  const Json* c = doc.find("ceilings");
  EPKIT_CHECK(c != nullptr, "ceilings is missing: epkit-moe kernel rows need the run's measured ceilings");
  c->as_object("ceilings");
  f.hbm_GBps = row_number(*c, "hbm_read_GBps", "ceilings");
  f.fp8_TFLOPs = row_number(*c, "fp8_dense_TFLOPs", "ceilings");
  EPKIT_CHECK(f.hbm_GBps > 0, "ceilings.hbm_read_GBps = ", f.hbm_GBps, " must be > 0");
  EPKIT_CHECK(f.fp8_TFLOPs > 0, "ceilings.fp8_dense_TFLOPs = ", f.fp8_TFLOPs, " must be > 0");
}

KernelMeasurement kernel_row(const Json& row, const std::string& where, const MoeFile& f, std::string* system) {
  KernelMeasurement r;
  r.kernel = row_string(row, "kernel", where);
  *system = row_string(row, "system", where);
  r.variant = row_string(row, "variant", where);
  r.device = f.device;
  r.groups = row_integer(row, "G", where, 1);
  r.m = row_integer(row, "m", where, 1);
  r.n = row_integer(row, "N", where, 0);
  r.k = row_integer(row, "K", where, 0);
  r.us = row_number(row, "us_median", where);
  EPKIT_CHECK(r.us > 0, where, ".us_median = ", r.us, " must be > 0");
  r.bytes = row_number(row, "bytes", where);
  r.weight_bytes = row_number(row, "weight_bytes", where);
  r.flops = row_number(row, "flops", where);
  EPKIT_CHECK(r.bytes > 0 || r.flops > 0, where, ": bytes and flops are both 0, so there is no roofline to take a fraction of");
  r.hbm_GBps = f.hbm_GBps;
  r.fp8_TFLOPs = f.fp8_TFLOPs;
  return r;
}

LayerMeasurement layer_row(const Json& row, const std::string& where, const MoeFile& f) {
  LayerMeasurement r;
  row_string(row, "system", where);
  r.device = f.device;
  r.schedule = row_string(row, "schedule", where);
  EPKIT_CHECK(r.schedule == "none" || r.schedule == "dispatch_overlap" || r.schedule == "microbatch", where,
              ".schedule = '", r.schedule, "' is not one of: none, dispatch_overlap, microbatch");
  r.layout = row_string(row, "layout", where);
  EPKIT_CHECK(r.layout == "masked" || r.layout == "packed", where, ".layout = '", r.layout,
              "' is not one of: masked, packed");
  r.world_size = row_integer(row, "world_size", where, 1);
  r.experts = row_integer(row, "experts", where, 1);
  r.batch = row_integer(row, "batch", where, 0);
  r.query_len = row_integer(row, "query_len", where, 1);
  r.tokens = row_integer(row, "tokens", where, 0);
  EPKIT_CHECK(r.tokens == r.batch * r.query_len, where, ".tokens = ", r.tokens, " must equal batch * query_len = ",
              r.batch * r.query_len);
  r.us = row_number(row, "us_median", where);
  r.graph_us = row_number(row, "graph_us_median", where);
  EPKIT_CHECK(r.graph_us > 0, where, ".graph_us_median = ", r.graph_us, " must be > 0");
  if (row.find("graph_us_p99")) r.graph_p99_us = row_number(row, "graph_us_p99", where);
  if (const Json* n = row.find("note")) r.note = n->as_string(where + ".note");
  if (const Json* s = row.find("shared")) {
    r.shared = s->as_string(where + ".shared");
    EPKIT_CHECK(r.shared == "concurrent" || r.shared == "in_stream", where, ".shared = '", r.shared,
                "' is not one of: concurrent, in_stream");
  }
  if (const Json* g = row.find("gate_router")) {
    r.gate_router = g->as_string(where + ".gate_router");
    EPKIT_CHECK(r.gate_router == "fused" || r.gate_router == "separate", where, ".gate_router = '", r.gate_router,
                "' is not one of: fused, separate");
  }
  if (const Json* b = row.find("breakdown")) {
    const Json::Array& steps = b->as_array(where + ".breakdown");
    for (size_t i = 0; i < steps.size(); ++i) {
      const std::string w = where + ".breakdown[" + std::to_string(i) + "]";
      steps[i].as_object(w);
      LayerStepMeasurement s;
      s.step = row_string(steps[i], "step", w);
      EPKIT_CHECK(!s.step.empty(), w, ".step is empty");
      s.us = row_number(steps[i], "us_median", w);
      r.breakdown.push_back(s);
    }
  }
  return r;
}

bool device_matches(const std::string& device, const std::string& gpu) {
  if (device.empty()) return true;
  auto lower = [](std::string s) {
    for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  const std::string g = lower(gpu), stem = g.substr(0, g.find('-'));
  std::string word;
  for (char c : lower(device) + " ") {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      word += c;
    } else {
      if (!word.empty() && (word == g || word == stem)) return true;
      word.clear();
    }
  }
  return false;
}

}  // namespace detail

double KernelMeasurement::roofline_fraction() const {
  const double mem = weight_bytes > 0 ? weight_bytes : bytes;
  const double roof_s = std::max(mem / (hbm_GBps * 1e9), flops / (fp8_TFLOPs * 1e12));
  return roof_s / (us * 1e-6);
}

namespace {

// The x a row or query is interpolated over: rows per group for the GEMM (its efficiency follows the
// tile's m), all rows for the memory-bound kernels (their efficiency follows the bytes they move).
bool per_group(const std::string& kernel) { return kernel == "grouped_gemm"; }
double x_of(const KernelMeasurement& r) { return per_group(r.kernel) ? r.m : double(r.groups) * r.m; }

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

}  // namespace

KernelLookup lookup_kernel(const Calibration& cal, const KernelQuery& q) {
  KernelLookup out;
  std::string label = q.kernel + (q.variant.empty() ? "" : " " + q.variant) + " N=" + std::to_string(q.n) +
                      (q.k >= 0 ? " K=" + std::to_string(q.k) : "");
  std::vector<const KernelMeasurement*> rows;
  std::set<std::string> variants;
  std::string other_device;
  for (const auto& r : cal.kernels) {
    if (r.kernel != q.kernel || (!q.variant.empty() && r.variant != q.variant) || r.n != q.n ||
        (q.k >= 0 && r.k != q.k))
      continue;
    if (!detail::device_matches(r.device, q.gpu)) {
      other_device = r.device;
      continue;
    }
    rows.push_back(&r);
    variants.insert(r.variant);
  }
  if (rows.empty()) {
    out.what = other_device.empty() ? "no " + label + " rows" : label + " rows were measured on " + other_device + ", not " + q.gpu;
    return out;
  }
  if (variants.size() > 1) {
    out.what = "several " + label + " variants match (" + *variants.begin() + ", " + *variants.rbegin() + ")";
    return out;
  }
  if (q.variant.empty()) label = q.kernel + " " + *variants.begin();

  if (!(q.groups > 0 && q.m > 0)) {
    out.what = "no rows to time (G = " + fmt(q.groups) + ", m = " + fmt(q.m) + ")";
    return out;
  }
  // The measured G nearest to the query's, by ratio; a tie goes to the larger G.
  int g_best = rows.front()->groups;
  for (const auto* r : rows) {
    const double d = std::abs(std::log(r->groups / q.groups)), best = std::abs(std::log(g_best / q.groups));
    if (d < best - 1e-12 || (std::abs(d - best) <= 1e-12 && r->groups > g_best)) g_best = r->groups;
  }
  std::vector<const KernelMeasurement*> at;
  for (const auto* r : rows)
    if (r->groups == g_best) at.push_back(r);
  std::sort(at.begin(), at.end(), [](auto* a, auto* b) { return x_of(*a) < x_of(*b); });
  out.groups_used = g_best;

  const bool grouped = per_group(q.kernel);
  const double x = grouped ? q.m : q.groups * q.m;
  const char* x_name = grouped ? "m" : "rows";
  const double lo = x_of(*at.front()), hi = x_of(*at.back());
  const double tol = 1e-9 * std::max(1.0, x);
  if (!(x >= lo - tol && x <= hi + tol)) {
    out.what = std::string(x_name) + " = " + fmt(x) + " outside the measured [" + fmt(lo) + ", " + fmt(hi) + "] of " +
               label + " at G=" + std::to_string(g_best);
    return out;
  }
  size_t i = 0;
  while (i + 1 < at.size() && x_of(*at[i + 1]) <= x + tol) ++i;
  const KernelMeasurement& a = *at[i];
  const bool exact = std::abs(x - x_of(a)) <= tol;
  const KernelMeasurement& b = exact ? a : *at[i + 1];
  // Efficiency interpolates as a power law between the two points (log f over log x): exact for a
  // launch-bound kernel, whose time is flat while its bytes grow. Bytes and FLOP are affine in x.
  const double xa = x_of(a), xb = x_of(b);
  const double w_log = exact ? 0 : (std::log(x) - std::log(xa)) / (std::log(xb) - std::log(xa));
  const double w_lin = exact ? 0 : (x - xa) / (xb - xa);
  const double f = std::exp((1 - w_log) * std::log(a.roofline_fraction()) + w_log * std::log(b.roofline_fraction()));
  const double scale = grouped ? q.groups / g_best : 1.0;
  auto lin = [&](double va, double vb) { return scale * ((1 - w_lin) * va + w_lin * vb); };
  const double mem = a.weight_bytes > 0 ? lin(a.weight_bytes, b.weight_bytes) : lin(a.bytes, b.bytes);
  const double flops = lin(a.flops, b.flops);
  const double roof_s = std::max(mem / (a.hbm_GBps * 1e9), flops / (a.fp8_TFLOPs * 1e12));
  out.found = true;
  out.time_us = roof_s / f * 1e6;
  out.interpolated = !exact;
  out.what = label + " G=" + std::to_string(g_best) + ", " + x_name + " " + fmt(x) +
             (exact ? " measured" : " interpolated in [" + fmt(xa) + ", " + fmt(xb) + "]") +
             (grouped && std::abs(scale - 1) > 1e-9 ? ", scaled to G=" + fmt(q.groups) : "");
  return out;
}

std::string layer_schedule_name(Schedule s) {
  switch (s) {
    case Schedule::kNoOverlap: return "none";
    case Schedule::kDispatchOverlap: return "dispatch_overlap";
    case Schedule::kMicroBatch: return "microbatch";
  }
  return "?";
}

LayerMatch find_layer_row(const Calibration& cal, const ModelSpec& m, const std::string& gpu, int ep, int tp,
                          int batch, int query_len, Schedule schedule) {
  LayerMatch out;
  const int local = m.num_routed_experts / ep;
  const std::string sched = layer_schedule_name(schedule);
  if (tp != 1) {
    out.why = "epkit-moe layer rows have no TP groups; only TP1 points are compared";
    return out;
  }
  const LayerMeasurement* best[2] = {nullptr, nullptr};  // exact, proxy
  // The layer's defaults first: the packed layout, then (schedule none) the shared expert on its own
  // branch.
  auto rank_of = [](const LayerMeasurement& x) { return (x.layout == "packed" ? 2 : 0) + (x.shared == "concurrent"); };
  bool other_device = false;
  for (const auto& r : cal.layers) {
    if (r.experts != local || r.batch != batch || r.query_len != query_len || r.schedule != sched) continue;
    const int kind = r.world_size == ep ? 0 : (r.world_size == 1 && local >= m.top_k ? 1 : -1);
    if (kind < 0) continue;
    if (!detail::device_matches(r.device, gpu)) {
      other_device = true;
      continue;
    }
    if (!best[kind] || rank_of(r) > rank_of(*best[kind])) best[kind] = &r;
  }
  if (best[0] || best[1]) {
    out.row = best[0] ? best[0] : best[1];
    out.kind = best[0] ? "exact" : "w1_proxy";
    return out;
  }
  out.why = "no epkit-moe layer row for W=" + std::to_string(ep) + " with " + std::to_string(local) +
            " experts per GPU" + (ep > 1 ? " (or its W=1 proxy)" : "") + ", batch " + std::to_string(batch) +
            ", query_len " + std::to_string(query_len) + ", schedule " + sched +
            (other_device ? " measured on " + gpu + " (rows of another device exist)" : "");
  return out;
}

}  // namespace epkit::plan
