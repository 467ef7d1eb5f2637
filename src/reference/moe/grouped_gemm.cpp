// Host reference of the grouped FP8 GEMM: see epkit/moe/reference_gemm.hpp.
#include <cmath>
#include <cstdint>
#include <vector>

#include "epkit/error.hpp"
#include "reference/moe/reference_gemm.hpp"
#include "reference/moe/numerics.hpp"

namespace epkit::ref {

GroupRows grouped_gemm_rows(const GroupedGemmOperands& op, int g) {
  GroupRows r;
  const int64_t count = op.counts[g];
  if (op.layout == ExpertLayout::kMasked) {
    r.first_row = static_cast<int64_t>(g) * op.rows;
    r.violation = count < 0 || count > op.rows;
    r.count = static_cast<int>(count < 0 ? 0 : count > op.rows ? op.rows : count);
    return r;
  }
  const int64_t start = op.offsets[g], next = op.offsets[g + 1];
  const int64_t limit = next < op.rows ? next : op.rows;
  if (start < 0 || count < 0 || start + count > limit) {
    r.violation = true;
    return r;
  }
  r.first_row = start;
  r.count = static_cast<int>(count);
  return r;
}

void grouped_gemm(const GroupedGemmOperands& op, float* out, float* out_abs) {
  EPKIT_CHECK(op.k > 0 && op.k % kScaleBlock == 0, "ref::grouped_gemm: k = ", op.k, " must be a positive multiple of ",
              kScaleBlock);
  EPKIT_CHECK(op.layout == ExpertLayout::kMasked || op.offsets != nullptr, "ref::grouped_gemm: packed needs offsets");
  const int N = op.n, K = op.k, S = op.k / kScaleBlock, NB = (op.n + kScaleBlock - 1) / kScaleBlock;
  std::vector<double> w(static_cast<size_t>(N) * K), x(K);
  for (int g = 0; g < op.num_groups; ++g) {
    const GroupRows rows = grouped_gemm_rows(op, g);
    if (rows.count == 0) continue;
    const uint8_t* bq = op.b + static_cast<int64_t>(g) * N * K;
    const float* bs = op.b_scale + static_cast<int64_t>(g) * NB * S;
    for (int j = 0; j < N; ++j)
      for (int kk = 0; kk < K; ++kk)
        w[static_cast<size_t>(j) * K + kk] =
            static_cast<double>(e4m3_to_float(bq[static_cast<int64_t>(j) * K + kk])) *
            bs[(j / kScaleBlock) * S + kk / kScaleBlock];
    for (int i = 0; i < rows.count; ++i) {
      const int64_t r = rows.first_row + i;
      for (int kk = 0; kk < K; ++kk)
        x[kk] = static_cast<double>(e4m3_to_float(op.a[r * K + kk])) * op.a_scale[r * S + kk / kScaleBlock];
      for (int j = 0; j < N; ++j) {
        const double* wj = &w[static_cast<size_t>(j) * K];
        double s = 0, sa = 0;
        for (int kk = 0; kk < K; ++kk) {
          const double p = x[kk] * wj[kk];
          s += p;
          sa += std::fabs(p);
        }
        out[r * N + j] = static_cast<float>(s);
        if (out_abs) out_abs[r * N + j] = static_cast<float>(sa);
      }
    }
  }
}

}  // namespace epkit::ref
