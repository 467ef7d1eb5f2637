// The gate projection of a MoE layer: logits [m, E] fp32 = x [m, H] bf16 . W_g [E, H]^T bf16,
// fp32 accumulation, through cuBLASLt (a small dense GEMM: no kernel of our own).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

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

}  // namespace epkit::moe
