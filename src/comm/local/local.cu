// World size 1: dispatch and combine without a peer. With one rank, dispatch is the
// permutation of the tokens into the expert-major layout and combine the weighted gather back out
// of it, so these kernels send no messages, raise no flags and touch symmetric memory only where a
// split half must hand data to the other. The host takes them for every call of an object with
// world_size == 1 (the data path does not matter there: there is no peer). This is a W = 1 fast path
// of its own; it does not make the W >= 2 kernels (dispatch.cu, combine.cu) any faster.
//
// Dispatch (fused): give every (token, k) entry its rank within its expert, and store x (and its
// scales) straight into expert_x; recv_map[t] = (t, expert_x row per k) tells combine where each
// (t, k) went. Small objects (M < kLocalLargeTokens): every block ranks all m * K entries the same
// way (in entry order, so the rows are deterministic), with no communication between blocks, and any
// warp of the grid places any (token, piece of the row, k); while that is cheaper (decode sizes:
// local_scan_ranks), each warp ranks only its own unit's entry instead. Large ones: each block gives its own chunk
// of tokens their ranks (in an order set by shared atomics), counts only that chunk and takes its base
// in each expert with one global atomic per (block, expert); the packed layout then needs every
// total before any offset, one grid-wide step (all blocks resident, as the fused kernels of every
// world size assume), while the masked layout's last block writes the counts and nobody waits.
// dispatch_send / dispatch_recv keep their contract (the send half reads only the inputs, the
// receive half writes the outputs): the send half stages each token as its message to self (the
// message layout of layout.hpp: header with (expert, rank) per k, scales, payload), the receive
// half places the staged tokens.
//
// Combine (fused): one warp per (token, 256 * kChunks elements) sums w[t,k] * expert_y[row(t,k)] over
// k in fp32 and stores the output once. combine_send stores that sum (in the output dtype, so the
// value is the same) into the staging rows; combine_recv copies them to out.
//
// Fused decode calls whose m is given on the host run one-path kernels (local_dispatch_path_kernel,
// local_combine_wave_kernel): the path the general kernel would take, and only its instructions.
// Code a call does not execute still costs it: a kernel's instructions come into each SM's
// instruction caches as it runs, and the general kernels' other paths sit between and around the
// decode path's (measured: -0.5 us per dispatch + combine pair at 1 to 32 tokens).
#include <cuda_runtime.h>

#include "comm/kernels/protocol.cuh"
#include "comm/kernels/launch.hpp"
#include "comm/kernels/vec8.cuh"

