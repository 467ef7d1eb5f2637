#include "moe_testing.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

namespace epkit::moe_test {

uint64_t base_seed() {
  static const uint64_t s = [] {
    uint64_t v;
    if (const char* e = std::getenv("EPKIT_TEST_SEED")) {
      v = std::strtoull(e, nullptr, 10);
    } else {
      std::random_device rd;
      v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    }
    std::printf("[moe-test] seed=%llu (set EPKIT_TEST_SEED to replay)\n", static_cast<unsigned long long>(v));
    return v;
  }();
  return s;
}

uint64_t case_seed(uint64_t case_id) {
  uint64_t z = base_seed() + 0x9e3779b97f4a7c15ull * (case_id + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::vector<std::string>& gemm_config_filter_mut() {
  static std::vector<std::string> v;
  return v;
}
const std::vector<std::string>& gemm_config_filter() { return gemm_config_filter_mut(); }

}  // namespace epkit::moe_test

// main() of every MoE GPU test binary: a loud skip (exit 77) where there is no GPU.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--gemm-config") && i + 1 < argc) {
      epkit::moe_test::gemm_config_filter_mut().push_back(argv[++i]);
    } else {
      std::fprintf(stderr, "%s: unknown argument %s (gtest flags, --gemm-config NAME)\n", argv[0], argv[i]);
      return 2;
    }
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("skipped: no GPU (%s needs one CUDA GPU)\n", argv[0]);
    return 77;
  }
  (void)epkit::moe_test::base_seed();
  return RUN_ALL_TESTS();
}
