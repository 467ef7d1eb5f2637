// The weight-streaming grouped GEMM for decode (config "swapab_stream_128x64x128_c1x1"): epkit's own
// kernel, where CUTLASS's grouped GEMM cannot reach the weight-read floor.
//
// Why ours: CUTLASS's grouped scheduler tiles each group with the token tile chosen on the host, so a
// group with more rows than the expected count takes a second token tile and reads its weights again
// (uneven routing: 54-68% of the HBM read rate where even counts reach 78-86%), and each CTA of a
// non-persistent group pays its pipeline fill. This kernel reads the counts on the device and walks
// units of equal cost: every weight block of a group is streamed once per 64 of the group's rows.
//
// The work:
// - A unit is (group g, weight block nb of 128 output features, token chunk c of up to 64 rows), over
//   all of K. Units are numbered group by group, weight block by weight block, chunk by chunk (the
//   chunks of one weight block are adjacent, so a group above 64 rows re-reads that block from L2),
//   from each group's device count: ceil(N / 128) * ceil(count / 64) units, none for an empty group.
//   Each CTA (one per SM, persistent) builds that prefix in shared memory from the counts and takes
//   units blockIdx.x, blockIdx.x + gridDim.x, ...; every unit streams one 128 x K weight block, so the
//   split is even whatever the counts.
// - One producer warp issues TMA loads of a stage (the unit's 128 x 128 weight tile, 16 KB, and one
//   8 x 128 token tile per 8 of the chunk's rows) into an 8-deep ring with mbarriers, running ahead
//   across units, so the ring fills once per CTA, not once per tile.
// - Four consumer warps each own 32 of the block's 128 weight rows (the M side of mma.sync m16n8k32
//   e4m3, two 16-row tiles) against all of the chunk's tokens (the N side: 1, 2, 4 or 8 tiles of 8,
//   chosen per unit from the device count). Fragments come from the 128-byte-swizzled stage by
//   ldmatrix. After each 128-deep K block the warp promotes: total += block_sum * weight_scale[nb, kb]
//   * token_scale[row, kb], the DeepSeek-V3 1 x 128 / 128 x 128 block scaling in fp32; the other
//   warps' mma keep the tensor cores busy meanwhile (mma.sync is synchronous per warp, so there is no
//   wait on an asynchronous group as in a wgmma mainloop).
// - The epilogue writes bf16 straight from the accumulators, only rows < count and features < N.
// - Split K where the units are too few for the grid (at most half the CTAs: the shared expert, G = 1,
//   or a handful of experts): each unit's K blocks are cut into up to gridDim / units parts of at least
//   14 blocks, each part stores its fp32 tile to a workspace slot, and the part that takes the last
//   ticket of the unit's arrival counter sums the parts in part order (deterministic) and writes the
//   output, then zeroes the counter for the next run. The choice is made on the device from the counts.
//
// Counts are clamped and reported exactly as the CUTLASS path does (masked: to [0, rows]; packed: a
// group outside [0, min(offsets[g + 1], R)) is skipped). No wait depends on another CTA or on the
// host: the consumers wait for TMA completions of their own CTA, the producer for its consumers.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "epkit/error.hpp"
#include "moe/device_errors.cuh"
#include "moe/gemm/gemm_impl.hpp"
#include "moe/gemm/stream_schedule.hpp"

