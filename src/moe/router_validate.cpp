// Validation of the router (epkit/moe/router.hpp): pure C++, tested on the CPU.
#include <cmath>
#include <cstdint>

#include "epkit/error.hpp"
#include "epkit/moe/router.hpp"
#include "moe/args_check.hpp"

namespace epkit::moe {

const char* router_kernel_name(RouterKernel k) {
  switch (k) {
    case RouterKernel::kAuto: return "auto";
    case RouterKernel::kGeneral: return "general";
    case RouterKernel::kWarpGrouped: return "warp_grouped";
  }
  return "unknown";
}

const char* router_mode_name(RouterMode m) {
  switch (m) {
    case RouterMode::kSoftmaxTopK: return "softmax_topk";
    case RouterMode::kGroupedTopK: return "grouped_topk";
  }
  return "unknown";
}

void validate(const RouterConfig& c) {
  EPKIT_CHECK(c.mode == RouterMode::kSoftmaxTopK || c.mode == RouterMode::kGroupedTopK,
              "RouterConfig: mode = ", static_cast<int>(c.mode), " is not a RouterMode");
  EPKIT_CHECK(c.kernel == RouterKernel::kAuto || c.kernel == RouterKernel::kGeneral ||
                  c.kernel == RouterKernel::kWarpGrouped,
              "RouterConfig: kernel = ", static_cast<int>(c.kernel), " is not a RouterKernel");
  const int E = c.num_experts;
  EPKIT_CHECK(E >= 1 && E <= kMaxRouterExperts, "RouterConfig: num_experts = ", E, " must be in [1, ",
              kMaxRouterExperts, "]");
  EPKIT_CHECK(c.topk >= 1 && c.topk <= kMaxTopK, "RouterConfig: topk = ", c.topk, " must be in [1, ", kMaxTopK, "]");
  EPKIT_CHECK(c.topk <= E, "RouterConfig: topk = ", c.topk, " exceeds num_experts = ", E);
  EPKIT_CHECK(std::isfinite(c.routed_scaling) && c.routed_scaling > 0.0f, "RouterConfig: routed_scaling = ",
              c.routed_scaling, " must be finite and > 0");
  if (c.mode == RouterMode::kSoftmaxTopK) {
    EPKIT_CHECK(c.num_groups == 1 && c.topk_groups == 1, "RouterConfig: softmax_topk has no expert groups (num_groups = ",
                c.num_groups, ", topk_groups = ", c.topk_groups, "; both must be 1)");
    return;
  }
  EPKIT_CHECK(c.num_groups >= 1 && c.num_groups <= E, "RouterConfig: num_groups = ", c.num_groups,
              " must be in [1, num_experts = ", E, "]");
  EPKIT_CHECK(E % c.num_groups == 0, "RouterConfig: num_groups = ", c.num_groups, " does not divide num_experts = ", E);
  EPKIT_CHECK(c.topk_groups >= 1 && c.topk_groups <= c.num_groups, "RouterConfig: topk_groups = ", c.topk_groups,
              " must be in [1, num_groups = ", c.num_groups, "]");
  const int candidates = c.topk_groups * (E / c.num_groups);
  EPKIT_CHECK(c.topk <= candidates, "RouterConfig: topk = ", c.topk, " exceeds the ", candidates,
              " experts of the topk_groups = ", c.topk_groups, " kept groups (", E / c.num_groups, " experts each)");
  EPKIT_CHECK(c.renormalize, "RouterConfig: grouped_topk always renormalises its weights; renormalize = false is "
              "not supported");
}

void check_router_args(const RouterConfig& c, const RouterArgs& a) {
  validate(c);
  constexpr const char* call = "route";
  const int E = c.num_experts, K = c.topk;
  int64_t rows = detail::check_tensor(call, a.logits, "logits", {DType::kBF16, DType::kFP32}, {-1, E});
  if (c.mode == RouterMode::kGroupedTopK) {
    if (detail::given(a.bias)) detail::check_tensor(call, a.bias, "bias", {DType::kFP32}, {E});
  } else {
    detail::check_absent(call, a.bias, "bias", "softmax_topk takes no correction bias");
  }
  const int64_t ri = detail::check_tensor(call, a.topk_idx, "topk_idx", {DType::kInt32}, {-1, K});
  const int64_t rw = detail::check_tensor(call, a.topk_weights, "topk_weights", {DType::kFP32}, {-1, K});
  rows = ri < rows ? ri : rows;
  rows = rw < rows ? rw : rows;
  EPKIT_CHECK(rows <= INT32_MAX, call, ": ", rows, " rows exceed the int32 row index");
  detail::check_token_count(call, a.num_tokens, a.num_tokens_device, rows);
  EPKIT_CHECK(reinterpret_cast<uintptr_t>(a.num_tokens_out) % alignof(int32_t) == 0, call,
              ": num_tokens_out is not 4-byte aligned");
  const char* why = nullptr;
  EPKIT_CHECK(c.kernel != RouterKernel::kWarpGrouped || warp_router_applies(c, a, &why), call,
              ": RouterConfig::kernel = warp_grouped cannot run this call: ", why);
}

namespace detail {

bool warp_router_config_applies(const RouterConfig& c, const char** why) {
  auto no = [&](const char* reason) {
    if (why) *why = reason;
    return false;
  };
  if (c.mode != RouterMode::kGroupedTopK) return no("it runs grouped_topk only");
  const int E = c.num_experts;
  if (E != 64 && E != 128 && E != 256 && E != 512) return no("num_experts must be 64, 128, 256 or 512 (32 lanes x 2-16)");
  const int G = c.num_groups;
  const bool use_groups = c.topk_groups < G;
  if (use_groups && (G > 32 || (G & (G - 1)) != 0))
    return no("num_groups must be a power of two <= 32 (each group whole lanes) when groups are dropped");
  if (why) *why = nullptr;
  return true;
}

}  // namespace detail

bool warp_router_applies(const RouterConfig& c, const RouterArgs& a, const char** why) {
  if (!detail::warp_router_config_applies(c, why)) return false;
  if (reinterpret_cast<uintptr_t>(a.logits.data) % 16 != 0) {
    if (why) *why = "logits must be 16-byte aligned";
    return false;
  }
  return true;
}

RouterKernel choose_router_kernel(const RouterConfig& c, const RouterArgs& a) {
  if (c.kernel != RouterKernel::kAuto) return c.kernel;
  return warp_router_applies(c, a) ? RouterKernel::kWarpGrouped : RouterKernel::kGeneral;
}

}  // namespace epkit::moe
