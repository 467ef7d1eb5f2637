// Division by a value known on the host as one multiply on the device, exact over the ranges the
// kernels use (CPU-tested over every value in range: tests/cpu/test_launch_plan.cpp).
#pragma once

#include <cstdint>

namespace epkit::kernels {

// The rank holding expert e, e / L, without a division (a runtime division is ~20 instructions,
// and the general kernels had eleven inlined copies): (e * 2^8 * d) >> 32 with d = ceil(2^24 / L).
// Exact for 0 <= e < 4096 and 1 <= L <= 4096 (config.cpp's kMaxExperts): with d * L = 2^24 + r,
// 0 <= r < L, e * d / 2^24 = e / L + e * r / (L * 2^24), and e * r < 2^24 keeps the excess below
// 1 / L, less than e / L's distance to the next integer (CPU-tested over every e and L).
constexpr uint32_t expert_rank_div(int L) { return static_cast<uint32_t>(((1u << 24) + L - 1) / L); }
constexpr int expert_rank(int e, uint32_t div) {
  return static_cast<int>((static_cast<uint64_t>(static_cast<uint32_t>(e) << 8) * div) >> 32);
}

// n / L without a division, for 1 <= L and n * L <= 2^32: (n * ceil(2^32 / L)) >> 32. With
// ceil(2^32 / L) = (2^32 + r) / L, 0 <= r < L, the product over 2^32 is n / L + n * r / (L * 2^32), and
// n * r < 2^32 keeps the excess below 1 / L, where n / L's fraction is at most (L - 1) / L: the floor
// is exact (CPU-tested). A runtime 32-bit division is ~20 instructions with a reciprocal in its chain.
constexpr uint64_t small_div_mul(int L) { return ((uint64_t{1} << 32) + static_cast<uint64_t>(L) - 1) / static_cast<uint64_t>(L); }
constexpr int small_div(int n, uint64_t mul) {
  return static_cast<int>((static_cast<uint64_t>(static_cast<uint32_t>(n)) * mul) >> 32);
}
// n / d for 0 <= n and 1 <= d, with mul = small_div_mul(d): one multiply where small_div is exact
// (n * d <= 2^32, which every unit of a decode call meets), the division beyond (CPU-tested).
constexpr int div_by_mul(int n, int d, uint64_t mul) {
  return static_cast<uint64_t>(n) * static_cast<uint64_t>(d) <= (uint64_t{1} << 32) ? small_div(n, mul) : n / d;
}

}  // namespace epkit::kernels
