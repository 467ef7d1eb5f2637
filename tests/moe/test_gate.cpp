// GPU tests of the gate projection (cuBLASLt) against a double-precision host GEMM of the same
// bf16 values, at DeepSeek and Mixtral shapes, several m, m = 0, and inside a captured graph; and
// of the fused gate + router (GateRouter): its logits against the same reference and bound, its
// routing bit for bit against the host router on the logits it wrote, m on the host and on the
// device (clamped and reported), replayed graphs (its arrival counter runs across launches).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "epkit/moe/gate.hpp"
#include "host_testing.hpp"
#include "moe_testing.hpp"
#include "reference/moe/numerics.hpp"
#include "reference/moe/reference.hpp"

namespace epkit::moe {
namespace {

using moe_test::case_seed;
using moe_test::DeviceArray;

struct GateCase {
  int H, E, rows;
  std::vector<uint16_t> x, w;
  DeviceArray<uint16_t> dx, dw;
  DeviceArray<float> dl;
  GateCase(int h, int e, int r, uint64_t seed) : H(h), E(e), rows(r), dl(static_cast<size_t>(r) * e) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    x.resize(static_cast<size_t>(rows) * H);
    w.resize(static_cast<size_t>(E) * H);
    for (auto& v : x) v = ref::float_to_bf16(nd(rng));
    for (auto& v : w) v = ref::float_to_bf16(0.02f * nd(rng));
    dx = DeviceArray<uint16_t>(x);
    dw = DeviceArray<uint16_t>(w);
  }
  Tensor tx() const { return Tensor(dx.get(), DType::kBF16, {rows, H}); }
  Tensor tw() const { return Tensor(dw.get(), DType::kBF16, {E, H}); }
  Tensor tl() const { return Tensor(dl.get(), DType::kFP32, {rows, E}); }