namespace epkit::kernels {

namespace {

constexpr int kHistUnroll = 4;    // topk loads in flight per lane in the histogram
constexpr int kUnroll = 4;        // 16-byte chunks per lane per dispatch slice (kSliceBytes)
constexpr int kSliceChunks = kWarpSize * kUnroll;
constexpr int kRowBatch = 8;      // small combine: expert rows whose loads a warp keeps in flight together
// Large combine: rows whose four 512-byte pieces (a unit's 1024 elements) a warp loads together.
// Two rows of four pieces measured faster at 4096 tokens than eight rows of one piece (V3 combine
// 143.5 -> 141.0 us: each row's 2 KB read in one go) and than four rows (180 us).
constexpr int kLargeRowBatch = 2;
// Small objects, fused: one scatter unit is a piece of U 16-byte chunks per lane (512 B or 2 KB per
// warp). host::local_shapes picks the smaller when all of a call's units fit in one wave of the grid
// (decode: more warps and SMs share a token's K rows), else the larger (fewer, longer units:
// measured faster at 128 tokens). One-path scan calls also take 4 KB pieces where only those fit in
// one wave (kernels::local_fused_piece_chunks: V3 at 65-132 tokens).
static_assert(kWarpSize * 16 == 512, "local_pieces_per_row counts 512-byte chunks per warp");

// Shared memory of the dispatch kernel. Both paths start with the counts (what dispatch_recv uses);
// the packed arrays are used only with the packed layout.
struct CountSmem {
  int* cnt;    // [E] entries per expert: small, over all m tokens; large, this block's chunk, then the totals
  int* first;  // [E + 1] packed: first row of each expert
  int* wsum;   // [kWarps] scratch of block_aligned_prefix
};
__device__ __forceinline__ CountSmem carve_counts(int* smem, int E) {
  CountSmem c;
  c.cnt = smem;
  c.first = c.cnt + E;
  c.wsum = c.first + E + 1;
  return c;
}

// Large objects, after the counts.
struct LocalSmem : CountSmem {
  int* run;      // [E] next rank within each expert of this block's tokens
  int* tok_e;    // [kLocalRoundTokens][K] expert of each entry of the round's tokens (-1: none)
  int* tok_rk;   // [kLocalRoundTokens][K] its rank within the expert (fused: its row of expert_x, -1 if none)
  int* last;     // [1] large masked: this block is the last to count
};
__device__ __forceinline__ LocalSmem carve(int* smem, int E, int K) {
  LocalSmem sm;
  static_cast<CountSmem&>(sm) = carve_counts(smem, E);
  sm.run = smem + local_count_smem_ints(E);
  sm.tok_e = sm.run + E;
  sm.tok_rk = sm.tok_e + kLocalRoundTokens * K;
  sm.last = sm.tok_rk + kLocalRoundTokens * K;
  return sm;
}

// Small objects, after the counts: entry i = t * K + k of the n = m * K entries.
struct SmallSmem : CountSmem {
  int* wcnt;  // [local_rank_warps(E)][E] each ranking warp's entries per expert, then its base in each expert
  int* ent;   // [max_tokens * K] expert of entry i (-1: none)
  int* rk;    // [max_tokens * K] its rank within the expert (fused: its row of expert_x, -1 if none)
};
__device__ __forceinline__ SmallSmem carve_small(int* smem, int E, int max_entries) {
  SmallSmem sm;
  static_cast<CountSmem&>(sm) = carve_counts(smem, E);
  sm.wcnt = smem + local_count_smem_ints(E);
  sm.ent = sm.wcnt + static_cast<size_t>(local_rank_warps(E)) * E;
  sm.rk = sm.ent + max_entries;
  return sm;
}

__device__ __forceinline__ unsigned long long atomic_add_acq_rel_gpu_u64(uint64_t* p, unsigned long long v) {
  unsigned long long old;
  asm volatile("atom.acq_rel.gpu.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
  return old;
}

// Rows of expert_x (and expert_y) in this layout: what a recv_map row index must stay below.
__device__ __forceinline__ int local_rows(const CommParams& p) {
  return p.packed ? p.packed_rows : p.num_local_experts * p.capacity;
}

// Masked layout: expert e's count c as expert_num_tokens holds it (at most the capacity) and, past
// the capacity, the overflow record.
__device__ __forceinline__ void write_masked_count(const CommParams& p, const DispatchIO& io, int e, int c, int cap) {
  io.expert_num_tokens[e] = min(c, cap);
  if (c > cap) record_error(p, err_where(kErrCapacity, kPhaseDispatchRecv, kWaitNone, -1), e, -1, c, cap, 0);
}

// The counts (and packed offsets) from the per-expert totals in sm.cnt, and the overflow record.
// packed: every block (they all need the first rows); the writer block writes the outputs. masked:
// only the writer block calls it.
__device__ void local_counts_out(const CommParams& p, const DispatchIO& io, const CountSmem& sm, bool writer) {
  const int E = p.num_experts, cap = p.capacity;
  if (p.packed) {
    block_aligned_prefix(E, p.packed_row_align, [&](int e) { return sm.cnt[e]; }, sm.first, sm.wsum);
    if (writer) write_packed_counts(p, io, sm.cnt, sm.first, kPhaseDispatchRecv, 0);
    return;
  }
  for (int e = threadIdx.x; e < E; e += blockDim.x) write_masked_count(p, io, e, sm.cnt[e], cap);
}

// The warp stores piece pc of a row (U 16-byte chunks per lane: 512 * U bytes) into row r of
// expert_x and, with pc == 0, the scales: the first 128 held in sc, any further ones (hidden > 16384)
// read from src_sc.
template <int U>
__device__ __forceinline__ void store_row_piece(const CommParams& p, const DispatchIO& io, const int4 (&v)[U],
                                                const float (&sc)[kScaleRegs], const float* src_sc, int r, int pc,
                                                int lane, bool scales = true) {
  const int chunks = p.payload_bytes / 16, ns = scales ? p.num_scales : 0;
  int4* dst = reinterpret_cast<int4*>(io.expert_x + static_cast<size_t>(r) * p.payload_bytes);
#pragma unroll
  for (int q = 0; q < U; ++q) {
    const int c = (pc * U + q) * kWarpSize + lane;
    if (c < chunks) dst[c] = v[q];
  }
  if (pc == 0 && ns > 0) store_row_scales(p, io, ns, sc, src_sc, r, lane);
}

// Lane k holds `row` for entry k (-1: none): the warp stores its slice into each of those rows.
__device__ __forceinline__ void store_to_rows(const CommParams& p, const DispatchIO& io, const int4 (&v)[kUnroll],
                                              const float (&sc)[kScaleRegs], const float* src_sc, int row, int sl,
                                              int lane) {
  const int K = p.topk;
#pragma unroll
  for (int k = 0; k < kMaxTopK; ++k) {
    const int r = __shfl_sync(0xffffffffu, row, k);
    if (k >= K || r < 0) continue;
    store_row_piece(p, io, v, sc, src_sc, r, sl, lane);
  }
}

// Token t's first kScaleRegs * 32 of its ns scales, lane l holding l, l + 32, ... (0 past ns).
__device__ __forceinline__ void load_token_scales(const DispatchIO& io, int t, int ns, int lane, float (&sc)[kScaleRegs]) {
#pragma unroll
  for (int i = 0; i < kScaleRegs; ++i)
    sc[i] = i * kWarpSize + lane < ns ? __ldg(io.x_scale + static_cast<size_t>(t) * ns + i * kWarpSize + lane) : 0.f;
}

// Piece pc of token t (U 16-byte chunks per lane) and, with pc == 0, its first scales.
template <int U>
__device__ __forceinline__ void load_piece(const CommParams& p, const DispatchIO& io, int t, int pc, int lane,
                                           int4 (&v)[U], float (&sc)[kScaleRegs], bool scales = true) {
  const int chunks = p.payload_bytes / 16, ns = scales ? p.num_scales : 0;
  const int4* src = reinterpret_cast<const int4*>(io.x + static_cast<size_t>(t) * p.payload_bytes);
#pragma unroll
  for (int q = 0; q < U; ++q) {
    const int c = (pc * U + q) * kWarpSize + lane;
    v[q] = c < chunks ? __ldg(src + c) : int4{};
  }
  load_token_scales(io, t, pc == 0 ? ns : 0, lane, sc);
}
__device__ __forceinline__ void load_slice(const CommParams& p, const DispatchIO& io, int t, int sl, int lane,
                                           int4 (&v)[kUnroll], float (&sc)[kScaleRegs]) {
  load_piece<kUnroll>(p, io, t, sl, lane, v, sc);
}

// dst = src, element by element (register arrays: a prefetched unit taking the place of a load).
template <typename T, int N>
__device__ __forceinline__ void take(T (&dst)[N], const T (&src)[N]) {
#pragma unroll
  for (int j = 0; j < N; ++j) dst[j] = src[j];
}

// recv_map[t][1 + k] = row of entry (t, k) (and map[t][0] = t), and with weights_at_dispatch the
// entry's weight w (io.topk_weights[t * K + k], loaded by the caller) where combine reads it.
__device__ __forceinline__ void write_map_entry(const CommParams& p, int t, int k, int row, float w) {
  const int K = p.topk;
  int32_t* map = p.recv_map + static_cast<size_t>(t) * (K + 1);
  map[1 + k] = row;
  if (k == 0) map[0] = t;
  if (p.weights_at_dispatch) sym_at<uint64_t>(p, p.off_weights_recv)[static_cast<size_t>(t) * K + k] = __float_as_uint(w);
}
__device__ __forceinline__ void write_map_entry(const CommParams& p, const DispatchIO& io, int t, int k, int row) {
  write_map_entry(p, t, k, row, p.weights_at_dispatch ? io.topk_weights[static_cast<size_t>(t) * p.topk + k] : 0.f);
}

// The fused small dispatch's units: unit q is piece q / K % npc (U 16-byte chunks per lane) of token
// q / K / npc for entry k = q % K, m * npc * K of them. Unit q goes to warp q / gridDim.x of block
// q % gridDim.x (this warp: gw, gw + gstride, ...), so that a decode call's few units land on as
// many SMs as the grid has (one unit per block first), not on the first blocks' 16 warps each.
//
// Built in place from the kernel's parameters and passed by reference, never copied (the copy
// constructor is deleted): nvcc 13.0 compiles a copy of such an object, in a kernel whose parameter
// is __grid_constant__, into parameter-space loads at the object's own field offsets, i.e. reads of
// unrelated CommParams fields (tests/compiler/grid_constant_copy.cu; a field order of CommParams
// exposed it once and broke the one-warp dispatch).
template <int U>
struct PieceUnits {
  int K, npc, units, gw, gstride;
  uint64_t kmul, nmul;  // small_div_mul of K and npc (CommParams)
  bool scales;  // false: the pieces carry no scales (the one-warp dispatch's scale units store them)
  __device__ PieceUnits(const CommParams& p, int m, bool with_scales = true)
      : K(p.topk),
        npc(local_pieces_per_row(p.payload_bytes, U)),
        units(m * npc * K),
        gw(static_cast<int>(threadIdx.x / kWarpSize * gridDim.x + blockIdx.x)),
        gstride(static_cast<int>(gridDim.x) * kWarps),
        kmul(p.topk_mul),
        nmul(p.piece_mul[piece_mul_index(U)]),
        scales(with_scales) {}
  PieceUnits(const PieceUnits&) = delete;
  PieceUnits& operator=(const PieceUnits&) = delete;
  // q < 2^20 (m < kLocalLargeTokens, npc <= 64, K <= 32): within small_div's range.
  __device__ int entry_k(int q) const { return q - small_div(q, kmul) * K; }
  __device__ int token(int q) const { return small_div(small_div(q, kmul), nmul); }
  __device__ int piece(int q) const {
    const int a = small_div(q, kmul);
    return a - small_div(a, nmul) * npc;
  }
  __device__ void load(const CommParams& p, const DispatchIO& io, int q, int4 (&v)[U], float (&sc)[kScaleRegs]) const {
    load_piece<U>(p, io, token(q), piece(q), threadIdx.x % kWarpSize, v, sc, scales);
  }
};

// The fused small dispatch's scatter: this warp stores its units (row_of(i), warp-uniform in i,
// returns the row of entry i or -1 for none), its next unit's load in flight while the current one
// is stored. pre holds the warp's first unit, loaded by the caller before its ranking. With
// write_map, the unit of piece 0 also writes the entry's recv_map row (lane 0).
template <int U, typename RowOf>
__device__ __forceinline__ void scatter_units(const CommParams& p, const DispatchIO& io, const PieceUnits<U>& u,
                                              int4 (&pre)[U], float (&pre_sc)[kScaleRegs], RowOf row_of,
                                              bool write_map = false) {
  const int K = p.topk, ns = p.num_scales, lane = threadIdx.x % kWarpSize;
  for (int q = u.gw; q < u.units; q += u.gstride) {
    int4 nxt[U];
    float nxt_sc[kScaleRegs];
    const int qn = q + u.gstride;
    if (qn < u.units) u.load(p, io, qn, nxt, nxt_sc);
    const int t = u.token(q), pc = u.piece(q), k = u.entry_k(q);
    const int row = row_of(t * K + k);
    if (write_map && pc == 0 && lane == 0) write_map_entry(p, io, t, k, row);
    if (row >= 0)
      store_row_piece(p, io, pre, pre_sc, ns ? io.x_scale + static_cast<size_t>(t) * ns : nullptr, row, pc, lane, u.scales);
    if (qn < u.units) {
      take(pre, nxt);
      take(pre_sc, nxt_sc);
    }
  }
}

// The split send half's message to self for (token t, slice sl): header and scales with slice 0
// (e, rk: the token's experts and ranks at e[base + k], rk[base + k]), then the payload slice.
__device__ __forceinline__ void stage_message(const CommParams& p, const DispatchIO& io, const int4 (&v)[kUnroll],
                                              const float (&sc)[kScaleRegs], int t, int sl, const int* e,
                                              const int* rk, int base, int lane) {
  const int K = p.topk, chunks = p.payload_bytes / 16, ns = p.num_scales, hdr_words = p.header_bytes / 4;
  uint8_t* msg = sym_at<uint8_t>(p, p.off_dispatch_recv) + static_cast<size_t>(t) * p.msg_bytes;
  if (sl == 0) {
    auto word = [&](int wd) { return header_word(wd, t, K, io.topk_weights, e, rk, base); };
    int32_t* h = reinterpret_cast<int32_t*>(msg);
    if (lane < hdr_words) h[lane] = word(lane);
    if (lane + 32 < hdr_words) h[lane + 32] = word(lane + 32);
    float* ms = reinterpret_cast<float*>(msg + p.header_bytes);
    const float* src_sc = io.x_scale + static_cast<size_t>(t) * ns;
#pragma unroll
    for (int i = 0; i < kScaleRegs; ++i)
      if (i * kWarpSize + lane < ns) ms[i * kWarpSize + lane] = sc[i];
    for (int x = kScaleRegs * kWarpSize + lane; x < ns; x += kWarpSize) ms[x] = __ldg(src_sc + x);
  }
  int4* pl = reinterpret_cast<int4*>(msg + p.payload_offset);
#pragma unroll
  for (int q = 0; q < kUnroll; ++q) {
    const int c = sl * kSliceChunks + q * kWarpSize + lane;
    if (c < chunks) pl[c] = v[q];
  }
}

// The send half's first steps on both paths: the stage stamps' start (stamp builds), and the call's
// m (block 0 reports a bad device m).
__device__ __forceinline__ int local_send_start(const CommParams& p, const DispatchIO& io) {
  return resolve_num_tokens(p, io.m, kPhaseDispatchSend, 0, blockIdx.x == 0);
}

// Fused dispatch of at most 32 entries (m * K <= 32: decode at 1-4 tokens for top-8): every warp
// loads all the indices itself and ranks them with one warp match (match_groups), so that no warp waits for
// shared memory or a block barrier before its store (the ranking measured 1.0 us of the 1-token
// dispatch with them). Same ranks and rows as local_dispatch_small: rank = entries of the same
// expert earlier in entry order; packed, the expert's first row is the sum of the aligned counts of
// the experts below it. Block 0 writes the counts after its stores.
template <int U>
__device__ void local_dispatch_tiny(const CommParams& p, const DispatchIO& io, int* smem, int m,
                                    const PieceUnits<U>& u) {
  const int E = p.num_experts, K = p.topk, n = m * K;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  // Lane i holds entry i's expert (block 0's warp 0 reports bad indices, once). In the SASS the
  // piece's loads wait for the index's range check; loading them first measured no faster (session
  // 14, call 2: 10.8 against 11.2 us at 1 token), so the order stays.
  const int e = lane < n ? read_expert(p, io.topk_idx, io.idx_type, lane, kPhaseDispatchSend, lane / K, 0,
                                       blockIdx.x == 0 && warp == 0)
                         : -1;
  int4 pre[U] = {};
  float pre_sc[kScaleRegs] = {};
  if (u.gw < u.units) u.load(p, io, u.gw, pre, pre_sc);
  const unsigned peers = match_groups(e, match_key_width(E), n + 1);  // warp_match.cuh
  const unsigned below = peers & ((1u << lane) - 1u);
  const int rk = __popc(below);
  const bool lead = e >= 0 && below == 0;  // the first entry of its expert
  int row = -1;
  if (p.packed) {
    const int align = p.packed_row_align;
    const int key = lead ? e : -1, acnt = lead ? (__popc(peers) + align - 1) / align * align : 0;
    int first = 0;
    for (int j = 0; j < n; ++j) {  // only the n lanes that hold an entry (n is warp-uniform)
      const int ej = __shfl_sync(0xffffffffu, key, j), cj = __shfl_sync(0xffffffffu, acnt, j);
      if (ej >= 0 && ej < e) first += cj;
    }
    if (e >= 0 && first + rk < p.packed_rows) row = first + rk;
  } else if (e >= 0 && rk < p.capacity) {
    row = e * p.capacity + rk;
  }
  if (blockIdx.x == 0 && warp == 0 && lane < n) write_map_entry(p, io, lane / K, lane % K, row);  // lane i: entry i
  scatter_units<U>(p, io, u, pre, pre_sc,
                   [&](int i) { return __shfl_sync(0xffffffffu, row, i); });  // every lane: q is warp-uniform
  if (blockIdx.x != 0) return;
  // The counts (and, packed, the offsets) from warp 0's groups, as local_counts_out writes them.
  const CountSmem cs = carve_counts(smem, E);
  for (int x = threadIdx.x; x < E; x += blockDim.x) cs.cnt[x] = 0;
  __syncthreads();
  if (warp == 0 && lead) cs.cnt[e] = __popc(peers);
  __syncthreads();
  local_counts_out(p, io, cs, true);
}

// The one-warp dispatch's bookkeeping on warps of its own (masked layout). Besides the
// payload units, the grid takes n scale units (entry i: its token's scales into its row), ceil(E / 32)
// count units (32 experts' counts each, from the match's groups through a warp-private array of 32
// ints) and one map unit (the n recv_map entries and, with weights_at_dispatch, the weights), each on
// a warp with no payload unit while they fit the grid, so that no warp's stores wait behind another
// output's.
template <int U>
__device__ void local_dispatch_tiny_roles(const CommParams& p, const DispatchIO& io, int m) {
  __shared__ int warp_cnt[kWarps][kWarpSize];
  const int E = p.num_experts, K = p.topk, n = m * K, ns = p.num_scales, cap = p.capacity;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const PieceUnits<U> u(p, m, false);  // the payload units, without scales
  const int nscale = ns > 0 ? n : 0, ncount = (E + kWarpSize - 1) / kWarpSize;
  const int total = u.units + nscale + ncount + 1;  // payload, scale, count units, the map unit
  if (u.gw >= total) return;  // warp-uniform; block 0's warp 0 (gw 0) always has a unit
  const int lt = small_div(lane, u.kmul), lk = lane - lt * K;  // lane i holds entry i = (lt, lk)
  const int e = lane < n ? read_expert(p, io.topk_idx, io.idx_type, lane, kPhaseDispatchSend, lt, 0,
                                       blockIdx.x == 0 && warp == 0)
                         : -1;
  int4 pre[U] = {};
  float pre_sc[kScaleRegs] = {};
  if (u.gw < u.units) u.load(p, io, u.gw, pre, pre_sc);
  // A warp whose first unit is a scale unit loads those scales with the indices, the map unit's
  // lanes their weights (weights_at_dispatch).
  const bool scale_first = u.gw >= u.units && u.gw < u.units + nscale;
  if (scale_first) load_token_scales(io, small_div(u.gw - u.units, u.kmul), ns, lane, pre_sc);
  const bool map_warp = u.gw == total - 1;
  const float wt = map_warp && p.weights_at_dispatch && lane < n ? __ldg(io.topk_weights + lane) : 0.f;
  const unsigned peers = match_groups(e, match_key_width(E), n + 1);  // warp_match.cuh
  const unsigned below = peers & ((1u << lane) - 1u);
  const int rk = __popc(below);
  const bool lead = e >= 0 && below == 0;  // the first entry of its expert
  const int row = e >= 0 && rk < cap ? e * cap + rk : -1;
  scatter_units<U>(p, io, u, pre, pre_sc, [&](int i) { return __shfl_sync(0xffffffffu, row, i); });
  // This warp's units after the payload ones: gw, gw + gstride, ... from the first that is >= units.
  int q = u.gw;
  while (q < u.units) q += u.gstride;
  for (; q < total; q += u.gstride) {  // q is warp-uniform
    const int r = q - u.units;
    if (r < nscale) {  // entry r's scales
      const int rt = small_div(r, u.kmul);
      if (!(scale_first && q == u.gw)) load_token_scales(io, rt, ns, lane, pre_sc);
      const int dst = __shfl_sync(0xffffffffu, row, r);
      if (dst >= 0) store_row_scales(p, io, ns, pre_sc, io.x_scale + static_cast<size_t>(rt) * ns, dst, lane);
    } else if (r < nscale + ncount) {  // experts 32 c .. 32 c + 31
      const int c = r - nscale;
      int* cnt = warp_cnt[warp];
      cnt[lane] = 0;
      __syncwarp();
      if (lead && e / kWarpSize == c) cnt[e % kWarpSize] = __popc(peers);
      __syncwarp();
      const int x = c * kWarpSize + lane;
      if (x < E) write_masked_count(p, io, x, cnt[lane], cap);
      __syncwarp();  // before a next count unit of this warp clears the array
    } else {  // the map: lane i, entry i
      // The map unit is the first unit of the warp whose gw is total - 1 (its weights loaded above).
      if (lane < n)
        write_map_entry(p, lt, lk, row, map_warp || !p.weights_at_dispatch ? wt : __ldg(io.topk_weights + lane));
    }
  }
}

// The one-warp dispatch (m * K <= 32): the role units with the masked layout, block 0's count with
// the packed one (its rows need every count first).
template <int U>
__device__ __forceinline__ void local_dispatch_one_warp(const CommParams& p, const DispatchIO& io, int* smem, int m,
                                                        const PieceUnits<U>& pu) {
  if (!p.packed) return local_dispatch_tiny_roles<U>(p, io, m);
  local_dispatch_tiny<U>(p, io, smem, m, pu);
}

// Rank of entry i (expert e >= 0; i and e warp-uniform) among the entries j < i of expert e, counted
// by the whole warp. Scans of kScanVecMin words or more read 16-byte vectors: lane l compares the
// index words of vectors l, l + 32, ..., kScanVecs of them loaded at a time (one round for i <= 1024
// int32 or 512 int64 entries), plus the few words before the first 16-byte boundary and after the
// last whole vector below i (one scalar load per lane, issued with the first round). Shorter ones
// read one word per lane, kScanBatch in flight. One reduction sums the lanes. The raw index words
// are compared with e, which matches exactly the entries read_expert maps to e (every other value,
// -1 and out-of-range ones included, differs). Each warp of a block reads the same few KB of
// indices, so after the first they come from L1.
constexpr int kScanVecs = 8;
// The split (one H200, 2026-12-01): vector scans everywhere lost 0.4-0.6 us per pair against scalar
// ones at V3 32 to 128 tokens; the split at 640 words tied all-scalar within 0.1 us and was 0.5 us
// faster at V3 192 tokens.
constexpr int kScanVecMin = 640, kScanBatch = 8;
// This lane's count of the words ix[j] == key, j < i. W: the index word type (long long for int64
// indices; unsigned for int32 and uint32, compared as the 32-bit pattern); ix is W-aligned.
template <typename W>
__device__ __forceinline__ int lane_matches_below(const W* ix, int i, W key, int lane) {
  if (kScanVecMin > 0 && i < kScanVecMin) {  // i is warp-uniform
    int mine = 0;
    for (int j0 = 0; j0 < i; j0 += kScanBatch * kWarpSize) {
      W v[kScanBatch];
#pragma unroll
      for (int b = 0; b < kScanBatch; ++b) {
        const int j = j0 + b * kWarpSize + lane;
        v[b] = j < i ? __ldg(ix + j) : static_cast<W>(-1);  // all ones: never a valid expert
      }
#pragma unroll
      for (int b = 0; b < kScanBatch; ++b) mine += v[b] == key;
    }
    return mine;
  }
  constexpr int kPer = 16 / static_cast<int>(sizeof(W));  // words per vector
  // head: words before the first 16-byte boundary (< kPer); then nv whole vectors; then the tail.
  const int mis = static_cast<int>(reinterpret_cast<uintptr_t>(ix) % 16) / static_cast<int>(sizeof(W));
  const ScanSplit sp = scan_split(i, mis, kPer);
  const int head = sp.head, nv = sp.nv, tail0 = sp.tail0;  // the tail: words tail0 .. i - 1
  // Lanes 0 .. kPer - 1 take the head's words, lanes kPer .. 2 kPer - 1 the tail's.
  const int js = lane < kPer ? lane : tail0 + lane - kPer;
  const bool have = lane < kPer ? lane < head : lane < 2 * kPer && js < i;
  int mine = have && __ldg(ix + js) == key;
  const uint4* v4 = reinterpret_cast<const uint4*>(ix + head);
  for (int v0 = 0; v0 < nv; v0 += kScanVecs * kWarpSize) {
    uint4 v[kScanVecs];
#pragma unroll
    for (int b = 0; b < kScanVecs; ++b) {
      const int j = v0 + b * kWarpSize + lane;
      v[b] = j < nv ? __ldg(v4 + j) : make_uint4(~0u, ~0u, ~0u, ~0u);  // all ones: never a valid expert
    }
#pragma unroll
    for (int b = 0; b < kScanVecs; ++b) {
      W w[kPer];
      memcpy(w, &v[b], 16);
#pragma unroll
      for (int x = 0; x < kPer; ++x) mine += w[x] == key;
    }
  }
  return mine;
}
__device__ __forceinline__ int scan_rank(const DispatchIO& io, int i, int e, int lane) {
  const int mine = io.idx_type == kIdxInt64
                       ? lane_matches_below(static_cast<const long long*>(io.topk_idx), i, static_cast<long long>(e), lane)
                       : lane_matches_below(static_cast<const unsigned*>(io.topk_idx), i, static_cast<unsigned>(e), lane);
  return __reduce_add_sync(0xffffffffu, mine);
}

// Fused dispatch of more than 32 entries whose scans stay short (local_scan_ranks): the warp of each
// unit finds its entry's rank itself (scan_rank), so that with the masked layout no warp waits for
// another, for shared memory or for a block barrier before its stores (the ranking in every block,
// barriers and per-warp prefix included, measured 3.2 us of the 128-token dispatch).
// Same ranks and rows as local_dispatch_small. The counts need no order, so they are shared-memory
// atomics: packed, in every block before the stores (each expert's first row is the aligned sum of
// the counts below it); masked, in the last block after its stores. The writer block also reports
// bad indices.
template <int U>
__device__ void local_dispatch_scan(const CommParams& p, const DispatchIO& io, int* smem, int m,
                                    const PieceUnits<U>& u) {
  const int E = p.num_experts, K = p.topk, n = m * K;
  const int lane = threadIdx.x % kWarpSize;
  const CountSmem cs = carve_counts(smem, E);
  int4 pre[U] = {};
  float pre_sc[kScaleRegs] = {};
  if (u.gw < u.units) u.load(p, io, u.gw, pre, pre_sc);
  // The block that writes the counts and reports bad indices: packed, block 0 (every block counts);
  // masked, the last block, which has the fewest units (q % gridDim.x), after its stores (measured:
  // 128 tokens 18.2 -> 17.8 us against block 0).
  const bool writer = blockIdx.x == (p.packed ? 0 : gridDim.x - 1);
  auto count_all = [&] {  // ends synced (local_counts_out's packed prefix, or the barrier here)
    for (int x = threadIdx.x; x < E; x += blockDim.x) cs.cnt[x] = 0;
    __syncthreads();
#pragma unroll 4
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const int e = read_expert(p, io.topk_idx, io.idx_type, i, kPhaseDispatchSend, i / K, 0, writer);
      if (e >= 0) atomicAdd(&cs.cnt[e], 1);
    }
    __syncthreads();
    local_counts_out(p, io, cs, writer);
  };
  if (p.packed) count_all();
  bool first_row = true;
  scatter_units<U>(
      p, io, u, pre, pre_sc,
      [&](int i) {
        const int e = read_expert(p, io.topk_idx, io.idx_type, i, kPhaseDispatchSend, i / K, 0, false);
        const int row = e >= 0 ? expert_row(p, e, scan_rank(io, i, e, lane), cs.first) : -1;
        if (first_row) {  // thread 0's first row
          first_row = false;
        }
        return row;
      },
      true);
  if (!p.packed && writer) count_all();
}

// Small objects (M < kLocalLargeTokens): dispatch and dispatch_send. Every block ranks all n = m * K
// entries the same way, so that any warp of the grid can place any (token, piece, k) and nothing
// passes between blocks. The rank of entry i within its expert is its position among the entries
// of that expert in entry order (deterministic: every block computes the same row):
//   1. warp w < R takes a contiguous range of 32-entry chunks and, chunk by chunk, gives each entry
//      its rank within the warp's range so far (match_groups groups the equal experts of a chunk);
//   2. one thread per expert turns the R per-warp counts into each warp's base and the total
//      (skipped with one ranking warp, m * K <= 64: its counts are the totals);
//   3. rank = base of its warp + rank within the warp, computed where a row is needed.
// fused: then one warp per (t, piece, k) stores that piece (U chunks per lane) into its row, so a decode
// call spreads its K rows over many warps and several SMs instead of one warp per slice storing all K;
// each warp loads its next unit before it stores the current one. Split: one warp per (t, slice)
// stages the message to self.
// kRankOnly: a fused call known on the host to take the block ranking (local_dispatch_path_kernel):
// the tiny and scan paths and the split half are compiled out.
template <int U, bool kRankOnly = false>
__device__ void local_dispatch_small(const CommParams& p, const DispatchIO& io, int* smem, bool fused_arg) {
  const bool fused = kRankOnly || fused_arg;
  const int E = p.num_experts, K = p.topk, nsd = p.dispatch_slices;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const SmallSmem sm = carve_small(smem, E, p.max_tokens * K);
  const int m = local_send_start(p, io);
  const int n = m * K;
  const PieceUnits<U> pu(p, m);  // fused; the split half's units (t, slice) take the same warps
  if constexpr (!kRankOnly) {
    const LocalSmallPath path = fused ? local_small_path(n, pu.units, pu.gstride) : LocalSmallPath::kRank;
    if (path == LocalSmallPath::kTiny) return local_dispatch_one_warp<U>(p, io, smem, m, pu);
    if (path == LocalSmallPath::kScan) return local_dispatch_scan<U>(p, io, smem, m, pu);
  }
  const int units = fused ? pu.units : m * nsd;
  const int gw = pu.gw, gstride = pu.gstride;

  // 1. Ranks within each ranking warp's range. Each ranking warp clears its own counters while its
  // first indices load, so that no block-wide step comes before the ranking.
  const int C = (n + kWarpSize - 1) / kWarpSize;
  const int R = min(local_rank_warps(E), max(1, (C + 1) / 2));  // at least two chunks per ranking warp
  const int c0 = warp < R ? C * warp / R : 0, c1 = warp < R ? C * (warp + 1) / R : 0;
  int* wc = sm.wcnt + static_cast<size_t>(warp) * E;  // this warp's counters (warp < R)
  int ex[kHistUnroll];
  auto load_batch = [&](int c) {
#pragma unroll
    for (int q = 0; q < kHistUnroll; ++q) {
      const int i = (c + q) * kWarpSize + lane;
      ex[q] = c + q < c1 && i < n ? read_expert(p, io.topk_idx, io.idx_type, i, kPhaseDispatchSend, i / K, 0,
                                                blockIdx.x == 0)
                                  : -1;
    }
  };
  if (warp < R) load_batch(c0);  // before the data loads below, which may be many
  // This warp's first unit, loaded now so that its latency hides behind the ranking: at decode sizes
  // it is the only unit a warp has.
  int4 pre[U] = {};
  int4 pre_split[kUnroll] = {};
  float pre_sc[kScaleRegs] = {};
  if (gw < units) {
    if (fused) {
      pu.load(p, io, gw, pre, pre_sc);
    } else {
      load_slice(p, io, gw / nsd, gw % nsd, lane, pre_split, pre_sc);
    }
  }

  if (warp < R) {
    const int ebits = match_key_width(E);  // a chunk's groups (warp_match.cuh): up to 33 distinct keys
    for (int x = lane; x < E; x += kWarpSize) wc[x] = 0;
    __syncwarp();
    for (int c = c0; c < c1; c += kHistUnroll) {
      if (c != c0) load_batch(c);
#pragma unroll
      for (int q = 0; q < kHistUnroll; ++q) {
        if (c + q >= c1) break;  // uniform over the warp
        const int e = ex[q], i = (c + q) * kWarpSize + lane;
        const unsigned peers = match_groups(e, ebits, kWarpSize + 1);
        const int before = __popc(peers & ((1u << lane) - 1u));
        const int lr = e >= 0 ? wc[e] + before : -1;
        __syncwarp();
        if (e >= 0 && before == 0) wc[e] += __popc(peers);  // the group's first lane
        __syncwarp();
        if (i < n) sm.ent[i] = e, sm.rk[i] = lr;
      }
    }
  }
  __syncthreads();
  // 2. Each ranking warp's base in each expert, and the totals (one ranking warp: its counts are the
  // totals and every base is 0).
  CountSmem cs = sm;
  if (R == 1) {
    cs.cnt = sm.wcnt;
  } else {
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      int v[kWarps];
#pragma unroll
      for (int w = 0; w < kWarps; ++w) v[w] = w < R ? sm.wcnt[w * E + e] : 0;
      int at = 0;
#pragma unroll
      for (int w = 0; w < kWarps; ++w)
        if (w < R) sm.wcnt[w * E + e] = at, at += v[w];
      sm.cnt[e] = at;
    }
    __syncthreads();
  }
  // Rank of entry i (expert e >= 0) within its expert: its warp's base + its rank within the warp.
  auto rank_of = [&](int i, int e) {
    if (R == 1) return sm.rk[i];
    const int w = ((i / kWarpSize + 1) * R - 1) / C;  // the warp whose range holds chunk i / 32
    return sm.wcnt[w * E + e] + sm.rk[i];
  };

