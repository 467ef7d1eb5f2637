// The layer's activation buffers of one half, by name and size: the one place they are sized
// (MoELayer carves its arena from it, layer_workspace_bytes() sums it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "epkit/moe_layer.hpp"

namespace epkit::layer {

struct HalfSizes {
  int rows = 0;       // most tokens of the half
  int64_t xrows = 0;  // rows of its expert-major tensors (L * capacity, or R)
  std::vector<std::pair<const char*, size_t>> parts;  // (buffer, bytes)
};

HalfSizes half_sizes(const MoELayerConfig& c, const AllToAllConfig& a);

}  // namespace epkit::layer
