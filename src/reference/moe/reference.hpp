// Host references of the MoE expert-compute kernels: the oracles the GPU tests compare against.
// Pure C++ (no CUDA), over host arrays. bf16 values are passed as their raw uint16_t bits, fp8
// e4m3 as uint8_t. They share the fp32 arithmetic of the kernels (src/moe/moe_math.hpp), so
// indices, bytes and scales match exactly; see each kernel's header for the semantics.
#pragma once

#include <cstdint>

#include "epkit/moe/router.hpp"

namespace epkit::ref {

// route() for m tokens: logits [m, E] as fp32 values (bf16 logits widened exactly), bias [E] or
// nullptr, outputs topk_idx / topk_weights [m, K]. cfg must pass moe::validate.
void route(const moe::RouterConfig& cfg, int m, const float* logits, const float* bias, int32_t* topk_idx,
           float* topk_weights);

// The scale of one quantization block from its amax (moe/quant.hpp), and the e4m3 code of x in
// a block of that scale.
float block_scale(float amax, bool ue8m0);
uint8_t quantize_value(float x, float scale);

// quantize_activations() for m rows of H: x [m, H] bf16 bits -> q [m, H], scale [m, ceil(H/128)].
void quantize_activations(int m, int h, const uint16_t* x, bool ue8m0, uint8_t* q, float* scale);

// quantize_weights() for one [N, K] matrix: q [N, K], scale_inv [ceil(N/128), ceil(K/128)].
void quantize_weights(int n, int k, const uint16_t* w, bool ue8m0, uint8_t* q, float* scale_inv);

// silu_mul_quantize() for one row: in [2I] bf16 bits (gate, then up) -> q [I], scale [I/128].
void silu_mul_quantize_row(int i, const uint16_t* in, bool ue8m0, uint8_t* q, float* scale);

}  // namespace epkit::ref
