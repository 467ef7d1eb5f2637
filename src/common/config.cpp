#include "epkit/config.hpp"

#include <cstdlib>
#include <sstream>

#include "epkit/error.hpp"
#include "common/buffer_layout.hpp"

namespace epkit {

namespace {
constexpr int kMaxWorldSize = 1024;
constexpr int kMaxExperts = 4096;
constexpr int64_t kMaxHidden = 1 << 16;
}  // namespace

void validate(const AllToAllConfig& c) {
  EPKIT_CHECK(c.world_size >= 1 && c.world_size <= kMaxWorldSize, "world_size = ", c.world_size,
              " must be in [1, ", kMaxWorldSize, "]");
  EPKIT_CHECK(c.rank >= 0 && c.rank < c.world_size, "rank = ", c.rank, " must be in [0, world_size = ",
              c.world_size, ")");
  EPKIT_CHECK(c.dp_size >= 1 && c.world_size % c.dp_size == 0, "dp_size = ", c.dp_size,
              " must be >= 1 and divide world_size = ", c.world_size);
  EPKIT_CHECK(c.num_experts >= 1 && c.num_experts <= kMaxExperts, "num_experts = ", c.num_experts,
              " must be in [1, ", kMaxExperts, "]");
  EPKIT_CHECK(c.num_experts % c.world_size == 0, "num_experts = ", c.num_experts,
              " must be a multiple of world_size = ", c.world_size);
  EPKIT_CHECK(c.topk >= 1 && c.topk <= kMaxTopK, "topk = ",
              c.topk, " must be in [1, ", kMaxTopK, "]");
  EPKIT_CHECK(c.topk <= c.num_experts, "topk = ", c.topk,
              " exceeds num_experts = ", c.num_experts);
  EPKIT_CHECK(c.hidden >= 16 && c.hidden <= kMaxHidden && c.hidden % 16 == 0, "hidden = ", c.hidden,
              " must be a multiple of 16 in [16, ", kMaxHidden, "]");
  EPKIT_CHECK(c.max_tokens_per_rank >= 1 && c.max_tokens_per_rank <= kMaxTokensPerRank,
              "max_tokens_per_rank = ", c.max_tokens_per_rank, " must be in [1, ", kMaxTokensPerRank, "]");
  EPKIT_CHECK(c.dispatch_dtype == DType::kBF16 || c.dispatch_dtype == DType::kFP16 ||
                  c.dispatch_dtype == DType::kFP8E4M3,
              "dispatch_dtype = ", dtype_name(c.dispatch_dtype), " must be bf16, fp16 or fp8_e4m3");
  EPKIT_CHECK(c.combine_in_dtype == DType::kBF16 || c.combine_in_dtype == DType::kFP16 ||
                  c.combine_in_dtype == DType::kFP32,
              "combine_in_dtype = ", dtype_name(c.combine_in_dtype), " must be bf16, fp16 or fp32");
  EPKIT_CHECK(c.combine_out_dtype == DType::kBF16 || c.combine_out_dtype == DType::kFP16,
              "combine_out_dtype = ", dtype_name(c.combine_out_dtype), " must be bf16 or fp16");
  EPKIT_CHECK(c.layout == ExpertLayout::kMasked || c.layout == ExpertLayout::kPacked, "layout = ",
              static_cast<int>(c.layout), " must be kMasked (0) or kPacked (1)");
  const bool packed = c.layout == ExpertLayout::kPacked;
  EPKIT_CHECK(packed || (c.packed_rows == 0 && c.packed_row_align == 1), "packed_rows = ", c.packed_rows,
              " and packed_row_align = ", c.packed_row_align,
              " apply to layout = packed only; the masked layout takes capacity (leave them at 0 and 1)");
  EPKIT_CHECK(!packed || c.capacity == 0, "capacity = ", c.capacity,
              " applies to layout = masked only; the packed layout takes packed_rows");
  if (packed) {
    EPKIT_CHECK(c.packed_row_align >= 1 && c.packed_row_align <= 1024, "packed_row_align = ", c.packed_row_align,
                " must be in [1, 1024]");
    const int64_t bound = packed_row_bound(c);
    EPKIT_CHECK(bound < (int64_t{1} << 31), "the packed row bound ", bound, " must stay below 2^31");
    EPKIT_CHECK(c.packed_rows >= 0 && c.packed_rows <= bound, "packed_rows = ", c.packed_rows,
                " must be in [0, packed_row_bound = ", bound, "] (0 selects the bound)");
    EPKIT_CHECK(c.packed_rows % c.packed_row_align == 0, "packed_rows = ", c.packed_rows,
                " must be a multiple of packed_row_align = ", c.packed_row_align);
  }
  const int64_t full = static_cast<int64_t>(c.max_tokens_per_rank) * (c.world_size / c.dp_size);
  EPKIT_CHECK(c.capacity >= 0 && c.capacity <= full, "capacity = ", c.capacity, " must be in [0, M * (W / D) = ",
              full, "] (0 selects the maximum)");
  const int64_t cap = c.capacity ? c.capacity : full;
  EPKIT_CHECK(cap * (c.num_experts / c.world_size) < (int64_t{1} << 31), "capacity * num_local_experts = ",
              cap * (c.num_experts / c.world_size), " must stay below 2^31");
  EPKIT_CHECK(c.path == DataPath::kAuto || c.path == DataPath::kPortable, "path = ", static_cast<int>(c.path),
              " must be kAuto (0) or kPortable (1)");
  EPKIT_CHECK(c.num_sms >= 0 && c.num_sms <= 1024, "num_sms = ", c.num_sms, " must be in [0, 1024] (0 = all)");
  EPKIT_CHECK(c.timeout_ms == -1 || c.timeout_ms >= 1, "timeout_ms = ", c.timeout_ms,
              " must be -1 (env default) or >= 1");
  EPKIT_CHECK(!c.expert_scales_mn_major || (!packed && c.dispatch_dtype == DType::kFP8E4M3),
              "expert_scales_mn_major = true needs layout = masked and dispatch_dtype = fp8_e4m3 (got layout = ",
              layout_name(c.layout), ", dispatch_dtype = ", dtype_name(c.dispatch_dtype), ")");
}

int num_local_experts(const AllToAllConfig& c) { return c.num_experts / c.world_size; }
int num_dp_groups(const AllToAllConfig& c) { return c.world_size / c.dp_size; }
bool has_scales(const AllToAllConfig& c) { return c.dispatch_dtype == DType::kFP8E4M3; }
int scales_per_token(const AllToAllConfig& c) {
  return has_scales(c) ? (c.hidden + kScaleBlock - 1) / kScaleBlock : 0;
}
int effective_capacity(const AllToAllConfig& c) {
  return c.capacity ? c.capacity : c.max_tokens_per_rank * (c.world_size / c.dp_size);
}
int max_tokens_per_sender(const AllToAllConfig& c) {
  return (c.max_tokens_per_rank + c.dp_size - 1) / c.dp_size;
}

int resolved_timeout_ms(const AllToAllConfig& c) {
  if (c.timeout_ms > 0) return c.timeout_ms;
  if (const char* e = std::getenv("EPKIT_TIMEOUT_MS"); e && *e) {
    char* end = nullptr;
    long v = std::strtol(e, &end, 10);
    EPKIT_CHECK(end && *end == '\0' && v >= 1 && v <= 24L * 3600 * 1000, "EPKIT_TIMEOUT_MS = '", e,
                "' must be an integer number of milliseconds in [1, 86400000]");
    return static_cast<int>(v);
  }
  return 10000;
}

std::vector<std::pair<std::string, int64_t>> agreement_fields(const AllToAllConfig& c) {
  // Raw fields, so that ranks can compare before (and whether or not) each config validates.
  // timeout_ms and num_sms are rank-local choices and may differ.
  return {{"world_size", c.world_size},
          {"dp_size", c.dp_size},
          {"num_experts", c.num_experts},
          {"topk", c.topk},
          {"hidden", c.hidden},
          {"max_tokens_per_rank", c.max_tokens_per_rank},
          {"dispatch_dtype", static_cast<int64_t>(c.dispatch_dtype)},
          {"combine_in_dtype", static_cast<int64_t>(c.combine_in_dtype)},
          {"combine_out_dtype", static_cast<int64_t>(c.combine_out_dtype)},
          {"layout", static_cast<int64_t>(c.layout)},
          {"capacity", c.capacity},
          {"packed_rows", c.packed_rows},
          {"packed_row_align", c.packed_row_align},
          {"path", static_cast<int64_t>(c.path)},
          {"weights_at_dispatch", c.weights_at_dispatch ? 1 : 0}};
}

std::string to_string(const AllToAllConfig& c) {
  std::ostringstream os;
  os << "AllToAllConfig{world_size=" << c.world_size << ", rank=" << c.rank << ", dp_size=" << c.dp_size
     << ", num_experts=" << c.num_experts << ", topk=" << c.topk
     << ", hidden=" << c.hidden << ", max_tokens_per_rank=" << c.max_tokens_per_rank
     << ", dispatch_dtype=" << dtype_name(c.dispatch_dtype) << ", combine_in_dtype=" << dtype_name(c.combine_in_dtype)
     << ", combine_out_dtype=" << dtype_name(c.combine_out_dtype) << ", layout=" << layout_name(c.layout)
     << ", capacity=" << c.capacity << ", packed_rows=" << c.packed_rows << ", packed_row_align=" << c.packed_row_align
     << ", path=" << (c.path == DataPath::kPortable ? "portable" : "auto") << ", num_sms=" << c.num_sms
     << ", timeout_ms=" << c.timeout_ms << ", weights_at_dispatch=" << (c.weights_at_dispatch ? 1 : 0)
     << ", expert_scales_mn_major=" << (c.expert_scales_mn_major ? 1 : 0) << "}";
  return os.str();
}

}  // namespace epkit