  if (!fused) {
    if (blockIdx.x == 0) {  // the totals and m for dispatch_recv
      for (int e = threadIdx.x; e < E; e += blockDim.x) p.local_counts[e] = cs.cnt[e];
      if (threadIdx.x == 0) p.state->local_m = m;
    }
    // The header carries (expert, rank) per k: ranks in place first.
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const int e = sm.ent[i];
      if (e >= 0) sm.rk[i] = rank_of(i, e);
    }
    __syncthreads();
    for (int q = gw; q < units; q += gstride) {
      const int t = q / nsd, sl = q % nsd;
      int4 v[kUnroll];
      float sc[kScaleRegs];
      if (q == gw) {
        take(v, pre_split), take(sc, pre_sc);
      } else {
        load_slice(p, io, t, sl, lane, v, sc);
      }
      stage_message(p, io, v, sc, t, sl, sm.ent, sm.rk, t * K, lane);
    }
    return;
  }
  if (p.packed || blockIdx.x == 0) local_counts_out(p, io, cs, blockIdx.x == 0);  // packed: every block, ends synced
  auto row_of = [&](int i) {
    const int e = sm.ent[i];
    return e >= 0 ? expert_row(p, e, rank_of(i, e), sm.first) : -1;
  };
  // recv_map and the weights: one thread per entry; then one warp per (t, piece, k).
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    write_map_entry(p, io, i / K, i % K, row_of(i));
  scatter_units<U>(p, io, pu, pre, pre_sc, row_of);
}

