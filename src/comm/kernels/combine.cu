// Combine: the expert side reduces a token's local experts with the router weights and sends one
// partial per (token, destination rank) to every rank of the token's DP group; the token side sums
// the partials of the ranks it dispatched to. Weights reach the expert side at the start of
// combine_send (one row per dispatched message), so the API needs them only here.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "comm/kernels/protocol.cuh"
#include "comm/kernels/vec8.cuh"
#include "comm/kernels/launch.hpp"

namespace epkit::kernels {

namespace {

// Takes the next one or two set bits of `mask` (the lowest first); b is -1 when only one was left.
// The loops below handle two expert rows or partials at a time so both rows' loads are in flight
// together (one at a time, each cost a full memory round trip).
__device__ __forceinline__ void take_pair(unsigned& mask, int& a, int& b) {
  a = __ffs(mask) - 1;
  mask &= mask - 1;
  b = mask ? __ffs(mask) - 1 : -1;
  if (b >= 0) mask &= mask - 1;
}

// The P2P arrival flags of a warp's last few partial slices, raised together behind one system
// fence: a release per slice stalled the warp on its remote stores after every slice (at prefill,
// ~27 slices per warp). A warp with one slice (decode) flushes it at the end, as before.
constexpr int kFlagBatch = 4;
struct PendingFlags {
  uint64_t* f[kFlagBatch] = {};  // lane dd < D: the flag at DP-group member dd (null: none / portable)
  int n = 0;
  __device__ void flush(int lane, int D, uint64_t seq) {
    if (n == 0) return;
    __syncwarp();  // + a cumulative fence: every lane's stores of these slices precede the flags
    if (lane < D) {
      fence_acq_rel_sys();
#pragma unroll
      for (int i = 0; i < kFlagBatch; ++i)
        if (i < n && f[i]) st_relaxed_sys(f[i], seq);
    }
    n = 0;
  }
  __device__ void push(uint64_t* flag, int lane, int D, uint64_t seq) {
#pragma unroll
    for (int i = kFlagBatch - 1; i > 0; --i) f[i] = f[i - 1];  // constant indices: stays in registers
    f[0] = flag;
    if (++n == kFlagBatch) flush(lane, D, seq);
  }
};

struct CombineSmem {
  int* nmsg;      // [W]
  int* msg_off;   // [W + 2]: first recv_map row of each source's messages (layout.hpp's order), the total,
                  // the largest nmsg
};

// The row of a group's first message, loaded before the message count is known. Which unit a group
// takes depends on that count (combine_send_group, the one-wave spread); the guess is the unit it
// takes when the call's slices fit one wave in groups of kMaxCombineGroup, the shape of every 1-4
// token call. send_partials takes the loaded row when its first message is that row and loads the
// row itself otherwise. A guessed row past this call's messages is never used (a stale row of an
// earlier call, or never written: only its registers are read, and only after the count says so).
struct RowGuess {
  int row = -1;
  MsgRow r{};
};

// The received messages' count, for the small P2P variant of an object of at most 32 ranks: lane s
// loads the messages of source s (num_msgs, written by dispatch_recv) and the warp adds them, with
// no shared memory and no block barrier. With the block's prefix in shared memory, every warp waited
// at two block barriers for the block's slowest warp, at decode the one storing a token's router
// weights (two round trips and its stores), before its first partial's map load. (Until the rows
// were dense, each warp also scanned the counts to find a message's source and index: the map load
// waited for them. The row now says both.)
__device__ __forceinline__ int warp_message_total(const CommParams& p) {
  const int lane = threadIdx.x % kWarpSize;
  return __reduce_add_sync(0xffffffffu, lane < p.world_size ? p.num_msgs[lane] : 0);
}

constexpr int kUnroll = 4;                          // 8-element chunks per lane per slice
constexpr int kSliceChunks = kWarpSize * kUnroll;   // 1024 elements: kSliceBytes of 16-bit output

// One partial per (received message, slice): sum over the message's local experts of w * y, in
// fp32, sent to every rank of the token's DP group with one flag per slice.
// Large calls take messages source-interleaved, (j, s) rather than (s, j): the partials of our
// own tokens are local HBM writes and the others cross the link, and taken source by source the
// two ran one after the other (all warps on the local half first, the link idle). Positions past
// a source's count are skipped; with even routing there are none.
// G warps per slice (G > 1: the small P2P variant only, combine_send_group): warp sub of a group
// takes chunks [sub * N, (sub + 1) * N) of the lane's kUnroll, N = kUnroll / G, over R = 2 * G rows
// at a time, so every lane has 2 * kUnroll 16-byte loads in flight at any G. The group's warps are
// consecutive in one block: they store, meet at named barrier 1 + warp / G, and the first raises
// the slice's flag. bar.sync orders the other warps' stores before its release, which is
// cumulative, as __syncwarp and the release order the lanes' stores of one warp.
// kWarpTotal: the call's message count is warp_total (warp_message_total), else the block's prefix in sm.
// guess: the row loaded before the count (RowGuess), or none.
template <int G, typename Tin, typename Tout, bool kLarge, bool kP2P, bool kWarpTotal = false>
__device__ __forceinline__ void send_partials(const CommParams& p, const CombineIO& io, uint64_t seq,
                                              const CombineSmem& sm, PendingFlags& flags,
                                              int warp_total = 0, const RowGuess& guess = RowGuess{}) {
  static_assert(G == 1 || (!kLarge && kP2P), "warp groups: the small P2P variant only");
  static_assert(!kWarpTotal || (!kLarge && kP2P), "the warp's own message count: the small P2P variant only");
  static_assert(kUnroll % G == 0 && kWarps % G == 0, "a group's warps split the lane's chunks, within one block");
  constexpr int N = kUnroll / G, R = 2 * G;
  const int W = p.world_size, K = p.topk, D = p.dp_size, S = p.max_msgs_per_src, M = p.max_tokens, H = p.hidden;
  const int me = p.rank, nsc = p.combine_slices;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int gw = blockIdx.x * kWarps + warp, nw = gridDim.x * kWarps;
  const int ngroups = nw / G, sub = warp % G;
  const int span = kLarge ? W * sm.msg_off[W + 1] : kWarpTotal ? warp_total : sm.msg_off[W];
  // Small calls whose slices fit one wave of groups take one group per block first (block-uniform:
  // span is the same in every block): a group's loads and stores then have an SM to themselves.
  // Taken block by block, a 1-token V3 call put its 7 groups of 4 warps on 2 SMs.
  const int grp = !kLarge && span * nsc <= ngroups ? (warp / G) * gridDim.x + blockIdx.x : gw / G;
  const int chunks = H / 8;
  const size_t out_row = p.out_row_bytes, row_stride = p.combine_row_bytes;
  // Tagged partials (layout.hpp): the words carry their own arrival, so no flag, barrier or release.
  // Set only where every rank maps every peer, whose calls all take the small P2P variant.
  const bool tagged = !kLarge && kP2P && p.tagged_partials;
  const uint64_t* wrecv = sym_at<uint64_t>(p, p.off_weights_recv);
  const Tin* y = static_cast<const Tin*>(io.expert_y);
  for (int q = grp; q < span * nsc; q += ngroups) {
    const int qv = div_by_mul(q, nsc, p.combine_slices_mul), sl = q - qv * nsc;
    int row = qv;
    if constexpr (kLarge) {
      const int jj = qv / W, ss = (qv + me) % W;  // own tokens' partials start the interleave
      if (jj >= sm.nmsg[ss]) continue;
      row = sm.msg_off[ss] + jj;
    }
    const MsgRow mr = row == guess.row ? guess.r : load_msg_row(p, row);
    const int s = mr.s, t = mr.t, slot = mr.slot;
    const size_t msg = static_cast<size_t>(s) * S + mr.j;  // its index as its sender numbered it: where its weights land
    // The weights (tagged words) are waited for after the first rows' loads have gone out, so that
    // the rows' round trip runs beside the weights' (waited for first, the rows' loads went out only
    // once the weights had come: the spin is a volatile load and a branch, and nothing moves across
    // it). Later rows need no wait. have_w is warp-uniform. fp32 rows (twice the registers) keep
    // the wait first: held across it, they spilled (ptxas, CUDA 13.0: 36 -> 268 bytes); so do the
    // large and the portable variants (their spill loads grew by 28-32 bytes), whose weights are
    // there when the rows are summed: large calls' long before, portable sources' waited for above.
    constexpr bool kRowsFirst = !kLarge && kP2P && sizeof(Tin) == 2;
    uint32_t wbits = 0;  // on a timeout the error is recorded and the layer fails; the weight stays 0
    bool have_w = false;
    const auto wait_weights = [&] {
      if (have_w) return;
      if (lane < K) wait_tagged(p, wrecv + msg * K + lane, seq, wbits, kPhaseCombineSend, kWaitWeights, s);
      have_w = true;
    };
    if (!kRowsFirst) wait_weights();
    int c[N];
#pragma unroll
    for (int i = 0; i < N; ++i) c[i] = sl * kSliceChunks + (sub * N + i) * kWarpSize + lane;
    float acc[N][8];
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[i][e] = 0.f;
    if constexpr (G == 1) {
      // The message's local experts, two at a time (the loop of one warp per slice: written the
      // general way below, V3 at 256 tokens, which takes G = 1, measured +1.3 us in combine).
      for (unsigned kmask = __ballot_sync(0xffffffffu, lane < K && slot >= 0); kmask;) {
        int ka, kb;
        take_pair(kmask, ka, kb);
        const int slot_a = __shfl_sync(0xffffffffu, slot, ka), slot_b = __shfl_sync(0xffffffffu, slot, kb < 0 ? ka : kb);
        const Tin* row_a = y + static_cast<size_t>(slot_a) * H;
        const Tin* row_b = y + static_cast<size_t>(slot_b) * H;
        RawRow<Tin> ra[kUnroll], rb[kUnroll];
#pragma unroll
        for (int qq = 0; qq < kUnroll; ++qq) {
          const int cc = sl * kSliceChunks + qq * kWarpSize + lane;
          if (cc < chunks) {
            ra[qq].load(row_a + cc * 8);
            if (kb >= 0) rb[qq].load(row_b + cc * 8);
          }
        }
        wait_weights();
        const float wk = __uint_as_float(wbits);
        const float w_a = __shfl_sync(0xffffffffu, wk, ka), w_b = __shfl_sync(0xffffffffu, wk, kb < 0 ? ka : kb);
#pragma unroll
        for (int qq = 0; qq < kUnroll; ++qq) {
          float v[8];
          ra[qq].unpack(v);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[qq][e] = fmaf(w_a, v[e], acc[qq][e]);
          if (kb >= 0) {
            rb[qq].unpack(v);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[qq][e] = fmaf(w_b, v[e], acc[qq][e]);
          }
        }
      }
    } else {
      // The message's local experts, R at a time: every row's loads before any is used.
      for (unsigned kmask = __ballot_sync(0xffffffffu, lane < K && slot >= 0); kmask;) {
        int kr[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          kr[r] = kmask ? __ffs(kmask) - 1 : -1;
          kmask &= kmask - 1;
        }
        // Every row's loads unconditional (a missing row reloads row kr[0], a chunk past the row
        // its last one; the sum below skips both): predicated, short of registers, each row was
        // loaded into scratch registers and moved into the array, the move waited for the load,
        // and the eighth row's load went out after those moves (SASS, CUDA 13.0).
        RawRow<Tin> raw[R][N];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const int from = kr[r] < 0 ? kr[0] : kr[r];  // kr[0] >= 0: the mask was not empty
          const int row = __shfl_sync(0xffffffffu, slot, from);
          const Tin* src = y + static_cast<size_t>(row) * H;
#pragma unroll
          for (int i = 0; i < N; ++i) raw[r][i].load(src + static_cast<size_t>(min(c[i], chunks - 1)) * 8);
        }
        wait_weights();
        const float wk = __uint_as_float(wbits);
        float w[R];
#pragma unroll
        for (int r = 0; r < R; ++r) w[r] = __shfl_sync(0xffffffffu, wk, kr[r] < 0 ? kr[0] : kr[r]);
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int i = 0; i < N; ++i) {
            if (kr[r] < 0 || c[i] >= chunks) continue;
            float v[8];
            raw[r][i].unpack(v);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[i][e] = fmaf(w[r], v[e], acc[i][e]);
          }
      }
    }
    const int p0 = small_div(s, p.dp_mul) * D;  // the source's DP group: every member gets the partial (s * D < 2^32)
    bool any_portable = false;
    for (int dd = 0; dd < D; ++dd) any_portable |= peer_at<kP2P>(p, p0 + dd) == nullptr;
    uint8_t* stage = sym_at<uint8_t>(p, p.off_combine_stage) + msg * out_row;
    const size_t dst_off = p.off_combine_recv + (static_cast<size_t>(me) * M + t) * row_stride;
    int4 packed[N];
#pragma unroll
    for (int i = 0; i < N; ++i) packed[i] = Vec8<Tout>::pack(acc[i]);
    // Direct stores into each P2P member's buffer, plus the staging row when a member needs a put.
    for (int dd = 0; dd < D + (any_portable ? 1 : 0); ++dd) {
      uint8_t* row = stage;
      if (dd < D) {
        uint8_t* pb = peer_at<kP2P>(p, p0 + dd);
        if (pb == nullptr) continue;
        row = pb + dst_off;
      }
      if (tagged) {
#pragma unroll
        for (int i = 0; i < N; ++i)
          if (c[i] < chunks) st_tagged_chunk(row + static_cast<size_t>(c[i]) * 32, packed[i], seq);
      } else {
#pragma unroll
        for (int i = 0; i < N; ++i)
          if (c[i] < chunks) st16(row + static_cast<size_t>(c[i]) * 16, packed[i]);
      }
    }
    const size_t flag_idx = (static_cast<size_t>(me) * M + t) * nsc + sl;
    uint64_t* flag = nullptr;  // lane dd < D: this slice's flag at member dd, if P2P
    if (lane < D && !tagged)
      if (uint8_t* pb = peer_at<kP2P>(p, p0 + lane)) flag = reinterpret_cast<uint64_t*>(pb + p.off_combine_flag) + flag_idx;
    if constexpr (kLarge) {
      flags.push(flag, lane, D, seq);
    } else if constexpr (G > 1) {
      if (!tagged) {  // block-uniform: the group meets only to order its stores before the flag
        named_barrier_sync(1 + warp / G, G * kWarpSize);  // + a cumulative release: the group's stores
        if (sub == 0 && flag) st_release_sys(flag, seq);
      }
    } else {
      __syncwarp();  // + a cumulative release: publish the whole warp's stores
      if (flag) st_release_sys(flag, seq);
    }
    if (any_portable) {
      __threadfence();
      const size_t lo_b = static_cast<size_t>(sl) * kSliceChunks * 16;
      const size_t hi_b = min(out_row, lo_b + static_cast<size_t>(kSliceChunks) * 16);
      for (int dd = 0; dd < D; ++dd)
        if (peer_at<kP2P>(p, p0 + dd) == nullptr)
          put_signal_warp(p.sym + dst_off + lo_b, stage + lo_b, hi_b - lo_b,
                                          sym_at<uint64_t>(p, p.off_combine_flag) + flag_idx, seq, NVSHMEM_SIGNAL_SET,
                                          p0 + dd);
    }
  }
}

