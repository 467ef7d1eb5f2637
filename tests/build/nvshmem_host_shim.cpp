// A stand-in for another NVSHMEM host library's version query, preloaded (LD_PRELOAD) in front of
// the real libnvshmem_host.so.3 so that the version check sees a host library of another release.
// EPKIT_SHIM_NVSHMEM_VERSION="major.minor.patch" (default 3.2.5).
#include <cstdio>
#include <cstdlib>

extern "C" __attribute__((visibility("default"))) void nvshmemx_vendor_get_version_info(int* major, int* minor,
                                                                                        int* patch) {
  *major = 3, *minor = 2, *patch = 5;
  if (const char* v = std::getenv("EPKIT_SHIM_NVSHMEM_VERSION")) std::sscanf(v, "%d.%d.%d", major, minor, patch);
}
