// The router kernels (epkit/moe/router.hpp). Both run one warp per token over a persistent grid
// that reads m (the device counter) once, and give the same bits.
//
// kGeneral: the token's E scores in registers (V = E/32 rounded up to a power of two per lane,
// lane l holding experts [l V, l V + V)), K rounds of warp arg-max, each one redux.sync max over
// 32-bit order keys plus a ballot: since lane l holds lower indices than lane l + 1, the lowest lane
// holding the maximum holds the lowest such index. Grouped mode writes s' to a per-warp
// shared-memory row to score and rank the groups.
//
// kWarpGrouped (grouped mode, E = 32 V, groups of whole lanes): the same layout with everything in
// registers, no shared memory, no barrier (moe/router_warp.cuh).
#include <cuda_runtime.h>

#include "epkit/error.hpp"
#include "epkit/moe/router.hpp"
#include "moe/kernel_util.cuh"
#include "moe/router_warp.cuh"

namespace epkit::moe {
namespace {

namespace m = math;
using detail::kFullMask;

constexpr int kWarpsPerBlock = 4;

struct RouterParams {
  const void* logits;       // [rows, E] bf16 bits or fp32
  const float* bias;        // [E] or nullptr (= 0)
  int32_t* topk_idx;        // [rows, K]
  float* topk_weights;      // [rows, K]
  int num_experts;          // E
  int topk;                 // K
  int num_groups;           // G
  int group_size;           // E / G
  int topk_groups;
  int lanes_per_group;      // group scan: a power of two with G * lanes_per_group <= 32, or 1 when G > 32
  int warp_smem_bytes;      // per-warp scratch (grouped mode with groups to drop), else 0
  bool use_groups;          // grouped mode and topk_groups < num_groups
  bool renormalize;
  bool vec_loads;           // E == 32 V and 16-byte rows: load logits as 16-byte words
  float scaling;
  int num_tokens;
  const int32_t* num_tokens_device;
  int32_t* num_tokens_out;  // or nullptr
  int rows;
  DeviceErrorRecord* error;
};

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<uint16_t>(uint16_t v) { return m::bf16_bits_to_float(v); }
template <>
__device__ __forceinline__ float to_float<float>(float v) { return v; }

template <typename T, int V>
__device__ __forceinline__ void load_logits(const RouterParams& p, int t, int e0, float (&val)[V]) {
  const T* row = static_cast<const T*>(p.logits) + static_cast<size_t>(t) * p.num_experts;
  constexpr int kWords = V * static_cast<int>(sizeof(T)) / 16;
  if constexpr (kWords > 0) {
    if (p.vec_loads) {
      const uint4* src = reinterpret_cast<const uint4*>(row + e0);
#pragma unroll
      for (int i = 0; i < kWords; ++i) {
        const uint4 u = __ldg(src + i);
        if constexpr (sizeof(T) == 2) {
          detail::bf16x8_to_float(u, val + 8 * i);
        } else {
          val[4 * i] = __uint_as_float(u.x), val[4 * i + 1] = __uint_as_float(u.y);
          val[4 * i + 2] = __uint_as_float(u.z), val[4 * i + 3] = __uint_as_float(u.w);
        }
      }
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < V; ++j) val[j] = e0 + j < p.num_experts ? to_float<T>(__ldg(row + e0 + j)) : 0.0f;
}

// The group of each s' row entry is scored (sum of its two largest s') into gkey[g] as an order
// key. lanes_per_group lanes scan one group's strided part each, then merge their top-2 pairs.
__device__ __forceinline__ void score_groups(const RouterParams& p, const float* sp, uint32_t* gkey, int lane) {
  const int G = p.num_groups, gs = p.group_size, lpg = p.lanes_per_group;
  const int gpp = 32 / lpg;
  for (int g0 = 0; g0 < G; g0 += gpp) {
    const int g = g0 + lane / lpg, part = lane & (lpg - 1);
    uint32_t k1 = 0, k2 = 0;
    float v1 = 0.0f, v2 = 0.0f;
    if (g < G) {
      const float* x = sp + g * gs;
      for (int i = part; i < gs; i += lpg) {
        const float v = x[i];
        const uint32_t k = m::order_key(v);
        if (k > k1) {
          k2 = k1, v2 = v1, k1 = k, v1 = v;
        } else if (k > k2) {
          k2 = k, v2 = v;
        }
      }
    }
    for (int off = lpg >> 1; off > 0; off >>= 1) {
      const uint32_t b1 = __shfl_xor_sync(kFullMask, k1, off), b2 = __shfl_xor_sync(kFullMask, k2, off);
      const float w1 = __shfl_xor_sync(kFullMask, v1, off), w2 = __shfl_xor_sync(kFullMask, v2, off);
      if (b1 > k1) {
        if (k1 > b2) k2 = k1, v2 = v1;
        else k2 = b2, v2 = w2;
        k1 = b1, v1 = w1;
      } else if (b1 > k2) {
        k2 = b1, v2 = w1;
      }
    }
    if (g < G && part == 0) gkey[g] = m::order_key(k2 == 0 ? v1 : m::fadd(v1, v2));
  }
}

// kept[g] = 1 for the topk_groups best groups (ties: the lower group index ranks higher).
__device__ __forceinline__ void rank_groups(const RouterParams& p, const uint32_t* gkey, uint8_t* kept, int lane) {
  const int G = p.num_groups;
  for (int g = lane; g < G; g += 32) {
    const uint32_t kg = gkey[g];
    int better = 0;
    for (int h = 0; h < G; ++h) {
      const uint32_t kh = gkey[h];
      better += (kh > kg) | ((kh == kg) & (h < g));
    }
    kept[g] = better < p.topk_groups;
  }
}

template <int V>
__device__ __forceinline__ void local_best(const uint32_t (&key)[V], const float (&val)[V], uint32_t& bk, int& bj,
                                           float& bv) {
  bk = 0, bj = 0, bv = val[0];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    if (key[j] > bk) bk = key[j], bj = j, bv = val[j];
  }
}

template <typename T, int V, bool kGrouped>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) router_kernel(const RouterParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gwarp = blockIdx.x * kWarpsPerBlock + warp, nwarps = gridDim.x * kWarpsPerBlock;
  const int num_tokens = detail::resolve_num_tokens(p.num_tokens, p.num_tokens_device, p.rows, p.error,
                                                    KernelId::kRouter, blockIdx.x == 0 && threadIdx.x == 0);
  if (p.num_tokens_out != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *p.num_tokens_out = num_tokens;
  const int E = p.num_experts, K = p.topk, e0 = lane * V;

  float bias[V];
#pragma unroll
  for (int j = 0; j < V; ++j) bias[j] = kGrouped && p.bias != nullptr && e0 + j < E ? __ldg(p.bias + e0 + j) : 0.0f;
  float* sp = reinterpret_cast<float*>(smem + warp * p.warp_smem_bytes);  // [E] s' of the token
  uint32_t* gkey = reinterpret_cast<uint32_t*>(sp + E);                   // [G]
  uint8_t* kept = reinterpret_cast<uint8_t*>(gkey + p.num_groups);        // [G]

  for (int t = gwarp; t < num_tokens; t += nwarps) {
    float val[V];  // grouped: s (unbiased); softmax: the logit
    uint32_t key[V];
    load_logits<T, V>(p, t, e0, val);
    if constexpr (kGrouped) {
      float sb[V];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        val[j] = m::sigmoid(val[j]);
        sb[j] = m::fadd(val[j], bias[j]);
        key[j] = e0 + j < E ? m::order_key(sb[j]) : 0u;
      }
      if (p.use_groups) {
        __syncwarp();  // the previous token's readers of sp / kept are done
#pragma unroll
        for (int j = 0; j < V; ++j)
          if (e0 + j < E) sp[e0 + j] = sb[j];
        __syncwarp();
        score_groups(p, sp, gkey, lane);
        __syncwarp();
        rank_groups(p, gkey, kept, lane);
        __syncwarp();
        int g = e0 / p.group_size, r = e0 - g * p.group_size;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          if (e0 + j < E && !kept[g]) key[j] = 0u;
          if (++r == p.group_size) r = 0, ++g;
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) key[j] = e0 + j < E ? m::order_key(val[j]) : 0u;
    }

    uint32_t bk;
    int bj;
    float bv;
    local_best<V>(key, val, bk, bj, bv);
    int my_idx = 0;
    float my_x = 0.0f, sum = 0.0f, vmax = 0.0f;
    for (int k = 0; k < K; ++k) {
      const uint32_t best = __reduce_max_sync(kFullMask, bk);
      const int w = __ffs(__ballot_sync(kFullMask, bk == best)) - 1;
      const int wj = __shfl_sync(kFullMask, bj, w);
      const float wv = __shfl_sync(kFullMask, bv, w);
      float x = wv;
      if constexpr (!kGrouped) {
        if (k == 0) vmax = wv;
        x = m::exp(m::fsub(wv, vmax));
      }
      sum = m::fadd(sum, x);
      if (lane == k) my_idx = w * V + wj, my_x = x;
      if (lane == w) {
#pragma unroll
        for (int j = 0; j < V; ++j)
          if (j == wj) key[j] = 0u;
        local_best<V>(key, val, bk, bj, bv);
      }
    }
    float denom = sum;
    if constexpr (!kGrouped) {
      if (!p.renormalize) {
        float part = 0.0f;
#pragma unroll
        for (int j = 0; j < V; ++j)
          if (e0 + j < E) part = m::fadd(part, m::exp(m::fsub(val[j], vmax)));
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) part = m::fadd(part, __shfl_xor_sync(kFullMask, part, off));
        denom = part;
      }
    }
    if (lane < K) {
      const size_t o = static_cast<size_t>(t) * K + lane;
      p.topk_idx[o] = my_idx;
      p.topk_weights[o] = m::fmul(m::fdiv(my_x, denom), p.scaling);
    }
  }
}

