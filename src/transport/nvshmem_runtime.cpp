// NVSHMEM lifetime and host-side helpers behind epkit::Communicator. This file (with the kernels)
// is the only place that initialises NVSHMEM, so its device state lives in libepkit.so.
#include <dlfcn.h>
#include <nvshmem.h>
#include <nvshmemx.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "epkit/communicator.hpp"
#include "epkit/error.hpp"
#include "transport/nvshmem_version.hpp"
#include "transport/rendezvous.hpp"
#include "transport/control.cuh"
#include "common/cuda_check.hpp"

namespace epkit {

namespace {
std::atomic<int> g_live{0};
std::atomic<bool> g_unreachable{false};

int env_int(const char* name, int dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  EPKIT_CHECK(end && *end == '\0' && x >= 0 && x < (1L << 30), "environment variable ", name, " = '", v,
              "' is not a non-negative integer");
  return static_cast<int>(x);
}
// nvshmemx_init_attr() exits the process on failure; call the function behind it and throw instead.
void init_nvshmem(unsigned flags, nvshmemx_init_attr_t& attr, const std::string& who) {
  // NVSHMEM's init exits the process when no CUDA context is current (a process that has not
  // touched CUDA yet): make the device's primary context current first.
  const cudaError_t ctx = cudaFree(nullptr);
  if (ctx != cudaSuccess) {
    g_live = 0;
    EPKIT_FAIL("making the CUDA context current before NVSHMEM init failed: ", cudaGetErrorString(ctx), " (",
               who, ")");
  }
  int provided = 0;
  nvshmemi_version_t version = {NVSHMEM_VENDOR_MAJOR_VERSION, NVSHMEM_VENDOR_MINOR_VERSION,
                                NVSHMEM_VENDOR_PATCH_VERSION};
  nvshmemx_init_init_attr_ver_only(attr);
  const int status = nvshmemi_init_thread(NVSHMEM_THREAD_SERIALIZED, &provided, flags, &attr, version);
  if (status != 0) {
    g_live = 0;
    EPKIT_FAIL("NVSHMEM initialisation failed with status ", status, " (", who, ")");
  }
}

// Before anything else touches NVSHMEM: a host library that cannot run the linked device half.
void check_nvshmem_version() {
  const NvshmemVersions v = nvshmem_versions();
  EPKIT_CHECK(v.problem.empty(), v.problem);
}

}  // namespace

NvshmemVersions nvshmem_versions() {
  NvshmemVersions v;
  v.device = {NVSHMEM_VENDOR_MAJOR_VERSION, NVSHMEM_VENDOR_MINOR_VERSION, NVSHMEM_VENDOR_PATCH_VERSION};
  // The host library's own answer (a plain getter of its build constants; needs no init). The
  // symbol binds to whichever libnvshmem_host.so.3 the process loaded first.
  nvshmemx_vendor_get_version_info(&v.host[0], &v.host[1], &v.host[2]);
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&nvshmemx_vendor_get_version_info), &info) != 0 && info.dli_fname)
    v.host_library = info.dli_fname;
  v.problem = transport::nvshmem_version_problem({v.device[0], v.device[1], v.device[2]},
                                                 {v.host[0], v.host[1], v.host[2]}, v.host_library);
  return v;
}

bool peers_unreachable() { return g_unreachable.load(); }
void mark_peers_unreachable() { g_unreachable.store(true); }

UniqueId make_unique_id() {
  check_nvshmem_version();
  nvshmemx_uniqueid_t uid = NVSHMEMX_UNIQUEID_INITIALIZER;
  EPKIT_CHECK(nvshmemx_get_uniqueid(&uid) == 0, "nvshmemx_get_uniqueid failed");
  static_assert(sizeof(uid) == sizeof(UniqueId::bytes), "NVSHMEM unique id size changed");
  UniqueId out;
  std::memcpy(out.bytes.data(), &uid, sizeof(uid));
  return out;
}

