// Measured kernel times that replace modelled terms: the JSON epkit-bench writes.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "epkit/plan/json.hpp"
#include "epkit/plan/specs.hpp"

namespace epkit::plan {

// One epkit-bench row: medians of dispatch and combine for `tokens` tokens per rank on `world_size` ranks.
struct CommMeasurement {
  std::string preset;
  std::string system;       // epkit | nccl | nvshmem
  int world_size = 0;
  int tokens = 0;           // tokens per rank
  double dispatch_us = 0;   // dispatch_us_median
  double combine_us = 0;    // combine_us_median
  double total_us = 0;      // total_us_median
  double total_p99_us = 0;  // total_us_p99 (0 when absent)
};

// The measurements one planner run uses.
struct Calibration {
  std::string source;                  // file name, for the report
  std::vector<CommMeasurement> comm;   // rows of the chosen system and model only
};

// Measured dispatch and combine times, µs, for one configuration.
struct CommLookup {
  double dispatch_us = 0;
  double combine_us = 0;
  bool interpolated = false;  // linear in tokens between two measured token counts
};

// Reads epkit-bench JSON (top-level `rows`). Keeps rows whose `system` equals `system` and whose `preset`
// (when present) names the model or one of its aliases. Throws epkit::Error naming a malformed row.
Calibration calibration_from_json(const Json& j, const ModelSpec& m, const std::string& system = "epkit");
// As above, from a file.
Calibration load_calibration(const std::string& path, const ModelSpec& m, const std::string& system = "epkit");

// Measured times for `world_size` ranks and `tokens` tokens per rank: exact, or interpolated between the
// nearest measured token counts at that world size; nullopt outside the measured range.
std::optional<CommLookup> lookup_comm(const Calibration& cal, int world_size, double tokens);

}  // namespace epkit::plan
