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
// - Two consumer warpgroups each own 64 of the block's 128 weight rows: per stage four wgmma
//   m64nNk32 e4m3 (N = 8, 16, 32 or 64: the chunk's rows rounded up, chosen per unit from the device
//   count), both operands straight from the swizzled stage, then wait and promote: total +=
//   block_sum * weight_scale[nb, kb] * token_scale[row, kb], the DeepSeek-V3 1 x 128 / 128 x 128 block
//   scaling in fp32, while the other warpgroup's wgmma keep the tensor cores busy. (A first version on
//   mma.sync was bound by the legacy tensor path: sm_90 has no e4m3 mma.sync, its f16 HMMA with fp32
//   accumulation ran at ~240 TFLOP/s on an H100, 56-59% of HBM at 64 tokens.)
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
#include "moe/gemm/group_rows.cuh"
#include "moe/gemm/gemm_impl.hpp"
#include "moe/gemm/stream_schedule.hpp"

namespace epkit::moe::detail {

namespace {

using stream::kBlockRows;
using stream::kChunkRows;
using stream::Unit;
constexpr int kStageK = 128;         // K per stage: one scale block
constexpr int kConsumerWarps = 8;    // two warpgroups, each 64 of the block's 128 weight rows
constexpr int kConsumerThreads = kConsumerWarps * 32;
constexpr int kSlotFloats = 32;      // split K: per consumer thread, the accumulators at 64 tokens
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
  float* partials;     // split-K: [gridDim.x][kConsumerThreads][kSlotFloats] fp32, one tile per split unit
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

// The shared-memory matrix descriptor of wgmma for a K-major tile of 128-byte rows written by TMA with
// the 128-byte swizzle: start address / 16, 8-row groups 1024 bytes apart (stride byte offset), swizzle
// mode 1 (128 B). A K step of 32 bytes inside the swizzled row advances the start address by 32.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }

// Keeps the compiler from moving accumulator accesses across the asynchronous wgmma section.
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D[64 x N] (+)= A[64 x 32] . B[N x 32]^T, e4m3 in, fp32 accumulators (the m64nNk32 fragment: per
// n8 tile j, d[4j .. 4j+3] = rows lane/4 and lane/4 + 8 of the warp's 16, columns 2 (lane % 4) + {0, 1}).
template <int N>
struct Wgmma;

#define EPKIT_WGMMA_OPEN(n) \
  "{\n .reg .pred p;\n setp.ne.b32 p, %" #n ", 0;\n wgmma.mma_async.sync.aligned.m64n"
#define EPKIT_WGMMA_CLOSE ", p, 1, 1;\n}"

template <>
struct Wgmma<8> {
  __device__ __forceinline__ static void run(float (&d)[4], uint64_t a, uint64_t b, int accumulate) {
    asm volatile(EPKIT_WGMMA_OPEN(6) "8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, %4, %5" EPKIT_WGMMA_CLOSE
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "l"(a), "l"(b), "r"(accumulate));
  }
};

template <>
struct Wgmma<16> {
  __device__ __forceinline__ static void run(float (&d)[8], uint64_t a, uint64_t b, int accumulate) {
    asm volatile(EPKIT_WGMMA_OPEN(10) "16k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9" EPKIT_WGMMA_CLOSE
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "l"(a), "l"(b), "r"(accumulate));
  }
};

template <>
struct Wgmma<32> {
  __device__ __forceinline__ static void run(float (&d)[16], uint64_t a, uint64_t b, int accumulate) {
    asm volatile(EPKIT_WGMMA_OPEN(18)
                 "32k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, "
                 "%17" EPKIT_WGMMA_CLOSE
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "l"(a), "l"(b), "r"(accumulate));
  }
};

template <>
struct Wgmma<64> {
  __device__ __forceinline__ static void run(float (&d)[32], uint64_t a, uint64_t b, int accumulate) {
    asm volatile(EPKIT_WGMMA_OPEN(34)
                 "64k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, "
                 "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33" EPKIT_WGMMA_CLOSE
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
                   "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31])
                 : "l"(a), "l"(b), "r"(accumulate));
  }
};

#undef EPKIT_WGMMA_OPEN
#undef EPKIT_WGMMA_CLOSE

__device__ __forceinline__ uint16_t to_bf16(float x) {
  const __nv_bfloat16 h = __float2bfloat16_rn(x);
  return *reinterpret_cast<const uint16_t*>(&h);
}

// One consumer thread's share of a unit with NT token tiles of 8 (wgmma N = 8 NT): returns the ring
// position after it. Warpgroup wg owns weight rows 64 wg .. 64 wg + 63 of the block; warp w of it rows
// 16 w .. 16 w + 15 of those in its accumulator fragment.
template <int NT>
__device__ __forceinline__ int consume_unit(const StreamParams& p, const Unit& unit, int splits, int unit_index,
                                            int row0, uint8_t* ring, uint64_t* full, uint64_t* empty, int* last_flag,
                                            int it) {
  constexpr int kN = NT * 8;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wg = warp >> 2;
  const int S = p.k / kStageK, NB = (p.n + kBlockRows - 1) / kBlockRows;
  const float* sb_row = p.b_scale + (static_cast<int64_t>(unit.g) * NB + unit.nb) * S;
  // The scales of this lane's token columns j * 8 + 2 * (lane & 3) + c of the chunk: row t of the
  // chunk's scales at sa + t * S.
  const float* sa = p.a_scale + (static_cast<int64_t>(row0) + unit.tok0) * S;
  const int col0 = 2 * (lane & 3);

  float total[NT * 4];
#pragma unroll
  for (int i = 0; i < NT * 4; ++i) total[i] = 0.f;
  float acc[NT * 4];
#pragma unroll
  for (int i = 0; i < NT * 4; ++i) acc[i] = 0.f;

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
    const uint32_t w_base = smem_addr(ring + static_cast<size_t>(s) * kStageBytes) + wg * 64 * kStageK;
    const uint32_t t_base = smem_addr(ring + static_cast<size_t>(s) * kStageBytes) + kWeightTileBytes;
    fence_regs(acc);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kStageK / 32; ++ks)
      Wgmma<kN>::run(acc, smem_desc(w_base + ks * 32), smem_desc(t_base + ks * 32), ks > 0 ? 1 : 0);
    wgmma_commit();
    wgmma_wait_all();
    fence_regs(acc);
    // The warpgroup's reads of the stage are complete: hand it back.
    __syncwarp();
    if (lane == 0) mbar_arrive(smem_addr(&empty[s]));
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) total[j * 4 + i] = fmaf(acc[j * 4 + i], wscale * tscale[j][i & 1], total[j * 4 + i]);
  }

