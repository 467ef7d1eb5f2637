// The kernels of one decode layer for one (micro-)batch, tagged with the deployment study's five stages.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "epkit/plan/calibration.hpp"
#include "epkit/plan/config.hpp"
#include "epkit/plan/roofline.hpp"
#include "epkit/plan/specs.hpp"

namespace epkit::plan {

// What the GPU does at one point of a layer: run a kernel, start an asynchronous transfer, or wait for one.
enum class OpKind { kKernel, kStartDispatch, kWaitDispatch, kStartCombine, kWaitCombine };

struct Op {
  OpKind kind = OpKind::kKernel;
  int stage = 1;       // 1..5 (the deployment study: norm/QKV | attention/O/gate | dispatch-send | MoE | combine-recv)
  KernelCost kernel;   // for kKernel
};

// One MoE layer of one micro-batch: ops in issue order and the two network transfers.
struct MoeLayerOps {
  std::vector<Op> ops;
  double dispatch_transfer_us = 0;  // from dispatch-send's end until the data is usable at the receiver, µs
  double combine_transfer_us = 0;   // the same for combine, µs
  bool dispatch_measured = false;
  bool combine_measured = false;
  bool comm_interpolated = false;
};

// Ops of one MoE layer for `batch` requests per DP group. `shared_after_send` puts the shared expert between
// dispatch-send and dispatch-receive (dispatch overlap); otherwise it runs before dispatch-send.
MoeLayerOps moe_layer_ops(const ModelSpec& m, const GpuSpec& g, const DeployConfig& c, const Efficiency& e, int batch,
                          bool shared_after_send, const Calibration* cal);

// The (micro-)batches of one MoE layer under c.schedule: the whole batch, or for the micro-batch schedule
// two halves of ceil(batch/2) and floor(batch/2) requests. Dispatch overlap and micro-batching put the
// shared expert after dispatch-send.
std::vector<MoeLayerOps> moe_layer_batches(const ModelSpec& m, const GpuSpec& g, const DeployConfig& c,
                                           const Efficiency& e, const Calibration* cal);

// Whether an op belongs to the MoE block epkit's MoELayer runs (gate GEMM to combine-receive, and the
// shared expert), as opposed to attention and the norms around it.
bool in_moe_block(const Op& op);

// The planner's time, µs, for each of epkit-moe's layer breakdown steps (gate, router, dispatch,
// gemm_w13, silu_mul_quantize, gemm_w2, combine, shared_expert) of one (micro-)batch. dispatch and
// combine include their transfers; steps the planner has no kernel for are absent.
std::vector<std::pair<std::string, double>> moe_block_steps(const MoeLayerOps& mb);

// Kernels of one dense layer for `batch` requests per DP group (run back to back).
std::vector<KernelCost> dense_layer_kernels(const ModelSpec& m, const GpuSpec& g, const DeployConfig& c,
                                            const Efficiency& e, int batch);

// Kernels run once per step: embedding, final norm, LM head, sampling.
std::vector<KernelCost> head_kernels(const ModelSpec& m, const GpuSpec& g, const DeployConfig& c, const Efficiency& e,
                                     int batch);

}  // namespace epkit::plan
