// GPU tests of the grouped FP8 GEMM, for every compiled config, against the host reference.
//
// Tolerance. Inputs are exact e4m3 codes with fp32 block scales; the reference multiplies the same
// dequantised values in double. The kernel differs by (1) its accumulation: wgmma sums each 128-deep
// K block in the tensor core's reduced-precision fp32 (about 14 mantissa bits are kept on Hopper,
// DeepSeek-V3 report section 3.3.2), then promotes the block sum times sa * sb into a full fp32
// accumulator; and (2) the bf16 output rounding (8 significant bits: at most 2^-8 relative, about
// 1.5e-3 relative in RMS for random data). So:
// - per element: |y - r| <= 2^-7 |r| + 2^-10 sum_k |a_k b_k|  (the rounding with a factor 2 of margin, plus
//   16x a 2^-14 block-accumulation error measured against the magnitudes that were summed);
// - over a case: ||y - r||_F / ||r||_F <= 4e-3 (2.5x the rounding's 1.5e-3; a single wrong scale on one
//   of K/128 blocks moves it by ~sqrt(128 / K) >= 0.1).
// Every output element a run must not write is poisoned (0xffff, a bf16 NaN) and must stay so.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "epkit/error.hpp"
#include "epkit/moe/errors.hpp"
#include "epkit/moe/grouped_gemm.hpp"
#include "reference/moe/reference_gemm.hpp"
#include "moe_testing.hpp"
#include "reference/moe/numerics.hpp"

namespace epkit::moe {
namespace {

using moe_test::DeviceArray;

constexpr double kRelFrobenius = 4e-3;
constexpr uint16_t kPoison = 0xffff;

// Host inputs of one case, in the device layouts.
struct HostCase {
  GroupedGemmShape shape;
  std::vector<uint8_t> a, b;
  std::vector<float> a_scale, b_scale;
  std::vector<int32_t> counts, offsets;

  int64_t total_rows() const {
    return shape.layout == ExpertLayout::kMasked ? int64_t(shape.num_groups) * shape.rows : shape.rows;
  }
  ref::GroupedGemmOperands operands() const {
    return {shape.num_groups, shape.n, shape.k, shape.layout, shape.rows, a.data(), a_scale.data(), b.data(),
            b_scale.data(), counts.data(), offsets.empty() ? nullptr : offsets.data()};
  }
};

// Block-quantises N(0, 1) data whose spread differs per block (a factor 2^[-3, 3] x [0.5, 1)), so
// that a scale taken from the wrong block, row or group shows up. `block_rows` rows share a scale
// (1 for tokens, 128 for weights).
void quantize(std::mt19937_64& rng, int64_t rows, int K, int block_rows, std::vector<uint8_t>& q,
              std::vector<float>& s) {
  const int S = K / 128;
  const int64_t RB = (rows + block_rows - 1) / block_rows;
  q.assign(static_cast<size_t>(rows) * K, 0);
  s.assign(static_cast<size_t>(RB) * S, 0.0f);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> expo(-3, 3);
  std::uniform_real_distribution<float> frac(0.5f, 1.0f);
  std::vector<float> x(static_cast<size_t>(block_rows) * 128);
  for (int64_t rb = 0; rb < RB; ++rb) {
    const int64_t r0 = rb * block_rows, nr = std::min<int64_t>(block_rows, rows - r0);
    for (int kb = 0; kb < S; ++kb) {
      const float f = std::ldexp(frac(rng), expo(rng));
      float amax = 0;
      for (int64_t i = 0; i < nr * 128; ++i) amax = std::max(amax, std::fabs(x[i] = normal(rng) * f));
      const float scale = amax > 0 ? amax / ref::kE4M3Max : 1.0f;
      s[rb * S + kb] = scale;
      for (int64_t i = 0; i < nr; ++i)
        for (int j = 0; j < 128; ++j)
          q[(r0 + i) * K + kb * 128 + j] = ref::float_to_e4m3(x[i * 128 + j] / scale);
    }
  }
}

HostCase make_case(uint64_t seed, GroupedGemmShape shape, std::vector<int32_t> counts, std::vector<int32_t> offsets = {}) {
  std::mt19937_64 rng(seed);
  HostCase c;
  c.shape = shape;
  c.counts = std::move(counts);
  c.offsets = std::move(offsets);
  quantize(rng, c.total_rows(), shape.k, 1, c.a, c.a_scale);
  std::vector<uint8_t> bq;
  std::vector<float> bs;
  for (int g = 0; g < shape.num_groups; ++g) {  // per group, so that each group's n % 128 tail is its own block
    quantize(rng, shape.n, shape.k, 128, bq, bs);
    c.b.insert(c.b.end(), bq.begin(), bq.end());
    c.b_scale.insert(c.b_scale.end(), bs.begin(), bs.end());
  }
  return c;
}

// The case's device tensors; d is poisoned by prepare().
struct DeviceCase {
  DeviceArray<uint8_t> a, b;
  DeviceArray<float> a_scale, b_scale;
  DeviceArray<uint16_t> d;
  DeviceArray<int32_t> counts, offsets;

