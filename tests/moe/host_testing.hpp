// Host-only helpers shared by the MoE tests (CPU tests and the GPU tests' host side): no CUDA.
#pragma once

#include <cstdint>
#include <vector>

#include "epkit/moe/router.hpp"
#include "reference/moe/numerics.hpp"

namespace epkit::moe::host_test {

// A device pointer for validation tests, which never dereference it (alignment is chosen by addr).
inline void* fake(uintptr_t addr = 0x10000) { return reinterpret_cast<void*>(addr); }

// bf16 bits of v, rounded to nearest even.
inline std::vector<uint16_t> bf16(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = ref::float_to_bf16(v[i]);
  return h;
}

// DeepSeek-V3's router: grouped top-k, 256 experts in 8 groups, keep 4, top-8, weights x 2.5.
inline RouterConfig deepseek() {
  RouterConfig c;
  c.mode = RouterMode::kGroupedTopK;
  c.num_experts = 256, c.topk = 8, c.num_groups = 8, c.topk_groups = 4, c.routed_scaling = 2.5f;
  return c;
}

// Mixtral's router: softmax top-2 over 8 experts.
inline RouterConfig mixtral() {
  RouterConfig c;
  c.mode = RouterMode::kSoftmaxTopK;
  c.num_experts = 8, c.topk = 2;
  return c;
}

}  // namespace epkit::moe::host_test
