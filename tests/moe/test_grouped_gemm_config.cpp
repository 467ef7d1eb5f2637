// CPU side of the grouped GEMM: the compiled config list, the heuristic over the benchmark grid,
// shape and argument validation, and the host reference on hand-computed cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "epkit/error.hpp"
#include "epkit/moe/grouped_gemm.hpp"
#include "moe/gemm/stream_schedule.hpp"
#include "reference/moe/reference_gemm.hpp"
#include "host_testing.hpp"
#include "reference/moe/numerics.hpp"

namespace epkit::moe {
namespace {

using host_test::fake;

// Runs f and returns the epkit::Error message ("" if it did not throw).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_ERROR_HAS(stmt, ...)                                       \
  do {                                                                    \
    const std::string _m = error_of([&] { stmt; });                       \
    ASSERT_FALSE(_m.empty()) << #stmt << " did not throw";                \
    for (const char* _p : {__VA_ARGS__}) EXPECT_NE(_m.find(_p), std::string::npos) << "'" << _p << "' not in: " << _m; \
  } while (0)

TEST(GroupedGemmConfig, DefIdsAreTheirConfigsNames) {
  std::vector<std::pair<std::string, GemmConfig>> entries;
#define EPKIT_GEMM_CONFIG(id, swap, sched, tm, tn, cm, cn) \
  entries.push_back({#id, GemmConfig{tm, tn, 128, swap, GemmSchedule::sched, cm, cn}});
#define EPKIT_GEMM_OWN_CONFIG EPKIT_GEMM_CONFIG
#include "moe/gemm/gemm_configs.def"
  const std::vector<GemmConfig> avail = available_gemm_configs();
  ASSERT_EQ(entries.size(), avail.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    EXPECT_EQ(to_string(entries[i].second), entries[i].first);
    EXPECT_EQ(avail[i], entries[i].second);
    EXPECT_EQ(parse_gemm_config(entries[i].first), entries[i].second);
    for (size_t j = 0; j < i; ++j) EXPECT_NE(avail[i], avail[j]) << "duplicate config " << entries[i].first;
  }
}

TEST(GroupedGemmConfig, UnknownNameListsTheCompiledOnes) {
  EXPECT_ERROR_HAS(parse_gemm_config("pingpong_64x64x128_c1x1"), "pingpong_64x64x128_c1x1",
                   "swapab_pingpong_128x32x128_c1x1", "cooperative_128x128x128_c1x2");
}

bool is_available(const GemmConfig& c) {
  for (const GemmConfig& a : available_gemm_configs())
    if (a == c) return true;
  return false;
}

// Every shape of the MoE benchmark grid (epkit-moe kernels) gets a compiled config; decode sizes get swap-AB
// with a token tile that covers the group, large m the cooperative 128 x 128 tile.
TEST(GroupedGemmConfig, BenchmarkGridMapsToCompiledConfigs) {
  const std::pair<int, int> nk[] = {{4096, 7168}, {7168, 2048}};
  for (auto [n, k] : nk)
    for (int G : {1, 2, 8, 16, 32, 64})
      for (int m : {1, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096})
        for (ExpertLayout layout : {ExpertLayout::kMasked, ExpertLayout::kPacked}) {
          GroupedGemmShape s{G, n, k, layout, layout == ExpertLayout::kMasked ? m : G * m, 0};
          const GemmConfig c = choose_gemm_config(s);
          const std::string name = to_string(c);
          SCOPED_TRACE("G=" + std::to_string(G) + " m=" + std::to_string(m) + " n=" + std::to_string(n) + " " +
                       layout_name(layout) + " -> " + name);
          EXPECT_TRUE(is_available(c));
          EXPECT_EQ(parse_gemm_config(name), c);
          if (m <= 64) {
            EXPECT_TRUE(c.swap_ab);
            EXPECT_GE(c.token_tile(), m);  // one token tile per group: every weight byte read once
            if (m <= 32) {
              EXPECT_EQ(c.schedule, GemmSchedule::kStream);  // the own kernel: units of <= 64 rows from the counts
            } else {
              EXPECT_LT(c.token_tile(), 2 * m);
            }
          } else {
            EXPECT_FALSE(c.swap_ab);
            EXPECT_EQ(c.schedule, GemmSchedule::kCooperative);
            EXPECT_EQ(c.cluster_n, 2);  // 4096 / 128 and 7168 / 128 feature tiles are even
          }
          // A masked capacity above the expected m does not change the choice.
          GroupedGemmShape big = s;
          big.rows = 8 * s.rows;
          big.expected_m = m;
          EXPECT_EQ(choose_gemm_config(big), c);
        }
}

TEST(GroupedGemmConfig, OddFeatureTileCountAvoidsThePaddedCluster) {
  const GemmConfig c = choose_gemm_config({8, 384, 1024, ExpertLayout::kMasked, 512, 0});
  EXPECT_FALSE(c.swap_ab);
  EXPECT_EQ(c.cluster_n, 1);
  EXPECT_EQ(choose_gemm_config({8, 256, 1024, ExpertLayout::kMasked, 512, 0}).cluster_n, 2);
}

TEST(GroupedGemmConfig, PackedExpectsRowsPerGroup) {
  // R = 32 groups x 40 rows: 40 rows per group -> the 64-token tile, not R.
  const GemmConfig c = choose_gemm_config({32, 4096, 7168, ExpertLayout::kPacked, 32 * 40, 0});
  EXPECT_EQ(to_string(c), "swapab_pingpong_128x64x128_c1x1");
}

TEST(GroupedGemmConfig, ValidateNamesTheFieldAndTheLimit) {
  const GroupedGemmShape ok{8, 4096, 7168, ExpertLayout::kMasked, 64, 0};
  validate(ok);
  auto with = [&](auto f) {
    GroupedGemmShape s = ok;
    f(s);
    return s;
  };
  EXPECT_ERROR_HAS(validate(with([](auto& s) { s.num_groups = 0; })), "num_groups = 0", "[1, 1024]");
  EXPECT_ERROR_HAS(validate(with([](auto& s) { s.num_groups = 1025; })), "num_groups = 1025", "[1, 1024]");
  EXPECT_ERROR_HAS(validate(with([](auto& s) { s.n = 0; })), "n = 0", "multiple of 8");
  EXPECT_ERROR_HAS(validate(with([](auto& s) { s.n = 4100; })), "n = 4100", "multiple of 8");
  EXPECT_ERROR_HAS(validate(with([](auto& s) { s.k = 7000; })), "k = 7000", "multiple of 128");
  EXPECT_ERROR_HAS(validate(with([](auto& s) { s.k = 0; })), "k = 0", "multiple of 128");
  EXPECT_ERROR_HAS(validate(with([](auto& s) { s.rows = -1; })), "rows = -1", ">= 0");
  EXPECT_ERROR_HAS(validate(with([](auto& s) { s.expected_m = -4; })), "expected_m = -4", ">= 0");
  EXPECT_ERROR_HAS(validate(with([](auto& s) { s.layout = static_cast<ExpertLayout>(7); })), "layout code 7");
  EXPECT_ERROR_HAS(choose_gemm_config(with([](auto& s) { s.k = 100; })), "k = 100");
}

TEST(GroupedGemmConfig, TrafficFormulasSkipEmptyGroupsAndClampCounts) {
  const GroupedGemmShape s{4, 4096, 7168, ExpertLayout::kMasked, 64, 0};
  const int64_t per_group = 4096LL * 7168 + 32 * 56 * 4;
  EXPECT_EQ(grouped_gemm_weight_bytes(s, {1, 0, 64, -3}), 2 * per_group);
  EXPECT_EQ(grouped_gemm_flops(s, {1, 0, 100, -3}), 2.0 * 65 * 4096 * 7168);  // 100 clamped to rows = 64
  GroupedGemmShape p = s;
  p.layout = ExpertLayout::kPacked;
  p.rows = 1000;
  EXPECT_EQ(grouped_gemm_flops(p, {1, 0, 100, 3}), 2.0 * 104 * 4096 * 7168);
  EXPECT_ERROR_HAS(grouped_gemm_flops(s, {1, 2}), "2 counts for num_groups = 4");
}

// Fake, never dereferenced device addresses with chosen alignment.

struct ArgsCase {
  GroupedGemmShape shape;
  GroupedGemmArgs args;
};

ArgsCase valid_args(ExpertLayout layout) {
  const int G = 4, N = 256, K = 512, rows = 96, S = K / 128;
  ArgsCase c;
  c.shape = {G, N, K, layout, rows, 0};
  GroupedGemmArgs& a = c.args;
  if (layout == ExpertLayout::kMasked) {
    a.a = {fake(0x100000), DType::kFP8E4M3, {G, rows, K}};
    a.a_scale = {fake(0x200000), DType::kFP32, {G, rows, S}};
    a.d = {fake(0x300000), DType::kBF16, {G, rows, N}};
  } else {
    a.a = {fake(0x100000), DType::kFP8E4M3, {rows, K}};
    a.a_scale = {fake(0x200000), DType::kFP32, {rows, S}};
    a.d = {fake(0x300000), DType::kBF16, {rows, N}};
    a.expert_offsets = {fake(0x700000), DType::kInt32, {G + 1}};
  }
  a.b = {fake(0x400000), DType::kFP8E4M3, {G, N, K}};
  a.b_scale = {fake(0x500000), DType::kFP32, {G, 2, S}};
  a.expert_num_tokens = {fake(0x600000), DType::kInt32, {G}};
  return c;
}

TEST(GroupedGemmArgs, ValidArgsPass) {
  for (ExpertLayout l : {ExpertLayout::kMasked, ExpertLayout::kPacked}) {
    const ArgsCase c = valid_args(l);
    check_grouped_gemm_args(c.shape, c.args);
  }
}

TEST(GroupedGemmArgs, EachBadTensorIsNamedWithValueAndLimit) {
  auto bad = [](ExpertLayout l, auto f) {
    ArgsCase c = valid_args(l);
    f(c.args);
    return error_of([&] { check_grouped_gemm_args(c.shape, c.args); });
  };
  const ExpertLayout M = ExpertLayout::kMasked, P = ExpertLayout::kPacked;
  auto has = [](const std::string& m, std::initializer_list<const char*> parts) {
    EXPECT_FALSE(m.empty());
    for (const char* p : parts) EXPECT_NE(m.find(p), std::string::npos) << "'" << p << "' not in: " << m;
  };
  has(bad(M, [](auto& a) { a.a.dtype = DType::kBF16; }), {"a has dtype bf16", "expected fp8_e4m3"});
  has(bad(M, [](auto& a) { a.a.shape[1] = 95; }), {"a has shape [4, 95, 512]", "dim 1 is 95, expected 96"});
  has(bad(M, [](auto& a) { a.a.ndim = 2; }), {"a has shape", "expected 3 dims"});
  has(bad(M, [](auto& a) { a.a.data = fake(0x100008); }), {"a data pointer is not 16-byte aligned"});
  has(bad(M, [](auto& a) { a.a.data = nullptr; }), {"a is missing"});
  has(bad(M, [](auto& a) { a.a_scale.shape[2] = 3; }), {"a_scale", "dim 2 is 3, expected 4"});
  has(bad(M, [](auto& a) { a.a_scale.data = fake(0x200002); }), {"a_scale data pointer is not 4-byte aligned"});
  has(bad(M, [](auto& a) { a.b.shape[1] = 128; }), {"b has shape", "dim 1 is 128, expected 256"});
  has(bad(M, [](auto& a) { a.b.data = fake(0x400004); }), {"b data pointer is not 16-byte aligned"});
  has(bad(M, [](auto& a) { a.b_scale.shape[1] = 1; }), {"b_scale", "dim 1 is 1, expected 2"});
  has(bad(M, [](auto& a) { a.b_scale.dtype = DType::kBF16; }), {"b_scale has dtype bf16", "expected fp32"});
  has(bad(M, [](auto& a) { a.d.dtype = DType::kFP16; }), {"d has dtype fp16", "expected bf16"});
  has(bad(M, [](auto& a) { a.d.data = fake(0x300002); }), {"d data pointer is not 16-byte aligned"});
  has(bad(M, [](auto& a) { a.expert_num_tokens.shape[0] = 5; }), {"expert_num_tokens", "dim 0 is 5, expected 4"});
  has(bad(M, [](auto& a) { a.expert_num_tokens.dtype = DType::kInt64; }), {"expert_num_tokens has dtype int64"});
  has(bad(M, [](auto& a) { a.expert_num_tokens.data = nullptr; }), {"expert_num_tokens is missing"});
  has(bad(M, [](auto& a) { a.expert_offsets = {fake(0x700000), DType::kInt32, {5}}; }),
      {"expert_offsets is given but the layout is masked"});
  has(bad(P, [](auto& a) { a.expert_offsets = Tensor(); }), {"expert_offsets is missing"});
  has(bad(P, [](auto& a) { a.expert_offsets.shape[0] = 4; }), {"expert_offsets", "dim 0 is 4, expected 5"});
  has(bad(P, [](auto& a) { a.a = {fake(0x100000), DType::kFP8E4M3, {4, 96, 512}}; }), {"a has shape", "expected 2 dims"});
  has(bad(P, [](auto& a) { a.d.shape[0] = 97; }), {"d has shape [97, 256]", "dim 0 is 97, expected 96"});
}

TEST(GroupedGemmArgs, EmptyTensorsMayBeNull) {
  ArgsCase c = valid_args(ExpertLayout::kMasked);
  c.shape.rows = 0;
  c.args.a = {nullptr, DType::kFP8E4M3, {4, 0, 512}};
  c.args.a_scale = {nullptr, DType::kFP32, {4, 0, 4}};
  c.args.d = {nullptr, DType::kBF16, {4, 0, 256}};
  check_grouped_gemm_args(c.shape, c.args);
}

}  // namespace
}  // namespace epkit::moe

namespace epkit::ref {
namespace {

uint8_t q(float x) {
  const uint8_t c = float_to_e4m3(x);
  EXPECT_EQ(e4m3_to_float(c), x) << x << " is not exact in e4m3";
  return c;
}

// Two 128-blocks of K with different token and weight scales; the second row is past the count.
TEST(ReferenceGroupedGemm, BlockScalesMultiplyPerKBlock) {
  const int K = 256;
  std::vector<uint8_t> a(2 * K, q(1.0f)), b(K, q(2.0f));
  std::vector<float> as = {1.0f, 0.5f, 9.0f, 9.0f}, bs = {0.25f, 4.0f};
  std::vector<int32_t> counts = {1};
  GroupedGemmOperands op{1, 1, K, ExpertLayout::kMasked, 2, a.data(), as.data(), b.data(), bs.data(), counts.data(), nullptr};
  std::vector<float> out(2, -7.0f), abs_out(2, -7.0f);
  grouped_gemm(op, out.data(), abs_out.data());
  EXPECT_EQ(out[0], 128 * 1.0f * 0.5f + 128 * 0.5f * 8.0f);  // 64 + 512
  EXPECT_EQ(abs_out[0], 576.0f);
  EXPECT_EQ(out[1], -7.0f);  // row 1 >= count: untouched
  EXPECT_EQ(abs_out[1], -7.0f);
}

// N = 130: features 128 and 129 use the second 128-row weight scale block; signs cancel in out
// but not in out_abs.
TEST(ReferenceGroupedGemm, WeightScaleBlocksAlongN) {
  const int K = 128, N = 130;
  std::vector<uint8_t> a(K), b(static_cast<size_t>(N) * K, q(1.0f));
  for (int k = 0; k < K; ++k) a[k] = q(k % 2 ? -1.0f : 1.0f);
  b[0] = q(3.0f);  // feature 0, k 0: a = +1 there
  std::vector<float> as = {1.0f}, bs = {1.0f, 3.0f};
  std::vector<int32_t> counts = {1};
  GroupedGemmOperands op{1, N, K, ExpertLayout::kMasked, 1, a.data(), as.data(), b.data(), bs.data(), counts.data(), nullptr};
  std::vector<float> out(N), abs_out(N);
  grouped_gemm(op, out.data(), abs_out.data());
  EXPECT_EQ(out[0], 2.0f);
  EXPECT_EQ(abs_out[0], 130.0f);
  for (int j = 1; j < 128; ++j) EXPECT_EQ(out[j], 0.0f) << j;
  for (int j = 128; j < N; ++j) {
    EXPECT_EQ(out[j], 0.0f) << j;
    EXPECT_EQ(abs_out[j], 384.0f) << j;
  }
}

TEST(ReferenceGroupedGemm, MaskedCountsAreClampedToRows) {
  const int K = 128, rows = 2;
  std::vector<uint8_t> a(2 * rows * K), b(2 * K, q(1.0f));
  for (int r = 0; r < 2 * rows; ++r)
    for (int k = 0; k < K; ++k) a[r * K + k] = q(static_cast<float>(r + 1));
  std::vector<float> as(2 * rows, 1.0f), bs = {1.0f, 2.0f};
  std::vector<int32_t> counts = {5, -1};
  GroupedGemmOperands op{2, 1, K, ExpertLayout::kMasked, rows, a.data(), as.data(), b.data(), bs.data(), counts.data(), nullptr};
  EXPECT_TRUE(grouped_gemm_rows(op, 0).violation);
  EXPECT_EQ(grouped_gemm_rows(op, 0).count, rows);
  EXPECT_TRUE(grouped_gemm_rows(op, 1).violation);
  EXPECT_EQ(grouped_gemm_rows(op, 1).count, 0);
  std::vector<float> out(2 * rows, -7.0f);
  grouped_gemm(op, out.data());
  EXPECT_EQ(out, (std::vector<float>{128, 256, -7, -7}));
}

// Packed rows with a gap (row 2), a group that would run into the next group's rows (skipped) and
// one that ends exactly at R.
TEST(ReferenceGroupedGemm, PackedOffsetsGapsAndSkippedGroups) {
  const int K = 128, R = 6;
  std::vector<uint8_t> a(R * K), b(3 * K);
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < K; ++k) a[r * K + k] = q(static_cast<float>(r + 1));
  for (int g = 0; g < 3; ++g)
    for (int k = 0; k < K; ++k) b[g * K + k] = q(static_cast<float>(g + 1));
  std::vector<float> as(R, 1.0f), bs = {1.0f, 1.0f, 1.0f};
  std::vector<int32_t> offsets = {0, 3, 4, 6}, counts = {2, 2, 2};
  GroupedGemmOperands op{3, 1, K, ExpertLayout::kPacked, R, a.data(), as.data(), b.data(), bs.data(), counts.data(),
                         offsets.data()};
  EXPECT_FALSE(grouped_gemm_rows(op, 0).violation);
  EXPECT_TRUE(grouped_gemm_rows(op, 1).violation);  // 3 + 2 > offsets[2] = 4
  EXPECT_FALSE(grouped_gemm_rows(op, 2).violation);  // 4 + 2 = R
  std::vector<float> out(R, -7.0f);
  grouped_gemm(op, out.data());
  EXPECT_EQ(out, (std::vector<float>{128, 256, -7, -7, 5 * 128 * 3, 6 * 128 * 3}));
  offsets = {0, 3, 4, 7};  // the last group's limit is R, not offsets[G]
  counts = {2, 1, 3};
  EXPECT_TRUE(grouped_gemm_rows(op, 2).violation);
  offsets = {0, 3, 2, 6};  // decreasing offsets
  counts = {2, 0, 2};
  EXPECT_TRUE(grouped_gemm_rows(op, 1).violation);
  offsets = {-1, 3, 4, 6};
  EXPECT_TRUE(grouped_gemm_rows(op, 0).violation);
}

}  // namespace
}  // namespace epkit::ref

namespace epkit::moe {
namespace {

// The streaming kernel's work split (stream_schedule.hpp, the code the kernel runs): for random device
// counts, every (group, weight block, row, K block) of the groups with rows is computed by exactly one
// unit, no unit is empty, and K is split only when the unsplit units fill at most half the grid.
TEST(StreamGemmSchedule, UnitsCoverEveryBlockRowAndKBlockOnce) {
  namespace st = detail::stream;
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 300; ++trial) {
    const int G = 1 + static_cast<int>(rng() % 40);
    const int n = std::vector<int>{200, 256, 4096, 7168}[rng() % 4];
    const int S = std::vector<int>{1, 3, 16, 56}[rng() % 4];
    const int grid = std::vector<int>{132, 114, 8, 1}[rng() % 4];
    std::vector<int> counts(G), prefix(G + 1, 0);
    for (int g = 0; g < G; ++g) {
      const int r = static_cast<int>(rng() % 8);
      counts[g] = r < 3 ? 0 : r < 6 ? 1 + static_cast<int>(rng() % 64) : 1 + static_cast<int>(rng() % 300);
      prefix[g + 1] = prefix[g] + st::group_units(counts[g], n);
    }
    const int base = prefix[G], splits = st::choose_splits(base, grid, S);
    SCOPED_TRACE("G=" + std::to_string(G) + " n=" + std::to_string(n) + " S=" + std::to_string(S) +
                 " grid=" + std::to_string(grid) + " units=" + std::to_string(base) + " splits=" + std::to_string(splits));
    if (2 * base > grid || base == 0) EXPECT_EQ(splits, 1);
    if (splits > 1) {
      EXPECT_LE(base * splits, grid);          // one workspace slot per CTA suffices
      EXPECT_GE(S / splits, st::kMinPartBlocks);
    }
    const int NB = (n + 127) / 128;
    std::vector<int> hits;  // [g][nb][row][kb], flattened per group
    std::vector<size_t> at(G + 1, 0);
    for (int g = 0; g < G; ++g) at[g + 1] = at[g] + static_cast<size_t>(NB) * counts[g] * S;
    hits.assign(at[G], 0);
    for (int u = 0; u < base * splits; ++u) {
      const st::Unit x = st::decode_unit(u, splits, S, prefix.data(), counts.data(), G);
      ASSERT_GE(x.g, 0);
      ASSERT_LT(x.g, G);
      ASSERT_GT(counts[x.g], 0) << "unit " << u << " in an empty group";
      ASSERT_GE(x.nb, 0);
      ASSERT_LT(x.nb, NB);
      ASSERT_GE(x.ntok, 1);
      ASSERT_LE(x.ntok, st::kChunkRows);
      ASSERT_EQ(x.tok0 % st::kChunkRows, 0);
      ASSERT_LE(x.tok0 + x.ntok, counts[x.g]);
      ASSERT_EQ(x.base, u / splits);
      ASSERT_LT(x.kb0, x.kb1);
      for (int r = x.tok0; r < x.tok0 + x.ntok; ++r)
        for (int kb = x.kb0; kb < x.kb1; ++kb)
          ++hits[at[x.g] + (static_cast<size_t>(x.nb) * counts[x.g] + r) * S + kb];
    }
    for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i], 1) << "element " << i;
  }
}

// The shapes that split: the shared expert (G = 1) at decode on 132 SMs, and a few active experts.
TEST(StreamGemmSchedule, FewUnitsSplitK) {
  namespace st = detail::stream;
  EXPECT_EQ(st::choose_splits(st::group_units(1, 4096), 132, 56), 4);   // 32 units: 4 parts of 14 blocks
  EXPECT_EQ(st::choose_splits(st::group_units(1, 7168), 132, 16), 1);   // K 2048: parts would be too short
  EXPECT_EQ(st::choose_splits(2 * st::group_units(32, 7168), 132, 16), 1);  // 112 units, more than half: no split
  EXPECT_EQ(st::choose_splits(2 * st::group_units(8, 4096), 132, 56), 2);
  EXPECT_EQ(st::choose_splits(1, 132, 56), 4);  // capped at 14 blocks a part
  EXPECT_EQ(st::choose_splits(0, 132, 56), 1);
}

}  // namespace
}  // namespace epkit::moe
