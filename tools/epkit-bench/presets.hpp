// Benchmark presets and their expansion, with the command-line overrides, into one Case per row.
#pragma once

#include <string>
#include <vector>

#include "epkit/config.hpp"
#include "options.hpp"

namespace epkit::bench {

struct Preset {
  std::string name;
  int hidden = 0;
  int num_experts = 0;
  int topk = 0;
  std::vector<int> tokens;  // tokens per rank, one row each
  DType dispatch_dtype = DType::kFP8E4M3;
  DType combine_dtype = DType::kBF16;  // combine_in and combine_out
};

// decode (DeepSeek-V3 shape), decode-v2lite (DeepSeek-V2-Lite shape), prefill.
const std::vector<Preset>& builtin_presets();

// Throws epkit::Error listing the known names when `name` is not one.
const Preset& find_preset(const std::string& name);

// One benchmark row: a full AllToAll config plus what the bench needs to drive it.
struct Case {
  std::string preset;
  int num_tokens = 0;        // m passed to every call (per rank; the same on the D ranks of a group)
  AllToAllConfig cfg;        // max_tokens_per_rank = max(m, --max-tokens)
  RoutingKind routing = RoutingKind::kUniform;
  double zipf_s = 1.0;
  uint64_t seed = 1;
};

// Expands the presets in option order, applying every override; each token count gives one row per
// --layout, in option order. Throws epkit::Error on an unknown
// preset, K > E, or --max-tokens below a row's token count. Library-level limits (E % W, H % 16, ...)
// are left to epkit::validate, which the caller runs on every case before measuring anything.
std::vector<Case> expand_cases(const Options& opt, int world_size, int rank);

}  // namespace epkit::bench
