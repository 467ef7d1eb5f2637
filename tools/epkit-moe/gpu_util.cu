#include "gpu_util.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "epkit/error.hpp"
#include "stats.hpp"

namespace epkit::moebench {

namespace {

__device__ __forceinline__ uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
__device__ __forceinline__ float unit(uint64_t h) { return static_cast<float>(h >> 40) * (1.0f / 16777216.0f); }

template <typename T>
__global__ void fill_kernel(T* dst, size_t n, uint64_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float v = lo + (hi - lo) * unit(mix(seed ^ (i * 0x632be59bd9b4e019ull)));
    if constexpr (std::is_same_v<T, float>) dst[i] = v;
    else if constexpr (std::is_same_v<T, __nv_bfloat16>) dst[i] = __float2bfloat16_rn(v);
    else if constexpr (std::is_same_v<T, __half>) dst[i] = __float2half_rn(v);
    else dst[i] = __nv_fp8_e4m3(v);
  }
}

__global__ void fill_int_kernel(int32_t* dst, size_t n, uint64_t seed, int base, int range) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dst[i] = base + static_cast<int>(mix(seed ^ (i * 0x632be59bd9b4e019ull)) % static_cast<uint64_t>(range));
}

}  // namespace

void fill_uniform(void* dst, DType t, size_t count, uint64_t seed, float lo, float hi, cudaStream_t s) {
  if (count == 0) return;
  const int blocks = static_cast<int>(std::min<size_t>((count + 255) / 256, 132 * 16));
  switch (t) {
    case DType::kFP32: fill_kernel<<<blocks, 256, 0, s>>>(static_cast<float*>(dst), count, seed, lo, hi); break;
    case DType::kBF16: fill_kernel<<<blocks, 256, 0, s>>>(static_cast<__nv_bfloat16*>(dst), count, seed, lo, hi); break;
    case DType::kFP16: fill_kernel<<<blocks, 256, 0, s>>>(static_cast<__half*>(dst), count, seed, lo, hi); break;
    case DType::kFP8E4M3: fill_kernel<<<blocks, 256, 0, s>>>(static_cast<__nv_fp8_e4m3*>(dst), count, seed, lo, hi); break;
    default: EPKIT_FAIL("fill_uniform: unsupported dtype ", dtype_name(t));
  }
  cuda_check(cudaGetLastError(), "fill_uniform launch");
}

void fill_int(int32_t* dst, size_t count, uint64_t seed, int base, int range, cudaStream_t s) {
  if (count == 0) return;
  EPKIT_CHECK(range > 0, "fill_int: range = ", range, " must be > 0");
  const int blocks = static_cast<int>(std::min<size_t>((count + 255) / 256, 132 * 16));
  fill_int_kernel<<<blocks, 256, 0, s>>>(dst, count, seed, base, range);
  cuda_check(cudaGetLastError(), "fill_int launch");
}

L2Flush::L2Flush() {
  int dev = 0, l2 = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev), "L2 size");
  l2_ = static_cast<size_t>(l2);
  buf_ = Buffer(std::max<size_t>(4 * l2_, size_t{256} << 20));
}
void L2Flush::run(cudaStream_t s) const { cuda_check(cudaMemsetAsync(buf_.get(), 0x5a, buf_.bytes(), s), "L2 flush"); }

Timing time_graph(cudaStream_t s, const L2Flush& flush, int calls, int replays,
                  const std::function<void(int, cudaStream_t)>& call) {
  EPKIT_CHECK(calls >= 1 && replays >= 1, "time_graph: calls = ", calls, ", replays = ", replays, " must be >= 1");
  cudaGraph_t g = nullptr;
  cuda_check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin capture");
  try {
    for (int i = 0; i < calls; ++i) call(i, s);
  } catch (...) {
    cudaStreamEndCapture(s, &g);
    if (g) cudaGraphDestroy(g);
    throw;
  }
  cuda_check(cudaStreamEndCapture(s, &g), "end capture");
  cudaGraphExec_t ge = nullptr;
  const cudaError_t ie = cudaGraphInstantiate(&ge, g, 0);
  cudaGraphDestroy(g);
  cuda_check(ie, "graph instantiate");
  cudaEvent_t a, b;
  cuda_check(cudaEventCreate(&a), "event");
  cuda_check(cudaEventCreate(&b), "event");
  std::vector<double> us;
  try {
    for (int w = 0; w < 2; ++w) cuda_check(cudaGraphLaunch(ge, s), "graph warm-up");
    for (int r = 0; r < replays; ++r) {
      flush.run(s);
      cuda_check(cudaEventRecord(a, s), "event");
      cuda_check(cudaGraphLaunch(ge, s), "graph launch");
      cuda_check(cudaEventRecord(b, s), "event");
      cuda_check(cudaEventSynchronize(b), "graph replay");
      float ms = 0;
      cuda_check(cudaEventElapsedTime(&ms, a, b), "graph replay: cudaEventElapsedTime");
      us.push_back(1000.0 * ms / calls);
    }
  } catch (...) {
    cudaEventDestroy(a), cudaEventDestroy(b), cudaGraphExecDestroy(ge);
    throw;
  }
  cudaEventDestroy(a), cudaEventDestroy(b), cudaGraphExecDestroy(ge);
  const bench::Summary sm = bench::summarize(us);
  return Timing{sm.median, sm.p99, sm.min, calls, replays};
}

