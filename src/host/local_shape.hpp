// Launch shapes of the world-size-1 kernels (local.cu): pure C++, CPU-tested, computed once per
// AllToAll object from its largest call.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kernel_params.hpp"

namespace epkit::host {

struct LocalShapes {
  kernels::LaunchShape dispatch;  // every dispatch kernel (fused, send half, receive half)
  kernels::LaunchShape combine;
  int piece_chunks = 0;           // small objects: CommParams::local_piece_chunks; large: 0
};

// Blocks of kThreadsPerBlock threads for one warp per unit: ceil(warp_units / warps per block),
// at least 1 and at most max_blocks (every kernel's grid, not only the local ones').
int blocks_for(int64_t warp_units, int max_blocks);

// Grids of the general (W >= 2) kernels, dispatch.cu and combine.cu, for an object whose largest
// call receives max_msgs = W * S messages of dispatch_slices / combine_slices slices, with top-k and
// max_tokens tokens per rank. The kernels give a call whose units fit one wave one unit per block
// first (unit q to block q % gridDim.x), so the grids hold at least one block per (message, slice,
// entry) unit of dispatch's receive copy and per (message, slice) group of combine (and per (token,
// slice) of its token side), up to max_blocks: a decode call then has each unit on an SM of its
// own (session 18: V3 at 1 token 24.3 -> 21.4 us per pair at W = 1). Never fewer than one warp
// per (message, slice) unit of dispatch and per combine_warp_units unit of combine, 16 to a block.
// Dispatch also has a block per own token (max_own_tokens, ceil(M / D)) beside the copy's: the fused
// kernel's small calls send each own token from a block of the grid's end that takes no copy unit
// (dispatch.cu, send_chunk_begin).
struct GeneralBlocks {
  int dispatch = 1;
  int combine = 1;
};
GeneralBlocks general_blocks(int64_t max_msgs, int max_tokens, int max_own_tokens, int topk, int dispatch_slices,
                             int combine_slices, int64_t combine_warp_units, int max_blocks);

// Shared memory of the dispatch kernel (bytes): the counts, then the large path's round arrays or
// the small path's per-warp counters and one (expert, rank) pair per entry of the largest call.
size_t local_dispatch_smem_bytes(int num_experts, int topk, int max_tokens);

// The small dispatch's piece of a row: the 512-byte piece when all (token, piece, k) units of the
// largest call fit in one wave of max_blocks blocks, else the 2 KB one.
int local_piece_chunks(int max_tokens, int topk, int payload_bytes, int max_blocks);

// Shapes for an object of max_tokens tokens and top-k, payload_bytes per token and hidden
// elements per output row, on at most max_blocks blocks (>= 1). Small objects: one block per
// (token, piece, k) unit of the largest call for dispatch and per (token, 256 elements) for combine,
// up to max_blocks (the kernels give unit q to block q % gridDim.x); large ones (max_tokens >=
// kLocalLargeTokens): every block for dispatch, 16 units of (token, 1024 elements) per block for
// combine.
LocalShapes local_shapes(int max_tokens, int topk, int num_experts, int payload_bytes, int hidden, int max_blocks);

}  // namespace epkit::host
