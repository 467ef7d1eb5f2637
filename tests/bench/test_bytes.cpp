// Algorithmic byte formulas (tools/epkit-bench/bytes.hpp), checked against hand-counted cases.
#include <gtest/gtest.h>

#include "bytes.hpp"

namespace epkit::bench {
namespace {

AllToAllConfig decode_cfg(int world, int dp = 1) {
  AllToAllConfig c;
  c.world_size = world;
  c.rank = 0;
  c.dp_size = dp;
  c.num_experts = 256;
  c.topk = 8;
  c.hidden = 7168;
  c.max_tokens_per_rank = 128;
  c.dispatch_dtype = DType::kFP8E4M3;
  c.combine_in_dtype = DType::kBF16;
  c.combine_out_dtype = DType::kBF16;
  return c;
}

TEST(BenchBytes, TokenBytes) {
  AllToAllConfig c = decode_cfg(2);
  // fp8 payload 7168 B + 56 fp32 scales.
  EXPECT_EQ(dispatch_token_bytes(c), 7168u + 56u * 4u);
  EXPECT_EQ(combine_token_bytes(c), 7168u * 2u);
  c.dispatch_dtype = DType::kBF16;  // no scales without fp8
  EXPECT_EQ(dispatch_token_bytes(c), 7168u * 2u);
  c.hidden = 200;  // partial last scale block counts as a block
  c.dispatch_dtype = DType::kFP8E4M3;
  EXPECT_EQ(dispatch_token_bytes(c), 200u + 2u * 4u);
}

TEST(BenchBytes, RemoteDestinationsCountsDistinctRemoteRanks) {
  AllToAllConfig c = decode_cfg(4);  // 64 experts per rank
  c.topk = 4;
  const int32_t row[] = {0, 63, 64, 200};  // ranks 0, 0, 1, 3
  EXPECT_EQ(remote_destinations(c, row, 0), 2);
  EXPECT_EQ(remote_destinations(c, row, 1), 2);  // ranks 0 and 3
  EXPECT_EQ(remote_destinations(c, row, 2), 3);
  const int32_t same_rank[] = {64, 65, 66, 127};
  EXPECT_EQ(remote_destinations(c, same_rank, 0), 1);
  EXPECT_EQ(remote_destinations(c, same_rank, 1), 0);
  const int32_t invalid[] = {-1, 256, 70, -5};  // out-of-range indices mean "no expert"
  EXPECT_EQ(remote_destinations(c, invalid, 0), 1);
}

TEST(BenchBytes, AlgorithmicBytesOverGroups) {
  AllToAllConfig c = decode_cfg(2);
  c.topk = 2;
  // Group 0 (rank 0): token 0 -> rank 1 only; token 1 -> ranks 0 and 1. Group 1 (rank 1): token 0 -> rank 0; token 1 -> rank 1.
  std::vector<std::vector<int32_t>> groups = {{128, 129, 0, 200}, {5, 6, 130, 131}};
  const AlgorithmicBytes b = algorithmic_bytes(c, groups, 2);
  EXPECT_EQ(b.pairs, 3u);
  EXPECT_EQ(b.dispatch, 3u * (7168u + 224u));
  EXPECT_EQ(b.combine, 3u * 7168u * 2u);
  EXPECT_DOUBLE_EQ(b.dispatch_per_rank, 3.0 * (7168 + 224) / 2);
  EXPECT_DOUBLE_EQ(b.combine_per_rank, 3.0 * 7168 * 2 / 2);
}

TEST(BenchBytes, DpGroupDealsTokensRoundRobin) {
  AllToAllConfig c = decode_cfg(4, 2);  // groups {0,1} and {2,3}
  EXPECT_EQ(epkit::dp_sender_rank(c, 0, 0), 0);
  EXPECT_EQ(epkit::dp_sender_rank(c, 0, 2), 0);  // round-robin over the group's 2 ranks
  EXPECT_EQ(epkit::dp_sender_rank(c, 0, 3), 1);
  EXPECT_EQ(epkit::dp_sender_rank(c, 1, 4), 2);
  c.topk = 1;
  // Group 0, 2 tokens: token 0 sent by rank 0 to expert 70 (rank 1, remote); token 1 sent by rank 1 to rank 1 (local).
  std::vector<std::vector<int32_t>> groups = {{70, 80}, {0, 0}};
  const AlgorithmicBytes b = algorithmic_bytes(c, groups, 2);
  // Group 1: tokens sent by ranks 2 and 3 to rank 0: both remote.
  EXPECT_EQ(b.pairs, 3u);
}

TEST(BenchBytes, DensePaddingAndRates) {
  AllToAllConfig c = decode_cfg(8);
  EXPECT_EQ(dense_bytes_per_peer(c, 100), 32u * 128u * 100u);
  EXPECT_DOUBLE_EQ(gb_per_s(1e9, 1e6), 1.0);  // 1 GB in 1 s
  EXPECT_DOUBLE_EQ(gb_per_s(393e3, 1.0), 393.0);
  EXPECT_EQ(gb_per_s(5, 0), 0.0);
}

}  // namespace
}  // namespace epkit::bench