// Large objects (M >= kLocalLargeTokens): dispatch and dispatch_send. Each block counts and ranks
// its own chunk of tokens and takes its base in each expert from the global counters. fused: scatter
// into expert_x; else stage the messages to self.
__device__ void local_dispatch_large(const CommParams& p, const DispatchIO& io, int* smem, bool fused) {
  const int E = p.num_experts, K = p.topk, nsd = p.dispatch_slices, ns = p.num_scales;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const LocalSmem sm = carve(smem, E, K);
  const int m = local_send_start(p, io);
  const int u0 = chunk_begin(m, blockIdx.x, gridDim.x), u1 = chunk_begin(m, blockIdx.x + 1, gridDim.x);

  // The first slice this warp copies (fused calls), loaded now so that its latency hides behind the
  // histogram: at decode sizes it is the only slice a warp has.
  int4 pre[kUnroll] = {};
  float pre_sc[kScaleRegs] = {};
  const int nr0 = min(kLocalRoundTokens, u1 - u0);
  const bool prefetched = fused && warp < nr0 * nsd;
  if (prefetched) load_slice(p, io, u0 + warp / nsd, warp % nsd, lane, pre, pre_sc);

  // Histogram of this block's chunk, lanes in groups of G >= K (a power of two): lane k of a group
  // reads entry k of one token, a warp reads 32 / G tokens with one coalesced load, kHistUnroll loads
  // in flight per lane. The first batch is loaded before the counters are cleared, so that its
  // latency hides behind that.
  {
    const int h0 = u0, h1 = u1;
    const bool report = true;
    const int G = K <= 1 ? 1 : K <= 2 ? 2 : K <= 4 ? 4 : K <= 8 ? 8 : 16;
    const int per_warp = kWarpSize / G, k = lane % G, sub = lane / G;
    const int step = kWarps * per_warp;
    int ex[kHistUnroll];
    auto load_batch = [&](int base) {
#pragma unroll
      for (int q = 0; q < kHistUnroll; ++q) {
        const int u = base + q * step + sub;
        ex[q] = u < h1 && k < K ? read_expert(p, io.topk_idx, io.idx_type, static_cast<int64_t>(u) * K + k,
                                              kPhaseDispatchSend, u, 0, report)
                                : -1;
      }
    };
    const int base0 = h0 + warp * per_warp;
    load_batch(base0);
    for (int x = threadIdx.x; x < E; x += blockDim.x) sm.cnt[x] = 0, sm.run[x] = 0;
    __syncthreads();
    for (int base = base0; base < h1; base += kHistUnroll * step) {
      if (base != base0) load_batch(base);
#pragma unroll
      for (int q = 0; q < kHistUnroll; ++q) {
        const int e = ex[q], u = base + q * step + sub;
        if (u >= u0 && u < u0 + nr0 && k < K) sm.tok_e[(u - u0) * K + k] = e;  // phase A of round 0 reads it
        if (e < 0) continue;
        atomicAdd(&sm.cnt[e], 1);
      }
    }
  }
  __syncthreads();

  bool writer = blockIdx.x == 0;  // the block that writes the counts (and, split, the totals)
  {
    // This block's base in each expert: one global atomic per (block, expert) with entries. The
    // counters are zeroed by the combine that ends the layer.
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      const int c = sm.cnt[e];
      sm.run[e] = c ? atomicAdd(p.local_counts + e, c) : 0;
    }
    __syncthreads();
    if (fused) {
      // bar.sync + the cumulative acq_rel add publish this block's atomics; the last block to
      // arrive (masked) or every block after all arrived (packed) reads the totals.
      const uint64_t G = gridDim.x;
      if (threadIdx.x == 0) {
        const unsigned long long old = atomic_add_acq_rel_gpu_u64(&p.state->local_arrive, 1);
        const uint64_t target = (old / G + 1) * G;
        sm.last[0] = old + 1 == target;
        if (p.packed)
          wait_flag(p, &p.state->local_arrive, target, Cmp::kGe, kPhaseDispatchSend, kWaitBlockHistogram, p.rank, -1,
                    old / G + 1);
      }
      __syncthreads();
      writer = p.packed ? blockIdx.x == 0 : sm.last[0] != 0;
      if (p.packed || writer)
        for (int e = threadIdx.x; e < E; e += blockDim.x) sm.cnt[e] = __ldcg(p.local_counts + e);
      __syncthreads();
    }
  }

  if (fused) {
    if (p.packed || writer) local_counts_out(p, io, sm, writer);
  } else if (blockIdx.x == 0 && threadIdx.x == 0) {  // m for dispatch_recv (the counters hold the totals)
    p.state->local_m = m;
  }

  for (int r0 = u0; r0 < u1; r0 += kLocalRoundTokens) {
    const int nr = min(kLocalRoundTokens, u1 - r0);
    // Phase A: one warp per token takes its ranks (and, fused, its rows).
    for (int ui = warp; ui < nr; ui += kWarps) {
      const int t = r0 + ui;
      const int e = lane >= K ? -1
                    : r0 == u0 ? sm.tok_e[ui * K + lane]
                               : read_expert(p, io.topk_idx, io.idx_type, static_cast<int64_t>(t) * K + lane,
                                             kPhaseDispatchSend, t, 0, false);
      const int rk = e >= 0 ? atomicAdd(&sm.run[e], 1) : 0;
      if (lane < K) {
        sm.tok_e[ui * K + lane] = e;
        if (fused) {
          const int row = e >= 0 ? expert_row(p, e, rk, sm.first) : -1;
          sm.tok_rk[ui * K + lane] = row;
          write_map_entry(p, io, t, lane, row);
        } else {
          sm.tok_rk[ui * K + lane] = rk;
        }
      }
    }
    __syncthreads();
    // Phase B: one warp per (token, slice).
    for (int w = warp; w < nr * nsd; w += kWarps) {
      const int ui = w / nsd, sl = w % nsd, t = r0 + ui;
      int4 v[kUnroll];
      float sc[kScaleRegs];
      if (prefetched && r0 == u0 && w == warp) {
        take(v, pre), take(sc, pre_sc);
      } else {
        load_slice(p, io, t, sl, lane, v, sc);
      }
      if (fused) {
        store_to_rows(p, io, v, sc, ns ? io.x_scale + static_cast<size_t>(t) * ns : nullptr,
                      lane < K ? sm.tok_rk[ui * K + lane] : -1, sl, lane);
      } else {
        stage_message(p, io, v, sc, t, sl, sm.tok_e, sm.tok_rk, ui * K, lane);
      }
    }
    __syncthreads();
  }
}

