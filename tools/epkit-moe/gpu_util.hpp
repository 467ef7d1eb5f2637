// Device helpers of epkit-moe: checked calls, owned buffers filled on the device with random
// finite data, an L2 flush, and the timing method every system is measured with.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "device.hpp"  // tools/epkit-bench: cuda_check, DeviceBuffer
#include "epkit/types.hpp"

namespace epkit::moebench {

using bench::cuda_check;
using Buffer = bench::DeviceBuffer;  // cudaMalloc'd bytes, freed on destruction

// Fills `count` elements on the device with seeded values, never zero as a whole: fp8 / bf16 /
// fp16 uniform in [-lo, hi] ("lo" mirrors "hi" by default), fp32 uniform in [lo, hi] (scales, logits).
void fill_uniform(void* dst, DType t, size_t count, uint64_t seed, float lo, float hi, cudaStream_t s);
// Integer fill: int32 values `base + (hash % range)` (counts, indices).
void fill_int(int32_t* dst, size_t count, uint64_t seed, int base, int range, cudaStream_t s);

// Evicts the L2 by writing a buffer several times its size (allocated once).
class L2Flush {
 public:
  L2Flush();
  void run(cudaStream_t s) const;
  size_t l2_bytes() const { return l2_; }

 private:
  Buffer buf_;
  size_t l2_ = 0;
};

// The timing method of every kernel and every system (docs/PERF.md, "Method"): `calls` back-to-back calls
// captured in one CUDA graph, replayed `replays` times with the L2 flushed before each replay (not
// timed), each replay timed with CUDA events and divided by `calls`. call(i, stream) issues call i;
// it should use input set i % sets so that no call reads what the previous one left in L2.
struct Timing {
  double us_median = 0, us_p99 = 0, us_min = 0;
  int calls = 0, replays = 0;
};
Timing time_graph(cudaStream_t s, const L2Flush& flush, int calls, int replays,
                  const std::function<void(int, cudaStream_t)>& call);

// time_graph for a sequence of parts that must run together (dispatch, then combine): each call runs
// every part in order with an event recorded after each (event nodes in the graph), and each part's
// time is the sum of its spans over the calls, per replay, median over replays. The total is
// timed as time_graph does, without the inner events.
struct PartsTiming {
  std::vector<double> part_us_median;
  Timing total;
};
PartsTiming time_graph_parts(cudaStream_t s, const L2Flush& flush, int calls, int replays,
                             const std::vector<std::function<void(cudaStream_t)>>& parts);

// Calls per graph and replays for a kernel of roughly `est_us` per call: 20 calls (the issue's
// method) for anything under a millisecond, fewer for longer ones, and replays that keep one
// point's timing under ~0.2 s of device time.
void pick_repeats(double est_us, int& calls, int& replays);

// How many input sets keep `calls` consecutive calls of `bytes_per_call` from reusing L2 contents:
// enough that the sets together exceed 4x the L2, at most `calls`.
int rotation_sets(size_t bytes_per_call, size_t l2_bytes, int calls);

}  // namespace epkit::moebench
