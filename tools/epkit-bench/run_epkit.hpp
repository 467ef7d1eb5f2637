// Measures epkit's dispatch and combine for one case: split halves, fused calls, CUDA-graph replay.
#pragma once

#include <cuda_runtime_api.h>

#include "bytes.hpp"
#include "epkit/communicator.hpp"
#include "options.hpp"
#include "presets.hpp"
#include "report.hpp"
#include "routing.hpp"

namespace epkit::bench {

// Identity fields of a row for `c` (shared by epkit and the baselines).
Row make_row_identity(const Case& c, const char* system);

// Fills the latency, bandwidth and memory fields of an "epkit" row. `mine` is this rank's DP group's
// routing. Collective.
Row run_epkit(const Communicator& comm, const Case& c, const GroupRouting& mine, const AlgorithmicBytes& bytes,
              const Options& opt, const Ceilings& ceilings, cudaStream_t stream);

}  // namespace epkit::bench
