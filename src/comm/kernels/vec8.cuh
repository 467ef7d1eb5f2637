// Eight 16-bit (or fp32) values per 16-byte (or 32-byte) vector, to and from fp32: the element
// conversions of the combine kernels (combine.cu, local.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace epkit::kernels {

// The packed pair type of a 16-bit float and its conversions to and from float2.
template <typename T>
struct Pair16;
template <>
struct Pair16<__nv_bfloat16> {
  using type = __nv_bfloat162;
  __device__ static type from(float a, float b) { return __floats2bfloat162_rn(a, b); }
  __device__ static float2 to(type h) { return __bfloat1622float2(h); }
};
template <>
struct Pair16<__half> {
  using type = __half2;
  __device__ static type from(float a, float b) { return __floats2half2_rn(a, b); }
  __device__ static float2 to(type h) { return __half22float2(h); }
};

// Eight 16-bit values in one 16-byte vector, to and from fp32.
template <typename T>
struct Vec8 {
  using P = Pair16<T>;
  __device__ static int4 pack(const float* f) {
    int4 v;
    auto* h = reinterpret_cast<typename P::type*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = P::from(f[2 * i], f[2 * i + 1]);
    return v;
  }
  __device__ static void unpack(int4 v, float* f) {
    const auto* h = reinterpret_cast<const typename P::type*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 x = P::to(h[i]);
      f[2 * i] = x.x, f[2 * i + 1] = x.y;
    }
  }
};

// bf16 to fp32 is the 16 bits placed high: one shift or one mask per element. (The pair
// conversion compiled to a shift, a byte permute and a shift per pair, CUDA 13.0.)
template <>
__device__ inline void Vec8<__nv_bfloat16>::unpack(int4 v, float* f) {
  const uint32_t w[4] = {static_cast<uint32_t>(v.x), static_cast<uint32_t>(v.y), static_cast<uint32_t>(v.z),
                         static_cast<uint32_t>(v.w)};
#pragma unroll
  for (int i = 0; i < 4; ++i) f[2 * i] = __uint_as_float(w[i] << 16), f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
}

// Eight elements of an expert-output row, loaded raw (so two rows' loads can be in flight before
// any conversion) and unpacked to fp32 afterwards.
template <typename T>
struct RawRow {
  int4 v;
  __device__ void load(const T* p) { v = __ldg(reinterpret_cast<const int4*>(p)); }
  __device__ void zero() { v = int4{0, 0, 0, 0}; }
  __device__ void unpack(float* f) const { Vec8<T>::unpack(v, f); }
};
template <>
struct RawRow<float> {
  float4 a, b;
  __device__ void load(const float* p) {
    a = __ldg(reinterpret_cast<const float4*>(p));
    b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  }
  __device__ void zero() { a = b = float4{0.f, 0.f, 0.f, 0.f}; }
  __device__ void unpack(float* f) const {
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
  }
};

}  // namespace epkit::kernels
