// Whether NVSHMEM's host library loaded in a process can run the device half linked into
// libepkit_comm.so. Pure logic (CPU-tested); nvshmem_runtime.cpp reads the two versions.
#pragma once

#include <string>

namespace epkit::transport {

struct NvshmemVersion {
  int major = 0, minor = 0, patch = 0;
};

std::string to_string(const NvshmemVersion& v);  // "3.4.5"

// "" when a host library of version `host` (loaded from `host_library`) can run epkit's device half
// of version `device`, else the message epkit::Error carries. NVSHMEM's own rule: the same major
// version, and a host minor version at least the device half's (a newer device half may call host
// functions an older host library lacks). NVSHMEM's init would print its own one-line complaint
// to stdout and fail with a bare status code; this names both versions, the library and the fix.
std::string nvshmem_version_problem(const NvshmemVersion& device, const NvshmemVersion& host,
                                    const std::string& host_library);

}  // namespace epkit::transport