// The small P2P variant's partials for `units` (message, slice) units: G warps per slice, the
// largest G whose groups take them all in one wave (combine_send_group).
template <typename Tin, typename Tout, bool kWarpTotal>
__device__ __forceinline__ void send_partials_grouped(const CommParams& p, const CombineIO& io, uint64_t seq,
                                                      const CombineSmem& sm, PendingFlags& flags, int units,
                                                      int warp_total = 0, const RowGuess& guess = RowGuess{}) {
  const int G = combine_send_group(units, static_cast<int>(gridDim.x) * kWarps);
  static_assert(kMaxCombineGroup == 4, "the groups below");
  if (G == 4) {
    send_partials<4, Tin, Tout, false, true, kWarpTotal>(p, io, seq, sm, flags, warp_total, guess);
  } else if (G == 2) {
    send_partials<2, Tin, Tout, false, true, kWarpTotal>(p, io, seq, sm, flags, warp_total, guess);
  } else {
    send_partials<1, Tin, Tout, false, true, kWarpTotal>(p, io, seq, sm, flags, warp_total, guess);
  }
}

// kLarge: compiled with the large-call paths (see kLargeCallTokens): messages taken
// source-interleaved and arrival flags raised kFlagBatch slices at a time.
// kP2P: every rank P2P-mapped (KernelVariant::kSmallP2P), the portable branches compiled out.
// kDecode: the small P2P variant's decode kernel (combine_decode_kernel): at most kDecodeMaxRanks
// ranks, so the warp-index path only.
template <typename Tin, typename Tout, bool kLarge, bool kP2P, bool kDecode>
__device__ void combine_send(const CommParams& p, const CombineIO& io, uint64_t seq, int m, int* smem) {
  const int W = p.world_size, K = p.topk, D = p.dp_size, S = p.max_msgs_per_src;
  const int me = p.rank, gi = p.group_index, nsc = p.combine_slices;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int nw = gridDim.x * kWarps;
  CombineSmem sm{smem, smem + W};

  // Router weights of our own tokens to every rank we dispatched them to, into the same slot, as
  // tagged words (wait.cuh): a P2P receiver reads each as it lands, with no counter and no
  // release; a portable one after its put's signal.
  const int n_own = p.weights_at_dispatch ? 0 : num_own_tokens(p, m);  // dispatch carried the weights
  // Whether the layer was aborted (an error recorded by a wait that ran out), read by thread 0 now
  // and shared at the barrier before the partials: read there, its load was one more round trip
  // before the first partial. Every wait below is bounded, and ends early on an abort by itself.
  // (The warp-index path below needs none.) warp_index is block-uniform.
  static_assert(kDecodeMaxRanks <= kWarpSize, "warp_message_total: one rank per lane");
  const bool warp_index = kDecode || (!kLarge && kP2P && W <= kWarpSize);  // a constant in the decode kernel
  const int32_t abort_early = !warp_index && threadIdx.x == 0 ? abort_word(p) : 0;  // tested at the barrier (abort_word)
  // One warp per own token, every block's second-to-last warp first (block by block), then the
  // warps below it (and the last warp, after warp 0): the partials and the token side start from
  // warp 0 and the layer tail's loads are the last warp's, so at decode the warp that sends a
  // token's weights does nothing else. Block-major, as before, the 1-token weights and the first
  // partial both fell to block 0's warp 0, one after the other.
  for (int u = ((2 * kWarps - 2 - warp) % kWarps) * gridDim.x + blockIdx.x; u < n_own; u += nw) {
    const int t = u * D + gi;
    const uint64_t w = tag_word(seq, lane < K ? __float_as_uint(io.topk_weights[static_cast<size_t>(t) * K + lane]) : 0u);
    uint64_t* stage = sym_at<uint64_t>(p, p.off_weights_stage) + static_cast<size_t>(u) * K;
    bool staged = false;
    for (int base = 0; base < W; base += kWarpSize) {
      const int x = base + lane;
      const int j = x < W ? p.send_slot[static_cast<size_t>(u) * W + x] : -1;
      for (unsigned mask = __ballot_sync(0xffffffffu, j >= 0); mask; mask &= mask - 1) {
        const int src_lane = __ffs(mask) - 1;
        const int d = base + src_lane;
        const int jd = __shfl_sync(0xffffffffu, j, src_lane);
        const size_t off = p.off_weights_recv + ((static_cast<size_t>(me) * S + jd) * K) * sizeof(uint64_t);
        if (uint8_t* pb = peer_at<kP2P>(p, d)) {
          if (lane < K) st_relaxed_sys(reinterpret_cast<uint64_t*>(pb + off) + lane, w);
        } else {
          if (!staged) {
            if (lane < K) stage[lane] = w;
            __syncwarp();
            __threadfence();
            staged = true;
          }
          put_signal_warp(p.sym + off, stage, K * sizeof(uint64_t),
                                          sym_at<uint64_t>(p, p.off_weights_recv_ctr) + me, 1, NVSHMEM_SIGNAL_ADD, d);
        }
      }
    }
  }

  PendingFlags flags;
  if constexpr (!kLarge && kP2P) {
    if (warp_index) {
      // Each warp on its own: its likely first row and the message count (warp_message_total), then its
      // partials. No early return on an aborted layer here: every wait below is bounded and ends
      // early on an abort by itself, and the warps of a group (named barriers without tagged
      // partials) must all go on.
      RowGuess guess;
      const int gq = (warp / kMaxCombineGroup) * gridDim.x + blockIdx.x;  // the group's unit, one wave of groups of 4
      if (gq < W * S * nsc) {
        guess.row = div_by_mul(gq, nsc, p.combine_slices_mul);
        guess.r = load_msg_row(p, guess.row);
      }
      const int total = warp_message_total(p);
      send_partials_grouped<Tin, Tout, true>(p, io, seq, sm, flags, total * nsc, total, guess);
      return;
    }
  }
  // Portable sources: wait for the weights of every message we received from them in the matching
  // dispatch (its dispatch_recv added them to weights_base). P2P sources' weights are read below,
  // each as it lands.
  const uint64_t* wctr = sym_at<uint64_t>(p, p.off_weights_recv_ctr);
  for (int s = threadIdx.x; s < W; s += blockDim.x) {
    sm.nmsg[s] = p.num_msgs[s];
    if (!p.weights_at_dispatch && peer_at<kP2P>(p, s) == nullptr)
      wait_flag(p, wctr + s, p.weights_base[s], Cmp::kGe, kPhaseCombineSend, kWaitWeights, s, -1, seq);
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // each source's first recv_map row (layout.hpp: ours first, then me + 1, ...)
    int acc = 0, most = 0;
#pragma unroll 1  // one thread, W steps: unrolled it was 150 instructions
    for (int i = 0; i < W; ++i) {
      const int s = map_order_source(me, i, W);
      sm.msg_off[s] = acc, acc += sm.nmsg[s], most = max(most, sm.nmsg[s]);
    }
    sm.msg_off[W] = acc;
    sm.msg_off[W + 1] = most;
  }
  // Block-uniform (send_partials' groups meet at named barriers, so no warp may leave alone).
  const bool aborted = __syncthreads_or(abort_early != 0);
  if (aborted) return;

  // One partial per (received message, slice): see send_partials. The small P2P variant shares a
  // slice among G warps when the call's slices fit one wave that way (combine_send_group).
  if constexpr (!kLarge && kP2P) {
    send_partials_grouped<Tin, Tout, false>(p, io, seq, sm, flags, sm.msg_off[W] * nsc);
  } else {
    send_partials<1, Tin, Tout, kLarge, kP2P>(p, io, seq, sm, flags);
  }
  if constexpr (kLarge) flags.flush(lane, D, seq);
}

