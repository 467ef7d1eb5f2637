// NVSHMEM helpers of the Python package: unique id, init/finalize of the process's Communicator,
// barriers, symmetric allocations exported through DLPack, and the dense on-stream all-to-all.
#include "runtime.hpp"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "bindings.hpp"

namespace nb = nanobind;

namespace epkit::py {

namespace {
// Bumped by every init and finalize, so that a capsule outliving its NVSHMEM instance never frees
// an address a later instance handed out again.
uint64_t g_generation = 0;

struct SymmetricOwner {
  void* ptr;
  uint64_t generation;
};

bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

// Runs when the last DLPack consumer (a torch tensor and all its views) lets go. nvshmem_free is
// collective, so this matches torch's lifetime rules only where every rank drops the tensor at the
// same point; it is skipped during interpreter shutdown, where the drop order is arbitrary and a
// collective could hang, and after finalize, which already released the heap.
void release_symmetric(void* p) noexcept {
  auto* owner = static_cast<SymmetricOwner*>(p);
  Runtime& rt = runtime();
  auto it = rt.allocs.find(reinterpret_cast<uintptr_t>(owner->ptr));
  if (owner->generation == g_generation && rt.comm && it != rt.allocs.end() && !interpreter_finalizing()) {
    rt.allocs.erase(it);
    try {
      DeviceGuard guard(rt.comm->device());
      rt.comm->symmetric_free(owner->ptr);
    } catch (const std::exception& e) {
      // A destructor path cannot raise into Python; say what leaked instead.
      std::fprintf(stderr, "epkit: symmetric_free(%p) failed: %s\n", owner->ptr, e.what());
    }
  }
  delete owner;
}

// Throws unless [ptr, ptr + bytes) lies inside one live symmetric allocation: a peer addresses our
// buffer by the same offset, so any other pointer would fault or corrupt a peer's memory.
void check_symmetric(uintptr_t ptr, size_t bytes, const char* what) {
  const auto& allocs = runtime().allocs;
  auto it = allocs.upper_bound(ptr);
  EPKIT_CHECK(it != allocs.begin(), what, " (0x", std::hex, ptr, std::dec,
              ") is not in memory from nvshmem_malloc");
  --it;
  EPKIT_CHECK(ptr + bytes <= it->first + it->second, what, " (0x", std::hex, ptr, std::dec, ", ", bytes,
              " bytes) is not inside one nvshmem_malloc allocation (base 0x", std::hex, it->first, std::dec,
              ", ", it->second, " bytes)");
}
}  // namespace

Runtime& runtime() {
  // Leaked on purpose: destroying it from a static destructor would run the collective
  // nvshmem_finalize at process exit, when peers may already be gone.
  static Runtime* rt = new Runtime();
  return *rt;
}

const Communicator& comm() {
  const auto& c = runtime().comm;
  EPKIT_CHECK(c != nullptr, "NVSHMEM is not initialized in this process: call epkit.nvshmem_init(uid, rank, "
                            "world_size) first");
  return *c;
}

DeviceGuard::DeviceGuard(int device) {
  if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
  if (device >= 0 && device != prev_) {
    cudaError_t e = cudaSetDevice(device);
    EPKIT_CHECK(e == cudaSuccess, "cudaSetDevice(", device, "): ", cudaGetErrorString(e));
    changed_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (changed_ && prev_ >= 0) cudaSetDevice(prev_);
}

static void init(nb::bytes uid, int rank, int world_size) {
  Runtime& rt = runtime();
  EPKIT_CHECK(!rt.comm, "NVSHMEM is already initialized in this process (rank ", rt.comm->rank(),
              " of ", rt.comm->world_size(), "); call nvshmem_finalize() before initializing again");
  UniqueId id;
  EPKIT_CHECK(uid.size() == id.bytes.size(), "unique id has ", uid.size(), " bytes, expected ",
              id.bytes.size());
  std::memcpy(id.bytes.data(), uid.c_str(), id.bytes.size());
  std::unique_ptr<Communicator> c;
  {
    nb::gil_scoped_release release;  // a collective: let other Python threads run while peers arrive
    c = std::make_unique<Communicator>(Communicator::from_unique_id(rank, world_size, id, -1));
  }
  rt.comm = std::move(c);
  ++g_generation;
}

static void finalize() {
  Runtime& rt = runtime();
  if (!rt.comm) return;
  // Detach everything while holding the GIL (capsule deleters read the same state under it), then
  // run the collectives without it.
  std::vector<std::shared_ptr<void>> instances = std::move(rt.instances);
  rt.instances.clear();
  std::unique_ptr<Communicator> c = std::move(rt.comm);
  rt.allocs.clear();  // the heap goes with NVSHMEM; tensors still alive must not free into it
  ++g_generation;
  nb::gil_scoped_release release;
  DeviceGuard guard(c->device());
  // Creation order is the same on every rank, so the collective frees inside match up.
  for (auto& a : instances) a.reset();
  c.reset();
}

static nb::ndarray<nb::device::cuda, uint8_t, nb::ndim<1>> symmetric_malloc(size_t bytes) {
  const Communicator& c = comm();
  // NVSHMEM may return null for 0 bytes; a 1-byte block keeps "non-null means ours" simple.
  size_t alloc_bytes = bytes == 0 ? 1 : bytes;
  void* p = nullptr;
  {
    nb::gil_scoped_release release;
    DeviceGuard guard(c.device());
    p = c.symmetric_malloc(alloc_bytes);
  }
  EPKIT_CHECK(p != nullptr, "symmetric_malloc(", alloc_bytes, ") returned null");
  runtime().allocs[reinterpret_cast<uintptr_t>(p)] = alloc_bytes;
  nb::capsule owner(new SymmetricOwner{p, g_generation}, release_symmetric);
  size_t shape[1] = {bytes};
  return nb::ndarray<nb::device::cuda, uint8_t, nb::ndim<1>>(p, 1, shape, owner, nullptr,
                                                           nb::dtype<uint8_t>(), nb::device::cuda::value,
                                                           c.device());
}

static void alltoall(uintptr_t dst, uintptr_t src, size_t bytes_per_rank, uintptr_t stream) {
  const Communicator& c = comm();
  // First, whatever the buffers: where NVSHMEM would end the process, say so as an exception.
  EPKIT_CHECK(c.nvshmem_collectives_supported(), "nvshmem_alltoall is not supported here: ", c.world_size(),
              " PEs run with several PEs on one GPU and no MPS (NVSHMEM's \"limited MPG\" mode), where NVSHMEM's "
              "collectives end the process; run one PE per GPU (or under MPS). epkit.AllToAll and the barriers "
              "work in this mode.");
  size_t total = bytes_per_rank * static_cast<size_t>(c.world_size());
  check_symmetric(dst, total, "nvshmem_alltoall destination");
  check_symmetric(src, total, "nvshmem_alltoall source");
  DeviceGuard guard(c.device());
  c.alltoall_on_stream(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes_per_rank,
                       as_stream(stream));
}

void bind_runtime(nb::module_& m) {
  m.def(
      "make_unique_id",
      [] {
        UniqueId id = make_unique_id();
        return nb::bytes(reinterpret_cast<const char*>(id.bytes.data()), id.bytes.size());
      },
      "A fresh 128-byte NVSHMEM unique id (call on one rank, share it out of band).");
  m.def("unique_id_size", [] { return UniqueId{}.bytes.size(); });
  m.def(
      "nvshmem_versions",
      [] {
        const NvshmemVersions v = nvshmem_versions();
        return nb::make_tuple(nb::make_tuple(v.device[0], v.device[1], v.device[2]),
                              nb::make_tuple(v.host[0], v.host[1], v.host[2]), v.host_library, v.problem);
      },
      "((device half's version), (host library's version), host library path, problem or ''): NVSHMEM's "
      "two halves in this process. A non-empty problem is what every NVSHMEM bootstrap raises.");
  m.def("init", &init, nb::arg("uid"), nb::arg("rank"), nb::arg("world_size"),
        "Bootstraps this process's NVSHMEM on the current CUDA device. Collective.");
  m.def("finalize", &finalize,
        "Destroys AllToAll and MoELayer objects never destroyed (creation order), then finalizes NVSHMEM. Collective.");
  m.def("initialized", [] { return runtime().comm != nullptr; });
  m.def("my_pe", [] { return comm().rank(); });
  m.def("n_pes", [] { return comm().world_size(); });
  m.def("device", [] { return comm().device(); });
  m.def(
      "barrier_all",
      [] {
        const Communicator& c = comm();
        nb::gil_scoped_release release;
        DeviceGuard guard(c.device());
        c.barrier();
      },
      "Host-side barrier over all PEs.");
  m.def(
      "barrier_all_on_stream",
      [](uintptr_t stream) {
        const Communicator& c = comm();
        DeviceGuard guard(c.device());
        c.barrier_on_stream(as_stream(stream));
      },
      nb::arg("stream"));
  m.def("symmetric_malloc", &symmetric_malloc, nb::arg("nbytes"),
        "A 1-D uint8 CUDA array of nbytes on the symmetric heap, freed (collectively) when its last "
        "consumer lets go. Collective.");
  m.def("alltoall", &alltoall, nb::arg("dst"), nb::arg("src"), nb::arg("bytes_per_rank"), nb::arg("stream"));
  m.def(
      "maps_peer", [](int pe) { return comm().maps_peer(pe); }, nb::arg("pe"),
      "Whether this PE reaches PE pe's symmetric heap with plain loads and stores (nvshmem_ptr non-null).");
  m.def(
      "collectives_supported", [] { return comm().nvshmem_collectives_supported(); },
      "False where several PEs share a GPU without MPS: NVSHMEM's collectives (alltoall) would end the process.");
  m.def("num_live_allocations", [] { return runtime().allocs.size(); });
  m.def("num_live_instances", [] { return runtime().instances.size(); });
}

}  // namespace epkit::py
