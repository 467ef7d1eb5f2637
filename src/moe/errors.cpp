#include "epkit/moe/errors.hpp"

#include <cuda_runtime.h>

#include <cstring>
#include <sstream>

#include "epkit/error.hpp"

namespace epkit::moe {

const char* kernel_name(KernelId k) {
  switch (k) {
    case KernelId::kNone: return "none";
    case KernelId::kRouter: return "router";
    case KernelId::kQuantize: return "quantize";
    case KernelId::kGroupedGemm: return "grouped_gemm";
    case KernelId::kSiluMulQuantize: return "silu_mul_quantize";
    case KernelId::kLayer: return "moe_layer";
  }
  return "?";
}

ErrorRecord::ErrorRecord() {
  void* h = nullptr;
  const cudaError_t e = cudaHostAlloc(&h, sizeof(DeviceErrorRecord), cudaHostAllocMapped);
  EPKIT_CHECK(e == cudaSuccess, "ErrorRecord: cudaHostAlloc failed: ", cudaGetErrorString(e));
  host_ = static_cast<DeviceErrorRecord*>(h);
  std::memset(static_cast<void*>(host_), 0, sizeof(DeviceErrorRecord));
  void* d = nullptr;
  const cudaError_t e2 = cudaHostGetDevicePointer(&d, h, 0);
  if (e2 != cudaSuccess) {
    cudaFreeHost(h);
    EPKIT_FAIL("ErrorRecord: cudaHostGetDevicePointer failed: ", cudaGetErrorString(e2));
  }
  dev_ = static_cast<DeviceErrorRecord*>(d);
}

ErrorRecord::~ErrorRecord() {
  if (host_) cudaFreeHost(host_);
}

std::string ErrorRecord::message() const {
  if (host_->code == 0) return "";
  const DeviceErrorRecord& r = *host_;
  std::ostringstream os;
  os << "epkit " << kernel_name(static_cast<KernelId>(r.kernel)) << ": ";
  switch (static_cast<Violation>(r.violation)) {
    case Violation::kNumTokens:
      os << "num_tokens_device holds m = " << r.value << " but the tensors have " << r.limit
         << " rows; m was clamped to [0, " << r.limit << "]";
      break;
    case Violation::kExpertCount:
      os << "expert_num_tokens[" << r.index << "] = " << r.value << " exceeds the capacity " << r.limit
         << "; only " << r.limit << " rows were computed";
      break;
    case Violation::kPackedRange:
      os << "packed layout: group " << r.index << " ends at row " << r.value << " but the tensor has " << r.limit
         << " rows (or its offsets decrease); the group was skipped";
      break;
    default: os << "unknown violation " << r.violation;
  }
  return os.str();
}

void ErrorRecord::reset() { std::memset(static_cast<void*>(host_), 0, sizeof(DeviceErrorRecord)); }

void ErrorRecord::check() {
  if (host_->code == 0) return;
  const std::string m = message();
  reset();
  throw Error(m);
}

}  // namespace epkit::moe