// The token side: one warp per (token, slice) sums the partials of each rank it dispatched to.
// With arrival flags it waits for each rank's flag, then loads the partials two ranks at a time.
// kTagged (tagged partials, layout.hpp): it reads each rank's words as they land, one rank at a time
// (both ranks' tagged words in flight at once spilled 500 bytes); a lane whose chunks have not all
// landed loads them all again until one round has them all, and sums that round's words.
template <typename Tout, bool kTagged>
__device__ __forceinline__ void recv_partials(const CommParams& p, const CombineIO& io, uint64_t seq, int m) {
  const int K = p.topk, M = p.max_tokens, H = p.hidden;
  const int nsc = p.combine_slices;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int gw = blockIdx.x * kWarps + warp, nw = gridDim.x * kWarps;
  const uint64_t* flags = sym_at<uint64_t>(p, p.off_combine_flag);
  const uint8_t* partials = sym_at<uint8_t>(p, p.off_combine_recv);
  const size_t row_stride = p.combine_row_bytes;
  const int chunks = H / 8;
  Tout* out = static_cast<Tout*>(io.out);
  // One (token, slice) per block first when they fit one wave, as in send_partials. (Taken from each
  // block's last warp down, on warps the send groups leave free, they gained nothing at 1-4 tokens
  // and lost 0.3-0.4 us at 128.)
  const int q0 = m * nsc <= nw ? warp * gridDim.x + blockIdx.x : gw;

  for (int q = q0; q < m * nsc; q += nw) {
    const int t = div_by_mul(q, nsc, p.combine_slices_mul), sl = q - t * nsc;
    const int e = lane < K ? read_expert(p, io.topk_idx, io.idx_type, static_cast<int64_t>(t) * K + lane,
                                         kPhaseCombineRecv, t, seq, false)
                           : -1;
    const int r = e >= 0 ? expert_rank(e, p.rank_div) : -1;
    const unsigned same = match_groups(r, match_key_width(p.world_size), min(p.world_size, K) + 1);  // warp_match.cuh
    const bool first = e >= 0 && (same & ((1u << lane) - 1)) == 0;
    bool ok = true;
    if constexpr (!kTagged) {
      if (first)
        ok = wait_flag(p, flags + (static_cast<size_t>(r) * M + t) * nsc + sl, seq, Cmp::kEq, kPhaseCombineRecv,
                       kWaitPartial, r, t, seq);
      if (!__all_sync(0xffffffffu, ok)) break;
    }
    const unsigned dmask = __ballot_sync(0xffffffffu, first);
    float acc[kUnroll][8];
#pragma unroll
    for (int qq = 0; qq < kUnroll; ++qq)
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[qq][i] = 0.f;
    if constexpr (kTagged) {
      // This lane's chunks of the slice: sl * kSliceChunks + qq * 32 + lane < chunks.
      const int c0 = sl * kSliceChunks + lane;
      const int n = c0 < chunks ? min(kUnroll, (chunks - c0 + kWarpSize - 1) / kWarpSize) : 0;
      for (unsigned km = dmask; km; km &= km - 1) {
        const int rr = __shfl_sync(0xffffffffu, r, __ffs(km) - 1);
        const uint8_t* row = partials + (static_cast<size_t>(rr) * M + t) * row_stride + static_cast<size_t>(c0) * 32;
        // Every chunk of the lane each round, until one round sees them all under this call's tag
        // (spin_alive: the bound); the sum takes that round's words. A lane that has failed on an
        // earlier rank does not wait again.
        TaggedChunk tc[kUnroll];
        uint64_t start = 0;
        uint32_t spins = 0;
        for (;; ++spins) {
#pragma unroll
          for (int qq = 0; qq < kUnroll; ++qq)
            if (qq < n) tc[qq].load(row + static_cast<size_t>(qq) * kWarpSize * 32);
          bool ready = true;
#pragma unroll
          for (int qq = 0; qq < kUnroll; ++qq)
            if (qq < n) ready = ready && tc[qq].ready(seq);
          if (ready || !ok) break;
          if (spins == 0) {
            start = global_timer_ns();
          } else if ((spins & 63) == 0 &&
                     !spin_alive(p, start, static_cast<int64_t>(tc[0].w[0] >> 32), static_cast<int64_t>(seq & 0xffffffffull),
                                 err_where(kErrTimeout, kPhaseCombineRecv, kWaitPartial, rr), t, seq)) {
            ok = false;
            break;
          }
        }
#pragma unroll
        for (int qq = 0; qq < kUnroll; ++qq) {
          if (qq >= n) continue;
          float f[8];
          Vec8<Tout>::unpack(tc[qq].value(), f);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[qq][i] += f[i];
        }
      }
      if (!__all_sync(0xffffffffu, ok)) break;  // a partial that never came (recorded): the layer fails
#pragma unroll
      for (int qq = 0; qq < kUnroll; ++qq)
        if (qq < n) st16(out + static_cast<size_t>(t) * H + static_cast<size_t>(c0 + qq * kWarpSize) * 8, Vec8<Tout>::pack(acc[qq]));
    } else {
      // The partials, two ranks at a time.
      for (unsigned km = dmask; km;) {
        int ka, kb;
        take_pair(km, ka, kb);
        const int ra = __shfl_sync(0xffffffffu, r, ka), rb = __shfl_sync(0xffffffffu, r, kb < 0 ? ka : kb);
        const uint8_t* row_a = partials + (static_cast<size_t>(ra) * M + t) * row_stride;
        const uint8_t* row_b = partials + (static_cast<size_t>(rb) * M + t) * row_stride;
        int4 va[kUnroll], vb[kUnroll];
#pragma unroll
        for (int qq = 0; qq < kUnroll; ++qq) {
          const int c = sl * kSliceChunks + qq * kWarpSize + lane;
          if (c < chunks) {
            va[qq] = ld_cg16(row_a + static_cast<size_t>(c) * 16);
            if (kb >= 0) vb[qq] = ld_cg16(row_b + static_cast<size_t>(c) * 16);
          }
        }
#pragma unroll
        for (int qq = 0; qq < kUnroll; ++qq) {
          float f[8];
          Vec8<Tout>::unpack(va[qq], f);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[qq][i] += f[i];
          if (kb >= 0) {
            Vec8<Tout>::unpack(vb[qq], f);
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[qq][i] += f[i];
          }
        }
      }
#pragma unroll
      for (int qq = 0; qq < kUnroll; ++qq) {
        const int c = sl * kSliceChunks + qq * kWarpSize + lane;
        if (c < chunks) st16(out + static_cast<size_t>(t) * H + c * 8, Vec8<Tout>::pack(acc[qq]));
      }
    }
  }
}

