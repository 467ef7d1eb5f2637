// Shared pieces of the MoE GPU tests: a main() that skips loudly without a GPU, a fresh seed per
// run, and device arrays that are poisoned before every kernel writes them.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#define CUDA_OK(expr)                                                                          \
  do {                                                                                         \
    const cudaError_t _e = (expr);                                                             \
    ASSERT_EQ(_e, cudaSuccess) << #expr << ": " << cudaGetErrorString(_e);                    \
  } while (0)

namespace epkit::moe_test {

// The run's base seed: EPKIT_TEST_SEED if set (to replay a failure), else fresh from the OS.
// Printed once at start. case_seed mixes it with a case number.
uint64_t base_seed();
uint64_t case_seed(uint64_t case_id);

// --gemm-config NAME (repeatable; scripts/sanitize.sh runs one config per process): the grouped-GEMM
// configs a test restricts itself to. Empty: every compiled config.
const std::vector<std::string>& gemm_config_filter();

// A typed device array. Poisoned (every byte = `byte`) on request: outputs are poisoned before each
// launch so that an element the kernel failed to write shows up as a mismatch.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t n) : n_(n) {
    if (n_ && cudaMalloc(&p_, n_ * sizeof(T)) != cudaSuccess) p_ = nullptr;
  }
  explicit DeviceArray(const std::vector<T>& h) : DeviceArray(h.size()) { upload(h); }
  DeviceArray(DeviceArray&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(p_, o.p_), std::swap(n_, o.n_);
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  ~DeviceArray() { if (p_) cudaFree(p_); }
  T* get() const { return static_cast<T*>(p_); }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }
  void upload(const std::vector<T>& h) { if (n_) cudaMemcpy(p_, h.data(), bytes(), cudaMemcpyHostToDevice); }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    if (n_) cudaMemcpy(h.data(), p_, bytes(), cudaMemcpyDeviceToHost);
    return h;
  }
  void poison(uint8_t byte = 0xff) { if (n_) cudaMemset(p_, byte, bytes()); }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace epkit::moe_test
