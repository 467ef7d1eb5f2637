// The gate projection of a MoE layer: logits [m, E] fp32 = x [m, H] bf16 . W_g [E, H]^T bf16,
// fp32 accumulation, through cuBLASLt (a small dense GEMM: no kernel of our own).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "epkit/moe/router.hpp"
#include "epkit/types.hpp"

namespace epkit::moe {

// The problem a GateProjection is built for.
struct GateShape {
  int hidden = 0;       // H: > 0, a multiple of 8 (16-byte rows for cuBLASLt)
  int num_experts = 0;  // E: 1..512
  int max_tokens = 0;   // the largest m a run may take: >= 1
};
// Throws epkit::Error naming the field and its limit.
void validate(const GateShape& s);

// The one validation of a GateProjection::run call: x bf16 [rows >= m, H], w bf16 [E, H],
// logits fp32 [rows >= m, E], all 16-byte aligned, 0 <= m <= max_tokens.
void check_gate_args(const GateShape& s, const Tensor& x, const Tensor& w, const Tensor& logits, int m);

// Owns the cuBLASLt handle, its workspace and the matmul descriptors, all created once.
// Not thread-safe: one run at a time per object.
class GateProjection {
 public:
  GateProjection(int hidden, int num_experts, int max_tokens);
  ~GateProjection();
  GateProjection(const GateProjection&) = delete;
  GateProjection& operator=(const GateProjection&) = delete;

  const GateShape& shape() const;

  // logits[0:m] = x[0:m] . w^T on `stream`; m = 0 launches nothing. No device allocation and no
  // host synchronisation (capturable). The first run at each m asks cuBLASLt's heuristic for an
  // algorithm (host work, cached); later runs at that m reuse it.
  void run(const Tensor& x, const Tensor& w, const Tensor& logits, int m, cudaStream_t stream);

  size_t workspace_bytes() const;  // device workspace owned by this object

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- The gate projection and the grouped router in one kernel, for decode batches ----------------
//
// For m <= kGateRouterMaxTokens tokens: logits = x . W_g^T, then route() on those logits, in one
// launch. Each block multiplies a 16-expert x 512-column slice of W_g with the rows of x on the
// tensor cores (the bf16 products are exact in fp32; fp32 sums); the last blocks to finish add the
// hidden / 512 slices' partial sums in a fixed order and route their tokens from those logits with
// the warp router's code (RouterKernel::kWarpGrouped), without a second launch. The logits are
// written out too (MoELayer::routing shows them).
//
// Numerics: the routing is the router's, bit for bit, on the logits this kernel writes. The logits
// are deterministic (one summation order) but not cuBLASLt's bits: each is within the gate's bound,
// H 2^-24 sum_k |x_k w_k| of the exact dot product (tests/moe/test_gate.cpp checks both against
// fp64); its sums are about 30 roundings deep (8 mma steps, 4 warps, H / 512 slices), far inside it.
constexpr int kGateRouterMaxTokens = 32;
constexpr int kGateRouterSlice = 512;  // columns of H per block (4 warps x 4 steps of 32)

// Whether a GateRouter can be built for this shape and router; if not and `why` is given, the
// reason: grouped_topk with the warp router's expert layout (router.hpp, warp_router_applies) and
// E in {128, 256, 512}, hidden a multiple of 512, max_tokens <= 32.
bool gate_router_applies(const GateShape& s, const RouterConfig& router, const char** why = nullptr);

// The one validation of a GateRouter::run call: the router call's checks (check_router_args, with
// a.logits the fp32 logits the kernel writes, 16-byte aligned) plus x bf16 [rows >= m, H] and
// w bf16 [E, H], 16-byte aligned; with m on the host m <= max_tokens, with m on the device the
// rows the kernel may route (the smallest of x's and the router outputs') <= max_tokens.
void check_gate_router_args(const GateShape& s, const RouterConfig& router, const Tensor& x, const Tensor& w,
                            const RouterArgs& a);

// Owns the partial sums (hidden / 512 x 32 x E fp32) and an arrival counter, made once.
// One run at a time per object (the counter orders one launch's blocks).
class GateRouter {
 public:
  // Throws epkit::Error unless gate_router_applies(). router.kernel is not used (always the warp code).
  GateRouter(int hidden, const RouterConfig& router, int max_tokens);
  ~GateRouter();
  GateRouter(const GateRouter&) = delete;
  GateRouter& operator=(const GateRouter&) = delete;

  const GateShape& shape() const;
  const RouterConfig& router() const;

  // a.logits[0:m] = x[0:m] . w^T (written), then the routing of tokens [0, m) as route(router, a)
  // gives it from those logits: a.bias, a.num_tokens / num_tokens_device, num_tokens_out,
  // topk_idx, topk_weights and error mean what they mean there. No allocation, no host
  // synchronisation (capturable); m = 0 on the host launches nothing.
  void run(const Tensor& x, const Tensor& w, const RouterArgs& a, cudaStream_t stream);

  size_t workspace_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace epkit::moe
