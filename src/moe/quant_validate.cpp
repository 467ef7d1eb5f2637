// Validation of the FP8 block quantizers (epkit/moe/quant.hpp): pure C++, tested on the CPU.
#include "epkit/error.hpp"
#include "epkit/moe/quant.hpp"
#include "moe/args_check.hpp"

namespace epkit::moe {

void check_act_quant_args(const ActQuantArgs& a) {
  constexpr const char* call = "quantize_activations";
  EPKIT_CHECK(a.x.ndim == 2, call, ": x has shape ", a.x.shape_str(), ", expected [rows, H]");
  const int64_t H = a.x.shape[1];
  EPKIT_CHECK(H > 0 && H % 16 == 0, call, ": H = ", H, " must be a positive multiple of 16 (16-byte vectors)");
  EPKIT_CHECK(H <= (int64_t{1} << 24), call, ": H = ", H, " exceeds the limit ", int64_t{1} << 24);
  int64_t rows = detail::check_tensor(call, a.x, "x", {DType::kBF16}, {-1, H}, 16);
  const int64_t ro = detail::check_tensor(call, a.out, "out", {DType::kFP8E4M3}, {-1, H}, 16);
  const int64_t rs = detail::check_tensor(call, a.scale, "scale", {DType::kFP32}, {-1, num_scale_blocks(H)});
  rows = ro < rows ? ro : rows;
  rows = rs < rows ? rs : rows;
  EPKIT_CHECK(rows <= INT32_MAX, call, ": ", rows, " rows exceed the int32 row index");
  detail::check_token_count(call, a.num_tokens, a.num_tokens_device, rows);
}

void check_weight_quant_args(const WeightQuantArgs& a) {
  constexpr const char* call = "quantize_weights";
  EPKIT_CHECK(a.w.ndim == 2 || a.w.ndim == 3, call, ": w has shape ", a.w.shape_str(), ", expected [N, K] or [G, N, K]");
  const bool batched = a.w.ndim == 3;
  const int64_t G = batched ? a.w.shape[0] : 1, N = a.w.shape[a.w.ndim - 2], K = a.w.shape[a.w.ndim - 1];
  EPKIT_CHECK(G >= 0 && N >= 0 && K >= 0, call, ": w has shape ", a.w.shape_str(), " with a negative dim");
  const int64_t nt = num_scale_blocks(N), kt = num_scale_blocks(K);
  EPKIT_CHECK(G * nt * kt <= INT32_MAX, call, ": w has ", G * nt * kt, " 128x128 tiles, more than the limit ", INT32_MAX);
  if (batched) {
    detail::check_tensor(call, a.w, "w", {DType::kBF16}, {G, N, K});
    detail::check_tensor(call, a.out, "out", {DType::kFP8E4M3}, {G, N, K});
    detail::check_tensor(call, a.scale_inv, "scale_inv", {DType::kFP32}, {G, nt, kt});
  } else {
    detail::check_tensor(call, a.w, "w", {DType::kBF16}, {N, K});
    detail::check_tensor(call, a.out, "out", {DType::kFP8E4M3}, {N, K});
    detail::check_tensor(call, a.scale_inv, "scale_inv", {DType::kFP32}, {nt, kt});
  }
}

}  // namespace epkit::moe
