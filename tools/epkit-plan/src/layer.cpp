// Per-kernel FLOP and byte counts of a decode layer (the deployment study's kernel list and stages).
#include "layer.hpp"

#include <algorithm>
#include <cmath>

#include "epkit/plan/routing.hpp"

namespace epkit::plan {

namespace {

constexpr double kAct = 2.0;  // BF16 activations between kernels

Op kernel_op(int stage, KernelCost k) { return Op{OpKind::kKernel, stage, std::move(k)}; }

// Ring all-reduce of `bytes` over the TP group's NVLink; a blocking collective on the compute stream.
KernelCost tp_allreduce(const DeployConfig& c, const GpuSpec& g, const Efficiency& e, double bytes) {
  KernelCost k;
  k.name = "tp_allreduce";
  k.cls = KernelClass::kTpAllReduce;
  k.bytes = bytes;
  const double wire = 2.0 * (c.tp - 1) / c.tp * bytes;
  k.time_us = g.kernel_launch_us + g.nvlink_latency_us * 2 + wire / (g.nvlink_gb_per_s * 1e9 * e.comm) * 1e6;
  return k;
}

// Stages 1 and 2: attention for T tokens of the DP group on one TP rank.
void attention_ops(const ModelSpec& m, const GpuSpec& g, const DeployConfig& c, const Efficiency& e, int batch,
                   std::vector<Op>& ops) {
  const double T = double(batch) * c.query_len;
  const double h = m.hidden, heads = double(m.num_heads) / c.tp, wb = m.weight_bytes;
  const double ab = m.weight_bytes <= 1 ? 1.0 : kAct;  // FP8 models quantize GEMM inputs on the fly
  const double ctx = c.context;
  ops.push_back(kernel_op(1, elementwise_cost("input_norm", KernelClass::kElementwise, 2 * T * h * kAct, g, e)));
  KernelCost attn;
  attn.name = "attention";
  attn.cls = KernelClass::kAttention;
  if (m.attention == AttentionKind::kMla) {
    const double lat = m.kv_lora_rank, rope = m.qk_rope_head_dim, nope = m.qk_nope_head_dim, vd = m.v_head_dim;
    // q_a and kv_a fused into one GEMM (the deployment study: 30.2 -> 16.7 µs); replicated on every TP rank.
    if (m.q_lora_rank > 0) {
      ops.push_back(kernel_op(1, gemm_cost("qkv_a_proj", KernelClass::kGemm, T, h, m.q_lora_rank + lat + rope, wb, ab, kAct, g, e)));
      ops.push_back(kernel_op(1, gemm_cost("q_b_proj", KernelClass::kGemm, T, m.q_lora_rank, heads * (nope + rope), wb, ab, kAct, g, e)));
    } else {
      ops.push_back(kernel_op(1, gemm_cost("qkv_a_proj", KernelClass::kGemm, T, h, heads * (nope + rope) + lat + rope, wb, ab, kAct, g, e)));
    }
    ops.push_back(kernel_op(1, elementwise_cost("append_kv", KernelClass::kElementwise, T * (lat + rope) * (kAct + m.kv_bytes), g, e)));
    // Absorbed k_b: per local head [T, nope] x [nope, kv_lora] (a batched GEMM over heads).
    ops.push_back(kernel_op(1, group_gemm_cost("k_b_bmm", heads, heads * T, nope, lat, wb, ab, kAct, g, e)));
    ops.back().kernel.cls = KernelClass::kGemm;
    // Decode MLA with absorption: every query of every local head scores ctx latents of width lat+rope and
    // sums ctx latents of width lat; the latent cache is read once per request for all heads and both queries.
    attn.flop = 2.0 * T * heads * ctx * ((lat + rope) + lat);
    attn.bytes = double(batch) * ctx * (lat + rope) * m.kv_bytes + 2.0 * T * heads * (lat + rope) * kAct;
    attn.time_us = roofline_us(attn.flop, attn.bytes, g.peak_bf16_tflops, g.hbm_bandwidth_tb_per_s, e.attention_compute,
                               e.attention_memory, g.kernel_launch_us, &attn.compute_bound);
    ops.push_back(kernel_op(2, attn));
    ops.push_back(kernel_op(2, group_gemm_cost("v_b_bmm", heads, heads * T, lat, vd, wb, ab, kAct, g, e)));
    ops.back().kernel.cls = KernelClass::kGemm;
    ops.push_back(kernel_op(2, gemm_cost("o_proj", KernelClass::kGemm, T, heads * vd, h, wb, ab, kAct, g, e)));
  } else {
    const double hd = m.head_dim;
    const double kvh = m.num_kv_heads >= c.tp ? double(m.num_kv_heads) / c.tp : 1.0;
    ops.push_back(kernel_op(1, gemm_cost("qkv_proj", KernelClass::kGemm, T, h, (heads + 2 * kvh) * hd, wb, ab, kAct, g, e)));
    ops.push_back(kernel_op(1, elementwise_cost("append_kv", KernelClass::kElementwise, T * 2 * kvh * hd * (kAct + m.kv_bytes), g, e)));
    attn.flop = 2.0 * T * heads * ctx * hd * 2;
    attn.bytes = double(batch) * ctx * 2 * kvh * hd * m.kv_bytes + 2.0 * T * heads * hd * kAct;
    attn.time_us = roofline_us(attn.flop, attn.bytes, g.peak_bf16_tflops, g.hbm_bandwidth_tb_per_s, e.attention_compute,
                               e.attention_memory, g.kernel_launch_us, &attn.compute_bound);
    ops.push_back(kernel_op(2, attn));
    ops.push_back(kernel_op(2, gemm_cost("o_proj", KernelClass::kGemm, T, heads * hd, h, wb, ab, kAct, g, e)));
  }
  if (c.tp > 1) ops.push_back(kernel_op(2, tp_allreduce(c, g, e, T * h * kAct)));
  ops.push_back(kernel_op(2, elementwise_cost("post_norm", KernelClass::kElementwise, 2 * T * h * kAct, g, e)));
}

// Copies of (token, expert) leaving one rank split by link: same GPU, NVLink, network.
struct LinkSplit {
  double local = 0, intra = 0, inter = 0;
};
LinkSplit link_split(const DeployConfig& c, const GpuSpec& g) {
  const double node = std::min(c.ep, g.gpus_per_node);
  return {1.0 / c.ep, (node - 1) / c.ep, (c.ep - node) / c.ep};
}

// Transfer time for `copies` messages of `msg_bytes` from one rank, µs. NVLink and the NIC are separate
// paths, so the slower of the two sets the time.
double transfer_us(const DeployConfig& c, const GpuSpec& g, const Efficiency& e, double copies, double msg_bytes) {
  const LinkSplit s = link_split(c, g);
  const double t_nvl = copies * s.intra * msg_bytes / (g.nvlink_gb_per_s * 1e9 * e.comm);
  const double t_net = copies * s.inter * msg_bytes / (g.network_gbit_per_s / 8 * 1e9 * e.comm);
  const double latency = s.inter > 0 ? g.network_latency_us : (s.intra > 0 ? g.nvlink_latency_us : 0);
  return latency + std::max(t_nvl, t_net) * 1e6;
}

// epkit runs these kernels with its own MoE kernels, which epkit-moe times standalone: a measured time
// at the planner's shape replaces the roofline. Where no row applies the model stays, and the note
// says why (explain prints it).
void use_measured(KernelCost& k, const Calibration* cal, const KernelQuery& q) {
  if (cal == nullptr || cal->kernels.empty()) return;
  const KernelLookup l = lookup_kernel(*cal, q);
  if (!l.found) {
    k.note = "modelled: " + l.what;
    return;
  }
  k.time_us = l.time_us;
  k.measured = true;
  k.interpolated = l.interpolated;
  k.note = l.what;
}

// The grouped GEMM rows are epkit's FP8 block-scaled kernel; a BF16 model's GEMMs are another kernel.
void use_measured_gemm(KernelCost& k, const ModelSpec& m, const Calibration* cal, const KernelQuery& q) {
  if (cal != nullptr && !cal->kernels.empty() && m.weight_bytes > 1) {
    k.note = "modelled: epkit's grouped GEMM rows are FP8, and this model's weights are BF16";
    return;
  }
  use_measured(k, cal, q);
}

}  // namespace

MoeLayerOps moe_layer_ops(const ModelSpec& m, const GpuSpec& g, const DeployConfig& c, const Efficiency& e, int batch,
                          bool shared_after_send, const Calibration* cal) {
  MoeLayerOps out;
  auto& ops = out.ops;
  attention_ops(m, g, c, e, batch, ops);
  const double T = double(batch) * c.query_len;
  const double h = m.hidden, wb = m.weight_bytes, inter = m.moe_inter;
  const double ab = m.weight_bytes <= 1 ? 1.0 : kAct;

  // Router: gate GEMM (BF16 weights) + top-k; every TP rank routes the group's tokens.
  ops.push_back(kernel_op(2, gemm_cost("gate", KernelClass::kRouter, T, h, m.num_routed_experts, 2.0, kAct, 4.0, g, e)));
  ops.push_back(kernel_op(2, elementwise_cost("topk", KernelClass::kRouter, T * m.num_routed_experts * 4.0, g, e)));
  use_measured(ops.back().kernel, cal, {"router", "", m.num_routed_experts, m.top_k, 1, T, g.name});

  // Each TP rank dispatches a disjoint 1/tp share of the group's tokens (as in the pplx-kernels design); combine returns
  // every result to every rank of the group.
  const double t_send = std::ceil(T / c.tp);
  const double copies_out = t_send * m.top_k;
  const double scales = (m.dispatch_bytes <= 1 && m.weight_block > 0) ? std::ceil(h / m.weight_block) * 4.0 : 0.0;
  const double msg = h * m.dispatch_bytes + scales + 8.0;  // payload + block scales + source index
  const double combine_copies_in = T * m.top_k;
  const double combine_msg = h * m.combine_bytes;

  const RoutingStats r = routing_stats(m, c, batch);
  const double copies_in = r.copies_per_gpu;
  KernelCost d_send = elementwise_cost("dispatch_send", KernelClass::kDispatch, t_send * h * kAct + copies_out * msg, g, e);
  KernelCost d_recv = elementwise_cost("dispatch_recv", KernelClass::kDispatch, copies_out * (msg + h * ab), g, e);
  KernelCost c_send = elementwise_cost("combine_send", KernelClass::kCombine, 2 * copies_in * combine_msg, g, e);
  KernelCost c_recv = elementwise_cost("combine_recv", KernelClass::kCombine, combine_copies_in * combine_msg + T * h * kAct, g, e);
  out.dispatch_transfer_us = transfer_us(c, g, e, copies_out, msg);
  out.combine_transfer_us = transfer_us(c, g, e, combine_copies_in, combine_msg);
  // Measured dispatch/combine (send + transfer + receive) replace the modelled totals; the kernels keep
  // their modelled share and the transfer takes the rest, so overlap schedules can still hide it.
  // epkit-bench has no notion of TP groups, so only TP1 points use its rows.
  if (cal != nullptr && c.tp == 1) {
    if (auto meas = lookup_comm(*cal, c.ep, t_send)) {
      out.dispatch_transfer_us = std::max(0.0, meas->dispatch_us - d_send.time_us - d_recv.time_us);
      out.combine_transfer_us = std::max(0.0, meas->combine_us - c_send.time_us - c_recv.time_us);
      out.dispatch_measured = out.combine_measured = true;
      out.comm_interpolated = meas->interpolated;
      for (auto* k : {&d_send, &d_recv, &c_send, &c_recv}) k->measured = true;
    }
  }

  // epkit runs the shared expert as a one-group grouped GEMM (src/layer/moe_layer.cu), so its rows apply.
  const int H = m.hidden, I = m.moe_inter;
  std::vector<Op> shared;
  for (int i = 0; i < m.num_shared_experts; ++i) {
    shared.push_back(kernel_op(3, gemm_cost("shared_gate_up", KernelClass::kSharedExpert, T, h, 2 * inter, wb, ab, kAct, g, e)));
    use_measured_gemm(shared.back().kernel, m, cal, {"grouped_gemm", "up_gate", 2 * I, H, 1, T, g.name});
    shared.push_back(kernel_op(3, elementwise_cost("shared_silu", KernelClass::kSharedExpert, T * inter * (2 * kAct + ab), g, e)));
    use_measured(shared.back().kernel, cal, {"silu_mul_quantize", "masked", I, -1, 1, T, g.name});
    shared.push_back(kernel_op(3, gemm_cost("shared_down", KernelClass::kSharedExpert, T, inter, h, wb, ab, kAct, g, e)));
    use_measured_gemm(shared.back().kernel, m, cal, {"grouped_gemm", "down", H, I, 1, T, g.name});
  }
  if (!shared_after_send) ops.insert(ops.end(), shared.begin(), shared.end());
  ops.push_back(kernel_op(3, d_send));
  ops.push_back(Op{OpKind::kStartDispatch, 3, {}});
  if (shared_after_send) ops.insert(ops.end(), shared.begin(), shared.end());

  // Stage 4: receive, expert GroupGEMMs over the touched experts only, combine-send.
  ops.push_back(Op{OpKind::kWaitDispatch, 4, {}});
  ops.push_back(kernel_op(4, d_recv));
  const double active = r.active_experts_per_gpu;
  const double rows_per_group = r.tokens_per_active_expert;
  ops.push_back(kernel_op(4, group_gemm_cost("moe_gate_up", active, copies_in, h, 2 * inter, wb, ab, kAct, g, e)));
  use_measured_gemm(ops.back().kernel, m, cal, {"grouped_gemm", "up_gate", 2 * I, H, active, rows_per_group, g.name});
  ops.push_back(kernel_op(4, elementwise_cost("moe_silu_quant", KernelClass::kGroupGemm, copies_in * inter * (2 * kAct + ab), g, e)));
  use_measured(ops.back().kernel, cal, {"silu_mul_quantize", "masked", I, -1, active, rows_per_group, g.name});
  ops.push_back(kernel_op(4, group_gemm_cost("moe_down", active, copies_in, inter, h, wb, ab, kAct, g, e)));
  use_measured_gemm(ops.back().kernel, m, cal, {"grouped_gemm", "down", H, I, active, rows_per_group, g.name});
  ops.push_back(kernel_op(4, c_send));
  ops.push_back(Op{OpKind::kStartCombine, 4, {}});
  ops.push_back(Op{OpKind::kWaitCombine, 5, {}});
  ops.push_back(kernel_op(5, c_recv));
  return out;
}

std::vector<MoeLayerOps> moe_layer_batches(const ModelSpec& m, const GpuSpec& g, const DeployConfig& c,
                                           const Efficiency& e, const Calibration* cal) {
  const bool shared_after_send = c.schedule != Schedule::kNoOverlap;
  if (c.schedule != Schedule::kMicroBatch) return {moe_layer_ops(m, g, c, e, c.batch, shared_after_send, cal)};
  return {moe_layer_ops(m, g, c, e, (c.batch + 1) / 2, shared_after_send, cal),
          moe_layer_ops(m, g, c, e, c.batch / 2, shared_after_send, cal)};
}

bool in_moe_block(const Op& op) { return op.stage >= 3 || (op.kind == OpKind::kKernel && op.kernel.cls == KernelClass::kRouter); }

std::vector<std::pair<std::string, double>> moe_block_steps(const MoeLayerOps& mb) {
  // epkit-moe's step names, and the planner kernels doing that work. A standalone dispatch or combine
  // includes its transfer. quantize and add_shared have no planner kernel: the planner folds them into
  // dispatch-send's and combine-receive's bytes, as the deployment study's kernel list does.
  static const std::vector<std::pair<std::string, std::vector<std::string>>> kSteps = {
      {"gate", {"gate"}},
      {"router", {"topk"}},
      {"dispatch", {"dispatch_send", "dispatch_recv"}},
      {"gemm_w13", {"moe_gate_up"}},
      {"silu_mul_quantize", {"moe_silu_quant"}},
      {"gemm_w2", {"moe_down"}},
      {"combine", {"combine_send", "combine_recv"}},
      {"shared_expert", {"shared_gate_up", "shared_silu", "shared_down"}}};
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [step, kernels] : kSteps) {
    double us = step == "dispatch" ? mb.dispatch_transfer_us : step == "combine" ? mb.combine_transfer_us : 0.0;
    bool any = false;
    for (const Op& op : mb.ops)
      if (op.kind == OpKind::kKernel && std::find(kernels.begin(), kernels.end(), op.kernel.name) != kernels.end())
        us += op.kernel.time_us, any = true;
    if (any) out.emplace_back(step, us);
  }
  return out;
}

