// Process-wide state of the Python extension: the one Communicator (one NVSHMEM per process), the
// symmetric allocations handed to Python and the AllToAll instances still holding symmetric memory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "epkit/all_to_all.hpp"
#include "epkit/communicator.hpp"
#include "epkit/error.hpp"

namespace epkit::py {

struct Runtime {
  std::unique_ptr<Communicator> comm;
  // Live symmetric allocations, base -> bytes; a pointer leaves when it is freed or at finalize.
  std::map<uintptr_t, size_t> allocs;
  // AllToAll and MoELayer objects not yet destroyed, in creation order. Their destruction frees
  // symmetric memory, which is collective, so finalize must destroy leftovers in the same order on
  // every rank. (shared_ptr<void> keeps each object's own deleter.)
  std::vector<std::shared_ptr<void>> instances;
};

Runtime& runtime();

// The communicator, or an epkit::Error telling the caller to run nvshmem_init first.
const Communicator& comm();

// Makes the communicator's GPU current for one binding call and restores the caller's afterwards:
// kernels launch on the current device, and Python code may have another one current.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
  bool changed_ = false;
};

inline cudaStream_t as_stream(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

}  // namespace epkit::py
