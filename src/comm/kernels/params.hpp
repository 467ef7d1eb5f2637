// The kernels' named-field arguments: the per-object parameters (CommParams, built once by
// host::make_comm_params), the per-call tensors (DispatchIO, CombineIO) and the device state in the
// workspace. Host code fills them after validation; kernels take nothing else.
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm/kernels/errors.hpp"

namespace epkit::kernels {

// Block shape every kernel is compiled for (ptx.cuh names them kThreads and kWarps).
inline constexpr int kThreadsPerBlock = 512;
inline constexpr int kWarpsPerBlock = kThreadsPerBlock / 32;

// Per-object device state in the local workspace.
struct DeviceState {
  // The call in flight, or the next one: calls completed + 1 (the host sets 1 at creation). Stored
  // ahead so that a kernel's first instruction on the loaded value is its first real use: with
  // "calls completed" every kernel added 1 right after the load and waited for it there.
  // Read by the dispatch kernels only; advanced by the combine_recv kernel's tail warp at its start
  // (the layer's dispatch kernels, its only readers, are complete by then).
  uint64_t seq;
  int32_t aborted;         // set after a timeout so every other wait returns at once
  int32_t error_lock;      // first-writer-wins lock for the ErrorRecord
  // The combine kernels' copy of seq: written by the dispatch_recv kernel's block 0, read by the
  // combine kernels only, so that combine may advance seq without waiting for its own blocks.
  uint64_t combine_seq;
  // World size 1 (local.cu).
  uint64_t local_arrive;   // large fused dispatch: blocks arrived, cumulative (gridDim.x per call)
  int32_t local_m;         // dispatch_send's m, for the dispatch_recv that places the staged tokens
  int32_t local_pad;
};

// Offsets into the symmetric heap (copied from SymmetricLayout) and sizes, for every kernel.
// Ranks whose peer base travels in the kernel parameters (CommParams::peer_param): one NVLink
// domain of 8 GPUs; ranks past it read the device table.
inline constexpr int kParamPeers = 8;

struct CommParams {
  // The fields the W = 1 decode kernels read, first: the parameter block sits in the constant bank
  // from 0x210 and each kernel's first read of a 64-byte line there is a miss on every SM (the launch
  // probe: 14 parameter words on 8 lines cost 0.15 us more than on one). These 48 bytes share the
  // bank's line 0x200, the next 64 bytes fill line 0x240.
  int topk, hidden, num_experts;
  int capacity;          // masked layout: slots per local expert
  int num_scales;        // fp32 scales per token (0 without fp8)
  int payload_bytes;
  int max_tokens;        // M
  int weights_at_dispatch;  // 1: weights travel in the dispatch header, combine exchanges none
  int packed;            // 1: packed layout (expert e's rows from an aligned offset), 0: masked
  int packed_rows;       // packed: R
  int num_local_experts;
  int local_piece_chunks;   // W = 1, M < kLocalLargeTokens: 16-byte chunks per lane of one scatter unit (1 or 4)
  int32_t* recv_map;    // [W * S][kRecvMapHead + K] (layout.hpp); W = 1's own kernels (local.cu): [M][K + 1]
  uint8_t* sym;                 // this rank's symmetric base (nvshmem addresses)
  size_t off_weights_recv;
  // World size 1 (local.cu): small_div_mul of the divisors of its unit arithmetic, so that a unit's
  // token, piece and k (and the one-wave combine's token) take a multiply each instead of a division.
  uint64_t topk_mul;          // K
  uint64_t piece_mul[3];      // local_pieces_per_row(payload_bytes, U) for U = 1, 4, 8 (piece_mul_index)
  uint64_t wave_units_mul[2]; // local_combine_units(hidden, c) for c = 1, 2

  int rank, world_size, dp_size;
  int max_msgs_per_src;  // ceil(M / D)
  int msg_bytes, header_bytes, payload_offset, out_row_bytes;
  int dispatch_slices;  // slices per dispatch message (arrival counters count slices)
  int combine_slices;   // slices per combine output row (one flag each)
  uint64_t timeout_ns;

  uint8_t* const* peer_bases;   // [W] peer address of the symmetric base; null: use put-with-signal
  // The first kParamPeers entries of peer_bases, in the parameters themselves: a kernel reads them
  // from the constant bank instead of with a dependent global load before every peer store.
  uint8_t* peer_param[kParamPeers];
  size_t off_dispatch_recv, off_dispatch_stage, off_dispatch_counts, off_dispatch_count_stage;
  size_t off_dispatch_count_flag, off_dispatch_recv_ctr, off_weights_stage, off_weights_recv_ctr;
  size_t off_combine_recv, off_combine_stage, off_combine_flag, off_barrier_flag;

