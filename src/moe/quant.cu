// FP8 block quantization kernels (epkit/moe/quant.hpp).
// Activations: a persistent grid of warps over (row, 512-element chunk) items; each lane loads 16
// bf16 (two 16-byte words), 8 lanes form one 1x128 block whose amax is reduced by shuffles, and
// each lane stores its 16 codes as one 16-byte word. Two items are in flight per warp.
// Weights: one block of 256 threads per 128x128 tile, the tile held in registers between the
// amax and the quantisation (it is read once).
#include <cuda_runtime.h>

#include "epkit/error.hpp"
#include "epkit/moe/quant.hpp"
#include "moe/kernel_util.cuh"

namespace epkit::moe {
namespace {

namespace m = math;
using detail::kFullMask;

constexpr int kActThreads = 256;
constexpr int kActBlocksPerSm = 4;
constexpr int kChunk = 512;  // elements of one warp item: 32 lanes x 16

struct ActQuantParams {
  const uint16_t* x;  // [rows, H] bf16 bits
  uint8_t* out;       // [rows, H]
  float* scale;       // [rows, nb]
  int h;
  int nb;      // ceil(H / 128)
  int chunks;  // ceil(H / 512)
  int num_tokens;
  const int32_t* num_tokens_device;
  int rows;
  bool ue8m0;
  DeviceErrorRecord* error;
};

// A warp's position in the (row, chunk) item space, advanced by a fixed stride without division.
struct Cursor {
  int64_t row;
  int c;
  __device__ __forceinline__ void advance(const Cursor& step, int chunks) {
    row += step.row, c += step.c;
    if (c >= chunks) c -= chunks, ++row;
  }
};

__device__ __forceinline__ void act_load(const ActQuantParams& p, const Cursor& at, int lane, bool valid, uint4& v0,
                                         uint4& v1) {
  const int e = at.c * kChunk + lane * 16;
  v0 = v1 = make_uint4(0, 0, 0, 0);
  if (valid && e < p.h) {
    const uint4* src = reinterpret_cast<const uint4*>(p.x + at.row * p.h + e);
    v0 = __ldcs(src);
    v1 = __ldcs(src + 1);
  }
}

// Quantises one loaded item. Every lane of the warp calls it (the amax shuffles need them all).
__device__ __forceinline__ void act_store(const ActQuantParams& p, const Cursor& at, int lane, const uint4& v0,
                                          const uint4& v1) {
  const int e = at.c * kChunk + lane * 16;
  uint32_t a = max(detail::bf16x8_amax_bits(v0), detail::bf16x8_amax_bits(v1));
  a = max(a, __shfl_xor_sync(kFullMask, a, 4));
  a = max(a, __shfl_xor_sync(kFullMask, a, 2));
  a = max(a, __shfl_xor_sync(kFullMask, a, 1));
  if (e >= p.h) return;
  const float s = m::block_scale(m::bf16_bits_to_float(a), p.ue8m0);
  const float inv = m::block_inv_scale(s);
  float f[16];
  detail::bf16x8_to_float(v0, f);
  detail::bf16x8_to_float(v1, f + 8);
  *reinterpret_cast<uint4*>(p.out + at.row * p.h + e) = detail::quant16(f, inv);
  if ((lane & 7) == 0) p.scale[at.row * p.nb + e / kScaleBlock] = s;
}

__global__ void __launch_bounds__(kActThreads, kActBlocksPerSm) act_quant_kernel(const ActQuantParams p) {
  const int lane = threadIdx.x & 31;
  const int gw = (blockIdx.x * kActThreads + threadIdx.x) >> 5, nw = (gridDim.x * kActThreads) >> 5;
  const int num_tokens = detail::resolve_num_tokens(p.num_tokens, p.num_tokens_device, p.rows, p.error,
                                                    KernelId::kQuantize, blockIdx.x == 0 && threadIdx.x == 0);
  const Cursor step{nw / p.chunks, nw % p.chunks};
  Cursor a{gw / p.chunks, gw % p.chunks};
  while (a.row < num_tokens) {
    Cursor b = a;
    b.advance(step, p.chunks);
    const bool has_b = b.row < num_tokens;
    uint4 a0, a1, b0, b1;
    act_load(p, a, lane, true, a0, a1);
    act_load(p, b, lane, has_b, b0, b1);
    act_store(p, a, lane, a0, a1);
    if (has_b) act_store(p, b, lane, b0, b1);
    a = b;
    a.advance(step, p.chunks);
  }
}

constexpr int kWeightThreads = 256;  // 16 threads x 8 elements per tile row, 16 rows per pass, 8 passes

struct WeightQuantParams {
  const uint16_t* w;  // [G, N, K] bf16 bits
  uint8_t* out;       // [G, N, K]
  float* scale_inv;   // [G, nt, kt]
  int64_t n, k;
  int nt, kt;
  bool vec;  // K % 8 == 0 and aligned: 16-byte loads, 8-byte stores
  bool ue8m0;
};

__global__ void __launch_bounds__(kWeightThreads) weight_quant_kernel(const WeightQuantParams p) {
  __shared__ uint32_t warp_amax[kWeightThreads / 32];
  const int tile = blockIdx.x;
  const int kt_i = tile % p.kt, rest = tile / p.kt;
  const int nt_i = rest % p.nt, g = rest / p.nt;
  const int tid = threadIdx.x;
  const int64_t col = static_cast<int64_t>(kt_i) * kScaleBlock + (tid & 15) * 8;
  const int64_t row0 = static_cast<int64_t>(nt_i) * kScaleBlock + (tid >> 4);
  const uint16_t* w = p.w + g * p.n * p.k;
  uint8_t* out = p.out + g * p.n * p.k;

  uint4 v[8];
  uint32_t a = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t row = row0 + 16 * i;
    v[i] = make_uint4(0, 0, 0, 0);
    if (row < p.n && col < p.k) {
      const uint16_t* src = w + row * p.k + col;
      if (p.vec) {
        v[i] = __ldcs(reinterpret_cast<const uint4*>(src));
      } else {
        uint16_t h[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int e = 0; e < 8 && col + e < p.k; ++e) h[e] = src[e];
        v[i] = make_uint4(h[0] | (uint32_t{h[1]} << 16), h[2] | (uint32_t{h[3]} << 16), h[4] | (uint32_t{h[5]} << 16),
                          h[6] | (uint32_t{h[7]} << 16));
      }
    }
    a = max(a, detail::bf16x8_amax_bits(v[i]));
  }
  a = __reduce_max_sync(kFullMask, a);
  if ((tid & 31) == 0) warp_amax[tid >> 5] = a;
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kWeightThreads / 32; ++i) a = max(a, warp_amax[i]);
  const float s = m::block_scale(m::bf16_bits_to_float(a), p.ue8m0);
  const float inv = m::block_inv_scale(s);
  if (tid == 0) p.scale_inv[tile] = s;

#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t row = row0 + 16 * i;
    if (row >= p.n || col >= p.k) continue;
    float f[8];
    detail::bf16x8_to_float(v[i], f);
    const uint2 q = make_uint2(detail::quant4(f, inv), detail::quant4(f + 4, inv));
    uint8_t* dst = out + row * p.k + col;
    if (p.vec) {
      *reinterpret_cast<uint2*>(dst) = q;
    } else {
      const uint8_t* b = reinterpret_cast<const uint8_t*>(&q);
      for (int e = 0; e < 8 && col + e < p.k; ++e) dst[e] = b[e];
    }
  }
}

}  // namespace

