#include "layer_bench.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "epkit/communicator.hpp"
#include "epkit/error.hpp"
#include "epkit/moe/gate.hpp"
#include "epkit/moe/quant.hpp"
#include "epkit/moe_layer.hpp"
#include "stats.hpp"

namespace epkit::moebench {

namespace {

constexpr int kH = 7168, kI = 2048, kTopK = 8;
std::vector<LayerRow> g_rows;

// Synthetic DeepSeek-V3-shaped weights for E local experts: bf16 random values quantised with the
// 128x128 quantizer (the path a user with a bf16 checkpoint takes), a bf16 gate and a small bias.
struct Weights {
  Buffer w13, w13s, w2, w2s, sw13, sw13s, sw2, sw2s, gate, bias;
  MoELayerWeights views;
  size_t expert_bytes = 0, shared_bytes = 0, gate_bytes = 0;  // fp8 + scales (gate: bf16)

  static size_t blocks(size_t n) { return (n + 127) / 128; }
  // Quantises [G, N, K] bf16 random weights into `q` / `s`, 16 experts at a time.
  static void make(Buffer& q, Buffer& s, int G, int N, int K, uint64_t seed, cudaStream_t st) {
    q = Buffer(size_t(G) * N * K);
    s = Buffer(size_t(G) * blocks(N) * blocks(K) * 4);
    const int chunk = std::min(G, 16);
    Buffer tmp(size_t(chunk) * N * K * 2);
    for (int g0 = 0; g0 < G; g0 += chunk) {
      const int n = std::min(chunk, G - g0);
      fill_uniform(tmp.get(), DType::kBF16, size_t(n) * N * K, seed + g0, -0.06f, 0.06f, st);
      moe::WeightQuantArgs a;
      a.w = Tensor(tmp.get(), DType::kBF16, {n, N, K});
      a.out = Tensor(q.as<uint8_t>() + size_t(g0) * N * K, DType::kFP8E4M3, {n, N, K});
      a.scale_inv = Tensor(s.as<float>() + size_t(g0) * blocks(N) * blocks(K), DType::kFP32,
                           {n, static_cast<int64_t>(blocks(N)), static_cast<int64_t>(blocks(K))});
      moe::quantize_weights(a, st);
    }
    cuda_check(cudaStreamSynchronize(st), "weight quantization");
  }

