#include "layer_model.hpp"

#include <algorithm>
#include <cmath>

#include "reference/moe/numerics.hpp"

namespace epkit::test {
namespace {

// A random e4m3 code of magnitude <= 3.75 (exponent field <= 8): no NaN, no saturation.
uint8_t random_code(std::mt19937_64& rng) {
  const uint64_t r = rng();
  return static_cast<uint8_t>(((r & 1) << 7) | ((r >> 1) % 9) << 3 | ((r >> 8) & 7));
}

void fill_expert(std::mt19937_64& rng, int n, int k, std::vector<uint8_t>& q, std::vector<float>& s) {
  q.resize(static_cast<size_t>(n) * k);
  for (auto& c : q) c = random_code(rng);
  s.resize(static_cast<size_t>((n + 127) / 128) * ((k + 127) / 128));
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  for (auto& v : s) v = u(rng) / std::sqrt(static_cast<float>(k)) * 0.5f;
}

}  // namespace

std::unique_ptr<MoELayer> make_layer(const MoELayerConfig& cfg, const MoELayerWeights& w) {
  const Communicator* c = communicator();
  return c ? std::make_unique<MoELayer>(*c, cfg, w) : std::make_unique<MoELayer>(cfg, w);
}





Model make_model(const MoELayerConfig& cfg, uint64_t seed, float skew_bias) {
  Model md;
  md.cfg = cfg;
  std::mt19937_64 rng(seed);
  const int E = cfg.num_experts, H = cfg.hidden, I = cfg.intermediate, Is = shared_intermediate(cfg);
  md.w13.resize(E), md.w2.resize(E), md.w13s.resize(E), md.w2s.resize(E);
  for (int e = 0; e < E; ++e) {
    fill_expert(rng, 2 * I, H, md.w13[e], md.w13s[e]);
    fill_expert(rng, H, I, md.w2[e], md.w2s[e]);
  }
  if (cfg.num_shared_experts) {
    fill_expert(rng, 2 * Is, H, md.sw13, md.sw13s);
    fill_expert(rng, H, Is, md.sw2, md.sw2s);
  }
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  md.gate.resize(static_cast<size_t>(E) * H);
  for (auto& g : md.gate) g = ref::float_to_bf16(u(rng) * 2.0f / std::sqrt(static_cast<float>(H)));
  md.bias.resize(E);
  for (int e = 0; e < E; ++e) md.bias[e] = 0.05f * u(rng) + (e < cfg.topk ? skew_bias : 0.f);
  for (int e = 0; e < E; ++e) md.experts.push_back({md.w13[e].data(), md.w13s[e].data(), md.w2[e].data(), md.w2s[e].data()});
  md.shared = {md.sw13.data(), md.sw13s.data(), md.sw2.data(), md.sw2s.data()};
  return md;
}



void make_device_model(const Model& md, DeviceModel& d) {
  const MoELayerConfig& c = md.cfg;
  const int L = num_local_experts(c), e0 = c.rank * L, H = c.hidden, I = c.intermediate, Is = shared_intermediate(c);
  std::vector<uint8_t> w13, w2;
  std::vector<float> w13s, w2s;
  for (int e = e0; e < e0 + L; ++e) {
    w13.insert(w13.end(), md.w13[e].begin(), md.w13[e].end());
    w2.insert(w2.end(), md.w2[e].begin(), md.w2[e].end());
    w13s.insert(w13s.end(), md.w13s[e].begin(), md.w13s[e].end());
    w2s.insert(w2s.end(), md.w2s[e].begin(), md.w2s[e].end());
  }
  d.w13 = upload(w13.data(), w13.size()), d.w2 = upload(w2.data(), w2.size());
  d.w13s = upload(w13s.data(), w13s.size()), d.w2s = upload(w2s.data(), w2s.size());
  const int64_t b = 128;
  auto blk = [&](int64_t n) { return (n + b - 1) / b; };
  d.views.w13 = Tensor(d.w13.ptr, DType::kFP8E4M3, {L, 2 * I, H});
  d.views.w13_scale = Tensor(d.w13s.ptr, DType::kFP32, {L, blk(2 * I), blk(H)});
  d.views.w2 = Tensor(d.w2.ptr, DType::kFP8E4M3, {L, H, I});
  d.views.w2_scale = Tensor(d.w2s.ptr, DType::kFP32, {L, blk(H), blk(I)});
  if (c.num_shared_experts) {
    d.sw13 = upload(md.sw13.data(), md.sw13.size()), d.sw2 = upload(md.sw2.data(), md.sw2.size());
    d.sw13s = upload(md.sw13s.data(), md.sw13s.size()), d.sw2s = upload(md.sw2s.data(), md.sw2s.size());
    d.views.shared_w13 = Tensor(d.sw13.ptr, DType::kFP8E4M3, {2 * Is, H});
    d.views.shared_w13_scale = Tensor(d.sw13s.ptr, DType::kFP32, {blk(2 * Is), blk(H)});
    d.views.shared_w2 = Tensor(d.sw2.ptr, DType::kFP8E4M3, {H, Is});
    d.views.shared_w2_scale = Tensor(d.sw2s.ptr, DType::kFP32, {blk(H), blk(Is)});
  }
  d.gate = upload(md.gate.data(), md.gate.size());
  d.bias = upload(md.bias.data(), md.bias.size());
  d.views.gate = Tensor(d.gate.ptr, DType::kBF16, {c.num_experts, H});
  d.views.gate_bias = Tensor(d.bias.ptr, DType::kFP32, {c.num_experts});
}


// Tolerance of the layer output, relative to the norm of sum_k |w y| + |shared| (out_abs):
// the device differs from the reference only in the GEMMs' fp32 accumulation order (vs double).
// That moves a bf16-rounded GEMM output by one bf16 step (2^-8) for a small fraction of elements
// (those within ~1e-6 of a rounding boundary), which can move one e4m3 code of the activation by one
// step (2^-3 of that element) or, through the block's amax, one 128-element block's scale; one such
// event changes an output row by well under 1e-2 of its norm, and they are rare. Across ranks the
// partials are also rounded to bf16 once more (2^-9). So: 1e-2 on the Frobenius norm over all rows,
// 3e-2 per row (a wrong expert or a permuted token gives errors of order 1). The aggregate bound
// needs rows to average over: with fewer than kFrobMinRows rows the per-row bound alone applies (one
// token with every top-k expert's block scales moved has been seen at 1.08e-2, skewed routing, m = 1).
constexpr double kFrobTol = 1e-2, kRowTol = 3e-2;
constexpr int kFrobMinRows = 4;

// Checks one forward of m tokens of DP group g: logits, routing, output and the untouched rows.
std::string check_forward(MoELayer& layer, const Model& md, const std::vector<uint16_t>& x, int m, int rows,
                          bool device_m, const DeviceBuffer& out_dev) {
  const MoELayerConfig& c = md.cfg;
  const int E = c.num_experts, K = c.topk, H = c.hidden;
  // kMicrobatch: half 0 holds the first ceil(n / 2) rows, n = m on the host or the rows of x.
  const int halves = c.schedule == MoESchedule::kMicrobatch ? 2 : 1, split = ((device_m ? rows : m) + 1) / 2;
  // Gather the routing of both halves into token order.
  std::vector<float> logits(static_cast<size_t>(m) * E);
  std::vector<int32_t> idx(static_cast<size_t>(m) * K);
  std::vector<float> w(static_cast<size_t>(m) * K);
  for (int h = 0; h < halves; ++h) {
    const int t0 = halves == 1 ? 0 : (h == 0 ? 0 : split);
    const int n = halves == 1 ? m : (h == 0 ? std::min(m, split) : std::max(0, m - split));
    if (n == 0) continue;
    const MoELayer::Routing r = layer.routing(h);
    auto lg = download<float>(r.logits.data, static_cast<size_t>(n) * E);
    auto ix = download<int32_t>(r.topk_idx.data, static_cast<size_t>(n) * K);
    auto ww = download<float>(r.topk_weights.data, static_cast<size_t>(n) * K);
    std::copy(lg.begin(), lg.end(), logits.begin() + static_cast<size_t>(t0) * E);
    std::copy(ix.begin(), ix.end(), idx.begin() + static_cast<size_t>(t0) * K);
    std::copy(ww.begin(), ww.end(), w.begin() + static_cast<size_t>(t0) * K);
  }
  // 1. Logits: bf16 inputs are exact, fp32 accumulation over H terms: |err| <= H * 2^-23 * sum|x g|.
  for (int t = 0; t < m; ++t)
    for (int e = 0; e < E; ++e) {
      double acc = 0, mag = 0;
      for (int k = 0; k < H; ++k) {
        const double p = static_cast<double>(ref::bf16_to_float(x[static_cast<size_t>(t) * H + k])) *
                         ref::bf16_to_float(md.gate[static_cast<size_t>(e) * H + k]);
        acc += p, mag += std::fabs(p);
      }
      const double got = logits[static_cast<size_t>(t) * E + e];
      if (!(std::fabs(got - acc) <= 1e-5 * mag + 1e-6))
        return "logit[" + std::to_string(t) + "][" + std::to_string(e) + "] = " + std::to_string(got) + ", host " +
               std::to_string(acc);
    }
  // 2. Routing: exact, against the reference router on the device's own logits.
  std::vector<int32_t> ridx(idx.size());
  std::vector<float> rw(w.size());
  ref::route(router_config(c), m, logits.data(),
             c.router_mode == moe::RouterMode::kGroupedTopK ? md.bias.data() : nullptr, ridx.data(), rw.data());
  for (size_t i = 0; i < idx.size(); ++i)
    if (idx[i] != ridx[i] || ref::float_to_bits(w[i]) != ref::float_to_bits(rw[i]))
      return "routing entry " + std::to_string(i) + ": device (" + std::to_string(idx[i]) + ", " + std::to_string(w[i]) +
             "), reference (" + std::to_string(ridx[i]) + ", " + std::to_string(rw[i]) + ")";
  // 3. Output.
  ref::LayerReferenceShape rs;
  rs.hidden = H, rs.intermediate = c.intermediate, rs.topk = K, rs.ue8m0 = c.ue8m0_scales;
  rs.shared_intermediate = c.num_shared_experts ? shared_intermediate(c) : 0;
  std::vector<float> want(static_cast<size_t>(m) * H), mag(want.size());
  ref::moe_layer(rs, m, x.data(), idx.data(), w.data(), md.experts, md.shared, want.data(), mag.data());
  const auto out = download<uint16_t>(out_dev.ptr, static_cast<size_t>(rows) * H);
  double err2 = 0, mag2 = 0;
  for (int t = 0; t < m; ++t) {
    double e2 = 0, m2 = 0;
    for (int i = 0; i < H; ++i) {
      const size_t k = static_cast<size_t>(t) * H + i;
      const float got = ref::bf16_to_float(out[k]);
      if (!std::isfinite(got)) {
        // Which rows were left unwritten tells the schedule's halves apart.
        int unwritten = 0, first = -1, last = -1;
        for (int r = 0; r < m; ++r)
          if (!std::isfinite(ref::bf16_to_float(out[static_cast<size_t>(r) * H]))) {
            ++unwritten, last = r;
            if (first < 0) first = r;
          }
        return "out[" + std::to_string(t) + "][" + std::to_string(i) + "] is not finite (" + std::to_string(unwritten) +
               " of " + std::to_string(m) + " rows unwritten, rows " + std::to_string(first) + ".." +
               std::to_string(last) + ")";
      }
      e2 += (got - want[k]) * static_cast<double>(got - want[k]);
      m2 += static_cast<double>(mag[k]) * mag[k];
    }
    if (std::sqrt(e2) > kRowTol * std::sqrt(m2) + 1e-6)
      return "row " + std::to_string(t) + ": relative error " + std::to_string(std::sqrt(e2 / std::max(m2, 1e-30))) +
             " > " + std::to_string(kRowTol);
    err2 += e2, mag2 += m2;
  }
  if (m >= kFrobMinRows && std::sqrt(err2) > kFrobTol * std::sqrt(mag2))
    return "relative Frobenius error " + std::to_string(std::sqrt(err2 / mag2)) + " > " + std::to_string(kFrobTol);
  // Rows >= m keep their poison (0xffff: a bf16 NaN pattern).
  for (size_t k = static_cast<size_t>(m) * H; k < out.size(); ++k)
    if (out[k] != 0xffff) return "row " + std::to_string(k / H) + " >= m = " + std::to_string(m) + " was written";
  return "";
}

MoELayerConfig base_config(MoESchedule sched, ExpertLayout layout, bool deepseek, int dp, int world_size, int rank) {
  MoELayerConfig c;
  if (deepseek) {
    c.hidden = 7168, c.intermediate = 2048, c.num_experts = 8 * world_size, c.topk = 4;
    c.num_groups = 4, c.topk_groups = 2, c.routed_scaling = 2.5f, c.shared_intermediate = 2048;
    c.max_tokens_per_rank = 6;
  } else {
    c.hidden = 512, c.intermediate = 256, c.num_experts = 16, c.topk = 4;
    c.num_groups = 4, c.topk_groups = 2, c.routed_scaling = 2.5f, c.shared_intermediate = 384;
    c.max_tokens_per_rank = 24;
  }
  c.router_mode = moe::RouterMode::kGroupedTopK;
  c.num_shared_experts = 1;
  c.world_size = world_size, c.rank = rank, c.dp_size = dp;
  c.schedule = sched;
  c.layout = layout;
  return c;
}

// The tokens of this rank's DP group (identical on the group's ranks).
std::vector<uint16_t> group_tokens(const MoELayerConfig& c, int rows, uint64_t seed) {
  std::mt19937_64 rng(seed + static_cast<uint64_t>(c.rank / c.dp_size) * 7919);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<uint16_t> x(static_cast<size_t>(rows) * c.hidden);
  for (auto& v : x) v = ref::float_to_bf16(u(rng));
  return x;
}

}  // namespace epkit::test
