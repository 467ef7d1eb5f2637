// Work mappings of the general (W >= 2) kernels that host and device share: which tokens, units and
// rows each block and warp takes. constexpr, so the CPU suite checks on the host's grids that they
// cover every token and unit exactly once (tests/cpu/test_launch_plan.cpp).
#pragma once

#include <cstdint>

#include "comm/kernels/fastdiv.hpp"
#include "comm/kernels/params.hpp"

namespace epkit::kernels {

// Own tokens per rank from which the large-call paths run (look-back histogram, own tokens fanned
// out by the send half, source-interleaved combine with batched flags). They cost 1-2 us per call
// at decode sizes even when not taken, so each kernel has a variant without them, and the host
// launches the large variant only for objects whose ceil(M / D) reaches this.
inline constexpr int kLargeCallTokens = 1024;
// Own tokens the general dispatch's send half places per round (its shared-memory arrays hold one round).
inline constexpr int kDispatchRoundTokens = 64;
// Tokens a rank sends of its DP group's m (tokens t = u * D + rank % D), on the host and the device.
constexpr int own_tokens(int m, int rank, int dp_size) {
  return m > rank % dp_size ? (m - rank % dp_size + dp_size - 1) / dp_size : 0;
}
// The same with i = rank % D and mul = small_div_mul(D) given (CommParams::group_index, dp_mul): a
// multiply instead of two divisions. m - i + D - 1 < 2^20 (m <= kMaxTokensPerRank, D <= 1024)
// keeps it inside small_div's range (CPU-tested against own_tokens).
constexpr int own_tokens_by_mul(int m, int group_index, int dp_size, uint64_t mul) {
  return m > group_index ? small_div(m - group_index + dp_size - 1, mul) : 0;
}
// Where the scales of expert_x row `row` go in expert_x_scale: element `first`, then every `step`.
// Row-major [rows, S]: row * S, step 1. With scales_mn_major (masked: row = e * capacity + j) each
// expert's block is [S, capacity]: e * S * capacity + j, step capacity (CPU-tested).
struct ScaleSpot {
  int64_t first;
  int step;
};
constexpr ScaleSpot scale_spot(const CommParams& p, int row) {
  if (!p.scales_mn_major) return {static_cast<int64_t>(row) * p.num_scales, 1};
  const int e = div_by_mul(row, p.capacity, p.capacity_mul);
  return {static_cast<int64_t>(e) * p.num_scales * p.capacity + (row - e * p.capacity), p.capacity};
}
// recv_map's order (layout.hpp, kRecvMapHead): the source at position i (0 <= i < W) of rank me's
// received messages, its own first, then me + 1, ..., W - 1, 0, ..., me - 1. dispatch_recv numbers
// the messages it copies in this order, a copy's number being its row (after the own rows when the
// large fused calls' send half wrote those), and combine_send's large calls find each source's first
// row by the same order (CPU-tested: the rows are dense and both sides agree).
constexpr int map_order_source(int me, int i, int W) { return me + i < W ? me + i : me + i - W; }

// combine_send's small P2P variant (combine.cu): the G warps of a group share one partial slice,
// each summing 1 / G of its chunks over 2 G rows at a time, so that a message's local experts take
// G times fewer dependent row loads (eight 16-byte loads in flight per lane at every G). G is the
// largest of 4, 2, 1 whose groups take every slice of the call in one wave of the grid's warps: in
// more than one wave the fewer loads in flight per warp would cost more than the rounds save. The
// host sizes the combine grid with combine_grid_group.
inline constexpr int kMaxCombineGroup = 4;
constexpr int combine_send_group(int64_t slices, int64_t warps) {
  return slices * kMaxCombineGroup <= warps ? kMaxCombineGroup : slices * 2 <= warps ? 2 : 1;
}
// Block mappings of the general dispatch kernel (host and device: the CPU suite checks that they
// cover every token and unit once, tests/cpu/test_local_shape.cpp).
//
// First of the n items of block b's chunk when n items are split into nb contiguous chunks
// (items b * n / nb ...). 32-bit: n <= kMaxTokensPerRank and b <= nb <= kMaxGridBlocks keep the
// product inside int32 (protocol.cuh asserts it); the int64 form was two division calls ahead
// of every dispatch's first load.
constexpr int chunk_begin(int n, unsigned b, unsigned nb) { return static_cast<int>(static_cast<unsigned>(n) * b / nb); }
// The own tokens' chunks of dispatch's small send half: one token to each of the grid's last n blocks
// when n is at most half the grid (send_from_last_blocks), else chunk_begin's even chunks. Either
// way block b's chunk comes before block b + 1's. The blocks before the senders then take the
// receive copy's units (dispatch_recv), which in a sending block would start only after its send
// half. With more senders than that, the copy's units never fit the other blocks, and the last
// blocks in a row measured 0.2 us slower than the even spread (V3 and V2-Lite at 128 tokens).
constexpr bool send_from_last_blocks(int n, unsigned nb) { return 2 * n <= static_cast<int>(nb); }
constexpr int send_chunk_begin(int n, unsigned b, unsigned nb) {
  return send_from_last_blocks(n, nb) ? (static_cast<int>(b) - (static_cast<int>(nb) - n) > 0
                                             ? static_cast<int>(b) - (static_cast<int>(nb) - n) : 0)
                                      : chunk_begin(n, b, nb);
}
// The sending blocks of a small call of the fused kernel: its n own tokens, one per block, when
// send_from_last_blocks holds; else none (the tokens spread in even chunks, no block sends alone).
constexpr int sender_blocks_of(int n, unsigned nb) { return send_from_last_blocks(n, nb) ? n : 0; }

// dispatch's decode kernel (dispatch.cu): the small P2P variant compiled for calls whose own tokens
// send one per block from the grid's last blocks (send_from_last_blocks on the launch's grid, for the
// largest m the call may have: the host's, or the rows a device m is clamped to), so that the send
// half runs one round and reads every index from the histogram's copy; on the masked layout; with
// at most kDispatchDecodeMaxScales scales per token (hidden <= 16384 with 128-wide FP8 blocks),
// which the copies hold in registers; and where every unit index times its divisor fits small_div
// (the receive copy's (message, slice) units, the count matrix's rows), so no division fallback is
// compiled. The receive half's conditions are the object's, the same on every rank. 2,752 -> 2,448
// SASS instructions; dispatch -0.4 us at 1-4 tokens on one H200.
// Its send half (dispatch_send_decode) holds every own entry in one warp's lanes and
// every destination rank in one lane each: at most kWarpSize own entries (own tokens x K) and ranks.
// Its slices take the first dispatch_slices warps of a block, its message-index row one more, and
// the last block's count units at least one more (kDispatchDecodeMaxSlices).
inline constexpr int kDispatchDecodeMaxScales = 128;
inline constexpr int kDispatchDecodeMaxSlices = kWarpsPerBlock - 2;
inline constexpr int kDecodeMaxRanks = 32;  // combine's decode kernel: one rank per lane of warp_message_total

// The receive copy's work for msgs messages of nsd slices on nw warps: entries per (message, slice)
// unit, K when the (message, slice, entry) units fit one wave (decode), else 1.
constexpr int copy_entries(int msgs, int nsd, int K, int nw) { return msgs > 0 && msgs * nsd * K <= nw ? K : 1; }
// Whether the copy's units leave the grid's last sender_blocks (the fused kernel's sending blocks)
// free: they then fit the warps of the cb = gridDim.x - sender_blocks blocks before them.
constexpr bool copy_skips_senders(int units, int sender_blocks, int cb) {
  return sender_blocks > 0 && units <= cb * kWarpsPerBlock;
}
// The first copy unit of warp `warp` of block b in a grid of nb blocks (then every nb * kWarpsPerBlock
// units; >= units: none). Units spread one per block first when they fit one wave (block-uniform
// choice), over the blocks before the senders when they fit those (copy_skips_senders).
constexpr int copy_first_unit(int units, int sender_blocks, unsigned b, int warp, unsigned nb) {
  const int cb = static_cast<int>(nb) - sender_blocks;
  return copy_skips_senders(units, sender_blocks, cb)
             ? (static_cast<int>(b) < cb ? warp * cb + static_cast<int>(b) : units)
         : units <= static_cast<int>(nb) * kWarpsPerBlock ? warp * static_cast<int>(nb) + static_cast<int>(b)
                                                          : static_cast<int>(b) * kWarpsPerBlock + warp;
}

}  // namespace epkit::kernels
