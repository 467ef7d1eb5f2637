// The single source of truth for every buffer epkit allocates: symmetric (NVSHMEM) and local workspace.
// Kernels, host code, docs/ARCHITECTURE.md and the benchmark's memory report all use these formulas.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "epkit/config.hpp"

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

// Most tokens per rank an object takes (AllToAllConfig::max_tokens_per_rank): it keeps every
// symmetric offset and slot index inside int32 arithmetic on the device.
inline constexpr int kMaxTokensPerRank = 1 << 16;

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

// --- The expert-major tensors of dispatch (expert_x, expert_x_scale) and combine (expert_y) ---
//
// Masked: [L, capacity, ...]; expert e's rows are e * capacity + [0, count[e]).
// Packed: [R, ...]; expert e's rows are offset[e] + [0, count[e]), where, for the tokens c[e]
// that arrive for expert e,
//   offset[0] = 0,  offset[e + 1] = offset[e] + align_up(c[e], packed_row_align)   (before clamping)
// and then each offset is clamped to R and count[e] = min(c[e], R - offset[e]): rows that would lie at
// or past R are dropped (and reported). dispatch writes offsets [L + 1] and counts [L] on the device.

// The packed rows that can never overflow while each token lists an expert at most once: at most
// N = M * (W / D) * min(K, L) rows arrive, at most M * (W / D) of them for one expert, and every
// expert with c[e] > 0 pads up to the next multiple of `a`. The largest total of aligned runs is
// then B * a with B = min(N, L) + (N - min(N, L)) / a runs of a rows (the first block of each of
// min(N, L) experts costs one token, every further block a tokens), and at most L * align_up(M * (W / D), a).
int64_t packed_row_bound(const AllToAllConfig& cfg);
// R: packed_rows, or packed_row_bound() when it is 0.
int64_t effective_packed_rows(const AllToAllConfig& cfg);
// Rows of the flattened expert-major row space: L * capacity (masked) or R (packed). Kernel slot
// indices (and the row index of expert_x / expert_y) are below this.
int64_t expert_rows(const AllToAllConfig& cfg);

// Shapes of the expert-major tensors for the config's layout (ndim 3 masked, 2 packed).
struct ExpertShapes {
  int ndim = 0;
  int64_t expert_x[3] = {0, 0, 0};        // [L, cap, H] or [R, H]
  int64_t expert_x_scale[3] = {0, 0, 0};  // [L, cap, ceil(H/128)] or [R, ceil(H/128)] (fp8 only; else 0 rows)
  int64_t expert_offsets = 0;             // L + 1 (packed), 0 (masked: not taken)

  static ExpertShapes make(const AllToAllConfig& cfg);
};

// Bytes of the expert-major tensors one rank needs per layer: what the layout costs in device memory.
struct ExpertTensorBytes {
  size_t expert_x = 0;        // rows * H * sizeof(dispatch dtype)
  size_t expert_x_scale = 0;  // rows * ceil(H/128) * 4 (fp8 only)
  size_t expert_y = 0;        // rows * H * sizeof(combine_in dtype)
  size_t expert_offsets = 0;  // (L + 1) * 4, packed only
  size_t total = 0;           // expert_x + expert_x_scale + expert_y (the L + 1 offsets not counted)

  static ExpertTensorBytes make(const AllToAllConfig& cfg);
};

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