namespace epkit::moe::detail {

namespace {

using stream::kBlockRows;
using stream::kChunkRows;
using stream::Unit;
constexpr int kStageK = 128;         // K per stage: one scale block
constexpr int kConsumerWarps = 4;    // each owns 32 weight rows
constexpr int kThreads = (kConsumerWarps + 1) * 32;
constexpr int kStages = 8;
constexpr int kWeightTileBytes = kBlockRows * kStageK;  // 16 KB
constexpr int kTokenTileBytes = 8 * kStageK;            // one 8-row TMA box, 1 KB
constexpr int kStageBytes = kWeightTileBytes + (kChunkRows / 8) * kTokenTileBytes;  // 24 KB
// Shared memory: the ring, the 2 x kStages barriers, then per group the unit prefix (G + 1), the first
// token row and the clamped count, the split-K flag; 1 KB of slack to align the ring to the 128-byte swizzle's 1 KB atom.
size_t smem_bytes(int groups) {
  return 1024 + static_cast<size_t>(kStages) * kStageBytes + 2 * kStages * sizeof(uint64_t) +
         (3 * static_cast<size_t>(groups) + 2) * sizeof(int);
}

struct StreamParams {  // CUtensorMap is 64-byte aligned itself
  CUtensorMap weights;  // [G * N, K] fp8, box 128 x 128, 128-byte swizzle
  CUtensorMap tokens;   // [G * rows (masked) or R (packed), K] fp8, box 8 x 128, 128-byte swizzle
  const float* a_scale;
  const float* b_scale;
  uint16_t* d;
  const int32_t* counts;
  const int32_t* offsets;
  DeviceErrorRecord* error;
  float* partials;     // split-K: [gridDim.x][kConsumerWarps * 32][64] fp32, one tile per split unit
  uint32_t* arrivals;  // split-K: [gridDim.x] splits arrived per unsplit unit; 0 between runs
  int groups, n, k, rows;
  int packed;
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// Waits until the phase of the given parity has completed (the phase before the current one counts
// as completed, which lets the producer's first pass over the ring through).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, int x, int y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

__device__ __forceinline__ void ldsm_x2(uint32_t addr, uint32_t& r0, uint32_t& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(addr));
}

// Two e4m3 values as f16x2 (exact: every e4m3 value is an f16 value): bytes 0-1 of v (lo), 2-3 (hi).
__device__ __forceinline__ uint32_t e4m3x2_lo(uint32_t v) {
  uint32_t r;
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e4m3x2 %0, l;\n}" : "=r"(r) : "r"(v));
  return r;
}
__device__ __forceinline__ uint32_t e4m3x2_hi(uint32_t v) {
  uint32_t r;
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e4m3x2 %0, h;\n}" : "=r"(r) : "r"(v));
  return r;
}

// One 16 x 8 x 32 e4m3 product added to c, as two chained f16 m16n8k16 mma. Hopper has no e4m3
// mma.sync in hardware: ptxas lowers mma.m16n8k32.e4m3 to two HMMA from zero plus four FADD into c;
// converting here and chaining into c saves the FADDs. The K order inside the step is permuted the
// same way for A and B (a lane's 4 bytes k = 4t..4t+3 become f16 slots 2t, 2t+1 and 2t+8, 2t+9),
// which a dot product does not see.
__device__ __forceinline__ void mma_e4m3(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // h = 0: the fragment's k 0-15 (a0, a1, b0); h = 1: k 16-31 (a2, a3, b1)
    const uint32_t x = a[2 * h], y = a[2 * h + 1], b = h ? b1 : b0;
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(e4m3x2_lo(x)), "r"(e4m3x2_lo(y)), "r"(e4m3x2_hi(x)), "r"(e4m3x2_hi(y)), "r"(e4m3x2_lo(b)),
          "r"(e4m3x2_hi(b)));
  }
}

// Byte offset of (row, 16-byte chunk) in a tile of 128-byte rows written by TMA with the 128-byte
// swizzle: the chunk index is XORed with the row's position in its 8-row (1 KB) atom.
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

__device__ __forceinline__ uint16_t to_bf16(float x) {
  const __nv_bfloat16 h = __float2bfloat16_rn(x);
  return *reinterpret_cast<const uint16_t*>(&h);
}