  if (splits > 1) {
    // Split K: every part stores its tile (each thread its own NT * 4 values, in fragment order); the
    // part that arrives last sums the parts in part order (deterministic) and writes the output.
    const int consumer = threadIdx.x;
    float4* mine = reinterpret_cast<float4*>(
        p.partials + (static_cast<int64_t>(unit_index) * kConsumerThreads + consumer) * kSlotFloats);
#pragma unroll
    for (int j = 0; j < NT; ++j)
      __stcg(mine + j, make_float4(total[j * 4], total[j * 4 + 1], total[j * 4 + 2], total[j * 4 + 3]));
    __threadfence();
    asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory");
    if (consumer == 0) {
      const uint32_t ticket = atomicAdd(p.arrivals + unit.base, 1u);
      *last_flag = ticket == static_cast<uint32_t>(splits - 1);
      if (ticket == static_cast<uint32_t>(splits - 1)) p.arrivals[unit.base] = 0;  // ready for the next run
    }
    asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory");
    if (!*last_flag) return it;
    __threadfence();
#pragma unroll
    for (int i = 0; i < NT * 4; ++i) total[i] = 0.f;
    for (int part = 0; part < splits; ++part) {
      const float4* src = reinterpret_cast<const float4*>(
          p.partials + (static_cast<int64_t>(unit.base * splits + part) * kConsumerThreads + consumer) * kSlotFloats);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const float4 v = __ldcg(src + j);
        total[j * 4] += v.x;
        total[j * 4 + 1] += v.y;
        total[j * 4 + 2] += v.z;
        total[j * 4 + 3] += v.w;
      }
    }
  }

  // Epilogue: accumulator (row, column) = (output feature, token); d[4j], d[4j+1] are row lane / 4 and
  // columns 2 (lane % 4) + {0, 1} of tile j, d[4j+2], d[4j+3] the row 8 below.
  const int64_t out_row0 = static_cast<int64_t>(row0) + unit.tok0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int feature = unit.nb * kBlockRows + warp * 16 + h * 8 + (lane >> 2);
    if (feature >= p.n) continue;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int t = j * 8 + col0 + c;
        if (t < unit.ntok) p.d[(out_row0 + t) * p.n + feature] = to_bf16(total[j * 4 + h * 2 + c]);
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
    const GroupRows gr = group_rows(p.counts, p.offsets, g, p.rows, p.packed, blockIdx.x == 0 ? p.error : nullptr);
    row0s[g] = static_cast<int>(gr.row0);  // < 2^31: checked on the host
    counts[g] = gr.count;
    prefix[g + 1] = stream::group_units(gr.count, p.n);
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

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(const GemmConfig& cfg) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  gemm_cuda_check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q),
             "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)", cfg);
  EPKIT_CHECK(q == cudaDriverEntryPointSuccess && fn != nullptr,
              "grouped GEMM: the driver has no cuTensorMapEncodeTiled (needs a CUDA 12+ driver)");
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
}