// kTaggable: the small P2P variant, the only one an object with tagged partials runs; kTagged: its
// decode kernel, whose objects all have them.
template <typename Tout, bool kTaggable, bool kTagged>
__device__ void combine_recv(const CommParams& p, const CombineIO& io, uint64_t seq, int m) {
  static_assert(!kTagged || kTaggable, "tagged partials: the small P2P variant only");
  if (kTagged || (kTaggable && p.tagged_partials))
    recv_partials<Tout, true>(p, io, seq, m);
  else
    recv_partials<Tout, false>(p, io, seq, m);

}

// The layer's bookkeeping, on one warp of the combine kernel (the last block's last warp: the
// weights' warps start from every block's second-to-last warp and the partials and the token side
// from the first ones, so at decode this warp does nothing else). None of it waits for the other
// blocks: at decode their work and this run side by side, and every block leaves when its own work
// is done (a finished-block counter held each block for an acq_rel atomic and the last one for its
// stores: 0.7-0.9 us per decode pair at W = 1).
//
// raise_barrier (combine_send): this rank no longer reads its dispatch buffers. dispatch_recv, the
// only reader of what a peer's next dispatch_send writes (messages, counts, arrival counters), ran
// in an earlier kernel of this stream, which griddepcontrol.wait has seen complete, so every peer
// is told now (flag = seq, one lane per peer; docs/ARCHITECTURE.md, buffer reuse), and the release
// finds no store of this kernel to wait for. (Raised after the partials, it waited for the warp's
// partial stores, and that warp then took its token-side unit.)
template <bool kP2P>
__device__ __forceinline__ void raise_barrier(const CommParams& p, uint64_t seq) {
  for (int d = threadIdx.x % kWarpSize; d < p.world_size; d += kWarpSize) {
    if (uint8_t* pb = peer_at<kP2P>(p, d)) {
      st_release_sys(reinterpret_cast<uint64_t*>(pb + p.off_barrier_flag) + p.rank, seq);
    } else {
      signal_remote(sym_at<uint64_t>(p, p.off_barrier_flag) + p.rank, seq, NVSHMEM_SIGNAL_SET, d);
    }
  }
}

