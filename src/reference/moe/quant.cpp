// Host reference of the FP8 block quantizers (epkit/moe/quant.hpp). Shares the kernels' fp32 arithmetic (moe_math.hpp) and converts
// with the bit-exact host e4m3 of numerics.hpp; built with -ffp-contract=off.
#include <algorithm>

#include "reference/moe/reference.hpp"
#include "moe/moe_math.hpp"
#include "reference/moe/numerics.hpp"

namespace epkit::ref {

namespace m = moe::math;

namespace {
constexpr int kBlock = 128;

// |x| bits of a bf16 value: their unsigned order is the order of the magnitudes, NaN above all.
uint32_t abs_bits16(uint16_t h) { return h & 0x7fffu; }
}  // namespace

float block_scale(float amax, bool ue8m0) { return m::block_scale(amax, ue8m0); }

uint8_t quantize_value(float x, float scale) { return float_to_e4m3(m::fmul(x, m::block_inv_scale(scale))); }

void quantize_activations(int rows, int h, const uint16_t* x, bool ue8m0, uint8_t* q, float* scale) {
  const int nb = (h + kBlock - 1) / kBlock;
  for (int r = 0; r < rows; ++r) {
    const uint16_t* xr = x + static_cast<size_t>(r) * h;
    for (int b = 0; b < nb; ++b) {
      const int lo = b * kBlock, hi = std::min(h, lo + kBlock);
      uint32_t a = 0;
      for (int i = lo; i < hi; ++i) a = std::max(a, abs_bits16(xr[i]));
      const float s = m::block_scale(bf16_to_float(static_cast<uint16_t>(a)), ue8m0);
      const float inv = m::block_inv_scale(s);
      scale[static_cast<size_t>(r) * nb + b] = s;
      for (int i = lo; i < hi; ++i) q[static_cast<size_t>(r) * h + i] = float_to_e4m3(m::fmul(bf16_to_float(xr[i]), inv));
    }
  }
}

void quantize_weights(int n, int k, const uint16_t* w, bool ue8m0, uint8_t* q, float* scale_inv) {
  const int nt = (n + kBlock - 1) / kBlock, kt = (k + kBlock - 1) / kBlock;
  for (int tn = 0; tn < nt; ++tn) {
    for (int tk = 0; tk < kt; ++tk) {
      const int r0 = tn * kBlock, r1 = std::min(n, r0 + kBlock), c0 = tk * kBlock, c1 = std::min(k, c0 + kBlock);
      uint32_t a = 0;
      for (int r = r0; r < r1; ++r)
        for (int c = c0; c < c1; ++c) a = std::max(a, abs_bits16(w[static_cast<size_t>(r) * k + c]));
      const float s = m::block_scale(bf16_to_float(static_cast<uint16_t>(a)), ue8m0);
      const float inv = m::block_inv_scale(s);
      scale_inv[static_cast<size_t>(tn) * kt + tk] = s;
      for (int r = r0; r < r1; ++r)
        for (int c = c0; c < c1; ++c) {
          const size_t o = static_cast<size_t>(r) * k + c;
          q[o] = float_to_e4m3(m::fmul(bf16_to_float(w[o]), inv));
        }
    }
  }
}

}  // namespace epkit::ref