// dispatch_recv after a dispatch_send: the totals from local_counts, then one warp per (staged
// token, slice) places it.
__device__ void local_dispatch_recv(const CommParams& p, const DispatchIO& io, int* smem, bool interleave) {
  const int E = p.num_experts, K = p.topk, nsd = p.dispatch_slices, ns = p.num_scales;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int chunks = p.payload_bytes / 16;
  const CountSmem sm = carve_counts(smem, E);
  const int m = *reinterpret_cast<const volatile int32_t*>(&p.state->local_m);
  for (int e = threadIdx.x; e < E; e += blockDim.x) sm.cnt[e] = p.local_counts[e];
  __syncthreads();
  if (p.packed || blockIdx.x == 0) local_counts_out(p, io, sm, blockIdx.x == 0);
  const uint8_t* stage = sym_at<uint8_t>(p, p.off_dispatch_recv);
  const int gw = interleave ? warp * gridDim.x + blockIdx.x : blockIdx.x * kWarps + warp;  // as the send half
  for (int q = gw; q < m * nsd; q += gridDim.x * kWarps) {
    const int t = q / nsd, sl = q % nsd;
    const uint8_t* msg = stage + static_cast<size_t>(t) * p.msg_bytes;
    const int4* pl = reinterpret_cast<const int4*>(msg + p.payload_offset);
    int4 v[kUnroll];
#pragma unroll
    for (int qq = 0; qq < kUnroll; ++qq) {
      const int c = sl * kSliceChunks + qq * kWarpSize + lane;
      if (c < chunks) v[qq] = __ldcg(pl + c);
    }
    float sc[kScaleRegs];
    const float* ms = reinterpret_cast<const float*>(msg + p.header_bytes);
#pragma unroll
    for (int i = 0; i < kScaleRegs; ++i)
      sc[i] = sl == 0 && i * kWarpSize + lane < ns ? __ldcg(ms + i * kWarpSize + lane) : 0.f;
    const int32_t* hdr = reinterpret_cast<const int32_t*>(msg);
    int row = -1;
    if (lane < K) {
      const int e = __ldcg(hdr + 4 + 2 * lane), rk = __ldcg(hdr + 5 + 2 * lane);
      row = e >= 0 ? expert_row(p, e, rk, sm.first) : -1;
    }
    if (sl == 0 && lane < K) {
      int32_t* map = p.recv_map + static_cast<size_t>(t) * (K + 1);
      map[1 + lane] = row;
      if (lane == 0) map[0] = t;
      if (p.weights_at_dispatch)
        sym_at<uint64_t>(p, p.off_weights_recv)[static_cast<size_t>(t) * K + lane] =
            static_cast<uint32_t>(__ldcg(hdr + 4 + 2 * K + lane));
    }
    store_to_rows(p, io, v, sc, ms, row, sl, lane);
  }
}

