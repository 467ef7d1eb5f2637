// Hardware and model descriptions for the deployment planner. Both are plain data: the built-in ones
// are JSON files under src/plan/specs/ compiled into the library, and users can pass their own files.
#pragma once

#include <string>
#include <vector>

#include "epkit/plan/json.hpp"

namespace epkit::plan {

// One GPU type and the node it sits in. Units are in the field names; GB/TB are decimal (1e9/1e12).
struct GpuSpec {
  std::string name;
  double peak_bf16_tflops = 0;        // dense BF16 tensor-core peak, TFLOP/s
  double peak_fp8_tflops = 0;         // dense FP8 tensor-core peak, TFLOP/s
  double hbm_bandwidth_tb_per_s = 0;  // HBM bandwidth, TB/s
  double hbm_capacity_gb = 0;         // HBM capacity, GB
  double nvlink_gb_per_s = 0;         // NVLink bandwidth per GPU per direction, GB/s
  double network_gbit_per_s = 0;      // scale-out NIC bandwidth per GPU per direction, Gbit/s
  int gpus_per_node = 0;              // GPUs joined by NVLink in one node
  double kernel_launch_us = 0;        // fixed cost per kernel inside a CUDA graph, µs
  double nvlink_latency_us = 0;       // one-way latency of an intra-node transfer + signal, µs
  double network_latency_us = 0;      // one-way latency of an inter-node transfer + signal, µs
  double reserved_gb = 0;             // per-GPU memory kept for context, activations, graphs, comm buffers, GB
};

// Attention flavour: MLA (DeepSeek) or grouped-query attention (Llama/Mixtral).
enum class AttentionKind { kMla, kGqa };

// One MoE transformer. Sizes are element counts; *_bytes are bytes per element.
struct ModelSpec {
  std::string name;
  std::vector<std::string> aliases;  // other names (e.g. epkit-bench presets) that mean this model
  int num_layers = 0;                // all transformer layers
  int num_dense_layers = 0;          // leading layers with a dense MLP instead of MoE
  int hidden = 0;
  int vocab = 0;
  AttentionKind attention = AttentionKind::kGqa;
  int num_heads = 0;
  // MLA only
  int q_lora_rank = 0;  // 0: no query compression
  int kv_lora_rank = 0;
  int qk_rope_head_dim = 0;
  int qk_nope_head_dim = 0;
  int v_head_dim = 0;
  // GQA only
  int num_kv_heads = 0;
  int head_dim = 0;
  // MoE
  int num_routed_experts = 0;
  int num_shared_experts = 0;
  int top_k = 0;
  int moe_inter = 0;    // intermediate size of one expert
  int dense_inter = 0;  // intermediate size of the dense MLP layers
  // storage
  double weight_bytes = 1;        // linear-layer weights (1: FP8, 2: BF16)
  int weight_block = 0;           // block-quantization tile edge (128 for DeepSeek FP8; 0: none)
  double embedding_bytes = 2;     // embedding and LM head
  double kv_bytes = 2;            // KV-cache element
  double dispatch_bytes = 1;      // activation element sent by dispatch (1: FP8 + block scales)
  double combine_bytes = 2;       // expert-output element sent back by combine
  int mtp_draft_tokens = 0;       // tokens the model's own MTP module drafts per step (DeepSeek-V3: 1)
};

// Parses a GPU spec object; throws epkit::Error naming a missing or out-of-range field.
GpuSpec gpu_from_json(const Json& j);
// Parses a model spec object; throws epkit::Error naming a missing or out-of-range field.
ModelSpec model_from_json(const Json& j);
// The JSON form of a spec (round-trips through *_from_json).
Json to_json(const GpuSpec& g);
Json to_json(const ModelSpec& m);

// Names of the built-in specs.
std::vector<std::string> builtin_gpu_names();
std::vector<std::string> builtin_model_names();
// A built-in spec by name or alias (case-insensitive) or, when `name_or_path` ends in ".json", a user file.
GpuSpec load_gpu(const std::string& name_or_path);
ModelSpec load_model(const std::string& name_or_path);

}  // namespace epkit::plan
