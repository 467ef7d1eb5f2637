// MoELayer: one DeepSeek-V3-class MoE layer, router to combine, on top of the two components:
// the communication core (AllToAll: dispatch/combine over NVSHMEM) and the expert compute
// (epkit::moe: router, FP8 quantization, grouped GEMM, SiLU-mul + quantization).
//
//   gate GEMM -> router -> quantize -> dispatch -> grouped GEMM (w13) -> SiLU*mul + quantize
//             -> grouped GEMM (w2) -> combine  (+ the shared expert beside it)
//
// out[t] = sum_k w[t,k] * expert_{idx[t,k]}(x[t]) + shared(x[t]), with every expert an FP8
// block-scaled SwiGLU MLP: expert(x) = W2 . (silu(W1 x) * (W3 x)).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "epkit/all_to_all.hpp"
#include "epkit/communicator.hpp"
#include "epkit/moe/router.hpp"
#include "epkit/types.hpp"

namespace epkit {

// How the layer orders its kernels (the overlap schedules of the DeepSeek-V3 deployment study,
// docs/MOE.md).
enum class MoESchedule : int32_t {
  kNone = 0,             // route, dispatch, experts, combine; the shared expert beside them (shared_concurrent)
  kDispatchOverlap = 1,  // the shared expert between dispatch_send and dispatch_recv
  kMicrobatch = 2,       // two halves of the batch, each half's communication beside the other's compute
};
const char* schedule_name(MoESchedule s);   // "none", "dispatch_overlap", "microbatch"
MoESchedule parse_schedule(const std::string& name);  // throws epkit::Error on an unknown name

struct MoELayerConfig {
  // Model shape.
  int hidden = 0;               // H: multiple of 128 (DeepSeek-V3: 7168)
  int intermediate = 0;         // I of one routed expert: multiple of 128 (2048); w13 is [2I, H]
  int num_experts = 0;          // E routed experts (256); E % world_size == 0
  int topk = 0;                 // K (8)
  moe::RouterMode router_mode = moe::RouterMode::kGroupedTopK;
  int num_groups = 1;           // grouped top-k: n_group (8)
  int topk_groups = 1;          // grouped top-k: groups kept (4)
  bool renormalize = true;      // softmax top-k: renormalise the K weights
  float routed_scaling = 1.0f;  // grouped top-k: weight scale (2.5)
  int num_shared_experts = 0;   // 0 or 1 (DeepSeek-V3: 1)
  int shared_intermediate = 0;  // I of the shared expert; 0 means `intermediate` (DeepSeek-V3: 2048)
  // Parallel layout.
  int world_size = 1;           // W
  int rank = 0;
  int dp_size = 1;              // D: ranks per DP group (they hold identical tokens)
  int max_tokens_per_rank = 0;  // M: most tokens one forward() takes (per DP group)
  // Execution.
  MoESchedule schedule = MoESchedule::kNone;
  // Dispatch's expert-major layout. kPacked (default): the received rows back to back, at most
  // M * (W / D) * min(K, L) of them; kMasked: L * capacity rows, L / min(K, L) times more (7.5 GB of
  // expert_x and 15 GB of expert_y at W = 1, E = 256, M = 4096). Measured on one H200 within 1-2% of
  // each other at every batch (docs/MOE.md), so the default is the one that fits prefill.
  ExpertLayout layout = ExpertLayout::kPacked;
  int expected_tokens = 0;      // with a device m (the host does not know it): tokens per forward the GEMM
                                // configs are chosen for; 0 means the rows of x (the graph's bucket)
  bool shared_concurrent = true;  // schedule none: the shared expert runs on a second stream forked after
                                  // quantization (a graph branch when captured), beside dispatch, the routed
                                  // experts and combine; false: after combine, in stream order
  bool ue8m0_scales = false;    // power-of-two activation scales
  bool fused_gate_router = true;  // decode batches (m <= 32 on the host, or a device m over at most 32 rows) run the
                                  // gate GEMM and the router as one kernel (moe::GateRouter) where
                                  // moe::gate_router_applies; false: cuBLASLt's gate, then route() (the
                                  // same-run A/B of docs/perf/grouped-gemm.md)
  int timeout_ms = -1;          // AllToAll's bound on device waits (-1: EPKIT_TIMEOUT_MS, else 10 s)
};

// Throws epkit::Error naming the first field out of range and its limit.
void validate(const MoELayerConfig& cfg);
int num_local_experts(const MoELayerConfig& cfg);   // E / W
int shared_intermediate(const MoELayerConfig& cfg);  // shared_intermediate, or intermediate when 0
moe::RouterConfig router_config(const MoELayerConfig& cfg);
// Whether moe::GateRouter can run a half of `half_rows` rows at decode batches (its first
// min(half_rows, 32)): the layer fuses gate + router there when fused_gate_router is set.
bool gate_router_fits(const MoELayerConfig& cfg, int half_rows);
// The dispatch/combine config of one half (half_tokens: M, or the split point of kMicrobatch).
AllToAllConfig all_to_all_config(const MoELayerConfig& cfg, int half_tokens);
// Tokens of half 0 under kMicrobatch: rows [0, split) go to half 0, [split, m) to half 1.
int microbatch_split(const MoELayerConfig& cfg);
// Rows per local expert the routed GEMMs' config is chosen for, for a forward of `tokens` tokens:
// the expected largest count under uniform routing, mean + sqrt(2 mean ln L) with mean =
// tokens * K * (W / D) / E (the Gaussian bound on the largest of L binomial counts), at least 1. A
// token tile sized for the mean alone splits the fuller experts into two tiles, and reads their
// weights twice.
int expected_rows_per_expert(const MoELayerConfig& cfg, int tokens);
// Device bytes the layer allocates for its activations (both halves), by the layout formulas.
size_t layer_workspace_bytes(const MoELayerConfig& cfg);

// The caller's weights, in the DeepSeek-V3 checkpoint's layout and dtypes (device tensors). The
// layer keeps the views, not copies: the memory must outlive it.
struct MoELayerWeights {
  Tensor w13;               // [L, 2I, H] fp8_e4m3, this rank's local experts: rows [0, I) gate (w1), [I, 2I) up (w3)
  Tensor w13_scale;         // [L, 2I/128, H/128] fp32 weight_scale_inv (dequantised w = q * scale_inv)
  Tensor w2;                // [L, H, I] fp8_e4m3
  Tensor w2_scale;          // [L, H/128, I/128] fp32
  Tensor shared_w13;        // [2Is, H] fp8_e4m3 (num_shared_experts == 1), same half order
  Tensor shared_w13_scale;  // [2Is/128, H/128] fp32
  Tensor shared_w2;         // [H, Is] fp8_e4m3
  Tensor shared_w2_scale;   // [H/128, Is/128] fp32
  Tensor gate;              // [E, H] bf16 router projection
  Tensor gate_bias;         // [E] fp32 correction bias (grouped top-k); may be absent
};
// Throws epkit::Error naming the first tensor whose dtype or shape does not match cfg.
void check_weights(const MoELayerConfig& cfg, const MoELayerWeights& w);

// One forward's tokens: x [rows >= m, H] bf16 in, out [rows, H] bf16 out (rows t >= m untouched).
// m on the host, or -1 with num_tokens_device (one device int32: one captured graph serves any m).
struct MoEBatch {
  Tensor x;
  Tensor out;
  int num_tokens = -1;
  const int32_t* num_tokens_device = nullptr;
};

class MoELayer {
 public:
  // Owns its AllToAll (two under kMicrobatch), allocated collectively over comm's ranks.
  MoELayer(const Communicator& comm, const MoELayerConfig& cfg, const MoELayerWeights& weights);
  // World size 1 in one process, with no Communicator and no NVSHMEM (cfg.world_size 1, rank 0):
  // one GPU serving the whole model, on the current device.
  MoELayer(const MoELayerConfig& cfg, const MoELayerWeights& weights);
  // Borrows the caller's AllToAll objects (one, or two for kMicrobatch: several layers then share
  // one set of symmetric buffers, as the seed does). Their configs must equal all_to_all_config(),
  // except weights_at_dispatch, which the layer follows (all_to_all_config() sets it: the router's
  // weights then travel with dispatch and combine exchanges none).
  MoELayer(const std::vector<AllToAll*>& a2a, const MoELayerConfig& cfg, const MoELayerWeights& weights);
  ~MoELayer();
  MoELayer(const MoELayer&) = delete;
  MoELayer& operator=(const MoELayer&) = delete;