  Weights(int E, cudaStream_t st, int rank) {
    const uint64_t r = static_cast<uint64_t>(rank) << 20;
    make(w13, w13s, E, 2 * kI, kH, 1000 + r, st);
    make(w2, w2s, E, kH, kI, 2000 + r, st);
    make(sw13, sw13s, 1, 2 * kI, kH, 3000, st);
    make(sw2, sw2s, 1, kH, kI, 4000, st);
    gate = Buffer(size_t(E) * kH * 2);
    bias = Buffer(size_t(E) * 4);
    fill_uniform(gate.get(), DType::kBF16, size_t(E) * kH, 5000, -0.02f, 0.02f, st);
    fill_uniform(bias.get(), DType::kFP32, E, 6000, -0.05f, 0.05f, st);
    cuda_check(cudaStreamSynchronize(st), "gate weights");
    const int64_t b2I = blocks(2 * kI), bH = blocks(kH), bI = blocks(kI);
    views.w13 = Tensor(w13.get(), DType::kFP8E4M3, {E, 2 * kI, kH});
    views.w13_scale = Tensor(w13s.get(), DType::kFP32, {E, b2I, bH});
    views.w2 = Tensor(w2.get(), DType::kFP8E4M3, {E, kH, kI});
    views.w2_scale = Tensor(w2s.get(), DType::kFP32, {E, bH, bI});
    views.shared_w13 = Tensor(sw13.get(), DType::kFP8E4M3, {2 * kI, kH});
    views.shared_w13_scale = Tensor(sw13s.get(), DType::kFP32, {b2I, bH});
    views.shared_w2 = Tensor(sw2.get(), DType::kFP8E4M3, {kH, kI});
    views.shared_w2_scale = Tensor(sw2s.get(), DType::kFP32, {bH, bI});
    views.gate = Tensor(gate.get(), DType::kBF16, {E, kH});
    views.gate_bias = Tensor(bias.get(), DType::kFP32, {E});
    expert_bytes = size_t(3) * kI * kH + (b2I * bH + bH * bI) * 4;
    shared_bytes = expert_bytes;
    gate_bytes = size_t(E) * kH * 2;
  }
};

// E_local experts on each of the communicator's ranks (E_local * W routed experts in all).
MoELayerConfig deepseek_config(const Communicator& comm, int E_local, int max_tokens, MoESchedule sched,
                               ExpertLayout layout, bool shared_concurrent, bool fused_gate_router) {
  MoELayerConfig c;
  c.hidden = kH, c.intermediate = kI, c.num_experts = E_local * comm.world_size(), c.topk = kTopK;
  c.router_mode = moe::RouterMode::kGroupedTopK;
  c.num_groups = 8, c.topk_groups = 4, c.routed_scaling = 2.5f;
  c.num_shared_experts = 1, c.shared_intermediate = kI;
  c.world_size = comm.world_size(), c.rank = comm.rank(), c.dp_size = 1;
  c.max_tokens_per_rank = max_tokens;
  c.schedule = sched;
  c.layout = layout;
  c.shared_concurrent = shared_concurrent;
  c.fused_gate_router = fused_gate_router;
  return c;
}

// One forward, event-timed from the host (launches included), median over `n`.
Timing time_forward(MoELayer& layer, const MoEBatch& b, cudaStream_t s, int n) {
  cudaEvent_t a, e;
  cuda_check(cudaEventCreate(&a), "event");
  cuda_check(cudaEventCreate(&e), "event");
  std::vector<double> us;
  for (int i = -3; i < n; ++i) {
    cuda_check(cudaStreamSynchronize(s), "sync");
    cuda_check(cudaEventRecord(a, s), "event");
    layer.forward(b, s);
    cuda_check(cudaEventRecord(e, s), "event");
    cuda_check(cudaEventSynchronize(e), "forward");
    cuda_check(cudaGetLastError(), "forward (a launch)");
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, a, e), "forward: cudaEventElapsedTime");
    if (i >= 0) us.push_back(1000.0 * ms);
  }
  cudaEventDestroy(a), cudaEventDestroy(e);
  const bench::Summary sm = bench::summarize(us);
  return Timing{sm.median, sm.p99, sm.min, 1, n};
}

// The slowest rank's value (every rank gets it).
double slowest(const Communicator& comm, double v) {
  std::vector<double> all(comm.world_size());
  comm.allgather(&v, sizeof v, all.data());
  return *std::max_element(all.begin(), all.end());
}

bool g_rank0 = true;

}  // namespace

bool layer_rank0() { return g_rank0; }
const std::vector<LayerRow>& last_layer_rows() { return g_rows; }
std::function<void()> g_layer_checkpoint;
void set_layer_checkpoint(std::function<void()> f) { g_layer_checkpoint = std::move(f); }

