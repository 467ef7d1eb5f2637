// make_comm_params (src/comm/host/comm_params.cpp): every field of the kernels' parameters from a
// config, its layouts and the addresses an AllToAll allocated. The kernels trust these fields
// without checking them, so each is compared with the formula it must equal.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "comm/host/comm_params.hpp"
#include "comm/host/launch_plan.hpp"
#include "comm/kernels/fastdiv.hpp"
#include "comm/kernels/mapping.hpp"
#include "comm/local/mapping.hpp"
#include "common/buffer_layout.hpp"
#include "epkit/error.hpp"
#include "epkit/shapes.hpp"

namespace epkit::host {
namespace {

AllToAllConfig config(int W, int rank, int D, int E, int K, int H, int M, DType dispatch) {
  AllToAllConfig c;
  c.world_size = W;
  c.rank = rank;
  c.dp_size = D;
  c.num_experts = E;
  c.topk = K;
  c.hidden = H;
  c.max_tokens_per_rank = M;
  c.dispatch_dtype = dispatch;
  return c;
}

uint8_t* fake(uintptr_t a) { return reinterpret_cast<uint8_t*>(a); }

struct Made {
  SymmetricLayout sym;
  WorkspaceLayout ws;
  CommAddresses at;
  kernels::CommParams p;
};

Made make(const AllToAllConfig& c, bool every_p2p) {
  Made m;
  m.sym = SymmetricLayout::make(c, every_p2p);
  m.ws = WorkspaceLayout::make(c);
  m.at.sym = fake(0x7f0000000000);
  m.at.workspace = fake(0x7e0000000000);
  m.at.error = reinterpret_cast<kernels::ErrorRecord*>(0x7d0000000000);
  for (int r = 0; r < c.world_size; ++r) m.at.peers.push_back(every_p2p ? fake(0x600000000000 + (uintptr_t(r) << 32)) : nullptr);
  m.p = make_comm_params(c, m.sym, m.ws, m.at);
  return m;
}

TEST(CommParams, ShapesAndSizesFollowTheConfigAndLayout) {
  const AllToAllConfig c = config(8, 3, 2, 256, 8, 7168, 128, DType::kFP8E4M3);
  const Made m = make(c, true);
  const kernels::CommParams& p = m.p;
  EXPECT_EQ(p.rank, 3);
  EXPECT_EQ(p.world_size, 8);
  EXPECT_EQ(p.dp_size, 2);
  EXPECT_EQ(p.group_index, 1);
  EXPECT_EQ(p.num_experts, 256);
  EXPECT_EQ(p.num_local_experts, 32);
  EXPECT_EQ(p.topk, 8);
  EXPECT_EQ(p.hidden, 7168);
  EXPECT_EQ(p.max_tokens, 128);
  EXPECT_EQ(p.max_msgs_per_src, 64);  // ceil(M / D)
  EXPECT_EQ(p.capacity, effective_capacity(c));
  EXPECT_EQ(p.num_scales, 56);
  EXPECT_EQ(p.msg_bytes, static_cast<int>(m.sym.msg.bytes));
  EXPECT_EQ(p.header_bytes, static_cast<int>(m.sym.msg.header_bytes));
  EXPECT_EQ(p.payload_bytes, 7168);
  EXPECT_EQ(p.payload_offset, static_cast<int>(m.sym.msg.payload_offset));
  EXPECT_EQ(p.out_row_bytes, 7168 * 2);
  EXPECT_EQ(p.dispatch_slices, static_cast<int>(m.sym.msg.slices));
  EXPECT_EQ(p.combine_slices, static_cast<int>(m.sym.combine_slices));
  EXPECT_EQ(p.packed, 0);
  EXPECT_EQ(p.packed_rows, 0);
  EXPECT_EQ(p.weights_at_dispatch, 0);
  EXPECT_EQ(p.timeout_ns, static_cast<uint64_t>(resolved_timeout_ms(c)) * 1000000ull);
  EXPECT_EQ(p.hist_stride, static_cast<int>(m.ws.hist_stride));
}

TEST(CommParams, EveryBufferIsTheLayoutsOffsetFromItsBase) {
  AllToAllConfig c = config(4, 1, 1, 64, 6, 2048, 256, DType::kBF16);
  c.weights_at_dispatch = true;
  const Made m = make(c, true);
  const kernels::CommParams& p = m.p;
  const SymmetricLayout& s = m.sym;
  EXPECT_EQ(p.sym, m.at.sym);
  EXPECT_EQ(p.off_dispatch_recv, s.dispatch_recv);
  EXPECT_EQ(p.off_dispatch_stage, s.dispatch_stage);
  EXPECT_EQ(p.off_dispatch_counts, s.dispatch_counts);
  EXPECT_EQ(p.off_dispatch_count_stage, s.dispatch_count_stage);
  EXPECT_EQ(p.off_dispatch_count_flag, s.dispatch_count_flag);
  EXPECT_EQ(p.off_dispatch_recv_ctr, s.dispatch_recv_ctr);
  EXPECT_EQ(p.off_weights_recv, s.weights_recv);
  EXPECT_EQ(p.off_weights_stage, s.weights_stage);
  EXPECT_EQ(p.off_weights_recv_ctr, s.weights_recv_ctr);
  EXPECT_EQ(p.off_combine_recv, s.combine_recv);
  EXPECT_EQ(p.off_combine_stage, s.combine_stage);
  EXPECT_EQ(p.off_combine_flag, s.combine_flag);
  EXPECT_EQ(p.off_barrier_flag, s.barrier_flag);
  const WorkspaceLayout& w = m.ws;
  uint8_t* ws = m.at.workspace;
  EXPECT_EQ(reinterpret_cast<uint8_t*>(p.state), ws + w.state);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(p.send_slot), ws + w.send_slot);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(p.num_msgs), ws + w.num_msgs);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(p.recv_base), ws + w.recv_base);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(p.weights_base), ws + w.weights_base);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(p.recv_map), ws + w.recv_map);
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(p.peer_bases), ws + w.peer_bases);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(p.block_hist), ws + w.block_hist);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(p.block_flag), ws + w.block_flag);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(p.local_counts), ws + w.local_counts);
  EXPECT_EQ(p.err, m.at.error);
  EXPECT_EQ(p.weights_at_dispatch, 1);
}

