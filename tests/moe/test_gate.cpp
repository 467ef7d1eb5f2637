// GPU tests of the gate projection (cuBLASLt) against a double-precision host GEMM of the same
// bf16 values, at DeepSeek and Mixtral shapes, several m, m = 0, and inside a captured graph.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "epkit/moe/gate.hpp"
#include "moe_testing.hpp"
#include "reference/moe/numerics.hpp"

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

}  // namespace
}  // namespace epkit::moe
