#include "comm/host/launch_plan.hpp"

#include <algorithm>
#include <cstdint>

#include "common/buffer_layout.hpp"
#include "epkit/error.hpp"

namespace epkit::host {



bool large_capable(const CommParams& p) { return p.max_msgs_per_src >= kernels::kLargeCallTokens; }

bool large_variant(const CommParams& p, const TokenCount& m) {
  return large_capable(p) &&
         (m.dev_m != nullptr || kernels::own_tokens(m.host_m, p.rank, p.dp_size) >= kernels::kLargeCallTokens);
}

KernelVariant kernel_variant(const CommParams& p, const TokenCount& m) {
  return large_variant(p, m) ? KernelVariant::kLarge : p.all_p2p != 0 ? KernelVariant::kSmallP2P : KernelVariant::kSmall;
}

bool combine_decode_kernel(const CommParams& p, const TokenCount& m) {
  return kernel_variant(p, m) == KernelVariant::kSmallP2P && p.tagged_partials != 0 &&
         p.world_size <= kernels::kDecodeMaxRanks;
}

bool dispatch_decode_kernel(const CommParams& p, const TokenCount& m, int blocks) {
  if (kernel_variant(p, m) != KernelVariant::kSmallP2P || p.packed != 0 || p.num_scales > kernels::kDispatchDecodeMaxScales)
    return false;
  if (p.world_size > 32 || p.dispatch_slices > kernels::kDispatchDecodeMaxSlices) return false;
  constexpr uint64_t kSmallDivRange = uint64_t{1} << 32;
  const uint64_t W = static_cast<uint64_t>(p.world_size), S = static_cast<uint64_t>(p.max_msgs_per_src);
  const uint64_t nsd = static_cast<uint64_t>(p.dispatch_slices), L1 = static_cast<uint64_t>(p.num_local_experts) + 1;
  if (W * S * nsd * nsd > kSmallDivRange || W * L1 * L1 > kSmallDivRange) return false;
  const int m_max = m.dev_m != nullptr ? m.rows : m.host_m;
  const int own = kernels::own_tokens(m_max, p.rank, p.dp_size);
  return blocks > 0 && kernels::send_from_last_blocks(own, static_cast<unsigned>(blocks)) &&
         static_cast<int64_t>(own) * p.topk <= 32;
}

kernels::DispatchKernel dispatch_kernel(const CommParams& p, const TokenCount& m, int blocks) {
  using K = kernels::DispatchKernel;
  const KernelVariant v = kernel_variant(p, m);
  return v == KernelVariant::kLarge           ? K::kLarge
         : dispatch_decode_kernel(p, m, blocks) ? K::kDecode
         : v == KernelVariant::kSmallP2P      ? K::kSmallP2P
                                              : K::kSmall;
}

kernels::CombineKernel combine_kernel(const CommParams& p, const TokenCount& m) {
  using K = kernels::CombineKernel;
  const KernelVariant v = kernel_variant(p, m);
  return v == KernelVariant::kLarge        ? K::kLarge
         : combine_decode_kernel(p, m)     ? K::kDecode
         : v == KernelVariant::kSmallP2P   ? K::kSmallP2P
                                           : K::kSmall;
}

int combine_grid_group(int64_t max_slices, int64_t max_warps, bool all_p2p) {
  return all_p2p ? kernels::combine_send_group(max_slices, max_warps) : 1;
}


int blocks_for(int64_t warp_units, int max_blocks) {
  const int64_t b = (warp_units + kernels::kWarpsPerBlock - 1) / kernels::kWarpsPerBlock;
  return static_cast<int>(std::clamp<int64_t>(b, 1, max_blocks));
}

namespace {
constexpr int kWarps = kernels::kWarpsPerBlock;

// Small objects spread their units one per block first (local.cu maps unit q to block
// q % gridDim.x): as many blocks as units, up to max_blocks.
int spread_blocks(int64_t warp_units, int max_blocks) {
  return static_cast<int>(std::clamp<int64_t>(warp_units, 1, max_blocks));
}
}  // namespace

GeneralBlocks general_blocks(int64_t max_msgs, int max_tokens, int max_own_tokens, int topk, int dispatch_slices,
                             int combine_slices, int64_t combine_warp_units, int max_blocks) {
  EPKIT_CHECK(max_blocks >= 1, "general_blocks: max_blocks = ", max_blocks, " must be at least 1");
  GeneralBlocks g;
  g.dispatch = std::max(blocks_for(max_msgs * dispatch_slices, max_blocks),
                        spread_blocks(max_msgs * dispatch_slices * topk + max_own_tokens, max_blocks));
  const int64_t groups = std::max(max_msgs, static_cast<int64_t>(max_tokens)) * combine_slices;
  g.combine = std::max(blocks_for(combine_warp_units, max_blocks), spread_blocks(groups, max_blocks));
  return g;
}

size_t local_dispatch_smem_bytes(int num_experts, int topk, int max_tokens) {
  const size_t E = static_cast<size_t>(num_experts), K = static_cast<size_t>(topk);
  const size_t path = max_tokens >= kernels::kLocalLargeTokens
                          ? E + 2 * static_cast<size_t>(kernels::kLocalRoundTokens) * K + 1  // run, round arrays, last
                          : static_cast<size_t>(kernels::local_rank_warps(num_experts)) * E +
                                2 * static_cast<size_t>(max_tokens) * K;  // per-warp counters, ent, rk
  return (kernels::local_count_smem_ints(num_experts) + path) * sizeof(int);
}

int local_piece_chunks(int max_tokens, int topk, int payload_bytes, int max_blocks) {
  return kernels::local_call_piece_chunks(max_tokens, topk, payload_bytes, max_blocks * kWarps);
}

LocalShapes local_shapes(int max_tokens, int topk, int num_experts, int payload_bytes, int hidden, int max_blocks) {
  EPKIT_CHECK(max_blocks >= 1, "local_shapes: max_blocks = ", max_blocks, " must be at least 1");
  LocalShapes s;
  const bool large = max_tokens >= kernels::kLocalLargeTokens;
  s.dispatch.smem_bytes = local_dispatch_smem_bytes(num_experts, topk, max_tokens);
  if (large) {
    s.dispatch.blocks = max_blocks;
  } else {
    s.piece_chunks = local_piece_chunks(max_tokens, topk, payload_bytes, max_blocks);
    const int64_t units = static_cast<int64_t>(max_tokens) * topk *
                          kernels::local_pieces_per_row(payload_bytes, s.piece_chunks);
    s.dispatch.blocks = spread_blocks(units, max_blocks);
  }
  const int64_t combine_units = static_cast<int64_t>(max_tokens) * kernels::local_combine_units(hidden, large ? 4 : 1);
  s.combine.blocks = large ? blocks_for(combine_units, max_blocks) : spread_blocks(combine_units, max_blocks);
  s.combine.smem_bytes = 0;
  return s;
}


size_t dispatch_smem_bytes(int world_size, int num_experts, int topk) {
  const size_t send = 2 * static_cast<size_t>(num_experts) + 3 * static_cast<size_t>(world_size) +
                      3 * static_cast<size_t>(kernels::kDispatchRoundTokens) * topk;
  const size_t L = static_cast<size_t>(num_experts / world_size);
  const size_t recv = 2 * static_cast<size_t>(num_experts) + 2 * static_cast<size_t>(world_size) + 1 + 2 * L + 1 +
                      kernels::kWarpsPerBlock;
  return (send > recv ? send : recv) * sizeof(int);
}

size_t combine_smem_bytes(int world_size) { return (2 * static_cast<size_t>(world_size) + 2) * sizeof(int); }

int64_t combine_units(int world_size, int max_msgs_per_src, int max_tokens, int slices, int group) {
  const int64_t send = static_cast<int64_t>(world_size) * max_msgs_per_src * slices * group;
  const int64_t recv = static_cast<int64_t>(max_tokens) * slices;
  return send > recv ? send : recv;
}

ObjectShapes object_shapes(const CommParams& p, int max_blocks, bool local) {
  EPKIT_CHECK(max_blocks >= 1 && max_blocks <= kMaxGridBlocks, "object_shapes: max_blocks = ", max_blocks,
              " must be in [1, ", kMaxGridBlocks, "]");
  ObjectShapes o;
  if (local) {
    const LocalShapes ls = local_shapes(p.max_tokens, p.topk, p.num_experts, p.payload_bytes, p.hidden, max_blocks);
    o.dispatch = ls.dispatch;
    o.combine = ls.combine;
    o.local_piece_chunks = ls.piece_chunks;
    return o;
  }
  const int64_t max_slices = static_cast<int64_t>(p.world_size) * p.max_msgs_per_src * p.combine_slices;
  const int group = combine_grid_group(max_slices, static_cast<int64_t>(max_blocks) * kernels::kWarpsPerBlock, p.all_p2p != 0);
  const GeneralBlocks gb = general_blocks(
      static_cast<int64_t>(p.world_size) * p.max_msgs_per_src, p.max_tokens, p.max_msgs_per_src, p.topk,
      p.dispatch_slices, p.combine_slices,
      combine_units(p.world_size, p.max_msgs_per_src, p.max_tokens, p.combine_slices, group), max_blocks);
  o.dispatch = {gb.dispatch, dispatch_smem_bytes(p.world_size, p.num_experts, p.topk)};
  o.combine = {gb.combine, combine_smem_bytes(p.world_size)};
  return o;
}

int local_fused_piece_chunks(int m, int topk, int payload_bytes, int warps) {
  using namespace kernels;
  const int pc = local_call_piece_chunks(m, topk, payload_bytes, warps);
  const auto units = [&](int chunks) { return static_cast<int64_t>(m) * topk * local_pieces_per_row(payload_bytes, chunks); };
  return pc == kLocalLargePieceChunks && units(pc) > warps && units(kLocalWidePieceChunks) <= warps ? kLocalWidePieceChunks
                                                                                                      : pc;
}

kernels::LocalFusedDispatch local_fused_dispatch(bool large_object, int m, int topk, int payload_bytes, int warps) {
  using namespace kernels;
  if (m >= kLocalLargeTokens) return {false, LocalSmallPath::kRank, 0};
  int pc = local_fused_piece_chunks(m, topk, payload_bytes, warps);
  const int n = m * topk;
  LocalSmallPath path = local_small_path(n, n * local_pieces_per_row(payload_bytes, pc), warps);
  // The 4 KB piece is compiled for the scan path only (one wave of n <= warps entries ranks there
  // on every GPU of up to kLocalScanWork warps); elsewhere the 2 KB piece.
  if (pc == kLocalWidePieceChunks && path != LocalSmallPath::kScan) {
    pc = kLocalLargePieceChunks;
    path = local_small_path(n, n * local_pieces_per_row(payload_bytes, pc), warps);
  }
  // The block ranking keeps an (expert, rank) pair per entry of the object's largest call in shared
  // memory, which a large object's launch does not have: its calls that rank in blocks stay general.
  if (large_object && path == LocalSmallPath::kRank) return {false, path, 0};
  return {true, path, pc};
}

int local_fused_combine_chunks(int m, int hidden, int warps) {
  using namespace kernels;
  if (m >= kLocalLargeTokens) return 0;
  if (static_cast<int64_t>(m) * local_combine_units(hidden, 1) <= warps) return 1;
  if (static_cast<int64_t>(m) * local_combine_units(hidden, 2) <= warps) return 2;
  return 0;
}

}  // namespace epkit::host
