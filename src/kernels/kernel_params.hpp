// Named-field kernel arguments. Host code fills them after validation; kernels take nothing else.
#pragma once

#include <cstddef>
#include <cstdint>

namespace epkit::kernels {

// Error codes a kernel can record (ErrorRecord::code).
enum ErrorCode : int32_t {
  kErrNone = 0,
  kErrTimeout = 1,          // a wait ran past timeout_ns; peer says whose signal never came
  kErrCapacity = 2,         // more tokens for a local expert than capacity (excess dropped)
  kErrExpertIndex = 3,      // topk index >= num_experts (entry skipped)
  kErrNumTokens = 4,        // device-side m > max_tokens_per_rank or > rows (clamped)
  kErrPackedRows = 5,       // packed layout: rows past R (excess dropped); expert = one that lost rows
};

// What a wait was for (ErrorRecord::what) and which call (ErrorRecord::phase).
enum Phase : int32_t { kPhaseDispatchSend = 0, kPhaseDispatchRecv = 1, kPhaseCombineSend = 2, kPhaseCombineRecv = 3 };
enum WaitWhat : int32_t {
  kWaitNone = 0, kWaitDispatchCounts = 1, kWaitDispatchData = 2, kWaitWeights = 3, kWaitPartial = 4, kWaitBarrier = 5,
  kWaitBlockHistogram = 6  // dispatch_send's look-back over earlier blocks of the same grid (local)
};

// First error a kernel records; lives in host-mapped pinned memory so the host reads it without a sync.
struct ErrorRecord {
  volatile int32_t code;
  int32_t phase;
  int32_t what;
  int32_t rank;
  int32_t peer;
  int32_t expert;
  int32_t token;
  int32_t pad;
  int64_t value;
  int64_t limit;
  uint64_t seq;
};

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
};
static_assert(offsetof(CommParams, recv_map) == 48 && offsetof(CommParams, wave_units_mul) == 104,
              "the W = 1 decode fields fill the parameter block's first 112 bytes");

// The rank holding expert e, e / L, without a division (a runtime division is ~20 instructions,
// and the general kernels had eleven inlined copies): (e * 2^8 * d) >> 32 with d = ceil(2^24 / L).
// Exact for 0 <= e < 4096 and 1 <= L <= 4096 (config.cpp's kMaxExperts): with d * L = 2^24 + r,
// 0 <= r < L, e * d / 2^24 = e / L + e * r / (L * 2^24), and e * r < 2^24 keeps the excess below
// 1 / L, less than e / L's distance to the next integer (CPU-tested over every e and L).
constexpr uint32_t expert_rank_div(int L) { return static_cast<uint32_t>(((1u << 24) + L - 1) / L); }
constexpr int expert_rank(int e, uint32_t div) {
  return static_cast<int>((static_cast<uint64_t>(static_cast<uint32_t>(e) << 8) * div) >> 32);
}

// n / L without a division, for 1 <= L and n * L <= 2^32: (n * ceil(2^32 / L)) >> 32. With
// ceil(2^32 / L) = (2^32 + r) / L, 0 <= r < L, the product over 2^32 is n / L + n * r / (L * 2^32), and
// n * r < 2^32 keeps the excess below 1 / L, where n / L's fraction is at most (L - 1) / L: the floor
// is exact (CPU-tested). A runtime 32-bit division is ~20 instructions with a reciprocal in its chain.
constexpr uint64_t small_div_mul(int L) { return ((uint64_t{1} << 32) + static_cast<uint64_t>(L) - 1) / static_cast<uint64_t>(L); }
constexpr int small_div(int n, uint64_t mul) {
  return static_cast<int>((static_cast<uint64_t>(static_cast<uint32_t>(n)) * mul) >> 32);
}
// n / d for 0 <= n and 1 <= d, with mul = small_div_mul(d): one multiply where small_div is exact
// (n * d <= 2^32, which every unit of a decode call meets), the division beyond (CPU-tested).
constexpr int div_by_mul(int n, int d, uint64_t mul) {
  return static_cast<uint64_t>(n) * static_cast<uint64_t>(d) <= (uint64_t{1} << 32) ? small_div(n, mul) : n / d;
}
constexpr int piece_mul_index(int piece_chunks) { return piece_chunks == 1 ? 0 : piece_chunks == 4 ? 1 : 2; }

