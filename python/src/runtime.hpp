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
#include <nanobind/nanobind.h>

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

// A Python object's hold on an AllToAll or MoELayer (T). With NVSHMEM initialized the runtime's
// instance list owns the object: its symmetric memory is freed collectively, so an object dropped
// without destroy() lives until nvshmem_finalize destroys leftovers in creation order on every rank.
// A single-process object (world size 1 without NVSHMEM, on the current device) is owned here and
// freed like any tensor.
template <class T>
class Held {
 public:
  explicit Held(const char* what) : what_(what) {}

  void adopt(std::shared_ptr<T> obj, bool single, int device) {
    device_ = device;
    if (single) {
      owned_ = obj;
    } else {
      runtime().instances.push_back(obj);
    }
    weak_ = obj;
  }

  std::shared_ptr<T> get() const {
    auto p = weak_.lock();
    EPKIT_CHECK(p != nullptr, "this ", what_, " was destroyed (destroy() or nvshmem_finalize())");
    return p;
  }
  int device() const { return device_; }
  bool alive() const { return !weak_.expired(); }

  // Idempotent. Collective for an object of the instance list (every rank destroys it).
  void destroy() {
    std::shared_ptr<T> p = owned_ ? std::move(owned_) : weak_.lock();
    weak_.reset();
    if (!p) return;
    auto& v = runtime().instances;
    for (auto it = v.begin(); it != v.end(); ++it)
      if (it->get() == static_cast<void*>(p.get())) {
        v.erase(it);
        break;
      }
    nanobind::gil_scoped_release release;
    DeviceGuard guard(device_);
    p.reset();
  }

 private:
  const char* what_;
  std::weak_ptr<T> weak_;
  std::shared_ptr<T> owned_;  // single-process objects only
  int device_ = 0;
};

}  // namespace epkit::py
