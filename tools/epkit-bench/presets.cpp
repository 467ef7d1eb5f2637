#include "presets.hpp"

#include <algorithm>

#include "epkit/error.hpp"

namespace epkit::bench {

const std::vector<Preset>& builtin_presets() {
  // Decode batch sizes per rank span one token to the batch-128 point of the published anchors.
  static const std::vector<int> kDecodeTokens = {1, 4, 8, 16, 32, 64, 128};
  static const std::vector<Preset> presets = {
      {"decode", 7168, 256, 8, kDecodeTokens, DType::kFP8E4M3, DType::kBF16},
      {"decode-v2lite", 2048, 64, 6, kDecodeTokens, DType::kFP8E4M3, DType::kBF16},
      {"prefill", 7168, 256, 8, {4096}, DType::kFP8E4M3, DType::kBF16},
  };
  return presets;
}

const Preset& find_preset(const std::string& name) {
  std::string known;
  for (const Preset& p : builtin_presets()) {
    if (p.name == name) return p;
    known += (known.empty() ? "" : ", ") + p.name;
  }
  EPKIT_FAIL("--preset: unknown preset '", name, "' (known: ", known, ")");
}

std::vector<Case> expand_cases(const Options& opt, int world_size, int rank) {
  std::vector<Case> cases;
  for (const std::string& name : opt.presets) {
    const Preset& p = find_preset(name);
    const std::vector<int>& tokens = opt.tokens ? *opt.tokens : p.tokens;
    for (int m : tokens) {
      for (ExpertLayout layout : opt.layouts) {
        Case c;
        c.preset = p.name;
        c.num_tokens = m;
        c.routing = opt.routing;
        c.zipf_s = opt.zipf_s;
        c.seed = opt.seed;
        AllToAllConfig& cfg = c.cfg;
        cfg.world_size = world_size;
        cfg.rank = rank;
        cfg.dp_size = opt.dp_size;
        cfg.hidden = opt.hidden.value_or(p.hidden);
        cfg.num_experts = opt.experts.value_or(p.num_experts);
        cfg.topk = opt.topk.value_or(p.topk);
        cfg.dispatch_dtype = opt.dispatch_dtype.value_or(p.dispatch_dtype);
        cfg.combine_in_dtype = opt.combine_dtype.value_or(p.combine_dtype);
        cfg.combine_out_dtype = cfg.combine_in_dtype;
        EPKIT_CHECK(opt.max_tokens == 0 || opt.max_tokens >= m, "--max-tokens ", opt.max_tokens,
                    " is below the row's token count ", m, " (preset ", p.name, ")");
        cfg.max_tokens_per_rank = std::max(m, opt.max_tokens);
        cfg.capacity = opt.capacity;
        cfg.layout = layout;
        cfg.path = opt.portable ? DataPath::kPortable : DataPath::kAuto;
        cfg.weights_at_dispatch = opt.weights_at_dispatch;
        cfg.num_sms = opt.num_sms;
        EPKIT_CHECK(cfg.topk <= cfg.num_experts, "--topk ", cfg.topk,
                    " exceeds the number of experts ", cfg.num_experts, " (preset ", p.name,
                    "): a token cannot pick distinct experts");
        cases.push_back(c);
      }
    }
  }
  return cases;
}

}  // namespace epkit::bench