Communicator Communicator::from_unique_id(int rank, int world_size, const UniqueId& id, int device) {
  check_nvshmem_version();
  EPKIT_CHECK(world_size >= 1, "world_size = ", world_size, " must be >= 1");
  EPKIT_CHECK(rank >= 0 && rank < world_size, "rank = ", rank, " must be in [0, ", world_size, ")");
  int ndev = 0;
  EPKIT_CUDA_CHECK(cudaGetDeviceCount(&ndev));
  EPKIT_CHECK(ndev > 0, "no CUDA device visible");
  if (device >= 0) {
    EPKIT_CHECK(device < ndev, "device = ", device, " but only ", ndev, " CUDA devices are visible");
    EPKIT_CUDA_CHECK(cudaSetDevice(device));
  }
  int expected = 0;
  EPKIT_CHECK(g_live.compare_exchange_strong(expected, 1),
              "NVSHMEM is already initialised in this process (one Communicator per process)");
  nvshmemx_uniqueid_t uid;
  std::memcpy(&uid, id.bytes.data(), sizeof(uid));
  nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
  if (nvshmemx_set_attr_uniqueid_args(rank, world_size, &uid, &attr) != 0) {
    g_live = 0;
    EPKIT_FAIL("nvshmemx_set_attr_uniqueid_args(rank = ", rank, ", world_size = ", world_size, ") failed");
  }
  init_nvshmem(NVSHMEMX_INIT_WITH_UNIQUEID, attr,
               "rank " + std::to_string(rank) + " of " + std::to_string(world_size));
  Communicator c = adopt();
  EPKIT_CHECK(c.rank_ == rank && c.world_size_ == world_size, "NVSHMEM reports PE ", c.rank_, " of ", c.world_size_,
              ", expected ", rank, " of ", world_size);
  return c;
}

Communicator Communicator::adopt() {
  Communicator c;
  c.rank_ = nvshmem_my_pe();
  c.world_size_ = nvshmem_n_pes();
  c.local_rank_ = env_int("LOCAL_RANK", 0);
  EPKIT_CUDA_CHECK(cudaGetDevice(&c.device_));
  c.owns_ = true;
  transport::control_init(c.world_size_);
  // NVSHMEM refuses its collectives in limited MPG mode by ending the process, so find out here,
  // from its own status, and let every rank agree: one rank skipping a collective hangs the rest.
  const int32_t ok = nvshmemx_init_status() == NVSHMEM_STATUS_LIMITED_MPG ? 0 : 1;
  std::vector<int32_t> all(c.world_size_);
  c.allgather(&ok, sizeof ok, all.data());
  for (int32_t v : all) c.nvshmem_collectives_ &= v == 1;
  return c;
}

Communicator Communicator::from_env() {
  check_nvshmem_version();
  RendezvousOptions opt = rendezvous_options_from_env();
  const int local_rank = env_int("LOCAL_RANK", opt.rank);
  int ndev = 0;
  EPKIT_CUDA_CHECK(cudaGetDeviceCount(&ndev));
  EPKIT_CHECK(ndev > 0, "no CUDA device visible (rank ", opt.rank, ")");
  const int device = local_rank % ndev;  // several PEs per GPU are allowed
  EPKIT_CUDA_CHECK(cudaSetDevice(device));
  std::vector<uint8_t> blob;
  if (opt.rank == 0) {
    UniqueId id = make_unique_id();
    blob.assign(id.bytes.begin(), id.bytes.end());
  }
  blob = rendezvous_broadcast(opt, blob);
  EPKIT_CHECK(blob.size() == sizeof(UniqueId::bytes), "rendezvous returned ", blob.size(), " bytes, expected ",
              sizeof(UniqueId::bytes));
  UniqueId id;
  std::memcpy(id.bytes.data(), blob.data(), blob.size());
  return from_unique_id(opt.rank, opt.world_size, id, device);
}

