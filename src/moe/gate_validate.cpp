// Validation of the gate projection (epkit/moe/gate.hpp): pure C++, tested on the CPU.
#include "epkit/error.hpp"
#include "epkit/moe/gate.hpp"
#include "epkit/moe/router.hpp"
#include "moe/args_check.hpp"

namespace epkit::moe {

void validate(const GateShape& s) {
  EPKIT_CHECK(s.hidden > 0 && s.hidden % 8 == 0, "GateShape: hidden = ", s.hidden,
              " must be a positive multiple of 8 (16-byte bf16 rows)");
  EPKIT_CHECK(s.num_experts >= 1 && s.num_experts <= kMaxRouterExperts, "GateShape: num_experts = ", s.num_experts,
              " must be in [1, ", kMaxRouterExperts, "]");
  EPKIT_CHECK(s.max_tokens >= 1, "GateShape: max_tokens = ", s.max_tokens, " must be >= 1");
}

void check_gate_args(const GateShape& s, const Tensor& x, const Tensor& w, const Tensor& logits, int m) {
  validate(s);
  constexpr const char* call = "GateProjection::run";
  const int H = s.hidden, E = s.num_experts;
  EPKIT_CHECK(m >= 0 && m <= s.max_tokens, call, ": m = ", m, " must be in [0, max_tokens = ", s.max_tokens, "]");
  const int64_t rx = detail::check_tensor(call, x, "x", {DType::kBF16}, {-1, H}, 16);
  detail::check_tensor(call, w, "w", {DType::kBF16}, {E, H}, 16);
  const int64_t rl = detail::check_tensor(call, logits, "logits", {DType::kFP32}, {-1, E}, 16);
  EPKIT_CHECK(m <= rx, call, ": m = ", m, " exceeds the rows of x = ", rx);
  EPKIT_CHECK(m <= rl, call, ": m = ", m, " exceeds the rows of logits = ", rl);
}

bool gate_router_applies(const GateShape& s, const RouterConfig& r, const char** why) {
  auto no = [&](const char* reason) {
    if (why) *why = reason;
    return false;
  };
  if (!detail::warp_router_config_applies(r, why)) return false;
  if (s.num_experts != r.num_experts) return no("the gate's num_experts differs from the router's");
  if (r.num_experts < 128) return no("num_experts must be 128, 256 or 512 (4-16 logits per lane, float4 sums)");
  if (s.hidden <= 0 || s.hidden % kGateRouterSlice != 0) return no("hidden must be a multiple of 512");
  if (s.max_tokens < 1 || s.max_tokens > kGateRouterMaxTokens) return no("max_tokens must be in [1, 32]");
  if (why) *why = nullptr;
  return true;
}

void check_gate_router_args(const GateShape& s, const RouterConfig& r, const Tensor& x, const Tensor& w,
                            const RouterArgs& a) {
  validate(s);
  validate(r);
  constexpr const char* call = "GateRouter::run";
  const char* why = nullptr;
  EPKIT_CHECK(gate_router_applies(s, r, &why), call, ": ", why);
  check_router_args(r, a);
  const int H = s.hidden, E = s.num_experts;
  const int64_t rx = detail::check_tensor(call, x, "x", {DType::kBF16}, {-1, H}, 16);
  detail::check_tensor(call, w, "w", {DType::kBF16}, {E, H}, 16);
  detail::check_tensor(call, a.logits, "logits", {DType::kFP32}, {-1, E}, 16);
  int64_t rows = a.logits.shape[0];
  rows = a.topk_idx.shape[0] < rows ? a.topk_idx.shape[0] : rows;
  rows = a.topk_weights.shape[0] < rows ? a.topk_weights.shape[0] : rows;
  if (a.num_tokens_device == nullptr) {
    EPKIT_CHECK(a.num_tokens <= s.max_tokens, call, ": m = ", a.num_tokens, " exceeds max_tokens = ", s.max_tokens);
    EPKIT_CHECK(a.num_tokens <= rx, call, ": m = ", a.num_tokens, " exceeds the rows of x = ", rx);
  } else {
    rows = rx < rows ? rx : rows;
    EPKIT_CHECK(rows <= s.max_tokens, call, ": with m on the device, the ", rows,
                " rows of x and the router outputs exceed max_tokens = ", s.max_tokens,
                " (pass tensors of at most max_tokens rows)");
  }
}

}  // namespace epkit::moe
