// The work split of the streaming grouped GEMM (stream_grouped_gemm.cu), shared by the kernel and
// the CPU tests: which units a run has for given device counts, how K is split when they are few,
// and which (group, weight block, rows, K blocks) a unit index stands for.
#pragma once

#if defined(__CUDACC__)
#define EPKIT_STREAM_HD __host__ __device__ __forceinline__
#else
#define EPKIT_STREAM_HD inline
#endif

namespace epkit::moe::detail::stream {

constexpr int kBlockRows = 128;     // weight rows (output features) per unit: one 128-row scale block
constexpr int kChunkRows = 64;      // token rows per unit
// Split K: at least this many 128-deep K blocks per part. On one H100, parts of 14 blocks (K 7168 in 4)
// took the shared expert's up/gate (G = 1) from 21.0 to 17.1 µs, parts of 8 (K 2048 in 2) made the down
// projection slower (10.0 -> 11.4 µs): the reduction's write, ticket and read cost more than half of
// 16 blocks.
constexpr int kMinPartBlocks = 14;

// Unsplit units of a group with `count` rows (already clamped): one per (weight block, 64 rows).
EPKIT_STREAM_HD int group_units(int count, int n) {
  return count <= 0 ? 0 : ((n + kBlockRows - 1) / kBlockRows) * ((count + kChunkRows - 1) / kChunkRows);
}

// Parts per unit: 1 unless the units fill at most half the grid, then as many as the grid holds,
// each of at least kMinPartBlocks K blocks.
EPKIT_STREAM_HD int choose_splits(int base_units, int grid, int k_blocks) {
  if (base_units <= 0 || 2 * base_units > grid) return 1;
  int s = grid / base_units;
  const int by_k = k_blocks / kMinPartBlocks;
  if (by_k < s) s = by_k;
  return s < 1 ? 1 : s;
}

struct Unit {
  int g, nb, tok0, ntok;  // group, weight block, first row of the chunk and its rows (1..64)
  int base;               // the unsplit unit
  int kb0, kb1;           // K blocks [kb0, kb1)
};

// Unit u of a run with `splits` parts per unsplit unit: unsplit unit u / splits, part u % splits.
// prefix[g] = unsplit units of the groups before g (prefix[0] = 0, non-decreasing, prefix[groups] =
// their total > u / splits); its group is the last g with prefix[g] <= that unit.
EPKIT_STREAM_HD Unit decode_unit(int u, int splits, int k_blocks, const int* prefix, const int* counts, int groups) {
  const int part = u % splits;
  const int base = u / splits;
  int lo = 0, hi = groups;  // prefix[lo] <= base < prefix[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (prefix[mid] <= base) lo = mid; else hi = mid;
  }
  const int local = base - prefix[lo];
  const int count = counts[lo];
  const int chunks = (count + kChunkRows - 1) / kChunkRows;
  Unit x;
  x.g = lo;
  x.nb = local / chunks;
  x.tok0 = (local % chunks) * kChunkRows;
  x.ntok = count - x.tok0 < kChunkRows ? count - x.tok0 : kChunkRows;
  x.base = base;
  x.kb0 = part * k_blocks / splits;
  x.kb1 = (part + 1) * k_blocks / splits;
  return x;
}

}  // namespace epkit::moe::detail::stream

#undef EPKIT_STREAM_HD
