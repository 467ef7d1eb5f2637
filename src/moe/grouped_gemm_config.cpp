// Host side of the grouped GEMM (epkit_core, CPU-tested): the compiled configs, the heuristic that
// picks one, and the validation of shapes and run arguments.
#include <cstdint>
#include <initializer_list>
#include <string>

#include "epkit/error.hpp"
#include "epkit/moe/grouped_gemm.hpp"

namespace epkit::moe {

const char* schedule_name(GemmSchedule s) {
  switch (s) {
    case GemmSchedule::kPingpong: return "pingpong";
    case GemmSchedule::kCooperative: return "cooperative";
    case GemmSchedule::kStream: return "stream";
  }
  return "unknown";
}

bool operator==(const GemmConfig& x, const GemmConfig& y) {
  return x.tile_m == y.tile_m && x.tile_n == y.tile_n && x.tile_k == y.tile_k && x.swap_ab == y.swap_ab &&
         x.schedule == y.schedule && x.cluster_m == y.cluster_m && x.cluster_n == y.cluster_n;
}

std::string to_string(const GemmConfig& c) {
  return std::string(c.swap_ab ? "swapab_" : "") + schedule_name(c.schedule) + "_" + std::to_string(c.tile_m) + "x" +
         std::to_string(c.tile_n) + "x" + std::to_string(c.tile_k) + "_c" + std::to_string(c.cluster_m) + "x" +
         std::to_string(c.cluster_n);
}

std::vector<GemmConfig> available_gemm_configs() {
  std::vector<GemmConfig> v;
#define EPKIT_GEMM_CONFIG(id, swap, sched, tm, tn, cm, cn) v.push_back({tm, tn, 128, swap, GemmSchedule::sched, cm, cn});
#define EPKIT_GEMM_OWN_CONFIG EPKIT_GEMM_CONFIG
#include "moe/gemm/gemm_configs.def"
  return v;
}

GemmConfig parse_gemm_config(std::string_view name) {
  std::string names;
  for (const GemmConfig& c : available_gemm_configs()) {
    const std::string s = to_string(c);
    if (s == name) return c;
    names += (names.empty() ? "" : ", ") + s;
  }
  EPKIT_FAIL("grouped GEMM: unknown config '", name, "' (compiled: ", names, ")");
}

void validate(const GroupedGemmShape& s) {
  EPKIT_CHECK(s.num_groups >= 1 && s.num_groups <= kMaxGemmGroups, "grouped GEMM: num_groups = ", s.num_groups,
              " must be in [1, ", kMaxGemmGroups, "]");
  EPKIT_CHECK(s.n > 0 && s.n % 8 == 0 && s.n <= (1 << 20), "grouped GEMM: n = ", s.n,
              " must be a positive multiple of 8 (16-byte bf16 output rows for TMA), at most ", 1 << 20);
  EPKIT_CHECK(s.k > 0 && s.k % kScaleBlock == 0 && s.k <= (1 << 20), "grouped GEMM: k = ", s.k,
              " must be a positive multiple of ", kScaleBlock, " (one scale per ", kScaleBlock, " of K), at most ",
              1 << 20);
  EPKIT_CHECK(s.layout == ExpertLayout::kMasked || s.layout == ExpertLayout::kPacked,
              "grouped GEMM: unknown layout code ", static_cast<int>(s.layout));
  EPKIT_CHECK(s.rows >= 0, "grouped GEMM: rows = ", s.rows, " must be >= 0");
  EPKIT_CHECK(s.expected_m >= 0, "grouped GEMM: expected_m = ", s.expected_m, " must be >= 0 (0 = from rows)");
}

namespace {

// Rows per group the config is chosen for.
int expected_rows(const GroupedGemmShape& s) {
  if (s.expected_m > 0) return s.expected_m;
  if (s.layout == ExpertLayout::kMasked) return s.rows;
  return static_cast<int>((static_cast<int64_t>(s.rows) + s.num_groups - 1) / s.num_groups);
}

}  // namespace

// Decode (m <= 64) is bound by reading the weights once. Up to 32 rows per group: the own streaming
// kernel (units from the device counts, every weight block read once whatever the spread of the
// counts, split K for few experts); measured on one H100 against CUTLASS's swap-AB tiles in the same
// run (docs/perf/grouped-gemm.md). 33-64 rows: CUTLASS swap-AB with the 64-token tile (the streaming
// kernel's 64-token wgmma waits for each stage before promoting). Beyond 64 the work is compute-bound
// at m >= 256 and the 128 x 128 cooperative tile with the token tile multicast over a 1 x 2 cluster is
// the FP8 peak candidate; the 1 x 1 cluster only where the feature tiles per group are odd (the
// cluster would pad each group with an empty tile).
GemmConfig choose_gemm_config(const GroupedGemmShape& s) {
  validate(s);
  const int m = expected_rows(s);
  if (m <= 32) return {128, 64, 128, true, GemmSchedule::kStream, 1, 1};
  if (m <= 64) return {128, 64, 128, true, GemmSchedule::kPingpong, 1, 1};
  const int feature_tiles = (s.n + 127) / 128;
  if (feature_tiles % 2 == 0) return {128, 128, 128, false, GemmSchedule::kCooperative, 1, 2};
  return {128, 128, 128, false, GemmSchedule::kCooperative, 1, 1};
}

namespace {

int64_t rows_of(const GroupedGemmShape& s, int32_t count) {
  if (count < 0) return 0;
  return s.layout == ExpertLayout::kMasked && count > s.rows ? s.rows : count;
}

void check_counts(const GroupedGemmShape& s, const std::vector<int32_t>& counts) {
  EPKIT_CHECK(static_cast<int64_t>(counts.size()) == s.num_groups, "grouped GEMM: ", counts.size(),
              " counts for num_groups = ", s.num_groups);
}

}  // namespace

int64_t grouped_gemm_weight_bytes(const GroupedGemmShape& s, const std::vector<int32_t>& counts) {
  validate(s);
  check_counts(s, counts);
  const int64_t per_group = static_cast<int64_t>(s.n) * s.k +
                            static_cast<int64_t>((s.n + kScaleBlock - 1) / kScaleBlock) * (s.k / kScaleBlock) * 4;
  int64_t bytes = 0;
  for (int32_t c : counts) bytes += rows_of(s, c) > 0 ? per_group : 0;
  return bytes;
}

double grouped_gemm_flops(const GroupedGemmShape& s, const std::vector<int32_t>& counts) {
  validate(s);
  check_counts(s, counts);
  double rows = 0;
  for (int32_t c : counts) rows += static_cast<double>(rows_of(s, c));
  return 2.0 * rows * s.n * s.k;
}

namespace {

// Checks dtype, rank, dims and pointer alignment of one tensor. An empty tensor may have no storage.
void check_tensor(const Tensor& t, const char* name, DType dtype, std::initializer_list<int64_t> dims, size_t align) {
  const bool empty = t.ndim > 0 && t.numel() == 0;
  EPKIT_CHECK(t.data != nullptr || empty, "grouped GEMM: ", name, " is missing (null data pointer)");
  EPKIT_CHECK(t.dtype == dtype, "grouped GEMM: ", name, " has dtype ", dtype_name(t.dtype), ", expected ",
              dtype_name(dtype));
  EPKIT_CHECK(t.ndim == static_cast<int>(dims.size()), "grouped GEMM: ", name, " has shape ", t.shape_str(), " (",
              t.ndim, " dims), expected ", dims.size(), " dims");
  int i = 0;
  for (int64_t d : dims) {
    EPKIT_CHECK(t.shape[i] == d, "grouped GEMM: ", name, " has shape ", t.shape_str(), ": dim ", i, " is ",
                t.shape[i], ", expected ", d);
    ++i;
  }
  EPKIT_CHECK(empty || reinterpret_cast<uintptr_t>(t.data) % align == 0, "grouped GEMM: ", name,
              " data pointer is not ", align, "-byte aligned (TMA and the scale loads need it)");
}

}  // namespace

// Row pitches follow from the shapes (the views are contiguous): K bytes for a and b (K % 128), 2N
// bytes for d (N % 8), so 16-byte base pointers make every row TMA-aligned. CUTLASS checks none of
// this itself when the problem shapes live on the device.
void check_grouped_gemm_args(const GroupedGemmShape& s, const GroupedGemmArgs& a) {
  const int64_t G = s.num_groups, N = s.n, K = s.k, R = s.rows, S = s.k / kScaleBlock;
  const int64_t NB = (s.n + kScaleBlock - 1) / kScaleBlock;
  if (s.layout == ExpertLayout::kMasked) {
    check_tensor(a.a, "a", DType::kFP8E4M3, {G, R, K}, 16);
    check_tensor(a.a_scale, "a_scale", DType::kFP32, {G, R, S}, 4);
    check_tensor(a.d, "d", DType::kBF16, {G, R, N}, 16);
    EPKIT_CHECK(!a.expert_offsets.defined(), "grouped GEMM: expert_offsets is given but the layout is masked");
  } else {
    check_tensor(a.a, "a", DType::kFP8E4M3, {R, K}, 16);
    check_tensor(a.a_scale, "a_scale", DType::kFP32, {R, S}, 4);
    check_tensor(a.d, "d", DType::kBF16, {R, N}, 16);
    check_tensor(a.expert_offsets, "expert_offsets", DType::kInt32, {G + 1}, 4);
  }
  check_tensor(a.b, "b", DType::kFP8E4M3, {G, N, K}, 16);
  check_tensor(a.b_scale, "b_scale", DType::kFP32, {G, NB, S}, 4);
  check_tensor(a.expert_num_tokens, "expert_num_tokens", DType::kInt32, {G}, 4);
}

}  // namespace epkit::moe
