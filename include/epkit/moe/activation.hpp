// SiLU-and-mul fused with FP8 1x128 block quantization: the step between the up/gate and the
// down grouped GEMMs. Per real row: h = silu(g) * u in fp32, with g = in[..., 0:I] (the gate, w1)
// and u = in[..., I:2I] (the up projection, w3), the order of DeepSeek's concatenated w13; then
// each 1x128 block of h is quantised as in epkit/moe/quant.hpp. The arithmetic is that of
// src/moe/moe_math.hpp, shared bit for bit with epkit::ref::silu_mul_quantize_row.
//
// The counts stay on the device: a persistent kernel reads expert_num_tokens, and splits only the
// real rows over the grid. Rows past an expert's count are not read or written. A count above the
// capacity (masked) is clamped and recorded; a packed expert whose rows do not fit (offset < 0,
// offset + count > R or past the next expert's offset) is skipped and recorded.
#pragma once

#include <cuda_runtime_api.h>

#include "epkit/moe/errors.hpp"
#include "epkit/types.hpp"

namespace epkit::moe {

constexpr int kMaxLocalExperts = 1024;

struct SiluMulQuantArgs {
  ExpertLayout layout = ExpertLayout::kMasked;
  Tensor in;                 // masked [L, cap, 2I], packed [R, 2I] bf16; I % 128 == 0; 16-byte aligned
  Tensor out;                // masked [L, cap, I], packed [R, I] fp8_e4m3 (output); 16-byte aligned
  Tensor scale;              // masked [L, cap, I/128], packed [R, I/128] fp32 (output)
  Tensor expert_num_tokens;  // [L] int32 (device): real rows per expert; 1 <= L <= 1024
  Tensor expert_offsets;     // packed only: [L + 1] int32 (device), expert e's rows start at offsets[e]
  bool ue8m0 = false;        // power-of-two scales
  DeviceErrorRecord* error = nullptr;  // counts / offsets out of range are recorded here
};

// The one validation of a silu_mul_quantize call; throws epkit::Error.
void check_silu_mul_quant_args(const SiluMulQuantArgs& a);
// Validates, then launches on `stream` (capturable; no host synchronisation or allocation).
void silu_mul_quantize(const SiluMulQuantArgs& a, cudaStream_t stream);

}  // namespace epkit::moe
