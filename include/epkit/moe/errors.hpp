// Device-side violations found by the MoE kernels, reported rather than written: a device count
// above capacity, a device m above the rows of its tensors, packed offsets out of range. The kernel
// clamps (never writes past a buffer) and records the first violation in an ErrorRecord, which the
// host reads without synchronising.
#pragma once

#include <cstdint>
#include <string>

namespace epkit::moe {

enum class KernelId : int32_t { kNone = 0, kRouter, kQuantize, kGroupedGemm, kSiluMulQuantize, kLayer };
const char* kernel_name(KernelId k);

enum class Violation : int32_t {
  kNone = 0,
  kNumTokens = 1,    // num_tokens_device > rows (or < 0): clamped to [0, rows]
  kExpertCount = 2,  // expert_num_tokens[index] > capacity: only capacity rows were computed
  kPackedRange = 3,  // packed offsets: offset[index] + count > rows of the tensor, or not increasing: group skipped
};

// What a kernel writes on its first violation (device or host-mapped memory; `lock` wins the race).
struct DeviceErrorRecord {
  int32_t lock;
  int32_t kernel;     // KernelId
  int32_t violation;  // Violation
  int32_t index;      // expert / group index, or -1
  int64_t value;      // the offending value
  int64_t limit;      // the limit it broke
  volatile int32_t code;  // written last: non-zero once the record is complete
  int32_t pad;
};

// Owns one host-mapped DeviceErrorRecord. Pass device() to the kernels' `error` argument; call
// check() after the work has finished (after a stream or event synchronisation).
class ErrorRecord {
 public:
  ErrorRecord();
  ~ErrorRecord();
  ErrorRecord(const ErrorRecord&) = delete;
  ErrorRecord& operator=(const ErrorRecord&) = delete;

  DeviceErrorRecord* device() const { return dev_; }
  bool pending() const { return host_->code != 0; }
  // The recorded violation as text ("" if none).
  std::string message() const;
  // Throws epkit::Error with message() if a violation was recorded, after re-arming the record.
  void check();
  // Forgets a recorded violation. Not while kernels that write this record are in flight.
  void reset();

 private:
  DeviceErrorRecord* host_ = nullptr;
  DeviceErrorRecord* dev_ = nullptr;
};

}  // namespace epkit::moe
