// Host reference of the MoE layer (include/epkit/moe/reference_layer.hpp).
#include "reference/moe/reference_layer.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "epkit/error.hpp"
#include "reference/moe/reference.hpp"
#include "reference/moe/numerics.hpp"

namespace epkit::ref {

namespace {

// The 256 e4m3 values, decoded once.
const float* e4m3_table() {
  static const std::vector<float> t = [] {
    std::vector<float> v(256);
    for (int c = 0; c < 256; ++c) v[c] = e4m3_to_float(static_cast<uint8_t>(c));
    return v;
  }();
  return t.data();
}

float round_bf16(double v) { return bf16_to_float(float_to_bf16(static_cast<float>(v))); }

// y[n] = sum_k a[k] * dequant(W)[n, k] for W [N, K] e4m3 with 128x128 scales, in double.
void gemv_fp8(int n_out, int k_in, const float* a, const uint8_t* w, const float* ws, std::vector<double>& y) {
  const float* lut = e4m3_table();
  const int kb = (k_in + 127) / 128;
  y.assign(n_out, 0.0);
  for (int n = 0; n < n_out; ++n) {
    const uint8_t* row = w + static_cast<size_t>(n) * k_in;
    const float* srow = ws + static_cast<size_t>(n / 128) * kb;
    double acc = 0;
    for (int b = 0; b < kb; ++b) {
      double part = 0;
      const int k1 = std::min(k_in, (b + 1) * 128);
      for (int k = b * 128; k < k1; ++k) part += static_cast<double>(a[k]) * lut[row[k]];
      acc += part * srow[b];
    }
    y[n] = acc;
  }
}

}  // namespace

void expert_forward(const LayerReferenceShape& s, int inter, const uint8_t* xq, const float* xs, const Fp8Expert& e,
                    float* y) {
  const int H = s.hidden;
  const float* lut = e4m3_table();
  std::vector<float> xd(H);
  for (int k = 0; k < H; ++k) xd[k] = lut[xq[k]] * xs[k / 128];
  std::vector<double> h;
  gemv_fp8(2 * inter, H, xd.data(), e.w13, e.w13_scale, h);
  std::vector<uint16_t> hb(2 * inter);
  for (int i = 0; i < 2 * inter; ++i) hb[i] = float_to_bf16(static_cast<float>(h[i]));  // the GEMM's bf16 output
  std::vector<uint8_t> aq(inter);
  std::vector<float> as((inter + 127) / 128);
  silu_mul_quantize_row(inter, hb.data(), s.ue8m0, aq.data(), as.data());
  std::vector<float> ad(inter);
  for (int i = 0; i < inter; ++i) ad[i] = lut[aq[i]] * as[i / 128];
  std::vector<double> yd;
  gemv_fp8(H, inter, ad.data(), e.w2, e.w2_scale, yd);
  for (int i = 0; i < H; ++i) y[i] = round_bf16(yd[i]);
}

void moe_layer(const LayerReferenceShape& s, int m, const uint16_t* x, const int32_t* topk_idx,
               const float* topk_weights, const std::vector<Fp8Expert>& experts, const Fp8Expert& shared, float* out,
               float* out_abs) {
  EPKIT_CHECK(s.hidden % 128 == 0 && s.intermediate % 128 == 0, "ref::moe_layer: H and I must be multiples of 128");
  const int H = s.hidden, K = s.topk, nb = H / 128;
  std::vector<uint8_t> xq(H);
  std::vector<float> xs(nb), y(H), ys(H);
  std::vector<double> acc(H), acc_abs(H);
  for (int t = 0; t < m; ++t) {
    quantize_activations(1, H, x + static_cast<size_t>(t) * H, s.ue8m0, xq.data(), xs.data());
    std::fill(acc.begin(), acc.end(), 0.0);
    std::fill(acc_abs.begin(), acc_abs.end(), 0.0);
    for (int k = 0; k < K; ++k) {
      const int e = topk_idx[static_cast<size_t>(t) * K + k];
      if (e < 0) continue;
      EPKIT_CHECK(e < static_cast<int>(experts.size()), "ref::moe_layer: expert ", e, " >= ", experts.size());
      const double w = topk_weights[static_cast<size_t>(t) * K + k];
      expert_forward(s, s.intermediate, xq.data(), xs.data(), experts[e], y.data());
      for (int i = 0; i < H; ++i) acc[i] += w * y[i], acc_abs[i] += std::fabs(w * y[i]);
    }
    float* o = out + static_cast<size_t>(t) * H;
    float* oa = out_abs + static_cast<size_t>(t) * H;
    if (s.shared_intermediate > 0) expert_forward(s, s.shared_intermediate, xq.data(), xs.data(), shared, ys.data());
    for (int i = 0; i < H; ++i) {
      const float routed = round_bf16(acc[i]);  // combine writes bf16
      o[i] = s.shared_intermediate > 0 ? round_bf16(static_cast<double>(routed) + ys[i]) : routed;
      oa[i] = static_cast<float>(acc_abs[i] + (s.shared_intermediate > 0 ? std::fabs(ys[i]) : 0.0));
    }
  }
}

}  // namespace epkit::ref