// recv_map's order (layout.hpp, kRecvMapHead): the source at position i (0 <= i < W) of rank me's
// received messages, its own first, then me + 1, ..., W - 1, 0, ..., me - 1. dispatch_recv numbers
// the messages it copies in this order, a copy's number being its row (after the own rows when the
// large fused calls' send half wrote those), and combine_send's large calls find each source's first
// row by the same order (CPU-tested: the rows are dense and both sides agree).
constexpr int map_order_source(int me, int i, int W) { return me + i < W ? me + i : me + i - W; }

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
  float* expert_x_scale;      // [rows of expert_x, num_scales] or null
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

// Own tokens per rank from which the large-call paths run (look-back histogram, own tokens fanned
// out by the send half, source-interleaved combine with batched flags). They cost 1-2 us per call
// at decode sizes even when not taken, so each kernel has a variant without them, and the host
// launches the large variant only for objects whose ceil(M / D) reaches this.
inline constexpr int kLargeCallTokens = 1024;
inline bool large_capable(const CommParams& p) { return p.max_msgs_per_src >= kLargeCallTokens; }
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
// The large variant for this call (dispatch.cu, combine.cu): an object that can take the large-call
// paths, and a call that may: m on the device, or own tokens of a host m at least kLargeCallTokens.
// A smaller host-m call runs the small variant: the same work, since dispatch takes its large-call
// paths only from kLargeCallTokens own tokens and combine's large variant changes only the order of
// its messages and the batching of its flags, so an object sized for prefill does not pay the large
// variants' fixed cost at decode (measured at EP2 when they were split: dispatch +1.6 us, combine
// +0.6 at 1 token, docs/perf-notes/2026-11-30-prefill.md).
inline bool large_variant(const CommParams& p, const TokenCount& m) {
  return large_capable(p) && (m.dev_m != nullptr || own_tokens(m.host_m, p.rank, p.dp_size) >= kLargeCallTokens);
}
// The kernel variant of a call (dispatch.cu, combine.cu): the large variant where large_variant
// says so; else, for an object whose every rank is P2P-mapped (one NVLink domain, the NVLink path),
// the small variant with the portable path's branches compiled out (code a call never takes still
// costs it at decode: 1.5 us per pair, docs/perf-notes/2026-12-01-general-kernels-s13.md); else
// the small variant.
enum class KernelVariant { kSmall, kSmallP2P, kLarge };
inline KernelVariant kernel_variant(const CommParams& p, const TokenCount& m) {
  return large_variant(p, m) ? KernelVariant::kLarge : p.all_p2p != 0 ? KernelVariant::kSmallP2P : KernelVariant::kSmall;
}

// combine's decode kernel (combine.cu): the small P2P variant compiled for one kind of object only,
// tagged partials (every P2P object of at most kTaggedPartialMaxTokens tokens per rank) on at most
// kDecodeMaxRanks ranks, where each warp counts its messages by itself (warp_message_total). It holds the
// paths such a call takes and nothing else: 3,520 SASS instructions against the small P2P kernel's
// 6,776 (its block-prefix path for more ranks and its untagged token side). Code a call never runs
// cost the pair 0.3-0.6 us at 1-4 tokens, and the 128-token graph 0.5-0.9 us (one H100, same-call
// A/B; on one H200 the pair within its spread, graph -0.2 to -0.5: docs/perf-notes/2026-12-05-decode-kernels-s30.md).
inline constexpr int kDecodeMaxRanks = 32;  // one rank per lane of warp_message_total
inline bool combine_decode_kernel(const CommParams& p, const TokenCount& m) {
  return kernel_variant(p, m) == KernelVariant::kSmallP2P && p.tagged_partials != 0 && p.world_size <= kDecodeMaxRanks;
}

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
// Warps per slice the host sizes the combine grid for: the group of the object's largest call
// (every message of every source received, max_slices slices) on max_warps warps; 1 without the
// small P2P variant. Sized for groups of four everywhere, a 128-token object at W = 1 ran 132 blocks
// instead of 56 and lost what G = 2 gained (session 14, call 1: every block adds fixed work, and the
// last one waits for all of them).
constexpr int combine_grid_group(int64_t max_slices, int64_t max_warps, bool all_p2p) {
  return all_p2p ? combine_send_group(max_slices, max_warps) : 1;
}

// World size 1 (local.cu): objects whose M reaches this count each block's own chunk of tokens and
// share per-expert counters (one grid-wide step for the packed layout) instead of every block
// counting every token. Not measured: at 512 tokens x top-8 the redundant count is 8 loads per thread.
inline constexpr int kLocalLargeTokens = 512;
constexpr bool local_large(const CommParams& p) { return p.max_tokens >= kLocalLargeTokens; }  // host and device

// Block shape every kernel is compiled for (device_common.cuh uses the same numbers).
inline constexpr int kThreadsPerBlock = 512;
inline constexpr int kWarpsPerBlock = kThreadsPerBlock / 32;