  explicit DeviceCase(const HostCase& c)
      : a(c.a), b(c.b), a_scale(c.a_scale), b_scale(c.b_scale), d(static_cast<size_t>(c.total_rows()) * c.shape.n),
        counts(c.counts), offsets(c.offsets) {}

  GroupedGemmArgs args(const GroupedGemmShape& s) const {
    const int64_t G = s.num_groups, N = s.n, K = s.k, R = s.rows, S = s.k / 128, NB = (s.n + 127) / 128;
    GroupedGemmArgs x;
    if (s.layout == ExpertLayout::kMasked) {
      x.a = {a.get(), DType::kFP8E4M3, {G, R, K}};
      x.a_scale = {a_scale.get(), DType::kFP32, {G, R, S}};
      x.d = {d.get(), DType::kBF16, {G, R, N}};
    } else {
      x.a = {a.get(), DType::kFP8E4M3, {R, K}};
      x.a_scale = {a_scale.get(), DType::kFP32, {R, S}};
      x.d = {d.get(), DType::kBF16, {R, N}};
      x.expert_offsets = {offsets.get(), DType::kInt32, {G + 1}};
    }
    x.b = {b.get(), DType::kFP8E4M3, {G, N, K}};
    x.b_scale = {b_scale.get(), DType::kFP32, {G, NB, S}};
    x.expert_num_tokens = {counts.get(), DType::kInt32, {G}};
    return x;
  }
};

// The reference output of a case and which rows of d it computes.
struct Reference {
  std::vector<float> out, out_abs;
  std::vector<char> computed;
};

Reference reference_of(const HostCase& c) {
  const ref::GroupedGemmOperands op = c.operands();
  Reference x;
  x.out.assign(static_cast<size_t>(c.total_rows()) * c.shape.n, NAN);
  x.out_abs.assign(x.out.size(), NAN);
  ref::grouped_gemm(op, x.out.data(), x.out_abs.data());
  x.computed.assign(c.total_rows(), 0);
  for (int g = 0; g < c.shape.num_groups; ++g) {
    const ref::GroupRows gr = ref::grouped_gemm_rows(op, g);
    for (int i = 0; i < gr.count; ++i) x.computed[gr.first_row + i] = 1;
  }
  return x;
}

// Compares a run's output with the reference: computed rows within tolerance, all others still poison.
void expect_matches_reference(const HostCase& c, const Reference& ref, const std::vector<uint16_t>& d,
                              const std::string& what) {
  const int N = c.shape.n;
  const int64_t rows = c.total_rows();
  const std::vector<float>& r = ref.out;
  const std::vector<float>& rabs = ref.out_abs;
  const std::vector<char>& computed = ref.computed;
  double err2 = 0, ref2 = 0;
  int64_t bad = 0, checked = 0;
  for (int64_t row = 0; row < rows; ++row) {
    for (int j = 0; j < N; ++j) {
      const size_t i = static_cast<size_t>(row) * N + j;
      if (!computed[row]) {
        if (d[i] != kPoison && bad++ < 5)
          ADD_FAILURE() << what << ": row " << row << " col " << j << " is not computed but was written (0x" << std::hex
                        << d[i] << std::dec << ")";
        continue;
      }
      ++checked;
      const double y = ref::bf16_to_float(d[i]), want = r[i];
      const double tol = std::ldexp(std::fabs(want), -7) + std::ldexp(static_cast<double>(rabs[i]), -10) + 1e-30;
      const double e = std::fabs(y - want);
      if (!(e <= tol) && bad++ < 5)
        ADD_FAILURE() << what << ": row " << row << " col " << j << ": got " << y << ", reference " << want
                      << " (|error| " << e << " > " << tol << ")";
      if (std::isfinite(y)) err2 += (y - want) * (y - want);
      else err2 = INFINITY;
      ref2 += want * want;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " bad elements";
  if (checked > 0 && ref2 > 0) {
    const double rel = std::sqrt(err2 / ref2);
    EXPECT_LE(rel, kRelFrobenius) << what << ": relative Frobenius error";
    std::printf("[grouped-gemm] %-60s rows %6lld  rel. Frobenius error %.2e\n", what.c_str(),
                static_cast<long long>(checked / N), rel);
  }
}

std::string label(const GemmConfig& cfg, const char* name) { return to_string(cfg) + " / " + name; }

// The configs under test: every compiled one, or those named by --gemm-config (each must exist).
std::vector<GemmConfig> configs_under_test() {
  const std::vector<GemmConfig> all = available_gemm_configs();
  const std::vector<std::string>& want = moe_test::gemm_config_filter();
  if (want.empty()) return all;
  std::vector<GemmConfig> v;
  for (const std::string& w : want) {
    bool found = false;
    for (const GemmConfig& c : all)
      if (to_string(c) == w) v.push_back(c), found = true;
    if (!found) throw Error("--gemm-config " + w + " is not a compiled config");
  }
  return v;
}

// One case through every compiled config, each on freshly poisoned output.
void run_all_configs(const char* name, const HostCase& c, ErrorRecord* err = nullptr, const char* expect_error = nullptr) {
  DeviceCase dev(c);
  const Reference ref = reference_of(c);
  for (const GemmConfig& cfg : configs_under_test()) {
    SCOPED_TRACE(label(cfg, name));
    GroupedGemm gemm(c.shape, cfg);
    dev.d.poison(0xff);
    GroupedGemmArgs args = dev.args(c.shape);
    if (err) args.error = err->device();
    CUDA_OK(cudaDeviceSynchronize());
    gemm.run(args, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    expect_matches_reference(c, ref, dev.d.download(), label(cfg, name));
    if (expect_error) {
      ASSERT_TRUE(err->pending()) << "no violation recorded";
      const std::string m = err->message();
      EXPECT_NE(m.find("grouped_gemm"), std::string::npos) << m;
      EXPECT_NE(m.find(expect_error), std::string::npos) << m;
      err->reset();
    } else if (err) {
      EXPECT_FALSE(err->pending()) << err->message();
    }
  }
}

GroupedGemmShape masked(int G, int n, int k, int rows) { return {G, n, k, ExpertLayout::kMasked, rows, 0}; }
GroupedGemmShape packed(int G, int n, int k, int R) { return {G, n, k, ExpertLayout::kPacked, R, 0}; }

TEST(GroupedGemm, EveryConfigBuildsAndTheDefaultIsTheHeuristics) {
  const GroupedGemmShape s = masked(8, 4096, 7168, 64);
  for (const GemmConfig& cfg : configs_under_test()) {
    GroupedGemm g(s, cfg);
    EXPECT_EQ(g.config(), cfg);
    EXPECT_GT(g.workspace_bytes(), 0u);
  }
  GroupedGemm g(s);
  EXPECT_EQ(g.config(), choose_gemm_config(s));
  GemmConfig missing{64, 64, 128, false, GemmSchedule::kPingpong, 1, 1};
  try {
    GroupedGemm x(s, missing);
    ADD_FAILURE() << "a config that is not compiled was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not compiled in"), std::string::npos) << e.what();
  }
}

// Token counts that are not tile multiples, 0 and rows (= capacity) among them, an odd number of
// feature tiles (the 1 x 2 cluster pads each group with an empty tile).
TEST(GroupedGemm, MaskedUnevenCounts) {
  run_all_configs("masked G=5 N=384 K=512", make_case(moe_test::case_seed(1), masked(5, 384, 512, 100), {0, 100, 1, 37, 77}));
}

TEST(GroupedGemm, FeaturesNotAMultipleOf128) {
  run_all_configs("masked N=200", make_case(moe_test::case_seed(2), masked(3, 200, 256, 70), {70, 5, 33}));
}

TEST(GroupedGemm, LongReduction) {
  run_all_configs("masked K=7168", make_case(moe_test::case_seed(3), masked(2, 256, 7168, 40), {40, 17}));
}

TEST(GroupedGemm, SingleGroup) {
  run_all_configs("masked G=1 rows=130", make_case(moe_test::case_seed(4), masked(1, 256, 384, 130), {130}));
}

// More tiles than SMs: every persistent CTA walks several tiles across groups (TMA descriptor
// updates between groups).
TEST(GroupedGemm, ManyTilesAcrossGroups) {
  std::mt19937_64 rng(moe_test::case_seed(5));
  std::vector<int32_t> counts(16);
  for (auto& c : counts) c = std::uniform_int_distribution<int>(0, 64)(rng);
  counts[3] = 0, counts[7] = 64, counts[11] = 0;
  run_all_configs("masked G=16 N=2048 many tiles", make_case(moe_test::case_seed(6), masked(16, 2048, 512, 64), counts));
}

// The tile scheduler looks for a tile's group 32 groups at a time (one per lane): more groups than
// that, with a run of more than 32 empty ones, and empty groups at the end.
TEST(GroupedGemm, MoreGroupsThanAWarpWithLongEmptyRuns) {
  std::mt19937_64 rng(moe_test::case_seed(18));
  std::vector<int32_t> counts(72, 0);
  for (int g = 40; g < 68; ++g) counts[g] = std::uniform_int_distribution<int>(0, 24)(rng);
  counts[0] = 24, counts[45] = 1;
  run_all_configs("masked G=72", make_case(moe_test::case_seed(19), masked(72, 128, 256, 24), counts));
}

TEST(GroupedGemm, PackedAlignedOffsets) {
  run_all_configs("packed offsets aligned to 64",
                  make_case(moe_test::case_seed(7), packed(4, 256, 512, 320), {50, 0, 129, 3}, {0, 64, 64, 256, 320}));
}

// Any offset works: the 16-byte alignment of every row comes from K % 128 and N % 8.
TEST(GroupedGemm, PackedUnalignedOffsetsAndSpareRows) {
  run_all_configs("packed unaligned offsets",
                  make_case(moe_test::case_seed(8), packed(4, 256, 512, 135), {7, 31, 0, 90}, {0, 9, 41, 41, 131}));
}

TEST(GroupedGemm, EveryGroupEmptyLeavesTheOutputUntouched) {
  run_all_configs("masked all empty", make_case(moe_test::case_seed(9), masked(4, 256, 256, 64), {0, 0, 0, 0}));
  run_all_configs("packed all empty",
                  make_case(moe_test::case_seed(10), packed(3, 256, 256, 64), {0, 0, 0}, {0, 10, 20, 64}));
}

TEST(GroupedGemm, CountAboveRowsIsClampedAndReported) {
  ErrorRecord err;
  run_all_configs("masked count > rows", make_case(moe_test::case_seed(11), masked(3, 256, 256, 48), {53, 3, 48}), &err,
                  "expert_num_tokens[0] = 53 exceeds the capacity 48");
  run_all_configs("masked count < 0", make_case(moe_test::case_seed(12), masked(2, 256, 256, 48), {5, -2}), &err,
                  "expert_num_tokens[1] = -2");
  run_all_configs("valid counts, no report", make_case(moe_test::case_seed(13), masked(2, 256, 256, 48), {5, 48}), &err);
}

TEST(GroupedGemm, PackedGroupPastItsRangeIsSkippedAndReported) {
  ErrorRecord err;
  // Group 0 would run into group 1's rows; group 2 would end past R.
  run_all_configs("packed overlapping group",
                  make_case(moe_test::case_seed(14), packed(3, 256, 256, 40), {12, 3, 2}, {0, 10, 20, 30}), &err,
                  "packed layout: group 0 ends at row 12");
  run_all_configs("packed group past R",
                  make_case(moe_test::case_seed(15), packed(2, 256, 256, 40), {12, 30}, {0, 20, 64}), &err,
                  "packed layout: group 1 ends at row 50 but the tensor has 40 rows");
}

// One captured graph, replayed with new counts (and offsets) written between replays: the shapes
// kernel reads them on the device, so each replay computes the new problem.
void replay_with_changing_counts(const GroupedGemmShape& shape, const std::vector<std::vector<int32_t>>& counts,
                                 const std::vector<std::vector<int32_t>>& offsets, uint64_t seed) {
  HostCase c = make_case(seed, shape, counts[0], offsets.empty() ? std::vector<int32_t>{} : offsets[0]);
  DeviceCase dev(c);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));  // blocking: ordered after the default-stream uploads and poison
  for (const GemmConfig& cfg : configs_under_test()) {
    SCOPED_TRACE(to_string(cfg));
    GroupedGemm gemm(shape, cfg);
    const GroupedGemmArgs args = dev.args(shape);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    gemm.run(args, stream);
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (size_t round = 0; round < counts.size(); ++round) {
      c.counts = counts[round];
      dev.counts.upload(c.counts);
      if (!offsets.empty()) {
        c.offsets = offsets[round];
        dev.offsets.upload(c.offsets);
      }
      dev.d.poison(0xff);
      CUDA_OK(cudaDeviceSynchronize());
      CUDA_OK(cudaGraphLaunch(exec, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      expect_matches_reference(c, reference_of(c), dev.d.download(),
                               to_string(cfg) + " / graph replay " + std::to_string(round) + " " + layout_name(shape.layout));
    }
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
  }
  CUDA_OK(cudaStreamDestroy(stream));
}

// Objects of one config built for different group counts, the larger first, then run in the order
// built (a MoE layer's routed GEMM and its shared expert): a later object must not break an earlier one
// (a per-kernel launch attribute set from the later, smaller shape once did).
TEST(GroupedGemm, ObjectsOfDifferentShapesRunAfterEachOther) {
  std::vector<int32_t> counts(72);
  for (int g = 0; g < 72; ++g) counts[g] = (g * 7) % 25;
  const HostCase big = make_case(moe_test::case_seed(31), masked(72, 256, 512, 24), counts);
  const HostCase small = make_case(moe_test::case_seed(32), masked(1, 384, 1024, 40), {33});
  DeviceCase dbig(big), dsmall(small);
  const Reference rbig = reference_of(big), rsmall = reference_of(small);
  for (const GemmConfig& cfg : configs_under_test()) {
    SCOPED_TRACE(label(cfg, "G=72 then G=1"));
    GroupedGemm gbig(big.shape, cfg);
    GroupedGemm gsmall(small.shape, cfg);
    dbig.d.poison(0xff);
    dsmall.d.poison(0xff);
    CUDA_OK(cudaDeviceSynchronize());
    gbig.run(dbig.args(big.shape), nullptr);
    gsmall.run(dsmall.args(small.shape), nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    expect_matches_reference(big, rbig, dbig.d.download(), label(cfg, "G=72"));
    expect_matches_reference(small, rsmall, dsmall.d.download(), label(cfg, "G=1"));
  }
}

TEST(GroupedGemm, GraphReplayWithChangingCounts) {
  replay_with_changing_counts(masked(4, 256, 256, 64), {{64, 0, 17, 33}, {0, 0, 0, 0}, {1, 64, 40, 0}}, {},
                              moe_test::case_seed(16));
  replay_with_changing_counts(packed(3, 256, 256, 96), {{20, 30, 40}, {0, 70, 5}, {96, 0, 0}},
                              {{0, 20, 50, 96}, {0, 0, 80, 96}, {0, 96, 96, 96}}, moe_test::case_seed(17));
}

}  // namespace
}  // namespace epkit::moe
