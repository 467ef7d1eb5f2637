// The boundary between GroupedGemm (grouped_gemm.cu) and the CUTLASS instantiations (one .cu per
// entry of gemm_configs.def): raw pointers in, one virtual run per call.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "epkit/moe/grouped_gemm.hpp"

namespace epkit::moe::detail {

// One run's device pointers, already validated against the shape.
struct GemmLaunch {
  const uint8_t* a = nullptr;       // fp8 tokens, [G, rows, K] or [R, K]
  const float* a_scale = nullptr;   // [G, rows, K/128] or [R, K/128]
  const uint8_t* b = nullptr;       // fp8 weights [G, N, K]
  const float* b_scale = nullptr;   // [G, ceil(N/128), K/128]
  uint16_t* d = nullptr;            // bf16 [G, rows, N] or [R, N]
  const int32_t* counts = nullptr;  // [G]
  const int32_t* offsets = nullptr; // [G + 1], packed only
  DeviceErrorRecord* error = nullptr;
};

// Throws epkit::Error naming the config and the call if `e` is an error (and clears a non-sticky one,
// so that the next call starts clean).
void gemm_cuda_check(cudaError_t e, const char* what, const GemmConfig& cfg);

// The current device, checked to be a Hopper (sm_90a kernels only), with what the kernels size from.
struct GemmDevice {
  int device = 0;
  int sm_count = 0;
  int smem_optin = 0;  // dynamic shared memory a block may opt into
};
GemmDevice current_gemm_device(const GemmConfig& cfg);

class GemmImpl {
 public:
  GemmImpl(const GroupedGemmShape& shape, const GemmConfig& cfg) : shape_(shape), cfg_(cfg) {}
  virtual ~GemmImpl() = default;
  GemmImpl(const GemmImpl&) = delete;
  GemmImpl& operator=(const GemmImpl&) = delete;

  // Launches the shapes kernel and the GEMM on `stream`; throws epkit::Error if a launch fails.
  virtual void run(const GemmLaunch& launch, cudaStream_t stream) = 0;
  virtual size_t workspace_bytes() const = 0;

  const GroupedGemmShape& shape() const { return shape_; }
  const GemmConfig& config() const { return cfg_; }
  int device() const { return device_; }

 protected:
  GroupedGemmShape shape_;
  GemmConfig cfg_;
  int device_ = 0;
};

// One factory per compiled config: CUTLASS's in src/moe/gemm/<id>.cu, epkit's own in their kernels' sources.
#define EPKIT_GEMM_CONFIG(id, swap, sched, tm, tn, cm, cn) \
  std::unique_ptr<GemmImpl> make_gemm_##id(const GroupedGemmShape& shape);
#define EPKIT_GEMM_OWN_CONFIG EPKIT_GEMM_CONFIG
#include "moe/gemm/gemm_configs.def"

}  // namespace epkit::moe::detail
