// A small TCP rendezvous: rank 0 serves a blob (the NVSHMEM unique id) to ranks 1..N-1 and can
// gather one blob from each rank. Works across nodes with torchrun's MASTER_ADDR / MASTER_PORT.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace epkit {

struct RendezvousOptions {
  std::string host = "127.0.0.1";  // MASTER_ADDR: where rank 0 listens / others connect
  int port = 29500;                // MASTER_PORT
  int rank = 0;
  int world_size = 1;
  int timeout_ms = 60000;          // whole-operation bound; connect retries until then
};

// Reads MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE (defaults: 127.0.0.1, 29500, 0, 1).
// Throws epkit::Error naming a malformed variable.
RendezvousOptions rendezvous_options_from_env();

// Every rank returns root 0's `blob` (ignored on other ranks). Throws epkit::Error on timeout or a
// peer closing early, naming the rank and the address.
std::vector<uint8_t> rendezvous_broadcast(const RendezvousOptions& opt, const std::vector<uint8_t>& blob);

// Every rank returns all ranks' blobs, indexed by rank (an allgather through rank 0).
std::vector<std::vector<uint8_t>> rendezvous_allgather(const RendezvousOptions& opt,
                                                       const std::vector<uint8_t>& blob);

}  // namespace epkit