// U: the small path's piece (kLocalSmallPieceChunks or kLocalLargePieceChunks; kLocalWidePieceChunks
// only in local_dispatch_path_kernel's scan path); the large path has none.
template <bool kLarge, int U>
__global__ void __launch_bounds__(kThreads, 1)
    local_dispatch_kernel(const __grid_constant__ CommParams p, const __grid_constant__ DispatchIO io, bool do_send,
                          bool do_recv) {
  extern __shared__ int smem[];
  touch_param_lines(p, io);  // ptx.cuh
  wait_previous_kernel();
  if (do_send) {
    if constexpr (kLarge) {
      local_dispatch_large(p, io, smem, do_recv);
    } else {
      local_dispatch_small<U>(p, io, smem, do_recv);
    }
  } else {
    local_dispatch_recv(p, io, smem, !kLarge);
  }
}

// Fused small dispatches of a host-given m, one path per kernel (the host picks it with
// local_small_path, as local_dispatch_small does on the device): the one-warp ranking (kTiny,
// m * K <= 32), the per-warp scans (kScan) or the block ranking (kRank). The kernel then holds only
// that path's instructions, not the other paths and the split halves as well.
template <int U, LocalSmallPath kPath>
__global__ void __launch_bounds__(kThreads, 1)
    local_dispatch_path_kernel(const __grid_constant__ CommParams p, const __grid_constant__ DispatchIO io) {
  extern __shared__ int smem[];
  touch_param_lines(p, io);  // ptx.cuh
  wait_previous_kernel();
  if constexpr (kPath == LocalSmallPath::kRank) {
    local_dispatch_small<U, true>(p, io, smem, true);
  } else {
    const int m = local_send_start(p, io);
    const PieceUnits<U> pu(p, m);
    if constexpr (kPath == LocalSmallPath::kTiny) {
      local_dispatch_one_warp<U>(p, io, smem, m, pu);
    } else {
      local_dispatch_scan<U>(p, io, smem, m, pu);
    }
  }
}

