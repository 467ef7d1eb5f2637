// Memory model: weights per GPU under EP/TP, KV-cache bytes, and the largest batch that fits.
#pragma once

#include "epkit/plan/config.hpp"
#include "epkit/plan/specs.hpp"

namespace epkit::plan {

// Weight bytes one GPU holds, by part. Block-quantization scales (FP32 per tile) are included.
struct WeightBytes {
  double attention = 0;       // all attention projections of all layers
  double dense_mlp = 0;       // MLPs of the leading dense layers (split by TP)
  double routed_experts = 0;  // num_routed_experts / ep experts per MoE layer
  double shared_experts = 0;  // a full copy on every GPU (the deployment study)
  double router = 0;          // gate weights (BF16)
  double embedding = 0;       // embedding + LM head, split by TP over the vocabulary
  double total() const { return attention + dense_mlp + routed_experts + shared_experts + router + embedding; }
};

// Weight bytes per GPU for expert parallelism `ep` and attention tensor parallelism `tp`.
WeightBytes weights_per_gpu(const ModelSpec& m, int ep, int tp);

// KV-cache bytes one token takes over all layers in the whole model (DeepSeek-V3: 70,272).
double kv_bytes_per_token(const ModelSpec& m);
// KV-cache bytes one token takes on one GPU with attention TP `tp` (MLA replicates the latent cache).
double kv_bytes_per_token_per_gpu(const ModelSpec& m, int tp);

// Largest number of requests of `context` + query_len tokens a DP group can hold in KV cache, given the
// weights and the GPU's reserve (0 when not even the weights fit).
int max_batch_per_gpu(const ModelSpec& m, const GpuSpec& g, const DeployConfig& c);

}  // namespace epkit::plan
