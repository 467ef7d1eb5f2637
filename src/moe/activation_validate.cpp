// Validation of the fused SiLU-mul + FP8 quantization (epkit/moe/activation.hpp): pure C++,
// tested on the CPU.
#include "epkit/error.hpp"
#include "epkit/moe/activation.hpp"
#include "moe/args_check.hpp"

namespace epkit::moe {

void check_silu_mul_quant_args(const SiluMulQuantArgs& a) {
  constexpr const char* call = "silu_mul_quantize";
  const bool packed = a.layout == ExpertLayout::kPacked;
  EPKIT_CHECK(packed || a.layout == ExpertLayout::kMasked, call, ": layout = ", static_cast<int>(a.layout),
              " is not an ExpertLayout");
  const int nd = packed ? 2 : 3;
  EPKIT_CHECK(a.in.ndim == nd, call, ": in has shape ", a.in.shape_str(), ", expected ",
              packed ? "[R, 2I] (packed)" : "[L, cap, 2I] (masked)");
  const int64_t two_i = a.in.shape[nd - 1];
  EPKIT_CHECK(two_i > 0 && two_i % (2 * kScaleBlock) == 0, call, ": in's last dim 2I = ", two_i,
              " must be a positive multiple of 256 (I a multiple of 128)");
  const int64_t I = two_i / 2, nb = I / kScaleBlock;
  EPKIT_CHECK(I <= (int64_t{1} << 20), call, ": I = ", I, " exceeds the limit ", int64_t{1} << 20);

  int64_t L = 0, rows = 0;
  if (packed) {
    const int64_t R = detail::check_tensor(call, a.in, "in", {DType::kBF16}, {-1, two_i}, 16);
    detail::check_tensor(call, a.out, "out", {DType::kFP8E4M3}, {R, I}, 16);
    detail::check_tensor(call, a.scale, "scale", {DType::kFP32}, {R, nb});
    EPKIT_CHECK(a.expert_num_tokens.ndim == 1, call, ": expert_num_tokens has shape ",
                a.expert_num_tokens.shape_str(), ", expected [L]");
    L = a.expert_num_tokens.shape[0];
    detail::check_tensor(call, a.expert_num_tokens, "expert_num_tokens", {DType::kInt32}, {L});
    EPKIT_CHECK(detail::given(a.expert_offsets), call, ": expert_offsets [L + 1] is required by the packed layout");
    detail::check_tensor(call, a.expert_offsets, "expert_offsets", {DType::kInt32}, {L + 1});
    rows = R;
  } else {
    L = detail::check_tensor(call, a.in, "in", {DType::kBF16}, {-1, -1, two_i}, 16);
    const int64_t cap = a.in.shape[1];
    detail::check_tensor(call, a.out, "out", {DType::kFP8E4M3}, {L, cap, I}, 16);
    detail::check_tensor(call, a.scale, "scale", {DType::kFP32}, {L, cap, nb});
    detail::check_tensor(call, a.expert_num_tokens, "expert_num_tokens", {DType::kInt32}, {L});
    detail::check_absent(call, a.expert_offsets, "expert_offsets", "the masked layout has no offsets");
    rows = L * cap;
  }
  EPKIT_CHECK(L >= 1 && L <= kMaxLocalExperts, call, ": L = ", L, " local experts, must be in [1, ",
              kMaxLocalExperts, "]");
  EPKIT_CHECK(rows <= INT32_MAX, call, ": ", rows, " rows exceed the int32 row index");
}

}  // namespace epkit::moe
