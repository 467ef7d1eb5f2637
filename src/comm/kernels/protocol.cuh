// Device helpers of the dispatch/combine protocol shared by the general and the world-size-1 kernels:
// the token count of a call, top-k index decoding, message headers, recv_map rows, expert rows of
// either layout, and peer addressing.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "common/buffer_layout.hpp"  // kMaxTokensPerRank, kMaxGridBlocks, kRecvMapHead
#include "comm/kernels/fastdiv.hpp"
#include "comm/kernels/mapping.hpp"
#include "comm/kernels/params.hpp"
#include "comm/kernels/ptx.cuh"
#include "comm/kernels/wait.cuh"
#include "comm/kernels/warp_match.cuh"  // match_key_bits

namespace epkit::kernels {

// m for this call: the host value, or the device value clamped to [0, min(M, rows)] (reported).
__device__ inline int resolve_num_tokens(const CommParams& p, const TokenCount& tc, int32_t phase, uint64_t seq,
                                         bool report) {
  if (tc.dev_m == nullptr) return tc.host_m;
  int m = *reinterpret_cast<const volatile int32_t*>(tc.dev_m);
  const int limit = min(p.max_tokens, tc.rows);
  if (__builtin_expect(m < 0 || m > limit, 0)) {
    if (report) record_error(p, err_where(kErrNumTokens, phase, kWaitNone, -1), -1, -1, m, limit, seq);
    m = m < 0 ? 0 : limit;
  }
  return m;
}

// Word wd of token t's dispatch message header (layout.hpp): the token, three zero words, then
// (expert, rank) per k from e[base + k] / rk[base + k], then the router weights (weights_at_dispatch;
// -1 without topk_weights) and -1 padding.
__device__ __forceinline__ int32_t header_word(int wd, int t, int K, const float* topk_weights, const int* e,
                                               const int* rk, int base) {
  if (wd == 0) return t;
  if (wd < 4) return 0;
  if (wd >= 4 + 2 * K) {
    const int k = wd - 4 - 2 * K;
    return topk_weights && k < K ? __float_as_int(topk_weights[static_cast<size_t>(t) * K + k]) : -1;
  }
  const int k = (wd - 4) / 2;
  return ((wd - 4) & 1) ? rk[base + k] : e[base + k];
}

// Entry i of topk_idx as raw 32-bit words (the high word only for int64 indices), and its decoding.
// Split so that a loop can issue all of its index loads before the first decoding branches on one:
// read_expert in an unrolled loop compiled to one load per basic block, each after the previous
// entry's range check, so the loads went out one round trip apart.
struct ExpertWord {
  uint32_t lo, hi;
};
// {~0, ~0} decodes to -1 (masked) for every index type: what a lane with no entry holds.
// Member by member: the brace-initialised return compiled to two loads of the constant from global
// memory (CUDA 13.0 SASS of the 1-token local dispatch).
__device__ __forceinline__ ExpertWord no_expert_word() {
  ExpertWord w;
  w.lo = 0xffffffffu;
  w.hi = 0xffffffffu;
  return w;
}
__device__ __forceinline__ ExpertWord load_expert(const void* idx, int32_t type, int64_t i) {
  // 32-bit words, selected rather than branched on: a switch on the type compiled to a jump table
  // in constant bank 2, one more dependent constant-cache miss before the first index load.
  // Read-only loads: the indices are an input, never written while a kernel runs.
  const uint32_t* w = static_cast<const uint32_t*>(idx);
  const bool wide = type == kIdxInt64;
  const int64_t at = wide ? 2 * i : i;
  return {__ldg(w + at), wide ? __ldg(w + at + 1) : 0u};  // little-endian int64: the high word follows
}
// The expert of a loaded entry, or -1 when masked. Indices >= E are reported and masked.
__device__ __forceinline__ int decode_expert(const CommParams& p, ExpertWord x, int32_t type, int32_t phase,
                                             int32_t token, uint64_t seq, bool report) {
  const bool wide = type == kIdxInt64;
  const int64_t v = wide ? static_cast<int64_t>((static_cast<uint64_t>(x.hi) << 32) | x.lo)
                    : type == kIdxInt32 ? static_cast<int64_t>(static_cast<int32_t>(x.lo))
                    : x.lo == 0xffffffffu ? int64_t{-1}
                                          : static_cast<int64_t>(x.lo);
  if (v < 0) return -1;
  if (__builtin_expect(v >= p.num_experts, 0)) {
    if (report)
      record_error(p, err_where(kErrExpertIndex, phase, kWaitNone, -1),
                   static_cast<int32_t>(v > INT32_MAX ? INT32_MAX : v), token, v, p.num_experts, seq);
    return -1;
  }
  return static_cast<int>(v);
}
// The expert of entry i of topk_idx, or -1 when masked. Indices >= E are reported and masked.
__device__ __forceinline__ int read_expert(const CommParams& p, const void* idx, int32_t type, int64_t i,
                                           int32_t phase, int32_t token, uint64_t seq, bool report) {
  return decode_expert(p, load_expert(idx, type, i), type, phase, token, seq, report);
}

// chunk_begin (mapping.hpp, with send_chunk_begin and the receive copy's mapping) keeps its
// product in 32 bits:
static_assert(static_cast<int64_t>(kMaxTokensPerRank) * kMaxGridBlocks <= INT32_MAX, "chunk_begin's product");

// Tokens this rank sends from its DP group: t = u * D + i for i = rank % D.
// own_tokens from the host's group index and multiplier (own_tokens_by_mul).
__device__ __forceinline__ int num_own_tokens(const CommParams& p, int m) {
  return own_tokens_by_mul(m, p.group_index, p.dp_size, p.dp_mul);
}

// A received message's recv_map row (layout.hpp, kRecvMapHead): the token at its source, the source,
// the message's index there, then one expert row per k (-1: none here). dispatch_recv and the large
// fused calls' send half (its own messages) write it, combine_send reads it; rows are dense, so a
// message's row follows from its position alone (map_order_source).
__device__ __forceinline__ void store_map_row(const CommParams& p, int K, int row, int t, int s, int j, int slot) {
  const int lane = threadIdx.x % kWarpSize;
  int32_t* map = p.recv_map + static_cast<size_t>(row) * (kRecvMapHead + K);
  if (lane < kRecvMapHead) map[lane] = lane == 0 ? t : lane == 1 ? s : j;
  if (lane < K) map[kRecvMapHead + lane] = slot;
}
struct MsgRow {
  int t, s, j, slot;  // slot: lane k's expert row
};
__device__ __forceinline__ MsgRow load_msg_row(const CommParams& p, int row) {
  const int32_t* map = p.recv_map + static_cast<size_t>(row) * (kRecvMapHead + p.topk);
  const int lane = threadIdx.x % kWarpSize;
  return {map[0], map[1], map[2], lane < p.topk ? map[kRecvMapHead + lane] : -1};
}

// Received messages are numbered source by source: the source (its position in the numbering's
// order) of message q is the last s with msg_off[s] <= q (msg_off is the prefix of the per-source
// message counts in that order, W + 1 entries).
__device__ __forceinline__ int source_of_message(const int* msg_off, int W, int q) {
  int lo = 0, hi = W - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (msg_off[mid] <= q) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Packed layout (layout.hpp): first[i] = sum_{j < i} align_up(count(j), align) for i < n, and first[n]
// the total, for the whole block (every thread must call it; warp_sums holds kWarps ints). Each
// thread sums a contiguous range, then one warp scans the warp totals. Ends synchronised.
template <typename Count>
__device__ void block_aligned_prefix(int n, int align, Count count, int* first, int* warp_sums) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int per = (n + kThreads - 1) / kThreads;
  const int lo = min(n, static_cast<int>(threadIdx.x) * per), hi = min(n, lo + per);
  auto aligned = [&](int i) { return (count(i) + align - 1) / align * align; };
  int mine = 0;
  for (int i = lo; i < hi; ++i) mine += aligned(i);
  int incl = mine;
#pragma unroll
  for (int d = 1; d < kWarpSize; d <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += y;
  }
  if (lane == kWarpSize - 1) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int w = lane < kWarps ? warp_sums[lane] : 0;
#pragma unroll
    for (int d = 1; d < kWarpSize; d <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, w, d);
      if (lane >= d) w += y;
    }
    if (lane < kWarps) warp_sums[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  int at = incl - mine + (warp > 0 ? warp_sums[warp - 1] : 0);
  for (int i = lo; i < hi; ++i) first[i] = at, at += aligned(i);
  if (threadIdx.x == kThreads - 1) first[n] = at;  // threads past n summed nothing: at is the total
  __syncthreads();
}

// Row of expert_x (and expert_y) that holds position `pos` of local expert el, or -1 when it lies
// past the layout's room (masked: pos >= capacity; packed: row >= R). `first`: the packed layout's
// first rows from block_aligned_prefix (unused when masked). pos < count(el), so a packed row never
// reaches the next expert's first row. `packed`: the layout, where a kernel knows it at compile time
// (dispatch's decode kernel: masked), else p.packed.
__device__ __forceinline__ int expert_row(const CommParams& p, bool packed, int el, int pos, const int* first) {
  if (packed) {
    const int row = first[el] + pos;
    return row < p.packed_rows ? row : -1;
  }
  return pos < p.capacity ? el * p.capacity + pos : -1;
}
__device__ __forceinline__ int expert_row(const CommParams& p, int el, int pos, const int* first) {
  return expert_row(p, p.packed != 0, el, pos, first);
}

// Packed layout, one block: expert_offsets[el] = min(first[el], R) for el <= L, expert_num_tokens
// the rows of each expert that fit below R; an expert that lost rows is reported.
__device__ inline void write_packed_counts(const CommParams& p, const DispatchIO& io, const int* tot, const int* first,
                                           int32_t phase, uint64_t seq) {
  const int L = p.num_local_experts, R = p.packed_rows;
  for (int el = threadIdx.x; el <= L; el += blockDim.x) {
    const int at = min(first[el], R);
    io.expert_offsets[el] = at;
    if (el == L) continue;
    const int n = min(tot[el], R - at);
    io.expert_num_tokens[el] = n;
    if (n < tot[el])
      record_error(p, err_where(kErrPackedRows, phase, kWaitNone, -1), p.rank * L + el, -1,
                   static_cast<int64_t>(first[el]) + tot[el], R, seq);
  }
}

// Packed layout, whole block: first[el] for every local expert from its token count tot[el]
// (block_aligned_prefix), and block 0 writes expert_offsets and expert_num_tokens. Out of line: the
// masked layout never calls it (see record_error).
static __device__ __noinline__ void packed_first_rows(const CommParams& p, const DispatchIO& io, const int* tot,
                                                      int* first, int* wsum, int32_t phase, uint64_t seq) {
  block_aligned_prefix(p.num_local_experts, p.packed_row_align, [&](int el) { return tot[el]; }, first, wsum);
  if (blockIdx.x == 0) write_packed_counts(p, io, tot, first, phase, seq);
}

// Peer r's address of our symmetric base, or null (no P2P: put-with-signal). Ranks below
// kParamPeers come from the parameters (constant bank), the rest from the device table.
__device__ __forceinline__ uint8_t* peer_base(const CommParams& p, int r) {
  if (r < kParamPeers) return p.peer_param[r];
  return p.peer_bases[r];
}
// peer_base in a kernel variant for objects whose every rank is P2P-mapped (kP2P, see
// KernelVariant::kSmallP2P): never null there, so the portable path's branches compile out.
template <bool kP2P>
__device__ __forceinline__ uint8_t* peer_at(const CommParams& p, int r) {
  uint8_t* pb = peer_base(p, r);
  if constexpr (kP2P) __builtin_assume(pb != nullptr);
  return pb;
}

template <typename T>
__device__ __forceinline__ T* sym_at(const CommParams& p, size_t off) {
  return reinterpret_cast<T*>(p.sym + off);
}

// Scales per lane the dispatch copies hold in registers: 128 per token, every one up to H = 16384.
inline constexpr int kScaleRegs = 4;

// The warp stores the ns scales of expert_x row `row` where scale_spot puts them: the first
// kScaleRegs * 32 from sc (lane l holds l, l + 32, ...), any further ones (H > 16384) read from
// src; kTail = false where no call has more (the decode kernel).
template <bool kTail = true>
__device__ __forceinline__ void store_row_scales(const CommParams& p, const DispatchIO& io, int ns,
                                                 const float (&sc)[kScaleRegs], const float* src, int row, int lane) {
  const ScaleSpot at = scale_spot(p, row);
  float* dst = io.expert_x_scale + at.first;
#pragma unroll
  for (int i = 0; i < kScaleRegs; ++i)
    if (i * kWarpSize + lane < ns) dst[static_cast<int64_t>(i * kWarpSize + lane) * at.step] = sc[i];
  if (kTail)
    for (int x = kScaleRegs * kWarpSize + lane; x < ns; x += kWarpSize) dst[static_cast<int64_t>(x) * at.step] = __ldcg(src + x);
}

}  // namespace epkit::kernels
