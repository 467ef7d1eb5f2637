// match_key_bits and match_groups (src/kernels/warp_match.cuh) against __match_any_sync, and token_lanes: one process,
// one GPU, no launcher. Fresh random keys every run (seed printed), outputs poisoned, exact
// comparison. Exits 77 (ctest: skipped) with a loud message where there is no GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "comm/kernels/warp_match.cuh"
#include "moe_testing.hpp"  // base_seed, CUDA_OK and main(): the MoE GPU tests' harness

namespace {

using epkit::kernels::match_groups;
using epkit::kernels::match_key_bits;
using epkit::kernels::match_key_width;
using epkit::kernels::token_lanes;

constexpr int kWarpsPerCase = 8;  // independent warps (key sets) per launch

// Warp w: keys[w * 32 + lane] -> the two masks of every lane.
__global__ void match_kernel(const int* keys, int bits, int distinct, unsigned* ballot_mask, unsigned* match_mask,
                             unsigned* group_mask) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const int key = keys[i];
  ballot_mask[i] = match_key_bits(key, bits);
  match_mask[i] = __match_any_sync(0xffffffffu, key);
  group_mask[i] = match_groups(key, bits, distinct);
}

__global__ void width_kernel(const int* n, int* out, int count) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) out[i] = match_key_width(n[i]);
}

__global__ void token_lanes_kernel(int K, unsigned* out) {
  const int u = threadIdx.x;
  if (u * K < 32) out[u] = token_lanes(u, K);
}

// Every bit width the library uses (0..12), keys drawn from ranges that force many, few or no
// repeats, some lanes negative (masked entries). For a lane with a key >= 0 the masks must be equal;
// a negative key's mask is its own lane only (MATCH.ANY would group the negative lanes together,
// which the callers never read).
TEST(WarpMatch, BallotsAndGroupsGiveTheMatchMasks) {
  std::mt19937_64 rng(epkit::moe_test::base_seed());
  const int n = kWarpsPerCase * 32;
  int* d_keys;
  unsigned *d_b, *d_m, *d_g;
  CUDA_OK(cudaMalloc(&d_g, n * sizeof(unsigned)));
  CUDA_OK(cudaMalloc(&d_keys, n * sizeof(int)));
  CUDA_OK(cudaMalloc(&d_b, n * sizeof(unsigned)));
  CUDA_OK(cudaMalloc(&d_m, n * sizeof(unsigned)));
  std::vector<int> keys(n);
  std::vector<unsigned> b(n), m(n), g(n);
  for (int bits = 0; bits <= 12; ++bits) {
    for (int trial = 0; trial < 40; ++trial) {
      const int range = 1 << bits;
      // trial % 4: the whole range, 2 values, 8 values, 32 values (clamped to the range)
      const int span = trial % 4 == 0 ? range : std::min(range, trial % 4 == 1 ? 2 : trial % 4 == 2 ? 8 : 32);
      const int lo = static_cast<int>(rng() % (range - span + 1));
      const int neg_pct = trial % 5 == 0 ? 0 : static_cast<int>(rng() % 60);
      for (int i = 0; i < n; ++i)
        keys[i] = static_cast<int>(rng() % 100) < neg_pct ? -1 - static_cast<int>(rng() % 3)
                                                          : lo + static_cast<int>(rng() % span);
      CUDA_OK(cudaMemcpy(d_keys, keys.data(), n * sizeof(int), cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemset(d_b, 0xa5, n * sizeof(unsigned)));  // poisoned
      CUDA_OK(cudaMemset(d_m, 0x5a, n * sizeof(unsigned)));
      CUDA_OK(cudaMemset(d_g, 0x3c, n * sizeof(unsigned)));
      // match_groups' choice depends on distinct (a hint, not a bound it checks): both branches
      const int distinct = static_cast<int>(rng() % 40);
      match_kernel<<<kWarpsPerCase, 32>>>(d_keys, bits, distinct, d_b, d_m, d_g);
      CUDA_OK(cudaGetLastError());
      CUDA_OK(cudaMemcpy(b.data(), d_b, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(m.data(), d_m, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(g.data(), d_g, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
      for (int i = 0; i < n; ++i) {
        const unsigned want = keys[i] >= 0 ? m[i] : 1u << (i % 32);
        ASSERT_EQ(b[i], want) << "bits " << bits << " trial " << trial << " lane " << i % 32 << " of warp "
                              << i / 32 << " key " << keys[i];
        // match_groups: the match's mask for a key >= 0; for a negative key at least its own lane
        if (keys[i] >= 0)
          ASSERT_EQ(g[i], m[i]) << "match_groups, bits " << bits << " distinct " << distinct << " lane " << i % 32;
        else
          ASSERT_TRUE((g[i] >> (i % 32)) & 1u) << "match_groups, negative key, lane " << i % 32;
      }
    }
  }
  cudaFree(d_keys);
  cudaFree(d_g);
  cudaFree(d_b);
  cudaFree(d_m);
}

TEST(WarpMatch, WidthIsTheBitsOfTheLargestKey) {
  std::vector<int> ns;
  for (int x = 1; x <= 4096; ++x) ns.push_back(x);
  const int count = static_cast<int>(ns.size());
  int *d_n, *d_w;
  CUDA_OK(cudaMalloc(&d_n, count * sizeof(int)));
  CUDA_OK(cudaMalloc(&d_w, count * sizeof(int)));
  CUDA_OK(cudaMemcpy(d_n, ns.data(), count * sizeof(int), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(d_w, 0xff, count * sizeof(int)));
  width_kernel<<<(count + 255) / 256, 256>>>(d_n, d_w, count);
  CUDA_OK(cudaGetLastError());
  std::vector<int> w(count);
  CUDA_OK(cudaMemcpy(w.data(), d_w, count * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < count; ++i) {
    const int nn = ns[i];
    // keys 0..nn-1 fit, and one bit fewer would not
    ASSERT_LT(nn - 1, 1 << w[i]) << "n " << nn;
    if (w[i] > 0) ASSERT_GE(nn - 1, 1 << (w[i] - 1)) << "n " << nn;
    if (nn == 1) ASSERT_EQ(w[i], 0);
  }
  cudaFree(d_n);
  cudaFree(d_w);
}

TEST(WarpMatch, TokenLanesAreTheTokensEntries) {
  unsigned* d;
  CUDA_OK(cudaMalloc(&d, 32 * sizeof(unsigned)));
  for (int K = 1; K <= 16; ++K) {
    CUDA_OK(cudaMemset(d, 0, 32 * sizeof(unsigned)));
    token_lanes_kernel<<<1, 32>>>(K, d);
    CUDA_OK(cudaGetLastError());
    unsigned h[32];
    CUDA_OK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    for (int u = 0; u * K < 32; ++u) {
      unsigned want = 0;
      for (int l = u * K; l < (u + 1) * K && l < 32; ++l) want |= 1u << l;
      ASSERT_EQ(h[u], want) << "K " << K << " token " << u;
    }
  }
  cudaFree(d);
}

}  // namespace

// main(): moe_testing.cpp's (the loud skip without a GPU, the seed printed first).
