// GPU tests of the FP8 block quantizers against the host reference, bytes and scales compared
// exactly: random values over a wide range of magnitudes with zero, huge, tiny and negative
// blocks, widths and tiles that are not multiples of 128 (or 512), m = 0, m from the device
// counter (clamped and reported above rows), and one captured graph replayed at several m.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "epkit/moe/quant.hpp"
#include "reference/moe/reference.hpp"
#include "moe_testing.hpp"
#include "reference/moe/numerics.hpp"

namespace epkit::moe {
namespace {

using moe_test::case_seed;
using moe_test::DeviceArray;

// bf16 values for `n` elements in blocks of `block` along rows of `width`: each block is one of
// zero, normal(0, 1), magnitudes 2^U(-30, 30) of random sign, huge (~1e30), tiny (~1e-30, some
// bf16 subnormal), or all negative, so that scales span the fp32 range.
std::vector<uint16_t> random_bf16(size_t rows, size_t width, std::mt19937_64& rng) {
  std::vector<uint16_t> v(rows * width);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ex(-30.0f, 30.0f);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t b = 0; b < width; b += 128) {
      const int kind = static_cast<int>(rng() % 6);
      for (size_t i = b; i < std::min(width, b + 128); ++i) {
        float x = 0.0f;
        switch (kind) {
          case 0: x = 0.0f; break;
          case 1: x = nd(rng); break;
          case 2: x = (rng() % 2 ? 1.0f : -1.0f) * std::exp2(ex(rng)); break;
          case 3: x = nd(rng) * 1e30f; break;
          case 4: x = nd(rng) * (rng() % 2 ? 1e-30f : 1e-39f); break;
          case 5: x = -std::fabs(nd(rng)) * 100.0f; break;
        }
        v[r * width + i] = ref::float_to_bf16(x);
      }
    }
  }
  return v;
}

template <typename T>
bool poisoned(const T& v) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(&v);
  for (size_t i = 0; i < sizeof(T); ++i)
    if (p[i] != 0xff) return false;
  return true;
}

struct ActCase {
  int rows, h;
  std::vector<uint16_t> x;
  DeviceArray<uint16_t> dx;
  DeviceArray<uint8_t> dq;
  DeviceArray<float> ds;
  ActCase(int r, int hh, std::mt19937_64& rng)
      : rows(r), h(hh), x(random_bf16(r, hh, rng)), dx(x), dq(static_cast<size_t>(r) * hh),
        ds(static_cast<size_t>(r) * num_scale_blocks(hh)) {}
  ActQuantArgs args(bool ue8m0) const {
    ActQuantArgs a;
    a.x = Tensor(dx.get(), DType::kBF16, {rows, h});
    a.out = Tensor(dq.get(), DType::kFP8E4M3, {rows, h});
    a.scale = Tensor(ds.get(), DType::kFP32, {rows, num_scale_blocks(h)});
    a.ue8m0 = ue8m0;
    return a;
  }
  void poison() { dq.poison(), ds.poison(); }
  void expect(int m, bool ue8m0, const std::string& what) const {
    const int nb = static_cast<int>(num_scale_blocks(h));
    std::vector<uint8_t> want_q(static_cast<size_t>(m) * h);
    std::vector<float> want_s(static_cast<size_t>(m) * nb);
    ref::quantize_activations(m, h, x.data(), ue8m0, want_q.data(), want_s.data());
    const std::vector<uint8_t> q = dq.download();
    const std::vector<float> s = ds.download();
    int bad = 0;
    for (int r = 0; r < rows && bad < 8; ++r) {
      for (int b = 0; b < nb && bad < 8; ++b) {
        const size_t so = static_cast<size_t>(r) * nb + b;
        if (r >= m) {
          if (!poisoned(s[so])) ADD_FAILURE() << what << ": scale of row " << r << " >= m written", ++bad;
        } else if (ref::float_to_bits(s[so]) != ref::float_to_bits(want_s[so])) {
          ADD_FAILURE() << what << ": row " << r << " block " << b << " scale " << s[so] << ", want " << want_s[so], ++bad;
        }
      }
      for (int i = 0; i < h && bad < 8; ++i) {
        const size_t o = static_cast<size_t>(r) * h + i;
        const uint8_t want = r < m ? want_q[o] : 0xff;
        if (q[o] != want)
          ADD_FAILURE() << what << ": row " << r << " col " << i << " code 0x" << std::hex << int(q[o]) << ", want 0x"
                        << int(want) << std::dec << " (x = " << ref::bf16_to_float(x[o]) << ")",
              ++bad;
      }
    }
  }
};

