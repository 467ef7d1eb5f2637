// Communicator: owns NVSHMEM's lifetime for this process (RAII) and knows rank, world and device.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace epkit {

// Opaque NVSHMEM unique id (128 bytes), produced by rank 0 and handed to every rank out of band.
struct UniqueId {
  std::array<uint8_t, 128> bytes{};
};

// Makes a fresh unique id (call on one rank only).
UniqueId make_unique_id();

// NVSHMEM's two halves in this process: the device half linked into libepkit_comm.so (its version
// fixed at build time) and the host library loaded at run time (libnvshmem_host.so.3, from whatever
// the dynamic loader found first), with the library's path. `problem` is empty where they work
// together, else the message that make_unique_id() and every Communicator factory throw as
// epkit::Error before NVSHMEM is touched: a mismatched pair would otherwise fail inside NVSHMEM's
// init with a bare status code (or worse). Reading the versions initialises nothing.
struct NvshmemVersions {
  std::array<int, 3> device{}, host{};
  std::string host_library;
  std::string problem;
};
NvshmemVersions nvshmem_versions();

class Communicator {
 public:
  // Reads RANK, WORLD_SIZE, LOCAL_RANK (torchrun / epkit-run convention), selects GPU
  // LOCAL_RANK % device_count, and bootstraps NVSHMEM with a unique id that rank 0 serves over TCP
  // on MASTER_ADDR:MASTER_PORT. Collective.
  static Communicator from_env();
  // Bootstraps NVSHMEM from an id every rank already holds. device < 0 keeps the current device.
  static Communicator from_unique_id(int rank, int world_size, const UniqueId& id, int device = -1);
  // Bootstraps NVSHMEM over an MPI communicator (pass &comm, an MPI_Comm*). Collective over it.
  // Needs NVSHMEM's MPI bootstrap plugin (nvshmem_bootstrap_mpi.so.3, loaded by NVSHMEM at run time)
  // and the MPI library it was built for; epkit itself is not built against MPI.
  static Communicator from_mpi(void* mpi_comm, int device = -1);

  Communicator(Communicator&& other) noexcept;
  Communicator& operator=(Communicator&& other) noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  ~Communicator();  // finalizes NVSHMEM unless a device-side timeout left peers unreachable

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int local_rank() const { return local_rank_; }
  int device() const { return device_; }
  // Host-side barrier over all ranks (nvshmem_barrier_all). Not for use inside captured graphs.
  void barrier() const;
  // Broadcasts n bytes from root's buffer to every rank's (host memory). Collective.
  void broadcast(void* data, size_t n, int root) const;
  // All-gathers n bytes from every rank into out[world_size * n] (host memory). Collective.
  void allgather(const void* data, size_t n, void* out) const;

  // Whether this rank reaches rank r's symmetric heap with plain loads and stores (NVLink or PCIe
  // peer access, or the same GPU: nvshmem_ptr is non-null). The same for every symmetric allocation.
  bool maps_peer(int r) const;
  // Symmetric-heap helpers (collective; same size on every rank). Throws on failure.
  void* symmetric_malloc(size_t bytes) const;
  void symmetric_free(void* ptr) const;
  // nvshmemx_barrier_all_on_stream.
  void barrier_on_stream(cudaStream_t stream) const;
  // Dense all-to-all of `bytes_per_rank` bytes to each rank between symmetric buffers, on a stream
  // (nvshmemx_alltoallmem_on_stream over the world team). Throws epkit::Error, before calling
  // NVSHMEM, where nvshmem_collectives_supported() is false.
  void alltoall_on_stream(void* dst, const void* src, size_t bytes_per_rank, cudaStream_t stream) const;
  // False where NVSHMEM runs in "limited MPG" mode on some rank (several PEs share a GPU without
  // MPS): its own collectives (alltoall, broadcast, fcollect, reduce) then end the process.
  // epkit's barrier, allgather and broadcast above are its own and work in every mode. Same on all ranks.
  bool nvshmem_collectives_supported() const { return nvshmem_collectives_; }

 private:
  Communicator() = default;
  static Communicator adopt();  // wraps the NVSHMEM instance just initialised in this process
  int rank_ = -1, world_size_ = 0, local_rank_ = 0, device_ = 0;
  bool owns_ = false;
  bool nvshmem_collectives_ = true;
};

// True once any epkit object in this process saw a device-side timeout: NVSHMEM's own collectives
// (finalize included) could then block on a dead peer, so the Communicator skips them.
bool peers_unreachable();
void mark_peers_unreachable();

}  // namespace epkit
