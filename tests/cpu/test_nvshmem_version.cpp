// The NVSHMEM host/device version rule (src/transport/nvshmem_version.cpp): which pairs run, and a
// message that names both versions, the library loaded and the fix for the ones that do not.
#include <gtest/gtest.h>

#include <string>

#include "transport/nvshmem_version.hpp"

namespace epkit::transport {
namespace {

const NvshmemVersion kDevice{3, 4, 5};

TEST(NvshmemVersion, TheSameVersionRuns) { EXPECT_EQ(nvshmem_version_problem(kDevice, kDevice, "/x/lib.so"), ""); }

TEST(NvshmemVersion, ANewerHostOfTheSameMajorRuns) {
  // NVSHMEM's own rule: the host library may be newer than the device half within a major version.
  EXPECT_EQ(nvshmem_version_problem(kDevice, {3, 4, 6}, ""), "");
  EXPECT_EQ(nvshmem_version_problem(kDevice, {3, 4, 0}, ""), "");  // patch releases share the ABI
  EXPECT_EQ(nvshmem_version_problem(kDevice, {3, 5, 19}, ""), "");
}

TEST(NvshmemVersion, AnOlderMinorOrAnotherMajorIsRefused) {
  for (const NvshmemVersion host : {NvshmemVersion{3, 3, 20}, NvshmemVersion{3, 0, 6}, NvshmemVersion{2, 11, 0},
                                    NvshmemVersion{4, 0, 0}, NvshmemVersion{0, 0, 0}}) {
    const std::string m = nvshmem_version_problem(kDevice, host, "/site-packages/nvidia/nvshmem/lib/libnvshmem_host.so.3");
    SCOPED_TRACE(to_string(host));
    ASSERT_FALSE(m.empty());
    EXPECT_NE(m.find("NVSHMEM version mismatch"), std::string::npos) << m;
    EXPECT_NE(m.find("NVSHMEM 3.4.5"), std::string::npos) << m;               // the device half
    EXPECT_NE(m.find("NVSHMEM " + to_string(host)), std::string::npos) << m;  // the host library
    EXPECT_NE(m.find("/site-packages/nvidia/nvshmem/lib/libnvshmem_host.so.3"), std::string::npos) << m;
    EXPECT_NE(m.find("nvidia-nvshmem-cu13==3.4.5"), std::string::npos) << m;  // the fix
  }
}

TEST(NvshmemVersion, AnUnknownLibraryPathStillNamesTheLibrary) {
  const std::string m = nvshmem_version_problem(kDevice, {3, 2, 5}, "");
  EXPECT_NE(m.find("libnvshmem_host.so.3"), std::string::npos) << m;
}

TEST(NvshmemVersion, ToString) { EXPECT_EQ(to_string({3, 14, 0}), "3.14.0"); }

}  // namespace
}  // namespace epkit::transport