TEST(ActQuant, ShapesAndScaleModes) {
  struct Shape { int rows, h, m; };
  std::mt19937_64 rng(case_seed(1));
  for (const Shape s : {Shape{4096, 7168, 4096}, Shape{130, 7168, 129}, Shape{1, 16, 1}, Shape{37, 144, 37},
                        Shape{129, 2064, 100}, Shape{8, 512, 8}, Shape{33, 2048, 7}, Shape{5, 528, 0}}) {
    ActCase c(s.rows, s.h, rng);
    for (bool ue8m0 : {false, true}) {
      const std::string what = "rows " + std::to_string(s.rows) + " H " + std::to_string(s.h) + " m " +
                               std::to_string(s.m) + (ue8m0 ? " ue8m0" : "");
      c.poison();
      ActQuantArgs a = c.args(ue8m0);
      a.num_tokens = s.m;
      quantize_activations(a, nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      c.expect(s.m, ue8m0, what);
    }
  }
}

TEST(ActQuant, DeviceTokenCountClampedAndReported) {
  std::mt19937_64 rng(case_seed(2));
  ActCase c(200, 1040, rng);
  DeviceArray<int32_t> dm(1);
  ErrorRecord rec;
  ActQuantArgs a = c.args(false);
  a.num_tokens_device = dm.get();
  a.error = rec.device();
  for (int m : {0, 1, 199, 200}) {
    dm.upload({m});
    c.poison();
    quantize_activations(a, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_FALSE(rec.pending()) << rec.message();
    c.expect(m, false, "device m = " + std::to_string(m));
  }
  for (int m : {201, -1}) {
    dm.upload({m});
    c.poison();
    quantize_activations(a, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    ASSERT_TRUE(rec.pending()) << "device m = " << m << " not reported";
    const std::string msg = rec.message();
    EXPECT_NE(msg.find("quantize"), std::string::npos) << msg;
    EXPECT_NE(msg.find("m = " + std::to_string(m)), std::string::npos) << msg;
    EXPECT_NE(msg.find("200 rows"), std::string::npos) << msg;
    rec.reset();
    c.expect(m < 0 ? 0 : 200, false, "clamped device m = " + std::to_string(m));
  }
}

TEST(ActQuant, OneCapturedGraphServesEveryM) {
  std::mt19937_64 rng(case_seed(3));
  ActCase c(256, 7168, rng);
  DeviceArray<int32_t> dm(1);
  ActQuantArgs a = c.args(true);
  a.num_tokens_device = dm.get();
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  quantize_activations(a, s);
  CUDA_OK(cudaStreamEndCapture(s, &g));
  CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
  for (int m : {256, 1, 0, 100}) {
    c.x = random_bf16(c.rows, c.h, rng);
    c.dx.upload(c.x);
    dm.upload({m});
    c.poison();
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaGraphLaunch(ge, s));
    CUDA_OK(cudaStreamSynchronize(s));
    c.expect(m, true, "graph replay, m = " + std::to_string(m));
  }
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
}

// One weight case: G matrices of [N, K]; `misalign` shifts the output by one byte (the scalar path).
void weight_case(int G, int N, int K, bool three_d, bool ue8m0, bool misalign, uint64_t seed) {
  const std::string what = "G " + std::to_string(G) + " N " + std::to_string(N) + " K " + std::to_string(K) +
                           (ue8m0 ? " ue8m0" : "") + (misalign ? " misaligned" : "");
  std::mt19937_64 rng(seed);
  const size_t n = static_cast<size_t>(G) * N * K;
  const int nt = static_cast<int>(num_scale_blocks(N)), kt = static_cast<int>(num_scale_blocks(K));
  const std::vector<uint16_t> w = random_bf16(static_cast<size_t>(G) * N, K, rng);
  DeviceArray<uint16_t> dw(w);
  DeviceArray<uint8_t> dq(n + 2);  // one guard byte on each side of the output
  DeviceArray<float> ds(static_cast<size_t>(G) * nt * kt);
  dq.poison(), ds.poison();
  uint8_t* out = dq.get() + (misalign ? 1 : 0);
  WeightQuantArgs a;
  if (three_d) {
    a.w = Tensor(dw.get(), DType::kBF16, {G, N, K});
    a.out = Tensor(out, DType::kFP8E4M3, {G, N, K});
    a.scale_inv = Tensor(ds.get(), DType::kFP32, {G, nt, kt});
  } else {
    a.w = Tensor(dw.get(), DType::kBF16, {N, K});
    a.out = Tensor(out, DType::kFP8E4M3, {N, K});
    a.scale_inv = Tensor(ds.get(), DType::kFP32, {nt, kt});
  }
  a.ue8m0 = ue8m0;
  quantize_weights(a, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint8_t> q = dq.download();
  const std::vector<float> s = ds.download();
  const size_t base = misalign ? 1 : 0;
  EXPECT_EQ(q[misalign ? 0 : n], 0xff) << what << ": guard byte overwritten";
  if (misalign) EXPECT_EQ(q[n + 1], 0xff) << what << ": guard byte overwritten";
  std::vector<uint8_t> want_q(static_cast<size_t>(N) * K);
  std::vector<float> want_s(static_cast<size_t>(nt) * kt);
  int bad = 0;
  for (int g = 0; g < G && bad < 8; ++g) {
    ref::quantize_weights(N, K, w.data() + static_cast<size_t>(g) * N * K, ue8m0, want_q.data(), want_s.data());
    for (int t = 0; t < nt * kt && bad < 8; ++t) {
      const float got = s[static_cast<size_t>(g) * nt * kt + t];
      if (ref::float_to_bits(got) != ref::float_to_bits(want_s[t]))
        ADD_FAILURE() << what << ": matrix " << g << " tile " << t << " scale " << got << ", want " << want_s[t], ++bad;
    }
    for (size_t i = 0; i < want_q.size() && bad < 8; ++i) {
      const uint8_t got = q[base + static_cast<size_t>(g) * N * K + i];
      if (got != want_q[i])
        ADD_FAILURE() << what << ": matrix " << g << " element (" << i / K << ", " << i % K << ") code 0x" << std::hex
                      << int(got) << ", want 0x" << int(want_q[i]) << std::dec,
            ++bad;
    }
  }
}

TEST(WeightQuant, CheckpointShapesAndPartialTiles) {
  weight_case(1, 4096, 7168, true, false, false, case_seed(10));  // DeepSeek w13 of one expert
  weight_case(1, 7168, 2048, false, false, false, case_seed(11));  // w2
  weight_case(1, 576, 7168, false, true, false, case_seed(12));    // kv_a_proj: a partial row of tiles
  weight_case(3, 130, 136, true, false, false, case_seed(13));     // partial tiles both ways
  weight_case(2, 257, 300, true, true, false, case_seed(14));      // K % 8 != 0: the scalar path
  weight_case(1, 129, 131, false, false, false, case_seed(15));
  weight_case(2, 200, 256, true, false, true, case_seed(16));      // unaligned output: the scalar path
  weight_case(1, 1, 1, false, false, false, case_seed(17));
}

}  // namespace
}  // namespace epkit::moe
