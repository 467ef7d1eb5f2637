// MoELayerConfig: validation and the derived sizes (pure C++, in epkit_core, CPU-tested).
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>

#include "epkit/error.hpp"
#include "common/buffer_layout.hpp"
#include "epkit/moe/gate.hpp"
#include "epkit/moe_layer.hpp"
#include "layer/sizes.hpp"

namespace epkit {

const char* schedule_name(MoESchedule s) {
  switch (s) {
    case MoESchedule::kNone: return "none";
    case MoESchedule::kDispatchOverlap: return "dispatch_overlap";
    case MoESchedule::kMicrobatch: return "microbatch";
  }
  return "unknown";
}

MoESchedule parse_schedule(const std::string& n) {
  if (n == "none") return MoESchedule::kNone;
  if (n == "dispatch_overlap") return MoESchedule::kDispatchOverlap;
  if (n == "microbatch") return MoESchedule::kMicrobatch;
  EPKIT_FAIL("unknown schedule '", n, "' (expected none, dispatch_overlap or microbatch)");
}

int num_local_experts(const MoELayerConfig& c) { return c.num_experts / c.world_size; }
int shared_intermediate(const MoELayerConfig& c) { return c.shared_intermediate > 0 ? c.shared_intermediate : c.intermediate; }

moe::RouterConfig router_config(const MoELayerConfig& c) {
  moe::RouterConfig r;
  r.mode = c.router_mode;
  r.num_experts = c.num_experts;
  r.topk = c.topk;
  r.num_groups = c.num_groups;
  r.topk_groups = c.topk_groups;
  r.renormalize = c.renormalize;
  r.routed_scaling = c.routed_scaling;
  return r;
}

bool gate_router_fits(const MoELayerConfig& c, int half_rows) {
  const int rows = std::min(half_rows, moe::kGateRouterMaxTokens);
  return rows >= 1 && moe::gate_router_applies(moe::GateShape{c.hidden, c.num_experts, rows}, router_config(c));
}

int expected_rows_per_expert(const MoELayerConfig& c, int tokens) {
  const int L = num_local_experts(c);
  const double mean =
      static_cast<double>(std::max(tokens, 0)) * c.topk * (c.world_size / c.dp_size) / c.num_experts;
  const double bound = mean + std::sqrt(2.0 * mean * std::log(static_cast<double>(std::max(L, 1))));
  return static_cast<int>(std::max(1.0, std::ceil(bound)));
}

int microbatch_split(const MoELayerConfig& c) {
  return c.schedule == MoESchedule::kMicrobatch ? (c.max_tokens_per_rank + 1) / 2 : c.max_tokens_per_rank;
}

AllToAllConfig all_to_all_config(const MoELayerConfig& c, int half_tokens) {
  AllToAllConfig a;
  a.world_size = c.world_size;
  a.rank = c.rank;
  a.dp_size = c.dp_size;
  a.num_experts = c.num_experts;
  a.topk = c.topk;
  a.hidden = c.hidden;
  a.max_tokens_per_rank = half_tokens;
  a.dispatch_dtype = DType::kFP8E4M3;
  a.combine_in_dtype = DType::kBF16;
  a.combine_out_dtype = DType::kBF16;
  a.layout = c.layout;
  a.timeout_ms = c.timeout_ms;
  // The router's weights exist before dispatch, so they travel in its messages and combine
  // exchanges none: at W >= 2 that takes a round of tagged words between the ranks (each rank's
  // weights to every rank it dispatched to, waited for before the first partial) off combine.
  a.weights_at_dispatch = true;
  return a;
}

void validate(const MoELayerConfig& c) {
  EPKIT_CHECK(c.hidden > 0 && c.hidden % 128 == 0, "MoELayerConfig.hidden = ", c.hidden,
              " must be a positive multiple of 128 (FP8 block scales and the grouped GEMM's K)");
  EPKIT_CHECK(c.intermediate > 0 && c.intermediate % 128 == 0, "MoELayerConfig.intermediate = ", c.intermediate,
              " must be a positive multiple of 128");
  EPKIT_CHECK(c.num_shared_experts == 0 || c.num_shared_experts == 1, "MoELayerConfig.num_shared_experts = ",
              c.num_shared_experts, " must be 0 or 1 (several shared experts are one wider expert: set shared_intermediate)");
  EPKIT_CHECK(c.shared_intermediate >= 0 && c.shared_intermediate % 128 == 0, "MoELayerConfig.shared_intermediate = ",
              c.shared_intermediate, " must be 0 (= intermediate) or a positive multiple of 128");
  EPKIT_CHECK(c.max_tokens_per_rank >= 1, "MoELayerConfig.max_tokens_per_rank = ", c.max_tokens_per_rank, " must be >= 1");
  EPKIT_CHECK(c.schedule != MoESchedule::kMicrobatch || c.max_tokens_per_rank >= 2,
              "MoELayerConfig.max_tokens_per_rank = ", c.max_tokens_per_rank, " must be >= 2 with schedule microbatch");
  EPKIT_CHECK(c.expected_tokens >= 0 && c.expected_tokens <= c.max_tokens_per_rank, "MoELayerConfig.expected_tokens = ",
              c.expected_tokens, " must be in [0, max_tokens_per_rank = ", c.max_tokens_per_rank, "]");
  moe::validate(router_config(c));
  // The dispatch/combine configs of both halves (world size, rank, dp, E % W, K, H, M).
  // Both halves of kMicrobatch use AllToAll objects of the same config (split tokens each).
  validate(all_to_all_config(c, microbatch_split(c)));
}

}  // namespace epkit