// advance_layer (combine_recv): the next call's seq and per-source dispatch arrival bases. Their
// only readers are the dispatch kernels (this layer's are complete: griddepcontrol.wait; the next
// layer's start after this kernel ends), and the combine kernels read seq from combine_seq, so they
// are written at once, from values loaded here. (The weights' bases are advanced by dispatch_recv:
// combine_send reads them.)
__device__ __forceinline__ void advance_layer(const CommParams& p, uint64_t seq) {
  const int lane = threadIdx.x % kWarpSize;
  for (int s = lane; s < p.world_size; s += kWarpSize)
    p.recv_base[s] += static_cast<uint64_t>(p.num_msgs[s]) * p.dispatch_slices;  // slices per message
  if (lane == 0) *reinterpret_cast<volatile uint64_t*>(&p.state->seq) = seq + 1;
}

// wait_barrier (combine_recv): the only global barrier. The kernel does not end before every peer
// has entered combine (so is done with its dispatch buffers): a fast rank can never start the next
// dispatch while a slow one still reads them.
__device__ __forceinline__ void wait_barrier(const CommParams& p, uint64_t seq) {
  const uint64_t* bar = sym_at<uint64_t>(p, p.off_barrier_flag);
  for (int s = threadIdx.x % kWarpSize; s < p.world_size; s += kWarpSize)
    wait_flag(p, bar + s, seq, Cmp::kEq, kPhaseCombineRecv, kWaitBarrier, s, -1, seq);
}

