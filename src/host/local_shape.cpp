#include "host/local_shape.hpp"

#include <algorithm>
#include <cstdint>

#include "epkit/error.hpp"

namespace epkit::host {

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

}  // namespace epkit::host
