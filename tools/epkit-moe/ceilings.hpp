// The two ceilings the MoE kernels are judged against, measured in the same run: HBM read
// bandwidth (a read-only kernel, not a copy) and dense FP8 GEMM throughput (cuBLASLt at 8192^3).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

namespace epkit::moebench {

struct Ceilings {
  double hbm_read_GBps = 0;      // bytes read / time, 8 GiB summed by every SM, median of 10
  double fp8_dense_TFLOPs = 0;   // cuBLASLt e4m3 x e4m3 -> bf16, 8192^3, fp32 accumulate, median of 10
  std::string fp8_note;          // how the FP8 figure was obtained (or why it is missing)
};

Ceilings measure_ceilings(cudaStream_t s, bool quick);

}  // namespace epkit::moebench