// __grid_constant__: the cold paths take p by reference; without it every thread keeps a stack
// copy of it (docs/ARCHITECTURE.md, kernel code conventions).
// kDecode: the small P2P variant's decode kernel (combine_decode_kernel).
template <typename Tin, typename Tout, bool kLarge, bool kP2P, bool kDecode = false>
__global__ void __launch_bounds__(kThreads, 1)
    combine_kernel(const __grid_constant__ CommParams p, const __grid_constant__ CombineIO io, bool do_send,
                   bool do_recv) {
  extern __shared__ int smem[];
  if constexpr (kDecode) touch_param_lines(p, io, kCombineTouchWarp);
  wait_previous_kernel();
  // This call's seq, as dispatch_recv stored it (not waited for until used).
  const uint64_t seq = *reinterpret_cast<volatile uint64_t*>(&p.state->combine_seq);
  // m (reported by dispatch_send only: one bad m is one error, not one per kernel of the layer).
  // With m on the device, the decode kernel loads it once for both halves: loaded again by the
  // token side, after its partials, it was one more round trip on that chain (graph -0.1 to -0.4 us
  // per pair). Kept in a register across the send half, it spilled (a stack
  // frame, SASS, CUDA 13.0), so each warp keeps its copy in shared memory: every lane stores the
  // same value and reads it back, so no lane waits for another. With m on the host there is nothing
  // to load: done the same way, it cost 0.1-0.2 us of graph time per pair there, so
  // those calls read the parameter as before. (The other kernels, where m's register spilled too,
  // load it in each half.)
  const bool m_kept = kDecode && do_send && do_recv && io.m.dev_m != nullptr;
  __shared__ int m_of_warp[kDecode ? kWarps : 1];
  const int m = do_send ? resolve_num_tokens(p, io.m, kPhaseCombineSend, seq, false) : 0;
  if (m_kept) m_of_warp[threadIdx.x / kWarpSize] = m;
  const bool tail_warp = blockIdx.x == gridDim.x - 1 && threadIdx.x / kWarpSize == kWarps - 1;
  if (tail_warp) {
    if (do_send) raise_barrier<kP2P>(p, seq);
    if (do_recv) advance_layer(p, seq);
  }
  static_assert(!kDecode || (!kLarge && kP2P), "the decode kernel: the small P2P variant only");
  if (do_send) combine_send<Tin, Tout, kLarge, kP2P, kDecode>(p, io, seq, m, smem);
  if (do_recv) {
    const int mr = m_kept ? reinterpret_cast<volatile int*>(m_of_warp)[threadIdx.x / kWarpSize]
                          : resolve_num_tokens(p, io.m, kPhaseCombineRecv, seq, false);
    combine_recv<Tout, !kLarge && kP2P, kDecode>(p, io, seq, mr);
    if (tail_warp) wait_barrier(p, seq);
  }
}

