// Grouped FP8 GEMM with DeepSeek-V3 block scales over the expert-major layouts that dispatch writes:
// for each group (local expert) g, d_g[r, :] = dequant(a_g[r, :]) . dequant(b_g)^T for the rows
// r < count[g], with fp32 accumulation and a bf16 output. Counts (and packed offsets) stay on the
// device: one run() is a fixed pair of kernel launches that a CUDA graph can capture, and a graph
// replayed with new counts computes the new problem. No CUTLASS type appears here.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "epkit/moe/errors.hpp"
#include "epkit/types.hpp"

namespace epkit::moe {

// Largest num_groups a GroupedGemm accepts (local experts of one rank).
constexpr int kMaxGemmGroups = 1024;

// The problem a GroupedGemm object is built for; counts vary per run, everything here is fixed.
struct GroupedGemmShape {
  int num_groups = 0;        // G (local experts); 1 is valid (the shared expert uses G = 1)
  int n = 0;                 // output features per group, multiple of 8 (DeepSeek-V3 up/gate 4096, down 7168)
  int k = 0;                 // reduction dim, multiple of 128 (DeepSeek-V3 7168 / 2048)
  ExpertLayout layout = ExpertLayout::kMasked;
  int rows = 0;              // masked: capacity (rows per group); packed: R (total rows of a and d)
  int expected_m = 0;        // rows per group the caller expects (picks the config); 0 = rows (masked), R / G (packed)
};

// Throws epkit::Error naming the field and its limit if the shape cannot be run.
void validate(const GroupedGemmShape& shape);

enum class GemmSchedule : int32_t {
  kPingpong = 0,     // two consumer warpgroups on alternate tiles: one's epilogue hides under the other's mainloop
  kCooperative = 1,  // two consumer warpgroups split one tile (64 rows each): larger tiles per CTA
  kStream = 2,       // epkit's own persistent weight-streaming kernel (decode): units walked from the device counts
};
const char* schedule_name(GemmSchedule s);  // "pingpong" / "cooperative" / "stream"

// One compiled instantiation, in CUTLASS's orientation: with swap_ab the weights are CUTLASS's A
// (M = output features, N = token rows), else the tokens are (M = token rows, N = output features).
// The kStream schedule is epkit's own kernel (src/moe/gemm/stream_grouped_gemm.cu): weights on the M
// side in blocks of tile_m = 128 rows, up to tile_n = 64 tokens of a group per unit.
// Plain data: compare, print and pass it to GroupedGemm to force a config.
struct GemmConfig {
  int tile_m = 0;
  int tile_n = 0;
  int tile_k = 128;
  bool swap_ab = false;
  GemmSchedule schedule = GemmSchedule::kPingpong;
  int cluster_m = 1;  // CTAs per cluster along M (TMA multicast of the B tile)
  int cluster_n = 1;  // CTAs per cluster along N (TMA multicast of the A tile)