// acc[qq] += sum over k < K of w_k * y[row_k][8 c[qq] .. 8 c[qq] + 7] (lane k holds row_k, -1: none,
// and w_k): kB rows at a time, the loads of all their kN chunks issued before any is used.
// kZero: the raw rows start as zeros, so that a predicated load can write its own registers (else,
// short of registers, the compiler loaded into one scratch and copied out, waiting for each load
// before issuing the next: measured in the SASS of the two-chunk one-wave combine).
template <int kB, int kN, typename Tin, bool kZero = false>
__device__ __forceinline__ void sum_rows(const Tin* y, int H, int K, int row, float wk, const int* c, int chunks,
                                         float (*acc)[8]) {
#pragma unroll 1
  for (int kb = 0; kb < K; kb += kB) {
    RawRow<Tin> r[kB][kN];
    if constexpr (kZero) {
#pragma unroll
      for (int j = 0; j < kB; ++j)
#pragma unroll
        for (int qq = 0; qq < kN; ++qq) r[j][qq].zero();
    }
    float w[kB];
    bool have[kB];
#pragma unroll
    for (int j = 0; j < kB; ++j) {
      const int rj = __shfl_sync(0xffffffffu, row, (kb + j) & (kWarpSize - 1));
      w[j] = __shfl_sync(0xffffffffu, wk, (kb + j) & (kWarpSize - 1));
      have[j] = kb + j < K && rj >= 0;
#pragma unroll
      for (int qq = 0; qq < kN; ++qq)
        if (have[j] && c[qq] < chunks) r[j][qq].load(y + static_cast<size_t>(rj) * H + static_cast<size_t>(c[qq]) * 8);
    }
#pragma unroll
    for (int j = 0; j < kB; ++j)
#pragma unroll
      for (int qq = 0; qq < kN; ++qq) {
        if (!have[j] || c[qq] >= chunks) continue;
        float f[8];
        r[j][qq].unpack(f);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[qq][i] = fmaf(w[j], f[i], acc[qq][i]);
      }
  }
}

// Combine: one warp per (token, kChunks x 256 elements), out (or the staging row) = sum_k w * y.
template <typename Tin, typename Tout, int kChunks, bool kOneWave = false>
__device__ void local_combine_sum(const CommParams& p, const CombineIO& io, int m, Tout* out) {
  const int K = p.topk, H = p.hidden, chunks = H / 8;
  const int per_unit = kWarpSize * kChunks, units = local_combine_units(H, kChunks);
  const int lane = threadIdx.x % kWarpSize;
  const int rows = local_rows(p);
  const Tin* y = static_cast<const Tin*>(io.expert_y);
  const uint64_t* wstore = sym_at<uint64_t>(p, p.off_weights_recv);
  // Small objects (kChunks == 1): unit q on block q % gridDim.x, so that a decode call's rows are
  // read by as many SMs as there are units, not by the first blocks' 16 warps each (the bytes one
  // SM can pull from L2 set the time there). Large objects keep contiguous units per block.
  const int warp = threadIdx.x / kWarpSize;
  // One-wave kernels spread their units the same way.
  constexpr bool kSpread = kChunks == 1 || kOneWave;
  const int q0 = kSpread ? warp * gridDim.x + blockIdx.x : blockIdx.x * kWarps + warp;
  // Small objects: when one unit per warp would take more than one wave of the grid, a warp sums g
  // consecutive units of one token, one after the other, so that it loads the token's map row once
  // instead of once per wave (each map load is a round trip before any row can be read).
  const int nwarps = gridDim.x * kWarps;
  const int g = !kOneWave && kChunks == 1 && m * units > nwarps ? min(units, (m * units + nwarps - 1) / nwarps) : 1;
  const int groups = (units + g - 1) / g;
  for (int q = q0; q < m * groups; q += nwarps) {
    // One wave: g = 1, groups = units = local_combine_units(H, kChunks), whose multiplier the host set.
    int t;
    if constexpr (kOneWave && kChunks <= 2) {
      t = small_div(q, p.wave_units_mul[kChunks - 1]);
    } else {
      t = q / groups;
    }
    const int cu0 = (q - t * groups) * g;
    int row = -1;
    float wk = 0.f;
    if (lane < K) {  // the map and the weight load together
      row = p.recv_map[static_cast<size_t>(t) * (K + 1) + 1 + lane];
      wk = p.weights_at_dispatch ? __uint_as_float(static_cast<uint32_t>(wstore[static_cast<size_t>(t) * K + lane]))
                                 : io.topk_weights[static_cast<size_t>(t) * K + lane];
      if (row >= rows) row = -1;  // never read past expert_y, whatever the map holds
    }
    if constexpr (kChunks == 1) {
#pragma unroll 1
      for (int cu = cu0; cu < min(units, cu0 + g); ++cu) {
        const int c = cu * kWarpSize + lane;
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        sum_rows<kRowBatch, 1>(y, H, K, row, wk, &c, chunks, &acc);
        if (c < chunks) st16(out + static_cast<size_t>(t) * H + static_cast<size_t>(c) * 8, Vec8<Tout>::pack(acc));
      }
    } else {
      int c[kChunks];
#pragma unroll
      for (int qq = 0; qq < kChunks; ++qq) c[qq] = cu0 * per_unit + qq * kWarpSize + lane;
      float acc[kChunks][8];
#pragma unroll
      for (int qq = 0; qq < kChunks; ++qq)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[qq][i] = 0.f;
      // One wave (kChunks == 2): all K rows of both chunks in flight at once, as kChunks == 1 has one's.
      sum_rows<kOneWave ? kRowBatch : kLargeRowBatch, kChunks, Tin, kOneWave>(y, H, K, row, wk, c, chunks, acc);
#pragma unroll
      for (int qq = 0; qq < kChunks; ++qq)
        if (c[qq] < chunks) st16(out + static_cast<size_t>(t) * H + static_cast<size_t>(c[qq]) * 8, Vec8<Tout>::pack(acc[qq]));
    }
  }
}

