// Device side of epkit/moe/errors.hpp: the first violation wins the record.
#pragma once

#include "epkit/moe/errors.hpp"

namespace epkit::moe {

__device__ __noinline__ inline void record_violation(DeviceErrorRecord* r, KernelId kernel, Violation v, int index,
                                                     long long value, long long limit) {
  if (r == nullptr) return;
  if (atomicCAS(&r->lock, 0, 1) != 0) return;
  r->kernel = static_cast<int32_t>(kernel);
  r->violation = static_cast<int32_t>(v);
  r->index = index;
  r->value = value;
  r->limit = limit;
  __threadfence_system();
  r->code = 1;
  __threadfence_system();
}

}  // namespace epkit::moe
