// Host reference of the grouped FP8 GEMM (epkit::moe::GroupedGemm): the oracle of its GPU tests.
// Pure C++: the operands are dequantised exactly (e4m3 code x fp32 block scale, in double) and
// multiplied in double, so the only differences to the kernel are its fp32 accumulation (with
// per-128-K promotion) and its bf16 rounding of the output.
#pragma once

#include <cstdint>

#include "epkit/types.hpp"

namespace epkit::ref {

// Host arrays in exactly the layouts the device tensors have (see GroupedGemmArgs).
struct GroupedGemmOperands {
  int num_groups = 0;  // G
  int n = 0;           // output features per group
  int k = 0;           // reduction dim, multiple of 128
  ExpertLayout layout = ExpertLayout::kMasked;
  int rows = 0;                      // masked: rows per group; packed: R
  const uint8_t* a = nullptr;        // e4m3 codes: masked [G][rows][K] / packed [R][K]
  const float* a_scale = nullptr;    // masked [G][rows][K/128] / packed [R][K/128]
  const uint8_t* b = nullptr;        // e4m3 codes [G][N][K]
  const float* b_scale = nullptr;    // [G][ceil(N/128)][K/128]
  const int32_t* counts = nullptr;   // [G]
  const int32_t* offsets = nullptr;  // packed only: [G + 1]
};

// The rows of group g that the GEMM computes: [first_row, first_row + count) of a and d, after the
// kernels' rules for bad device values. Masked: count clamped to [0, rows] (violation if it was
// outside). Packed: the group is skipped (count 0, violation) unless 0 <= offsets[g], count >= 0 and
// offsets[g] + count <= min(offsets[g + 1], R).
struct GroupRows {
  int64_t first_row = 0;
  int count = 0;
  bool violation = false;
};
GroupRows grouped_gemm_rows(const GroupedGemmOperands& op, int g);

// out[r][j] = sum_k deq(a)[r][k] * deq(b_g)[j][k], accumulated in double and stored as float, for
// every computed row r of every group g (grouped_gemm_rows); every other row of out is left as it
// was. out has d's layout (masked [G][rows][N] / packed [R][N]). If out_abs is not null it receives
// sum_k |deq(a)[r][k] * deq(b_g)[j][k]| at the same places: the scale that accumulation error
// bounds are stated against.
void grouped_gemm(const GroupedGemmOperands& op, float* out, float* out_abs = nullptr);

}  // namespace epkit::ref
