// A group's rows as ExpertLayout's contract says, shared by every grouped-GEMM kernel: masked, the
// count clamped to [0, rows]; packed, a group outside [0, min(offsets[g + 1], R)) (or with a
// negative count) skipped. A violation is recorded when `error` is given.
#pragma once

#include <cstdint>

#include "moe/device_errors.cuh"

namespace epkit::moe::detail {

struct GroupRows {
  int64_t row0;  // first row of the group in the token / output tensor
  int count;     // rows to compute (0: none)
};

__device__ __forceinline__ GroupRows group_rows(const int32_t* counts, const int32_t* offsets, int g, int rows,
                                                bool packed, DeviceErrorRecord* error) {
  int count = counts[g];
  if (!packed) {
    if (count < 0 || count > rows) {
      record_violation(error, KernelId::kGroupedGemm, Violation::kExpertCount, g, count, rows);
      count = count < 0 ? 0 : rows;
    }
    return {static_cast<int64_t>(g) * rows, count};
  }
  const int start = offsets[g], next = offsets[g + 1];
  const int64_t end = static_cast<int64_t>(start) + count;
  const int64_t limit = next < rows ? next : rows;
  if (start < 0 || count < 0 || end > limit) {
    record_violation(error, KernelId::kGroupedGemm, Violation::kPackedRange, g, end, limit);
    return {0, 0};
  }
  return {start, count};
}

}  // namespace epkit::moe::detail
