// Shared pieces of the GPU suite: the process-wide Communicator, device buffers, input generation
// per DP group, and the host-side oracle checks built on epkit::ref.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "epkit/epkit.hpp"
#include "reference/comm/reference.hpp"

namespace epkit::test {

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr << ": " << cudaGetErrorString(expr)

// The ranks a test runs on. Normally the process's Communicator, created by gpu_test_main from the
// epkit-run environment. With EPKIT_TEST_SINGLE_PROCESS=1 (world size 1 only) no Communicator and
// no NVSHMEM exist at all, and the objects are the single-process ones (AllToAll(cfg),
// MoELayer(cfg, w)): the same tests then check the world-size-1 path a one-GPU user runs.
class TestWorld {
 public:
  int rank() const;
  int world_size() const;
  void barrier() const;
  void allgather(const void* data, size_t n, void* out) const;
  bool single_process() const;
};
const TestWorld& comm();
// The Communicator, or null in a single-process run.
const Communicator* communicator();
// An AllToAll of the test's world (collective, or single-process as above).
std::unique_ptr<AllToAll> make_all_to_all(const AllToAllConfig& cfg);

// main() of every GPU test binary: initialises GoogleTest, hands the remaining arguments to
// `parse` (may be null), exits 77 ("skipped: no GPU") without a GPU, brings up the Communicator,
// runs the tests and meets the other ranks at a barrier before returning.
int gpu_test_main(int argc, char** argv, void (*parse)(int argc, char** argv));

// Agrees across ranks; on failure every rank reports and the test stops on every rank, so a
// problem on one rank never leaves the others waiting in the next collective call.
#define AGREE_OR_FAIL(problem, what)                                                                \
  do {                                                                                              \
    const std::string _p = (problem);                                                               \
    if (!::epkit::test::all_ranks(_p.empty())) {                                                    \
      FAIL() << "rank " << ::epkit::test::comm().rank() << ": "                                     \
             << (_p.empty() ? "ok here, failed on another rank" : _p) << "\n  case: " << (what);   \
    }                                                                                               \
  } while (0)
// The harness's fast host conversions (make_inputs, host_expert_output, check_combine) against
// the cuda_fp8 / cuda_bf16 / cuda_fp16 host conversions on a million random values (the suite's
// ranges and random bit patterns); throws Error on the first difference, so that a wrong fast path
// fails the process rather than hiding behind a reference computed the same wrong way.
// gpu_test_main calls it; a test with its own main calls it before make_inputs.
void check_fast_codecs();
// Fresh per launch: EPKIT_RUN_SEED (epkit-run draws a new one each launch), mixed with a case id.
uint64_t case_seed(uint64_t case_id);
// True on every rank iff `ok` is true on every rank (host allgather).
bool all_ranks(bool ok);

struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n);
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr(o.ptr), bytes(o.bytes) { o.ptr = nullptr; o.bytes = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  ~DeviceBuffer();
  template <typename T>
  T* as() const { return static_cast<T*>(ptr); }
};

enum class Routing { kUniform, kOneExpert, kOneRank, kMasked };
const char* routing_name(Routing r);

// Inputs of one DP group, identical on all ranks of the group (generated from the shared seed).
struct GroupInputs {
  int m = 0;
  std::vector<uint8_t> x;        // [M][payload_bytes]
  std::vector<float> x_scale;    // [M][num_scales]
  std::vector<int32_t> topk_idx; // [M][K]
  std::vector<float> weights;    // [M][K]
};
std::vector<GroupInputs> make_inputs(const AllToAllConfig& cfg, Routing routing, int m, uint64_t seed);

// Expert function applied by the test "expert" kernel: y = x * c_e + d_e (x dequantised with its
// block scale for fp8), rounded to combine_in dtype. Host and device compute it identically.
float expert_scale(int expert);
float expert_bias(int expert);
// Host value of y for (group, token) at expert e, already rounded to the combine_in dtype.
void host_expert_output(const AllToAllConfig& cfg, const GroupInputs& in, int token, int expert, float* y);

// Device buffers of one rank for one layer.
// Expert-major buffers follow the config's layout (ExpertShapes): [L, cap, ...] or [R, ...] plus
// expert_offsets [L + 1] for packed.
struct RankBuffers {
  DeviceBuffer x, x_scale, topk_idx, weights, expert_x, expert_x_scale, expert_num_tokens, expert_offsets, expert_y,
      out, m_dev;
  DType idx_dtype = DType::kInt32;
  // topk_idx starts this many elements into its buffer (0 .. kMaxIdxOffset): indices that are not
  // 16-byte aligned, as a view into a larger tensor may be.
  static constexpr int kMaxIdxOffset = 3;
  int idx_offset = 0;
  void* idx_ptr() const { return static_cast<uint8_t*>(topk_idx.ptr) + idx_offset * dtype_size(idx_dtype); }
  void allocate(const AllToAllConfig& cfg, DType idx_dtype);
  void upload(const AllToAllConfig& cfg, const GroupInputs& in, cudaStream_t st);  // also poisons outputs
  DispatchArgs dispatch_args(const AllToAllConfig& cfg, int m, bool device_m) const;
  CombineArgs combine_args(const AllToAllConfig& cfg, int m, bool device_m) const;
};

// Launches the test expert: y[row] = f(x[row]) for the rows first(el) + [0, expert_num_tokens[el]) of
// each local expert (first = el * capacity, or expert_offsets[el] packed); other rows stay untouched.
void launch_expert(const AllToAllConfig& cfg, const RankBuffers& b, cudaStream_t st);

// Checks this rank's outputs against the reference; returns "" or a description of the first problem.
// Both layouts; where the room overflows (a small capacity or R), the runs that fit are exact, a
// run that straddles the end holds a subset of its rows, nothing is written outside the placed rows,
// and combine is checked for the tokens whose drops are known (ref::dispatch_drops).
std::string check_dispatch(const AllToAllConfig& cfg, const std::vector<GroupInputs>& groups, const RankBuffers& b);
std::string check_combine(const AllToAllConfig& cfg, const std::vector<GroupInputs>& groups, const RankBuffers& b);

// Tolerance of combine relative to sum_k |w * y|: two roundings to the output dtype (the partial per
// rank and the final sum), each at most half an ulp = 2^-8 (bf16) or 2^-11 (fp16) relative, plus
// fp32 accumulation (K * 2^-24, negligible); 1% slack.
double combine_rel_tolerance(DType out);

}  // namespace epkit::test