std::vector<Row> bench_layer(const Options& o, const Ceilings& c, const L2Flush& f, cudaStream_t) {
  g_rows.clear();
  // Under epkit-run (WORLD_SIZE > 1) every rank holds `experts` of the E = experts * W experts; alone,
  // one rank holds them all. Each figure is the slowest rank's.
  const char* ws_env = std::getenv("WORLD_SIZE");
  const bool multi = ws_env && std::atoi(ws_env) > 1;
  Communicator comm = multi ? Communicator::from_env() : Communicator::from_unique_id(0, 1, make_unique_id());
  g_rank0 = comm.rank() == 0;
  const int W = comm.world_size();
  // Streams and events of the layer runs are made after NVSHMEM is up (it may make its own context
  // current): a stream made before it and events made after would not time together.
  cudaStream_t s = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "layer stream");
  const int max_b = *std::max_element(o.batches.begin(), o.batches.end());
  const int max_q = *std::max_element(o.query_lens.begin(), o.query_lens.end());
  const int M = std::max(2, max_b * max_q);
  Buffer x(size_t(M) * kH * 2), out(size_t(M) * kH * 2), mdev(4);
  fill_uniform(x.get(), DType::kBF16, size_t(M) * kH, 77 + 1000 * comm.rank(), -1.f, 1.f, s);
  for (int E : o.experts) {
    if (g_rank0)
      std::printf("== MoE layer, W = %d, %d experts per GPU (E = %d, DeepSeek-V3 shapes, one shared expert), M = %d\n",
                  W, E, E * W, M);
    const Weights w(E, s, comm.rank());
    // Every schedule in the layer's default layout (packed); schedule none also with the shared
    // expert in stream order and in the masked layout: the same-run A/B of each default.
    const ExpertLayout def = MoELayerConfig{}.layout;
    const ExpertLayout other = def == ExpertLayout::kPacked ? ExpertLayout::kMasked : ExpertLayout::kPacked;
    // Schedule none also without the fused gate + router (cuBLASLt's gate, then the router): the
    // same-run A/B of that default, at the batches where it applies (<= 32 tokens).
    const bool fused_def = MoELayerConfig{}.fused_gate_router;
    struct Variant { MoESchedule sched; ExpertLayout layout; bool concurrent; bool fused; };
    std::vector<Variant> variants;
    for (const std::string& sn : o.schedules) {
      const MoESchedule sc = parse_schedule(sn);
      variants.push_back({sc, def, true, fused_def});
      if (sc == MoESchedule::kNone) {
        variants.push_back({sc, def, false, fused_def});
        variants.push_back({sc, def, true, !fused_def});
      }
    }
    variants.push_back({MoESchedule::kNone, other, true, fused_def});
    for (const Variant& v : variants) {
      const MoELayerConfig lc = deepseek_config(comm, E, M, v.sched, v.layout, v.concurrent, v.fused);
      MoELayer layer(comm, lc, w.views);
      const std::string shared_mode =
          v.sched == MoESchedule::kNone && lc.shared_concurrent ? "concurrent" : "in_stream";
      for (int q : o.query_lens) {
        for (int b : o.batches) {
          const int T = b * q;
          if (v.sched == MoESchedule::kMicrobatch && T < 2) continue;
          // Where the fused kernel does not apply (or above its batch), on and off run the same kernels.
          const bool fusable = T <= moe::kGateRouterMaxTokens && gate_router_fits(lc, M);
          if (v.fused != fused_def && !fusable) continue;
          const bool fuses = v.fused && fusable;
          LayerRow r;
          r.schedule = schedule_name(v.sched), r.layout = layout_name(v.layout), r.shared = shared_mode;
          r.gate_router = fuses ? "fused" : "separate";
          r.world_size = W, r.experts = E, r.batch = b, r.query_len = q, r.tokens = T;
          MoEBatch batch;
          batch.x = Tensor(x.get(), DType::kBF16, {T, kH});
          batch.out = Tensor(out.get(), DType::kBF16, {T, kH});
          batch.num_tokens = T;
          const Timing ev = time_forward(layer, batch, s, 30);
          layer.check();
          r.us_median = slowest(comm, ev.us_median), r.us_p99 = slowest(comm, ev.us_p99);
          int calls = 0, replays = 0;
          pick_repeats(r.us_median, calls, replays);
          const Timing g = time_graph(s, f, calls, replays, [&](int, cudaStream_t st) { layer.forward(batch, st); });
          r.graph_us_median = slowest(comm, g.us_median), r.graph_us_p99 = slowest(comm, g.us_p99);
          // The experts with tokens in either half (the weights a forward must read at least once),
          // from the last forward.
          std::vector<int> counts = layer.expert_counts(0);
          if (v.sched == MoESchedule::kMicrobatch) {
            const std::vector<int> second = layer.expert_counts(1);
            for (size_t e = 0; e < counts.size(); ++e) counts[e] += second[e];
          }
          int touched = 0;
          for (int n : counts) touched += n > 0;
          touched = static_cast<int>(slowest(comm, touched));  // the rank that reads the most
          r.weight_bytes_touched = static_cast<double>(touched) * w.expert_bytes + w.shared_bytes + w.gate_bytes;
          r.weight_bound_us = r.weight_bytes_touched / (c.hbm_read_GBps * 1e3);
          // Breakdown: every kernel of the layer alone, in a graph, with this forward's arguments
          // (the same kernels whichever stream the shared expert takes: measured once).
          if (v.sched == MoESchedule::kNone && v.concurrent) {
            layer.forward(batch, s);
            const std::vector<MoELayer::Step> steps = layer.steps();
            for (size_t i = 0; i < steps.size(); ++i) {
              int sc = 0, sr = 0;
              pick_repeats(r.us_median / 4, sc, sr);
              if (steps[i].pair && i + 1 < steps.size()) {
                const PartsTiming pt = time_graph_parts(s, f, sc, sr, {steps[i].run, steps[i + 1].run});
                r.steps.push_back({steps[i].name, slowest(comm, pt.part_us_median[0])});
                r.steps.push_back({steps[i + 1].name, slowest(comm, pt.part_us_median[1])});
                ++i;
              } else {
                const Timing t = time_graph(s, f, sc, sr, [&](int, cudaStream_t st) { steps[i].run(st); });
                r.steps.push_back({steps[i].name, slowest(comm, t.us_median)});
              }
            }
            for (const LayerStep& st : r.steps) r.steps_us_sum += st.us_median;
            r.graph_over_steps = r.graph_us_median / r.steps_us_sum;
          }
          layer.check();
          if (g_rank0)
            std::printf("  %-16s %-6s %-10s E=%-3d batch=%-4d q=%d: forward %8.1f us, graph %8.1f us, kernels %8.1f us "
                      "(x%.2f), weights at HBM %8.1f us (%d experts touched)\n",
                      r.schedule.c_str(), r.layout.c_str(), r.shared.c_str(), E, b, q, r.us_median, r.graph_us_median, r.steps_us_sum,
                      r.graph_over_steps, r.weight_bound_us, touched);
          std::fflush(stdout);
          g_rows.push_back(r);
          if (g_layer_checkpoint && g_rank0) g_layer_checkpoint();  // the JSON so far, in case the run is cut short
        }
      }
      // One graph for every m through the device count: captured at the largest bucket (M rows),
      // replayed with m set on the device (one graph per bucket, or one for all sizes).
      if (v.layout == def && v.concurrent && v.fused == fused_def) {
        MoEBatch batch;
        batch.x = Tensor(x.get(), DType::kBF16, {M, kH});
        batch.out = Tensor(out.get(), DType::kBF16, {M, kH});
        batch.num_tokens_device = mdev.as<int32_t>();
        for (int q : o.query_lens)
          for (int b : o.batches) {
            const int T = b * q;
            if (v.sched == MoESchedule::kMicrobatch && T < 2) continue;
            cuda_check(cudaMemcpyAsync(mdev.get(), &T, 4, cudaMemcpyHostToDevice, s), "m");
            cuda_check(cudaStreamSynchronize(s), "m");
            int calls = 0, replays = 0;
            pick_repeats(200, calls, replays);
            const Timing g = time_graph(s, f, calls, replays, [&](int, cudaStream_t st) { layer.forward(batch, st); });
            layer.check();
            const double devm_us = slowest(comm, g.us_median);
            for (LayerRow& r : g_rows)
              if (r.experts == E && r.batch == b && r.query_len == q && r.schedule == schedule_name(v.sched) &&
                  r.layout == layout_name(v.layout) && r.shared == shared_mode &&
                  (r.tokens > moe::kGateRouterMaxTokens || r.gate_router == (fused_def ? "fused" : "separate")))
                r.note = "one graph for all m (device count, " + std::to_string(M) + "-row bucket): " +
                         std::to_string(devm_us) + " us";
          }
      }
    }
  }
  cudaStreamDestroy(s);
  return {};
}

}  // namespace epkit::moebench
