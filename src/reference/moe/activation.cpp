// Host reference of the fused SiLU-mul + FP8 quantization (epkit/moe/activation.hpp), one row at
// a time. Shares the kernel's fp32 arithmetic (moe_math.hpp) and converts with the bit-exact host
// e4m3 of numerics.hpp; built with -ffp-contract=off.
#include <algorithm>
#include <vector>

#include "reference/moe/reference.hpp"
#include "moe/moe_math.hpp"
#include "reference/moe/numerics.hpp"

namespace epkit::ref {

namespace m = moe::math;

void silu_mul_quantize_row(int i, const uint16_t* in, bool ue8m0, uint8_t* q, float* scale) {
  std::vector<float> h(i);
  for (int j = 0; j < i; ++j) h[j] = m::silu_mul(bf16_to_float(in[j]), bf16_to_float(in[i + j]));
  for (int b = 0; b < i / kScaleBlock; ++b) {
    uint32_t a = 0;  // the largest |h| bits: their unsigned order is that of the magnitudes, NaN above all
    for (int j = b * kScaleBlock; j < (b + 1) * kScaleBlock; ++j) a = std::max(a, m::bits(h[j]) & 0x7fffffffu);
    const float s = m::block_scale(m::from_bits(a), ue8m0);
    const float inv = m::block_inv_scale(s);
    scale[b] = s;
    for (int j = b * kScaleBlock; j < (b + 1) * kScaleBlock; ++j) q[j] = float_to_e4m3(m::fmul(h[j], inv));
  }
}

}  // namespace epkit::ref
