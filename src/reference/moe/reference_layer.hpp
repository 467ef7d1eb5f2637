// Host reference of one MoE layer (epkit::MoELayer): the oracle of its GPU tests. Pure C++.
// It follows the device's math and roundings step by step (activation quantization, fp32 GEMMs of
// the dequantised operands rounded to bf16, SiLU*mul + quantization, bf16 expert outputs, the
// router-weighted sum rounded to bf16, then + the shared expert), so that the remaining differences
// are accumulation order inside the GEMMs.
#pragma once

#include <cstdint>
#include <vector>

namespace epkit::ref {

// One SwiGLU expert in the checkpoint's FP8 layout (host copies): w13 [2I, H] + scale_inv
// [2I/128, H/128], w2 [H, I] + scale_inv [H/128, I/128].
struct Fp8Expert {
  const uint8_t* w13 = nullptr;
  const float* w13_scale = nullptr;
  const uint8_t* w2 = nullptr;
  const float* w2_scale = nullptr;
};

struct LayerReferenceShape {
  int hidden = 0;        // H, multiple of 128
  int intermediate = 0;  // I of a routed expert
  int shared_intermediate = 0;  // Is (0: no shared expert)
  int topk = 0;
  bool ue8m0 = false;
};

// out[t] for m tokens (x: [m, H] bf16 bits), given their routing (topk_idx [m, K] global expert ids,
// negative = none, topk_weights [m, K]); experts[e] is expert e's weights, `shared` the shared
// expert's (ignored when shape.shared_intermediate == 0). Writes out [m, H] as the bf16 values the
// layer produces (as floats) and out_abs [m, H] = the same sums over |terms| (the scale tolerances
// are stated against).
void moe_layer(const LayerReferenceShape& shape, int m, const uint16_t* x, const int32_t* topk_idx,
               const float* topk_weights, const std::vector<Fp8Expert>& experts, const Fp8Expert& shared,
               float* out, float* out_abs);

// One expert applied to one dequantised activation row (xq, xs: the row's e4m3 codes and 1x128
// scales): y [H] = bf16(W2 . act) with act = quant(silu(bf16(W1 x)) * bf16(W3 x)); exposed for tests.
void expert_forward(const LayerReferenceShape& shape, int inter, const uint8_t* xq, const float* xs,
                    const Fp8Expert& e, float* y);

}  // namespace epkit::ref