// ---- kWarpGrouped -------------------------------------------------------------------------------

template <typename T, int V>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) warp_router_kernel(const RouterParams p) {
  constexpr int E = 32 * V;
  const int lane = threadIdx.x & 31;
  const int gwarp = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5), nwarps = gridDim.x * kWarpsPerBlock;
  const int num_tokens = detail::resolve_num_tokens(p.num_tokens, p.num_tokens_device, p.rows, p.error,
                                                    KernelId::kRouter, blockIdx.x == 0 && threadIdx.x == 0);
  if (p.num_tokens_out != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *p.num_tokens_out = num_tokens;
  if (gwarp >= num_tokens) return;  // whole warps: every collective below runs on a full warp

  const detail::WarpRoute r{p.topk, p.topk_groups, p.lanes_per_group, p.use_groups, p.scaling, p.topk_idx,
                            p.topk_weights};
  float bias[V];
  detail::load_lane_bias<V>(p.bias, lane, bias);
  for (int t = gwarp; t < num_tokens; t += nwarps) {
    float s[V];
    detail::load_lane_scores<T, V>(static_cast<const T*>(p.logits) + static_cast<size_t>(t) * E, lane, s);
    detail::warp_route_token<V>(r, lane, t, s, bias);
  }
}

template <typename T>
void launch_warp(const RouterParams& p, int vpl, dim3 grid, cudaStream_t s) {
  switch (vpl) {
    case 2: warp_router_kernel<T, 2><<<grid, kWarpsPerBlock * 32, 0, s>>>(p); break;
    case 4: warp_router_kernel<T, 4><<<grid, kWarpsPerBlock * 32, 0, s>>>(p); break;
    case 8: warp_router_kernel<T, 8><<<grid, kWarpsPerBlock * 32, 0, s>>>(p); break;
    case 16: warp_router_kernel<T, 16><<<grid, kWarpsPerBlock * 32, 0, s>>>(p); break;
    default: EPKIT_FAIL("route: no warp_grouped kernel for ", vpl, " experts per lane");
  }
}

