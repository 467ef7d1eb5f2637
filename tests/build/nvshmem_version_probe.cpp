// The NVSHMEM version check wired into libepkit_comm.so (needs no GPU: the check runs before any
// CUDA or NVSHMEM call).
//   nvshmem_version_probe versions   prints both halves' versions; exit 0 iff they work together
//   nvshmem_version_probe init       make_unique_id() and Communicator::from_unique_id() must both
//                                    throw epkit::Error naming the mismatch (run it with a host
//                                    library of another release in front: tests/build/nvshmem_host_shim.cpp)
#include <cstdio>
#include <cstring>
#include <string>

#include "epkit/communicator.hpp"
#include "epkit/error.hpp"

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "versions";
  const epkit::NvshmemVersions v = epkit::nvshmem_versions();
  std::printf("device half %d.%d.%d, host library %d.%d.%d (%s)\n", v.device[0], v.device[1], v.device[2], v.host[0],
              v.host[1], v.host[2], v.host_library.c_str());
  if (mode == "versions") {
    if (!v.problem.empty()) std::printf("%s\n", v.problem.c_str());
    return v.problem.empty() ? 0 : 1;
  }
  int refused = 0;
  for (int step = 0; step < 2; ++step) {
    try {
      if (step == 0) (void)epkit::make_unique_id();
      else (void)epkit::Communicator::from_unique_id(0, 1, epkit::UniqueId{});
      std::printf("step %d: no error\n", step);
    } catch (const epkit::Error& e) {
      const std::string m = e.what();
      std::printf("step %d: epkit::Error: %s\n", step, m.c_str());
      const std::string host = std::to_string(v.host[0]) + "." + std::to_string(v.host[1]) + "." + std::to_string(v.host[2]);
      const std::string dev = std::to_string(v.device[0]) + "." + std::to_string(v.device[1]) + "." +
                              std::to_string(v.device[2]);
      if (m.find("NVSHMEM version mismatch") != std::string::npos && m.find(host) != std::string::npos &&
          m.find(dev) != std::string::npos)
        ++refused;
    }
  }
  std::printf("%s\n", refused == 2 ? "version mismatch refused before NVSHMEM init" : "NOT refused");
  return refused == 2 ? 0 : 1;
}
