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

}  // namespace epkit::moe
