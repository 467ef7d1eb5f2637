// GPU tests of the fused SiLU-mul + FP8 quantization against the host reference, bytes and scales
// compared exactly: masked and packed layouts, DeepSeek's I = 2048 and widths that are not
// multiples of 512, some experts empty and some at capacity, every expert empty, counts above the
// capacity and packed ranges that do not fit (clamped or skipped, and reported), rows past the
// counts left untouched, and counts changed between replays of one captured graph.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "epkit/moe/activation.hpp"
#include "reference/moe/reference.hpp"
#include "moe_testing.hpp"
#include "reference/moe/numerics.hpp"

namespace epkit::moe {
namespace {

using moe_test::case_seed;
using moe_test::DeviceArray;

constexpr size_t kGuard = 4096;  // poisoned bytes after each output, checked after every launch

// Rows of [gate | up] bf16, each 128-block of a half one of: zero, normal(0, 3), magnitudes
// 2^U(-20, 20) of random sign, large (~1e15: h stays finite), tiny (~1e-20), all negative.
std::vector<uint16_t> random_rows(size_t rows, int I, std::mt19937_64& rng) {
  std::vector<uint16_t> v(rows * 2 * I);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::uniform_real_distribution<float> ex(-20.0f, 20.0f);
  for (size_t r = 0; r < rows; ++r) {
    for (int b = 0; b < 2 * I; b += 128) {
      const int kind = static_cast<int>(rng() % 6);
      for (int i = b; i < b + 128; ++i) {
        float x = 0.0f;
        switch (kind) {
          case 0: x = 0.0f; break;
          case 1: x = nd(rng); break;
          case 2: x = (rng() % 2 ? 1.0f : -1.0f) * std::exp2(ex(rng)); break;
          case 3: x = nd(rng) * 1e15f; break;
          case 4: x = nd(rng) * 1e-20f; break;
          case 5: x = -std::fabs(nd(rng)); break;
        }
        v[r * 2 * I + i] = ref::float_to_bf16(x);
      }
    }
  }
  return v;
}

struct Extent {
  int base, count;  // the tensor rows the kernel must write: [base, base + count)
};

struct SiluCase {
  ExpertLayout layout;
  int L, cap, R, I;
  std::vector<int32_t> counts, offsets;
  std::vector<uint16_t> in;
  DeviceArray<uint16_t> din;
  DeviceArray<uint8_t> dq;
  DeviceArray<float> ds;
  DeviceArray<int32_t> dcounts, doffsets;