// Block mappings of the general dispatch kernel (host and device: the CPU suite checks that they
// cover every token and unit once, tests/cpu/test_local_shape.cpp).
//
// First of the n items of block b's chunk when n items are split into nb contiguous chunks
// (items b * n / nb ...). 32-bit: n <= kMaxTokensPerRank and b <= nb <= kMaxGridBlocks keep the
// product inside int32 (device_common.cuh asserts it); the int64 form was two division calls ahead
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
// SASS instructions (2,456 in the build measured); dispatch -0.4 us at 1-4 tokens on one H200 (docs/perf-notes/2026-12-05-decode-kernels-s30.md).
// Its send half (dispatch_send_decode, session 31) holds every own entry in one warp's lanes and
// every destination rank in one lane each: at most kWarpSize own entries (own tokens x K) and ranks.
// Its slices take the first dispatch_slices warps of a block, its message-index row one more, and
// the last block's count units at least one more (kDispatchDecodeMaxSlices).
inline constexpr int kDispatchDecodeMaxScales = 128;
inline constexpr int kDispatchDecodeMaxSlices = kWarpsPerBlock - 2;
inline bool dispatch_decode_kernel(const CommParams& p, const TokenCount& m, int blocks) {
  if (kernel_variant(p, m) != KernelVariant::kSmallP2P || p.packed != 0 || p.num_scales > kDispatchDecodeMaxScales)
    return false;
  if (p.world_size > 32 || p.dispatch_slices > kDispatchDecodeMaxSlices) return false;
  constexpr uint64_t kSmallDivRange = uint64_t{1} << 32;
  const uint64_t W = static_cast<uint64_t>(p.world_size), S = static_cast<uint64_t>(p.max_msgs_per_src);
  const uint64_t nsd = static_cast<uint64_t>(p.dispatch_slices), L1 = static_cast<uint64_t>(p.num_local_experts) + 1;
  if (W * S * nsd * nsd > kSmallDivRange || W * L1 * L1 > kSmallDivRange) return false;
  const int m_max = m.dev_m != nullptr ? m.rows : m.host_m;
  const int own = own_tokens(m_max, p.rank, p.dp_size);
  return blocks > 0 && send_from_last_blocks(own, static_cast<unsigned>(blocks)) &&
         static_cast<int64_t>(own) * p.topk <= 32;
}
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