// One consumer warp's unit with NT token tiles of 8: returns the ring position after it.
template <int NT>
__device__ __forceinline__ int consume_unit(const StreamParams& p, const Unit& unit, int splits, int unit_index,
                                            int row0, uint8_t* ring, uint64_t* full, uint64_t* empty, int* last_flag,
                                            int it) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int S = p.k / kStageK, NB = (p.n + kBlockRows - 1) / kBlockRows;
  const float* sb_row = p.b_scale + (static_cast<int64_t>(unit.g) * NB + unit.nb) * S;
  // The scales of this lane's token columns j * 8 + 2 * (lane & 3) + c of the chunk: row t of the
  // chunk's scales at sa + t * S.
  const float* sa = p.a_scale + (static_cast<int64_t>(row0) + unit.tok0) * S;
  const int col0 = 2 * (lane & 3);
  // ldmatrix row addresses. A (weights): lane's matrix q = lane / 8 is rows (q & 1) * 8 + lane % 8 of
  // the 16-row tile, K chunk q / 2 of the 32-deep step. B (tokens): matrix q is token tile (q / 2) of
  // the pair, K chunk q & 1.
  const int q = lane >> 3, r8 = lane & 7;
  const int a_row0 = warp * 32 + (q & 1) * 8 + r8;
  const int b_row = (q >> 1) * 8 + r8;

  float total[2][NT][4];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) total[m][j][i] = 0.f;

  for (int kb = unit.kb0; kb < unit.kb1; ++kb, ++it) {
    const int s = it % kStages;
    const uint32_t parity = (it / kStages) & 1;
    // The scales do not depend on the stage: load them before waiting for it.
    const float wscale = __ldg(sb_row + kb);
    float tscale[NT][2];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int t = j * 8 + col0 + c;
        tscale[j][c] = t < unit.ntok ? __ldg(sa + t * S + kb) : 0.f;
      }

    mbar_wait(smem_addr(&full[s]), parity);
    const uint32_t w_base = smem_addr(ring + static_cast<size_t>(s) * kStageBytes);
    const uint32_t t_base = w_base + kWeightTileBytes;
    float acc[2][NT][4];
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[m][j][i] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kStageK / 32; ++ks) {
      uint32_t a[2][4];
#pragma unroll
      for (int m = 0; m < 2; ++m)
        ldsm_x4(w_base + swz(a_row0 + m * 16, ks * 2 + (q >> 1)), a[m][0], a[m][1], a[m][2], a[m][3]);
      uint32_t b[NT][2];
      if constexpr (NT == 1) {
        ldsm_x2(t_base + swz(r8, ks * 2 + (q & 1)), b[0][0], b[0][1]);
      } else {
#pragma unroll
        for (int j = 0; j < NT; j += 2)
          ldsm_x4(t_base + swz(j * 8 + b_row, ks * 2 + (q & 1)), b[j][0], b[j][1], b[j + 1][0], b[j + 1][1]);
      }
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int j = 0; j < NT; ++j) mma_e4m3(acc[m][j], a[m], b[j][0], b[j][1]);
    }
    // The fragments are in registers: hand the stage back (release orders the ldmatrix reads first).
    __syncwarp();
    if (lane == 0) mbar_arrive(smem_addr(&empty[s]));
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) total[m][j][i] = fmaf(acc[m][j][i], wscale * tscale[j][i & 1], total[m][j][i]);
  }

  if (splits > 1) {
    // Split K: every part stores its tile (each thread its own 2 * NT * 4 values, in fragment order);
    // the part that arrives last sums the parts in part order (deterministic) and writes the output.
    const int consumer = warp * 32 + lane;
    float4* mine = reinterpret_cast<float4*>(p.partials + (static_cast<int64_t>(unit_index) * kConsumerWarps * 32 +
                                                           consumer) * 64);
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int j = 0; j < NT; ++j)
        __stcg(mine + m * NT + j, make_float4(total[m][j][0], total[m][j][1], total[m][j][2], total[m][j][3]));
    __threadfence();
    asm volatile("bar.sync 1, %0;" ::"n"(kConsumerWarps * 32) : "memory");
    if (consumer == 0) {
      const uint32_t ticket = atomicAdd(p.arrivals + unit.base, 1u);
      *last_flag = ticket == static_cast<uint32_t>(splits - 1);
      if (ticket == static_cast<uint32_t>(splits - 1)) p.arrivals[unit.base] = 0;  // ready for the next run
    }
    asm volatile("bar.sync 1, %0;" ::"n"(kConsumerWarps * 32) : "memory");
    if (!*last_flag) return it;
    __threadfence();
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) total[m][j][i] = 0.f;
    for (int part = 0; part < splits; ++part) {
      const float4* src = reinterpret_cast<const float4*>(
          p.partials + (static_cast<int64_t>(unit.base * splits + part) * kConsumerWarps * 32 + consumer) * 64);
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const float4 v = __ldcg(src + m * NT + j);
          total[m][j][0] += v.x;
          total[m][j][1] += v.y;
          total[m][j][2] += v.z;
          total[m][j][3] += v.w;
        }
    }
  }

  // Epilogue: accumulator (row, column) = (output feature, token); c0, c1 are row lane / 4 and
  // columns 2 * (lane % 4) + {0, 1}; c2, c3 the row 8 below.
  const int64_t out_row0 = static_cast<int64_t>(row0) + unit.tok0;
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int feature = unit.nb * kBlockRows + warp * 32 + m * 16 + h * 8 + (lane >> 2);
      if (feature >= p.n) continue;
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int t = j * 8 + col0 + c;
          if (t < unit.ntok) p.d[(out_row0 + t) * p.n + feature] = to_bf16(total[m][j][h * 2 + c]);
        }
    }
  return it;
}

