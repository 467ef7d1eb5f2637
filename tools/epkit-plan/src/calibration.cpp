// Reading calibration files (each row's kind detected on its own), epkit-bench rows, and the lookup of
// measured dispatch/combine times. epkit-moe rows are read in moe_calibration.cpp.
#include "epkit/plan/calibration.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "calibration_rows.hpp"
#include "epkit/error.hpp"

namespace epkit::plan {

namespace detail {

double row_number(const Json& row, const char* key, const std::string& where) {
  const Json* v = row.find(key);
  EPKIT_CHECK(v != nullptr, where, ".", key, " is missing");
  const double x = v->as_number(where + "." + key);
  EPKIT_CHECK(std::isfinite(x) && x >= 0, where, ".", key, " = ", x, " must be a finite number >= 0");
  return x;
}

int row_integer(const Json& row, const char* key, const std::string& where, int lo) {
  const double x = row_number(row, key, where);
  EPKIT_CHECK(x == std::floor(x) && x >= lo && x <= 1e9, where, ".", key, " = ", x, " must be an integer >= ", lo);
  return static_cast<int>(x);
}

const std::string& row_string(const Json& row, const char* key, const std::string& where) {
  const Json* v = row.find(key);
  EPKIT_CHECK(v != nullptr, where, ".", key, " is missing");
  return v->as_string(where + "." + key);
}

}  // namespace detail

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

bool names_model(const std::string& preset, const ModelSpec& m) {
  const std::string p = lower(preset);
  if (p == lower(m.name)) return true;
  for (const auto& a : m.aliases)
    if (p == lower(a)) return true;
  return false;
}

// A preset that names a known model (built-in, or the planner's) must name this one. Other presets
// ("decode", "prefill") describe a workload, and the row's shape fields decide.
bool preset_allows(const std::string& preset, const ModelSpec& m) {
  if (preset.empty() || names_model(preset, m)) return true;
  for (const auto& name : builtin_model_names())
    if (names_model(preset, load_model(name))) return false;
  return true;
}

// Whether an epkit-bench row measured this model's dispatch/combine as the planner models them. Each
// field is checked only when the row has it (older files have none of them).
bool comm_row_matches(const Json& row, const CommMeasurement& r, const ModelSpec& m, const std::string& where) {
  if (!preset_allows(r.preset, m)) return false;
  auto number_is = [&](const char* key, double want) {
    return !row.find(key) || detail::row_number(row, key, where) == want;
  };
  auto string_is = [&](const char* key, const std::string& want) {
    return !row.find(key) || detail::row_string(row, key, where) == want;
  };
  const std::string dispatch_dtype = m.dispatch_bytes <= 1 ? "fp8_e4m3" : "bf16";
  const std::string combine_dtype = m.combine_bytes <= 1 ? "fp8_e4m3" : "bf16";
  // path "auto" is the library's default; other paths (weights-at-dispatch, forced variants) are
  // studies of their own, and dp_size > 1 is a TP-like group the planner does not calibrate.
  return number_is("hidden", m.hidden) && number_is("experts", m.num_routed_experts) && number_is("topk", m.top_k) &&
         string_is("dispatch_dtype", dispatch_dtype) && string_is("combine_dtype", combine_dtype) &&
         string_is("path", "auto") && number_is("dp_size", 1) && string_is("routing", "uniform");
}

CommMeasurement comm_row(const Json& row, const std::string& where) {
  CommMeasurement r;
  r.system = detail::row_string(row, "system", where);
  EPKIT_CHECK(r.system == "epkit" || r.system == "nccl" || r.system == "nvshmem", where, ".system = '", r.system,
              "' is not one of: epkit, nccl, nvshmem");
  if (const Json* p = row.find("preset")) r.preset = p->as_string(where + ".preset");
  r.world_size = detail::row_integer(row, "world_size", where, 1);
  r.tokens = detail::row_integer(row, "tokens", where, 1);
  r.dispatch_us = detail::row_number(row, "dispatch_us_median", where);
  r.combine_us = detail::row_number(row, "combine_us_median", where);
  r.total_us = detail::row_number(row, "total_us_median", where);
  if (row.find("total_us_p99")) r.total_p99_us = detail::row_number(row, "total_us_p99", where);
  return r;
}

// epkit-moe layer runs schedule none at decode batches twice, with the fused gate + router (the
// library's default where it applies) and without it: the second row of such a point is the A/B's,
// not what the library runs, so it is left out (and counted).
void drop_unfused_twins(Calibration& cal) {
  auto key = [](const LayerMeasurement& r) {
    return std::make_tuple(r.device, r.world_size, r.experts, r.batch, r.query_len, r.schedule, r.layout, r.shared);
  };
  std::set<decltype(key(cal.layers[0]))> fused;
  for (const auto& r : cal.layers)
    if (r.gate_router == "fused") fused.insert(key(r));
  const size_t before = cal.layers.size();
  cal.layers.erase(std::remove_if(cal.layers.begin(), cal.layers.end(),
                                  [&](const LayerMeasurement& r) { return r.gate_router == "separate" && fused.count(key(r)); }),
                   cal.layers.end());
  cal.layer_rows_ignored += static_cast<int>(before - cal.layers.size());
}

// Two rows of one point would make the lookup depend on file order; refuse them.
void check_unique(const Calibration& cal) {
  std::map<std::tuple<std::string, std::string, int, int, int, int, std::string>, const KernelMeasurement*> kernels;
  for (const auto& r : cal.kernels) {
    auto [it, fresh] = kernels.emplace(std::make_tuple(r.kernel, r.variant, r.n, r.k, r.groups, r.m, r.device), &r);
    EPKIT_CHECK(fresh, "kernel row ", r.kernel, " ", r.variant, " G=", r.groups, " m=", r.m, " N=", r.n, " K=", r.k,
                " appears twice (", it->second->source, " and ", r.source, ")");
  }
  std::map<std::tuple<std::string, int, int, int, int, std::string, std::string, std::string>, const LayerMeasurement*>
      layers;
  for (const auto& r : cal.layers) {
    auto [it, fresh] = layers.emplace(
        std::make_tuple(r.device, r.world_size, r.experts, r.batch, r.query_len, r.schedule, r.layout, r.shared), &r);
    EPKIT_CHECK(fresh, "layer row W=", r.world_size, " E=", r.experts, " batch=", r.batch, " query_len=", r.query_len,
                " schedule=", r.schedule, " layout=", r.layout, " shared=", r.shared, " appears twice (",
                it->second->source, " and ", r.source, ")");
  }
}

}  // namespace