PartsTiming time_graph_parts(cudaStream_t s, const L2Flush& flush, int calls, int replays,
                             const std::vector<std::function<void(cudaStream_t)>>& parts) {
  PartsTiming out;
  out.total = time_graph(s, flush, calls, replays, [&](int, cudaStream_t st) {
    for (const auto& p : parts) p(st);
  });
  const int np = static_cast<int>(parts.size());
  std::vector<cudaEvent_t> ev(static_cast<size_t>(calls) * np + 1);
  for (auto& e : ev) cuda_check(cudaEventCreate(&e), "event");
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ge = nullptr;
  std::vector<std::vector<double>> per(np);
  auto cleanup = [&] {
    if (ge) cudaGraphExecDestroy(ge);
    for (auto& e : ev) cudaEventDestroy(e);
  };
  try {
    cuda_check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin capture");
    // External records: a plain cudaEventRecord in a capture becomes an internal dependency, not a
    // timestamp, and cudaEventElapsedTime then fails (seen on the H200 box).
    cuda_check(cudaEventRecordWithFlags(ev[0], s, cudaEventRecordExternal), "event in capture");
    for (int i = 0; i < calls; ++i)
      for (int p = 0; p < np; ++p) {
        parts[p](s);
        cuda_check(cudaEventRecordWithFlags(ev[1 + static_cast<size_t>(i) * np + p], s, cudaEventRecordExternal),
                   "event in capture");
      }
    cuda_check(cudaStreamEndCapture(s, &g), "end capture");
    const cudaError_t ie = cudaGraphInstantiate(&ge, g, 0);
    cudaGraphDestroy(g);
    cuda_check(ie, "graph instantiate");
    cuda_check(cudaGraphLaunch(ge, s), "graph warm-up");
    for (int r = 0; r < replays; ++r) {
      flush.run(s);
      cuda_check(cudaGraphLaunch(ge, s), "graph launch");
      cuda_check(cudaStreamSynchronize(s), "graph replay");
      std::vector<double> sum(np, 0.0);
      for (size_t k = 1; k < ev.size(); ++k) {
        float ms = 0;
        cuda_check(cudaEventElapsedTime(&ms, ev[k - 1], ev[k]), "graph parts: cudaEventElapsedTime");
        sum[(k - 1) % np] += 1000.0 * ms;
      }
      for (int p = 0; p < np; ++p) per[p].push_back(sum[p] / calls);
    }
  } catch (...) {
    cleanup();
    throw;
  }
  cleanup();
  for (int p = 0; p < np; ++p) out.part_us_median.push_back(bench::summarize(per[p]).median);
  return out;
}

void pick_repeats(double est_us, int& calls, int& replays) {
  calls = est_us < 1000 ? 20 : est_us < 10000 ? 5 : 2;
  const double per_replay = est_us * calls;
  replays = static_cast<int>(std::clamp(200000.0 / std::max(per_replay, 1.0), 5.0, 50.0));
}

int rotation_sets(size_t bytes_per_call, size_t l2_bytes, int calls) {
  if (bytes_per_call == 0) return 1;
  const size_t need = (4 * l2_bytes + bytes_per_call - 1) / bytes_per_call + 1;
  return static_cast<int>(std::clamp<size_t>(need, 1, static_cast<size_t>(std::max(calls, 1))));
}

}  // namespace epkit::moebench
