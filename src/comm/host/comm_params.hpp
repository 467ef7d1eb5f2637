// The kernels' per-object parameters (kernels::CommParams) from a config, its buffer layouts and the
// addresses the constructor allocated: pure C++, CPU-tested (tests/cpu/test_comm_params.cpp). The
// AllToAll constructor only allocates, agrees with its peers and calls this.
#pragma once

#include <cstdint>
#include <vector>

#include "common/buffer_layout.hpp"
#include "comm/kernels/params.hpp"
#include "epkit/config.hpp"

namespace epkit::host {

struct CommAddresses {
  uint8_t* sym = nullptr;               // this rank's symmetric base (SymmetricLayout)
  uint8_t* workspace = nullptr;         // the local workspace (WorkspaceLayout)
  std::vector<uint8_t*> peers;          // [W]: each rank's address of our symmetric base, null: no P2P
  kernels::ErrorRecord* error = nullptr;  // device address of the host-mapped error record
};

// Every field of CommParams. sym / ws: the layouts the buffers were allocated with. Throws
// epkit::Error where the layout and the peers disagree (tagged partials on an object that could
// take the large variant).
kernels::CommParams make_comm_params(const AllToAllConfig& cfg, const SymmetricLayout& sym, const WorkspaceLayout& ws,
                                     const CommAddresses& at);

}  // namespace epkit::host
