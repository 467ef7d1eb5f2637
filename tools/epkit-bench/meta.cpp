#include "meta.hpp"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <algorithm>
#include <sstream>

#include "epkit/diagnostics.hpp"
#include "epkit/version.hpp"


namespace epkit::bench {

namespace {

std::string cuda_version_string(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }

// The kernel driver's version from /proc (e.g. "580.95.05"); "unknown" where it is not readable.
std::string kernel_driver_version() {
  std::ifstream f("/proc/driver/nvidia/version");
  std::string line;
  if (!std::getline(f, line)) return "unknown";
  // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue ..." or "... Open Kernel Module
  // for x86_64  580.159.04 ...": the version is the first word made of digits and two or more dots.
  std::istringstream words(line);
  for (std::string w; words >> w;) {
    const bool digits_dots = w.find_first_not_of("0123456789.") == std::string::npos;
    if (digits_dots && std::count(w.begin(), w.end(), '.') >= 2) return w;
  }
  return line;
}

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> collect_meta(const Communicator& comm, const std::string& nccl_version,
                                                              const std::vector<std::string>& argv) {
  std::vector<std::pair<std::string, std::string>> m;
  cudaDeviceProp prop{};
  const bool have_prop = cudaGetDeviceProperties(&prop, comm.device()) == cudaSuccess;
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  std::string cmd;
  for (const std::string& a : argv) cmd += (cmd.empty() ? "" : " ") + a;

  m.emplace_back("gpu", have_prop ? prop.name : "unknown");
  m.emplace_back("gpu_sms", have_prop ? std::to_string(prop.multiProcessorCount) : "unknown");
  m.emplace_back("gpu_memory_bytes", have_prop ? std::to_string(prop.totalGlobalMem) : "unknown");
  m.emplace_back("driver", kernel_driver_version());
  m.emplace_back("cuda_driver_api", cuda_version_string(driver));
  m.emplace_back("cuda_runtime", cuda_version_string(runtime));
  m.emplace_back("nvshmem", probes::nvshmem_version());
  m.emplace_back("nccl", nccl_version);
  m.emplace_back("git_commit", epkit::git_commit());
  m.emplace_back("date", date);
  m.emplace_back("host", host);
  m.emplace_back("world_size", std::to_string(comm.world_size()));
  m.emplace_back("command_line", cmd);
  m.emplace_back("NVSHMEM_SYMMETRIC_SIZE", env_or("NVSHMEM_SYMMETRIC_SIZE", "unset"));
  m.emplace_back("EPKIT_TIMEOUT_MS", env_or("EPKIT_TIMEOUT_MS", "unset"));
  m.emplace_back("EPKIT_LOCAL_KERNELS", env_or("EPKIT_LOCAL_KERNELS", "unset"));  // "0": W = 1 runs the general kernels
  m.emplace_back("sample_definition",
                 "CUDA events after an on-stream barrier; each sample is the slowest rank's time; median, and p99 "
                 "as the nearest-rank 99th percentile");
  m.emplace_back("bytes_definition",
                 "algorithmic bytes per rank: dispatch = (payload + fp32 scales) per (token, remote destination rank) "
                 "pair, combine = H * sizeof(out dtype) per such pair; summed over ranks and divided by world size; "
                 "% of ceiling = GB/s over the P2P copy bandwidth per direction");
  return m;
}

}  // namespace epkit::bench
