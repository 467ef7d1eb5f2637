// Small device and launch helpers shared by the MoE kernels (router, quantization, SiLU-mul).
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "moe/device_errors.cuh"
#include "moe/moe_math.hpp"
#include "common/cuda_check.hpp"

namespace epkit::moe::detail {

constexpr unsigned kFullMask = 0xffffffffu;

// Multiprocessors of the current device: the size of the persistent grids.
inline int sm_count() {
  int dev = 0, n = 0;
  EPKIT_CUDA_CHECK(cudaGetDevice(&dev));
  EPKIT_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n > 0 ? n : 1;
}

// m for this launch: the host value, or the device counter read once and clamped to [0, rows]
// (a clamp is recorded by the one thread for which `reporter` is true).
__device__ __forceinline__ int resolve_num_tokens(int host_m, const int32_t* dev_m, int rows, DeviceErrorRecord* err,
                                                  KernelId kernel, bool reporter) {
  if (dev_m == nullptr) return host_m;
  const int m = *dev_m;
  if (m >= 0 && m <= rows) return m;
  if (reporter) record_violation(err, kernel, Violation::kNumTokens, -1, m, rows);
  return m < 0 ? 0 : rows;
}

// The largest |x| of the 8 bf16 in a 16-byte word, as bf16 bits: an unsigned max of the
// sign-cleared halves orders them as their magnitudes, and a NaN (above inf) wins.
__device__ __forceinline__ uint32_t bf16x8_amax_bits(const uint4& v) {
  uint32_t m = __vmaxu2(__vmaxu2(v.x & 0x7fff7fffu, v.y & 0x7fff7fffu), __vmaxu2(v.z & 0x7fff7fffu, v.w & 0x7fff7fffu));
  return max(m & 0xffffu, m >> 16);
}

// Widens the 8 bf16 of a 16-byte word to fp32 (exact).
__device__ __forceinline__ void bf16x8_to_float(const uint4& v, float* f) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// Four e4m3 codes of x * inv (satfinite, round to nearest even) in one word, x[0] lowest.
__device__ __forceinline__ uint32_t quant4(const float* x, float inv) {
  const __nv_fp8x2_storage_t lo =
      __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(x[0], inv), __fmul_rn(x[1], inv)), __NV_SATFINITE, __NV_E4M3);
  const __nv_fp8x2_storage_t hi =
      __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(x[2], inv), __fmul_rn(x[3], inv)), __NV_SATFINITE, __NV_E4M3);
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

// 16 e4m3 codes of x[0..16) * inv in one 16-byte word.
__device__ __forceinline__ uint4 quant16(const float* x, float inv) {
  return make_uint4(quant4(x, inv), quant4(x + 4, inv), quant4(x + 8, inv), quant4(x + 12, inv));
}

}  // namespace epkit::moe::detail