void quantize_activations(const ActQuantArgs& a, cudaStream_t stream) {
  check_act_quant_args(a);
  int64_t rows = a.x.shape[0];
  rows = a.out.shape[0] < rows ? a.out.shape[0] : rows;
  rows = a.scale.shape[0] < rows ? a.scale.shape[0] : rows;
  const bool on_device = a.num_tokens_device != nullptr;
  if (!on_device && a.num_tokens == 0) return;

  ActQuantParams p{};
  p.x = static_cast<const uint16_t*>(a.x.data);
  p.out = static_cast<uint8_t*>(a.out.data);
  p.scale = static_cast<float*>(a.scale.data);
  p.h = static_cast<int>(a.x.shape[1]);
  p.nb = static_cast<int>(num_scale_blocks(p.h));
  p.chunks = (p.h + kChunk - 1) / kChunk;
  p.num_tokens = a.num_tokens;
  p.num_tokens_device = a.num_tokens_device;
  p.rows = static_cast<int>(rows);
  p.ue8m0 = a.ue8m0;
  p.error = a.error;

  const int64_t items = (on_device ? rows : a.num_tokens) * static_cast<int64_t>(p.chunks);
  constexpr int kWarps = kActThreads / 32;
  int64_t blocks = (items + kWarps - 1) / kWarps;
  const int64_t cap = static_cast<int64_t>(detail::sm_count()) * kActBlocksPerSm;
  blocks = blocks < 1 ? 1 : (blocks > cap ? cap : blocks);
  act_quant_kernel<<<static_cast<unsigned>(blocks), kActThreads, 0, stream>>>(p);
  EPKIT_CUDA_CHECK(cudaGetLastError());
}

void quantize_weights(const WeightQuantArgs& a, cudaStream_t stream) {
  check_weight_quant_args(a);
  const int nd = a.w.ndim;
  const int64_t G = nd == 3 ? a.w.shape[0] : 1, N = a.w.shape[nd - 2], K = a.w.shape[nd - 1];
  WeightQuantParams p{};
  p.w = static_cast<const uint16_t*>(a.w.data);
  p.out = static_cast<uint8_t*>(a.out.data);
  p.scale_inv = static_cast<float*>(a.scale_inv.data);
  p.n = N;
  p.k = K;
  p.nt = static_cast<int>(num_scale_blocks(N));
  p.kt = static_cast<int>(num_scale_blocks(K));
  p.vec = K % 8 == 0 && reinterpret_cast<uintptr_t>(a.w.data) % 16 == 0 && reinterpret_cast<uintptr_t>(a.out.data) % 8 == 0;
  p.ue8m0 = a.ue8m0;
  const int64_t tiles = G * p.nt * p.kt;
  if (tiles == 0) return;
  weight_quant_kernel<<<static_cast<unsigned>(tiles), kWeightThreads, 0, stream>>>(p);
  EPKIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace epkit::moe