Communicator Communicator::from_mpi(void* mpi_comm, int device) {
  check_nvshmem_version();
  if (device >= 0) EPKIT_CUDA_CHECK(cudaSetDevice(device));
  int expected = 0;
  EPKIT_CHECK(g_live.compare_exchange_strong(expected, 1), "NVSHMEM is already initialised in this process");
  nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
  if (nvshmemx_set_attr_mpi_comm_args(mpi_comm, &attr) != 0) {
    g_live = 0;
    EPKIT_FAIL("nvshmemx_set_attr_mpi_comm_args failed");
  }
  init_nvshmem(NVSHMEMX_INIT_WITH_MPI_COMM, attr, "MPI bootstrap");
  return adopt();
}

Communicator::Communicator(Communicator&& o) noexcept
    : rank_(o.rank_),
      world_size_(o.world_size_),
      local_rank_(o.local_rank_),
      device_(o.device_),
      owns_(o.owns_),
      nvshmem_collectives_(o.nvshmem_collectives_) {
  o.owns_ = false;
}

Communicator& Communicator::operator=(Communicator&& o) noexcept {
  if (this != &o) {
    this->~Communicator();
    rank_ = o.rank_, world_size_ = o.world_size_, local_rank_ = o.local_rank_, device_ = o.device_, owns_ = o.owns_;
    nvshmem_collectives_ = o.nvshmem_collectives_;
    o.owns_ = false;
  }
  return *this;
}

Communicator::~Communicator() {
  if (!owns_) return;
  owns_ = false;
  // finalize is collective; with a dead or diverged peer it would block forever.
  transport::control_finalize();
  if (!peers_unreachable()) nvshmem_finalize();
  g_live = 0;
}

void Communicator::barrier() const {
  EPKIT_CHECK(owns_, "Communicator is not initialised");
  transport::control_barrier();
}

void Communicator::allgather(const void* data, size_t n, void* out) const {
  EPKIT_CHECK(owns_, "Communicator is not initialised");
  transport::control_allgather(data, n, out);
}

void Communicator::broadcast(void* data, size_t n, int root) const {
  EPKIT_CHECK(root >= 0 && root < world_size_, "broadcast root = ", root, " must be in [0, ", world_size_, ")");
  std::vector<uint8_t> all(n * world_size_);
  allgather(data, n, all.data());
  std::memcpy(data, all.data() + static_cast<size_t>(root) * n, n);
}

bool Communicator::maps_peer(int r) const {
  EPKIT_CHECK(owns_, "Communicator is not initialised");
  EPKIT_CHECK(r >= 0 && r < world_size_, "maps_peer(", r, "): rank must be in [0, ", world_size_, ")");
  return transport::control_maps_peer(r);
}

void* Communicator::symmetric_malloc(size_t bytes) const {
  EPKIT_CHECK(owns_, "Communicator is not initialised");
  void* p = nvshmem_malloc(bytes);
  EPKIT_CHECK(p != nullptr || bytes == 0, "nvshmem_malloc(", bytes,
              " bytes) failed: raise NVSHMEM_SYMMETRIC_SIZE (e.g. NVSHMEM_SYMMETRIC_SIZE=8G)");
  return p;
}

void Communicator::symmetric_free(void* ptr) const {
  if (ptr) nvshmem_free(ptr);
}

void Communicator::barrier_on_stream(cudaStream_t stream) const { transport::control_barrier_on_stream(stream); }

void Communicator::alltoall_on_stream(void* dst, const void* src, size_t bytes_per_rank, cudaStream_t stream) const {
  EPKIT_CHECK(owns_, "Communicator is not initialised");
  EPKIT_CHECK(nvshmem_collectives_, "nvshmemx_alltoallmem_on_stream is not supported here: several PEs share a GPU "
              "without MPS (NVSHMEM's \"limited MPG\" mode), where NVSHMEM would end the process instead of "
              "returning an error; run one PE per GPU (or under MPS)");
  const int rc = nvshmemx_alltoallmem_on_stream(NVSHMEM_TEAM_WORLD, dst, src, bytes_per_rank, stream);
  EPKIT_CHECK(rc == 0, "nvshmemx_alltoallmem_on_stream(", bytes_per_rank, " bytes per rank) failed with ", rc);
}

}  // namespace epkit
