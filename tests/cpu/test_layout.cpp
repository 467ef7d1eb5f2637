// Buffer layout: the size formulas of docs/ARCHITECTURE.md, region alignment and disjointness.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <utility>
#include <vector>

#include "epkit/error.hpp"
#include "common/buffer_layout.hpp"

namespace epkit {
namespace {

AllToAllConfig decode_ep(int W, int D = 1) {
  AllToAllConfig c;
  c.world_size = W;
  c.rank = 0;
  c.dp_size = D;
  c.num_experts = 256;
  c.topk = 8;
  c.hidden = 7168;
  c.max_tokens_per_rank = 128;
  c.dispatch_dtype = DType::kFP8E4M3;
  return c;
}

TEST(Layout, MessageBytes) {
  const MessageLayout m = MessageLayout::make(decode_ep(8));
  EXPECT_EQ(m.header_bytes, 80u);   // 16 + 8 * 8
  EXPECT_EQ(m.payload_bytes, 7168u);
  EXPECT_EQ(m.scale_bytes, 224u);   // 56 fp32 scales
  EXPECT_EQ(m.payload_offset, 304u);
  EXPECT_EQ(m.bytes, 7472u);
  EXPECT_EQ(m.slices, 4u);          // 7168 / 2048 rounded up
  AllToAllConfig c = decode_ep(8);
  c.topk = 1;
  c.dispatch_dtype = DType::kBF16;
  const MessageLayout b = MessageLayout::make(c);
  EXPECT_EQ(b.header_bytes, 32u);   // 24 rounded up to 16
  EXPECT_EQ(b.payload_bytes, 14336u);
  EXPECT_EQ(b.scale_bytes, 0u);
  EXPECT_EQ(b.payload_offset, 32u);
  c.weights_at_dispatch = true;  // K fp32 weights join the header
  EXPECT_EQ(MessageLayout::make(c).header_bytes, 32u);  // 16 + 12 * 1 = 28, rounded up
  c.topk = 8;
  EXPECT_EQ(MessageLayout::make(c).header_bytes, 112u);
  EXPECT_EQ(b.slices, 7u);
}

std::vector<std::pair<size_t, size_t>> regions(const AllToAllConfig& c) {
  const SymmetricLayout s = SymmetricLayout::make(c);
  const size_t W = c.world_size, L = c.num_experts / W, K = c.topk, M = c.max_tokens_per_rank;
  const size_t S = (M + c.dp_size - 1) / c.dp_size, out = c.hidden * 2;
  return {{s.dispatch_recv, W * S * s.msg.bytes},  {s.dispatch_stage, S * s.msg.bytes},
          {s.dispatch_counts, W * (L + 1) * 8},    {s.dispatch_count_stage, W * (L + 1) * 8},
          {s.dispatch_count_flag, W * 8},          {s.dispatch_recv_ctr, W * 8},
          {s.weights_recv, W * S * K * 8},         {s.weights_stage, S * K * 8},
          {s.weights_recv_ctr, W * 8},             {s.combine_recv, W * M * s.combine_row_bytes},
          {s.combine_stage, W * S * out},          {s.combine_flag, W * M * ((out + 2047) / 2048) * 8},
          {s.barrier_flag, W * 8}};
}

// Decode objects (M <= kTaggedPartialMaxTokens) whose every rank maps every peer give each partial
// row room for tagged words; other objects (a rank without P2P to some peer, or the portable path
// forced) keep single-width rows and the memory they would not use.
TEST(Layout, CombineRowsHoldTaggedWordsForDecodeObjects) {
  AllToAllConfig c = decode_ep(8);
  const size_t out = static_cast<size_t>(c.hidden) * 2;
  for (int M : {1, 128, kTaggedPartialMaxTokens, kTaggedPartialMaxTokens + 1, 4096}) {
    c.max_tokens_per_rank = M;
    for (int p2p = 0; p2p < 2; ++p2p)
      for (DataPath path : {DataPath::kAuto, DataPath::kPortable}) {
        c.path = path;
        const SymmetricLayout s = SymmetricLayout::make(c, p2p == 1);
        const bool tagged = p2p == 1 && path != DataPath::kPortable && M <= kTaggedPartialMaxTokens;
        EXPECT_EQ(s.combine_row_bytes, tagged ? 2 * out : out) << "M = " << M << ", p2p " << p2p << ", " << to_string(c);
        EXPECT_GE(s.combine_stage - s.combine_recv, static_cast<size_t>(c.world_size) * M * s.combine_row_bytes);
      }
  }
  // V3 at EP8, M = 128, over a network: the rows single-width again (36.3 MiB instead of 50.3).
  c = decode_ep(8);
  EXPECT_EQ(SymmetricLayout::make(c, true).total_bytes - SymmetricLayout::make(c, false).total_bytes,
            static_cast<size_t>(c.world_size) * c.max_tokens_per_rank * out);
}

TEST(Layout, SymmetricRegionsAreAlignedDisjointAndInside) {
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 200; ++trial) {
    AllToAllConfig c = decode_ep(1 << (rng() % 8), 1);
    c.dp_size = 1 << (rng() % (1 + __builtin_ctz(c.world_size)));
    c.num_experts = c.world_size * (1 + rng() % 8);
    c.topk = 1 + rng() % std::min(16, c.num_experts);
    c.hidden = 16 * (1 + rng() % 600);
    c.max_tokens_per_rank = 1 + rng() % 5000;
    c.dispatch_dtype = rng() % 2 ? DType::kFP8E4M3 : DType::kBF16;
    validate(c);
    const SymmetricLayout s = SymmetricLayout::make(c);
    auto r = regions(c);
    std::sort(r.begin(), r.end());
    for (size_t i = 0; i < r.size(); ++i) {
      EXPECT_EQ(r[i].first % 256, 0u);
      if (i + 1 < r.size()) EXPECT_LE(r[i].first + r[i].second, r[i + 1].first) << to_string(c);
    }
    EXPECT_LE(r.back().first + r.back().second, s.total_bytes);
  }
}

TEST(Layout, DecodeEp8SymmetricMemoryIsUnder64MB) {
  // The memory target: decode config at EP8 takes at most 64 MB of symmetric memory per rank.
  const SymmetricLayout s = SymmetricLayout::make(decode_ep(8));
  EXPECT_LE(s.total_bytes, 64u << 20);
  EXPECT_GT(s.total_bytes, 8u * 128 * 7472);  // at least the dispatch receive buffer
}

TEST(Layout, WorkspaceRegions) {
  const AllToAllConfig c = decode_ep(8, 2);
  const WorkspaceLayout w = WorkspaceLayout::make(c);
  EXPECT_GE(w.send_slot - w.state, 4096u);
  EXPECT_GE(w.num_msgs - w.send_slot, 64u * 8 * 4);          // [ceil(M/D)][W] int32
  EXPECT_GE(w.peer_bases - w.recv_map, 8u * 64 * 11 * 4);    // [W * ceil(M/D)][kRecvMapHead + K] int32
  EXPECT_GE(w.block_hist - w.peer_bases, 8u * sizeof(void*));
  EXPECT_EQ(w.hist_stride, 264u);                               // E + W = 256 + 8, a multiple of 4
  EXPECT_GE(w.block_flag - w.block_hist, size_t{kMaxGridBlocks} * 264 * 4);
  EXPECT_GE(w.total_bytes - w.block_flag, size_t{kMaxGridBlocks} * 8);
  EXPECT_EQ(w.block_hist % 16, 0u);                             // rows are read as int4
}

AllToAllConfig packed(AllToAllConfig c, int align = 1, int rows = 0) {
  c.layout = ExpertLayout::kPacked;
  c.packed_row_align = align;
  c.packed_rows = rows;
  validate(c);
  return c;
}

// The issue-18 configuration: EP8 prefill, 4096 tokens per rank, fp8 dispatch, bf16 combine.
AllToAllConfig prefill_ep8() {
  AllToAllConfig c = decode_ep(8);
  c.max_tokens_per_rank = 4096;
  c.combine_in_dtype = c.combine_out_dtype = DType::kBF16;
  return c;
}

TEST(Layout, PackedRowBoundByHand) {
  // EP8 prefill: N = 4096 * 8 * min(8, 32) = 262144 rows, at most 32768 per expert.
  EXPECT_EQ(packed_row_bound(packed(prefill_ep8())), 262144);
  // Alignment 128: 32 first blocks (one token each) + (262144 - 32) / 128 = 2047 full blocks.
  EXPECT_EQ(packed_row_bound(packed(prefill_ep8(), 128)), (32 + 2047) * 128);
  // W = 1 decode, one token: 8 rows; aligned to 128 each of them may open its own expert's block.
  AllToAllConfig one = decode_ep(1);
  one.max_tokens_per_rank = 1;
  EXPECT_EQ(packed_row_bound(packed(one)), 8);
  EXPECT_EQ(packed_row_bound(packed(one, 128)), 8 * 128);
  // Fewer local experts than K: min(K, L) = 2 rows per token (E 16 over W 8), and the per-expert
  // bound L * align_up(M * W / D, a) = 2 * 1200 is the smaller one at alignment 600 (by rows:
  // 2 + 2046 / 600 = 5 blocks), since no expert takes more than 1024 rows, two blocks.
  AllToAllConfig few = decode_ep(8);
  few.num_experts = 16;
  EXPECT_EQ(packed_row_bound(packed(few)), 128 * 8 * 2);
  EXPECT_EQ(packed_row_bound(packed(few, 600)), 2 * 1200);
  // The masked layout is untouched by the packed fields: rows = L * capacity.
  EXPECT_EQ(expert_rows(decode_ep(8)), 32 * 1024);
  EXPECT_EQ(expert_rows(packed(decode_ep(8), 1, 512)), 512);
}

TEST(Layout, PackedPrefillEp8TakesAQuarterOfTheMaskedBytes) {
  // The packed layout's point: per-rank bytes of expert_x + expert_y + scales, packed no-overflow bound
  // against the capacity layout, at the EP8 prefill config. Top-8 over 32 local experts: exactly 1/4.
  const ExpertTensorBytes masked = ExpertTensorBytes::make(prefill_ep8());
  const ExpertTensorBytes pk = ExpertTensorBytes::make(packed(prefill_ep8()));
  EXPECT_EQ(masked.expert_x, size_t{32} * 32768 * 7168);  // 7.5 GB, the figure
  EXPECT_EQ(masked.expert_y, size_t{32} * 32768 * 7168 * 2);
  EXPECT_EQ(masked.expert_x_scale, size_t{32} * 32768 * 56 * 4);
  EXPECT_EQ(masked.expert_offsets, 0u);
  EXPECT_EQ(pk.expert_offsets, 33u * 4);
  EXPECT_EQ(masked.total, masked.expert_x + masked.expert_x_scale + masked.expert_y);
  EXPECT_LE(pk.total * 4, masked.total);
  EXPECT_EQ(pk.total * 4, masked.total);
  // DeepGEMM's 128-row alignment adds at most 2079 * 128 - 262144 = 3968 rows of padding (1.5%).
  const ExpertTensorBytes pk128 = ExpertTensorBytes::make(packed(prefill_ep8(), 128));
  EXPECT_EQ(pk128.expert_x, size_t{266112} * 7168);
  EXPECT_LT(static_cast<double>(pk128.total) / masked.total, 0.254);
}

TEST(Layout, ShapesPerLayout) {
  const ExpertShapes m = ExpertShapes::make(decode_ep(8));
  EXPECT_EQ(m.ndim, 3);
  EXPECT_EQ(m.expert_x[0], 32);
  EXPECT_EQ(m.expert_x[1], 1024);
  EXPECT_EQ(m.expert_x[2], 7168);
  EXPECT_EQ(m.expert_x_scale[2], 56);
  EXPECT_EQ(m.expert_offsets, 0);
  const ExpertShapes p = ExpertShapes::make(packed(decode_ep(8), 16, 4096));
  EXPECT_EQ(p.ndim, 2);
  EXPECT_EQ(p.expert_x[0], 4096);
  EXPECT_EQ(p.expert_x[1], 7168);
  EXPECT_EQ(p.expert_x_scale[0], 4096);
  EXPECT_EQ(p.expert_x_scale[1], 56);
  EXPECT_EQ(p.expert_offsets, 33);
}

TEST(Layout, PlacementOffsetsRule) {
  AllToAllConfig c = decode_ep(64);  // L = 4
  const ExpertPlacement a = ExpertPlacement::make(packed(c, 4), {5, 0, 1, 8});
  EXPECT_EQ(a.offsets, (std::vector<int64_t>{0, 8, 8, 12, 20}));
  EXPECT_EQ(a.first_row, (std::vector<int64_t>{0, 8, 8, 12}));
  EXPECT_EQ(a.count, (std::vector<int>{5, 0, 1, 8}));
  EXPECT_FALSE(a.overflow);
  // R = 12: expert 3 starts at 12 = R and keeps nothing; R = 16: it keeps 4 of 8.
  const ExpertPlacement b = ExpertPlacement::make(packed(c, 4, 12), {5, 0, 1, 8});
  EXPECT_EQ(b.offsets, (std::vector<int64_t>{0, 8, 8, 12, 12}));
  EXPECT_EQ(b.count, (std::vector<int>{5, 0, 1, 0}));
  EXPECT_TRUE(b.overflow);
  const ExpertPlacement d = ExpertPlacement::make(packed(c, 4, 16), {5, 0, 1, 8});
  EXPECT_EQ(d.offsets, (std::vector<int64_t>{0, 8, 8, 12, 16}));
  EXPECT_EQ(d.count, (std::vector<int>{5, 0, 1, 4}));
  // Padding alone past R is no overflow: expert 0's 5 rows fit in R = 8 though its block ends at 8.
  const ExpertPlacement e = ExpertPlacement::make(packed(c, 4, 8), {5, 0, 0, 0});
  EXPECT_EQ(e.offsets, (std::vector<int64_t>{0, 8, 8, 8, 8}));
  EXPECT_FALSE(e.overflow);
  // Masked: e * capacity, clamped to capacity.
  c.capacity = 6;
  const ExpertPlacement m = ExpertPlacement::make(c, {5, 0, 7, 6});
  EXPECT_EQ(m.first_row, (std::vector<int64_t>{0, 6, 12, 18}));
  EXPECT_EQ(m.count, (std::vector<int>{5, 0, 6, 6}));
  EXPECT_TRUE(m.overflow);
  EXPECT_TRUE(m.offsets.empty());
  EXPECT_THROW(ExpertPlacement::make(c, {1, 2}), Error);
}

// The bound is safe for every count vector the routing allows (sum <= N, each <= M * W / D; any such
// vector is some routing of distinct experts per token) and reached by one: random small configs,
// adversarial counts (each non-empty expert just past a multiple of the alignment).
TEST(Layout, PackedRowBoundIsSafeAndTight) {
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 2000; ++trial) {
    AllToAllConfig c = decode_ep(1 << (rng() % 4));
    c.num_experts = c.world_size * (1 + rng() % 12);
    c.topk = 1 + rng() % std::min(16, c.num_experts);
    c.max_tokens_per_rank = 1 + rng() % 40;
    c = packed(c, 1 + rng() % 20);
    const int L = num_local_experts(c), K = c.topk, a = c.packed_row_align;
    const int per = c.max_tokens_per_rank * num_dp_groups(c), n = per * std::min(K, L);
    const int64_t bound = packed_row_bound(c);
    std::vector<int> cnt(L, 0);
    int left = n;
    // Adversarial: one token into each expert first, then whole blocks, as long as tokens last.
    for (int e = 0; e < L && left > 0; ++e) cnt[e] = 1, --left;
    for (int e = 0; e < L && left >= a; ++e)
      while (left >= a && cnt[e] + a <= per) cnt[e] += a, left -= a;
    int64_t used = 0;
    for (int e = 0; e < L; ++e) used += (cnt[e] + a - 1) / a * a;
    const ExpertPlacement worst = ExpertPlacement::make(c, cnt);
    EXPECT_FALSE(worst.overflow) << to_string(c);
    EXPECT_LE(used, bound) << to_string(c);
    // Random feasible counts never overflow either.
    for (int r = 0; r < 5; ++r) {
      std::vector<int> rc(L, 0);
      int budget = static_cast<int>(rng() % (n + 1));
      while (budget > 0) {
        const int e = static_cast<int>(rng() % L);
        if (rc[e] < per) ++rc[e], --budget;
      }
      EXPECT_FALSE(ExpertPlacement::make(c, rc).overflow) << to_string(c);
    }
    // Tight: the greedy counts open min(N, L) experts with one token each, then add whole blocks
    // while tokens and per-expert room last, which is the bound's count of blocks.
    EXPECT_EQ(used, bound) << to_string(c);
  }
}

}  // namespace
}  // namespace epkit