// World size 1, the local kernels' shapes (local.cu; the host sizes their launches with
// host/local_shape.hpp). Large objects place their own tokens kLocalRoundTokens at a time. Small
// ones rank with up to kWarpsPerBlock warps of kLocalRankCounters / E shared-memory counters each,
// and scatter one piece of a row per warp: kLocalSmallPieceChunks or kLocalLargePieceChunks
// 16-byte chunks per lane (512 B or 2 KB; one-path scan calls also kLocalWidePieceChunks, 4 KB).
inline constexpr int kLocalRoundTokens = 64;
// Fused small dispatches of n = m * K entries, units (token, piece, k) over `warps` warps: each
// warp ranks its units' entries itself (local.cu, scan_rank: ~n / 64 loads per lane per unit) while
// that costs at most kLocalScanWork entries per warp (n times its units). Measured on one H200
// against the block-wide ranking: faster at V3 128 tokens (1024 x 2) and V2-Lite 256 (1536 x 1) and
// 384 (2304 x 2), even at V3 192 (1536 x 3), slower at V3 256 (2048 x 4) and 384.
inline constexpr int64_t kLocalScanWork = 4608;
constexpr bool local_scan_ranks(int n, int units, int warps) {
  return n > 32 && static_cast<int64_t>(n) * ((units + warps - 1) / warps) <= kLocalScanWork;
}
// The path of a fused small dispatch (local.cu): one warp ranks all n <= 32 entries (kTiny), each
// warp ranks its own entries (kScan, local_scan_ranks), or every block ranks all of them (kRank).
// The kernel applies it on the device; the host applies it to pick a one-path kernel for a call
// of known m.
enum class LocalSmallPath { kTiny, kScan, kRank };
constexpr LocalSmallPath local_small_path(int n, int units, int warps) {
  return n <= 32 ? LocalSmallPath::kTiny : local_scan_ranks(n, units, warps) ? LocalSmallPath::kScan : LocalSmallPath::kRank;
}
// Combine units per token (a warp's 16-byte chunks of 8 elements, chunks_per_lane per lane: 256 or
// 1024 elements), for the kernel and the host's launch shapes.
constexpr int local_combine_units(int hidden, int chunks_per_lane) {
  return (hidden / 8 + 32 * chunks_per_lane - 1) / (32 * chunks_per_lane);
}
// The scan path's split of the index words j < i (local.cu, lane_matches_below) for 16-byte loads:
// `head` words up to the first 16-byte boundary (the array starts mis words past one; words of
// 16 / per bytes, per words per vector), then nv whole vectors, then the tail words tail0 .. i - 1.
// Head and tail each hold fewer than `per` words, one per lane.
struct ScanSplit {
  int head, nv, tail0;
};
constexpr ScanSplit scan_split(int i, int mis, int per) {
  const int head = (per - mis) % per < i ? (per - mis) % per : i;
  const int nv = (i - head) / per;
  return {head, nv, head + nv * per};
}
inline constexpr int kLocalRankCounters = 8192;
inline constexpr int kLocalSmallPieceChunks = 1, kLocalLargePieceChunks = 4;
// The one-path scan dispatch also takes a 4 KB piece (local_fused_piece_chunks) when only that
// piece puts a call's units in one wave: V3 (7168-byte rows, K = 8) from 65 to 132 tokens on 132
// SMs, whose 2 KB units take two rounds of scan + store per warp.
inline constexpr int kLocalWidePieceChunks = 8;
constexpr int local_rank_warps(int num_experts) {
  return kLocalRankCounters / num_experts < 1 ? 1
         : kLocalRankCounters / num_experts > kWarpsPerBlock ? kWarpsPerBlock
                                                             : kLocalRankCounters / num_experts;
}
constexpr int local_pieces_per_row(int payload_bytes, int piece_chunks) {
  return (payload_bytes + 512 * piece_chunks - 1) / (512 * piece_chunks);
}
// The small dispatch's piece for a call of m tokens on a grid of `warps` warps: the 512-byte piece
// when all of its (token, piece, k) units fit in one wave, else the 2 KB one (fewer, longer units:
// measured faster at 128 tokens). host::local_piece_chunks applies it to an object's largest call.
constexpr int local_call_piece_chunks(int m, int topk, int payload_bytes, int warps) {
  return static_cast<int64_t>(m) * topk * local_pieces_per_row(payload_bytes, kLocalSmallPieceChunks) <= warps
             ? kLocalSmallPieceChunks
             : kLocalLargePieceChunks;
}
// Fused W = 1 calls whose m is given on the host (local.cu's launchers): the one-path dispatch and
// the one-wave combine are chosen from the call's own m and the launch grid, not from the object's
// largest call, so that an object sized for an engine's largest batch (M of 4096, a large object)
// runs its decode calls on the decode kernels. one_path false: the object's general kernel.
struct LocalFusedDispatch {
  bool one_path;
  LocalSmallPath path;
  int piece_chunks;
};
// The piece of a one-path call: local_call_piece_chunks, or the 4 KB piece where the 2 KB units
// take more than one wave and the 4 KB ones fit in one.
constexpr int local_fused_piece_chunks(int m, int topk, int payload_bytes, int warps) {
  const int pc = local_call_piece_chunks(m, topk, payload_bytes, warps);
  const auto units = [&](int chunks) { return static_cast<int64_t>(m) * topk * local_pieces_per_row(payload_bytes, chunks); };
  return pc == kLocalLargePieceChunks && units(pc) > warps &&
                 units(kLocalWidePieceChunks) <= warps
             ? kLocalWidePieceChunks
             : pc;
}
constexpr LocalFusedDispatch local_fused_dispatch(bool large_object, int m, int topk, int payload_bytes, int warps) {
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
// The one-wave combine's 16-byte chunks per lane for a fused host-m call (1: 256-element units, 2:
// 512-element units for calls whose 256-element units would take two waves), 0: the general kernel.
constexpr int local_fused_combine_chunks(int m, int hidden, int warps, bool two_chunks) {
  if (m >= kLocalLargeTokens) return 0;
  if (static_cast<int64_t>(m) * local_combine_units(hidden, 1) <= warps) return 1;
  if (two_chunks && static_cast<int64_t>(m) * local_combine_units(hidden, 2) <= warps) return 2;
  return 0;
}
// The small dispatch's shared memory, in ints: the counts (E), the packed first rows (E + 1), the
// prefix scratch (kWarpsPerBlock), then the path's own arrays.
constexpr size_t local_count_smem_ints(int num_experts) {
  return 2 * static_cast<size_t>(num_experts) + 1 + kWarpsPerBlock;
}

// Grid of one kernel; every block has kThreadsPerBlock threads.
struct LaunchShape {
  int blocks;
  size_t smem_bytes;
};

}  // namespace epkit::kernels
