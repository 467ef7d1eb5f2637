#include "transport/nvshmem_version.hpp"

namespace epkit::transport {

std::string to_string(const NvshmemVersion& v) {
  return std::to_string(v.major) + "." + std::to_string(v.minor) + "." + std::to_string(v.patch);
}

std::string nvshmem_version_problem(const NvshmemVersion& device, const NvshmemVersion& host,
                                    const std::string& host_library) {
  const bool compatible = host.major == device.major && host.minor >= device.minor;
  if (compatible) return "";
  const std::string d = to_string(device), h = to_string(host);
  return "NVSHMEM version mismatch: epkit's NVSHMEM device half (libnvshmem_device.a, linked into "
         "libepkit_comm.so) is NVSHMEM " + d + ", but the NVSHMEM host library loaded in this process (" +
         (host_library.empty() ? std::string("libnvshmem_host.so.3") : host_library) + ") is NVSHMEM " + h +
         ". The host library must have the same major version and at least the device half's minor version (" +
         std::to_string(device.major) + "." + std::to_string(device.minor) + ".x or a later " +
         std::to_string(device.major) + ".x). Load NVSHMEM " + d +
         "'s libnvshmem_host.so.3 first (pip install nvidia-nvshmem-cu13==" + d +
         ", or NVSHMEM_HOME / LD_LIBRARY_PATH / LD_PRELOAD pointing at it), or rebuild epkit against NVSHMEM " + h + ".";
}

}  // namespace epkit::transport
