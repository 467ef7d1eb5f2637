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

// How a run's units are cut: the first `full` unsplit units run whole (full waves of the grid), the
// rest (the last, partial wave) are each cut into `parts` K ranges, so that a partial wave of at most
// half the grid still has every CTA streaming. The part count is as many as the grid holds, each of at
// least kMinPartBlocks K blocks. A run with at most half a wave of units (the shared expert, a few
// experts) splits them all (full = 0); one whose last wave is more than half full splits nothing.
struct Split {
  int full;   // unsplit units [0, full)
  int parts;  // K parts of each later unit (1: none split)
  int tail;   // units after `full` (each cut into `parts`)
  EPKIT_STREAM_HD int units() const { return full + tail * parts; }
};

EPKIT_STREAM_HD Split choose_split(int base_units, int grid, int k_blocks) {
  Split x{base_units, 1, 0};
  if (base_units <= 0 || grid <= 0) return x;
  const int tail = base_units % grid;
  if (tail == 0 || 2 * tail > grid) return x;
  int s = grid / tail;
  const int by_k = k_blocks / kMinPartBlocks;
  if (by_k < s) s = by_k;
  if (s < 2) return x;
  x.full = base_units - tail;
  x.parts = s;
  x.tail = tail;
  return x;
}

struct Unit {
  int g, nb, tok0, ntok;  // group, weight block, first row of the chunk and its rows (1..64)
  int base;               // the unsplit unit
  int parts;              // K parts of the unsplit unit (1: whole)
  int slot;               // split units: the part's workspace slot (< Split::tail * parts), else -1
  int ticket;             // split units: the unsplit unit's arrival counter (< Split::tail), else -1
  int kb0, kb1;           // K blocks [kb0, kb1)
};

// Unit u (< sp.units()) of a run cut as `sp` says. prefix[g] = unsplit units of the groups before g
// (prefix[0] = 0, non-decreasing, prefix[groups] = their total); a unit's group is the last g with
// prefix[g] <= its unsplit index.
EPKIT_STREAM_HD Unit decode_unit(int u, const Split& sp, int k_blocks, const int* prefix, const int* counts,
                                 int groups) {
  Unit x;
  int part = 0;
  if (u < sp.full) {
    x.base = u;
    x.parts = 1;
    x.slot = x.ticket = -1;
  } else {
    const int v = u - sp.full;
    x.ticket = v / sp.parts;
    x.base = sp.full + x.ticket;
    x.parts = sp.parts;
    x.slot = v;
    part = v % sp.parts;
  }
  int lo = 0, hi = groups;  // prefix[lo] <= base < prefix[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (prefix[mid] <= x.base) lo = mid; else hi = mid;
  }
  const int local = x.base - prefix[lo];
  const int count = counts[lo];
  const int chunks = (count + kChunkRows - 1) / kChunkRows;
  x.g = lo;
  x.nb = local / chunks;
  x.tok0 = (local % chunks) * kChunkRows;
  x.ntok = count - x.tok0 < kChunkRows ? count - x.tok0 : kChunkRows;
  x.kb0 = part * k_blocks / x.parts;
  x.kb1 = (part + 1) * k_blocks / x.parts;
  return x;
}

}  // namespace epkit::moe::detail::stream

#undef EPKIT_STREAM_HD