__global__ void __launch_bounds__(kThreads, 1) stream_grouped_gemm_kernel(const __grid_constant__ StreamParams p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* ring = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + static_cast<size_t>(kStages) * kStageBytes);
  uint64_t* empty = full + kStages;
  int* prefix = reinterpret_cast<int*>(empty + kStages);  // [G + 1]
  int* row0s = prefix + p.groups + 1;                     // [G]
  int* counts = row0s + p.groups;                         // [G]
  const int G = p.groups;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  // Each group's rows, clamped or skipped as ExpertLayout says (CTA 0 reports), and its unit count.
  for (int g = tid; g < G; g += kThreads) {
    int count = p.counts[g];
    int row0 = 0;
    if (!p.packed) {
      row0 = g * p.rows;
      if (count < 0 || count > p.rows) {
        if (blockIdx.x == 0)
          record_violation(p.error, KernelId::kGroupedGemm, Violation::kExpertCount, g, count, p.rows);
        count = count < 0 ? 0 : p.rows;
      }
    } else {
      const int start = p.offsets[g], next = p.offsets[g + 1];
      const int64_t end = static_cast<int64_t>(start) + count;
      const int64_t limit = next < p.rows ? next : p.rows;
      if (start < 0 || count < 0 || end > limit) {
        if (blockIdx.x == 0)
          record_violation(p.error, KernelId::kGroupedGemm, Violation::kPackedRange, g, end, limit);
        count = 0;
      } else {
        row0 = start;
      }
    }
    row0s[g] = row0;
    counts[g] = count;
    prefix[g + 1] = stream::group_units(count, p.n);
  }
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(smem_addr(&full[s]), 1);
      mbar_init(smem_addr(&empty[s]), kConsumerWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp == 0) {  // inclusive scan of the unit counts, 32 groups at a time
    int running = 0;
    for (int base = 0; base < G; base += 32) {
      const int g = base + lane;
      int v = g < G ? prefix[g + 1] : 0;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += y;
      }
      if (g < G) prefix[g + 1] = running + v;
      running += __shfl_sync(0xffffffffu, v, 31);
    }
    if (lane == 0) prefix[0] = 0;
  }
  __syncthreads();
  // Fewer unsplit units than half the CTAs (the shared expert, a few experts at decode): split K so
  // that every CTA streams weights, down to 4 K blocks a part. Every CTA computes the same value.
  const int S = p.k / kStageK;
  const int base_units = prefix[G];
  const int splits = stream::choose_splits(base_units, static_cast<int>(gridDim.x), S);
  const int units = base_units * splits;

  if (warp == kConsumerWarps) {  // producer
    if (lane != 0) return;
    int it = 0;
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
      const Unit unit = stream::decode_unit(u, splits, S, prefix, counts, G);
      const int tiles = (unit.ntok + 7) / 8;
      const uint32_t bytes = kWeightTileBytes + tiles * kTokenTileBytes;
      const int wrow = unit.g * p.n + unit.nb * kBlockRows;
      const int trow = row0s[unit.g] + unit.tok0;
      for (int kb = unit.kb0; kb < unit.kb1; ++kb, ++it) {
        const int s = it % kStages;
        const uint32_t parity = ((it / kStages) & 1) ^ 1;
        mbar_wait(smem_addr(&empty[s]), parity);
        const uint32_t bar = smem_addr(&full[s]);
        mbar_expect_tx(bar, bytes);
        const uint32_t dst = smem_addr(ring + static_cast<size_t>(s) * kStageBytes);
        tma_load(dst, &p.weights, kb * kStageK, wrow, bar);
        for (int t = 0; t < tiles; ++t)
          tma_load(dst + kWeightTileBytes + t * kTokenTileBytes, &p.tokens, kb * kStageK, trow + t * 8, bar);
      }
    }
    return;
  }

  int it = 0;
  int* last_flag = counts + G;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const Unit unit = stream::decode_unit(u, splits, S, prefix, counts, G);
    const int row0 = row0s[unit.g];
    const int tiles = (unit.ntok + 7) / 8;
    if (tiles <= 1) it = consume_unit<1>(p, unit, splits, u, row0, ring, full, empty, last_flag, it);
    else if (tiles <= 2) it = consume_unit<2>(p, unit, splits, u, row0, ring, full, empty, last_flag, it);
    else if (tiles <= 4) it = consume_unit<4>(p, unit, splits, u, row0, ring, full, empty, last_flag, it);
    else it = consume_unit<8>(p, unit, splits, u, row0, ring, full, empty, last_flag, it);
  }
}