template <typename T, bool kGrouped>
void launch_t(const RouterParams& p, int vpl, dim3 grid, size_t smem, cudaStream_t s) {
  switch (vpl) {
    case 1: router_kernel<T, 1, kGrouped><<<grid, kWarpsPerBlock * 32, smem, s>>>(p); break;
    case 2: router_kernel<T, 2, kGrouped><<<grid, kWarpsPerBlock * 32, smem, s>>>(p); break;
    case 4: router_kernel<T, 4, kGrouped><<<grid, kWarpsPerBlock * 32, smem, s>>>(p); break;
    case 8: router_kernel<T, 8, kGrouped><<<grid, kWarpsPerBlock * 32, smem, s>>>(p); break;
    case 16: router_kernel<T, 16, kGrouped><<<grid, kWarpsPerBlock * 32, smem, s>>>(p); break;
    default: EPKIT_FAIL("route: no kernel for ", vpl, " experts per lane");
  }
}

int pow2_ceil(int x) {
  int p = 1;
  while (p < x) p <<= 1;
  return p;
}

}  // namespace

void route(const RouterConfig& c, const RouterArgs& a, cudaStream_t stream) {
  check_router_args(c, a);
  int64_t rows = a.logits.shape[0];
  rows = a.topk_idx.shape[0] < rows ? a.topk_idx.shape[0] : rows;
  rows = a.topk_weights.shape[0] < rows ? a.topk_weights.shape[0] : rows;
  const bool on_device = a.num_tokens_device != nullptr;
  if (!on_device && a.num_tokens == 0) {  // nothing to route; the m the later kernels read is still 0
    if (a.num_tokens_out) EPKIT_CUDA_CHECK(cudaMemsetAsync(a.num_tokens_out, 0, sizeof(int32_t), stream));
    return;
  }

  const bool grouped = c.mode == RouterMode::kGroupedTopK;
  const bool bf16 = a.logits.dtype == DType::kBF16;
  const int E = c.num_experts, G = c.num_groups;
  const int vpl = pow2_ceil((E + 31) / 32);
  const int elem = bf16 ? 2 : 4;

  RouterParams p{};
  p.logits = a.logits.data;
  p.bias = grouped ? static_cast<const float*>(a.bias.data) : nullptr;
  p.topk_idx = static_cast<int32_t*>(a.topk_idx.data);
  p.topk_weights = static_cast<float*>(a.topk_weights.data);
  p.num_experts = E;
  p.topk = c.topk;
  p.num_groups = G;
  p.group_size = E / G;
  p.topk_groups = c.topk_groups;
  p.lanes_per_group = G <= 32 ? 32 / pow2_ceil(G) : 1;
  p.use_groups = grouped && c.topk_groups < G;
  p.warp_smem_bytes = p.use_groups ? ((E * 4 + G * 4 + G + 15) / 16) * 16 : 0;
  p.renormalize = c.renormalize;
  p.vec_loads = E == 32 * vpl && (vpl * elem) % 16 == 0 && reinterpret_cast<uintptr_t>(a.logits.data) % 16 == 0;
  p.scaling = c.routed_scaling;
  p.num_tokens = a.num_tokens;
  p.num_tokens_device = a.num_tokens_device;
  p.num_tokens_out = a.num_tokens_out;
  p.rows = static_cast<int>(rows);
  p.error = a.error;

  const int64_t cover = on_device ? rows : a.num_tokens;
  int64_t blocks = (cover + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const int64_t cap = static_cast<int64_t>(detail::sm_count()) * 16;
  blocks = blocks < 1 ? 1 : (blocks > cap ? cap : blocks);
  const dim3 grid(static_cast<unsigned>(blocks));
  if (choose_router_kernel(c, a) == RouterKernel::kWarpGrouped) {
    p.lanes_per_group = p.use_groups ? 32 / G : 32;
    p.warp_smem_bytes = 0;
    bf16 ? launch_warp<uint16_t>(p, vpl, grid, stream) : launch_warp<float>(p, vpl, grid, stream);
    EPKIT_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const size_t smem = static_cast<size_t>(p.warp_smem_bytes) * kWarpsPerBlock;
  if (grouped) {
    bf16 ? launch_t<uint16_t, true>(p, vpl, grid, smem, stream) : launch_t<float, true>(p, vpl, grid, smem, stream);
  } else {
    bf16 ? launch_t<uint16_t, false>(p, vpl, grid, smem, stream) : launch_t<float, false>(p, vpl, grid, smem, stream);
  }
  EPKIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace epkit::moe