  DeviceState* state;
  int32_t* send_slot;   // [S][W]
  int32_t* num_msgs;    // [W]
  uint64_t* recv_base;     // [W] dispatch slices consumed per source, over all earlier calls
  uint64_t* weights_base;  // [W] weight rows per source over all calls up to the one in flight (dispatch_recv adds its own)
  int32_t* block_hist;  // [kMaxGridBlocks][hist_stride]: each dispatch block's (expert, destination) counts
  uint64_t* block_flag; // [kMaxGridBlocks]: seq of the call whose block_hist row is written
  int hist_stride;      // E + W rounded up to 4 (rows are read as int4)
  ErrorRecord* err;     // host-mapped
  int packed_row_align;  // packed: every offset is a multiple of this
  int32_t* local_counts; // [E], world size 1: large dispatch's per-expert counters (zeroed by combine),
                         // or dispatch_send's totals for dispatch_recv
  int all_p2p;           // 1: every rank's base is P2P-mapped (no put-with-signal anywhere)
  uint32_t rank_div;     // expert_rank_div(L): e / L as one multiply (expert_rank)
  int combine_row_bytes; // stride of combine_recv's rows (SymmetricLayout::combine_row_bytes)
  int tagged_partials;   // 1: combine's partials travel as tagged words (kTaggedPartialMaxTokens); only
                         // set where every rank has every peer P2P-mapped, so only the small P2P
                         // variants (which every call of such an object takes) read it
  // The DP group arithmetic of every general kernel's first instructions, from the host: rank % D
  // and a multiply for / D (small_div). Computed in the kernels, they were two inlined divisions
  // (about 70 instructions) that every warp ran before the dispatch's first index load.
  int group_index;       // rank % dp_size
  uint64_t dp_mul;       // small_div_mul(dp_size)
  // The slice arithmetic of the units of dispatch's receive copy and of combine (div_by_mul): the
  // two to four inlined divisions by the slice counts were most of the ~200 instructions between
  // the receive half's data barrier and its first load.
  uint64_t dispatch_slices_mul;  // small_div_mul(dispatch_slices)
  uint64_t combine_slices_mul;   // small_div_mul(combine_slices)
  uint64_t counts_row_mul;       // small_div_mul(num_local_experts + 1): the receive half's count matrix
  int scales_mn_major;           // 1: expert_x_scale is [L, num_scales, capacity] (masked only; scale_spot)
  uint64_t capacity_mul;         // small_div_mul(capacity)
};
static_assert(offsetof(CommParams, recv_map) == 48 && offsetof(CommParams, wave_units_mul) == 104,
              "the W = 1 decode fields fill the parameter block's first 112 bytes");

// Index dtype codes for topk_idx.
enum IndexType : int32_t { kIdxInt32 = 0, kIdxInt64 = 1, kIdxUInt32 = 2 };

struct TokenCount {
  int host_m;             // >= 0: m given on the host
  const int32_t* dev_m;   // else: one-element device int
  int rows;               // first dimension of the token-side tensors (device m is clamped to it)
};

struct DispatchIO {
  const uint8_t* x;           // [rows, H] payload
  const float* x_scale;       // [rows, num_scales] or null
  const void* topk_idx;       // [rows, K]
  int32_t idx_type;
  const float* topk_weights;  // [rows, K] with weights_at_dispatch, else null
  TokenCount m;
  uint8_t* expert_x;          // [L, capacity, H] (masked) or [R, H] (packed)
  float* expert_x_scale;      // [rows of expert_x, num_scales], [L, num_scales, capacity] (scales_mn_major), or null
  int32_t* expert_num_tokens; // [L]
  int32_t* expert_offsets;    // [L + 1], packed only (else null)
};

struct CombineIO {
  const void* expert_y;       // [L, capacity, H] or [R, H] in dtype (rows as dispatched)
  const void* topk_idx;       // [rows, K]
  int32_t idx_type;
  const float* topk_weights;  // [rows, K]
  TokenCount m;
  void* out;                  // [rows, H] out dtype
};

// CommParams::piece_mul's slot of a piece of piece_chunks 16-byte chunks per lane.
constexpr int piece_mul_index(int piece_chunks) { return piece_chunks == 1 ? 0 : piece_chunks == 4 ? 1 : 2; }

// Grid of one kernel; every block has kThreadsPerBlock threads.
struct LaunchShape {
  int blocks;
  size_t smem_bytes;
};

}  // namespace epkit::kernels