class StreamGroupedGemm final : public GemmImpl {
 public:
  StreamGroupedGemm(const GroupedGemmShape& shape, const GemmConfig& cfg) : GemmImpl(shape, cfg) {
    const GemmDevice dev = current_gemm_device(cfg_);
    device_ = dev.device;
    sm_count_ = dev.sm_count;
    const int smem_optin = dev.smem_optin;
    // TMA coordinates and the kernel's row indices are int32.
    const int64_t weight_rows = static_cast<int64_t>(shape_.num_groups) * shape_.n;
    const int64_t token_rows = shape_.layout == ExpertLayout::kPacked ? shape_.rows
                                                                      : static_cast<int64_t>(shape_.num_groups) * shape_.rows;
    EPKIT_CHECK(weight_rows < (int64_t{1} << 31) && token_rows < (int64_t{1} << 31), "grouped GEMM ", to_string(cfg_),
                ": ", weight_rows, " weight rows and ", token_rows, " token rows must each be below 2^31");
    smem_ = smem_bytes(shape_.num_groups);
    EPKIT_CHECK(smem_ <= static_cast<size_t>(smem_optin), "grouped GEMM ", to_string(cfg_), ": needs ", smem_,
                " bytes of shared memory per block at num_groups = ", shape_.num_groups, ", device ", device_,
                " allows ", smem_optin);
    // The attribute is the kernel's, not this object's: set it for the largest group count, so that
    // an object built later for fewer groups does not lower it under an earlier one's launch.
    const size_t smem_max = smem_bytes(kMaxGemmGroups);
    EPKIT_CHECK(smem_max <= static_cast<size_t>(smem_optin), "grouped GEMM ", to_string(cfg_), ": needs up to ",
                smem_max, " bytes of shared memory per block, device ", device_, " allows ", smem_optin);
    gemm_cuda_check(cudaFuncSetAttribute(stream_grouped_gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem_max)),
               "cudaFuncSetAttribute", cfg_);
    encode_ = tensor_map_encoder(cfg_);
    // Split K: one partial tile per CTA of the grid, one arrival counter per unsplit unit (zeroed once;
    // the last part of each unit zeroes its counter again).
    const size_t partial_bytes = static_cast<size_t>(sm_count_) * kConsumerThreads * kSlotFloats * sizeof(float);
    ws_bytes_ = partial_bytes + static_cast<size_t>(sm_count_) * sizeof(uint32_t);
    void* w = nullptr;
    gemm_cuda_check(cudaMalloc(&w, ws_bytes_), "cudaMalloc of the split-K workspace", cfg_);
    ws_ = static_cast<char*>(w);
    partials_ = reinterpret_cast<float*>(ws_);
    arrivals_ = reinterpret_cast<uint32_t*>(ws_ + partial_bytes);
    const cudaError_t e = cudaMemset(arrivals_, 0, static_cast<size_t>(sm_count_) * sizeof(uint32_t));
    if (e != cudaSuccess) {
      cudaFree(ws_);
      gemm_cuda_check(e, "cudaMemset of the split-K counters", cfg_);
    }
  }

  ~StreamGroupedGemm() override {
    if (ws_) cudaFree(ws_);
  }

  void run(const GemmLaunch& l, cudaStream_t stream) override {
    const GroupedGemmShape& s = shape_;
    const bool packed = s.layout == ExpertLayout::kPacked;
    // The maps depend on the shape (fixed) and the base pointers: encoded again only when one moves.
    if (l.b != weights_base_) {
      encode(&weights_map_, l.b, static_cast<uint64_t>(s.num_groups) * s.n, kBlockRows);
      weights_base_ = l.b;
    }
    const uint64_t token_rows = packed ? static_cast<uint64_t>(s.rows) : static_cast<uint64_t>(s.num_groups) * s.rows;
    // No token rows: every count clamps to 0 (or its group is skipped), so no unit reads the map.
    if (token_rows > 0 && l.a != tokens_base_) {
      encode(&tokens_map_, l.a, token_rows, 8);
      tokens_base_ = l.a;
    }
    StreamParams p{};
    p.weights = weights_map_;
    p.tokens = tokens_map_;
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
    gemm_cuda_check(cudaGetLastError(), "launch of the streaming kernel", cfg_);
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

  CUtensorMap weights_map_{}, tokens_map_{};
  const void* weights_base_ = nullptr;
  const void* tokens_base_ = nullptr;
  int sm_count_ = 0;
  size_t smem_ = 0;
  char* ws_ = nullptr;
  size_t ws_bytes_ = 0;
  float* partials_ = nullptr;
  uint32_t* arrivals_ = nullptr;
  PFN_cuTensorMapEncodeTiled_v12000 encode_ = nullptr;
};

}  // namespace

// The factories of gemm_configs.def's own entries (this kernel is the only one).
#define EPKIT_GEMM_CONFIG(id, swap, sched, tm, tn, cm, cn)
#define EPKIT_GEMM_OWN_CONFIG(id, swap, sched, tm, tn, cm, cn)                                   \
  std::unique_ptr<GemmImpl> make_gemm_##id(const GroupedGemmShape& shape) {                      \
    return std::make_unique<StreamGroupedGemm>(shape, GemmConfig{tm, tn, 128, swap, GemmSchedule::sched, cm, cn}); \
  }
#include "moe/gemm/gemm_configs.def"

}  // namespace epkit::moe::detail