// combine_recv after a combine_send: the staged sums to out.
template <typename Tout>
__device__ void local_combine_copy(const CommParams& p, const CombineIO& io, int m) {
  const int chunks = p.hidden / 8;
  const int4* stage = sym_at<const int4>(p, p.off_combine_recv);
  int4* out = static_cast<int4*>(io.out);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < static_cast<int64_t>(m) * chunks;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __ldcg(stage + i);
}

template <typename Tin, typename Tout, bool kLarge>
__global__ void __launch_bounds__(kThreads, 1)
    local_combine_kernel(const __grid_constant__ CommParams p, const __grid_constant__ CombineIO io, bool do_send,
                         bool do_recv) {
  touch_param_lines(p, io);  // ptx.cuh
  wait_previous_kernel();
  // Reported by dispatch only: one bad m is one error, not one per kernel of the layer.
  const int m = resolve_num_tokens(p, io.m, do_send ? kPhaseCombineSend : kPhaseCombineRecv, 0, false);
  if (do_send) {
    // The large dispatch's per-expert counters start the next layer at zero (nothing reads them
    // after dispatch).
    if (kLarge && blockIdx.x == 0)
      for (int e = threadIdx.x; e < p.num_experts; e += blockDim.x) p.local_counts[e] = 0;
    Tout* out = do_recv ? static_cast<Tout*>(io.out) : sym_at<Tout>(p, p.off_combine_recv);
    local_combine_sum<Tin, Tout, kLarge ? 4 : 1>(p, io, m, out);
  } else {
    local_combine_copy<Tout>(p, io, m);
  }
}

// Fused small combines of a host-given m whose units fit one wave of the grid (one unit per warp):
// the kernel holds only that loop (see local_dispatch_path_kernel). kChunks 2: units of 512
// elements, for calls whose 256-element units would take two waves (V3 at 128 tokens: 3584 units
// against 2112 warps; 1792 of 512), so that every warp loads all its rows in one round instead of
// two rounds one after the other.
template <typename Tin, typename Tout, int kChunks>
__global__ void __launch_bounds__(kThreads, 1)
    local_combine_wave_kernel(const __grid_constant__ CommParams p, const __grid_constant__ CombineIO io) {
  touch_param_lines(p, io);  // ptx.cuh
  wait_previous_kernel();
  // A large object's dispatch of this layer may have taken the large path (device m) and counted
  // into the per-expert counters, which the layer's combine zeroes (local_combine_kernel).
  if (local_large(p) && blockIdx.x == 0)
    for (int e = threadIdx.x; e < p.num_experts; e += blockDim.x) p.local_counts[e] = 0;
  local_combine_sum<Tin, Tout, kChunks, true>(p, io, io.m.host_m, static_cast<Tout*>(io.out));
}

template <typename Tin, typename Tout>
cudaError_t launch_local_typed(const CommParams& p, const CombineIO& io, int chunks, bool s, bool r,
                               const LaunchShape& sh, cudaStream_t st) {
  // Two-byte inputs only: the fp32 one spills (16 bytes) where the general kernel spills 4.
  if constexpr (sizeof(Tin) == 2) {
    if (s && r && io.m.dev_m == nullptr) {
      if (chunks == 1) return launch_after_previous(local_combine_wave_kernel<Tin, Tout, 1>, sh, st, p, io);
      if (chunks == 2) return launch_after_previous(local_combine_wave_kernel<Tin, Tout, 2>, sh, st, p, io);
    }
  }
  auto kernel = local_large(p) ? local_combine_kernel<Tin, Tout, true> : local_combine_kernel<Tin, Tout, false>;
  return launch_after_previous(kernel, sh, st, p, io, s, r);
}

template <typename Tout>
cudaError_t launch_local_out(const CommParams& p, const CombineIO& io, int chunks, DType in, bool s, bool r,
                             const LaunchShape& sh, cudaStream_t st) {
  switch (in) {
    case DType::kBF16: return launch_local_typed<__nv_bfloat16, Tout>(p, io, chunks, s, r, sh, st);
    case DType::kFP16: return launch_local_typed<__half, Tout>(p, io, chunks, s, r, sh, st);
    case DType::kFP32: return launch_local_typed<float, Tout>(p, io, chunks, s, r, sh, st);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_local_dispatch(const CommParams& p, const DispatchIO& io, const LocalFusedDispatch& f, bool do_send,
                                  bool do_recv, const LaunchShape& shape, cudaStream_t stream) {
  if (do_send && do_recv && io.m.dev_m == nullptr) {
    if (f.one_path) {
      using LP = LocalSmallPath;
      auto pick = [&f](auto tiny, auto scan, auto rank) {
        return f.path == LP::kTiny ? tiny : f.path == LP::kScan ? scan : rank;
      };
      constexpr int kS = kLocalSmallPieceChunks, kL = kLocalLargePieceChunks, kW = kLocalWidePieceChunks;
      auto kernel = f.piece_chunks == kW   ? local_dispatch_path_kernel<kW, LP::kScan>  // scan only
                    : f.piece_chunks == kS ? pick(local_dispatch_path_kernel<kS, LP::kTiny>,
                                                  local_dispatch_path_kernel<kS, LP::kScan>,
                                                  local_dispatch_path_kernel<kS, LP::kRank>)
                                           : pick(local_dispatch_path_kernel<kL, LP::kTiny>,
                                                  local_dispatch_path_kernel<kL, LP::kScan>,
                                                  local_dispatch_path_kernel<kL, LP::kRank>);
      return launch_after_previous(kernel, shape, stream, p, io);
    }
  }
  auto kernel = local_large(p)                                    ? local_dispatch_kernel<true, kLocalLargePieceChunks>
                : p.local_piece_chunks == kLocalSmallPieceChunks ? local_dispatch_kernel<false, kLocalSmallPieceChunks>
                                                            : local_dispatch_kernel<false, kLocalLargePieceChunks>;
  return launch_after_previous(kernel, shape, stream, p, io, do_send, do_recv);
}

cudaError_t launch_local_combine(const CommParams& p, const CombineIO& io, int wave_chunks, DType in, DType out,
                                 bool do_send, bool do_recv, const LaunchShape& shape, cudaStream_t stream) {
  switch (out) {
    case DType::kBF16: return launch_local_out<__nv_bfloat16>(p, io, wave_chunks, in, do_send, do_recv, shape, stream);
    case DType::kFP16: return launch_local_out<__half>(p, io, wave_chunks, in, do_send, do_recv, shape, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace epkit::kernels
