// The shapes of what dispatch writes and combine reads (the expert-major tensors), for callers that
// allocate them: the layouts' formulas, the same ones the kernels and the host reference use.
#pragma once

#include <cstddef>
#include <cstdint>

#include "epkit/config.hpp"

namespace epkit {

// Most tokens per rank an object takes (AllToAllConfig::max_tokens_per_rank): it keeps every
// symmetric offset and slot index inside int32 arithmetic on the device.
constexpr int kMaxTokensPerRank = 1 << 16;

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

// The most symmetric (NVSHMEM) heap an AllToAll of cfg allocates; once created, its exact size is
// AllToAll::symmetric_bytes(). NVSHMEM reserves its heap at init (NVSHMEM_SYMMETRIC_SIZE), so a
// caller that sizes the heap does so with this before creating the Communicator.
size_t symmetric_heap_bytes(const AllToAllConfig& cfg);

// Shapes of the expert-major tensors for the config's layout (ndim 3 masked, 2 packed).
struct ExpertShapes {
  int ndim = 0;
  int64_t expert_x[3] = {0, 0, 0};        // [L, cap, H] or [R, H]
  int64_t expert_x_scale[3] = {0, 0, 0};  // [L, cap, ceil(H/128)] ([L, ceil(H/128), cap] with expert_scales_mn_major)
                                          // or [R, ceil(H/128)] (fp8 only; else 0 rows)
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

}  // namespace epkit
