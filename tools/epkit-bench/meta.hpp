// Run metadata for the JSON report: GPU, driver, library versions, commit, date, command line.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "epkit/communicator.hpp"

namespace epkit::bench {

// Key/value pairs describing this run as seen from this rank. `nccl_version` comes from the NCCL
// baseline ("none" when built without it).
std::vector<std::pair<std::string, std::string>> collect_meta(const Communicator& comm, const std::string& nccl_version,
                                                              const std::vector<std::string>& argv);

}  // namespace epkit::bench