  SiluCase(ExpertLayout lay, int l, int cap_or_r, int i, std::mt19937_64& rng)
      : layout(lay), L(l), cap(lay == ExpertLayout::kMasked ? cap_or_r : 0),
        R(lay == ExpertLayout::kPacked ? cap_or_r : 0), I(i) {
    in = random_rows(rows(), I, rng);
    din = DeviceArray<uint16_t>(in);
    dq = DeviceArray<uint8_t>(static_cast<size_t>(rows()) * I + kGuard);
    ds = DeviceArray<float>(static_cast<size_t>(rows()) * (I / 128) + kGuard / 4);
    dcounts = DeviceArray<int32_t>(L);
    doffsets = DeviceArray<int32_t>(L + 1);
  }
  bool masked() const { return layout == ExpertLayout::kMasked; }
  int rows() const { return masked() ? L * cap : R; }
  void set_counts(const std::vector<int32_t>& c, const std::vector<int32_t>& o = {}) {
    counts = c, offsets = o;
    dcounts.upload(counts);
    if (!masked()) doffsets.upload(offsets);
  }
  void new_inputs(std::mt19937_64& rng) {
    in = random_rows(rows(), I, rng);
    din.upload(in);
  }
  void poison() { dq.poison(), ds.poison(); }
  SiluMulQuantArgs args(bool ue8m0, DeviceErrorRecord* err) const {
    SiluMulQuantArgs a;
    a.layout = layout;
    if (masked()) {
      a.in = Tensor(din.get(), DType::kBF16, {L, cap, 2 * I});
      a.out = Tensor(dq.get(), DType::kFP8E4M3, {L, cap, I});
      a.scale = Tensor(ds.get(), DType::kFP32, {L, cap, I / 128});
    } else {
      a.in = Tensor(din.get(), DType::kBF16, {R, 2 * I});
      a.out = Tensor(dq.get(), DType::kFP8E4M3, {R, I});
      a.scale = Tensor(ds.get(), DType::kFP32, {R, I / 128});
      a.expert_offsets = Tensor(doffsets.get(), DType::kInt32, {L + 1});
    }
    a.expert_num_tokens = Tensor(dcounts.get(), DType::kInt32, {L});
    a.ue8m0 = ue8m0;
    a.error = err;
    return a;
  }
  // What the kernel computes: masked counts clamped to [0, cap]; packed experts that do not fit skipped.
  std::vector<Extent> extents() const {
    std::vector<Extent> x(L);
    for (int e = 0; e < L; ++e) {
      if (masked()) {
        x[e] = {e * cap, std::max(0, std::min(counts[e], cap))};
      } else {
        const int64_t end = static_cast<int64_t>(offsets[e]) + counts[e];
        const bool fits = offsets[e] >= 0 && counts[e] >= 0 && end <= std::min<int64_t>(offsets[e + 1], R);
        x[e] = {fits ? offsets[e] : 0, fits ? counts[e] : 0};
      }
    }
    return x;
  }
  void expect(bool ue8m0, const std::string& what) const {
    const int nb = I / 128;
    std::vector<char> real(rows(), 0);
    for (const Extent& x : extents())
      for (int r = x.base; r < x.base + x.count; ++r) real[r] = 1;
    const std::vector<uint8_t> q = dq.download();
    const std::vector<float> s = ds.download();
    std::vector<uint8_t> want_q(I);
    std::vector<float> want_s(nb);
    int bad = 0;
    for (int r = 0; r < rows() && bad < 8; ++r) {
      const uint8_t* qr = q.data() + static_cast<size_t>(r) * I;
      const float* sr = s.data() + static_cast<size_t>(r) * nb;
      if (!real[r]) {
        for (int i = 0; i < I; ++i)
          if (qr[i] != 0xff) {
            ADD_FAILURE() << what << ": row " << r << " is past its expert's count but was written", ++bad;
            break;
          }
        for (int b = 0; b < nb; ++b)
          if (ref::float_to_bits(sr[b]) != 0xffffffffu) {
            ADD_FAILURE() << what << ": scale of row " << r << " (past its count) was written", ++bad;
            break;
          }
        continue;
      }
      ref::silu_mul_quantize_row(I, in.data() + static_cast<size_t>(r) * 2 * I, ue8m0, want_q.data(), want_s.data());
      for (int b = 0; b < nb; ++b)
        if (ref::float_to_bits(sr[b]) != ref::float_to_bits(want_s[b]))
          ADD_FAILURE() << what << ": row " << r << " block " << b << " scale " << sr[b] << ", want " << want_s[b], ++bad;
      for (int i = 0; i < I && bad < 8; ++i)
        if (qr[i] != want_q[i])
          ADD_FAILURE() << what << ": row " << r << " col " << i << " code 0x" << std::hex << int(qr[i]) << ", want 0x"
                        << int(want_q[i]) << std::dec << " (g " << ref::bf16_to_float(in[(size_t)r * 2 * I + i])
                        << ", u " << ref::bf16_to_float(in[(size_t)r * 2 * I + I + i]) << ")",
              ++bad;
    }
    for (size_t i = static_cast<size_t>(rows()) * I; i < q.size(); ++i)
      if (q[i] != 0xff) {
        ADD_FAILURE() << what << ": output written past its end (byte " << i << ")";
        break;
      }
    for (size_t i = static_cast<size_t>(rows()) * nb; i < s.size(); ++i)
      if (ref::float_to_bits(s[i]) != 0xffffffffu) {
        ADD_FAILURE() << what << ": scale written past its end (element " << i << ")";
        break;
      }
  }
  void run_and_expect(bool ue8m0, ErrorRecord& rec, bool expect_violation, const std::string& what) {
    poison();
    silu_mul_quantize(args(ue8m0, rec.device()), nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    if (expect_violation) {
      EXPECT_TRUE(rec.pending()) << what << ": the violation was not reported";
    } else {
      EXPECT_FALSE(rec.pending()) << what << ": " << rec.message();
    }
    rec.reset();
    expect(ue8m0, what);
  }
};

// Counts in [0, cap] with every fourth expert empty and every fourth at capacity.
std::vector<int32_t> random_counts(int L, int cap, std::mt19937_64& rng) {
  std::vector<int32_t> c(L);
  for (int e = 0; e < L; ++e) {
    switch ((e + static_cast<int>(rng() % 4)) % 4) {
      case 0: c[e] = 0; break;
      case 1: c[e] = cap; break;
      default: c[e] = cap ? static_cast<int32_t>(rng() % (cap + 1)) : 0;
    }
  }
  return c;
}

// Packed offsets: each expert's rows padded up to a multiple of `align`, sometimes one spare
// block more; returns the rows used (offsets[L]).
std::vector<int32_t> packed_offsets(const std::vector<int32_t>& counts, int align, std::mt19937_64& rng) {
  std::vector<int32_t> o(counts.size() + 1, 0);
  for (size_t e = 0; e < counts.size(); ++e)
    o[e + 1] = o[e] + (counts[e] + align - 1) / align * align + (rng() % 3 == 0 ? align : 0);
  return o;
}

TEST(SiluMulQuant, MaskedDeepSeekAndOddWidths) {
  std::mt19937_64 rng(case_seed(1));
  struct Shape { int L, cap, I; };
  for (const Shape sh : {Shape{32, 64, 2048}, Shape{1, 5, 128}, Shape{3, 17, 384}, Shape{7, 9, 640}, Shape{4, 1, 2048}}) {
    SiluCase c(ExpertLayout::kMasked, sh.L, sh.cap, sh.I, rng);
    ErrorRecord rec;
    for (bool ue8m0 : {false, true}) {
      c.set_counts(random_counts(sh.L, sh.cap, rng));
      c.run_and_expect(ue8m0, rec, false,
                       "masked L " + std::to_string(sh.L) + " cap " + std::to_string(sh.cap) + " I " +
                           std::to_string(sh.I) + (ue8m0 ? " ue8m0" : ""));
    }
  }
}

TEST(SiluMulQuant, EveryExpertEmptyWritesNothing) {
  std::mt19937_64 rng(case_seed(2));
  ErrorRecord rec;
  SiluCase m(ExpertLayout::kMasked, 8, 16, 256, rng);
  m.set_counts(std::vector<int32_t>(8, 0));
  m.run_and_expect(false, rec, false, "masked, all empty");
  SiluCase p(ExpertLayout::kPacked, 8, 64, 256, rng);
  p.set_counts(std::vector<int32_t>(8, 0), std::vector<int32_t>(9, 0));
  p.run_and_expect(false, rec, false, "packed, all empty");
}

TEST(SiluMulQuant, Packed) {
  std::mt19937_64 rng(case_seed(3));
  ErrorRecord rec;
  for (int trial = 0; trial < 3; ++trial) {
    const int L = trial == 0 ? 32 : 3 + trial, I = trial == 2 ? 384 : 2048;
    const std::vector<int32_t> counts = random_counts(L, 40, rng);
    const std::vector<int32_t> offsets = packed_offsets(counts, 8, rng);
    SiluCase c(ExpertLayout::kPacked, L, offsets[L] + 13, I, rng);  // spare rows past offsets[L]
    c.set_counts(counts, offsets);
    c.run_and_expect(trial == 1, rec, false, "packed L " + std::to_string(L) + " I " + std::to_string(I));
  }
}

TEST(SiluMulQuant, CountsAboveCapacityAreClampedAndReported) {
  std::mt19937_64 rng(case_seed(4));
  ErrorRecord rec;
  SiluCase c(ExpertLayout::kMasked, 6, 12, 256, rng);
  c.set_counts({3, 12 + 5, 0, 1000000, -3, 12});
  c.poison();
  silu_mul_quantize(c.args(false, rec.device()), nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  ASSERT_TRUE(rec.pending()) << "count above capacity not reported";
  const std::string msg = rec.message();
  EXPECT_NE(msg.find("silu_mul_quantize"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expert_num_tokens["), std::string::npos) << msg;
  EXPECT_NE(msg.find("capacity 12"), std::string::npos) << msg;
  rec.reset();
  c.expect(false, "clamped counts");
}

TEST(SiluMulQuant, PackedRangesThatDoNotFitAreSkippedAndReported) {
  std::mt19937_64 rng(case_seed(5));
  ErrorRecord rec;
  // Expert 0 starts before row 0, expert 1 runs into expert 2's rows, expert 5 runs past R = 64.
  const std::vector<int32_t> counts = {5, 9, 4, 2, 10, 10};
  const std::vector<int32_t> offsets = {-8, 8, 16, 24, 32, 56, 70};
  SiluCase c(ExpertLayout::kPacked, 6, 64, 128, rng);
  c.set_counts(counts, offsets);
  const std::vector<Extent> x = c.extents();
  const int want[] = {0, 0, 4, 2, 10, 0};  // only the bad experts are skipped
  for (int e = 0; e < 6; ++e) EXPECT_EQ(x[e].count, want[e]) << "expert " << e;
  c.poison();
  silu_mul_quantize(c.args(false, rec.device()), nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  ASSERT_TRUE(rec.pending()) << "packed ranges out of bounds not reported";
  const std::string msg = rec.message();
  EXPECT_NE(msg.find("packed layout: group"), std::string::npos) << msg;
  EXPECT_NE(msg.find("skipped"), std::string::npos) << msg;
  c.expect(false, "packed ranges out of bounds");
  rec.reset();
}

TEST(SiluMulQuant, OneCapturedGraphWithCountsChangedBetweenReplays) {
  std::mt19937_64 rng(case_seed(6));
  ErrorRecord rec;
  SiluCase c(ExpertLayout::kMasked, 16, 32, 2048, rng);
  c.set_counts(random_counts(16, 32, rng));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  silu_mul_quantize(c.args(false, rec.device()), s);
  CUDA_OK(cudaStreamEndCapture(s, &g));
  CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
  for (int rep = 0; rep < 4; ++rep) {
    std::vector<int32_t> counts = random_counts(16, 32, rng);
    if (rep == 2) counts.assign(16, 0);
    if (rep == 3) counts.assign(16, 32);
    c.set_counts(counts);
    c.new_inputs(rng);
    c.poison();
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaGraphLaunch(ge, s));
    CUDA_OK(cudaStreamSynchronize(s));
    EXPECT_FALSE(rec.pending()) << rec.message();
    c.expect(false, "graph replay " + std::to_string(rep));
  }
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace epkit::moe
