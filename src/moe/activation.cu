// Fused SiLU-mul + FP8 1x128 quantization (epkit/moe/activation.hpp).
// A persistent grid: every block first turns the device counts into a prefix over the L experts
// (clamping and recording bad counts), then its warps walk the (real row, 512-element chunk)
// items of all experts; a real row r belongs to the expert found by binary search over the prefix.
// Each lane handles 16 outputs (two 16-byte words of gate, two of up, one word of codes); 8 lanes
// form one 1x128 block. Two items are in flight per warp.
#include <cuda_runtime.h>

#include "epkit/error.hpp"
#include "epkit/moe/activation.hpp"
#include "moe/kernel_util.cuh"

namespace epkit::moe {
namespace {

namespace m = math;
using detail::kFullMask;

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 4;
constexpr int kChunk = 512;  // outputs of one warp item: 32 lanes x 16

struct SiluParams {
  const uint16_t* in;      // [rows, 2I] bf16 bits (masked rows: e * cap + j)
  uint8_t* out;            // [rows, I]
  float* scale;            // [rows, I / 128]
  const int32_t* counts;   // [L]
  const int32_t* offsets;  // [L + 1] (packed) or nullptr (masked)
  int num_experts;         // L
  int cap;                 // masked: rows per expert
  int rows;                // packed: R
  int i;                   // I
  int nb;                  // I / 128
  int chunks;              // ceil(I / 512)
  bool ue8m0;
  DeviceErrorRecord* error;
};

struct Cursor {
  int64_t row;  // real row, over all experts
  int c;
  __device__ __forceinline__ void advance(const Cursor& step, int chunks) {
    row += step.row, c += step.c;
    if (c >= chunks) c -= chunks, ++row;
  }
};

// start[0..L] = the exclusive prefix of the clamped counts (start[L] = all real rows) and base[e] =
// the tensor row of expert e's first row. Block 0 records the violations.
__device__ void build_prefix(const SiluParams& p, int* start, int* base) {
  const int L = p.num_experts;
  const bool reporter = blockIdx.x == 0;
  for (int e = threadIdx.x; e < L; e += blockDim.x) {
    int cnt = p.counts[e], b;
    if (p.offsets == nullptr) {
      b = e * p.cap;
      if (cnt < 0 || cnt > p.cap) {
        if (reporter) record_violation(p.error, KernelId::kSiluMulQuantize, Violation::kExpertCount, e, cnt, p.cap);
        cnt = cnt < 0 ? 0 : p.cap;
      }
    } else {
      b = p.offsets[e];
      const int64_t end = static_cast<int64_t>(b) + cnt;
      const int next = p.offsets[e + 1];
      const int64_t limit = next < p.rows ? next : p.rows;
      if (b < 0 || cnt < 0 || end > limit) {
        if (reporter) record_violation(p.error, KernelId::kSiluMulQuantize, Violation::kPackedRange, e, end, limit);
        cnt = 0, b = 0;
      }
    }
    start[e] = cnt;
    base[e] = b;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x, per = (L + 31) / 32;
    const int lo = lane * per < L ? lane * per : L, hi = lo + per < L ? lo + per : L;
    int sum = 0;
    for (int e = lo; e < hi; ++e) sum += start[e];
    int incl = sum;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int v = __shfl_up_sync(kFullMask, incl, off);
      if (lane >= off) incl += v;
    }
    int run = incl - sum;
    for (int e = lo; e < hi; ++e) {
      const int c = start[e];
      start[e] = run;
      run += c;
    }
    if (lane == 31) start[L] = incl;
  }
  __syncthreads();
}

// The expert holding real row r: the largest e with start[e] <= r (empty experts share a start
// with their successor, so the largest one is the expert whose range holds r).
__device__ __forceinline__ int expert_of(const int* start, int L, int r) {
  int lo = 0, hi = L;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (start[mid] <= r) lo = mid;
    else hi = mid;
  }
  return lo;
}

struct Item {
  uint4 g0, g1, u0, u1;
  int64_t row;  // tensor row
};