  // Each bf16 x bf16 product is exact in fp32; only the fp32 accumulation rounds, and its error is
  // at most H 2^-24 sum |x w| in any summation order (a worst-case bound: it cannot fail on a
  // correct GEMM, and a wrong row, column or transpose misses by O(sum |x w|)).
  std::vector<double> want, tol;  // [rows, E], computed once
  void reference() {
    want.assign(static_cast<size_t>(rows) * E, 0.0);
    tol.assign(want.size(), 0.0);
    std::vector<float> xf(x.size()), wf(w.size());
    for (size_t i = 0; i < x.size(); ++i) xf[i] = ref::bf16_to_float(x[i]);
    for (size_t i = 0; i < w.size(); ++i) wf[i] = ref::bf16_to_float(w[i]);
    for (int t = 0; t < rows; ++t)
      for (int e = 0; e < E; ++e) {
        const float* xr = &xf[static_cast<size_t>(t) * H];
        const float* wr = &wf[static_cast<size_t>(e) * H];
        double dot = 0, mag = 0;
        for (int h = 0; h < H; ++h) {
          const double p = static_cast<double>(xr[h]) * wr[h];
          dot += p, mag += std::fabs(p);
        }
        want[static_cast<size_t>(t) * E + e] = dot;
        tol[static_cast<size_t>(t) * E + e] = H * std::ldexp(1.0, -24) * mag + 1e-30;
      }
  }
  void expect_logits(int m) {
    if (want.empty()) reference();
    const std::vector<float> got = dl.download();
    int bad = 0;
    for (int t = 0; t < rows && bad < 8; ++t) {
      for (int e = 0; e < E; ++e) {
        const size_t o = static_cast<size_t>(t) * E + e;
        if (t >= m) {
          if (ref::float_to_bits(got[o]) != 0xffffffffu) ADD_FAILURE() << "row " << t << " >= m = " << m << " written", ++bad;
          continue;
        }
        if (!(std::fabs(got[o] - want[o]) <= tol[o]))
          ADD_FAILURE() << "m = " << m << " token " << t << " expert " << e << ": " << got[o] << " vs " << want[o]
                        << " (tol " << tol[o] << ")",
              ++bad;
      }
    }
  }
};

TEST(Gate, DeepSeekAndMixtralShapes) {
  struct Shape { int H, E, rows; };
  for (const Shape s : {Shape{7168, 256, 300}, Shape{4096, 8, 64}, Shape{2048, 64, 33}}) {
    GateCase gc(s.H, s.E, s.rows, case_seed(s.H + s.E));
    GateProjection gate(s.H, s.E, s.rows);
    for (int m : {1, 5, s.rows / 2, s.rows, 0}) {
      SCOPED_TRACE("H " + std::to_string(s.H) + " E " + std::to_string(s.E) + " m " + std::to_string(m));
      gc.dl.poison();
      gate.run(gc.tx(), gc.tw(), gc.tl(), m, nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      gc.expect_logits(m);
    }
  }
}

// Captures one run at m and replays it; `warm` runs once at that m before the capture, so that
// the capture sees only the cached algorithm (else the heuristic query happens during capture).
void captured_case(int m, bool warm, uint64_t seed) {
  GateCase gc(7168, 256, 128, seed);
  GateProjection gate(7168, 256, 128);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  if (warm) gate.run(gc.tx(), gc.tw(), gc.tl(), m, s);
  CUDA_OK(cudaStreamSynchronize(s));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  gate.run(gc.tx(), gc.tw(), gc.tl(), m, s);
  CUDA_OK(cudaStreamEndCapture(s, &g));
  CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
  for (int rep = 0; rep < 2; ++rep) {
    gc.dl.poison();
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaGraphLaunch(ge, s));
    CUDA_OK(cudaStreamSynchronize(s));
    gc.expect_logits(m);
  }
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
}

TEST(Gate, CapturedInAGraphAfterAWarmRun) { captured_case(128, true, case_seed(2)); }

TEST(Gate, FirstRunAtAnMInsideACapture) { captured_case(64, false, case_seed(3)); }

// ---- GateRouter ----

struct Routed {
  DeviceArray<int32_t> idx;
  DeviceArray<float> w;
  DeviceArray<float> bias;
  std::vector<float> hbias;
  Routed(int rows, const RouterConfig& c, uint64_t seed) : idx(static_cast<size_t>(rows) * c.topk),
                                                           w(static_cast<size_t>(rows) * c.topk) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, 0.05f);
    hbias.resize(c.num_experts);
    for (float& b : hbias) b = nd(rng);
    bias = DeviceArray<float>(hbias);
  }
  RouterArgs args(const GateCase& gc, const RouterConfig& c) const {
    RouterArgs a;
    a.logits = gc.tl();
    a.bias = Tensor(bias.get(), DType::kFP32, {c.num_experts});
    a.topk_idx = Tensor(idx.get(), DType::kInt32, {gc.rows, c.topk});
    a.topk_weights = Tensor(w.get(), DType::kFP32, {gc.rows, c.topk});
    return a;
  }
  void poison(GateCase& gc) { idx.poison(), w.poison(), gc.dl.poison(); }
  // Tokens [0, m) routed as the host router routes the logits the kernel wrote; rows >= m untouched.
  void expect(const GateCase& gc, const RouterConfig& c, int m, const std::string& what) const {
    const std::vector<float> logits = gc.dl.download();
    const std::vector<int32_t> gi = idx.download();
    const std::vector<float> gw = w.download();
    std::vector<int32_t> wi(static_cast<size_t>(m) * c.topk);
    std::vector<float> ww(wi.size());
    ref::route(c, m, logits.data(), hbias.data(), wi.data(), ww.data());
    int bad = 0;
    for (int t = 0; t < gc.rows && bad < 8; ++t)
      for (int k = 0; k < c.topk; ++k) {
        const size_t o = static_cast<size_t>(t) * c.topk + k;
        if (t >= m) {
          if (gi[o] != -1) ADD_FAILURE() << what << ": row " << t << " >= m written", ++bad;
          continue;
        }
        if (gi[o] != wi[o] || ref::float_to_bits(gw[o]) != ref::float_to_bits(ww[o]))
          ADD_FAILURE() << what << ": token " << t << " k " << k << ": expert " << gi[o] << " weight " << gw[o]
                        << ", want " << wi[o] << " weight " << ww[o],
              ++bad;
      }
  }
};

