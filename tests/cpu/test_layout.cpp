// Buffer layout: the size formulas of docs/ARCHITECTURE.md, region alignment and disjointness.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <utility>
#include <vector>

#include "epkit/layout.hpp"

namespace epkit {
namespace {

AllToAllConfig decode_ep(int W, int D = 1) {
  AllToAllConfig c;
  c.world_size = W;
  c.rank = 0;
  c.dp_size = D;
  c.num_experts = 256;
  c.experts_per_token = 8;
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
  c.experts_per_token = 1;
  c.dispatch_dtype = DType::kBF16;
  const MessageLayout b = MessageLayout::make(c);
  EXPECT_EQ(b.header_bytes, 32u);   // 24 rounded up to 16
  EXPECT_EQ(b.payload_bytes, 14336u);
  EXPECT_EQ(b.scale_bytes, 0u);
  EXPECT_EQ(b.payload_offset, 32u);
  c.weights_at_dispatch = true;  // K fp32 weights join the header
  EXPECT_EQ(MessageLayout::make(c).header_bytes, 32u);  // 16 + 12 * 1 = 28, rounded up
  c.experts_per_token = 8;
  EXPECT_EQ(MessageLayout::make(c).header_bytes, 112u);
  EXPECT_EQ(b.slices, 7u);
}

std::vector<std::pair<size_t, size_t>> regions(const AllToAllConfig& c) {
  const SymmetricLayout s = SymmetricLayout::make(c);
  const size_t W = c.world_size, L = c.num_experts / W, K = c.experts_per_token, M = c.max_tokens_per_rank;
  const size_t S = (M + c.dp_size - 1) / c.dp_size, out = c.hidden * 2;
  return {{s.dispatch_recv, W * S * s.msg.bytes},  {s.dispatch_stage, S * s.msg.bytes},
          {s.dispatch_counts, W * (L + 1) * 8},    {s.dispatch_count_stage, W * (L + 1) * 8},
          {s.dispatch_count_flag, W * 8},          {s.dispatch_recv_ctr, W * 8},
          {s.weights_recv, W * S * K * 8},         {s.weights_stage, S * K * 8},
          {s.weights_recv_ctr, W * 8},             {s.combine_recv, W * M * out},
          {s.combine_stage, W * S * out},          {s.combine_flag, W * M * ((out + 2047) / 2048) * 8},
          {s.barrier_flag, W * 8}};
}

TEST(Layout, SymmetricRegionsAreAlignedDisjointAndInside) {
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 200; ++trial) {
    AllToAllConfig c = decode_ep(1 << (rng() % 8), 1);
    c.dp_size = 1 << (rng() % (1 + __builtin_ctz(c.world_size)));
    c.num_experts = c.world_size * (1 + rng() % 8);
    c.experts_per_token = 1 + rng() % std::min(16, c.num_experts);
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
  // Issue #3's memory target: decode config at EP8 takes at most 64 MB of symmetric memory per rank.
  const SymmetricLayout s = SymmetricLayout::make(decode_ep(8));
  EXPECT_LE(s.total_bytes, 64u << 20);
  EXPECT_GT(s.total_bytes, 8u * 128 * 7472);  // at least the dispatch receive buffer
}

TEST(Layout, WorkspaceRegions) {
  const AllToAllConfig c = decode_ep(8, 2);
  const WorkspaceLayout w = WorkspaceLayout::make(c);
  EXPECT_GE(w.send_slot - w.state, 4096u);
  EXPECT_GE(w.num_msgs - w.send_slot, 64u * 8 * 4);          // [ceil(M/D)][W] int32
  EXPECT_GE(w.peer_bases - w.recv_map, 8u * 64 * 9 * 4);     // [W][ceil(M/D)][K+1] int32
  EXPECT_GE(w.block_hist - w.peer_bases, 8u * sizeof(void*));
  EXPECT_EQ(w.hist_stride, 264u);                               // E + W = 256 + 8, a multiple of 4
  EXPECT_GE(w.block_flag - w.block_hist, size_t{kMaxGridBlocks} * 264 * 4);
  EXPECT_GE(w.total_bytes - w.block_flag, size_t{kMaxGridBlocks} * 8);
  EXPECT_EQ(w.block_hist % 16, 0u);                             // rows are read as int4
}

}  // namespace
}  // namespace epkit
