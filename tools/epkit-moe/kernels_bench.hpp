// Kernel mode of epkit-moe: every MoE kernel on the shapes of DeepSeek-V3, timed with
// time_graph() against the ceilings of the same run.
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

#include "bench_core.hpp"
#include "ceilings.hpp"
#include "gpu_util.hpp"

namespace epkit::moebench {

std::vector<Row> bench_router(const Options& o, const Ceilings& c, const L2Flush& f, cudaStream_t s);
std::vector<Row> bench_gate_router(const Options& o, const Ceilings& c, const L2Flush& f, cudaStream_t s);
std::vector<Row> bench_quantize(const Options& o, const Ceilings& c, const L2Flush& f, cudaStream_t s);
std::vector<Row> bench_silu_mul_quantize(const Options& o, const Ceilings& c, const L2Flush& f, cudaStream_t s);
std::vector<Row> bench_grouped_gemm(const Options& o, const Ceilings& c, const L2Flush& f, cudaStream_t s);

}  // namespace epkit::moebench