  const MoELayerConfig& config() const;

  // The whole layer in the configured schedule. No host synchronisation or allocation: capturable
  // (with num_tokens_device, one graph serves every m up to the rows of x). Validates first.
  void forward(const MoEBatch& batch, cudaStream_t stream);

  // The stages of the seed's 5-stage schedule, for engines that put attention between them
  // (kMicrobatch: half 0 or 1; else half 0 only). Per layer and half, in this order, after begin():
  //   stage_route          gate GEMM, router, activation quantization   (seed stage 2's gate)
  //   stage_dispatch_send  dispatch_send, then the shared expert        (stage 3)
  //   stage_experts        dispatch_recv, both grouped GEMMs + activation, combine_send (stage 4)
  //   stage_combine_recv   combine_recv, then out += shared expert       (stage 5)
  void begin(const MoEBatch& batch, cudaStream_t stream);
  void stage_route(int half, cudaStream_t stream);
  void stage_dispatch_send(int half, cudaStream_t stream);
  void stage_experts(int half, cudaStream_t stream);
  void stage_combine_recv(int half, cudaStream_t stream);

  // Raises epkit::Error for device-side violations recorded by earlier layers (capacity overflow,
  // device m above the rows, index errors), from the expert compute and from the AllToAll objects.
  // Does not synchronise: call after the stream has finished the work. A device-side timeout of
  // one of its AllToAll objects (a dead or stuck peer) is raised here, and from then on by every
  // call (forward, begin, the stages) before it launches anything: the layer is unusable.
  void check();

  // Diagnostics for breakdowns (epkit-moe layer): the kernels of half 0 as configured by the last
  // begin() or forward(), one step each, with the same arguments and device counts ("gate" and
  // "router", or "gate_router" where the fused kernel runs). Steps whose `pair` is true
  // ("dispatch", then "combine") must run together, in that order.
  struct Step {
    std::string name;
    std::function<void(cudaStream_t)> run;
    bool pair = false;
  };
  std::vector<Step> steps();
  // Diagnostics (tests): half `half`'s routing buffers of the last forward, device views of the gate
  // logits [rows, E] fp32, topk_idx [rows, K] int32 and topk_weights [rows, K] fp32 (rows of this
  // half; the first m are valid).
  struct Routing {
    Tensor logits, topk_idx, topk_weights;
  };
  Routing routing(int half = 0);
  // Diagnostics: the tokens each local expert received in half `half`'s last dispatch (synchronises
  // the device; not for a timed or captured region).
  std::vector<int> expert_counts(int half = 0);

  // The AllToAll of a half (owned or borrowed).
  AllToAll& all_to_all(int half = 0);
  size_t workspace_bytes() const;  // device memory the layer allocated

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace epkit
