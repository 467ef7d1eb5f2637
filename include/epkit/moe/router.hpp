// The MoE router: gate logits [m, E] -> each token's top-K experts and their weights, in the form
// AllToAll::dispatch takes (topk_idx [m, K] int32, topk_weights [m, K] fp32).
//
// Selection is exact and reproducible: candidates are ranked by their score, and among equal
// scores the lower expert index wins (among equal group scores, the lower group index). -0 ranks
// as +0 and NaN ranks below every number. The K chosen experts are written best first.
// The fp32 arithmetic (sigmoid, exp, the sums and quotients below, in the order written) is the
// one of src/moe/moe_math.hpp, which the host reference (epkit::ref::route) shares bit for bit.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "epkit/moe/errors.hpp"
#include "epkit/types.hpp"

namespace epkit::moe {

enum class RouterMode : int32_t {
  // Mixtral / Qwen-MoE: choose the K largest logits l; with e_k = exp(l_k - max_j l_j),
  // w_k = e_k / (e_0 + ... + e_{K-1}) (renormalize, summed best first) or e_k / sum over all E
  // experts of e_j (no renormalisation; that sum's order is unspecified), times routed_scaling.
  kSoftmaxTopK = 0,
  // DeepSeek-V3 noaux_tc: s = sigmoid(l), s' = s + bias; a group's score is the sum of its two
  // largest s' (its only s' for a one-expert group); keep the topk_groups best groups; choose the K
  // largest s' among their experts; w_k = s_k / (s_0 + ... + s_{K-1}) * routed_scaling (unbiased s,
  // summed best first).
  kGroupedTopK = 1,
};
const char* router_mode_name(RouterMode m);  // "softmax_topk" / "grouped_topk"

constexpr int kMaxRouterExperts = 512;

// The kernels behind route(). kGeneral runs every valid configuration: one warp per token, the
// groups scored and ranked through shared memory. kWarpGrouped is the grouped-mode kernel for
// E = 32 V experts (V = 2, 4, 8 or 16 per lane) whose groups are whole sets of lanes (num_groups a
// power of two, at most 32; DeepSeek-V3: E 256, 8 groups): one warp per token, every score, group
// score and group rank in registers and exchanged by shuffles, no shared memory, no barrier.
// Both give the same bits (the semantics above).
enum class RouterKernel : int32_t {
  kAuto = 0,         // choose_router_kernel()
  kGeneral = 1,
  kWarpGrouped = 2,
};
const char* router_kernel_name(RouterKernel k);  // "auto" / "general" / "warp_grouped"

struct RouterConfig {
  RouterMode mode = RouterMode::kGroupedTopK;
  int num_experts = 0;          // E: 1..512
  int topk = 0;                 // K: 1..16, <= E, and <= topk_groups * E / num_groups
  int num_groups = 1;           // n_group (grouped mode; 1 in softmax mode): divides E
  int topk_groups = 1;          // groups kept (grouped mode): 1..num_groups; 1 in softmax mode
  bool renormalize = true;      // softmax mode: divide by the sum of the K weights; grouped mode: must be true
  float routed_scaling = 1.0f;  // every weight times this (DeepSeek-V3: 2.5); finite, > 0
  // Forces one kernel (the benchmark's same-run comparison of the two); kAuto lets route() choose.
  // A forced kernel that cannot run the call is an error.
  RouterKernel kernel = RouterKernel::kAuto;
};

// Throws epkit::Error naming the field and its limit.
void validate(const RouterConfig& cfg);

// One route() call. Rows t >= m of the outputs are left untouched.
struct RouterArgs {
  Tensor logits;        // [rows >= m, E] bf16 or fp32
  Tensor bias;          // [E] fp32: grouped mode's correction bias; absent = 0 (must be absent in softmax mode)
  int num_tokens = -1;  // m on the host (0 <= m <= rows), or -1 with num_tokens_device
  const int32_t* num_tokens_device = nullptr;  // one device int32 holding m (one graph serves any m)
  int32_t* num_tokens_out = nullptr;  // optional: one device int32 the m this call used is written to
                                      // (after clamping), so that later kernels read m from the device
  Tensor topk_idx;      // [rows, K] int32 (output): expert indices, best first
  Tensor topk_weights;  // [rows, K] fp32 (output)
  DeviceErrorRecord* error = nullptr;  // a device m outside [0, rows] is clamped and recorded here
};

// The one validation of a route() call (config, dtypes, shapes, alignment, m); throws epkit::Error.
void check_router_args(const RouterConfig& cfg, const RouterArgs& a);

// Whether kWarpGrouped can run this call; if not and `why` is given, the reason. Needs grouped
// mode, E in {64, 128, 256, 512}, num_groups a power of two with E / num_groups >= E / 32 (a
// group is whole lanes), and logits 16-byte aligned.
bool warp_router_applies(const RouterConfig& cfg, const RouterArgs& a, const char** why = nullptr);

// The kernel route() launches for this call: cfg.kernel if forced, else kWarpGrouped where it
// applies (about half the time of kGeneral on an H100: docs/perf/grouped-gemm.md, "The router's warp
// kernel"), else kGeneral. Host-only, no launch.
RouterKernel choose_router_kernel(const RouterConfig& cfg, const RouterArgs& a);

// Validates, then launches on `stream`: no host synchronisation or allocation (capturable).
// rows = the smallest first dimension of logits, topk_idx and topk_weights.
void route(const RouterConfig& cfg, const RouterArgs& a, cudaStream_t stream);

}  // namespace epkit::moe
