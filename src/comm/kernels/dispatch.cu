// Dispatch: each token travels once per destination *rank* (not per expert) as one message holding
// its header (token index, top-k experts and each entry's rank within (sender, expert)), scales and
// payload. The receiver computes every slot of the expert-major output from the per-(source,
// expert) counts alone, so tokens are placed without atomics. Each local expert's run holds our
// own tokens first, then the other sources' in rank order after ours, one contiguous run per source
// (within a run, tokens of one 64-token round take their ranks in shared-atomic order).
// Messages move in slices (layout.hpp): one warp per (message, slice), loads batched before stores.
#include <cuda_runtime.h>

#include "comm/kernels/protocol.cuh"
#include "comm/kernels/launch.hpp"

namespace epkit::kernels {

namespace {

constexpr int kRoundTokens = kDispatchRoundTokens;  // own tokens placed per round of the send half
constexpr int kHistUnroll = 4;    // topk loads in flight per lane in the send half's histogram
constexpr int kUnroll = 4;        // 16-byte chunks per lane per slice (kSliceBytes = 32 * 4 * 16)
constexpr int kSliceChunks = kWarpSize * kUnroll;
static_assert(kScaleRegs * kWarpSize == kDispatchDecodeMaxScales, "the decode kernel holds every scale in registers");

// n / d by div_by_mul, or, in the decode kernel (kExact: dispatch_decode_kernel checked that every
// such product fits), by small_div with no division fallback.
template <bool kExact>
__device__ __forceinline__ int unit_div(int n, int d, uint64_t mul) {
  return kExact ? small_div(n, mul) : div_by_mul(n, d, mul);
}

// Shared memory, send half.
struct SendSmem {
  int* cnt_total;  // [E] entries per expert over all own tokens
  int* run_e;      // [E] next rank within (this rank, expert)
  int* dst_total;  // [W] messages per destination
  int* run_d;      // [W] next slot per destination
  int* blk_sent;   // [W] slices this block stored directly into each destination
  int* tok_e;      // [kRoundTokens][K] expert of each entry of the round's tokens (-1: none)
  int* tok_rk;     // [kRoundTokens][K] its rank within (this rank, expert)
  int* tok_j;      // [kRoundTokens][K] for the first entry of each destination rank: the slot there
};
// Shared memory, receive half.
struct RecvSmem {
  int* cnt;      // [W][L] tokens per (source, local expert)
  int* off;      // [W][L] first slot of each (source, local expert) run, within the expert
  int* nmsg;     // [W] messages from each source
  int* msg_off;  // [W + 1] prefix of the messages this kernel copies, in recv_map's order (layout.hpp):
                 // entry i for source me + i (mod W)
  // Then, packed layout only: [L + 1] first row of each local expert (then the aligned total), [L]
  // tokens per local expert, [kWarps] scratch of block_aligned_prefix (packed_smem below).
};
// The packed layout's arrays after the RecvSmem ones (computed where used: seven pointers kept live
// across the copy loop cost registers the loop needs).
__device__ __forceinline__ int* packed_first(const RecvSmem& sm, int W) { return sm.msg_off + W + 1; }

// Look-back step of the large-call histogram. On entry cnt_total / dst_total hold this block's own
// chunk; on exit run_e / run_d hold the counts of every earlier block's chunk and, in the last
// block, cnt_total / dst_total the totals over all own tokens. Blocks are dispatched in index order,
// so the blocks waited for are resident or done: no co-residency is needed.
// Out of line: small calls never take it, and inlined it grew every call's code (see record_error).
static __device__ __noinline__ void look_back(const CommParams& p, const SendSmem& sm, uint64_t seq) {
  const int E = p.num_experts, W = p.world_size, R = p.hist_stride, R4 = R / 4, b = blockIdx.x;
  const bool last = b == static_cast<int>(gridDim.x) - 1;
  int32_t* row = p.block_hist + static_cast<size_t>(b) * R;
  for (int x = threadIdx.x; x < R; x += blockDim.x) row[x] = x < E ? sm.cnt_total[x] : x < E + W ? sm.dst_total[x - E] : 0;
  __syncthreads();
  if (threadIdx.x == 0 && !last)  // bar.sync + a cumulative release publish the whole row
    st_release_sys(p.block_flag + b, seq);
  for (int x = threadIdx.x; x < b; x += blockDim.x)
    wait_flag(p, p.block_flag + x, seq, Cmp::kEq, kPhaseDispatchSend, kWaitBlockHistogram, p.rank, -1, seq);
  __syncthreads();
  // Thread i sums int4 column i % R4 over rows i / R4, i / R4 + rows_per_pass, ...: every load is
  // independent, so the compiler keeps several in flight.
  const int rows_per_pass = blockDim.x / R4;
  const int c4 = threadIdx.x % R4, r0 = threadIdx.x / R4;
  if (rows_per_pass > 0 && r0 < rows_per_pass) {
    int4 acc = make_int4(0, 0, 0, 0);
#pragma unroll 4
    for (int r = r0; r < b; r += rows_per_pass) {
      const int4 v = __ldcg(reinterpret_cast<const int4*>(p.block_hist + static_cast<size_t>(r) * R) + c4);
      acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
    }
    const int a[4] = {acc.x, acc.y, acc.z, acc.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int x = c4 * 4 + i;
      if (a[i] == 0) continue;
      if (x < E) {
        atomicAdd(&sm.run_e[x], a[i]);
        if (last) atomicAdd(&sm.cnt_total[x], a[i]);
      } else if (x < E + W) {
        atomicAdd(&sm.run_d[x - E], a[i]);
        if (last) atomicAdd(&sm.dst_total[x - E], a[i]);
      }
    }
  } else if (rows_per_pass == 0) {  // rows wider than the block (E + W > 4 * kThreads): plain loop
    for (int x = threadIdx.x; x < E + W; x += blockDim.x) {
      int acc = 0;
      for (int r = 0; r < b; ++r) acc += __ldcg(p.block_hist + static_cast<size_t>(r) * R + x);
      if (x < E) {
        sm.run_e[x] += acc;
        if (last) sm.cnt_total[x] += acc;
      } else {
        sm.run_d[x - E] += acc;
        if (last) sm.dst_total[x - E] += acc;
      }
    }
  }
  __syncthreads();
}

// Lane k holds `slot` for the token's entry k (-1: not here). The warp stores its slice (four
// 16-byte chunks per lane) to each slot's row of expert_x, and returns the mask of lanes with a
// slot. A rolled loop over that mask: unrolled over kMaxTopK, this and the scales' loop were 600
// instructions of the general dispatch kernel, and code a call skips still costs it at decode.
// Shared by the receive copy and the send half's own-token fan-out.
__device__ __forceinline__ unsigned store_slice_to_slots(const CommParams& p, const DispatchIO& io,
                                                         const int4 (&v)[kUnroll], int slot, int sl, int lane,
                                                         int payload_chunks) {
  const unsigned mask = __ballot_sync(0xffffffffu, lane < p.topk && slot >= 0);
#pragma unroll 1
  for (unsigned m = mask; m; m &= m - 1) {
    const int sk = __shfl_sync(0xffffffffu, slot, __ffs(m) - 1);
    int4* dst = reinterpret_cast<int4*>(io.expert_x + static_cast<size_t>(sk) * p.payload_bytes);
#pragma unroll
    for (int q = 0; q < kUnroll; ++q) {
      const int c = sl * kSliceChunks + q * kWarpSize + lane;
      if (c < payload_chunks) dst[c] = v[q];
    }
  }
  return mask;
}

// Slice sl of own token t's payload (four 16-byte chunks per lane) and, for slice 0, its first
// kScaleRegs * 32 scales (from src_scale, its row of x_scale): the send half's loads, batched.
__device__ __forceinline__ void load_own_slice(const CommParams& p, const DispatchIO& io, int t, int sl, int lane,
                                               const float* src_scale, int4 (&v)[kUnroll], float (&scv)[kScaleRegs]) {
  const int payload_chunks = p.payload_bytes / 16;
  const int4* src = reinterpret_cast<const int4*>(io.x + static_cast<size_t>(t) * p.payload_bytes);
#pragma unroll
  for (int q = 0; q < kUnroll; ++q) {
    const int c = sl * kSliceChunks + q * kWarpSize + lane;
    if (c < payload_chunks) v[q] = __ldg(src + c);
  }
#pragma unroll
  for (int i = 0; i < kScaleRegs; ++i) {
    const int x = i * kWarpSize + lane;
    scv[i] = sl == 0 && x < p.num_scales ? __ldg(src_scale + x) : 0.f;
  }
}

// direct_self: one slice of one of our own tokens into its local experts' slots (slot: lane k's
// entry, -1 when not local or past capacity); slice 0 also writes the scales and the token's
// recv_map row (row j: our own messages come first, layout.hpp) and router weights (at message
// index me * S + j, where combine_send would receive them), where combine looks them up. Out of line,
// like the other paths small calls rarely take.
static_assert(kUnroll == 4, "write_own takes the slice as four int4 values");
static __device__ __noinline__ void write_own(const CommParams& p, const DispatchIO& io, int4 v0, int4 v1, int4 v2,
                                              int4 v3, int slot, int sl, int t, int j, const float* src_scale,
                                              uint64_t seq) {
  const int K = p.topk, lane = threadIdx.x % kWarpSize;
  const int4 v[kUnroll] = {v0, v1, v2, v3};  // by value: a reference would put the caller's slice on the stack
  const unsigned mask = store_slice_to_slots(p, io, v, slot, sl, lane, p.payload_bytes / 16);
  if (sl != 0) return;
  // Slots outer, scales inner: the shuffle runs with every lane (the scale loop's last pass
  // need not).
  for (unsigned m = mask; m; m &= m - 1) {
    const ScaleSpot at = scale_spot(p, __shfl_sync(0xffffffffu, slot, __ffs(m) - 1));
    float* dst = io.expert_x_scale + at.first;
    for (int x = lane; x < p.num_scales; x += kWarpSize) dst[static_cast<int64_t>(x) * at.step] = __ldg(src_scale + x);
  }
  store_map_row(p, K, j, t, p.rank, j, slot);
  if (p.weights_at_dispatch && lane < K)  // where combine_send would otherwise receive them
    sym_at<uint64_t>(p, p.off_weights_recv)[(static_cast<size_t>(p.rank) * p.max_msgs_per_src + j) * K + lane] =
        tag_word(seq, __float_as_uint(io.topk_weights[static_cast<size_t>(t) * K + lane]));
}

// direct_self (large calls of the fused kernel): our own tokens' slices go straight into expert_x
// (and their recv_map rows are written here) instead of through a message to ourselves that the
// receive half copies again; this overlaps that half of the fan-out with the link. Own tokens come
// first in every local expert's run, so their slots need no peer's counts. The arrival counter
// still advances by the slices, so the bookkeeping is the same as when the message is sent.
// kLarge: compiled with the large-call paths (see kLargeCallTokens); kP2P: every rank P2P-mapped
// (KernelVariant::kSmallP2P), the portable branches compiled out. The decode kernel
// (host::dispatch_decode_kernel) has its own send half, dispatch_send_decode below.
struct SendDone {
  bool direct_self = false;  // the receive half of the same kernel skips our own messages
  int sender_blocks = 0;     // small calls: the grid's last blocks, one own token each (send_chunk_begin)
};
template <bool kLarge, bool kP2P>
__device__ SendDone dispatch_send(const CommParams& p, const DispatchIO& io, uint64_t seq, int* smem, bool fused) {
  const int E = p.num_experts, W = p.world_size, L = p.num_local_experts, K = p.topk, D = p.dp_size;
  const int me = p.rank, gi = p.group_index, S = p.max_msgs_per_src, nsd = p.dispatch_slices;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  SendSmem sm;
  sm.cnt_total = smem;
  sm.run_e = sm.cnt_total + E;
  sm.dst_total = sm.run_e + E;
  sm.run_d = sm.dst_total + W;
  sm.blk_sent = sm.run_d + W;
  sm.tok_e = sm.blk_sent + W;
  sm.tok_rk = sm.tok_e + kRoundTokens * K;
  sm.tok_j = sm.tok_rk + kRoundTokens * K;

  const int m = resolve_num_tokens(p, io.m, kPhaseDispatchSend, seq, blockIdx.x == 0);
  const int n_own = num_own_tokens(p, m);
  // This block's chunk of the own tokens. Small calls need it only after the first index loads
  // (it seeds the running counters), so it is computed after them; the look-back needs it first.
  int u0 = 0, u1 = 0;
  if (kLarge) u0 = chunk_begin(n_own, blockIdx.x, gridDim.x), u1 = chunk_begin(n_own, blockIdx.x + 1, gridDim.x);

  // Histogram. Small calls: every block counts all own tokens' entries, and the entries of tokens
  // before its chunk seed the running counters (no communication between blocks). Large calls
  // (n_own >= kLargeCallTokens, where that redundant count cost 36 us at 4096 tokens): every block
  // counts only its own chunk, publishes the row, and sums the rows of the blocks before it
  // (a decoupled look-back; the last block also adds its own row, which gives the totals).
  // Either way every (sender, expert) rank and every destination slot is unique, and one block's
  // chunk follows the chunks before it; inside a round, phase A's shared atomics set the order.
  const bool lookback = kLarge && n_own >= kLargeCallTokens && gridDim.x > 1;
  const int h0 = lookback ? u0 : 0, h1 = lookback ? u1 : n_own;
  // Own tokens go straight into expert_x in large fused calls only. At decode sizes the message to
  // ourselves was measured faster (fused dispatch 20.1 us at 1 token, 22.4 with direct_self).
  // Not with the packed layout: there an expert's first row depends on the peers' counts.
  const bool direct_self = kLarge && fused && n_own >= kLargeCallTokens && !p.packed;
  // Lanes work in groups of G = 2^lg >= K: lane k of a group reads entry k of one token, so a warp
  // reads 32 / G tokens with one coalesced load, kHistUnroll loads in flight per lane. Shifts, not
  // divisions: 32 / G and lane % G were a division call and an inline division before the loads.
  const int lg = K <= 1 ? 0 : K <= 2 ? 1 : K <= 4 ? 2 : K <= 8 ? 3 : 4;
  const int per_warp = kWarpSize >> lg, k = lane & ((1 << lg) - 1), sub = lane >> lg;
  const int step = kWarps * per_warp;
  // Every load first, then the decoding (see load_expert). The first round's loads go out before
  // the shared counters are zeroed: at decode they are the only loads, and the zeroing and its
  // barrier now run while they are in flight. Each later round's go out after the previous
  // round's atomics, as before. A warp stops at its first step with no token (warp-uniform, so
  // the match below stays convergent): at 1 token the three empty steps were three decodes,
  // matches and branches of atomics, most of the stage's instructions.
  ExpertWord xw[kHistUnroll];
  const auto load_round = [&](int base) {
#pragma unroll
    for (int q = 0; q < kHistUnroll; ++q) {
      if (base + q * step >= h1) break;
      const int u = base + q * step + sub;
      xw[q] = u < h1 && k < K ? load_expert(io.topk_idx, io.idx_type, static_cast<int64_t>(u * D + gi) * K + k)
                              : no_expert_word();
    }
  };
  int base = h0 + warp * per_warp;
  if (base < h1) load_round(base);

  for (int x = threadIdx.x; x < E; x += blockDim.x) sm.cnt_total[x] = 0, sm.run_e[x] = 0;
  for (int x = threadIdx.x; x < W; x += blockDim.x) sm.dst_total[x] = 0, sm.run_d[x] = 0, sm.blk_sent[x] = 0;
  __syncthreads();
  if (!kLarge) u0 = send_chunk_begin(n_own, blockIdx.x, gridDim.x), u1 = send_chunk_begin(n_own, blockIdx.x + 1, gridDim.x);

  while (base < h1) {
#pragma unroll
    for (int q = 0; q < kHistUnroll; ++q) {
      if (base + q * step >= h1) break;
      const int u = base + q * step + sub;
      const int e = decode_expert(p, xw[q], io.idx_type, kPhaseDispatchSend, u * D + gi, seq, blockIdx.x == 0 || lookback);
      const int r = e >= 0 ? expert_rank(e, p.rank_div) : -1;
      // Lanes of the same token with the same destination: the lowest one counts the message.
      const unsigned same = __match_any_sync(0xffffffffu, e >= 0 ? sub * W + r : -1 - lane);
      // The first round's entries stay in shared memory: phase A reads them from there.
      if (u >= u0 && u < min(u1, u0 + kRoundTokens) && k < K) sm.tok_e[(u - u0) * K + k] = e;
      if (e < 0) continue;
      const bool before = u < u0;
      atomicAdd(&sm.cnt_total[e], 1);
      if (before) atomicAdd(&sm.run_e[e], 1);
      if ((same & ((1u << lane) - 1)) == 0) {
        atomicAdd(&sm.dst_total[r], 1);
        if (before) atomicAdd(&sm.run_d[r], 1);
      }
    }
    base += kHistUnroll * step;
    if (base < h1) load_round(base);
  }
  __syncthreads();
  if (lookback) look_back(p, sm, seq);

  // Counts: per (this rank, local expert of d) and the number of messages d will get from us.
  // Warp w of the writing blocks writes destinations d = w, w + (warps), ...; with the look-back only
  // the last block has the totals, so it writes them all.
  const int gw = lookback ? warp : blockIdx.x * kWarps + warp, nw = lookback ? kWarps : gridDim.x * kWarps;
  const bool writes_counts = !lookback || blockIdx.x == gridDim.x - 1;
  for (int d = gw; writes_counts && d < W; d += nw) {
    uint8_t* pb = peer_at<kP2P>(p, d);
    // Tagged words (wait.cuh): a P2P receiver reads each as soon as it lands, while the
    // data is still on its way; a portable one after the put's signal.
    uint64_t* dst = pb ? reinterpret_cast<uint64_t*>(pb + p.off_dispatch_counts) + static_cast<size_t>(me) * (L + 1)
                       : sym_at<uint64_t>(p, p.off_dispatch_count_stage) + static_cast<size_t>(d) * (L + 1);
    // Four counts per lane per pass, their shared loads before the stores: one at a time, each
    // store's "memory" clobber held the next shared load behind it (V3 at W = 1: eight per lane).
#pragma unroll 1
    for (int el0 = lane; el0 < L; el0 += 4 * kWarpSize) {
      int c[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) c[i] = el0 + i * kWarpSize < L ? sm.cnt_total[d * L + el0 + i * kWarpSize] : 0;
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (el0 + i * kWarpSize < L) st_relaxed_sys(dst + el0 + i * kWarpSize, tag_word(seq, c[i]));
    }
    if (lane == 0) st_relaxed_sys(dst + L, tag_word(seq, sm.dst_total[d]));
    __syncwarp();
    if (!pb) {
      __threadfence();
      put_signal_warp(sym_at<uint64_t>(p, p.off_dispatch_counts) + static_cast<size_t>(me) * (L + 1),
                                      dst, (L + 1) * sizeof(uint64_t),
                                      sym_at<uint64_t>(p, p.off_dispatch_count_flag) + me, seq, NVSHMEM_SIGNAL_SET, d);
    }
  }

  const int hdr_words = p.header_bytes / 4;
  const int payload_chunks = p.payload_bytes / 16;
  // The decode kernel's blocks send at most one own token each (send_from_last_blocks): one round.
  for (int r0 = u0; r0 < u1; r0 += kRoundTokens) {
    const int nr = min(kRoundTokens, u1 - r0);
    // Round, phase A: one warp per token takes its ranks and destination slots.
    for (int ui = warp; ui < nr; ui += kWarps) {
      const int u = r0 + ui, t = u * D + gi;
      const int e = lane >= K ? -1
                    : r0 == u0 ? sm.tok_e[ui * K + lane]  // cached by the histogram
                               : read_expert(p, io.topk_idx, io.idx_type, static_cast<int64_t>(t) * K + lane,
                                             kPhaseDispatchSend, t, seq, false);
      const int rk = e >= 0 ? atomicAdd(&sm.run_e[e], 1) : 0;
      const int r = e >= 0 ? expert_rank(e, p.rank_div) : -1;
      const unsigned same = __match_any_sync(0xffffffffu, r);
      const bool first = e >= 0 && (same & ((1u << lane) - 1)) == 0;
      const int j = first ? atomicAdd(&sm.run_d[r], 1) : -1;
      int32_t* slot_row = p.send_slot + static_cast<size_t>(u) * W;
#pragma unroll 1  // rolled, like the short loops below: unrolled, they were 400 instructions
      for (int x = lane; x < W; x += kWarpSize) slot_row[x] = -1;
      __syncwarp();
      if (first) slot_row[r] = j;
      if (lane < K) {
        sm.tok_e[ui * K + lane] = e;
        sm.tok_rk[ui * K + lane] = rk;
        sm.tok_j[ui * K + lane] = j;
      }
    }
    __syncthreads();
    // Round, phase B: one warp per (token, slice) loads the slice once and stores it to every
    // destination rank of the token.
    for (int w = warp; w < nr * nsd; w += kWarps) {
      const int ui = div_by_mul(w, nsd, p.dispatch_slices_mul), sl = w - ui * nsd, u = r0 + ui, t = u * D + gi;
      const int e = lane < K ? sm.tok_e[ui * K + lane] : -1;
      const int j = lane < K ? sm.tok_j[ui * K + lane] : -1;
      const int r = e >= 0 ? expert_rank(e, p.rank_div) : -1;
      const unsigned dmask = __ballot_sync(0xffffffffu, j >= 0);
      if (dmask == 0) continue;

      int4 v[kUnroll];
      float scv[kScaleRegs];
      const float* src_scale = io.x_scale ? io.x_scale + static_cast<size_t>(t) * p.num_scales : nullptr;
      load_own_slice(p, io, t, sl, lane, src_scale, v, scv);
      // Slice 0 also carries the header and the scales.
      int32_t hw0 = 0, hw1 = 0;
      if (sl == 0) {
        auto word = [&](int wd) {
          return header_word(wd, t, K, io.topk_weights, sm.tok_e, sm.tok_rk, ui * K);
        };
        hw0 = lane < hdr_words ? word(lane) : 0;
        hw1 = lane + 32 < hdr_words ? word(lane + 32) : 0;
      }
      auto write_slice = [&](uint8_t* msg) {
        if (sl == 0) {
          int32_t* h = reinterpret_cast<int32_t*>(msg);
          if (lane < hdr_words) h[lane] = hw0;
          if (lane + 32 < hdr_words) h[lane + 32] = hw1;
          float* sc = reinterpret_cast<float*>(msg + p.header_bytes);
#pragma unroll
          for (int i = 0; i < kScaleRegs; ++i)
            if (i * kWarpSize + lane < p.num_scales) sc[i * kWarpSize + lane] = scv[i];
          for (int s = kScaleRegs * kWarpSize + lane; s < p.num_scales; s += kWarpSize)  // hidden > 16384
            sc[s] = __ldg(src_scale + s);
        }
        int4* pl = reinterpret_cast<int4*>(msg + p.payload_offset);
#pragma unroll
        for (int q = 0; q < kUnroll; ++q) {
          const int c = sl * kSliceChunks + q * kWarpSize + lane;
          if (c < payload_chunks) pl[c] = v[q];
        }
      };

      bool staged = false;
      uint8_t* stage = sym_at<uint8_t>(p, p.off_dispatch_stage) + static_cast<size_t>(u) * p.msg_bytes;
      for (unsigned mask = dmask; mask; mask &= mask - 1) {
        const int src_lane = __ffs(mask) - 1;
        const int rd = __shfl_sync(0xffffffffu, r, src_lane);
        const int jd = __shfl_sync(0xffffffffu, j, src_lane);
        const size_t slot_off = p.off_dispatch_recv + (static_cast<size_t>(me) * S + jd) * p.msg_bytes;
        if (direct_self && rd == me) {
          int slot = -1;  // own tokens lead every local expert's run: the slot is the rank within it
          if (lane < K && e >= 0 && r == me) {
            const int rk = sm.tok_rk[ui * K + lane];
            slot = rk < p.capacity ? (e - me * L) * p.capacity + rk : -1;
          }
          write_own(p, io, v[0], v[1], v[2], v[3], slot, sl, t, jd, src_scale, seq);
          if (lane == 0) atomicAdd(&sm.blk_sent[rd], 1);
        } else if (uint8_t* pb = peer_at<kP2P>(p, rd)) {
          write_slice(pb + slot_off);
          if (lane == 0) atomicAdd(&sm.blk_sent[rd], 1);
        } else {
          if (!staged) {
            write_slice(stage);
            __syncwarp();
            __threadfence();
            staged = true;
          }
          const size_t lo = sl == 0 ? 0 : p.payload_offset + static_cast<size_t>(sl) * kSliceChunks * 16;
          const size_t hi = min(static_cast<size_t>(p.msg_bytes),
                                p.payload_offset + static_cast<size_t>(sl + 1) * kSliceChunks * 16);
          put_signal_warp(p.sym + slot_off + lo, stage + lo, hi - lo,
                                          sym_at<uint64_t>(p, p.off_dispatch_recv_ctr) + me, 1, NVSHMEM_SIGNAL_ADD,
                                          rd);
        }
      }
    }
    __syncthreads();
  }
  __syncthreads();  // also when this block had no tokens
  // One release per destination publishes everything this block stored there: the bar.sync above
  // orders the other threads' stores before it, and release semantics are cumulative, so no
  // separate system fence is needed. (The counts are tagged words and need no release.) blk_sent
  // counts only direct stores (P2P peers, and ourselves with direct_self); portable peers' puts
  // signal by themselves. Our own counter is read on this GPU: a GPU-scope release publishes to
  // it (the reader's acquire is system-scope, which includes us), without the system-scope fence.
  for (int d = threadIdx.x; d < W; d += blockDim.x) {
    const uint64_t n = static_cast<uint64_t>(sm.blk_sent[d]);
    if (n == 0) continue;
    uint64_t* ctr = reinterpret_cast<uint64_t*>((d == me ? p.sym : peer_at<kP2P>(p, d)) + p.off_dispatch_recv_ctr) + me;
    if (d == me)
      red_release_gpu_add(ctr, n);
    else
      red_release_sys_add(ctr, n);
  }
  SendDone done;
  done.direct_self = direct_self;
  done.sender_blocks = kLarge ? 0 : sender_blocks_of(n_own, gridDim.x);
  return done;
}

// The decode kernel's send half (host::dispatch_decode_kernel: a P2P object, the masked layout, at
// most 32 own entries, one own token per sending block). A probe of the protocol's decode chain with
// nothing else in it timed 3.4 us under the general pair, so this half
// keeps the protocol (messages, tagged counts, slices counted at each destination) and drops the
// block-wide machinery around it: no shared histogram, no ranking round, no block barrier. Each
// warp of a sending block loads every own entry (lane i: entry i % K of own token i / K, one load)
// and derives in registers what it needs:
// - an entry's rank within (this rank, expert): the entries before it with the same expert (lane
//   order is token order, so every rank is unique and below the expert's count);
// - a token's message index at a destination: the earlier tokens that send there;
// - the counts: an expert's entries, a destination's tokens.
// Warp sl < nsd of token u's block stores slice sl of u's message (slice 0: the header and scales)
// to every destination, then adds one slice to each destination's arrival counter with a release
// (after __syncwarp: cumulative over the warp's stores). Warp nsd writes u's send_slot row. The
// grid's last block also writes the count words, 32 experts per warp and one warp for the message
// counts; it does so also when this rank sends nothing (the receivers wait for every word).
// Blocks that send nothing and count nothing go straight to the receive half.
// Measured (same-run A/Bs on one H200 and one H100): V2-Lite's dispatch -0.4 to -0.8 us at 1-4
// tokens (graph -0.9 to -1.1 per pair), V3's within the spread (graph -0.1 to -0.4). The matches
// only in the warps that use them took V3's dispatch from 8.3 to 7.8 us at 1 token (one H100, pair
// 16.2 -> 15.7, graph 9.4 -> 8.9); docs/perf/comm-latency.md.
static_assert(kWarpSize == 32, "one lane per own entry and per destination rank");
__device__ SendDone dispatch_send_decode(const CommParams& p, const DispatchIO& io, uint64_t seq) {
  __shared__ int warp_cnt[kWarps][kWarpSize];  // a count warp's 32 experts (or ranks)
  const int W = p.world_size, L = p.num_local_experts, K = p.topk, D = p.dp_size, E = p.num_experts;
  const int me = p.rank, gi = p.group_index, S = p.max_msgs_per_src, nsd = p.dispatch_slices;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int m = resolve_num_tokens(p, io.m, kPhaseDispatchSend, seq, blockIdx.x == 0);
  const int n_own = num_own_tokens(p, m);
  SendDone done;
  done.sender_blocks = sender_blocks_of(n_own, gridDim.x);
  const bool counter = blockIdx.x == gridDim.x - 1;
  const int ui = static_cast<int>(blockIdx.x) - (static_cast<int>(gridDim.x) - done.sender_blocks);  // own token
  const bool sends = ui >= 0;
  const int ncount = (E + kWarpSize - 1) / kWarpSize + 1;  // count units: 32 experts each, then the message counts
  const int cw = warp - (nsd + 1);                          // this warp's first count unit
  if (!(sends && warp <= nsd) && !(counter && cw >= 0 && cw < ncount)) return done;  // warp-uniform

  // Every own entry, one per lane (n_own * K <= 32: dispatch_decode_kernel).
  const int n = n_own * K;
  const int lu = small_div(lane, p.topk_mul), lk = lane - lu * K;
  const int e = lane < n ? read_expert(p, io.topk_idx, io.idx_type, static_cast<int64_t>(lu * D + gi) * K + lk,
                                       kPhaseDispatchSend, lu * D + gi, seq, counter && cw == 0)
                         : -1;
  const int r = e >= 0 ? expert_rank(e, p.rank_div) : -1;
  // The warp matches, only in the warps that use them: the slice warps, the send_slot warp and the
  // warp of the message counts (unit ncount - 1). A warp that counts experts only counts them by
  // shuffles (below): with every warp matching, V3's sending block (14 warps) reached "matches done"
  // 1.14 us after its index, V2-Lite's (5 warps) 0.59 us.
  const int cstride = kWarps - (nsd + 1);  // count warps
  const bool matches = (sends && warp <= nsd) || (counter && cw >= 0 && (ncount - 1 - cw) % cstride == 0);
  const unsigned below = (1u << lane) - 1u;
  unsigned dst_peers = 0;
  int rk = 0, j = -1;
  bool lead = false;
  if (matches) {  // warp-uniform
    // Two groupings (warp_match.cuh), not three matches with a key per lane outside the groups
    // (MATCH.ANY's time grows with the distinct keys: 932 cycles against 379 for V3's token, session
    // 35's probe): the entries of one rank, and of one expert in the warp that writes the header (the
    // only user of an entry's rank). The token's lanes and the leads' ballot give the rest.
    if (sends && warp == 0)  // rank within (this rank, expert)
      rk = __popc(match_groups(e, match_key_width(E), n + 1) & below);
    const unsigned same_r = match_groups(r, match_key_width(W), min(W, n) + 1);  // entries for the same rank
    lead = e >= 0 && (same_r & token_lanes(lu, K) & below) == 0;       // the token's first entry for rank r
    dst_peers = same_r & __ballot_sync(0xffffffffu, lead);             // the tokens sending to rank r
    j = lead ? __popc(dst_peers & below) : -1;                         // the token's message index at r
  }

  if (sends && warp < nsd) {  // slice `warp` of own token ui, to every rank it goes to
    const int sl = warp, t = ui * D + gi, base = ui * K;
    const unsigned dmask = __ballot_sync(0xffffffffu, lead && lu == ui);
    int4 v[kUnroll];
    float scv[kScaleRegs];
    const float* src_scale = io.x_scale ? io.x_scale + static_cast<size_t>(t) * p.num_scales : nullptr;
    load_own_slice(p, io, t, sl, lane, src_scale, v, scv);
    const int hdr_words = p.header_bytes / 4;  // <= 64 (kMaxTopK)
    int32_t hw0 = 0, hw1 = 0;
    if (sl == 0) {
      // Word wd of the header (header_word): entry k's expert and rank from lane base + k.
      const auto word = [&](int wd) -> int32_t {
        const int k = wd >= 4 && wd < 4 + 2 * K ? (wd - 4) / 2 : 0;
        const int ek = __shfl_sync(0xffffffffu, e, base + k), rkk = __shfl_sync(0xffffffffu, rk, base + k);
        if (wd == 0) return t;
        if (wd < 4) return 0;
        if (wd < 4 + 2 * K) return ((wd - 4) & 1) ? rkk : ek;
        const int kw = wd - 4 - 2 * K;
        return io.topk_weights && kw < K ? __float_as_int(io.topk_weights[static_cast<size_t>(t) * K + kw]) : -1;
      };
      hw0 = word(lane);  // every lane runs the shuffles; lanes past the header store nothing
      hw1 = word(lane + 32);
    }
    const int payload_chunks = p.payload_bytes / 16;
    for (unsigned mask = dmask; mask; mask &= mask - 1) {
      const int src_lane = __ffs(mask) - 1;
      const int rd = __shfl_sync(0xffffffffu, r, src_lane), jd = __shfl_sync(0xffffffffu, j, src_lane);
      uint8_t* msg = peer_at<true>(p, rd) + p.off_dispatch_recv + (static_cast<size_t>(me) * S + jd) * p.msg_bytes;
      if (sl == 0) {
        int32_t* h = reinterpret_cast<int32_t*>(msg);
        if (lane < hdr_words) h[lane] = hw0;
        if (lane + 32 < hdr_words) h[lane + 32] = hw1;
        float* sc = reinterpret_cast<float*>(msg + p.header_bytes);
#pragma unroll
        for (int i = 0; i < kScaleRegs; ++i)
          if (i * kWarpSize + lane < p.num_scales) sc[i * kWarpSize + lane] = scv[i];
      }
      int4* pl = reinterpret_cast<int4*>(msg + p.payload_offset);
#pragma unroll
      for (int q = 0; q < kUnroll; ++q) {
        const int c = sl * kSliceChunks + q * kWarpSize + lane;
        if (c < payload_chunks) pl[c] = v[q];
      }
    }
    __syncwarp();  // + the release below, cumulative: every lane's stores of this slice
    if ((dmask >> lane) & 1u) {  // one lane per destination: one more slice there
      uint64_t* ctr = reinterpret_cast<uint64_t*>(peer_at<true>(p, r) + p.off_dispatch_recv_ctr) + me;
      if (r == me)  // read on this GPU: a GPU-scope release publishes to it (as dispatch_send)
        red_release_gpu_add(ctr, 1);
      else
        red_release_sys_add(ctr, 1);
    }
  } else if (sends && warp == nsd) {  // own token ui's message index at every rank (-1: none), for combine
    int* row = warp_cnt[warp];
    row[lane] = -1;
    __syncwarp();
    if (lead && lu == ui) row[r] = j;
    __syncwarp();
    if (lane < W) p.send_slot[static_cast<size_t>(ui) * W + lane] = row[lane];
  }
  if (counter) {  // the count words: (this rank, local expert) and the messages, at every rank
    int* cnt = warp_cnt[warp];
    for (int c = cw; c >= 0 && c < ncount; c += cstride) {
      const bool msgs = c == ncount - 1;  // the warp's last unit; only in a warp with matches (above)
      const int x = msgs ? lane : c * kWarpSize + lane;  // a rank, or an expert
      int value = 0;
      if (msgs) {
        cnt[lane] = 0;
        __syncwarp();
        if (lead && j == 0) cnt[r] = __popc(dst_peers);  // rank r's messages: the tokens that go there
        __syncwarp();
        value = cnt[lane];
      } else {
        // Expert x's entries: every own entry's expert by shuffle (n <= 32, independent steps).
        for (int i = 0; i < n; ++i) value += __shfl_sync(0xffffffffu, e, i) == x;
      }
      if (msgs ? x < W : x < E) {
        const int d = msgs ? x : expert_rank(x, p.rank_div), el = msgs ? L : x - d * L;
        uint64_t* dst = reinterpret_cast<uint64_t*>(peer_at<true>(p, d) + p.off_dispatch_counts) +
                        static_cast<size_t>(me) * (L + 1) + el;
        st_relaxed_sys(dst, tag_word(seq, static_cast<uint32_t>(value)));
      }
    }
  }
  return done;
}

// sender_blocks: the grid's last blocks that ran a send half of one own token first (the fused
// kernel's small calls; 0 otherwise).
template <bool kP2P, bool kDecode>
__device__ void dispatch_recv(const CommParams& p, const DispatchIO& io, uint64_t seq, int* smem, bool direct_self,
                              int sender_blocks) {
  const int W = p.world_size, L = p.num_local_experts, K = p.topk, S = p.max_msgs_per_src, me = p.rank;
  const int cap = p.capacity, nsd = p.dispatch_slices;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const bool packed = !kDecode && p.packed;  // the decode kernel: masked layout only
  RecvSmem sm{smem, smem + W * L, smem + 2 * W * L, smem + 2 * W * L + W};

  const uint64_t* count_flag = sym_at<uint64_t>(p, p.off_dispatch_count_flag);
  // The arrival counters are waited for by the block's last threads (thread kThreads - 1 - s for
  // source s), the offsets computed by its first: the two overlap. Its base is loaded before the
  // waits so that its latency hides behind them.
  const int my_src = kThreads - 1 - static_cast<int>(threadIdx.x);
  const uint64_t my_base = my_src >= 0 && my_src < W ? p.recv_base[my_src] : 0;
  // Every thread of the block leaves together or not at all: a thread that left alone could leave
  // the others waiting at a later __syncthreads. __syncthreads_or gives them one answer.
  // All threads read the count matrix at once, each word as soon as it carries this call's tag
  // (portable sources: after their put's signal).
  // Thread 0 reads the abort flag before the waits, not after them: after, its load was one more
  // round trip before the offsets. The waits are bounded and end early on an abort by themselves.
  const int32_t abort_early = threadIdx.x == 0 ? abort_word(p) : 0;  // tested at the barrier (abort_word)
  bool ok = true;
  const uint64_t* counts = sym_at<uint64_t>(p, p.off_dispatch_counts);
  for (int i = threadIdx.x; i < W * (L + 1); i += blockDim.x) {
    const int s = unit_div<kDecode>(i, L + 1, p.counts_row_mul), el = i - s * (L + 1);
    uint32_t v = 0;
    if (peer_at<kP2P>(p, s) == nullptr)
      ok = ok && wait_flag(p, count_flag + s, seq, Cmp::kEq, kPhaseDispatchRecv, kWaitDispatchCounts, s, -1, seq);
    ok = ok && wait_tagged(p, counts + i, seq, v, kPhaseDispatchRecv, kWaitDispatchCounts, s);
    if (el < L) sm.cnt[s * L + el] = static_cast<int>(v); else sm.nmsg[s] = static_cast<int>(v);
  }
  const bool stop = __syncthreads_or(!ok || abort_early != 0);
  // The layer's combine kernels read this call's seq from combine_seq, which leaves them free to
  // advance seq for the next call (combine.cu, advance_layer). Written even when the call stops.
  if (blockIdx.x == 0 && my_src == 0) p.state->combine_seq = seq;
  if (stop) return;
  // Thread 0's second look at the abort flag (shared at the data's barrier below), loaded now so that
  // its round trip runs under the offsets it computes next. Loaded after them, right before that
  // barrier, it put one round trip between the offsets and the copy in every block (block 0's
  // stamps, V3 1 token: offsets done 2.54 -> data arrived 2.84 us). An abort raised in between is
  // seen by every bounded wait after this one. Measured (12 rounds, one H100): graph -0.04 to
  // -0.15 us per pair in every round at 1-4 tokens, event-timed -0.1. The word is tested at that
  // barrier (abort_word); tested here, as is_aborted did, thread 0 waited for the load before its
  // offsets.
  const int32_t abort_mid = threadIdx.x == 0 ? abort_word(p) : 0;
  // combine_send waits for a portable source's weights_recv_ctr[s] >= weights_base[s]: the weight
  // rows of every call so far, this one's (one per message) included. Only this kernel reads or
  // writes it before then. P2P sources' weights are tagged words, whose target nobody reads: the
  // small P2P variant compiles this out. Done by block 0's last threads (my_src = s), which wait
  // for the data next.
  if (!kP2P && blockIdx.x == 0 && !p.weights_at_dispatch)
    for (int s = my_src; s >= 0 && s < W; s += blockDim.x)
      if (peer_at<kP2P>(p, s) == nullptr) p.weights_base[s] += static_cast<uint64_t>(sm.nmsg[s]);
  // Each local expert's run: our own tokens first, then the other sources in rank order after us
  // (me + 1, ..., W - 1, 0, ..., me - 1), one contiguous run per source.
  for (int el = threadIdx.x; el < L; el += blockDim.x) {
    int acc = 0;
#pragma unroll 1
    for (int i = 0; i < W; ++i) {
      const int s = me + i < W ? me + i : me + i - W;
      sm.off[s * L + el] = acc;
      acc += sm.cnt[s * L + el];
    }
    if (packed) {
      packed_first(sm, W)[L + 1 + el] = acc;
    } else if (blockIdx.x == 0) {
      io.expert_num_tokens[el] = min(acc, cap);
      if (acc > cap)
        record_error(p, err_where(kErrCapacity, kPhaseDispatchRecv, kWaitNone, -1), me * L + el, -1, acc, cap, seq);
    }
  }
  if (packed) {  // every block needs every expert's first row (out of line: masked calls skip it)
    __syncthreads();
    int* first = packed_first(sm, W);
    int* tot = first + L + 1;
    packed_first_rows(p, io, tot, first, tot + L, kPhaseDispatchRecv, seq);
  }
  // The messages to copy, numbered in recv_map's order (ours first, then me + 1, ...), so that a
  // message's number is its map row: none of ours with direct_self (the send half placed them and
  // wrote their rows, the first nmsg[me]). (With a second array of each source's first row, the
  // copy's extra shared load and the loop here cost the dispatch 0.1-0.2 us.)
  if (threadIdx.x == 0) {
    int acc = 0;
#pragma unroll 1
    for (int i = 0; i < W; ++i) {
      const int s = map_order_source(me, i, W);
      sm.msg_off[i] = acc, acc += direct_self && i == 0 ? 0 : sm.nmsg[s];
    }
    sm.msg_off[W] = acc;
  }
  if (blockIdx.x == 0)
    for (int s = threadIdx.x; s < W; s += blockDim.x) p.num_msgs[s] = sm.nmsg[s];
  // A sending block that will take no copy unit (see the units below) leaves now: nothing it does
  // waits for the data. Block-uniform; its threads count the messages themselves (no prefix yet).
  if (sender_blocks > 0 && static_cast<int>(blockIdx.x) >= static_cast<int>(gridDim.x) - sender_blocks) {
    int msgs = 0;
#pragma unroll 1
    for (int s = 0; s < W; ++s) msgs += direct_self && s == me ? 0 : sm.nmsg[s];
    const int nw = gridDim.x * kWarps, cb = static_cast<int>(gridDim.x) - sender_blocks;
    if (copy_skips_senders(msgs * nsd * copy_entries(msgs, nsd, K, nw), sender_blocks, cb)) return;
  }
  const uint64_t* recv_ctr = sym_at<uint64_t>(p, p.off_dispatch_recv_ctr);
  for (int s = my_src; s >= 0 && s < W; s += blockDim.x)
    if (!(direct_self && s == me))  // our own slices are counted before this kernel ends, read by nobody
      ok &= wait_flag(p, recv_ctr + s, (s == my_src ? my_base : p.recv_base[s]) +
                      static_cast<uint64_t>(sm.nmsg[s]) * nsd, Cmp::kGe,
                      kPhaseDispatchRecv, kWaitDispatchData, s, -1, seq);
  // Also the copy below must not start on a source whose data never came (its headers would be garbage).
  const bool stop_data = __syncthreads_or(!ok || abort_mid != 0);
  if (stop_data) return;

  const int total = sm.msg_off[W];
  const int payload_chunks = p.payload_bytes / 16;
  const uint8_t* recv = sym_at<uint8_t>(p, p.off_dispatch_recv);
  // Units: one warp per (message, slice), or, when (message, slice, entry) units fit one wave
  // (decode), per entry: the warp stores its slice into that entry's row only, so a message's K
  // rows are stored by K warps instead of one. Units spread one per block first (block-uniform
  // choice: total is the same in every block). One block storing a 1-token message into 8 rows
  // took 1.8 us; the W = 1 kernels' scatter went from 2.3 to 1.0 us when spread over the grid's
  // SMs, while more warps of the same SM made this copy slower.
  // The fused kernel's sending blocks (the grid's last sender_blocks, one own token each) take no
  // unit when the units fit the warps of the blocks before them: a sending block reaches its copy
  // only after its send half, its count read and its offsets, and at decode it ended the grid last
  // (stamps, V3 1 token: its copy loaded 0.67 us after its data wait, 5.14 us into the kernel). The
  // host sizes the grid with a block per own token beside the copy's (host::general_blocks).
  const int nw = gridDim.x * kWarps;
  const int kx = copy_entries(total, nsd, K, nw);
  const int units = total * nsd * kx;
  const int q0 = copy_first_unit(units, sender_blocks, blockIdx.x, warp, gridDim.x);
  for (int q = q0; q < units; q += nw) {
    // Per entry, unit q is entry kq = q % K of (message, slice) qs = q / K, and a warp has at most
    // one unit (q < nw <= 4096: small_div is exact). Multiplies, not divisions (div_by_mul).
    const int qs = kx == 1 ? q : small_div(q, p.topk_mul), kq = q - qs * kx;
    const int qm = unit_div<kDecode>(qs, nsd, p.dispatch_slices_mul), sl = qs - qm * nsd;
    const int sp = source_of_message(sm.msg_off, W, qm), j = qm - sm.msg_off[sp];
    const int s = map_order_source(me, sp, W);  // sp: its position in recv_map's order
    const uint8_t* msg = recv + (static_cast<size_t>(s) * S + j) * p.msg_bytes;
    const int32_t* hdr = reinterpret_cast<const int32_t*>(msg);
    // Issue the slice's loads first; the header is small and read while they are in flight.
    const int4* pl = reinterpret_cast<const int4*>(msg + p.payload_offset);
    int4 v[kUnroll];
#pragma unroll
    for (int qq = 0; qq < kUnroll; ++qq) {
      const int c = sl * kSliceChunks + qq * kWarpSize + lane;
      if (c < payload_chunks) v[qq] = __ldcg(pl + c);
    }
    // Slice 0 carries the scales: their loads go out with the payload's.
    const float* sc = reinterpret_cast<const float*>(msg + p.header_bytes);
    float scv[kScaleRegs];
#pragma unroll
    for (int i = 0; i < kScaleRegs; ++i) {
      const int x = i * kWarpSize + lane;
      scv[i] = sl == 0 && x < p.num_scales ? __ldcg(sc + x) : 0.f;
    }
    // Entry k's (expert, rank) as one 8-byte load, and the token index, issued with the payload's:
    // loaded one by one, the rank's load sat behind the branch on the expert (only an entry of
    // ours needs it) and the token's behind both, two more round trips (SASS, CUDA 13.0).
    // The token word is loaded by every lane with the rest, and stored with the slots: a store of it
    // here, on one lane, was issued right after its load and held the warp for the round trip before
    // the entry's load went out (SASS, CUDA 13.0; dispatch +0.2-0.3 us).
    int slot = -1;
    const int2 erk = lane < K ? __ldcg(reinterpret_cast<const int2*>(hdr + 4) + lane) : make_int2(-1, 0);
    const int tok = __ldcg(hdr);
    if (erk.x >= 0 && expert_rank(erk.x, p.rank_div) == me) {
      const int el = erk.x - me * L;
      const int pos = sm.off[s * L + el] + erk.y;
      slot = expert_row(p, !kDecode && p.packed, el, pos, packed_first(sm, W));  // p.packed read here: the kernel-wide bool grew the small P2P kernel by 8 instructions
    }
    if (sl == 0 && kq == 0) {  // the map row and weights: once per message (entry 0's unit)
      store_map_row(p, K, direct_self ? qm + sm.nmsg[me] : qm, tok, s, j, slot);
      if (p.weights_at_dispatch && lane < K)  // where combine_send would otherwise receive them
        sym_at<uint64_t>(p, p.off_weights_recv)[(static_cast<size_t>(s) * S + j) * K + lane] =
            tag_word(seq, static_cast<uint32_t>(__ldcg(hdr + 4 + 2 * K + lane)));
    }
    if (kx != 1 && lane != kq) slot = -1;  // per entry: only this unit's row
    const unsigned mask = store_slice_to_slots(p, io, v, slot, sl, lane, payload_chunks);
    if (sl == 0 && p.num_scales > 0) {
#pragma unroll 1
      for (unsigned m = mask; m; m &= m - 1)  // warp-uniform: the shuffle runs with every lane
        store_row_scales<!kDecode>(p, io, p.num_scales, scv, sc,
                                   __shfl_sync(0xffffffffu, slot, __ffs(m) - 1), lane);
    }
  }
}

// __grid_constant__: the cold paths take p by reference; without it every thread keeps a stack
// copy of it (docs/ARCHITECTURE.md, kernel code conventions).
template <bool kLarge, bool kP2P, bool kDecode = false>
__global__ void __launch_bounds__(kThreads, 1)
    dispatch_kernel(const __grid_constant__ CommParams p, const __grid_constant__ DispatchIO io, bool do_send,
                    bool do_recv) {
  extern __shared__ int smem[];
  if constexpr (kDecode) touch_param_lines(p, io, kDispatchTouchWarp);
  wait_previous_kernel();
  const uint64_t seq = *reinterpret_cast<volatile uint64_t*>(&p.state->seq);  // not waited for until used
  SendDone sent;
  static_assert(!kDecode || (!kLarge && kP2P), "the decode kernel: the small P2P variant only");
  if constexpr (kDecode) {
    // No barrier between the halves: the send half uses no dynamic shared memory, and the receive
    // half's first step is a block-wide one.
    if (do_send) sent = dispatch_send_decode(p, io, seq);
  } else {
    if (do_send) sent = dispatch_send<kLarge, kP2P>(p, io, seq, smem, do_recv);
    if (do_send && do_recv) __syncthreads();
  }
  if (do_recv) dispatch_recv<kP2P, kDecode>(p, io, seq, smem, sent.direct_self, sent.sender_blocks);
}

}  // namespace

cudaError_t launch_dispatch(const CommParams& p, const DispatchIO& io, DispatchKernel which, bool do_send, bool do_recv,
                            const LaunchShape& shape, cudaStream_t stream) {
  auto kernel = which == DispatchKernel::kLarge      ? dispatch_kernel<true, false>
                : which == DispatchKernel::kDecode   ? dispatch_kernel<false, true, true>
                : which == DispatchKernel::kSmallP2P ? dispatch_kernel<false, true>
                                                     : dispatch_kernel<false, false>;
  return launch_after_previous(kernel, shape, stream, p, io, do_send, do_recv);
}

}  // namespace epkit::kernels
