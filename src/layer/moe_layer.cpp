// MoELayer: the host orchestration of one MoE layer over the communication core and the expert
// compute. Allocation happens in the constructor only; forward() and the stages validate, then
// launch: no host synchronisation, capturable.
#include "epkit/moe_layer.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <utility>

#include "epkit/error.hpp"
#include "common/buffer_layout.hpp"
#include "epkit/moe/activation.hpp"
#include "epkit/moe/errors.hpp"
#include "epkit/moe/gate.hpp"
#include "epkit/moe/grouped_gemm.hpp"
#include "epkit/moe/quant.hpp"
#include "epkit/moe/router.hpp"
#include "layer/layer_kernels.hpp"
#include "layer/sizes.hpp"
#include "common/cuda_check.hpp"

namespace epkit {

namespace {

// One cudaMalloc'd region carved into the layer's activations (256-byte aligned pieces).
class Arena {
 public:
  void reserve(size_t bytes) { total_ += align_up(bytes, 256); }
  void allocate() {
    if (total_) EPKIT_CUDA_CHECK(cudaMalloc(&base_, total_));
  }
  void* take(size_t bytes) {
    void* p = static_cast<uint8_t*>(base_) + used_;
    used_ += align_up(bytes, 256);
    EPKIT_CHECK(used_ <= total_, "layer arena overrun (internal error)");
    return p;
  }
  size_t bytes() const { return total_; }
  ~Arena() {
    if (base_) cudaFree(base_);
  }

 private:
  void* base_ = nullptr;
  size_t total_ = 0, used_ = 0;
};

}  // namespace

struct MoELayer::Impl {
  MoELayerConfig cfg;
  MoELayerWeights w;
  moe::RouterConfig rcfg;
  AllToAllConfig acfg;
  int halves = 1, split = 0, L = 0;
  Arena arena;
  moe::ErrorRecord err;
  std::unique_ptr<moe::GateProjection> gate;
  std::unique_ptr<moe::GateRouter> gate_router[2];  // one per half: a GateRouter runs one launch at a time
  std::vector<std::unique_ptr<AllToAll>> owned;

  // The grouped GEMMs: one object per (role, config); run() picks by the call's token hint.
  enum Role { kW13 = 0, kW2 = 1, kShared13 = 2, kShared2 = 3 };
  moe::GroupedGemmShape shapes[4];
  std::vector<std::unique_ptr<moe::GroupedGemm>> gemms[4];  // per role, one per compiled config

  struct Half {
    AllToAll* a2a = nullptr;
    int rows = 0;
    int64_t xrows = 0;
    float* logits = nullptr;
    int32_t* idx = nullptr;
    float* topw = nullptr;
    int32_t* m_used = nullptr;  // the m the router used, on the device: later kernels read it (dispatch and
                                // combine take host_m instead when there is one, set_tokens)
    uint8_t* xq = nullptr;
    float* xs = nullptr;
    uint8_t* ex = nullptr;
    float* exs = nullptr;
    int32_t* cnt = nullptr;
    int32_t* offs = nullptr;
    uint8_t* h = nullptr;
    uint8_t* act = nullptr;
    float* acts = nullptr;
    uint8_t* ey = nullptr;
    uint8_t* sh = nullptr;
    uint8_t* sact = nullptr;
    float* sacts = nullptr;
    uint8_t* sy = nullptr;
    // This call.
    int host_m = -1;                      // m of this half on the host, or -1
    const int32_t* dev_m = nullptr;       // else the device m of this half
    int hint = 0;                         // tokens the GEMM configs are chosen for
    Tensor x, out;                        // this half's rows of the batch
    int stage = 0;                        // next stage expected (0 route, 1 send, 2 experts, 3 recv)
  } half[2];
  int32_t* m_split = nullptr;  // [2] device m of each half under kMicrobatch with a device m
  bool begun = false;
  // The first device-side timeout of one of its AllToAll objects (empty while none): the layer is then
  // unusable, and every call raises it before launching anything.
  std::string failure;
  void raise_if_failed(const char* call);
  // The shared expert's branch (schedule none, shared_concurrent): a stream of the layer's own, forked
  // from the caller's after quantization and joined before out += shared.
  cudaStream_t side = nullptr;
  cudaEvent_t fork_ev = nullptr, join_ev = nullptr;

  ~Impl() {
    if (fork_ev) cudaEventDestroy(fork_ev);
    if (join_ev) cudaEventDestroy(join_ev);
    if (side) cudaStreamDestroy(side);
  }

