// Run under epkit-run by test_launcher: the rendezvous across real processes, configured only by
// the environment the launcher sets. Prints "ok" and exits 0 when every rank saw the right blobs.
#include <cstdio>
#include <string>
#include <vector>

#include "transport/rendezvous.hpp"

int main() {
  try {
    epkit::RendezvousOptions opt = epkit::rendezvous_options_from_env();
    opt.timeout_ms = 20000;
    const std::string root = "root of " + std::to_string(opt.world_size);
    auto got = epkit::rendezvous_broadcast(opt, std::vector<uint8_t>(root.begin(), root.end()));
    if (std::string(got.begin(), got.end()) != root) {
      std::fprintf(stderr, "broadcast mismatch\n");
      return 1;
    }
    for (int round = 0; round < 3; ++round) {
      const std::string mine = "rank " + std::to_string(opt.rank) + " round " + std::to_string(round);
      auto all = epkit::rendezvous_allgather(opt, std::vector<uint8_t>(mine.begin(), mine.end()));
      for (int r = 0; r < opt.world_size; ++r) {
        const std::string want = "rank " + std::to_string(r) + " round " + std::to_string(round);
        if (std::string(all.at(size_t(r)).begin(), all.at(size_t(r)).end()) != want) {
          std::fprintf(stderr, "allgather mismatch at rank %d\n", r);
          return 1;
        }
      }
    }
    std::printf("ok\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