namespace epkit {

namespace {

void expect(const Tensor& t, const char* name, DType dt, std::initializer_list<int64_t> dims) {
  std::string want;
  for (int64_t d : dims) want += (want.empty() ? "" : ", ") + std::to_string(d);
  EPKIT_CHECK(t.defined(), "MoELayerWeights.", name, " is missing (", dtype_name(dt), " [", want, "])");
  EPKIT_CHECK(t.dtype == dt, "MoELayerWeights.", name, " is ", dtype_name(t.dtype), " but must be ", dtype_name(dt));
  bool same = t.ndim == static_cast<int>(dims.size());
  int i = 0;
  for (int64_t d : dims) same = same && t.shape[i++] == d;
  EPKIT_CHECK(same, "MoELayerWeights.", name, " has shape ", t.shape_str(), " but must be [", want, "]");
}

int64_t blocks(int64_t n) { return (n + 127) / 128; }

}  // namespace

void check_weights(const MoELayerConfig& c, const MoELayerWeights& w) {
  const int64_t L = num_local_experts(c), H = c.hidden, I = c.intermediate, Is = shared_intermediate(c), E = c.num_experts;
  expect(w.w13, "w13", DType::kFP8E4M3, {L, 2 * I, H});
  expect(w.w13_scale, "w13_scale", DType::kFP32, {L, blocks(2 * I), blocks(H)});
  expect(w.w2, "w2", DType::kFP8E4M3, {L, H, I});
  expect(w.w2_scale, "w2_scale", DType::kFP32, {L, blocks(H), blocks(I)});
  if (c.num_shared_experts > 0) {
    expect(w.shared_w13, "shared_w13", DType::kFP8E4M3, {2 * Is, H});
    expect(w.shared_w13_scale, "shared_w13_scale", DType::kFP32, {blocks(2 * Is), blocks(H)});
    expect(w.shared_w2, "shared_w2", DType::kFP8E4M3, {H, Is});
    expect(w.shared_w2_scale, "shared_w2_scale", DType::kFP32, {blocks(H), blocks(Is)});
  } else {
    EPKIT_CHECK(!w.shared_w13.defined() && !w.shared_w2.defined(),
                "MoELayerWeights: shared expert weights given but num_shared_experts = 0");
  }
  expect(w.gate, "gate", DType::kBF16, {E, H});
  if (c.router_mode == moe::RouterMode::kGroupedTopK) {
    if (w.gate_bias.defined()) expect(w.gate_bias, "gate_bias", DType::kFP32, {E});
  } else {
    EPKIT_CHECK(!w.gate_bias.defined(), "MoELayerWeights.gate_bias is given but the softmax router takes no bias");
  }
}

}  // namespace epkit

namespace epkit {

layer::HalfSizes layer::half_sizes(const MoELayerConfig& c, const AllToAllConfig& a) {
  HalfSizes s;
  const int E = c.num_experts, K = c.topk, H = c.hidden, I = c.intermediate, Is = shared_intermediate(c);
  const int L = num_local_experts(c);
  s.rows = a.max_tokens_per_rank;
  s.xrows = expert_rows(a);
  const size_t R = static_cast<size_t>(s.rows), X = static_cast<size_t>(s.xrows);
  s.parts = {{"logits", R * E * 4},
             {"topk_idx", R * K * 4},
             {"topk_weights", R * K * 4},
             {"m_used", 16},
             {"xq", R * H},
             {"xs", R * (H / 128) * 4},
             {"expert_x", X * H},
             {"expert_x_scale", X * (H / 128) * 4},
             {"expert_num_tokens", static_cast<size_t>(L) * 4},
             {"expert_offsets", static_cast<size_t>(L + 1) * 4},
             {"h", X * 2 * I * 2},
             {"act", X * I},
             {"act_scale", X * (I / 128) * 4},
             {"expert_y", X * H * 2}};
  if (c.num_shared_experts > 0) {
    s.parts.insert(s.parts.end(), {{"shared_h", R * 2 * Is * 2},
                                   {"shared_act", R * Is},
                                   {"shared_act_scale", R * (Is / 128) * 4},
                                   {"shared_y", R * H * 2}});
  }
  return s;
}

size_t layer_workspace_bytes(const MoELayerConfig& c) {
  validate(c);
  const int halves = c.schedule == MoESchedule::kMicrobatch ? 2 : 1;
  size_t total = 0;
  const layer::HalfSizes s = layer::half_sizes(c, all_to_all_config(c, microbatch_split(c)));
  for (const auto& p : s.parts) total += align_up(p.second, 256);
  return total * halves;
}

}  // namespace epkit