  int token_tile() const { return swap_ab ? tile_n : tile_m; }    // token rows per tile
  int feature_tile() const { return swap_ab ? tile_m : tile_n; }  // output features per tile
};
bool operator==(const GemmConfig& x, const GemmConfig& y);
inline bool operator!=(const GemmConfig& x, const GemmConfig& y) { return !(x == y); }

// A stable name, e.g. "swapab_pingpong_128x32x128_c1x1" (also what parse_gemm_config reads).
std::string to_string(const GemmConfig& cfg);
// Inverse of to_string for a compiled config; throws epkit::Error listing the compiled names otherwise.
GemmConfig parse_gemm_config(std::string_view name);

// The compiled instantiations, in the order the benchmark sweeps them.
std::vector<GemmConfig> available_gemm_configs();

// The one heuristic: the config GroupedGemm(shape) uses. Validates the shape first.
GemmConfig choose_gemm_config(const GroupedGemmShape& shape);

// What a run must move and compute for given host-side counts (the benchmark's formulas): weight
// bytes count the fp8 weights and their fp32 scales of the groups with at least one row (an empty
// group's weights are never read); flops = 2 * sum(rows) * N * K. Counts are taken as the kernels
// take them (masked: clamped to [0, rows]; negative = 0).
int64_t grouped_gemm_weight_bytes(const GroupedGemmShape& shape, const std::vector<int32_t>& counts);
double grouped_gemm_flops(const GroupedGemmShape& shape, const std::vector<int32_t>& counts);

// One run's tensors (non-owning device views, contiguous row-major; see ExpertLayout).
struct GroupedGemmArgs {
  Tensor a;        // tokens: masked [G, rows, K] / packed [R, K] fp8_e4m3 (exactly what dispatch writes)
  Tensor a_scale;  // masked [G, rows, K/128] / packed [R, K/128] fp32: one scale per 1x128 block, K-major
  Tensor b;        // weights [G, N, K] fp8_e4m3 (DeepSeek layout: out-features x in-features)
  Tensor b_scale;  // [G, ceil(N/128), K/128] fp32: one scale per 128x128 block (the checkpoint's weight_scale_inv)
  Tensor d;        // masked [G, rows, N] / packed [R, N] bf16 (output): only rows r < count[g] of each group are written
  Tensor expert_num_tokens;  // [G] int32 on the device: rows of each group
  Tensor expert_offsets;     // packed only (absent for masked): [G + 1] int32 on the device: group g's rows start at
                             // row offsets[g] and must end by min(offsets[g + 1], R). Any offset is aligned
                             // enough (K % 128 and N % 8 make every row 16-byte aligned); rows between groups
                             // are left untouched
  DeviceErrorRecord* error = nullptr;  // optional: where a device-side violation is recorded (ErrorRecord::device()):
                                       // masked count < 0 or > rows (clamped to [0, rows]); packed group outside
                                       // [0, min(offsets[g + 1], R)) or count < 0 (group skipped)
};

// The one validation of a run (dtypes, shapes against `shape`, alignment: 16-byte a / b / d, 4-byte
// scales and counts). Throws epkit::Error naming the tensor, the value and the limit. No allocation
// unless it throws.
void check_grouped_gemm_args(const GroupedGemmShape& shape, const GroupedGemmArgs& args);

namespace detail {
class GemmImpl;
}

// A grouped GEMM for one fixed shape. The constructor allocates and initialises everything (device
// workspace, CUTLASS parameters and TMA descriptor templates) on the current device; run() then
// allocates nothing and never synchronises, so it can be captured in a CUDA graph. One run may be in
// flight per object at a time (the per-group arguments live in its workspace). Needs an sm_90 GPU.
// EPKIT_MOE_LOG=1 prints each object's shape and config to stderr when it is built.
class GroupedGemm {
 public:
  explicit GroupedGemm(const GroupedGemmShape& shape);                // config from choose_gemm_config
  GroupedGemm(const GroupedGemmShape& shape, const GemmConfig& cfg);  // forced config (benchmark sweeps)
  ~GroupedGemm();
  GroupedGemm(GroupedGemm&&) noexcept;
  GroupedGemm& operator=(GroupedGemm&&) noexcept;
  GroupedGemm(const GroupedGemm&) = delete;
  GroupedGemm& operator=(const GroupedGemm&) = delete;

  // Validates args (check_grouped_gemm_args), then launches on `stream`: a small kernel that writes
  // each group's problem shape and pointers from the device counts into the workspace, then the GEMM.
  // Throws epkit::Error on bad args, on another current device than the constructor's, or if a launch fails.
  void run(const GroupedGemmArgs& args, cudaStream_t stream);

  const GroupedGemmShape& shape() const;  // as constructed
  const GemmConfig& config() const;       // the instantiation it runs
  size_t workspace_bytes() const;  // device bytes this object owns

 private:
  std::unique_ptr<detail::GemmImpl> impl_;
};

}  // namespace epkit::moe