TEST(CommParams, PeersInTheParametersAndTheP2PAgreement) {
  const AllToAllConfig c = config(12, 0, 1, 96, 8, 1024, 64, DType::kBF16);
  const Made all = make(c, true);
  EXPECT_EQ(all.p.all_p2p, 1);
  for (int r = 0; r < kernels::kParamPeers; ++r) EXPECT_EQ(all.p.peer_param[r], all.at.peers[r]) << r;
  // Decode objects whose every rank maps every peer send tagged partials in double-width rows.
  EXPECT_EQ(all.p.tagged_partials, 1);
  EXPECT_EQ(all.p.combine_row_bytes, 2 * all.p.out_row_bytes);

  const Made none = make(c, false);
  EXPECT_EQ(none.p.all_p2p, 0);
  EXPECT_EQ(none.p.tagged_partials, 0);
  EXPECT_EQ(none.p.combine_row_bytes, none.p.out_row_bytes);
  for (int r = 0; r < kernels::kParamPeers; ++r) EXPECT_EQ(none.p.peer_param[r], nullptr) << r;

  // One rank without P2P makes the object not all-P2P, whatever the others map.
  Made one = make(c, true);
  one.at.peers[5] = nullptr;
  EXPECT_EQ(make_comm_params(c, one.sym, one.ws, one.at).all_p2p, 0);
  // Fewer ranks than parameter slots: the slots past W are null.
  const Made two = make(config(2, 1, 1, 8, 2, 256, 8, DType::kBF16), true);
  for (int r = 2; r < kernels::kParamPeers; ++r) EXPECT_EQ(two.p.peer_param[r], nullptr) << r;
}

TEST(CommParams, MultipliersAreTheExactQuotients) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int W = 1 << std::uniform_int_distribution<int>(0, 5)(rng);
    const int D = 1 << std::uniform_int_distribution<int>(0, 3)(rng);
    if (D > W) continue;
    const int L = std::uniform_int_distribution<int>(1, 16)(rng);
    const int K = std::uniform_int_distribution<int>(1, std::min(16, L * W))(rng);
    const int H = 128 * std::uniform_int_distribution<int>(1, 64)(rng);
    const int M = std::uniform_int_distribution<int>(1, 600)(rng);
    const DType dt = trial % 2 ? DType::kFP8E4M3 : DType::kBF16;
    const AllToAllConfig c = config(W, W - 1, D, L * W, K, H, M, dt);
    const kernels::CommParams p = make(c, trial % 3 != 0).p;
    for (int n = 0; n < 5000; n += 7) {
      ASSERT_EQ(kernels::small_div(n, p.topk_mul), n / K) << n << " / " << K;
      ASSERT_EQ(kernels::small_div(n, p.dp_mul), n / D);
      ASSERT_EQ(kernels::small_div(n, p.dispatch_slices_mul), n / p.dispatch_slices);
      ASSERT_EQ(kernels::small_div(n, p.combine_slices_mul), n / p.combine_slices);
      ASSERT_EQ(kernels::small_div(n, p.counts_row_mul), n / (L + 1));
      for (int u : {kernels::kLocalSmallPieceChunks, kernels::kLocalLargePieceChunks, kernels::kLocalWidePieceChunks}) {
        const int pieces = kernels::local_pieces_per_row(p.payload_bytes, u);
        ASSERT_EQ(kernels::small_div(n, p.piece_mul[kernels::piece_mul_index(u)]), n / pieces) << u;
      }
      for (int ch = 1; ch <= 2; ++ch)
        ASSERT_EQ(kernels::small_div(n, p.wave_units_mul[ch - 1]), n / kernels::local_combine_units(H, ch));
    }
    for (int e = 0; e < L * W; ++e) ASSERT_EQ(kernels::expert_rank(e, p.rank_div), e / L);
  }
}