std::vector<KernelCost> dense_layer_kernels(const ModelSpec& m, const GpuSpec& g, const DeployConfig& c,
                                            const Efficiency& e, int batch) {
  std::vector<Op> ops;
  attention_ops(m, g, c, e, batch, ops);
  const double T = double(batch) * c.query_len, h = m.hidden, inter = double(m.dense_inter) / c.tp;
  const double ab = m.weight_bytes <= 1 ? 1.0 : kAct;
  std::vector<KernelCost> out;
  for (auto& op : ops) out.push_back(op.kernel);
  out.push_back(gemm_cost("mlp_gate_up", KernelClass::kGemm, T, h, 2 * inter, m.weight_bytes, ab, kAct, g, e));
  out.push_back(elementwise_cost("mlp_silu", KernelClass::kElementwise, T * inter * (2 * kAct + ab), g, e));
  out.push_back(gemm_cost("mlp_down", KernelClass::kGemm, T, inter, h, m.weight_bytes, ab, kAct, g, e));
  if (c.tp > 1) out.push_back(tp_allreduce(c, g, e, T * h * kAct));
  return out;
}

std::vector<KernelCost> head_kernels(const ModelSpec& m, const GpuSpec& g, const DeployConfig& c, const Efficiency& e,
                                     int batch) {
  const double T = double(batch) * c.query_len, h = m.hidden;
  std::vector<KernelCost> out;
  out.push_back(elementwise_cost("embedding", KernelClass::kElementwise, 2 * T * h * kAct, g, e));
  out.push_back(elementwise_cost("final_norm", KernelClass::kElementwise, 2 * T * h * kAct, g, e));
  out.push_back(gemm_cost("lm_head", KernelClass::kGemm, T, h, double(m.vocab) / c.tp, m.embedding_bytes, kAct, 4.0, g, e));
  out.push_back(elementwise_cost("sampling", KernelClass::kElementwise, T * double(m.vocab) / c.tp * 4.0, g, e));
  return out;
}

}  // namespace epkit::plan
