// Bounded waits and error records: every wait of the communication kernels ends, on the flag, on a
// timeout (recorded with the phase, the wait and the peer, and the object marked aborted) or at
// once when the object was aborted earlier. Nothing spins forever and nothing traps the GPU; the
// host turns the record into an epkit::Error. Tagged words (seq << 32 | value) are their own
// arrival flags. Cold paths are out of line (__noinline__): inlined, they cost the decode path
// instruction fetches.
#pragma once

#include <nvshmem.h>
#include <nvshmemx.h>

#include <cstdint>

#include "comm/kernels/errors.hpp"
#include "comm/kernels/params.hpp"
#include "comm/kernels/ptx.cuh"

namespace epkit::kernels {

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
// (9.6% of the 1-token dispatch's warp samples in an ncu profile).
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
// sees them all: an out-of-line loop that waited for one chunk after the other (a
// round trip each, even once all had landed) and the caller loaded them again after it, up to
// n + 1 round trips after the data came where one is enough.
// wait_flag_slow keeps its own copy of these few lines: calling this from it made ptxas spill 392 /
// 524 bytes in the bf16 / fp16 small P2P combines, which have none (CUDA 13.0).
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

}  // namespace epkit::kernels
