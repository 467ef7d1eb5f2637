#include "kernels_bench.hpp"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include "epkit/error.hpp"
#include "epkit/moe/activation.hpp"
#include "epkit/moe/gate.hpp"
#include "epkit/moe/grouped_gemm.hpp"
#include "epkit/moe/quant.hpp"
#include "epkit/moe/router.hpp"

namespace epkit::moebench {

namespace {

constexpr int kHidden = 7168;   // DeepSeek-V3 H
constexpr int kInter = 2048;    // DeepSeek-V3 moe_intermediate_size I

// Rough time of a call, from its bytes at ~3 TB/s, to choose the repeat counts.
double est_us(double bytes, double flops = 0) { return std::max(bytes / 3e6, flops / 8e8) + 5; }

Row timed(Row r, const Ceilings& c, const L2Flush& f, cudaStream_t s, const std::function<void(int, cudaStream_t)>& call) {
  int calls = 0, replays = 0;
  pick_repeats(est_us(r.bytes, r.flops), calls, replays);
  const Timing t = time_graph(s, f, calls, replays, call);
  r.us_median = t.us_median, r.us_p99 = t.us_p99, r.calls = t.calls, r.replays = t.replays;
  finish_row(r, c.hbm_read_GBps, c.fp8_dense_TFLOPs);
  std::printf("  %-18s %-8s %-22s G=%-3d m=%-5d N=%-5d K=%-5d %9.2f us  %7.1f GB/s  %6.1f TFLOP/s  %5.1f%% of %s\n",
              r.kernel.c_str(), r.system.c_str(), r.variant.c_str(), r.G, r.m, r.N, r.K, r.us_median, r.GBps,
              r.TFLOPs, r.pct_of_ceiling, r.bound.c_str());
  std::fflush(stdout);
  return r;
}

}  // namespace

namespace {

// Rows of several systems on one point, timed in `rounds` rounds with the systems interleaved (the
// order reversed every other round): each row's median is the median of its rounds' medians, its
// note lists every round's.
std::vector<Row> timed_rounds(std::vector<Row> rs, int rounds, const Ceilings& c, const L2Flush& f, cudaStream_t s,
                              const std::vector<std::function<void(int, cudaStream_t)>>& calls) {
  if (rounds <= 1) {
    for (size_t i = 0; i < rs.size(); ++i) rs[i] = timed(rs[i], c, f, s, calls[i]);
    return rs;
  }
  std::vector<std::vector<Timing>> per(rs.size());
  for (int r = 0; r < rounds; ++r) {
    for (size_t n = 0; n < rs.size(); ++n) {
      const size_t i = r % 2 ? rs.size() - 1 - n : n;
      int nc = 0, nr = 0;
      pick_repeats(est_us(rs[i].bytes, rs[i].flops), nc, nr);
      per[i].push_back(time_graph(s, f, nc, nr, calls[i]));
    }
  }
  for (size_t i = 0; i < rs.size(); ++i) {
    std::vector<Timing> t = per[i];
    std::string note = "rounds (us):";
    for (const Timing& x : t) note += " " + std::to_string(x.us_median).substr(0, 6);
    std::sort(t.begin(), t.end(), [](const Timing& a, const Timing& b) { return a.us_median < b.us_median; });
    const Timing& mid = t[t.size() / 2];
    Row& r = rs[i];
    r.us_median = mid.us_median, r.us_p99 = mid.us_p99, r.calls = mid.calls, r.replays = mid.replays;
    r.note = r.note.empty() ? note : r.note + "; " + note;
    finish_row(r, c.hbm_read_GBps, c.fp8_dense_TFLOPs);
    std::printf("  %-18s %-8s %-34s m=%-5d %9.2f us  (%s)\n", r.kernel.c_str(), r.system.c_str(), r.variant.c_str(), r.m,
                r.us_median, note.c_str());
    std::fflush(stdout);
  }
  return rs;
}

moe::RouterKernel router_kernel_of(const std::string& name) {
  if (name == "general") return moe::RouterKernel::kGeneral;
  if (name == "warp_grouped") return moe::RouterKernel::kWarpGrouped;
  return moe::RouterKernel::kAuto;
}

// The router's arguments for rotation set `set` of m tokens: fp32 logits [m, E] and outputs [m, K]
// at set * (m * E) / set * (m * K) in their buffers; the bias (grouped mode) is shared by the sets.
moe::RouterArgs router_args(const Buffer& logits, const Buffer* bias, const Buffer& idx, const Buffer& weights,
                            int set, int m, int E, int K) {
  moe::RouterArgs a;
  a.logits = Tensor(logits.as<float>() + size_t(set) * m * E, DType::kFP32, {m, E});
  if (bias) a.bias = Tensor(bias->get(), DType::kFP32, {E});
  a.num_tokens = m;
  a.topk_idx = Tensor(idx.as<int32_t>() + size_t(set) * m * K, DType::kInt32, {m, K});
  a.topk_weights = Tensor(weights.as<float>() + size_t(set) * m * K, DType::kFP32, {m, K});
  return a;
}

}  // namespace

std::vector<Row> bench_router(const Options& o, const Ceilings& c, const L2Flush& f, cudaStream_t s) {
  std::vector<Row> rows;
  struct Mode { const char* name; moe::RouterConfig cfg; };
  moe::RouterConfig ds;
  ds.mode = moe::RouterMode::kGroupedTopK, ds.num_experts = 256, ds.topk = 8, ds.num_groups = 8, ds.topk_groups = 4,
  ds.routed_scaling = 2.5f;
  moe::RouterConfig mx;
  mx.mode = moe::RouterMode::kSoftmaxTopK, mx.num_experts = 8, mx.topk = 2, mx.renormalize = true;
  const Mode modes[] = {{"deepseek_grouped_topk", ds}, {"mixtral_softmax_topk", mx}};
  const std::vector<int> tokens = o.quick ? std::vector<int>{128, 4096} : std::vector<int>{1, 16, 128, 512, 4096, 16384};
  for (const Mode& md : modes) {
    const int E = md.cfg.num_experts, K = md.cfg.topk;
    const bool grouped = md.cfg.mode == moe::RouterMode::kGroupedTopK;
    // The softmax router has one kernel; the grouped router is timed with each kernel asked for.
    const std::vector<std::string> kernels = grouped ? o.router_kernels : std::vector<std::string>{"auto"};
    for (int m : tokens) {
      const size_t in_bytes = size_t(m) * E * 4 + E * 4, out_bytes = size_t(m) * K * 8;
      const int sets = rotation_sets(in_bytes, f.l2_bytes(), 20);
      Buffer logits(size_t(m) * E * 4 * sets), bias(E * 4), idx(size_t(m) * K * 4 * sets), w(size_t(m) * K * 4 * sets);
      fill_uniform(logits.get(), DType::kFP32, size_t(m) * E * sets, 17 + m, -4.f, 4.f, s);
      fill_uniform(bias.get(), DType::kFP32, E, 3, -0.1f, 0.1f, s);
      std::vector<Row> rs;
      std::vector<std::function<void(int, cudaStream_t)>> calls;
      for (const std::string& kname : kernels) {
        moe::RouterConfig cfg = md.cfg;
        cfg.kernel = router_kernel_of(kname);
        auto args = [&, m, E, K, sets](int i) {
          return router_args(logits, grouped ? &bias : nullptr, idx, w, i % sets, m, E, K);
        };
        Row r;
        r.kernel = "router", r.system = "epkit", r.G = 1, r.m = m, r.N = E, r.K = K;
        r.variant = std::string(md.name) + (kname == "auto" ? "" : " " + kname);
        r.bytes = static_cast<double>(in_bytes + out_bytes);
        r.note = std::string("kernel ") + moe::router_kernel_name(moe::choose_router_kernel(cfg, args(0)));
        rs.push_back(r);
        calls.push_back([cfg, args](int i, cudaStream_t st) { moe::route(cfg, args(i), st); });
      }
      for (Row& r : timed_rounds(rs, o.rounds, c, f, s, calls)) rows.push_back(r);
    }
  }
  return rows;
}

// The routed chain's first two steps at decode sizes, DeepSeek-V3 (H 7168, E 256, grouped top-8):
// the gate GEMM (cuBLASLt) then the router, as two launches, against GateRouter (one launch).
// "separate general" is the chain with the general router kernel (what the layer ran before the
// warp kernel). All rows of one m are timed in interleaved rounds (--rounds).
std::vector<Row> bench_gate_router(const Options& o, const Ceilings& c, const L2Flush& f, cudaStream_t s) {
  std::vector<Row> rows;
  constexpr int H = kHidden, E = 256, K = 8;
  moe::RouterConfig ds;
  ds.mode = moe::RouterMode::kGroupedTopK, ds.num_experts = E, ds.topk = K, ds.num_groups = 8, ds.topk_groups = 4,
  ds.routed_scaling = 2.5f;
  moe::RouterConfig general = ds;
  general.kernel = moe::RouterKernel::kGeneral;
  const std::vector<int> tokens = o.quick ? std::vector<int>{1, 32} : std::vector<int>{1, 2, 4, 8, 16, 32};
  moe::GateProjection gate(H, E, moe::kGateRouterMaxTokens);
  moe::GateRouter fused(H, ds, moe::kGateRouterMaxTokens);
  for (int m : tokens) {
    const size_t w_bytes = size_t(E) * H * 2, x_bytes = size_t(m) * H * 2, out_bytes = size_t(m) * (E * 4 + K * 8);
    const int sets = rotation_sets(w_bytes + x_bytes + out_bytes, f.l2_bytes(), 20);
    Buffer x(x_bytes * sets), w(w_bytes * sets), bias(E * 4), logits(size_t(m) * E * 4 * sets),
        idx(size_t(m) * K * 4 * sets), tw(size_t(m) * K * 4 * sets);
    fill_uniform(x.get(), DType::kBF16, size_t(m) * H * sets, 31 + m, -2.f, 2.f, s);
    fill_uniform(w.get(), DType::kBF16, size_t(E) * H * sets, 37, -0.05f, 0.05f, s);
    fill_uniform(bias.get(), DType::kFP32, E, 3, -0.1f, 0.1f, s);
    auto tx = [&, m](int set) { return Tensor(x.as<uint8_t>() + size_t(set) * x_bytes, DType::kBF16, {m, H}); };
    auto tw_ = [&](int set) { return Tensor(w.as<uint8_t>() + size_t(set) * w_bytes, DType::kBF16, {E, H}); };
    auto ra = [&, m](int set) { return router_args(logits, &bias, idx, tw, set, m, E, K); };
    Row base;
    base.kernel = "gate_router", base.system = "epkit", base.G = 1, base.m = m, base.N = E, base.K = H;
    base.bytes = static_cast<double>(w_bytes + x_bytes + out_bytes);
    base.weight_bytes = static_cast<double>(w_bytes);
    base.flops = 2.0 * m * E * H;
    std::vector<Row> rs;
    std::vector<std::function<void(int, cudaStream_t)>> calls;
    Row r = base;
    for (const moe::RouterConfig* rc : {&ds, &general}) {
      const bool warp = rc == &ds;
      r.variant = warp ? "separate" : "separate general";
      r.note = warp ? "cuBLASLt gate, then route() (warp_grouped)" : "cuBLASLt gate, then route() (general)";
      rs.push_back(r);
      calls.push_back([&, m, rc](int i, cudaStream_t st) {
        const int set = i % sets;
        const moe::RouterArgs a = ra(set);
        gate.run(tx(set), tw_(set), a.logits, m, st);
        moe::route(*rc, a, st);
      });
    }
    r.variant = "fused", r.note = "GateRouter: one launch";
    rs.push_back(r);
    calls.push_back([&](int i, cudaStream_t st) {
      const int set = i % sets;
      fused.run(tx(set), tw_(set), ra(set), st);
    });
    for (Row& x_ : timed_rounds(rs, o.rounds, c, f, s, calls)) rows.push_back(x_);
  }
  return rows;
}

std::vector<Row> bench_quantize(const Options& o, const Ceilings& c, const L2Flush& f, cudaStream_t s) {
  std::vector<Row> rows;
  const std::vector<int> tokens = o.quick ? std::vector<int>{128, 4096} : std::vector<int>{1, 16, 128, 512, 4096, 16384};
  const int H = kHidden, S = (H + 127) / 128;
  for (bool ue8m0 : {false, true}) {
    for (int m : tokens) {
      const size_t in_b = size_t(m) * H * 2, out_b = size_t(m) * H + size_t(m) * S * 4;
      const int sets = rotation_sets(in_b + out_b, f.l2_bytes(), 20);
      Buffer x(in_b * sets), q(size_t(m) * H * sets), sc(size_t(m) * S * 4 * sets);
      fill_uniform(x.get(), DType::kBF16, size_t(m) * H * sets, 5 + m, -3.f, 3.f, s);
      Row r;
      r.kernel = "quantize", r.system = "epkit", r.variant = ue8m0 ? "activations_ue8m0" : "activations", r.G = 1,
      r.m = m, r.N = H;
      r.bytes = static_cast<double>(in_b + out_b);
      rows.push_back(timed(r, c, f, s, [&](int i, cudaStream_t st) {
        const int set = i % sets;
        moe::ActQuantArgs a;
        a.x = Tensor(x.as<uint8_t>() + size_t(set) * in_b, DType::kBF16, {m, H});
        a.out = Tensor(q.as<uint8_t>() + size_t(set) * m * H, DType::kFP8E4M3, {m, H});
        a.scale = Tensor(sc.as<float>() + size_t(set) * m * S, DType::kFP32, {m, S});
        a.ue8m0 = ue8m0;
        a.num_tokens = m;
        moe::quantize_activations(a, st);
      }));
    }
  }
  return rows;
}

std::vector<Row> bench_silu_mul_quantize(const Options& o, const Ceilings& c, const L2Flush& f, cudaStream_t s) {
  std::vector<Row> rows;
  const int I = kInter;
  const std::vector<int> groups = o.quick ? std::vector<int>{32} : std::vector<int>{8, 32};
  for (int G : groups) {
    for (int m : o.m) {
      if (m == 0) continue;
      const int cap = m;
      const size_t in_b = size_t(G) * cap * 2 * I * 2, out_b = size_t(G) * cap * I + size_t(G) * cap * (I / 128) * 4;
      const int sets = rotation_sets(in_b + out_b, f.l2_bytes(), 20);
      if ((in_b + out_b) * sets > (size_t{24} << 30)) continue;
      Buffer in(in_b * sets), out(size_t(G) * cap * I * sets), sc(size_t(G) * cap * (I / 128) * 4 * sets),
          cnt(G * 4);
      fill_uniform(in.get(), DType::kBF16, size_t(G) * cap * 2 * I * sets, 9 + m, -4.f, 4.f, s);
      fill_int(cnt.as<int32_t>(), G, 1, m, 1, s);  // every expert full: m real rows
      Row r;
      r.kernel = "silu_mul_quantize", r.system = "epkit", r.variant = "masked", r.G = G, r.m = m, r.N = I;
      r.bytes = static_cast<double>(in_b + out_b);
      rows.push_back(timed(r, c, f, s, [&](int i, cudaStream_t st) {
        const int set = i % sets;
        moe::SiluMulQuantArgs a;
        a.layout = ExpertLayout::kMasked;
        a.in = Tensor(in.as<uint8_t>() + size_t(set) * in_b, DType::kBF16, {G, cap, 2 * I});
        a.out = Tensor(out.as<uint8_t>() + size_t(set) * G * cap * I, DType::kFP8E4M3, {G, cap, I});
        a.scale = Tensor(sc.as<float>() + size_t(set) * G * cap * (I / 128), DType::kFP32, {G, cap, I / 128});
        a.expert_num_tokens = Tensor(cnt.get(), DType::kInt32, {G});
        moe::silu_mul_quantize(a, st);
      }));
    }
  }
  return rows;
}

namespace {

// The operands of one grouped GEMM problem, `sets` times over (rotation), filled on the device.
struct GemmOperands {
  int G, rows, N, K, sets;
  Buffer a, as, b, bs, d, cnt;
  size_t a_elems, as_elems, b_elems, bs_elems, d_elems;
  GemmOperands(int G_, int rows_, int N_, int K_, int sets_, cudaStream_t s)
      : G(G_), rows(rows_), N(N_), K(K_), sets(sets_) {
    a_elems = size_t(G) * rows * K, as_elems = size_t(G) * rows * (K / 128);
    b_elems = size_t(G) * N * K, bs_elems = size_t(G) * ((N + 127) / 128) * (K / 128);
    d_elems = size_t(G) * rows * N;
    a = Buffer(a_elems * sets), as = Buffer(as_elems * 4 * sets), b = Buffer(b_elems * sets),
    bs = Buffer(bs_elems * 4 * sets), d = Buffer(d_elems * 2 * sets), cnt = Buffer(size_t(G) * 4);
    fill_uniform(a.get(), DType::kFP8E4M3, a_elems * sets, 101, -2.f, 2.f, s);
    fill_uniform(as.get(), DType::kFP32, as_elems * sets, 102, 0.01f, 0.02f, s);
    fill_uniform(b.get(), DType::kFP8E4M3, b_elems * sets, 103, -2.f, 2.f, s);
    fill_uniform(bs.get(), DType::kFP32, bs_elems * sets, 104, 0.01f, 0.02f, s);
  }
  moe::GroupedGemmArgs args(int set, const int32_t* counts) const {
    moe::GroupedGemmArgs x;
    x.a = Tensor(a.as<uint8_t>() + set * a_elems, DType::kFP8E4M3, {G, rows, K});
    x.a_scale = Tensor(as.as<float>() + set * as_elems, DType::kFP32, {G, rows, K / 128});
    x.b = Tensor(b.as<uint8_t>() + set * b_elems, DType::kFP8E4M3, {G, N, K});
    x.b_scale = Tensor(bs.as<float>() + set * bs_elems, DType::kFP32, {G, (N + 127) / 128, K / 128});
    x.d = Tensor(d.as<uint8_t>() + set * d_elems * 2, DType::kBF16, {G, rows, N});
    x.expert_num_tokens = Tensor(const_cast<int32_t*>(counts), DType::kInt32, {G});
    return x;
  }
  // The same memory as the expert-packed layout: R = G * rows rows, group g's rows from
  // offsets[g] (device [G + 1]).
  moe::GroupedGemmArgs packed_args(int set, const int32_t* counts, const int32_t* offsets) const {
    moe::GroupedGemmArgs x = args(set, counts);
    const int64_t R = int64_t(G) * rows;
    x.a = Tensor(x.a.data, DType::kFP8E4M3, {R, K});
    x.a_scale = Tensor(x.a_scale.data, DType::kFP32, {R, K / 128});
    x.d = Tensor(x.d.data, DType::kBF16, {R, N});
    x.expert_offsets = Tensor(const_cast<int32_t*>(offsets), DType::kInt32, {G + 1});
    return x;
  }
};

// Device [G + 1] offsets, the exclusive prefix of `counts` (rows back to back, no alignment), from a
// host vector; the last is the total.
void upload_offsets(int32_t* dst, const std::vector<int32_t>& counts, cudaStream_t s) {
  std::vector<int32_t> off(counts.size() + 1, 0);
  for (size_t g = 0; g < counts.size(); ++g) off[g + 1] = off[g] + counts[g];
  cuda_check(cudaMemcpyAsync(dst, off.data(), off.size() * 4, cudaMemcpyHostToDevice, s), "offsets");
  cuda_check(cudaStreamSynchronize(s), "offsets");
}

}  // namespace

std::vector<Row> bench_grouped_gemm(const Options& o, const Ceilings& c, const L2Flush& f, cudaStream_t s) {
  std::vector<Row> rows;
  const GemmShape shapes[] = {kDeepSeekUpGate, kDeepSeekDown};
  for (const GemmShape& sh : shapes) {
    for (int G : o.groups) {
      for (int m : o.m) {
        if (m == 0) continue;
        const int cap = m;
        const size_t wb = size_t(G) * sh.n * sh.k + size_t(G) * ((sh.n + 127) / 128) * (sh.k / 128) * 4;
        const size_t per_call = wb + size_t(G) * cap * sh.k + size_t(G) * cap * sh.n * 2;
        const int sets = rotation_sets(per_call, f.l2_bytes(), 20);
        if (per_call * sets > (size_t{60} << 30)) {
          std::printf("  grouped_gemm %s G=%d m=%d: skipped (%zu MB per set x %d sets)\n", sh.name, G, m, per_call >> 20, sets);
          continue;
        }
        GemmOperands ops(G, cap, sh.n, sh.k, sets, s);
        int32_t* even = ops.cnt.as<int32_t>();
        fill_int(even, G, 0, m, 1, s);
        moe::GroupedGemmShape gs;
        gs.num_groups = G, gs.n = sh.n, gs.k = sh.k, gs.layout = ExpertLayout::kMasked, gs.rows = cap, gs.expected_m = m;
        std::vector<moe::GemmConfig> cfgs = {moe::choose_gemm_config(gs)};
        if (o.sweep_configs) cfgs = moe::available_gemm_configs();
        for (const moe::GemmConfig& cfg : cfgs) {
          std::unique_ptr<moe::GroupedGemm> gemm;
          try {
            gemm = std::make_unique<moe::GroupedGemm>(gs, cfg);
          } catch (const Error& e) {
            std::printf("  grouped_gemm %s: config %s not usable here: %s\n", sh.name, moe::to_string(cfg).c_str(), e.what());
            continue;
          }
          Row r;
          r.kernel = "grouped_gemm", r.system = "epkit", r.G = G, r.m = m, r.N = sh.n, r.K = sh.k;
          r.variant = std::string(sh.name) + (o.sweep_configs ? " " + moe::to_string(cfg) : "");
          r.weight_bytes = static_cast<double>(wb);
          r.bytes = static_cast<double>(per_call);
          r.flops = 2.0 * G * double(m) * sh.n * sh.k;
          r.note = moe::to_string(gemm->config());
          rows.push_back(timed(r, c, f, s, [&](int i, cudaStream_t st) { gemm->run(ops.args(i % sets, even), st); }));
        }
        // The expert-packed layout over the same operands and counts (the packed layout's promise: within 5% of the
        // masked layout): the groups' rows back to back, offsets g * m, the same heuristic choice.
        if (!o.sweep_configs && m >= 16) {
          Buffer off((G + 1) * 4);
          upload_offsets(off.as<int32_t>(), std::vector<int32_t>(G, m), s);
          moe::GroupedGemmShape ps = gs;
          ps.layout = ExpertLayout::kPacked, ps.rows = G * cap;  // expected_m stays m
          moe::GroupedGemm gemm(ps);
          Row r;
          r.kernel = "grouped_gemm", r.system = "epkit", r.G = G, r.m = m, r.N = sh.n, r.K = sh.k;
          r.variant = std::string(sh.name) + " packed";
          r.weight_bytes = static_cast<double>(wb);
          r.bytes = static_cast<double>(per_call);
          r.flops = 2.0 * G * double(m) * sh.n * sh.k;
          r.note = "expert-packed rows, offsets g * m; " + moe::to_string(gemm.config());
          rows.push_back(timed(r, c, f, s, [&](int i, cudaStream_t st) {
            gemm.run(ops.packed_args(i % sets, even, off.as<int32_t>()), st);
          }));
        }
        // Uneven counts with the same total of real rows (G * m) as the even case (within
        // 10% of it): a quarter of the groups empty, the others alternating about 2m/3 and 2m rows,
        // over operands with capacity 2m.
        if (!o.sweep_configs && G >= 4 && m >= 3) {
          const std::vector<int32_t> h = uneven_counts(G, m);
          const int ucap = 2 * m;
          const size_t u_call = wb + size_t(G) * ucap * sh.k + size_t(G) * ucap * sh.n * 2;
          const int usets = rotation_sets(u_call, f.l2_bytes(), 20);
          if (u_call * usets > (size_t{60} << 30)) continue;
          GemmOperands uops(G, ucap, sh.n, sh.k, usets, s);
          int32_t* ucnt = uops.cnt.as<int32_t>();
          cuda_check(cudaMemcpyAsync(ucnt, h.data(), G * 4, cudaMemcpyHostToDevice, s), "counts");
          cuda_check(cudaStreamSynchronize(s), "counts");
          int active_groups = 0;
          for (int32_t v : h) active_groups += v > 0;
          moe::GroupedGemmShape ugs = gs;
          ugs.rows = ucap;  // expected_m stays m: the same heuristic choice as the even case
          moe::GroupedGemm gemm(ugs);
          Row r;
          r.kernel = "grouped_gemm", r.system = "epkit", r.G = G, r.m = m, r.N = sh.n, r.K = sh.k;
          r.variant = std::string(sh.name) + " uneven";
          r.weight_bytes = static_cast<double>(wb) * active_groups / G;
          r.bytes = r.weight_bytes + static_cast<double>(size_t(G) * m * sh.k + size_t(G) * m * sh.n * 2);
          r.flops = 2.0 * G * double(m) * sh.n * sh.k;
          r.note = std::to_string(G * m) + " real rows over " + std::to_string(active_groups) + " groups, capacity " +
                   std::to_string(ucap) + "; " + moe::to_string(gemm.config());
          rows.push_back(timed(r, c, f, s, [&](int i, cudaStream_t st) { gemm.run(uops.args(i % usets, ucnt), st); }));
          // The same uneven counts packed back to back (what dispatch's packed layout holds with
          // row alignment 1: groups start at any row).
          if (m >= 16) {
            Buffer uoff((G + 1) * 4);
            upload_offsets(uoff.as<int32_t>(), h, s);
            moe::GroupedGemmShape ps = gs;
            ps.layout = ExpertLayout::kPacked, ps.rows = G * ucap;
            moe::GroupedGemm pg(ps);
            Row pr = r;
            pr.variant = std::string(sh.name) + " packed uneven";
            pr.note = std::to_string(G * m) + " real rows over " + std::to_string(active_groups) +
                      " groups, packed back to back; " + moe::to_string(pg.config());
            rows.push_back(timed(pr, c, f, s, [&](int i, cudaStream_t st) {
              pg.run(uops.packed_args(i % usets, ucnt, uoff.as<int32_t>()), st);
            }));
          }
        }
      }
    }
  }
  return rows;
}

}  // namespace epkit::moebench