void cuda_check(cudaError_t e, const char* what, const GemmConfig& cfg) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    EPKIT_FAIL("grouped GEMM ", to_string(cfg), ": ", what, " failed: ", cudaGetErrorString(e));
  }
}

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(const GemmConfig& cfg) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  cuda_check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q),
             "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)", cfg);
  EPKIT_CHECK(q == cudaDriverEntryPointSuccess && fn != nullptr,
              "grouped GEMM: the driver has no cuTensorMapEncodeTiled (needs a CUDA 12+ driver)");
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
}

class StreamGroupedGemm final : public GemmImpl {
 public:
  StreamGroupedGemm(const GroupedGemmShape& shape, const GemmConfig& cfg) : GemmImpl(shape, cfg) {
    cuda_check(cudaGetDevice(&device_), "cudaGetDevice", cfg_);
    int major = 0, smem_optin = 0;
    cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_), "cudaDeviceGetAttribute", cfg_);
    cuda_check(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_), "cudaDeviceGetAttribute",
               cfg_);
    cuda_check(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_),
               "cudaDeviceGetAttribute", cfg_);
    EPKIT_CHECK(major == 9, "grouped GEMM: device ", device_, " has compute capability ", major,
                ".x; the kernels are built for sm_90a (Hopper) only");
    smem_ = smem_bytes(shape_.num_groups);
    EPKIT_CHECK(smem_ <= static_cast<size_t>(smem_optin), "grouped GEMM ", to_string(cfg_), ": needs ", smem_,
                " bytes of shared memory per block at num_groups = ", shape_.num_groups, ", device ", device_,
                " allows ", smem_optin);
    cuda_check(cudaFuncSetAttribute(stream_grouped_gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem_)),
               "cudaFuncSetAttribute", cfg_);
    encode_ = tensor_map_encoder(cfg_);
    // Split K: one partial tile per CTA of the grid, one arrival counter per unsplit unit (zeroed once;
    // the last part of each unit zeroes its counter again).
    const size_t partial_bytes = static_cast<size_t>(sm_count_) * kConsumerWarps * 32 * 64 * sizeof(float);
    ws_bytes_ = partial_bytes + static_cast<size_t>(sm_count_) * sizeof(uint32_t);
    void* w = nullptr;
    cuda_check(cudaMalloc(&w, ws_bytes_), "cudaMalloc of the split-K workspace", cfg_);
    ws_ = static_cast<char*>(w);
    partials_ = reinterpret_cast<float*>(ws_);
    arrivals_ = reinterpret_cast<uint32_t*>(ws_ + partial_bytes);
    const cudaError_t e = cudaMemset(arrivals_, 0, static_cast<size_t>(sm_count_) * sizeof(uint32_t));
    if (e != cudaSuccess) {
      cudaFree(ws_);
      cuda_check(e, "cudaMemset of the split-K counters", cfg_);
    }
  }

  ~StreamGroupedGemm() override {
    if (ws_) cudaFree(ws_);
  }

  void run(const GemmLaunch& l, cudaStream_t stream) override {
    const GroupedGemmShape& s = shape_;
    const bool packed = s.layout == ExpertLayout::kPacked;
    StreamParams p{};
    encode(&p.weights, l.b, static_cast<uint64_t>(s.num_groups) * s.n, kBlockRows);
    const uint64_t token_rows = packed ? static_cast<uint64_t>(s.rows) : static_cast<uint64_t>(s.num_groups) * s.rows;
    // No token rows: every count clamps to 0 (or its group is skipped), so no unit reads the map.
    if (token_rows > 0) encode(&p.tokens, l.a, token_rows, 8);
    p.a_scale = l.a_scale;
    p.b_scale = l.b_scale;
    p.d = l.d;
    p.counts = l.counts;
    p.offsets = l.offsets;
    p.error = l.error;
    p.partials = partials_;
    p.arrivals = arrivals_;
    p.groups = s.num_groups;
    p.n = s.n;
    p.k = s.k;
    p.rows = s.rows;
    p.packed = packed ? 1 : 0;
    stream_grouped_gemm_kernel<<<sm_count_, kThreads, smem_, stream>>>(p);
    cuda_check(cudaGetLastError(), "launch of the streaming kernel", cfg_);
  }

  size_t workspace_bytes() const override { return ws_bytes_; }

 private:
  // A row-major [rows, K] fp8 tensor read in boxes of box_rows x 128 with the 128-byte swizzle
  // (rows past the end read as zeros).
  void encode(CUtensorMap* map, const void* base, uint64_t rows, uint32_t box_rows) const {
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(shape_.k), rows};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(shape_.k)};
    const cuuint32_t box[2] = {static_cast<cuuint32_t>(kStageK), box_rows};
    const cuuint32_t elem[2] = {1, 1};
    const CUresult r = encode_(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box, elem,
                               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    EPKIT_CHECK(r == CUDA_SUCCESS, "grouped GEMM ", to_string(cfg_), ": cuTensorMapEncodeTiled failed (CUresult ",
                static_cast<int>(r), ") for a [", rows, ", ", shape_.k, "] operand");
  }

  int sm_count_ = 0;
  size_t smem_ = 0;
  char* ws_ = nullptr;
  size_t ws_bytes_ = 0;
  float* partials_ = nullptr;
  uint32_t* arrivals_ = nullptr;
  PFN_cuTensorMapEncodeTiled_v12000 encode_ = nullptr;
};

}  // namespace

std::unique_ptr<GemmImpl> make_stream_gemm(const GroupedGemmShape& shape, const GemmConfig& cfg) {
  return std::make_unique<StreamGroupedGemm>(shape, cfg);
}

}  // namespace epkit::moe::detail
