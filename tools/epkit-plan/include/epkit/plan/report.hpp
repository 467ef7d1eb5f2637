// Text, CSV and JSON forms of planner results.
#pragma once

#include <string>
#include <vector>

#include "epkit/plan/estimate.hpp"
#include "epkit/plan/json.hpp"

namespace epkit::plan {

// One point as JSON: the explain fields (kv_bytes_per_token, weights_bytes_per_gpu, max_batch_per_gpu,
// tokens_per_expert, layer_time_us, output_tokens_per_s_per_request, throughput_tokens_per_s_per_node, fits, ...).
Json to_json(const PlanPoint& p);
// Human-readable per-layer breakdown of one point.
std::string explain_text(const PlanPoint& p);
// The header and one row per point of the CSV form.
std::string csv(const std::vector<PlanPoint>& points, const std::vector<size_t>& rows);
// The Pareto table: one block per EP, frontier points only.
std::string pareto_table(const std::vector<PlanPoint>& points, const std::vector<int>& eps);

}  // namespace epkit::plan
