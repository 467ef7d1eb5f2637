// Which kernel variant and grid each call takes: pure C++, decided on the host before the launch
// from what the host knows (the object's parameters, the call's token count, the grid), and
// CPU-tested (tests/cpu/test_launch_plan.cpp). The kernels compile one variant per choice; code a
// call never runs still costs it instruction fetches at decode, so a decode call takes a kernel
// that holds only its own path.
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm/kernels/launch.hpp"
#include "comm/kernels/mapping.hpp"
#include "comm/local/mapping.hpp"

namespace epkit::host {

using kernels::CommParams;
using kernels::TokenCount;

// --- The general (W >= 2) kernels ------------------------------------------------------------------

// Objects whose ceil(M / D) reaches kLargeCallTokens can take the large-call paths (look-back
// histogram, own tokens fanned out by the send half, source-interleaved combine with batched flags).
bool large_capable(const CommParams& p);
// The large variant for this call: an object that can take the large-call paths, and a call that
// may: m on the device, or own tokens of a host m at least kLargeCallTokens. A smaller host-m call
// runs the small variant: the same work, since dispatch takes its large-call paths only from
// kLargeCallTokens own tokens and combine's large variant changes only the order of its messages
// and the batching of its flags, so an object sized for prefill does not pay the large variants'
// fixed cost at decode (measured at EP2 when they were split: dispatch +1.6 us, combine +0.6 at 1 token).
bool large_variant(const CommParams& p, const TokenCount& m);
// The large variant where large_variant says so; else, for an object whose every rank is
// P2P-mapped (one NVLink domain), the small variant with the portable path's branches compiled out
// (code a call never takes still costs it at decode: 1.5 us per pair); else the small variant.
enum class KernelVariant { kSmall, kSmallP2P, kLarge };
KernelVariant kernel_variant(const CommParams& p, const TokenCount& m);
// combine's decode kernel: the small P2P variant compiled for objects with tagged partials (every
// P2P object of at most kTaggedPartialMaxTokens tokens per rank) on at most kDecodeMaxRanks ranks,
// where each warp counts its messages by itself. It holds only the paths such a call takes: 3,520
// SASS instructions against the small P2P kernel's 6,776; the code a call never ran cost the pair
// 0.3-0.6 us at 1-4 tokens (one H100, same-run A/B).
bool combine_decode_kernel(const CommParams& p, const TokenCount& m);
// dispatch's decode kernel: the small P2P variant compiled for calls whose own tokens send one per
// block from the grid's last blocks (for the largest m the call may have: the host's, or the rows a
// device m is clamped to), at most 32 own entries (tokens x K), at most 32 ranks, the masked layout,
// at most kDispatchDecodeMaxScales scales per token, and unit indices inside small_div's range (no
// division fallback compiled). Dispatch -0.4 us at 1-4 tokens on one H200.
bool dispatch_decode_kernel(const CommParams& p, const TokenCount& m, int blocks);
kernels::DispatchKernel dispatch_kernel(const CommParams& p, const TokenCount& m, int blocks);
kernels::CombineKernel combine_kernel(const CommParams& p, const TokenCount& m);

// Warps per slice the host sizes the combine grid for: the group (kernels::combine_send_group) of
// the object's largest call (every message of every source received, max_slices slices) on
// max_warps warps; 1 without the small P2P variant. Sized for groups of four everywhere, a
// 128-token object at W = 1 ran 132 blocks instead of 56 and lost what G = 2 gained (every block
// adds fixed work, and the last one waits for all of them).
int combine_grid_group(int64_t max_slices, int64_t max_warps, bool all_p2p);


// --- Grids -----------------------------------------------------------------------------------------

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
// own (V3 at 1 token 24.3 -> 21.4 us per pair at W = 1). Never fewer than one warp
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


// Dynamic shared memory of the general kernels (the carving of dispatch.cu and combine.cu).
size_t dispatch_smem_bytes(int world_size, int num_experts, int topk);
size_t combine_smem_bytes(int world_size);
// Warp-sized work units of combine's largest half; with general_blocks they size its grid.
// group: warps per send slice the grid is sized for (combine_grid_group).
int64_t combine_units(int world_size, int max_msgs_per_src, int max_tokens, int slices, int group);

// An object's grids: what every call of it launches (the general kernels, or the world-size-1
// kernels when `local`), on at most max_blocks blocks (num_sms, the SMs, kMaxGridBlocks).
struct ObjectShapes {
  kernels::LaunchShape dispatch, combine;
  int local_piece_chunks = 0;  // CommParams::local_piece_chunks
};
ObjectShapes object_shapes(const CommParams& p, int max_blocks, bool local);

// --- World size 1: the one-path kernels of fused host-m calls -------------------------------------
// The one-path dispatch and the one-wave combine are chosen from the call's own m and the launch
// grid, not from the object's largest call, so that an object sized for an engine's largest batch
// (M of 4096, a large object) runs its decode calls on the decode kernels.
// The piece of a one-path call: local_call_piece_chunks, or the 4 KB piece where the 2 KB units
// take more than one wave and the 4 KB ones fit in one.
int local_fused_piece_chunks(int m, int topk, int payload_bytes, int warps);
kernels::LocalFusedDispatch local_fused_dispatch(bool large_object, int m, int topk, int payload_bytes, int warps);
// The one-wave combine's 16-byte chunks per lane for a fused host-m call (1: 256-element units, 2:
// 512-element units for calls whose 256-element units would take two waves), 0: the general kernel.
int local_fused_combine_chunks(int m, int hidden, int warps);

}  // namespace epkit::host