Calibration calibration_from_json(const Json& j, const ModelSpec& m, const std::string& system) {
  Calibration cal;
  j.as_object("calibration file");
  const Json::Array& rows = j.at("rows").as_array("rows");
  detail::MoeFile moe = detail::moe_file(j);
  bool have_ceilings = false;
  std::vector<KernelMeasurement> beside;  // epkit's default config timed beside DeepGEMM's
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string where = "rows[" + std::to_string(i) + "]";
    const Json& row = rows[i];
    row.as_object(where);
    if (row.find("dispatch_us_median")) {
      const CommMeasurement r = comm_row(row, where);
      if (r.system == system && comm_row_matches(row, r, m, where)) cal.comm.push_back(r);
    } else if (row.find("kernel")) {
      if (detail::row_string(row, "kernel", where) == "moe_layer") {
        cal.layers.push_back(detail::layer_row(row, where, moe));
        continue;
      }
      if (!have_ceilings) detail::read_ceilings(j, moe), have_ceilings = true;
      std::string row_system;
      KernelMeasurement r = detail::kernel_row(row, where, moe, &row_system);
      // Rows whose variant has a qualifier ("up_gate uneven", "up_gate <config>") are not the default
      // kernel on full groups, which is what the planner's kernels are.
      if (row_system == "epkit" && r.variant.find(' ') == std::string::npos) {
        cal.kernels.push_back(std::move(r));
      } else if (const size_t sp = r.variant.find(' ');
                 row_system == "epkit_vs_deepgemm" && sp != std::string::npos && r.variant.substr(sp) == " masked") {
        // deepgemm_baseline.py's "<shape> masked" rows (even counts, the heuristic's config): the same
        // measurement as epkit-moe's "<shape>" row, used where the file has none of its own.
        r.variant.resize(sp);
        beside.push_back(std::move(r));
      } else {
        ++cal.kernel_rows_ignored;
      }
    } else {
      EPKIT_FAIL(where, " has neither dispatch_us_median (an epkit-bench row) nor kernel (an epkit-moe row)");
    }
  }
  for (auto& r : beside) {
    const bool own = std::any_of(cal.kernels.begin(), cal.kernels.end(), [&](const KernelMeasurement& x) {
      return x.kernel == r.kernel && x.variant == r.variant && x.n == r.n && x.k == r.k && x.groups == r.groups &&
             x.m == r.m;
    });
    if (own) {
      ++cal.kernel_rows_ignored;
    } else {
      cal.kernels.push_back(std::move(r));
    }
  }
  drop_unfused_twins(cal);
  check_unique(cal);
  return cal;
}

Calibration load_calibration(const std::string& path, const ModelSpec& m, const std::string& system) {
  Calibration cal = calibration_from_json(read_json_file(path), m, system);
  cal.source = path;
  cal.sources = {path};
  for (auto& r : cal.kernels) r.source = path;
  for (auto& r : cal.layers) r.source = path;
  return cal;
}

Calibration load_calibrations(const std::vector<std::string>& paths, const ModelSpec& m, const std::string& system) {
  Calibration all;
  for (const auto& path : paths) {
    Calibration one = load_calibration(path, m, system);
    all.source += (all.source.empty() ? "" : ", ") + path;
    all.sources.push_back(path);
    all.comm.insert(all.comm.end(), one.comm.begin(), one.comm.end());
    all.kernels.insert(all.kernels.end(), one.kernels.begin(), one.kernels.end());
    all.layers.insert(all.layers.end(), one.layers.begin(), one.layers.end());
    all.kernel_rows_ignored += one.kernel_rows_ignored;
    all.layer_rows_ignored += one.layer_rows_ignored;
  }
  check_unique(all);
  return all;
}

std::optional<CommLookup> lookup_comm(const Calibration& cal, int world_size, double tokens) {
  const CommMeasurement* below = nullptr;
  const CommMeasurement* above = nullptr;
  for (const auto& r : cal.comm) {
    if (r.world_size != world_size) continue;
    if (r.tokens == tokens) return CommLookup{r.dispatch_us, r.combine_us, false};
    if (r.tokens < tokens && (!below || r.tokens > below->tokens)) below = &r;
    if (r.tokens > tokens && (!above || r.tokens < above->tokens)) above = &r;
  }
  // No extrapolation: outside the measured range the model is the better guess.
  if (!below || !above) return std::nullopt;
  const double f = (tokens - below->tokens) / double(above->tokens - below->tokens);
  return CommLookup{below->dispatch_us + f * (above->dispatch_us - below->dispatch_us),
                    below->combine_us + f * (above->combine_us - below->combine_us), true};
}

}  // namespace epkit::plan
