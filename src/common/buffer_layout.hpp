// The single source of truth for every buffer an AllToAll allocates: the symmetric (NVSHMEM) heap
// and the local workspace, with the dispatch message layout. Host code, kernels, the host reference
// and docs/ARCHITECTURE.md use these formulas; CPU-tested (tests/cpu/test_layout.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "epkit/config.hpp"
#include "epkit/shapes.hpp"

namespace epkit {

// Kernels move data in slices: one warp moves one slice of kSliceBytes (32 lanes x 4 x 16 B) with
// all of its loads in flight, and a message or output row of n bytes has ceil(n / kSliceBytes).
inline constexpr size_t kSliceBytes = 2048;

// Objects of at most this many tokens per rank (decode objects) send combine's partials between
// P2P ranks as tagged words: each 4-byte word of the partial travels in an 8-byte word with the
// call's tag (low 32 bits of its sequence number), so that the token side reads each word as soon
// as it lands, with no release, flag or barrier between the partial's stores and its sum. That takes
// twice the bytes, so combine_recv's rows of these objects are 2 x H x sizeof(out dtype) apart.
// The kernels use it only where every rank of the object has every peer P2P-mapped
// (CommParams::tagged_partials, agreed at creation); other objects' rows keep the single width.
inline constexpr int kTaggedPartialMaxTokens = 256;

// recv_map rows (the workspace's map from a received message to its expert rows): the token index
// at its source, the source, the message's index there, then one expert row per k (-1: none here).
// Rows are numbered densely in the order the local experts' runs have (this rank's own messages
// first, then sources me + 1, ..., W - 1, 0, ..., me - 1), so that combine finds a message's row
// from its position alone, without the per-source counts; the source and index in the row say where
// its weights and its partial go.
inline constexpr int kRecvMapHead = 3;

// Most blocks a kernel grid takes (one per SM; H200 has 132). The host clamps grids to it, and the
// per-block histogram rows of the workspace are sized by it.
inline constexpr int kMaxGridBlocks = 256;

// A dispatch message: one per (token, destination rank). Header, then scales, then payload, so that
// slice 0 (header + scales + the first payload slice) is one contiguous range.
//   header: int32 token index, int32 padding x3, then K x {int32 expert, int32 rank-within-(sender, expert)},
//           then K fp32 router weights when weights_at_dispatch
struct MessageLayout {
  size_t header_bytes = 0;   // 16 + 8 * K (+ 4 * K with weights_at_dispatch), rounded up to 16
  size_t scale_bytes = 0;    // ceil(H/128) * 4 for fp8, else 0 (rounded up to 16)
  size_t payload_bytes = 0;  // H * sizeof(dispatch dtype)
  size_t payload_offset = 0; // header_bytes + scale_bytes
  size_t bytes = 0;          // header + scales + payload
  size_t slices = 0;         // ceil(payload_bytes / kSliceBytes): units of transfer and of arrival counting

  static MessageLayout make(const AllToAllConfig& cfg);
};

// Symmetric heap (identical on every rank; peers address it as base + offset).
struct SymmetricLayout {
  MessageLayout msg;
  size_t max_msgs_per_src = 0;   // ceil(M / D): messages one source rank can send to one destination

  // Dispatch.
  size_t dispatch_recv = 0;      // [W][ceil(M/D)] messages, written by source ranks
  size_t dispatch_stage = 0;     // [ceil(M/D)] messages, staging for the portable path (local)
  size_t dispatch_counts = 0;    // [W][L + 1] uint64: per-(source, local expert) counts, then #messages,
                                 // each tagged with its call: (seq mod 2^32) << 32 | count
  size_t dispatch_count_stage = 0; // [W][L + 1] uint64 staging for the portable path
  size_t dispatch_count_flag = 0;  // [W] uint64: seq of the call whose counts have landed (portable path)
  size_t dispatch_recv_ctr = 0;    // [W] uint64: message slices landed from each source, cumulative
  // Combine.
  size_t weights_recv = 0;       // [W][ceil(M/D)][K] uint64: router weights of received messages, each
                                 // tagged with its call: (seq mod 2^32) << 32 | fp32 bits
  size_t weights_stage = 0;      // [ceil(M/D)][K] uint64 staging for the portable path
  size_t weights_recv_ctr = 0;   // [W] uint64: weight rows landed from each portable source, cumulative
  size_t combine_recv = 0;       // [W][M] rows of combine_row_bytes: one partial per (source rank, token)
  size_t combine_row_bytes = 0;  // H x sizeof(out dtype), twice that for M <= kTaggedPartialMaxTokens (P2P)
  size_t combine_stage = 0;      // [W * ceil(M/D)][H] out dtype: partial staging for the portable path
  size_t combine_slices = 0;     // ceil(H * sizeof(out dtype) / kSliceBytes)
  size_t combine_flag = 0;       // [W][M][combine_slices] uint64: seq of the call whose partial slice landed
  size_t barrier_flag = 0;       // [W] uint64: seq of the call each peer has entered combine with
  size_t total_bytes = 0;

  // every_rank_p2p: whether every rank of the object maps every peer's symmetric heap (AllToAll
  // agrees on it at creation, before allocating); with DataPath::kPortable it is taken as false.
  // Only then do decode objects' combine_recv rows get room for tagged words.
  static SymmetricLayout make(const AllToAllConfig& cfg, bool every_rank_p2p = true);
};

// Local (per-rank, non-symmetric) device workspace.
struct WorkspaceLayout {
  size_t state = 0;        // DeviceState (seq counter, bases, error record pointer)
  size_t send_slot = 0;    // [ceil(M/D)][W] int32: slot of each own token at each destination, -1 if none
  size_t num_msgs = 0;     // [W] int32: messages received from each source in the current call
  size_t recv_base = 0;    // [W] uint64: dispatch slices consumed from each source over all earlier calls
  size_t weights_base = 0; // [W] uint64: weight rows from each source over all calls up to the current one
  size_t recv_map = 0;     // [W * ceil(M/D)][kRecvMapHead + K] int32: token, source, index, then expert row per k or -1
  size_t peer_bases = 0;   // [W] pointers: peer address of the symmetric base, null if not P2P
  size_t hist_stride = 0;  // ints per block_hist row: E + W rounded up to 4
  size_t block_hist = 0;   // [kMaxGridBlocks][hist_stride] int32: one dispatch block's own-chunk counts
                           // per expert, then per destination rank (large calls' look-back histogram)
  size_t block_flag = 0;   // [kMaxGridBlocks] uint64: seq of the call whose row is written
  size_t local_counts = 0; // [E] int32, world size 1 only: per-expert counts of the local dispatch
  size_t total_bytes = 0;

  static WorkspaceLayout make(const AllToAllConfig& cfg);
};

inline size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// Where each local expert's rows lie once `received[e]` tokens arrived for local expert e (the
// formulas above, for either layout): first_row[e], placed count[e] (<= received[e]), and for the
// packed layout the offsets [L + 1] dispatch writes. overflow: some token was dropped.
struct ExpertPlacement {
  std::vector<int64_t> first_row;  // [L]
  std::vector<int> count;          // [L]
  std::vector<int64_t> offsets;    // [L + 1], packed only (empty for masked)
  bool overflow = false;

  static ExpertPlacement make(const AllToAllConfig& cfg, const std::vector<int>& received);
};

}  // namespace epkit