  // owned: create the AllToAll objects, collectively over comm (nullptr at world size 1: the
  // single-process ones, no NVSHMEM); else borrow `borrowed`.
  void build(const std::vector<AllToAll*>& borrowed, bool owned_objects, const Communicator* comm);
  moe::GroupedGemm& gemm(Role r, int expected_m);
  Tensor expert_tensor(const Half& hf, void* p, DType t, int64_t cols) const;
  Tensor counts(const Half& hf) const { return Tensor(hf.cnt, DType::kInt32, {L}); }
  Tensor offsets(const Half& hf) const {
    return cfg.layout == ExpertLayout::kPacked ? Tensor(hf.offs, DType::kInt32, {L + 1}) : Tensor();
  }
  void route(Half& hf, cudaStream_t s);
  // Whether this call of half hf runs the fused gate + router (decode sizes, where it applies).
  bool fused_gate(const Half& hf) const;
  void gate_router_step(Half& hf, cudaStream_t s);
  moe::RouterArgs router_args(Half& hf) const;
  void gate_step(Half& hf, cudaStream_t s);
  void router_step(Half& hf, cudaStream_t s);
  void quant_step(Half& hf, cudaStream_t s);
  void gemm13_step(Half& hf, cudaStream_t s);
  void silu_step(Half& hf, cudaStream_t s);
  void gemm2_step(Half& hf, cudaStream_t s);
  void dispatch(Half& hf, bool send, bool recv, cudaStream_t s);
  void experts(Half& hf, cudaStream_t s);
  void combine(Half& hf, bool send, bool recv, cudaStream_t s);
  void shared(Half& hf, cudaStream_t s);
  void add_shared(Half& hf, cudaStream_t s);
  static void set_tokens(const Half& hf, int& host_m, const int32_t*& dev_m);
  DispatchArgs dispatch_args(const Half& hf) const;
  CombineArgs combine_args(const Half& hf) const;
  void expect_stage(int h, int want, const char* call);
};

void MoELayer::Impl::build(const std::vector<AllToAll*>& borrowed, bool owned_objects, const Communicator* comm) {
  validate(cfg);
  check_weights(cfg, w);
  rcfg = router_config(cfg);
  halves = cfg.schedule == MoESchedule::kMicrobatch ? 2 : 1;
  split = microbatch_split(cfg);
  acfg = all_to_all_config(cfg, split);
  L = num_local_experts(cfg);
  if (owned_objects) {
    EPKIT_CHECK(comm != nullptr || (cfg.world_size == 1 && cfg.rank == 0), "MoELayer without a Communicator is the "
                "world-size-1 layer: world_size = ", cfg.world_size, ", rank = ", cfg.rank, " (must be 1 and 0)");
    for (int h = 0; h < halves; ++h)
      owned.push_back(comm ? std::make_unique<AllToAll>(*comm, acfg) : std::make_unique<AllToAll>(acfg));
    for (int h = 0; h < halves; ++h) half[h].a2a = owned[h].get();
  } else {
    EPKIT_CHECK(static_cast<int>(borrowed.size()) == halves, "MoELayer: schedule ", schedule_name(cfg.schedule),
                " needs ", halves, " AllToAll object(s), got ", borrowed.size());
    for (int h = 0; h < halves; ++h) {
      EPKIT_CHECK(borrowed[h] != nullptr, "MoELayer: AllToAll ", h, " is null");
      // Where the router weights go is the object's choice: the layer follows the first half's, and
      // the second must agree with it (agreement_fields below).
      if (h == 0) acfg.weights_at_dispatch = borrowed[0]->config().weights_at_dispatch;
      const auto want = agreement_fields(acfg), have = agreement_fields(borrowed[h]->config());
      for (size_t i = 0; i < want.size(); ++i)
        EPKIT_CHECK(i < have.size() && want[i] == have[i], "MoELayer: borrowed AllToAll ", h, " has ", want[i].first,
                    " = ", i < have.size() ? have[i].second : -1, " but the layer needs ", want[i].second,
                    " (all_to_all_config)");
      EPKIT_CHECK(borrowed[h]->config().rank == acfg.rank, "MoELayer: borrowed AllToAll ", h, " is rank ",
                  borrowed[h]->config().rank, " but the layer is rank ", acfg.rank);
      half[h].a2a = borrowed[h];
    }
  }
  const layer::HalfSizes hs = layer::half_sizes(cfg, acfg);
  for (int h = 0; h < halves; ++h)
    for (const auto& p : hs.parts) arena.reserve(p.second);
  arena.reserve(16);
  arena.allocate();
  for (int h = 0; h < halves; ++h) {
    Half& hf = half[h];
    hf.rows = halves == 1 ? cfg.max_tokens_per_rank : split;  // both halves hold up to ceil(M / 2) tokens
    hf.xrows = hs.xrows;
    auto take = [&](const char* name) {
      for (const auto& p : hs.parts)
        if (std::string(p.first) == name) return arena.take(p.second);
      EPKIT_FAIL("layer buffer ", name, " not sized (internal error)");
    };
    hf.logits = static_cast<float*>(take("logits"));
    hf.idx = static_cast<int32_t*>(take("topk_idx"));
    hf.topw = static_cast<float*>(take("topk_weights"));
    hf.m_used = static_cast<int32_t*>(take("m_used"));
    hf.xq = static_cast<uint8_t*>(take("xq"));
    hf.xs = static_cast<float*>(take("xs"));
    hf.ex = static_cast<uint8_t*>(take("expert_x"));
    hf.exs = static_cast<float*>(take("expert_x_scale"));
    hf.cnt = static_cast<int32_t*>(take("expert_num_tokens"));
    hf.offs = static_cast<int32_t*>(take("expert_offsets"));
    hf.h = static_cast<uint8_t*>(take("h"));
    hf.act = static_cast<uint8_t*>(take("act"));
    hf.acts = static_cast<float*>(take("act_scale"));
    hf.ey = static_cast<uint8_t*>(take("expert_y"));
    if (cfg.num_shared_experts > 0) {
      hf.sh = static_cast<uint8_t*>(take("shared_h"));
      hf.sact = static_cast<uint8_t*>(take("shared_act"));
      hf.sacts = static_cast<float*>(take("shared_act_scale"));
      hf.sy = static_cast<uint8_t*>(take("shared_y"));
    }
  }
  m_split = static_cast<int32_t*>(arena.take(16));
  EPKIT_CUDA_CHECK(cudaMemset(m_split, 0, 16));
  if (cfg.schedule == MoESchedule::kNone && cfg.shared_concurrent && cfg.num_shared_experts > 0) {
    EPKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    EPKIT_CUDA_CHECK(cudaEventCreateWithFlags(&fork_ev, cudaEventDisableTiming));
    EPKIT_CUDA_CHECK(cudaEventCreateWithFlags(&join_ev, cudaEventDisableTiming));
  }

  gate = std::make_unique<moe::GateProjection>(cfg.hidden, cfg.num_experts, half[0].rows);
  for (int h = 0; h < halves; ++h)
    if (cfg.fused_gate_router && gate_router_fits(cfg, half[h].rows))
      gate_router[h] = std::make_unique<moe::GateRouter>(cfg.hidden, rcfg, std::min(half[h].rows, moe::kGateRouterMaxTokens));
  const int I = cfg.intermediate, Is = shared_intermediate(cfg), H = cfg.hidden;
  const bool packed = cfg.layout == ExpertLayout::kPacked;
  auto routed = [&](int n, int k) {
    moe::GroupedGemmShape s;
    s.num_groups = L, s.n = n, s.k = k, s.layout = cfg.layout;
    s.rows = static_cast<int>(packed ? hs.xrows : hs.xrows / L);
    return s;
  };
  shapes[kW13] = routed(2 * I, H);
  shapes[kW2] = routed(H, I);
  for (Role r : {kShared13, kShared2}) {
    moe::GroupedGemmShape s;
    s.num_groups = 1, s.n = r == kShared13 ? 2 * Is : H, s.k = r == kShared13 ? H : Is;
    s.layout = ExpertLayout::kMasked, s.rows = hs.rows;
    shapes[r] = s;
  }
  // Every compiled config of every GEMM is built now (a few KB of workspace each), so that the
  // per-call choice never creates anything, inside a capture least of all.
  for (Role r : {kW13, kW2, kShared13, kShared2}) {
    if (cfg.num_shared_experts == 0 && (r == kShared13 || r == kShared2)) continue;
    for (const moe::GemmConfig& c : moe::available_gemm_configs())
      gemms[r].push_back(std::make_unique<moe::GroupedGemm>(shapes[r], c));
  }
}

// The GEMM of role r for a call of `tokens` tokens: the heuristic's config for the rows per group
// that many tokens give: the fullest routed expert's under uniform routing
// (expected_rows_per_expert), the tokens themselves for the shared expert.
moe::GroupedGemm& MoELayer::Impl::gemm(Role r, int tokens) {
  moe::GroupedGemmShape s = shapes[r];
  const long em = r == kShared13 || r == kShared2 ? tokens : expected_rows_per_expert(cfg, tokens);
  s.expected_m = static_cast<int>(std::clamp<long>(em, 1, std::max(1, s.rows)));
  const moe::GemmConfig c = moe::choose_gemm_config(s);
  for (const auto& g : gemms[r])
    if (g->config() == c) return *g;
  EPKIT_FAIL("MoELayer: grouped GEMM config ", moe::to_string(c), " was not built (internal error)");
}

Tensor MoELayer::Impl::expert_tensor(const Half& hf, void* p, DType t, int64_t cols) const {
  if (cfg.layout == ExpertLayout::kPacked) return Tensor(p, t, {hf.xrows, cols});
  return Tensor(p, t, {L, hf.xrows / L, cols});
}

void MoELayer::Impl::route(Half& hf, cudaStream_t s) {
  if (fused_gate(hf)) {
    gate_router_step(hf, s);
  } else {
    gate_step(hf, s);
    router_step(hf, s);
  }
  quant_step(hf, s);
}

bool MoELayer::Impl::fused_gate(const Half& hf) const {
  const moe::GateRouter* g = gate_router[&hf == &half[0] ? 0 : 1].get();
  if (g == nullptr) return false;
  const int bound = g->shape().max_tokens;
  return hf.host_m >= 0 ? hf.host_m <= bound : hf.x.shape[0] <= bound;
}

void MoELayer::Impl::gate_router_step(Half& hf, cudaStream_t s) {
  gate_router[&hf == &half[0] ? 0 : 1]->run(hf.x, w.gate, router_args(hf), s);
}

void MoELayer::Impl::gate_step(Half& hf, cudaStream_t s) {
  // The gate GEMM runs over m rows on the host, or over every row of the half (the bucket a graph
  // was captured for) when m lives on the device.
  const int gate_rows = hf.host_m >= 0 ? hf.host_m : static_cast<int>(hf.x.shape[0]);
  gate->run(hf.x, w.gate, Tensor(hf.logits, DType::kFP32, {hf.x.shape[0], cfg.num_experts}), gate_rows, s);
}

moe::RouterArgs MoELayer::Impl::router_args(Half& hf) const {
  const int E = cfg.num_experts, K = cfg.topk;
  moe::RouterArgs ra;
  ra.logits = Tensor(hf.logits, DType::kFP32, {hf.x.shape[0], E});
  ra.bias = cfg.router_mode == moe::RouterMode::kGroupedTopK ? w.gate_bias : Tensor();
  ra.num_tokens = hf.host_m;
  ra.num_tokens_device = hf.host_m >= 0 ? nullptr : hf.dev_m;
  ra.num_tokens_out = hf.m_used;
  ra.topk_idx = Tensor(hf.idx, DType::kInt32, {hf.x.shape[0], K});
  ra.topk_weights = Tensor(hf.topw, DType::kFP32, {hf.x.shape[0], K});
  ra.error = err.device();
  return ra;
}

void MoELayer::Impl::router_step(Half& hf, cudaStream_t s) { moe::route(rcfg, router_args(hf), s); }

void MoELayer::Impl::quant_step(Half& hf, cudaStream_t s) {
  const int H = cfg.hidden;
  moe::ActQuantArgs qa;
  qa.x = hf.x;
  qa.out = Tensor(hf.xq, DType::kFP8E4M3, {hf.x.shape[0], H});
  qa.scale = Tensor(hf.xs, DType::kFP32, {hf.x.shape[0], H / 128});
  qa.ue8m0 = cfg.ue8m0_scales;
  qa.num_tokens_device = hf.m_used;
  qa.error = err.device();
  moe::quantize_activations(qa, s);
}

// m for dispatch and combine: the batch's own when it gave one on the host (the router used exactly
// that m, m_used holds the same), so that the communication knows the call's size at launch (at
// W = 1 the one-path decode kernels, kernels::local_fused_dispatch); else the router's m_used.
void MoELayer::Impl::set_tokens(const Half& hf, int& host_m, const int32_t*& dev_m) {
  if (hf.host_m >= 0) {
    host_m = hf.host_m, dev_m = nullptr;
  } else {
    host_m = -1, dev_m = hf.m_used;
  }
}

DispatchArgs MoELayer::Impl::dispatch_args(const Half& hf) const {
  const int K = cfg.topk, H = cfg.hidden;
  const int64_t rows = hf.x.shape[0];
  DispatchArgs d;
  d.x = Tensor(hf.xq, DType::kFP8E4M3, {rows, H});
  d.x_scale = Tensor(hf.xs, DType::kFP32, {rows, H / 128});
  d.topk_idx = Tensor(hf.idx, DType::kInt32, {rows, K});
  set_tokens(hf, d.num_tokens, d.num_tokens_device);
  d.expert_x = expert_tensor(hf, hf.ex, DType::kFP8E4M3, H);
  d.expert_x_scale = expert_tensor(hf, hf.exs, DType::kFP32, H / 128);
  d.expert_num_tokens = Tensor(hf.cnt, DType::kInt32, {L});
  if (cfg.layout == ExpertLayout::kPacked) d.expert_offsets = Tensor(hf.offs, DType::kInt32, {L + 1});
  if (acfg.weights_at_dispatch) d.topk_weights = Tensor(hf.topw, DType::kFP32, {rows, K});
  return d;
}

CombineArgs MoELayer::Impl::combine_args(const Half& hf) const {
  const int K = cfg.topk, H = cfg.hidden;
  const int64_t rows = hf.x.shape[0];
  CombineArgs c;
  c.expert_y = expert_tensor(hf, hf.ey, DType::kBF16, H);
  c.topk_idx = Tensor(hf.idx, DType::kInt32, {rows, K});
  if (!acfg.weights_at_dispatch) c.topk_weights = Tensor(hf.topw, DType::kFP32, {rows, K});
  set_tokens(hf, c.num_tokens, c.num_tokens_device);
  c.out = hf.out;
  return c;
}

void MoELayer::Impl::dispatch(Half& hf, bool send, bool recv, cudaStream_t s) {
  const DispatchArgs d = dispatch_args(hf);
  if (send && recv) hf.a2a->dispatch(d, s);
  else if (send) hf.a2a->dispatch_send(d, s);
  else hf.a2a->dispatch_recv(d, s);
}

void MoELayer::Impl::combine(Half& hf, bool send, bool recv, cudaStream_t s) {
  const CombineArgs c = combine_args(hf);
  if (send && recv) hf.a2a->combine(c, s);
  else if (send) hf.a2a->combine_send(c, s);
  else hf.a2a->combine_recv(c, s);
}

void MoELayer::Impl::experts(Half& hf, cudaStream_t s) {
  gemm13_step(hf, s);
  silu_step(hf, s);
  gemm2_step(hf, s);
}

void MoELayer::Impl::gemm13_step(Half& hf, cudaStream_t s) {
  const int I = cfg.intermediate, H = cfg.hidden;
  moe::GroupedGemmArgs g;
  g.a = expert_tensor(hf, hf.ex, DType::kFP8E4M3, H);
  g.a_scale = expert_tensor(hf, hf.exs, DType::kFP32, H / 128);
  g.b = w.w13, g.b_scale = w.w13_scale;
  g.d = expert_tensor(hf, hf.h, DType::kBF16, 2 * I);
  g.expert_num_tokens = counts(hf), g.expert_offsets = offsets(hf), g.error = err.device();
  gemm(kW13, hf.hint).run(g, s);
}

void MoELayer::Impl::silu_step(Half& hf, cudaStream_t s) {
  const int I = cfg.intermediate;
  moe::SiluMulQuantArgs a;
  a.layout = cfg.layout;
  a.in = expert_tensor(hf, hf.h, DType::kBF16, 2 * I);
  a.out = expert_tensor(hf, hf.act, DType::kFP8E4M3, I);
  a.scale = expert_tensor(hf, hf.acts, DType::kFP32, I / 128);
  a.expert_num_tokens = counts(hf), a.expert_offsets = offsets(hf), a.ue8m0 = cfg.ue8m0_scales, a.error = err.device();
  moe::silu_mul_quantize(a, s);
}

void MoELayer::Impl::gemm2_step(Half& hf, cudaStream_t s) {
  const int I = cfg.intermediate, H = cfg.hidden;
  moe::GroupedGemmArgs g;
  g.a = expert_tensor(hf, hf.act, DType::kFP8E4M3, I);
  g.a_scale = expert_tensor(hf, hf.acts, DType::kFP32, I / 128);
  g.b = w.w2, g.b_scale = w.w2_scale;
  g.d = expert_tensor(hf, hf.ey, DType::kBF16, H);
  g.expert_num_tokens = counts(hf), g.expert_offsets = offsets(hf), g.error = err.device();
  gemm(kW2, hf.hint).run(g, s);
}

void MoELayer::Impl::shared(Half& hf, cudaStream_t s) {
  if (cfg.num_shared_experts == 0) return;
  const int Is = shared_intermediate(cfg), H = cfg.hidden;
  const int64_t rows = hf.rows;  // the layer's buffers (the GEMM objects' shape), not this call's rows of x
  const Tensor cnt(hf.m_used, DType::kInt32, {1});
  auto w1 = [](const Tensor& t) {  // a one-expert view of a 2-D weight
    Tensor v = t;
    v.ndim = 3, v.shape[2] = t.shape[1], v.shape[1] = t.shape[0], v.shape[0] = 1;
    return v;
  };
  moe::GroupedGemmArgs g1;
  g1.a = Tensor(hf.xq, DType::kFP8E4M3, {1, rows, H});
  g1.a_scale = Tensor(hf.xs, DType::kFP32, {1, rows, H / 128});
  g1.b = w1(w.shared_w13), g1.b_scale = w1(w.shared_w13_scale);
  g1.d = Tensor(hf.sh, DType::kBF16, {1, rows, 2 * Is});
  g1.expert_num_tokens = cnt, g1.error = err.device();
  gemm(kShared13, hf.hint).run(g1, s);
  moe::SiluMulQuantArgs sa;
  sa.layout = ExpertLayout::kMasked;
  sa.in = g1.d;
  sa.out = Tensor(hf.sact, DType::kFP8E4M3, {1, rows, Is});
  sa.scale = Tensor(hf.sacts, DType::kFP32, {1, rows, Is / 128});
  sa.expert_num_tokens = cnt, sa.ue8m0 = cfg.ue8m0_scales, sa.error = err.device();
  moe::silu_mul_quantize(sa, s);
  moe::GroupedGemmArgs g2;
  g2.a = sa.out, g2.a_scale = sa.scale;
  g2.b = w1(w.shared_w2), g2.b_scale = w1(w.shared_w2_scale);
  g2.d = Tensor(hf.sy, DType::kBF16, {1, rows, H});
  g2.expert_num_tokens = cnt, g2.error = err.device();
  gemm(kShared2, hf.hint).run(g2, s);
}

void MoELayer::Impl::add_shared(Half& hf, cudaStream_t s) {
  if (cfg.num_shared_experts == 0) return;
  EPKIT_CUDA_CHECK(layer::launch_add_rows(hf.out.data, hf.sy, hf.m_used, static_cast<int>(hf.out.shape[0]), cfg.hidden, s));
}

void MoELayer::Impl::raise_if_failed(const char* call) {
  for (int h = 0; failure.empty() && h < halves; ++h) {
    if (!half[h].a2a->failed()) continue;
    try {
      half[h].a2a->check();  // raises the recorded timeout (phase, wait, peer)
      failure = "dispatch/combine object " + std::to_string(h) + " failed";
    } catch (const Error& e) {
      failure = e.what();
    }
  }
  EPKIT_CHECK(failure.empty(), call, ": this MoELayer is unusable after a device-side timeout of its dispatch/combine ",
              "and launches nothing (its peers are out of step; destroy it): ", failure);
}

void MoELayer::Impl::expect_stage(int h, int want, const char* call) {
  raise_if_failed(call);
  EPKIT_CHECK(begun, call, ": begin() must come first in every layer call");
  EPKIT_CHECK(h >= 0 && h < halves, call, ": half = ", h, " but schedule ", schedule_name(cfg.schedule), " has ",
              halves, " half(s)");
  static const char* names[] = {"stage_route", "stage_dispatch_send", "stage_experts", "stage_combine_recv"};
  EPKIT_CHECK(half[h].stage == want, call, "(", h, ") called out of order: the next stage of half ", h, " is ",
              names[half[h].stage]);
  half[h].stage = (want + 1) % 4;
}

MoELayer::MoELayer(const Communicator& comm, const MoELayerConfig& cfg, const MoELayerWeights& weights)
    : impl_(std::make_unique<Impl>()) {
  impl_->cfg = cfg;
  impl_->w = weights;
  impl_->build({}, true, &comm);
}

MoELayer::MoELayer(const MoELayerConfig& cfg, const MoELayerWeights& weights) : impl_(std::make_unique<Impl>()) {
  impl_->cfg = cfg;
  impl_->w = weights;
  impl_->build({}, true, nullptr);
}

MoELayer::MoELayer(const std::vector<AllToAll*>& a2a, const MoELayerConfig& cfg, const MoELayerWeights& weights)
    : impl_(std::make_unique<Impl>()) {
  impl_->cfg = cfg;
  impl_->w = weights;
  impl_->build(a2a, false, nullptr);
}

MoELayer::~MoELayer() = default;

const MoELayerConfig& MoELayer::config() const { return impl_->cfg; }
AllToAll& MoELayer::all_to_all(int h) {
  EPKIT_CHECK(h >= 0 && h < impl_->halves, "all_to_all: half = ", h, " out of range [0, ", impl_->halves, ")");
  return *impl_->half[h].a2a;
}
size_t MoELayer::workspace_bytes() const { return impl_->arena.bytes(); }

void MoELayer::begin(const MoEBatch& b, cudaStream_t s) {
  Impl& I = *impl_;
  const MoELayerConfig& c = I.cfg;
  I.raise_if_failed("forward/begin");
  for (int h = 0; h < I.halves; ++h)
    EPKIT_CHECK(!I.begun || I.half[h].stage == 0, "begin: half ", h, " of the previous call has not finished (next: stage ",
                I.half[h].stage, ")");
  EPKIT_CHECK(b.x.dtype == DType::kBF16 && b.x.ndim == 2 && b.x.shape[1] == c.hidden, "MoEBatch.x must be bf16 [rows, ",
              c.hidden, "], got ", dtype_name(b.x.dtype), " ", b.x.shape_str());
  EPKIT_CHECK(b.out.dtype == DType::kBF16 && b.out.ndim == 2 && b.out.shape[1] == c.hidden,
              "MoEBatch.out must be bf16 [rows, ", c.hidden, "], got ", dtype_name(b.out.dtype), " ", b.out.shape_str());
  const int64_t rows = std::min(b.x.shape[0], b.out.shape[0]);
  EPKIT_CHECK(rows <= c.max_tokens_per_rank, "MoEBatch: x and out have ", rows, " rows but max_tokens_per_rank = ",
              c.max_tokens_per_rank, " (a graph's bucket is the rows of x: give it at most M rows)");
  EPKIT_CHECK(b.x.data != nullptr || rows == 0, "MoEBatch.x is null");
  const bool host = b.num_tokens >= 0;
  EPKIT_CHECK(host != (b.num_tokens_device != nullptr), "MoEBatch: give num_tokens >= 0 or num_tokens_device, not ",
              host ? "both" : "neither");
  if (host)
    EPKIT_CHECK(b.num_tokens <= rows, "MoEBatch.num_tokens = ", b.num_tokens, " exceeds the rows of x and out (", rows, ")");
  const int elem = c.hidden * 2;
  auto rows_of = [&](const Tensor& t, int64_t r0, int64_t n) {
    Tensor v = t;
    v.data = static_cast<uint8_t*>(t.data) + r0 * elem;
    v.shape[0] = std::max<int64_t>(0, n);
    return v;
  };
  if (I.halves == 1) {
    Impl::Half& hf = I.half[0];
    hf.x = rows_of(b.x, 0, rows), hf.out = rows_of(b.out, 0, rows);
    hf.host_m = host ? b.num_tokens : -1;
    hf.dev_m = host ? nullptr : b.num_tokens_device;
    hf.hint = static_cast<int>(host ? b.num_tokens : c.expected_tokens > 0 ? std::min<int64_t>(c.expected_tokens, rows) : rows);
  } else {
    // Half 0 takes the first ceil(n / 2) rows and half 1 the rest, n = m on the host, or the rows of
    // x (the graph's bucket) with a device m, split on the device: the halves' addresses stay fixed,
    // so one graph serves every m up to the bucket.
    const int64_t n = host ? b.num_tokens : rows;
    const int64_t sp = (n + 1) / 2;
    for (int h = 0; h < 2; ++h) {
      Impl::Half& hf = I.half[h];
      const int64_t first = h == 0 ? 0 : sp;
      const int64_t cnt = std::min<int64_t>(h == 0 ? sp : rows - sp, I.split);  // each half holds <= ceil(M/2)
      hf.x = rows_of(b.x, first, cnt), hf.out = rows_of(b.out, first, cnt);
      if (host) {
        hf.host_m = static_cast<int>(h == 0 ? sp : b.num_tokens - sp);
        hf.dev_m = nullptr;
        hf.hint = std::max(1, hf.host_m);
      } else {
        hf.host_m = -1;
        hf.dev_m = I.m_split + h;
        const int64_t want = c.expected_tokens > 0 ? std::min<int64_t>((c.expected_tokens + 1) / 2, cnt) : cnt;
        hf.hint = static_cast<int>(std::max<int64_t>(1, want));
      }
    }
    if (!host)
      EPKIT_CUDA_CHECK(layer::launch_split_tokens(b.num_tokens_device, static_cast<int>(sp), static_cast<int>(rows),
                                                  I.m_split, I.err.device(), s));
  }
  for (int h = 0; h < I.halves; ++h) I.half[h].stage = 0;
  I.begun = true;
}

void MoELayer::stage_route(int h, cudaStream_t s) {
  impl_->expect_stage(h, 0, "stage_route");
  impl_->route(impl_->half[h], s);
}
void MoELayer::stage_dispatch_send(int h, cudaStream_t s) {
  impl_->expect_stage(h, 1, "stage_dispatch_send");
  impl_->dispatch(impl_->half[h], true, false, s);
  impl_->shared(impl_->half[h], s);
}
void MoELayer::stage_experts(int h, cudaStream_t s) {
  impl_->expect_stage(h, 2, "stage_experts");
  impl_->dispatch(impl_->half[h], false, true, s);
  impl_->experts(impl_->half[h], s);
  impl_->combine(impl_->half[h], true, false, s);
}
void MoELayer::stage_combine_recv(int h, cudaStream_t s) {
  impl_->expect_stage(h, 3, "stage_combine_recv");
  impl_->combine(impl_->half[h], false, true, s);
  impl_->add_shared(impl_->half[h], s);
}

void MoELayer::forward(const MoEBatch& b, cudaStream_t s) {
  Impl& I = *impl_;
  begin(b, s);
  switch (I.cfg.schedule) {
    case MoESchedule::kNone: {
      // Fused halves (one kernel each for dispatch and combine). The shared expert needs only the
      // quantized x and m: on its own branch it streams its weights while the routed path waits on
      // its chain of small kernels (a few SMs each), instead of adding its time after combine. Its
      // kernels never wait on anything, so the routed kernels that need every block resident get
      // their SMs back as soon as its tiles finish (no deadlock, only delay).
      Impl::Half& hf = I.half[0];
      I.route(hf, s);
      if (I.side) {
        EPKIT_CUDA_CHECK(cudaEventRecord(I.fork_ev, s));
        EPKIT_CUDA_CHECK(cudaStreamWaitEvent(I.side, I.fork_ev, 0));
        I.shared(hf, I.side);
        EPKIT_CUDA_CHECK(cudaEventRecord(I.join_ev, I.side));
      }
      I.dispatch(hf, true, true, s);
      I.experts(hf, s);
      I.combine(hf, true, true, s);
      if (I.side) {
        EPKIT_CUDA_CHECK(cudaStreamWaitEvent(s, I.join_ev, 0));
      } else {
        I.shared(hf, s);
      }
      I.add_shared(hf, s);
      break;
    }
    case MoESchedule::kDispatchOverlap:
      stage_route(0, s);
      stage_dispatch_send(0, s);
      stage_experts(0, s);
      stage_combine_recv(0, s);
      break;
    case MoESchedule::kMicrobatch:
      // MoE-only interleaving: each half's dispatch has the other half's routing to hide behind,
      // and each half's combine the other half's experts.
      stage_route(0, s);
      stage_dispatch_send(0, s);
      stage_route(1, s);
      stage_dispatch_send(1, s);
      stage_experts(0, s);
      stage_experts(1, s);
      stage_combine_recv(0, s);
      stage_combine_recv(1, s);
      break;
  }
}

std::vector<MoELayer::Step> MoELayer::steps() {
  Impl& I = *impl_;
  EPKIT_CHECK(I.begun, "steps: run begin() or forward() first (the steps take its tensors and counts)");
  Impl::Half* hf = &I.half[0];
  Impl* p = &I;
  std::vector<Step> v;
  if (I.fused_gate(*hf)) {
    v.push_back({"gate_router", [p, hf](cudaStream_t s) { p->gate_router_step(*hf, s); }, false});
  } else {
    v.push_back({"gate", [p, hf](cudaStream_t s) { p->gate_step(*hf, s); }, false});
    v.push_back({"router", [p, hf](cudaStream_t s) { p->router_step(*hf, s); }, false});
  }
  std::vector<Step> rest = {
      {"quantize", [p, hf](cudaStream_t s) { p->quant_step(*hf, s); }, false},
      {"dispatch", [p, hf](cudaStream_t s) { p->dispatch(*hf, true, true, s); }, true},
      {"combine", [p, hf](cudaStream_t s) { p->combine(*hf, true, true, s); }, true},
      {"gemm_w13", [p, hf](cudaStream_t s) { p->gemm13_step(*hf, s); }, false},
      {"silu_mul_quantize", [p, hf](cudaStream_t s) { p->silu_step(*hf, s); }, false},
      {"gemm_w2", [p, hf](cudaStream_t s) { p->gemm2_step(*hf, s); }, false}};
  v.insert(v.end(), rest.begin(), rest.end());
  if (I.cfg.num_shared_experts > 0) {
    v.push_back({"shared_expert", [p, hf](cudaStream_t s) { p->shared(*hf, s); }, false});
    v.push_back({"add_shared", [p, hf](cudaStream_t s) { p->add_shared(*hf, s); }, false});
  }
  return v;
}

MoELayer::Routing MoELayer::routing(int h) {
  Impl& I = *impl_;
  EPKIT_CHECK(h >= 0 && h < I.halves, "routing: half = ", h, " out of range [0, ", I.halves, ")");
  const Impl::Half& hf = I.half[h];
  const int64_t rows = hf.rows;
  return Routing{Tensor(hf.logits, DType::kFP32, {rows, I.cfg.num_experts}),
                 Tensor(hf.idx, DType::kInt32, {rows, I.cfg.topk}), Tensor(hf.topw, DType::kFP32, {rows, I.cfg.topk})};
}

std::vector<int> MoELayer::expert_counts(int h) {
  Impl& I = *impl_;
  EPKIT_CHECK(h >= 0 && h < I.halves, "expert_counts: half = ", h, " out of range [0, ", I.halves, ")");
  std::vector<int> v(I.L);
  EPKIT_CUDA_CHECK(cudaDeviceSynchronize());
  EPKIT_CUDA_CHECK(cudaMemcpy(v.data(), I.half[h].cnt, v.size() * sizeof(int), cudaMemcpyDeviceToHost));
  return v;
}

void MoELayer::check() {
  Impl& I = *impl_;
  for (int h = 0; h < I.halves; ++h) I.half[h].a2a->check();
  I.err.check();
}

}  // namespace epkit
