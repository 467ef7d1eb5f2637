// Host reference of the router (epkit/moe/router.hpp), written as the definition reads: sort the
// candidates by (score desc, index asc), keep K. Shares the kernel's fp32 arithmetic (moe_math.hpp);
// built with -ffp-contract=off.
#include <algorithm>
#include <numeric>
#include <vector>

#include "reference/moe/reference.hpp"
#include "moe/moe_math.hpp"

namespace epkit::ref {

namespace m = moe::math;

namespace {

// Indices of `keys` ordered best first: larger key, then lower index.
std::vector<int> ranked(const std::vector<uint32_t>& keys) {
  std::vector<int> order(keys.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return keys[a] > keys[b]; });
  return order;
}

void route_softmax(const moe::RouterConfig& c, const float* l, int32_t* idx, float* w) {
  const int E = c.num_experts, K = c.topk;
  std::vector<uint32_t> keys(E);
  for (int e = 0; e < E; ++e) keys[e] = m::order_key(l[e]);
  const std::vector<int> order = ranked(keys);
  const float vmax = l[order[0]];
  std::vector<float> x(K);
  float sum = 0.0f;
  for (int k = 0; k < K; ++k) {
    x[k] = m::exp(m::fsub(l[order[k]], vmax));
    sum = m::fadd(sum, x[k]);
  }
  float denom = sum;
  if (!c.renormalize) {
    denom = 0.0f;  // the kernel sums in another order: compared with a tolerance
    for (int e = 0; e < E; ++e) denom = m::fadd(denom, m::exp(m::fsub(l[e], vmax)));
  }
  for (int k = 0; k < K; ++k) {
    idx[k] = order[k];
    w[k] = m::fmul(m::fdiv(x[k], denom), c.routed_scaling);
  }
}

void route_grouped(const moe::RouterConfig& c, const float* l, const float* bias, int32_t* idx, float* w) {
  const int E = c.num_experts, K = c.topk, G = c.num_groups, gs = E / G;
  std::vector<float> s(E), sb(E);
  for (int e = 0; e < E; ++e) {
    s[e] = m::sigmoid(l[e]);
    sb[e] = m::fadd(s[e], bias ? bias[e] : 0.0f);
  }
  std::vector<uint32_t> gkeys(G);
  for (int g = 0; g < G; ++g) {
    std::vector<uint32_t> k(gs);
    for (int i = 0; i < gs; ++i) k[i] = m::order_key(sb[g * gs + i]);
    const std::vector<int> o = ranked(k);
    const float top1 = sb[g * gs + o[0]];
    gkeys[g] = m::order_key(gs == 1 ? top1 : m::fadd(top1, sb[g * gs + o[1]]));
  }
  const std::vector<int> gorder = ranked(gkeys);
  std::vector<bool> kept(G, false);
  for (int i = 0; i < c.topk_groups; ++i) kept[gorder[i]] = true;
  std::vector<uint32_t> keys(E);
  for (int e = 0; e < E; ++e) keys[e] = kept[e / gs] ? m::order_key(sb[e]) : 0u;
  const std::vector<int> order = ranked(keys);
  float sum = 0.0f;
  for (int k = 0; k < K; ++k) sum = m::fadd(sum, s[order[k]]);
  for (int k = 0; k < K; ++k) {
    idx[k] = order[k];
    w[k] = m::fmul(m::fdiv(s[order[k]], sum), c.routed_scaling);
  }
}

}  // namespace

void route(const moe::RouterConfig& cfg, int m_tokens, const float* logits, const float* bias, int32_t* topk_idx,
           float* topk_weights) {
  moe::validate(cfg);
  const int E = cfg.num_experts, K = cfg.topk;
  for (int t = 0; t < m_tokens; ++t) {
    const float* l = logits + static_cast<size_t>(t) * E;
    int32_t* idx = topk_idx + static_cast<size_t>(t) * K;
    float* w = topk_weights + static_cast<size_t>(t) * K;
    if (cfg.mode == moe::RouterMode::kSoftmaxTopK) route_softmax(cfg, l, idx, w);
    else route_grouped(cfg, l, bias, idx, w);
  }
}

}  // namespace epkit::ref
