// Device-memory helpers of epkit-bench (and epkit-moe, through epkit_bench_device): checked CUDA
// calls, an owning buffer, and input filling.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "epkit/types.hpp"

namespace epkit::bench {

// Throws epkit::Error "what failed: <CUDA message>".
void cuda_check(cudaError_t err, const char* what);

// cudaMalloc'd memory, freed on destruction. Throws naming `what` and the size when it does not fit.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes, const char* what = "a device buffer");
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  template <typename T> T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Owned stream.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// Fills `count` elements of type `t` with seeded finite values of magnitude <= 1 (fp8 / bf16 / fp16 /
// fp32; fp32 is used for scales and gets values in [0.5, 1.5]). Payload values matter only in that
// they are not all zero, so no path can take a shortcut on them. Returns once the data is on the device.
void fill_random(void* dst, DType t, size_t count, uint64_t seed);

// Host-to-device copy; returns once the data is on the device (visible to work on any stream).
void copy_to_device(void* dst, const void* src, size_t bytes);

}  // namespace epkit::bench
