// The config of epkit's own weight-streaming grouped GEMM (stream_grouped_gemm.cu): one name that the
// config list, the runtime dispatch and the heuristic share.
#pragma once

#include "epkit/moe/grouped_gemm.hpp"

namespace epkit::moe::detail {

inline constexpr GemmConfig kStreamGemmConfig{128, 64, 128, true, GemmSchedule::kStream, 1, 1};

}  // namespace epkit::moe::detail
