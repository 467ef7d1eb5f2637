// Weights per GPU and KV-cache capacity (the deployment study, "Single-Node versus Multi-Node").
#include "epkit/plan/memory.hpp"

#include <cmath>

#include "epkit/error.hpp"

namespace epkit::plan {

namespace {

// Bytes of a [k, n] linear weight, with one FP32 scale per block x block tile when block-quantized.
double linear_bytes(const ModelSpec& m, double k, double n) {
  double bytes = k * n * m.weight_bytes;
  if (m.weight_block > 0) bytes += std::ceil(k / m.weight_block) * std::ceil(n / m.weight_block) * 4.0;
  return bytes;
}

// Attention weights of one layer on one GPU. MLA: TP cannot split the latent projections, so q_a, kv_a
// and kv_b are replicated on every TP rank (the deployment study); q_b and o are split by heads.
double attention_bytes_per_layer(const ModelSpec& m, int tp) {
  const double h = m.hidden, heads = double(m.num_heads) / tp;
  if (m.attention == AttentionKind::kMla) {
    const double qk_dim = m.qk_nope_head_dim + m.qk_rope_head_dim;
    double q = m.q_lora_rank > 0 ? linear_bytes(m, h, m.q_lora_rank) + linear_bytes(m, m.q_lora_rank, heads * qk_dim)
                                 : linear_bytes(m, h, heads * qk_dim);
    double kv_a = linear_bytes(m, h, m.kv_lora_rank + m.qk_rope_head_dim);
    double kv_b = linear_bytes(m, m.kv_lora_rank, double(m.num_heads) * (m.qk_nope_head_dim + m.v_head_dim));
    double o = linear_bytes(m, heads * m.v_head_dim, h);
    return q + kv_a + kv_b + o;
  }
  // GQA: KV heads are split while there are enough of them, replicated beyond that.
  const double kv_heads = m.num_kv_heads >= tp ? double(m.num_kv_heads) / tp : 1.0;
  return linear_bytes(m, h, (heads + 2 * kv_heads) * m.head_dim) + linear_bytes(m, heads * m.head_dim, h);
}

double expert_bytes(const ModelSpec& m, double inter) {
  return linear_bytes(m, m.hidden, 2 * inter) + linear_bytes(m, inter, m.hidden);  // gate+up, down
}

}  // namespace

WeightBytes weights_per_gpu(const ModelSpec& m, int ep, int tp) {
  EPKIT_CHECK(ep >= 1 && tp >= 1, "ep = ", ep, ", tp = ", tp, " must be >= 1");
  const int moe_layers = m.num_layers - m.num_dense_layers;
  WeightBytes w;
  w.attention = m.num_layers * attention_bytes_per_layer(m, tp);
  w.dense_mlp = m.num_dense_layers * expert_bytes(m, double(m.dense_inter) / tp);
  w.routed_experts = moe_layers * (double(m.num_routed_experts) / ep) * expert_bytes(m, m.moe_inter);
  w.shared_experts = moe_layers * m.num_shared_experts * expert_bytes(m, m.moe_inter);
  w.router = moe_layers * double(m.hidden) * m.num_routed_experts * 2.0;
  w.embedding = 2.0 * double(m.vocab) * m.hidden * m.embedding_bytes / tp;  // input embedding + LM head
  return w;
}

double kv_bytes_per_token(const ModelSpec& m) {
  // MLA caches one latent (kv_lora) and one shared RoPE key per token and layer; GQA caches K and V per KV head.
  const double per_layer = m.attention == AttentionKind::kMla
                               ? double(m.kv_lora_rank + m.qk_rope_head_dim)
                               : 2.0 * m.num_kv_heads * m.head_dim;
  return per_layer * m.num_layers * m.kv_bytes;
}

double kv_bytes_per_token_per_gpu(const ModelSpec& m, int tp) {
  if (m.attention == AttentionKind::kMla) return kv_bytes_per_token(m);  // every TP rank keeps the whole latent cache
  const double split = m.num_kv_heads >= tp ? tp : m.num_kv_heads;
  return kv_bytes_per_token(m) / split;
}

int max_batch_per_gpu(const ModelSpec& m, const GpuSpec& g, const DeployConfig& c) {
  const double free_bytes = (g.hbm_capacity_gb - g.reserved_gb) * 1e9 - weights_per_gpu(m, c.ep, c.tp).total();
  if (free_bytes <= 0) return 0;
  const double per_request = kv_bytes_per_token_per_gpu(m, c.tp) * (double(c.context) + c.query_len);
  return static_cast<int>(std::floor(free_bytes / per_request));
}

}  // namespace epkit::plan