RouterConfig grouped(int E, int G, int keep, int K) {
  RouterConfig c = host_test::deepseek();
  c.num_experts = E, c.num_groups = G, c.topk_groups = keep, c.topk = K;
  return c;
}

TEST(GateRouter, LogitsWithinTheBoundAndRoutingExactOnThem) {
  struct Shape { int H; RouterConfig c; };
  for (const Shape& sh : {Shape{7168, grouped(256, 8, 4, 8)}, Shape{2048, grouped(128, 4, 2, 6)},
                          Shape{4096, grouped(512, 16, 4, 16)}, Shape{512, grouped(256, 1, 1, 8)}}) {
    const int rows = kGateRouterMaxTokens;
    GateCase gc(sh.H, sh.c.num_experts, rows, case_seed(sh.H + sh.c.num_experts));
    Routed r(rows, sh.c, case_seed(7 + sh.H));
    GateRouter gr(sh.H, sh.c, rows);
    for (int m : {1, 2, 7, 8, 9, 16, 17, 31, 32, 0}) {
      const std::string what = "H " + std::to_string(sh.H) + " E " + std::to_string(sh.c.num_experts) + " m " +
                               std::to_string(m);
      SCOPED_TRACE(what);
      r.poison(gc);
      RouterArgs a = r.args(gc, sh.c);
      a.num_tokens = m;
      gr.run(gc.tx(), gc.tw(), a, nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      gc.expect_logits(m);
      r.expect(gc, sh.c, m, what);
    }
  }
}

TEST(GateRouter, DeviceTokenCountClampedAndReported) {
  const RouterConfig c = grouped(256, 8, 4, 8);
  const int rows = 24;
  GateCase gc(7168, 256, rows, case_seed(20));
  Routed r(rows, c, case_seed(21));
  GateRouter gr(7168, c, kGateRouterMaxTokens);
  DeviceArray<int32_t> dm(1), used(1);
  ErrorRecord rec;
  for (int m : {0, 1, 13, 24, 25, -3}) {
    SCOPED_TRACE("device m = " + std::to_string(m));
    dm.upload({m});
    r.poison(gc);
    RouterArgs a = r.args(gc, c);
    a.num_tokens = -1, a.num_tokens_device = dm.get(), a.num_tokens_out = used.get(), a.error = rec.device();
    gr.run(gc.tx(), gc.tw(), a, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const int want = m < 0 ? 0 : (m > rows ? rows : m);
    EXPECT_EQ(used.download()[0], want);
    EXPECT_EQ(rec.pending(), m != want) << rec.message();
    rec.reset();
    gc.expect_logits(want);
    r.expect(gc, c, want, "device m");
  }
}

TEST(GateRouter, ReplayedGraphsAndChangingM) {
  const RouterConfig c = grouped(256, 8, 4, 8);
  const int rows = kGateRouterMaxTokens;
  GateCase gc(7168, 256, rows, case_seed(30));
  Routed r(rows, c, case_seed(31));
  GateRouter gr(7168, c, rows);
  DeviceArray<int32_t> dm(1);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  RouterArgs a = r.args(gc, c);
  a.num_tokens = -1, a.num_tokens_device = dm.get();
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  gr.run(gc.tx(), gc.tw(), a, s);
  gr.run(gc.tx(), gc.tw(), a, s);  // two launches in one graph: the counter's epochs follow each other
  CUDA_OK(cudaStreamEndCapture(s, &g));
  CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
  for (int m : {32, 1, 0, 17, 32, 5}) {
    SCOPED_TRACE("replay at m = " + std::to_string(m));
    dm.upload({m});
    r.poison(gc);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaGraphLaunch(ge, s));
    CUDA_OK(cudaStreamSynchronize(s));
    gc.expect_logits(m);
    r.expect(gc, c, m, "graph");
    // An eager run between replays, on the host m.
    r.poison(gc);
    RouterArgs h = r.args(gc, c);
    h.num_tokens = m;
    gr.run(gc.tx(), gc.tw(), h, s);
    CUDA_OK(cudaStreamSynchronize(s));
    gc.expect_logits(m);
    r.expect(gc, c, m, "eager");
  }
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace epkit::moe
