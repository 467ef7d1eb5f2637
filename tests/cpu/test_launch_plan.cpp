// The launch plan (src/comm/host/launch_plan.cpp) and the shared mappings. Launch shapes of the world-size-1 kernels: the small dispatch's piece
// rule, its grid (one unit per block first), the large objects' grid, the combine grid, and that the dispatch's shared memory
// fits an H100/H200 block for every config the validation accepts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "epkit/error.hpp"
#include "common/buffer_layout.hpp"
#include "comm/host/launch_plan.hpp"

namespace epkit::host {
namespace {

constexpr int kH200Sms = 132;

TEST(LaunchPlan, DecodePieceIsSmallWhileTheCallFitsOneWave) {
  // DeepSeek-V3 decode: 7168 fp8 bytes per token, top-8: 14 pieces of 512 B per row; 132 x 16 warps.
  const int pb = 7168, K = 8, E = 256, H = 7168;
  LocalShapes s = local_shapes(1, K, E, pb, H, kH200Sms);
  EXPECT_EQ(s.piece_chunks, 1);
  EXPECT_EQ(s.dispatch.blocks, 112);  // 8 rows x 14 pieces = 112 units, one per block
  EXPECT_EQ(s.combine.blocks, 28);    // 7168 / 256 = 28 warp units, one per block
  // 18 tokens: 2016 units <= 2112 warps; 19 tokens: 2128 > 2112, so 2 KB pieces (4 per row).
  EXPECT_EQ(local_shapes(18, K, E, pb, H, kH200Sms).piece_chunks, 1);
  s = local_shapes(19, K, E, pb, H, kH200Sms);
  EXPECT_EQ(s.piece_chunks, 4);
  EXPECT_EQ(s.dispatch.blocks, kH200Sms);  // 19 x 8 x 4 = 608 units: one per block up to the grid
  EXPECT_EQ(local_shapes(2, K, E, pb, H, kH200Sms).combine.blocks, 56);
  s = local_shapes(128, K, E, pb, H, kH200Sms);
  EXPECT_EQ(s.piece_chunks, 4);
  EXPECT_EQ(s.dispatch.blocks, kH200Sms);  // 4096 units: capped at the grid
  // A smaller grid (AllToAllConfig::num_sms) moves the threshold: 1 token needs 112 warps.
  EXPECT_EQ(local_shapes(1, K, E, pb, H, 7).piece_chunks, 1);
  EXPECT_EQ(local_shapes(1, K, E, pb, H, 6).piece_chunks, 4);
  EXPECT_EQ(local_shapes(1, K, E, pb, H, 6).dispatch.blocks, 6);  // 32 units of 2 KB on 6 blocks
}

TEST(LaunchPlan, V2LiteThreshold) {
  // DeepSeek-V2-Lite decode: 2048 fp8 bytes, top-6: 4 pieces of 512 B; 88 x 6 x 4 = 2112.
  EXPECT_EQ(local_shapes(88, 6, 64, 2048, 2048, kH200Sms).piece_chunks, 1);
  EXPECT_EQ(local_shapes(88, 6, 64, 2048, 2048, kH200Sms).dispatch.blocks, kH200Sms);
  EXPECT_EQ(local_shapes(89, 6, 64, 2048, 2048, kH200Sms).piece_chunks, 4);
  // A payload not a multiple of the piece rounds up (the last piece is partial).
  EXPECT_EQ(local_shapes(1, 1, 8, 513, 513, kH200Sms).dispatch.blocks, 2);
  EXPECT_EQ(local_shapes(32, 1, 8, 513, 513, kH200Sms).dispatch.blocks, 64);  // 32 x 2 pieces
}

TEST(LaunchPlan, LargeObjectsTakeEveryBlock) {
  const LocalShapes s = local_shapes(512, 8, 256, 7168, 7168, kH200Sms);
  EXPECT_EQ(s.piece_chunks, 0);
  EXPECT_EQ(s.dispatch.blocks, kH200Sms);
  EXPECT_EQ(s.combine.blocks, kH200Sms);  // 512 x 7 units of 1024 elements = 224 blocks, capped
  EXPECT_EQ(local_shapes(4096, 8, 256, 7168, 7168, 5).dispatch.blocks, 5);
  EXPECT_EQ(local_shapes(511, 8, 256, 7168, 7168, 1).dispatch.blocks, 1);
  EXPECT_EQ(local_shapes(511, 8, 256, 7168, 7168, 1).combine.blocks, 1);
}

TEST(LaunchPlan, DispatchSharedMemoryFitsABlockForEveryAcceptedConfig) {
  // Config validation accepts E <= 4096 and K <= 16; the small path's largest M is 511. The opt-in
  // limit of one sm_90 block is 227 KB (232448 bytes).
  size_t worst = 0;
  for (int E = 1; E <= 4096; E += (E < 64 ? 1 : 37))
    for (int K = 1; K <= std::min(16, E); ++K)
      for (int M : {1, 128, 511, 512, 4096}) worst = std::max(worst, local_dispatch_smem_bytes(E, K, M));
  worst = std::max(worst, local_dispatch_smem_bytes(4096, 16, 511));
  EXPECT_LE(worst, 232448u);
  // The small path keeps one (expert, rank) pair per entry of the largest call: 2 x M x K ints more.
  EXPECT_EQ(local_dispatch_smem_bytes(256, 8, 101) - local_dispatch_smem_bytes(256, 8, 100), 2 * 8 * sizeof(int));
  // The large path's arrays do not grow with M.
  EXPECT_EQ(local_dispatch_smem_bytes(256, 8, 512), local_dispatch_smem_bytes(256, 8, 65536));
}

// Which fused small dispatches rank each entry in its own warp (kernels::local_scan_ranks), with the
// units and grid the object's shapes give: the cases measured on one H200 (kernel_params.hpp).
TEST(LaunchPlan, ScanRankingWhileScansStayShort) {
  auto scans = [](int m, int K, int E, int pb, int H) {
    const LocalShapes s = local_shapes(m, K, E, pb, H, kH200Sms);
    const int units = m * K * kernels::local_pieces_per_row(pb, s.piece_chunks);
    return kernels::local_scan_ranks(m * K, units, s.dispatch.blocks * kernels::kWarpsPerBlock);
  };
  const int v3 = 7168, v2 = 2048;  // fp8 payload bytes per token
  EXPECT_FALSE(scans(4, 8, 256, v3, 7168));   // 32 entries: the one-warp path (local_dispatch_tiny)
  EXPECT_TRUE(scans(5, 8, 256, v3, 7168));
  EXPECT_TRUE(scans(128, 8, 256, v3, 7168));  // 1024 entries x 2 units per warp
  EXPECT_TRUE(scans(192, 8, 256, v3, 7168));  // 1536 x 3 = 4608
  EXPECT_FALSE(scans(256, 8, 256, v3, 7168)); // 2048 x 4
  EXPECT_TRUE(scans(256, 6, 64, v2, 2048));   // V2-Lite: 1536 x 1
  EXPECT_TRUE(scans(384, 6, 64, v2, 2048));   // 2304 x 2
  EXPECT_FALSE(scans(511, 6, 64, v2, 2048));  // 3066 x 2
  // The path the kernel (and the host, for a call of known m) takes.
  auto path = [](int m, int K, int E, int pb, int H) {
    const LocalShapes s = local_shapes(m, K, E, pb, H, kH200Sms);
    const int units = m * K * kernels::local_pieces_per_row(pb, s.piece_chunks);
    return kernels::local_small_path(m * K, units, s.dispatch.blocks * kernels::kWarpsPerBlock);
  };
  using kernels::LocalSmallPath;
  EXPECT_EQ(path(1, 8, 256, v3, 7168), LocalSmallPath::kTiny);
  EXPECT_EQ(path(4, 8, 256, v3, 7168), LocalSmallPath::kTiny);   // 32 entries
  EXPECT_EQ(path(5, 8, 256, v3, 7168), LocalSmallPath::kScan);
  EXPECT_EQ(path(128, 8, 256, v3, 7168), LocalSmallPath::kScan);
  EXPECT_EQ(path(256, 8, 256, v3, 7168), LocalSmallPath::kRank);
  EXPECT_EQ(path(511, 6, 64, v2, 2048), LocalSmallPath::kRank);
}

// Fused calls of host-given m choose their kernel from their own m and the launch grid
// (kernels::local_fused_dispatch / local_fused_combine_chunks, local.cu's launchers), so that an
// object sized for a larger batch than the call runs decode calls on the decode kernels.
TEST(LaunchPlan, FusedCallsChooseTheirKernelFromTheirOwnM) {
  using kernels::LocalSmallPath;
  const int v3 = 7168, K = 8, E = 256, H = 7168;
  auto dispatch = [&](int M, int m) {
    const LocalShapes s = local_shapes(M, K, E, v3, H, kH200Sms);
    return local_fused_dispatch(M >= kernels::kLocalLargeTokens, m, K, v3,
                                         s.dispatch.blocks * kernels::kWarpsPerBlock);
  };
  // An object sized for an engine's largest batch (large: M >= 512) takes the one-warp and scan
  // paths for decode calls, each with the piece its own units need.
  auto f = dispatch(4096, 1);
  EXPECT_TRUE(f.one_path);
  EXPECT_EQ(f.path, LocalSmallPath::kTiny);
  EXPECT_EQ(f.piece_chunks, kernels::kLocalSmallPieceChunks);  // 112 units: one wave of 512 B
  f = dispatch(4096, 18);
  EXPECT_EQ(f.path, LocalSmallPath::kScan);
  EXPECT_EQ(f.piece_chunks, kernels::kLocalSmallPieceChunks);  // 2016 units <= 2112 warps
  f = dispatch(4096, 64);  // 2048 units of 2 KB: one wave
  EXPECT_EQ(f.path, LocalSmallPath::kScan);
  EXPECT_EQ(f.piece_chunks, kernels::kLocalLargePieceChunks);
  f = dispatch(4096, 128);  // 4096 units of 2 KB take two rounds; 2048 of 4 KB take one
  EXPECT_TRUE(f.one_path);
  EXPECT_EQ(f.path, LocalSmallPath::kScan);
  EXPECT_EQ(f.piece_chunks, kernels::kLocalWidePieceChunks);
  EXPECT_EQ(dispatch(4096, 132).piece_chunks,  // 2112 units of 4 KB
            kernels::kLocalWidePieceChunks);
  EXPECT_EQ(dispatch(4096, 133).piece_chunks, kernels::kLocalLargePieceChunks);  // two rounds either way
  // V2-Lite's 2 KB rows are one 2 KB piece: the 4 KB piece would not cut its units.
  EXPECT_EQ(local_fused_dispatch(false, 128, 6, 2048, kH200Sms * kernels::kWarpsPerBlock).piece_chunks,
            kernels::kLocalLargePieceChunks);
  // The 4 KB piece is compiled for the scan path only: a one-wave call of more than kLocalScanWork
  // entries (a grid of 8192 warps, 511 tokens of top-10 4 KB rows) ranks in blocks, with 2 KB pieces.
  f = local_fused_dispatch(false, 511, 10, 4096, 8192);
  EXPECT_EQ(f.path, LocalSmallPath::kRank);
  EXPECT_EQ(f.piece_chunks, kernels::kLocalLargePieceChunks);
  // The block ranking needs shared memory for the object's largest call, which a large object's
  // launch does not have; 512 tokens and more are the large path's.
  EXPECT_FALSE(dispatch(4096, 256).one_path);
  EXPECT_FALSE(dispatch(4096, 512).one_path);
  EXPECT_FALSE(dispatch(600, 4096).one_path);
  // A small object's 1-token call takes the 512-byte piece even where its largest call takes 2 KB.
  EXPECT_EQ(local_shapes(256, K, E, v3, H, kH200Sms).piece_chunks, kernels::kLocalLargePieceChunks);
  f = dispatch(256, 1);
  EXPECT_TRUE(f.one_path);
  EXPECT_EQ(f.path, LocalSmallPath::kTiny);
  EXPECT_EQ(f.piece_chunks, kernels::kLocalSmallPieceChunks);
  f = dispatch(256, 256);  // small objects rank in blocks with their own kernel too
  EXPECT_TRUE(f.one_path);
  EXPECT_EQ(f.path, LocalSmallPath::kRank);
  EXPECT_EQ(f.piece_chunks, kernels::kLocalLargePieceChunks);
  // With M = m (the benchmark) the call's piece is the object's, but for the 4 KB piece.
  for (int m : {1, 4, 18, 19, 32, 64, 133, 256, 511})
    EXPECT_EQ(dispatch(m, m).piece_chunks, local_shapes(m, K, E, v3, H, kH200Sms).piece_chunks) << m;
  // A grid of 6 blocks (AllToAllConfig::num_sms): 1 token's 112 small units need 7.
  EXPECT_EQ(local_fused_dispatch(false, 1, K, v3, 6 * kernels::kWarpsPerBlock).piece_chunks,
            kernels::kLocalLargePieceChunks);

  // Combine: 256-element units while one per warp fits one wave (28 per V3 token), then 512-element
  // units (14 per token) while those fit, then the general kernel.
  const int warps = kH200Sms * kernels::kWarpsPerBlock;  // 2112
  EXPECT_EQ(local_fused_combine_chunks(1, H, warps), 1);
  EXPECT_EQ(local_fused_combine_chunks(75, H, warps), 1);   // 2100 units
  EXPECT_EQ(local_fused_combine_chunks(76, H, warps), 2);   // 2128 > 2112; 1064
  EXPECT_EQ(local_fused_combine_chunks(128, H, warps), 2);  // 1792
  EXPECT_EQ(local_fused_combine_chunks(151, H, warps), 0);  // 2114
  EXPECT_EQ(local_fused_combine_chunks(128, 2048, warps), 1);  // V2-Lite: 1024
  EXPECT_EQ(local_fused_combine_chunks(512, 64, warps), 0);    // the large path's
  // A large object's combine grid holds a decode call's units.
  EXPECT_EQ(local_shapes(4096, K, E, v3, H, kH200Sms).combine.blocks, kH200Sms);
}

// The scan path's 16-byte loads (local.cu, lane_matches_below): for every start offset and scan
// length, head + whole vectors + tail cover exactly the words below i, the vectors start on a
// 16-byte boundary, and head and tail fit the lanes that take them (fewer than `per` each).
TEST(LaunchPlan, ScanSplitCoversEveryWordOnce) {
  for (int per : {2, 4})  // int64 and 32-bit index words
    for (int mis = 0; mis < per; ++mis)
      for (int i = 0; i <= 3000; ++i) {
        const kernels::ScanSplit s = kernels::scan_split(i, mis, per);
        const int tail = i - s.tail0;
        ASSERT_GE(s.head, 0);
        ASSERT_LT(s.head, per);
        ASSERT_GE(s.nv, 0);
        ASSERT_GE(tail, 0);
        ASSERT_LT(tail, per);
        ASSERT_EQ(s.head + s.nv * per + tail, i);
        ASSERT_EQ(s.tail0, s.head + s.nv * per);
        if (s.nv > 0) ASSERT_EQ((mis + s.head) % per, 0) << "vectors start on a 16-byte boundary";
        // Head and tail words are loaded one per lane by lanes 0 .. 2 per - 1 of one warp.
        ASSERT_LE(2 * per, 32);
      }
}

// World size >= 2 (dispatch.cu, combine.cu): the large variant only for calls that may take the
// large-call paths (kernels::large_variant): a device m, or a host m of at least kLargeCallTokens
// own tokens, on an object that can (ceil(M / D) >= kLargeCallTokens).
TEST(LaunchPlan, LargeVariantOnlyForCallsThatMayBeLarge) {
  EXPECT_EQ(kernels::own_tokens(0, 0, 1), 0);
  EXPECT_EQ(kernels::own_tokens(7, 0, 1), 7);
  EXPECT_EQ(kernels::own_tokens(7, 0, 2), 4);  // tokens 0, 2, 4, 6
  EXPECT_EQ(kernels::own_tokens(7, 1, 2), 3);  // 1, 3, 5
  EXPECT_EQ(kernels::own_tokens(1, 3, 2), 0);  // rank 3 is member 1 of its group: token 1 and up
  EXPECT_EQ(kernels::own_tokens(2, 3, 2), 1);
  kernels::CommParams p{};
  p.rank = 0, p.dp_size = 1, p.max_msgs_per_src = 4096;  // an object sized for prefill
  const int32_t dev = 0;
  auto host = [](int m) { return kernels::TokenCount{m, nullptr, 4096}; };
  EXPECT_FALSE(large_variant(p, host(1)));
  EXPECT_FALSE(large_variant(p, host(1023)));
  EXPECT_TRUE(large_variant(p, host(1024)));
  EXPECT_TRUE(large_variant(p, kernels::TokenCount{-1, &dev, 4096}));  // m known only on the device
  p.dp_size = 2, p.rank = 1;  // rank 1 sends tokens 1, 3, ...: 1024 of 2048, 1023 of 2047
  EXPECT_TRUE(large_variant(p, host(2048)));
  EXPECT_FALSE(large_variant(p, host(2047)));
  p.max_msgs_per_src = 1023;  // an object that cannot take them
  EXPECT_FALSE(large_variant(p, host(4096)));
  EXPECT_FALSE(large_variant(p, kernels::TokenCount{-1, &dev, 4096}));
}

// World size >= 2: the rank of expert e is e / L, computed as one multiply (kernels::expert_rank):
// exact for every expert index and local-expert count the configuration allows (E <= 4096).
TEST(LaunchPlan, ExpertRankIsTheExactQuotient) {
  for (int L = 1; L <= 4096; ++L) {
    const uint32_t d = kernels::expert_rank_div(L);
    for (int e = 0; e < 4096; ++e)
      if (kernels::expert_rank(e, d) != e / L) FAIL() << "e = " << e << ", L = " << L << ": " << kernels::expert_rank(e, d);
  }
}

// The P2P-only small variants run only where every rank is P2P-mapped, and never for large calls.
// The general kernels' own-token count from the host's group index and multiplier equals
// own_tokens for every DP size up to the world-size limit, every group index, and m over the
// whole token range (each m at small D; at larger D every m near a multiple of D and random m).
TEST(LaunchPlan, OwnTokensByMultiplyMatchesTheDivision) {
  std::mt19937 rng(std::random_device{}());
  const int m_max = kMaxTokensPerRank;
  for (int D = 1; D <= 1024; D = D < 16 ? D + 1 : D * 2 + static_cast<int>(rng() % 3)) {
    const uint64_t mul = kernels::small_div_mul(D);
    for (int r = 0; r < D; r += D <= 16 ? 1 : D / 8 + 1) {
      auto check = [&](int m) {
        if (m < 0 || m > m_max) return;
        const int want = kernels::own_tokens(m, r, D), got = kernels::own_tokens_by_mul(m, r % D, D, mul);
        if (got != want) FAIL() << "m = " << m << ", rank % D = " << r << ", D = " << D << ": " << got << " != " << want;
      };
      if (D <= 16) {
        for (int m = 0; m <= m_max; ++m) check(m);
      } else {
        for (int m = 0; m <= m_max + D; m += D) check(m - 1), check(m), check(m + 1), check(m + r);
        for (int i = 0; i < 512; ++i) check(static_cast<int>(rng() % (m_max + 1)));
      }
      check(m_max);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(LaunchPlan, P2PVariantOnlyForAllP2PObjectsAndSmallCalls) {

  kernels::CommParams p{};
  p.rank = 0, p.dp_size = 1, p.max_msgs_per_src = 4096;
  const kernels::TokenCount small{1, nullptr, 4096}, large{1024, nullptr, 4096};
  p.all_p2p = 1;
  EXPECT_EQ(kernel_variant(p, small), KernelVariant::kSmallP2P);
  EXPECT_EQ(kernel_variant(p, large), KernelVariant::kLarge);
  p.all_p2p = 0;  // one rank reached by put-with-signal (another node, or the portable path)
  EXPECT_EQ(kernel_variant(p, small), KernelVariant::kSmall);
  EXPECT_EQ(kernel_variant(p, large), KernelVariant::kLarge);
}

// combine's decode kernel: small P2P calls of objects with tagged partials on at most 32 ranks, and
// nothing else (it has neither the block-prefix path for more ranks nor the untagged token side).
TEST(LaunchPlan, CombineDecodeKernelOnlyForTaggedObjectsOfAtMost32Ranks) {
  kernels::CommParams p{};
  p.rank = 0, p.dp_size = 1, p.max_msgs_per_src = 4096, p.all_p2p = 1, p.tagged_partials = 1;
  const kernels::TokenCount small{1, nullptr, 4096}, large{1024, nullptr, 4096};
  for (int w : {1, 2, 8, 31, 32}) {
    p.world_size = w;
    EXPECT_TRUE(combine_decode_kernel(p, small)) << w;
    EXPECT_FALSE(combine_decode_kernel(p, large)) << w;  // the large variant
  }
  for (int w : {33, 64, 72}) {  // WarpMsgIndex holds one rank per lane
    p.world_size = w;
    EXPECT_FALSE(combine_decode_kernel(p, small)) << w;
  }
  p.world_size = 8;
  p.tagged_partials = 0;  // M > kTaggedPartialMaxTokens: untagged partials
  EXPECT_FALSE(combine_decode_kernel(p, small));
  p.tagged_partials = 1, p.all_p2p = 0;  // a rank reached by put-with-signal
  EXPECT_FALSE(combine_decode_kernel(p, small));
  p.all_p2p = 1;
  const int32_t dev_m = 1;
  const kernels::TokenCount on_device{-1, &dev_m, 4096};  // m on the device: the large variant
  EXPECT_FALSE(combine_decode_kernel(p, on_device));
}

// dispatch's decode kernel: small P2P calls whose own tokens send one per block from the grid's last
// blocks (one round), on the masked layout, with every scale in registers and exact unit multiplies.
TEST(LaunchPlan, DispatchDecodeKernelOnlyForOneTokenPerSendingBlock) {
  kernels::CommParams p{};
  p.rank = 0, p.dp_size = 1, p.world_size = 8, p.max_msgs_per_src = 4096, p.all_p2p = 1;
  p.num_local_experts = 32, p.dispatch_slices = 4, p.num_scales = 56, p.topk = 8;  // V3 over 8 ranks, FP8
  const int blocks = 40;
  for (int m : {0, 1, 4}) {  // 2 m <= blocks: the last m blocks send one token each; m * K <= 32
    EXPECT_TRUE(dispatch_decode_kernel(p, kernels::TokenCount{m, nullptr, 4096}, blocks)) << m;
    for (int b = 0; b < blocks; ++b)
      EXPECT_LE(kernels::send_chunk_begin(m, b + 1, blocks) - kernels::send_chunk_begin(m, b, blocks), 1) << m << " " << b;
  }
  for (int m : {5, 20})  // one token per block, but more own entries than a warp's lanes
    EXPECT_FALSE(dispatch_decode_kernel(p, kernels::TokenCount{m, nullptr, 4096}, blocks)) << m;
  p.topk = 2;  // 16 tokens x 2 entries fill the lanes; 20 blocks send one each
  EXPECT_TRUE(dispatch_decode_kernel(p, kernels::TokenCount{16, nullptr, 4096}, blocks));
  EXPECT_FALSE(dispatch_decode_kernel(p, kernels::TokenCount{17, nullptr, 4096}, blocks));
  p.topk = 1;
  EXPECT_TRUE(dispatch_decode_kernel(p, kernels::TokenCount{20, nullptr, 4096}, blocks));
  for (int m : {21, 64, 128, 1023})  // even chunks: a block may send a round of several tokens
    EXPECT_FALSE(dispatch_decode_kernel(p, kernels::TokenCount{m, nullptr, 4096}, blocks)) << m;
  p.topk = 8;
  EXPECT_FALSE(dispatch_decode_kernel(p, kernels::TokenCount{1, nullptr, 4096}, 0));
  // A device m is bounded by the rows it is clamped to (the small variant: no large-call object).
  const int32_t dev_m = 1;
  p.max_msgs_per_src = 512;
  EXPECT_TRUE(dispatch_decode_kernel(p, kernels::TokenCount{-1, &dev_m, 4}, blocks));
  EXPECT_FALSE(dispatch_decode_kernel(p, kernels::TokenCount{-1, &dev_m, 5}, blocks));
  // DP groups: a rank sends ceil((m - rank % D) / D) of the group's m.
  p.dp_size = 4, p.rank = 1;
  EXPECT_TRUE(dispatch_decode_kernel(p, kernels::TokenCount{17, nullptr, 4096}, blocks));   // 4 own
  EXPECT_FALSE(dispatch_decode_kernel(p, kernels::TokenCount{18, nullptr, 4096}, blocks));  // 5 own
  p.dp_size = 1, p.rank = 0;
  const kernels::TokenCount one{1, nullptr, 4096};
  p.packed = 1;  // the packed layout: expert rows from the peers' counts
  EXPECT_FALSE(dispatch_decode_kernel(p, one, blocks));
  p.packed = 0, p.num_scales = kernels::kDispatchDecodeMaxScales + 1;  // hidden > 16384: scales past the registers
  EXPECT_FALSE(dispatch_decode_kernel(p, one, blocks));
  p.num_scales = kernels::kDispatchDecodeMaxScales;
  EXPECT_TRUE(dispatch_decode_kernel(p, one, blocks));
  p.dispatch_slices = kernels::kDispatchDecodeMaxSlices + 1;  // no warp of a block left for the counts
  EXPECT_FALSE(dispatch_decode_kernel(p, one, blocks));
  p.dispatch_slices = kernels::kDispatchDecodeMaxSlices;
  EXPECT_TRUE(dispatch_decode_kernel(p, one, blocks));
  p.dispatch_slices = 4;
  p.all_p2p = 0;  // a rank reached by put-with-signal: the portable small variant
  EXPECT_FALSE(dispatch_decode_kernel(p, one, blocks));
  p.all_p2p = 1, p.world_size = 33, p.num_local_experts = 8;  // a rank per lane
  EXPECT_FALSE(dispatch_decode_kernel(p, one, blocks));
  p.world_size = 32;
  EXPECT_TRUE(dispatch_decode_kernel(p, one, blocks));
  p.max_msgs_per_src = 1 << 22, p.dispatch_slices = 14;  // 32 x 2^22 units x 14 x 14 > 2^32
  EXPECT_FALSE(dispatch_decode_kernel(p, one, blocks));
  p.dispatch_slices = 1;
  EXPECT_TRUE(dispatch_decode_kernel(p, one, blocks));
}

// combine_send's small P2P variant: the largest warp group (4, 2, 1 warps per slice) whose groups
// take every slice in one wave; a call past one wave of single warps keeps one warp per slice.
TEST(LaunchPlan, CombineSendGroupIsTheLargestThatFitsOneWave) {
  const int warps = kH200Sms * kernels::kWarpsPerBlock;  // 2112
  EXPECT_EQ(kernels::combine_send_group(7, warps), 4);          // V3 1 token at W = 1: 7 slices, 28 warps
  EXPECT_EQ(kernels::combine_send_group(528, warps), 4);        // exactly one wave of groups of 4
  EXPECT_EQ(kernels::combine_send_group(529, warps), 2);
  EXPECT_EQ(kernels::combine_send_group(896, warps), 2);        // V3 128 tokens at W = 1
  EXPECT_EQ(kernels::combine_send_group(1056, warps), 2);
  EXPECT_EQ(kernels::combine_send_group(1057, warps), 1);
  EXPECT_EQ(kernels::combine_send_group(1785, warps), 1);       // V3 128 tokens at EP2 (~255 messages)
  EXPECT_EQ(kernels::combine_send_group(100000, warps), 1);
  EXPECT_EQ(kernels::combine_send_group(0, warps), 4);          // nothing received: no warp has a slice
  EXPECT_EQ(kernels::combine_send_group(7, 16), 2);             // a one-block grid
  EXPECT_EQ(kernels::combine_send_group(int64_t{1} << 40, warps), 1);  // no overflow
  for (int64_t n = 0; n <= 3 * warps; ++n) {
    const int g = kernels::combine_send_group(n, warps);
    ASSERT_LE(n * g, std::max<int64_t>(warps, n)) << n;
    if (g < kernels::kMaxCombineGroup) ASSERT_GT(n * 2 * g, warps) << n << ": a larger group would fit";
  }
}

// The combine grid is sized for the group of the object's largest call, and for one warp per slice
// without the small P2P variant (the portable path never groups).
TEST(LaunchPlan, CombineGridGroupFollowsTheLargestCall) {
  const int warps = kH200Sms * kernels::kWarpsPerBlock;
  EXPECT_EQ(combine_grid_group(7, warps, true), 4);     // V3, M = 1, W = 1
  EXPECT_EQ(combine_grid_group(224, warps, true), 4);   // M = 32
  EXPECT_EQ(combine_grid_group(896, warps, true), 2);   // M = 128: 112 blocks, not 132
  EXPECT_EQ(combine_grid_group(8 * 128 * 7, warps, true), 1);  // EP8, M = 128: the grid as before
  EXPECT_EQ(combine_grid_group(7, warps, false), 1);
  EXPECT_EQ(combine_grid_group(896, warps, false), 1);
}

TEST(LaunchPlan, CombineUnitsPerToken) {
  EXPECT_EQ(kernels::local_combine_units(7168, 1), 28);  // 256 elements per unit
  EXPECT_EQ(kernels::local_combine_units(7168, 4), 7);   // 1024
  EXPECT_EQ(kernels::local_combine_units(2048, 1), 8);
  EXPECT_EQ(kernels::local_combine_units(264, 1), 2);    // a partial last unit
  EXPECT_EQ(kernels::local_combine_units(8, 4), 1);
}

TEST(LaunchPlan, BlocksForOneWarpPerUnit) {  // every kernel's grid (all_to_all.cu uses it too)
  EXPECT_EQ(blocks_for(0, kH200Sms), 1);
  EXPECT_EQ(blocks_for(16, kH200Sms), 1);
  EXPECT_EQ(blocks_for(17, kH200Sms), 2);
  EXPECT_EQ(blocks_for(int64_t{1} << 40, kH200Sms), kH200Sms);
}

// The general kernels' grids: DeepSeek-V3 at W = 1 has 4 dispatch slices (7168-byte fp8 payload)
// and 7 combine slices (7168 bf16); V3 at EP2 sends 2 messages per 1-token call.
TEST(LaunchPlan, GeneralBlocksSpreadDecodeUnits) {
  // One block per (message, slice, entry) of the copy and one per own token, which sends from a
  // block of its own (dispatch.cu, send_chunk_begin); one per (message, slice) of combine.
  GeneralBlocks g = general_blocks(1, 1, 1, 8, 4, 7, 28, kH200Sms);
  EXPECT_EQ(g.dispatch, 33);  // 4 (message, slice) warp units would have packed into 1 block
  EXPECT_EQ(g.combine, 7);    // 28 warp units (7 slices x groups of 4) into 2
  g = general_blocks(2, 1, 1, 8, 4, 7, 56, kH200Sms);  // EP2, 1 token
  EXPECT_EQ(g.dispatch, 65);
  EXPECT_EQ(g.combine, 14);
  EXPECT_EQ(general_blocks(4, 4, 4, 8, 4, 7, 112, kH200Sms).dispatch, 132);  // W = 1, 4 tokens: 128 + 4
  // DP groups: a rank sends ceil(M / D) of its group's M tokens (W = 2, D = 2, M = 4: 2 per source,
  // 4 messages, 2 own tokens).
  EXPECT_EQ(general_blocks(4, 4, 2, 8, 4, 7, 112, kH200Sms).dispatch, 130);
  // The token side's (token, slice) units count for combine: fewer messages than tokens.
  EXPECT_EQ(general_blocks(1, 4, 1, 8, 4, 7, 28, kH200Sms).combine, 28);
  // Larger objects: capped at max_blocks.
  g = general_blocks(128, 128, 128, 8, 4, 7, 896 * 2, kH200Sms);
  EXPECT_EQ(g.dispatch, kH200Sms);
  EXPECT_EQ(g.combine, kH200Sms);
  // Never below 16 warp units to a block (top-1, one slice: the entries add little).
  g = general_blocks(1, 1, 1, 1, 1, 1, 64, kH200Sms);
  EXPECT_EQ(g.dispatch, 2);  // the copy's unit and the sender's block
  EXPECT_EQ(g.combine, 4);
  g = general_blocks(1, 1, 1, 8, 4, 7, 28, 5);  // a num_sms cap below the units
  EXPECT_EQ(g.dispatch, 5);
  EXPECT_EQ(g.combine, 5);
  EXPECT_THROW(general_blocks(1, 1, 1, 8, 4, 7, 28, 0), Error);
}

// The general dispatch's block mappings (kernel_params.hpp) on the grids general_blocks gives, as
// dispatch_send and dispatch_recv use them: every own token sends from exactly one block, chunks in
// block order, one token to each of the grid's last blocks when they are at most half of it; every
// receive-copy unit goes to exactly one (block, warp, pass); when copy_skips_senders holds (which
// is also when a sending block leaves before the data wait) no sending block has a unit; decode
// copies fit one wave (at most one unit per warp). Message counts are drawn at random below the
// object's bound, fresh each run.
TEST(LaunchPlan, GeneralDispatchMappingsCoverEveryTokenAndUnitOnce) {
  std::mt19937 rng(std::random_device{}());
  const int kw = kernels::kWarpsPerBlock;
  int skipped = 0, spread = 0;
  for (const int W : {1, 2, 4, 8})
    for (const int D : {1, 2})
      for (const int M : {1, 2, 3, 4, 7, 16, 33, 64, 128, 512}) {
        if (D > W || W % D != 0) continue;
        const int n_own = (M + D - 1) / D;
        for (const int K : {1, 6, 8})
          for (const int nsd : {1, 4, 7}) {
            const int64_t max_msgs = static_cast<int64_t>(W) * n_own;
            const int G = general_blocks(max_msgs, M, n_own, K, nsd, 7, 28, kH200Sms).dispatch;
            const unsigned nb = static_cast<unsigned>(G);
            SCOPED_TRACE(::testing::Message() << "W " << W << " D " << D << " M " << M << " K " << K << " nsd " << nsd
                                              << " grid " << G);
            // The send half's chunks.
            std::vector<int> owner(n_own, -1);
            for (unsigned b = 0; b < nb; ++b) {
              const int u0 = kernels::send_chunk_begin(n_own, b, nb), u1 = kernels::send_chunk_begin(n_own, b + 1, nb);
              ASSERT_LE(0, u0);
              ASSERT_LE(u0, u1);
              ASSERT_LE(u1, n_own);
              if (kernels::send_from_last_blocks(n_own, nb)) {
                ASSERT_EQ(u1 - u0, static_cast<int>(b) >= G - n_own ? 1 : 0) << "block " << b;
              }
              for (int u = u0; u < u1; ++u) owner[u] = static_cast<int>(b);
            }
            for (int u = 0; u < n_own; ++u) ASSERT_GE(owner[u], 0) << "token " << u << " sent by no block";
            ASSERT_EQ(kernels::send_chunk_begin(n_own, nb, nb), n_own);
            const int sender_blocks = kernels::sender_blocks_of(n_own, nb);
            // The receive copy, for message counts up to the object's bound.
            const int nw = G * kw;
            for (int rep = 0; rep < 4; ++rep) {
              const int msgs = rep == 0 ? 1 : rep == 1 ? static_cast<int>(max_msgs)
                                                       : static_cast<int>(rng() % (max_msgs + 1));
              const int kx = kernels::copy_entries(msgs, nsd, K, nw);
              const int units = msgs * nsd * kx;
              ASSERT_TRUE(kx == 1 || (kx == K && units <= nw));
              const bool skips = kernels::copy_skips_senders(units, sender_blocks, G - sender_blocks);
              skipped += skips;
              spread += !skips && units <= nw;
              std::vector<int> seen(units, 0);
              for (unsigned b = 0; b < nb; ++b)
                for (int w = 0; w < kw; ++w) {
                  int passes = 0;
                  for (int q = kernels::copy_first_unit(units, sender_blocks, b, w, nb); q < units; q += nw) {
                    ASSERT_GE(q, 0);
                    ++seen[q], ++passes;
                    if (skips) ASSERT_LT(static_cast<int>(b), G - sender_blocks) << "unit " << q << " on a sending block";
                  }
                  if (units <= nw) ASSERT_LE(passes, 1) << "block " << b << " warp " << w;
                }
              for (int q = 0; q < units; ++q) ASSERT_EQ(seen[q], 1) << "unit " << q << " of " << units;
            }
          }
      }
  // Both decode mappings were exercised: units past the senders, and one per block over the grid.
  EXPECT_GT(skipped, 0);
  EXPECT_GT(spread, 0);
}

// recv_map's rows (layout.hpp, kRecvMapHead): dispatch_recv numbers the messages it copies in
// map_order_source's order and stores each at its number (after the own rows, which the large fused
// calls' send half writes at j); combine_send reads row q for the q-th message, and its large calls
// a source's message j at that source's first row + j. For random per-source counts: every
// (source, j) gets one row, the rows are 0 .. total - 1, own messages take the first ones, and the
// combine's large-call row is the dispatch's.
TEST(LaunchPlan, RecvMapRowsAreDenseOwnFirstAndAgreeAcrossKernels) {
  std::mt19937 rng(std::random_device{}());
  int checked = 0;
  for (const int W : {1, 2, 3, 4, 7, 8, 16, 33, 64})
    for (int me = 0; me < W; me += (W > 8 ? 5 : 1))
      for (const int S : {1, 4, 128})
        for (const bool direct_self : {false, true})
          for (int rep = 0; rep < 3; ++rep) {
            SCOPED_TRACE(::testing::Message() << "W " << W << " me " << me << " S " << S << " direct_self "
                                              << direct_self << " rep " << rep);
            std::vector<int> nmsg(W);
            for (int& n : nmsg) n = rep == 0 ? S : static_cast<int>(rng() % (S + 1));
            // The order is a permutation of the sources, ours first, then me + 1, ... (mod W).
            std::vector<int> pos_of(W, -1);
            for (int i = 0; i < W; ++i) {
              const int s = kernels::map_order_source(me, i, W);
              ASSERT_GE(s, 0);
              ASSERT_LT(s, W);
              ASSERT_EQ(pos_of[s], -1) << "source " << s << " twice";
              pos_of[s] = i;
              ASSERT_EQ(s, (me + i) % W);
            }
            // dispatch_recv: the copies' prefix in that order (none of ours with direct_self).
            std::vector<int> msg_off(W + 1, 0);
            for (int i = 0; i < W; ++i)
              msg_off[i + 1] = msg_off[i] + (direct_self && i == 0 ? 0 : nmsg[kernels::map_order_source(me, i, W)]);
            int total = 0;
            for (int n : nmsg) total += n;
            std::vector<std::vector<int>> row(W);
            for (int s = 0; s < W; ++s) row[s].assign(nmsg[s], -1);
            if (direct_self)
              for (int j = 0; j < nmsg[me]; ++j) row[me][j] = j;  // write_own
            for (int qm = 0; qm < msg_off[W]; ++qm) {
              int sp = 0;  // source_of_message: the last position whose prefix is <= qm
              while (sp + 1 < W && msg_off[sp + 1] <= qm) ++sp;
              const int s = kernels::map_order_source(me, sp, W), j = qm - msg_off[sp];
              ASSERT_LT(j, nmsg[s]);
              ASSERT_EQ(row[s][j], -1) << "message (" << s << ", " << j << ") copied twice";
              row[s][j] = direct_self ? qm + nmsg[me] : qm;
            }
            std::vector<int> seen(total, 0);
            for (int s = 0; s < W; ++s)
              for (int j = 0; j < nmsg[s]; ++j) {
                const int r = row[s][j];
                ASSERT_GE(r, 0) << "message (" << s << ", " << j << ") has no row";
                ASSERT_LT(r, total);
                ++seen[r];
                if (s == me) ASSERT_EQ(r, j) << "own messages take the first rows";
              }
            for (int r = 0; r < total; ++r) ASSERT_EQ(seen[r], 1) << "row " << r;
            // combine_send's large calls: each source's first row, in the same order.
            std::vector<int> first(W);
            for (int i = 0, acc = 0; i < W; ++i) {
              const int s = kernels::map_order_source(me, i, W);
              first[s] = acc;
              acc += nmsg[s];
            }
            for (int s = 0; s < W; ++s)
              for (int j = 0; j < nmsg[s]; ++j) ASSERT_EQ(first[s] + j, row[s][j]) << "message (" << s << ", " << j << ")";
            ++checked;
          }
  EXPECT_GT(checked, 100);
}

TEST(LaunchPlan, ZeroBlocksIsAnError) {
  try {
    local_shapes(1, 8, 256, 7168, 7168, 0);
    FAIL() << "max_blocks = 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_blocks = 0"), std::string::npos) << e.what();
  }
}

// World size 1: a unit's token, piece and k (and the one-wave combine's token) are n / L by one
// multiply (kernels::small_div): exact for every divisor up to 4096 over the numerators the local
// kernels use (q < 2^20), checked at every multiple of L and its neighbours (where a wrong floor
// would first show) and at random numerators; and at the range's edge, n * L = 2^32.
TEST(LaunchPlan, SmallDivIsTheExactQuotient) {
  std::mt19937 rng(std::random_device{}());
  for (int L = 1; L <= 4096; ++L) {
    const uint64_t mul = kernels::small_div_mul(L);
    auto check = [&](int n) {
      if (n < 0 || static_cast<uint64_t>(n) * static_cast<uint64_t>(L) > (uint64_t{1} << 32)) return;
      if (kernels::small_div(n, mul) != n / L) FAIL() << "n = " << n << ", L = " << L << ": " << kernels::small_div(n, mul);
    };
    for (int n = 0; n < (1 << 20); n += L) {
      check(n - 1), check(n), check(n + 1), check(n + L - 1);
      if (::testing::Test::HasFatalFailure()) return;
    }
    for (int i = 0; i < 256; ++i) check(static_cast<int>(rng() % (1u << 20)));
    const int edge = static_cast<int>(std::min<uint64_t>((uint64_t{1} << 32) / static_cast<uint64_t>(L), INT32_MAX));
    check(edge), check(edge - 1);
  }
}

// The general kernels' unit arithmetic (dispatch's receive copy and count matrix, combine's
// units): div_by_mul is n / d for every slice count a message or row can have (up to 129: hidden
// 65536 in fp32 plus a header), every count-matrix row (L + 1 <= 4097, sampled past 160) and every
// numerator: both sides of the multiply's range edge (n * d = 2^32, where it switches to the
// division), multiples of d and their neighbours below 2^20, random numerators up to INT32_MAX.
TEST(LaunchPlan, DivByMulIsTheQuotientOverTheWholeRange) {
  std::mt19937 rng(std::random_device{}());
  std::vector<int> divisors;
  for (int d = 1; d <= 160; ++d) divisors.push_back(d);
  for (int i = 0; i < 64; ++i) divisors.push_back(161 + static_cast<int>(rng() % (4097 - 161)));
  divisors.push_back(4097);
  for (const int d : divisors) {
    const uint64_t mul = kernels::small_div_mul(d);
    auto check = [&](int64_t n64) {
      if (n64 < 0 || n64 > INT32_MAX) return;
      const int n = static_cast<int>(n64);
      if (kernels::div_by_mul(n, d, mul) != n / d) FAIL() << "n = " << n << ", d = " << d << ": " << kernels::div_by_mul(n, d, mul);
    };
    for (int n = 0; n < (1 << 20); n += d) check(n - 1), check(n), check(n + 1), check(n + d - 1);
    const int64_t edge = static_cast<int64_t>((uint64_t{1} << 32) / static_cast<uint64_t>(d));
    for (int64_t n = edge - 2 * d; n <= edge + 2 * d; ++n) check(n);
    for (int i = 0; i < 4096; ++i) check(static_cast<int64_t>(rng() % (static_cast<uint64_t>(INT32_MAX) + 1)));
    check(INT32_MAX);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace epkit::host
