// Layer mode of epkit-moe: MoELayer forwards at world size 1 with DeepSeek-V3 shapes,
// every schedule, the per-kernel breakdown, and the bounds the layer is judged against.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <vector>

#include "bench_core.hpp"
#include "ceilings.hpp"
#include "gpu_util.hpp"

namespace epkit::moebench {

std::vector<Row> bench_layer(const Options& o, const Ceilings& c, const L2Flush& f, cudaStream_t s);
// The layer rows of the last bench_layer() run (written by main as the layer JSON).
const std::vector<LayerRow>& last_layer_rows();
// Whether this process writes the results (rank 0 under epkit-run; always alone).
bool layer_rank0();
// Called after every layer row on rank 0 (main writes the JSON so far).
void set_layer_checkpoint(std::function<void()> f);

}  // namespace epkit::moebench
