// FP8 (e4m3) block quantization: activations with one fp32 scale per 1x128 block (what
// AllToAll::dispatch takes as x + x_scale), weights with one per 128x128 tile (the DeepSeek-V3
// checkpoint layout: weight [N, K] e4m3 + weight_scale_inv [ceil(N/128), ceil(K/128)] fp32).
//
// Per block: amax = the largest |x| (NaN if the block holds a NaN), scale = max(amax, 1e-10) / 448
// (or, with ue8m0, the smallest power of two >= that, exactly), q = e4m3_satfinite_rn(x * (1/scale))
// with the reciprocal rounded once per block; dequantisation is q * scale. Partial edge blocks and
// tiles take their amax over the elements that exist. Host reference: epkit/moe/reference.hpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "epkit/moe/errors.hpp"
#include "epkit/types.hpp"

namespace epkit::moe {

// Scale blocks per row of H elements: ceil(H / 128).
inline int64_t num_scale_blocks(int64_t h) { return (h + kScaleBlock - 1) / kScaleBlock; }

struct ActQuantArgs {
  Tensor x;      // [rows >= m, H] bf16, H % 16 == 0, 16-byte aligned
  Tensor out;    // [rows, H] fp8_e4m3 (output), 16-byte aligned
  Tensor scale;  // [rows, ceil(H/128)] fp32 (output): the dequantisation scale of each block
  bool ue8m0 = false;   // power-of-two scales
  int num_tokens = -1;  // m on the host (0 <= m <= rows), or -1 with num_tokens_device
  const int32_t* num_tokens_device = nullptr;  // one device int32 holding m
  DeviceErrorRecord* error = nullptr;  // a device m outside [0, rows] is clamped and recorded here
};
// The one validation of a quantize_activations call; throws epkit::Error.
void check_act_quant_args(const ActQuantArgs& a);
// Validates, then launches on `stream` (capturable). rows = the smallest first dimension of the
// three tensors; rows >= m of the outputs are left untouched.
void quantize_activations(const ActQuantArgs& a, cudaStream_t stream);

struct WeightQuantArgs {
  Tensor w;          // [G, N, K] or [N, K] bf16
  Tensor out;        // the same shape, fp8_e4m3 (output)
  Tensor scale_inv;  // [G, ceil(N/128), ceil(K/128)] or [ceil(N/128), ceil(K/128)] fp32 (output):
                     // the dequantisation scale of each 128x128 tile (dequant = q * scale_inv)
  bool ue8m0 = false;  // power-of-two scales
};
// The one validation of a quantize_weights call; throws epkit::Error.
void check_weight_quant_args(const WeightQuantArgs& a);
// Validates, then launches on `stream`.
void quantize_weights(const WeightQuantArgs& a, cudaStream_t stream);

}  // namespace epkit::moe
