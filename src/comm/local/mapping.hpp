// Work mappings of the world-size-1 kernels (local.cu) that host and device share: the paths, pieces
// and units of the permutation and its inverse (CPU-tested: tests/cpu/test_launch_plan.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm/kernels/params.hpp"

namespace epkit::kernels {

// World size 1 (local.cu): objects whose M reaches this count each block's own chunk of tokens and
// share per-expert counters (one grid-wide step for the packed layout) instead of every block
// counting every token. Not measured: at 512 tokens x top-8 the redundant count is 8 loads per thread.
inline constexpr int kLocalLargeTokens = 512;
constexpr bool local_large(const CommParams& p) { return p.max_tokens >= kLocalLargeTokens; }  // host and device

// World size 1, the local kernels' shapes (local.cu; the host sizes their launches with
// host/local_shape.hpp). Large objects place their own tokens kLocalRoundTokens at a time. Small
// ones rank with up to kWarpsPerBlock warps of kLocalRankCounters / E shared-memory counters each,
// and scatter one piece of a row per warp: kLocalSmallPieceChunks or kLocalLargePieceChunks
// 16-byte chunks per lane (512 B or 2 KB; one-path scan calls also kLocalWidePieceChunks, 4 KB).
inline constexpr int kLocalRoundTokens = 64;
// Fused small dispatches of n = m * K entries, units (token, piece, k) over `warps` warps: each
// warp ranks its units' entries itself (local.cu, scan_rank: ~n / 64 loads per lane per unit) while
// that costs at most kLocalScanWork entries per warp (n times its units). Measured on one H200
// against the block-wide ranking: faster at V3 128 tokens (1024 x 2) and V2-Lite 256 (1536 x 1) and
// 384 (2304 x 2), even at V3 192 (1536 x 3), slower at V3 256 (2048 x 4) and 384.
inline constexpr int64_t kLocalScanWork = 4608;
constexpr bool local_scan_ranks(int n, int units, int warps) {
  return n > 32 && static_cast<int64_t>(n) * ((units + warps - 1) / warps) <= kLocalScanWork;
}
// The path of a fused small dispatch (local.cu): one warp ranks all n <= 32 entries (kTiny), each
// warp ranks its own entries (kScan, local_scan_ranks), or every block ranks all of them (kRank).
// The kernel applies it on the device; the host applies it to pick a one-path kernel for a call
// of known m.
enum class LocalSmallPath { kTiny, kScan, kRank };
constexpr LocalSmallPath local_small_path(int n, int units, int warps) {
  return n <= 32 ? LocalSmallPath::kTiny : local_scan_ranks(n, units, warps) ? LocalSmallPath::kScan : LocalSmallPath::kRank;
}
// A fused small dispatch of a host-given m may run a kernel compiled for one path only (the host's
// choice: host::local_fused_dispatch). one_path false: the object's general kernel.
struct LocalFusedDispatch {
  bool one_path;
  LocalSmallPath path;
  int piece_chunks;
};
// Combine units per token (a warp's 16-byte chunks of 8 elements, chunks_per_lane per lane: 256 or
// 1024 elements), for the kernel and the host's launch shapes.
constexpr int local_combine_units(int hidden, int chunks_per_lane) {
  return (hidden / 8 + 32 * chunks_per_lane - 1) / (32 * chunks_per_lane);
}
// The scan path's split of the index words j < i (local.cu, lane_matches_below) for 16-byte loads:
// `head` words up to the first 16-byte boundary (the array starts mis words past one; words of
// 16 / per bytes, per words per vector), then nv whole vectors, then the tail words tail0 .. i - 1.
// Head and tail each hold fewer than `per` words, one per lane.
struct ScanSplit {
  int head, nv, tail0;
};
constexpr ScanSplit scan_split(int i, int mis, int per) {
  const int head = (per - mis) % per < i ? (per - mis) % per : i;
  const int nv = (i - head) / per;
  return {head, nv, head + nv * per};
}
inline constexpr int kLocalRankCounters = 8192;
inline constexpr int kLocalSmallPieceChunks = 1, kLocalLargePieceChunks = 4;
// The one-path scan dispatch also takes a 4 KB piece (local_fused_piece_chunks) when only that
// piece puts a call's units in one wave: V3 (7168-byte rows, K = 8) from 65 to 132 tokens on 132
// SMs, whose 2 KB units take two rounds of scan + store per warp.
inline constexpr int kLocalWidePieceChunks = 8;
constexpr int local_rank_warps(int num_experts) {
  return kLocalRankCounters / num_experts < 1 ? 1
         : kLocalRankCounters / num_experts > kWarpsPerBlock ? kWarpsPerBlock
                                                             : kLocalRankCounters / num_experts;
}
constexpr int local_pieces_per_row(int payload_bytes, int piece_chunks) {
  return (payload_bytes + 512 * piece_chunks - 1) / (512 * piece_chunks);
}
// The small dispatch's piece for a call of m tokens on a grid of `warps` warps: the 512-byte piece
// when all of its (token, piece, k) units fit in one wave, else the 2 KB one (fewer, longer units:
// measured faster at 128 tokens). host::local_piece_chunks applies it to an object's largest call.
constexpr int local_call_piece_chunks(int m, int topk, int payload_bytes, int warps) {
  return static_cast<int64_t>(m) * topk * local_pieces_per_row(payload_bytes, kLocalSmallPieceChunks) <= warps
             ? kLocalSmallPieceChunks
             : kLocalLargePieceChunks;
}
// The small dispatch's shared memory, in ints: the counts (E), the packed first rows (E + 1), the
// prefix scratch (kWarpsPerBlock), then the path's own arrays.
constexpr size_t local_count_smem_ints(int num_experts) {
  return 2 * static_cast<size_t>(num_experts) + 1 + kWarpsPerBlock;
}

}  // namespace epkit::kernels
