#include "layer/layer_kernels.hpp"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "moe/device_errors.cuh"

namespace epkit::layer {

namespace {

// One thread per 8 bf16 (16 bytes), grid-stride over the first m rows.
__global__ void add_rows_kernel(int4* out, const int4* y, const int32_t* m_ptr, int rows, int vec_per_row) {
  const int m = min(max(*m_ptr, 0), rows);
  const size_t n = static_cast<size_t>(m) * vec_per_row;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    int4 a = out[i];
    const int4 b = __ldg(y + i);
    auto* pa = reinterpret_cast<__nv_bfloat162*>(&a);
    const auto* pb = reinterpret_cast<const __nv_bfloat162*>(&b);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 fa = __bfloat1622float2(pa[k]), fb = __bfloat1622float2(pb[k]);
      pa[k] = __floats2bfloat162_rn(fa.x + fb.x, fa.y + fb.y);
    }
    out[i] = a;
  }
}

__global__ void split_tokens_kernel(const int32_t* m_ptr, int split, int rows, int32_t* m_half,
                                    moe::DeviceErrorRecord* err) {
  const int raw = *m_ptr;
  if (raw < 0 || raw > rows) moe::record_violation(err, moe::KernelId::kLayer, moe::Violation::kNumTokens, -1, raw, rows);
  const int m = min(max(raw, 0), rows);
  m_half[0] = min(m, split);
  m_half[1] = max(0, m - split);
}

}  // namespace

cudaError_t launch_add_rows(void* out, const void* y, const int32_t* m, int rows, int hidden, cudaStream_t s) {
  if (rows <= 0) return cudaSuccess;
  const int vec = hidden / 8;
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const size_t work = static_cast<size_t>(rows) * vec;
  const int blocks = static_cast<int>(std::min<size_t>((work + 255) / 256, static_cast<size_t>(sms) * 4));
  add_rows_kernel<<<blocks, 256, 0, s>>>(static_cast<int4*>(out), static_cast<const int4*>(y), m, rows, vec);
  return cudaGetLastError();
}

cudaError_t launch_split_tokens(const int32_t* m, int split, int rows, int32_t* m_half, moe::DeviceErrorRecord* err,
                                cudaStream_t s) {
  split_tokens_kernel<<<1, 1, 0, s>>>(m, split, rows, m_half, err);
  return cudaGetLastError();
}

}  // namespace epkit::layer
