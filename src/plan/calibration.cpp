// Reading epkit-bench results and looking up measured dispatch/combine times.
#include "epkit/plan/calibration.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "epkit/error.hpp"

namespace epkit::plan {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

bool preset_matches(const std::string& preset, const ModelSpec& m) {
  const std::string p = lower(preset);
  if (p == lower(m.name)) return true;
  for (const auto& a : m.aliases)
    if (p == lower(a)) return true;
  return false;
}

double number(const Json& row, const char* key, const std::string& where) {
  double v = row.at(key).as_number(where + "." + key);
  EPKIT_CHECK(std::isfinite(v) && v >= 0, where, ".", key, " = ", v, " must be a finite number >= 0");
  return v;
}

}  // namespace

Calibration calibration_from_json(const Json& j, const ModelSpec& m, const std::string& system) {
  Calibration cal;
  const Json::Array& rows = j.at("rows").as_array("rows");
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string where = "rows[" + std::to_string(i) + "]";
    const Json& row = rows[i];
    row.as_object(where);
    CommMeasurement r;
    r.system = row.at("system").as_string(where + ".system");
    EPKIT_CHECK(r.system == "epkit" || r.system == "nccl" || r.system == "nvshmem", where, ".system = '", r.system,
                "' is not one of: epkit, nccl, nvshmem");
    if (const Json* p = row.find("preset")) r.preset = p->as_string(where + ".preset");
    const double ws = number(row, "world_size", where), tok = number(row, "tokens", where);
    EPKIT_CHECK(ws >= 1 && ws == std::floor(ws), where, ".world_size = ", ws, " must be an integer >= 1");
    EPKIT_CHECK(tok >= 1 && tok == std::floor(tok), where, ".tokens = ", tok, " must be an integer >= 1");
    r.world_size = static_cast<int>(ws);
    r.tokens = static_cast<int>(tok);
    r.dispatch_us = number(row, "dispatch_us_median", where);
    r.combine_us = number(row, "combine_us_median", where);
    r.total_us = number(row, "total_us_median", where);
    if (row.find("total_us_p99")) r.total_p99_us = number(row, "total_us_p99", where);
    if (r.system != system) continue;
    if (!r.preset.empty() && !preset_matches(r.preset, m)) continue;
    cal.comm.push_back(r);
  }
  return cal;
}

Calibration load_calibration(const std::string& path, const ModelSpec& m, const std::string& system) {
  Calibration cal = calibration_from_json(read_json_file(path), m, system);
  cal.source = path;
  return cal;
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