// Where dispatch stores each row's scales (kernels::scale_spot): row-major, or each expert's
// [ns, capacity] block with expert_scales_mn_major; every (row, scale) lands on its own element.
TEST(CommParams, ScaleSpotsCoverTheScaleTensorOnce) {
  for (bool mn : {false, true})
    for (int cap : {0, 1, 7, 33}) {  // 0: M * W = 64
      AllToAllConfig c = config(2, 1, 1, 8, 2, 640, 32, DType::kFP8E4M3);
      c.capacity = cap;
      c.expert_scales_mn_major = mn;
      validate(c);
      const kernels::CommParams p = make(c, true).p;
      const int L = 4, C = effective_capacity(c), ns = 5;
      ASSERT_EQ(p.num_scales, ns);
      ASSERT_EQ(p.scales_mn_major, mn ? 1 : 0);
      std::vector<int> hits(static_cast<size_t>(L) * C * ns, 0);
      for (int row = 0; row < L * C; ++row) {
        const kernels::ScaleSpot at = kernels::scale_spot(p, row);
        const int e = row / C, j = row % C;
        for (int s = 0; s < ns; ++s) {
          const int64_t i = at.first + static_cast<int64_t>(s) * at.step;
          ASSERT_EQ(i, mn ? (static_cast<int64_t>(e) * ns + s) * C + j : static_cast<int64_t>(row) * ns + s)
              << "mn " << mn << " cap " << C << " row " << row << " scale " << s;
          ++hits[static_cast<size_t>(i)];
        }
      }
      for (int h : hits) ASSERT_EQ(h, 1);
    }
}

TEST(CommParams, PackedLayoutCarriesItsRows) {
  AllToAllConfig c = config(2, 0, 1, 16, 4, 512, 32, DType::kFP8E4M3);
  c.layout = ExpertLayout::kPacked;
  c.packed_row_align = 128;
  const kernels::CommParams p = make(c, true).p;
  EXPECT_EQ(p.packed, 1);
  EXPECT_EQ(p.packed_rows, effective_packed_rows(c));
  EXPECT_EQ(p.packed_row_align, 128);
}

TEST(CommParams, PeerCountMustMatchTheWorld) {
  const AllToAllConfig c = config(4, 0, 1, 16, 2, 256, 8, DType::kBF16);
  Made m = make(c, true);
  m.at.peers.pop_back();
  EXPECT_THROW(make_comm_params(c, m.sym, m.ws, m.at), Error);
}

// The object's grids: the general kernels' at W >= 2, the world-size-1 ones when local, and never
// more blocks than the cap.
TEST(CommParams, ObjectShapesStayInsideTheGrid) {
  for (int W : {1, 2, 8}) {
    for (int M : {1, 128, 4096}) {
      const AllToAllConfig c = config(W, 0, 1, 256, 8, 7168, M, DType::kFP8E4M3);
      const kernels::CommParams p = make(c, true).p;
      for (int max_blocks : {1, 20, 132}) {
        for (bool local : {false, true}) {
          if (local && W != 1) continue;
          const ObjectShapes o = object_shapes(p, max_blocks, local);
          EXPECT_GE(o.dispatch.blocks, 1);
          EXPECT_LE(o.dispatch.blocks, max_blocks);
          EXPECT_GE(o.combine.blocks, 1);
          EXPECT_LE(o.combine.blocks, max_blocks);
          EXPECT_LE(o.dispatch.smem_bytes, size_t{227} * 1024) << W << " " << M;
          if (!local) EXPECT_EQ(o.local_piece_chunks, 0);
        }
      }
    }
  }
  const kernels::CommParams p = make(config(2, 0, 1, 16, 2, 256, 8, DType::kBF16), true).p;
  EXPECT_THROW(object_shapes(p, 0, false), Error);
  EXPECT_THROW(object_shapes(p, kMaxGridBlocks + 1, false), Error);
}

}  // namespace
}  // namespace epkit::host
