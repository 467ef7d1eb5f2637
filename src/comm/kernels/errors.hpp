// What a communication kernel reports to the host: the error codes, the phase and the wait it was
// in, and the record the first error is written to (host-mapped pinned memory: the host reads it
// without a sync). AllToAll turns a record into an epkit::Error naming the rank, the peer and the wait.
#pragma once

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

}  // namespace epkit::kernels
