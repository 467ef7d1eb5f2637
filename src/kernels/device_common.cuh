// Device-side building blocks shared by the dispatch and combine kernels: system-scope flag
// accesses, bounded waits that record an error instead of hanging, and input decoding.
#pragma once

#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>

#include <climits>
#include <cstdint>
#include <utility>

#include "epkit/layout.hpp"  // kMaxTokensPerRank, kMaxGridBlocks, kRecvMapHead
#include "kernels/kernel_params.hpp"
#include "kernels/warp_match.cuh"  // match_key_bits

namespace epkit::kernels {

constexpr int kWarpSize = 32;
constexpr int kThreads = kThreadsPerBlock;
constexpr int kWarps = kWarpsPerBlock;

__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// Release fence at system scope (the fence half of st.release.sys; lighter than __threadfence_system's fence.sc).
__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
__device__ __forceinline__ void st_relaxed_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t ld_relaxed_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_sys_add(uint64_t* p, uint64_t v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// GPU scope: for a reader on this GPU (our own counters), where the system-scope fence is not needed.
__device__ __forceinline__ void red_release_gpu_add(uint64_t* p, uint64_t v) {
  asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// 16-byte load that bypasses L1: the data may have been written by a peer during this kernel.
__device__ __forceinline__ int4 ld_cg16(const void* p) { return __ldcg(reinterpret_cast<const int4*>(p)); }
__device__ __forceinline__ void st16(void* p, int4 v) { *reinterpret_cast<int4*>(p) = v; }

// Programmatic dependent launch (every kernel here is launched with launch_after_previous): the
// kernel may be scheduled before the previous kernel in the stream has finished, so its first
// statement waits for that kernel's completion and memory (griddepcontrol.wait; a no-op when not
// launched that way), and it then lets the next such kernel be scheduled. Nothing is read or
// written before the wait, so the only overlap is the launch and block scheduling.
__device__ __forceinline__ void wait_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // older GPUs serialise the launches anyway
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Every 64-byte line of a kernel's parameter objects into the SM's constant cache at once. A
// kernel's first read of a parameter line misses on every SM (the launch probe, bench/results/ab-w1-s15/), and the
// decode path reads its parameters where it needs them, so those misses can come one after the
// other on the chain. Every thread calls it before wait_previous_kernel (parameters are valid at
// launch, so with a programmatic launch the fills overlap the previous kernel); the block's last
// warp loads, and waits for the loads at once, the others find the lines filled or on their way. The W = 1 kernels
// only (local.cu): there it measured -0.1 to -0.3 us per pair in the graph replay, the same in
// every round, and nothing event-timed (again in session 24, call 4); in the general kernels +0.1 to
// +0.3 event-timed (session 23, call 2; docs/perf-notes/2026-12-04-combine-rows-s23.md), and again
// with the counter-free combine end (session 24, call 6: dispatch +0.1 to +0.3). The xor of the words
// means nothing: its store to a shared word nobody reads keeps the loads (an empty asm did not, and
// behind a branch that is never taken the compiler moved them under the branch).
template <typename T>
__device__ __forceinline__ uint32_t param_lines_xor(const T& a) {
  static_assert(sizeof(T) % 4 == 0, "parameter objects are whole words");
  const uint32_t* w = reinterpret_cast<const uint32_t*>(&a);
  uint32_t x = w[sizeof(T) / 4 - 1];  // the last line, wherever the stride below ends
#pragma unroll
  for (size_t i = 0; i < sizeof(T) / 4; i += 16) x ^= w[i];
  return x;
}
template <typename IO>
__device__ __forceinline__ void touch_param_lines(const CommParams& p, const IO& io, int warp = kWarps - 1) {
  __shared__ uint32_t sink;
  if (threadIdx.x / kWarpSize != warp) return;
  const uint32_t x = param_lines_xor(p) ^ param_lines_xor(io);
  if (threadIdx.x % kWarpSize == 0) *static_cast<volatile uint32_t*>(&sink) = x;
}
// The general decode kernels touch them on a warp that has no work at decode (dispatch: warp 14,
// past the sending block's slice, send_slot and count warps for up to 288 experts; combine: warp
// 13, between the partial groups and the weights' warp). Sessions 23-24 measured the touch on the
// last warp, which in these kernels has work (the sending block's count words, the combine's layer
// tail): +0.1 to +0.3 us. On the idle warps, session 40 measured graph 0 to -0.3 us per pair and
// stage stamps 0.05-0.24 us earlier at the combine's exit in all eight cases (V3 and V2-Lite, 1 and
// 4 tokens, m on the host and on the device); event-timed within the rounds' spread.
// The touch reads the words by LDC (lane 0 stores the xor), the kernels' own reads go through the
// immediate-constant cache (IMC), which a probe found to be per SM sub-partition, about 2-4 KB, with
// a miss costing about 60 cycles (30 ns) more than a hit (session 44, one H100,
// bench/results/ab-w1-s42/call1/const_probe.txt). Touching by ULDC, on one warp per sub-partition,
// or pinning the combine token side's parameters together changed nothing beyond the spread at 1-4
// tokens and cost the combine 0.3-0.5 us at 4 and 128 tokens (same call; the switches were removed,
// docs/perf-notes/2026-12-07-constant-cache-s42.md).
constexpr int kDispatchTouchWarp = kWarps - 2;
constexpr int kCombineTouchWarp = kWarps - 3;

// kernel<<<shape.blocks, kThreads, shape.smem_bytes, stream>>>(args...), allowed to be scheduled
// before the previous kernel in the stream ends (programmatic stream serialization); the kernel
// must start with wait_previous_kernel(). Capturable: graphs keep it as a programmatic edge. More
// than 48 KB of dynamic shared memory is opted into here, for every kernel.
template <typename... Params, typename... Args>
cudaError_t launch_after_previous(void (*kernel)(Params...), const LaunchShape& shape, cudaStream_t stream,
                                  Args&&... args) {
  if (shape.smem_bytes > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(shape.smem_bytes));
    if (e != cudaSuccess) return e;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(shape.blocks);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = shape.smem_bytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// bar.sync on a named barrier (1..15; 0 is __syncthreads) for `threads` threads, whole warps.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// The abort flag's word. A look whose answer is needed only at a later barrier keeps the word and
// tests it there (word != 0): tested where it is loaded (is_aborted), the test sits in the load's
// basic block and the thread waits out the round trip right there (SASS, CUDA 13.0).
__device__ __forceinline__ int32_t abort_word(const CommParams& p) {
  return *reinterpret_cast<volatile int32_t*>(&p.state->aborted);
}
__device__ __forceinline__ bool is_aborted(const CommParams& p) { return abort_word(p) != 0; }

// An error's code, phase, wait and peer in one word (peer + 1 in the high half: world_size <= 1024).
// The out-of-line error paths below take it so that their arguments fit the twelve parameter
// registers of the call ABI (R4-R15): with ten separate arguments record_error's seq went on the
// stack, which gave every small general kernel an 8-byte frame, and a frame's setup (the stack
// pointer's constant load, then its adjustment) was the instruction every warp stalled on first
// (session 28's ncu profile: 9.6% of the 1-token dispatch's warp samples).
static_assert(kErrPackedRows < 16 && kPhaseCombineRecv < 16 && kWaitBlockHistogram < 256,
              "err_where's fields: code and phase four bits, wait eight");
__device__ __forceinline__ uint32_t err_where(int32_t code, int32_t phase, int32_t what, int32_t peer) {
  return static_cast<uint32_t>(code) | static_cast<uint32_t>(phase) << 4 | static_cast<uint32_t>(what) << 8 |
         static_cast<uint32_t>(peer + 1) << 16;
}

// Records the first error of this object (later ones are dropped: the first is the cause).
// Out of line, like every cold path below: inlined, each call site put ~40 instructions (a CAS and
// two system fences) into the middle of the hot loops, and the fetches of the hot code that jumped
// over them dominated the small-batch kernels (instruction-cache misses, not data).
static __device__ __noinline__ void record_error(const CommParams& p, uint32_t where, int32_t expert, int32_t token,
                                                 int64_t value, int64_t limit, uint64_t seq) {
  if (atomicCAS(&p.state->error_lock, 0, 1) != 0) return;
  ErrorRecord* e = p.err;
  e->phase = static_cast<int32_t>(where >> 4 & 0xf);
  e->what = static_cast<int32_t>(where >> 8 & 0xff);
  e->rank = p.rank;
  e->peer = static_cast<int32_t>(where >> 16) - 1;
  e->expert = expert;
  e->token = token;
  e->value = value;
  e->limit = limit;
  e->seq = seq;
  __threadfence_system();
  e->code = static_cast<int32_t>(where & 0xf);
  __threadfence_system();
}

// NVSHMEM's warp put-with-signal and signal op, out of line: they are the portable path (peers
// without P2P), and their inlined bodies are large.
static __device__ __noinline__ void put_signal_warp(void* dst, const void* src, size_t bytes, uint64_t* sig,
                                                    uint64_t value, int op, int pe) {
  nvshmemx_putmem_signal_nbi_warp(dst, src, bytes, sig, value, op, pe);
}
static __device__ __noinline__ void signal_remote(uint64_t* sig, uint64_t value, int op, int pe) {
  nvshmemx_signal_op(sig, value, op, pe);
}

// kTag: the word's high 32 bits equal target (a tagged word, see wait_tagged).
enum class Cmp { kEq, kGe, kTag };

__device__ __forceinline__ bool flag_passes(uint64_t v, uint64_t target, Cmp cmp) {
  return cmp == Cmp::kEq ? v == target : cmp == Cmp::kGe ? v >= target : (v >> 32) == target;
}

// The spinning part of wait_flag, out of line (see record_error). Returns the last value it loaded:
// one that passes once the flag is there, one that does not on timeout or abort. A tagged word's
// caller takes its value from it, with no second load after the spin (that load was one more round
// trip on every wait the first load missed: a decode consumer's usual case).
// where: err_where(kErrTimeout, phase, what, peer).
static __device__ __noinline__ uint64_t wait_flag_slow(const CommParams& p, const uint64_t* flag, uint64_t target,
                                                       Cmp cmp, uint32_t where, int32_t token, uint64_t seq) {
  const uint64_t start = global_timer_ns();
  uint32_t spins = 0;
  while (true) {
    const uint64_t v = ld_acquire_sys(flag);
    if (flag_passes(v, target, cmp)) return v;
    if ((++spins & 63) == 0) {
      if (is_aborted(p)) return v;
      if (global_timer_ns() - start > p.timeout_ns) {
        record_error(p, where, -1, token, static_cast<int64_t>(v), static_cast<int64_t>(target), seq);
        atomicExch(&p.state->aborted, 1);
        __threadfence_system();
        return v;
      }
    }
  }
}

// Spins until *flag == target (kEq) or *flag >= target (kGe). On timeout records which peer never
// signalled, marks the object aborted and returns false; returns false at once once aborted.
__device__ __forceinline__ bool wait_flag(const CommParams& p, const uint64_t* flag, uint64_t target, Cmp cmp,
                                          int32_t phase, int32_t what, int32_t peer, int32_t token, uint64_t seq) {
  const uint64_t v = ld_acquire_sys(flag);
  if (flag_passes(v, target, cmp)) return true;
  return flag_passes(wait_flag_slow(p, flag, target, cmp, err_where(kErrTimeout, phase, what, peer), token, seq),
                     target, cmp);
}

// A tagged word: the low 32 bits of the call's seq, then a 32-bit value. A peer writes it with one
// 8-byte store, so the word is its own arrival flag: the writer needs no release and the reader no
// separate flag (and no second load after one). Calls of one object never overlap, so a word holds
// this call's tag or the previous call's.
__device__ __forceinline__ uint64_t tag_word(uint64_t seq, uint32_t value) {
  return (seq << 32) | static_cast<uint64_t>(value);
}
// Spins until *word carries this call's tag and gives its value; on timeout or abort, as wait_flag.
__device__ __forceinline__ bool wait_tagged(const CommParams& p, const uint64_t* word, uint64_t seq, uint32_t& value,
                                            int32_t phase, int32_t what, int32_t peer) {
  const uint64_t tag = seq & 0xffffffffull;
  uint64_t v = ld_relaxed_sys(word);
  if ((v >> 32) != tag) {
    v = wait_flag_slow(p, word, tag, Cmp::kTag, err_where(kErrTimeout, phase, what, peer), -1, seq);  // the word as the spin saw it
    if ((v >> 32) != tag) return false;
  }
  value = static_cast<uint32_t>(v);
  return true;
}

// Tagged partials (layout.hpp, kTaggedPartialMaxTokens): a 16-byte chunk {x, y, z, w} of a partial
// travels as four 8-byte words, each a 32-bit word of the chunk under the call's tag (tag_word),
// stored as two 16-byte vectors of 8-byte elements. Each element is single-copy atomic, so a reader
// that sees this call's tag in a word sees that word's data: every word is its own arrival flag.
__device__ __forceinline__ void st_tagged_chunk(void* dst, int4 v, uint64_t seq) {
  const uint64_t tag = seq << 32;
  asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(dst), "l"(tag | static_cast<uint32_t>(v.x)),
               "l"(tag | static_cast<uint32_t>(v.y)));
  asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(static_cast<uint8_t*>(dst) + 16),
               "l"(tag | static_cast<uint32_t>(v.z)), "l"(tag | static_cast<uint32_t>(v.w)));
}
struct TaggedChunk {
  uint64_t w[4];
  __device__ __forceinline__ void load(const void* src) {
    asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];" : "=l"(w[0]), "=l"(w[1]) : "l"(src));
    asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];"
                 : "=l"(w[2]), "=l"(w[3])
                 : "l"(static_cast<const uint8_t*>(src) + 16));
  }
  __device__ __forceinline__ bool ready(uint64_t seq) const {
    const uint32_t tag = static_cast<uint32_t>(seq);
    return static_cast<uint32_t>(w[0] >> 32) == tag && static_cast<uint32_t>(w[1] >> 32) == tag &&
           static_cast<uint32_t>(w[2] >> 32) == tag && static_cast<uint32_t>(w[3] >> 32) == tag;
  }
  __device__ __forceinline__ int4 value() const {
    return make_int4(static_cast<int>(static_cast<uint32_t>(w[0])), static_cast<int>(static_cast<uint32_t>(w[1])),
                     static_cast<int>(static_cast<uint32_t>(w[2])), static_cast<int>(static_cast<uint32_t>(w[3])));
  }
};
// One check of a spin that a caller runs inline (tagged partial chunks): every 64th round it asks
// whether to go on. False once the object is aborted, or when the wait has lasted p.timeout_ns since
// start (then recorded and the object aborted, as wait_flag). Out of line, like wait_flag_slow, so
// that the spin's own code is only its loads and tag checks. The spin is inline, loads all of a
// lane's chunks each round into the registers it then sums, and so takes them from the round that
// sees them all: before session 26 an out-of-line loop waited for one chunk after the other (a
// round trip each, even once all had landed) and the caller loaded them again after it, up to
// n + 1 round trips after the data came where one is enough.
// wait_flag_slow keeps its own copy of these few lines: calling this from it made ptxas spill 392 /
// 524 bytes in the bf16 / fp16 small P2P combines, which have none (CUDA 13.0, session 26).
// where: err_where(kErrTimeout, phase, what, peer).
static __device__ __noinline__ bool spin_alive(const CommParams& p, uint64_t start, int64_t seen, int64_t want,
                                               uint32_t where, int32_t token, uint64_t seq) {
  if (is_aborted(p)) return false;
  if (global_timer_ns() - start <= p.timeout_ns) return true;
  record_error(p, where, -1, token, seen, want, seq);
  atomicExch(&p.state->aborted, 1);
  __threadfence_system();
  return false;
}

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

// chunk_begin (kernel_params.hpp, with send_chunk_begin and the receive copy's mapping) keeps its
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

}  // namespace epkit::kernels