__device__ __forceinline__ void load_item(const SiluParams& p, const int* start, const int* base, const Cursor& at,
                                          int lane, bool valid, Item& it) {
  it.g0 = it.g1 = it.u0 = it.u1 = make_uint4(0, 0, 0, 0);
  it.row = 0;
  if (!valid) return;
  const int r = static_cast<int>(at.row);
  const int e = expert_of(start, p.num_experts, r);
  it.row = static_cast<int64_t>(base[e]) + (r - start[e]);
  const int x = at.c * kChunk + lane * 16;
  if (x >= p.i) return;
  const uint4* g = reinterpret_cast<const uint4*>(p.in + it.row * 2 * p.i + x);
  const uint4* u = reinterpret_cast<const uint4*>(p.in + it.row * 2 * p.i + p.i + x);
  it.g0 = __ldcs(g);
  it.g1 = __ldcs(g + 1);
  it.u0 = __ldcs(u);
  it.u1 = __ldcs(u + 1);
}

// Every lane of the warp calls it (the amax shuffles need them all).
__device__ __forceinline__ void store_item(const SiluParams& p, const Cursor& at, int lane, const Item& it) {
  const int x = at.c * kChunk + lane * 16;
  float g[16], u[16], h[16];
  detail::bf16x8_to_float(it.g0, g);
  detail::bf16x8_to_float(it.g1, g + 8);
  detail::bf16x8_to_float(it.u0, u);
  detail::bf16x8_to_float(it.u1, u + 8);
  uint32_t a = 0;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    h[j] = m::silu_mul(g[j], u[j]);
    a = max(a, __float_as_uint(h[j]) & 0x7fffffffu);  // unsigned order of |h| bits; NaN wins
  }
  a = max(a, __shfl_xor_sync(kFullMask, a, 4));
  a = max(a, __shfl_xor_sync(kFullMask, a, 2));
  a = max(a, __shfl_xor_sync(kFullMask, a, 1));
  if (x >= p.i) return;
  const float s = m::block_scale(__uint_as_float(a), p.ue8m0);
  const float inv = m::block_inv_scale(s);
  *reinterpret_cast<uint4*>(p.out + it.row * p.i + x) = detail::quant16(h, inv);
  if ((lane & 7) == 0) p.scale[it.row * p.nb + x / kScaleBlock] = s;
}

__global__ void __launch_bounds__(kThreads, kBlocksPerSm) silu_mul_quant_kernel(const SiluParams p) {
  extern __shared__ int smem[];
  int* start = smem;                      // [L + 1]
  int* base = smem + p.num_experts + 1;   // [L]
  build_prefix(p, start, base);
  const int64_t total = start[p.num_experts];
  const int lane = threadIdx.x & 31;
  const int gw = (blockIdx.x * kThreads + threadIdx.x) >> 5, nw = (gridDim.x * kThreads) >> 5;
  const Cursor step{nw / p.chunks, nw % p.chunks};
  Cursor a{gw / p.chunks, gw % p.chunks};
  while (a.row < total) {
    Cursor b = a;
    b.advance(step, p.chunks);
    const bool has_b = b.row < total;
    Item ia, ib;
    load_item(p, start, base, a, lane, true, ia);
    load_item(p, start, base, b, lane, has_b, ib);
    store_item(p, a, lane, ia);
    if (has_b) store_item(p, b, lane, ib);
    a = b;
    a.advance(step, p.chunks);
  }
}

}  // namespace

void silu_mul_quantize(const SiluMulQuantArgs& a, cudaStream_t stream) {
  check_silu_mul_quant_args(a);
  const bool packed = a.layout == ExpertLayout::kPacked;
  SiluParams p{};
  p.in = static_cast<const uint16_t*>(a.in.data);
  p.out = static_cast<uint8_t*>(a.out.data);
  p.scale = static_cast<float*>(a.scale.data);
  p.counts = static_cast<const int32_t*>(a.expert_num_tokens.data);
  p.offsets = packed ? static_cast<const int32_t*>(a.expert_offsets.data) : nullptr;
  p.num_experts = static_cast<int>(a.expert_num_tokens.shape[0]);
  p.cap = packed ? 0 : static_cast<int>(a.in.shape[1]);
  p.rows = packed ? static_cast<int>(a.in.shape[0]) : p.num_experts * p.cap;
  p.i = static_cast<int>(a.in.shape[a.in.ndim - 1] / 2);
  p.nb = p.i / kScaleBlock;
  p.chunks = (p.i + kChunk - 1) / kChunk;
  p.ue8m0 = a.ue8m0;
  p.error = a.error;
  const size_t smem = static_cast<size_t>(2 * p.num_experts + 1) * sizeof(int);
  const int blocks = detail::sm_count() * kBlocksPerSm;
  silu_mul_quant_kernel<<<blocks, kThreads, smem, stream>>>(p);
  EPKIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace epkit::moe