template <typename Tin, typename Tout>
cudaError_t launch_typed(const CommParams& p, const CombineIO& io, CombineKernel which, bool s, bool r,
                         const LaunchShape& sh, cudaStream_t st) {
  auto kernel = which == CombineKernel::kLarge      ? combine_kernel<Tin, Tout, true, false>
                : which == CombineKernel::kDecode   ? combine_kernel<Tin, Tout, false, true, true>
                : which == CombineKernel::kSmallP2P ? combine_kernel<Tin, Tout, false, true>
                                                    : combine_kernel<Tin, Tout, false, false>;
  return launch_after_previous(kernel, sh, st, p, io, s, r);
}

template <typename Tout>
cudaError_t launch_out(const CommParams& p, const CombineIO& io, CombineKernel which, DType in, bool s, bool r,
                       const LaunchShape& sh, cudaStream_t st) {
  switch (in) {
    case DType::kBF16: return launch_typed<__nv_bfloat16, Tout>(p, io, which, s, r, sh, st);
    case DType::kFP16: return launch_typed<__half, Tout>(p, io, which, s, r, sh, st);
    case DType::kFP32: return launch_typed<float, Tout>(p, io, which, s, r, sh, st);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_combine(const CommParams& p, const CombineIO& io, CombineKernel which, DType in, DType out,
                           bool do_send, bool do_recv, const LaunchShape& shape, cudaStream_t stream) {
  switch (out) {
    case DType::kBF16: return launch_out<__nv_bfloat16>(p, io, which, in, do_send, do_recv, shape, stream);
    case DType::kFP16: return launch_out<__half>(p, io, which, in, do_send, do_recv, shape, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace epkit::kernels
