#include "baselines.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <functional>
#include <set>

#include "device.hpp"
#include "epkit/error.hpp"
#include "run_epkit.hpp"
#include "timing.hpp"

#ifdef EPKIT_BENCH_HAVE_NCCL
#include <nccl.h>
#endif

namespace epkit::bench {

namespace {

struct DenseSizes {
  size_t dispatch_chunk = 0;  // bytes per destination rank, dispatch direction
  size_t combine_chunk = 0;   // bytes per destination rank, combine direction
  size_t buffer = 0;          // one of send / receive: W chunks of the larger direction
};

DenseSizes dense_sizes(const AllToAllConfig& cfg) {
  DenseSizes s;
  s.dispatch_chunk = dense_bytes_per_peer(cfg, dispatch_token_bytes(cfg));
  s.combine_chunk = dense_bytes_per_peer(cfg, combine_token_bytes(cfg));
  s.buffer = static_cast<size_t>(cfg.world_size) * std::max(s.dispatch_chunk, s.combine_chunk);
  return s;
}

// Times `all_to_all(chunk)` for the dispatch then the combine direction, after a barrier, per sample,
// and fills the latency and bandwidth fields of `row`.
void time_dense(const Communicator& comm, const Case& c, const AlgorithmicBytes& bytes, const Options& opt,
                const Ceilings& ceilings, cudaStream_t stream, const DenseSizes& sz,
                const std::function<void(size_t chunk)>& all_to_all, Row& row) {
  for (int i = 0; i < opt.warmup; ++i) {
    all_to_all(sz.dispatch_chunk);
    all_to_all(sz.combine_chunk);
  }
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  const int n = opt.iters;
  EventGrid ev(n, 3);
  time_samples(comm, stream, ev,
               {[&] { all_to_all(sz.dispatch_chunk); }, [&] { all_to_all(sz.combine_chunk); }});
  Summary s = summarize_slowest(comm, ev.span_us(0, 1));
  row.dispatch_us_median = s.median;
  row.dispatch_us_p99 = s.p99;
  s = summarize_slowest(comm, ev.span_us(1, 2));
  row.combine_us_median = s.median;
  row.combine_us_p99 = s.p99;
  s = summarize_slowest(comm, ev.span_us(0, 2));
  row.total_us_median = s.median;
  row.total_us_p99 = s.p99;
  row.samples = n;
  const double remote = static_cast<double>(c.cfg.world_size - 1);
  row.dispatch_wire_bytes_per_rank = remote * static_cast<double>(sz.dispatch_chunk);
  row.combine_wire_bytes_per_rank = remote * static_cast<double>(sz.combine_chunk);
  set_bandwidth(row, bytes.dispatch_per_rank, bytes.combine_per_rank, ceilings.p2p_gbps);
}

int visible_gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// Whether this rank's GPU fits both padded buffers, agreed by all ranks (so all skip or none).
[[maybe_unused]] bool all_ranks_fit(const Communicator& comm, size_t need, std::string& why) {
  size_t free_b = 0, total_b = 0;
  cuda_check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  const int fits = free_b >= need + (size_t{1} << 30);  // keep 1 GiB for NCCL's own buffers
  std::vector<int> all(comm.world_size());
  comm.allgather(&fits, sizeof fits, all.data());
  if (std::count(all.begin(), all.end(), 0) == 0) return true;
  why = detail::concat("skipped: padded buffers need ", need, " bytes per rank (+1 GiB); rank ", comm.rank(),
                       " has ", free_b, " free");
  return false;
}

}  // namespace

int distinct_gpus(const Communicator& comm) {
  std::array<char, 128> me{};
  char host[64] = {};
  gethostname(host, sizeof host - 1);
  char bus[32] = {};
  cuda_check(cudaDeviceGetPCIBusId(bus, sizeof bus, comm.device()), "cudaDeviceGetPCIBusId");
  std::snprintf(me.data(), me.size(), "%s/%s", host, bus);
  std::vector<std::array<char, 128>> all(comm.world_size());
  comm.allgather(me.data(), me.size(), all.data());
  std::set<std::string> distinct;
  for (const auto& a : all) distinct.insert(a.data());
  return static_cast<int>(distinct.size());
}

std::string nvshmem_baseline_skip_reason(const Communicator& comm) {
  if (comm.nvshmem_collectives_supported()) return "";
  return detail::concat("skipped: NVSHMEM refuses its collectives when PEs share a GPU without MPS "
                        "(\"limited MPG\"), and ends the process; ", comm.world_size(), " ranks on ",
                        visible_gpus(), " visible GPU(s)");
}

size_t dense_buffer_bytes(const AllToAllConfig& cfg) { return dense_sizes(cfg).buffer; }

struct NcclBaseline::Impl {
#ifdef EPKIT_BENCH_HAVE_NCCL
  ncclComm_t comm = nullptr;
#endif
};

NcclBaseline::NcclBaseline(const Communicator& comm, NcclMode mode) : comm_(comm), mode_(mode) {
  impl_ = std::make_unique<Impl>();
#ifndef EPKIT_BENCH_HAVE_NCCL
  reason_ = "epkit-bench was built without NCCL (cmake/NCCL.cmake found none)";
#else
  // NCCL refuses two ranks on one GPU (epkit's functional runs do that); find out before it does.
  const int gpus = distinct_gpus(comm);
  if (gpus != comm.world_size()) {
    reason_ = detail::concat("skipped: NCCL needs one rank per GPU; ", comm.world_size(), " ranks share ", gpus,
                             " GPUs");
    return;
  }
  ncclUniqueId id{};
  if (comm.rank() == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    EPKIT_CHECK(r == ncclSuccess, "ncclGetUniqueId failed: ", ncclGetErrorString(r));
  }
  comm.broadcast(&id, sizeof id, 0);
  const ncclResult_t r = ncclCommInitRank(&impl_->comm, comm.world_size(), id, comm.rank());
  if (r != ncclSuccess) {
    reason_ = detail::concat("skipped: ncclCommInitRank failed: ", ncclGetErrorString(r));
    impl_->comm = nullptr;
    return;
  }
  available_ = true;
#endif
}

NcclBaseline::~NcclBaseline() {
#ifdef EPKIT_BENCH_HAVE_NCCL
  if (impl_ && impl_->comm) ncclCommDestroy(impl_->comm);
#endif
}

std::string NcclBaseline::version() const {
#ifdef EPKIT_BENCH_HAVE_NCCL
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  return detail::concat(v / 10000, ".", (v / 100) % 100, ".", v % 100);  // NCCL >= 2.9 encoding
#else
  return "none";
#endif
}

Row NcclBaseline::run(const Case& c, const AlgorithmicBytes& bytes, const Options& opt, const Ceilings& ceilings,
                      cudaStream_t stream) {
  Row row = make_row_identity(c, "nccl");
  if (!available_) {
    row.note = reason_;
    return row;
  }
#ifdef EPKIT_BENCH_HAVE_NCCL
  const DenseSizes sz = dense_sizes(c.cfg);
  if (!all_ranks_fit(comm_, 2 * sz.buffer, row.note)) return row;
  DeviceBuffer send(sz.buffer, "nccl send buffer"), recv(sz.buffer, "nccl recv buffer");
  fill_random(send.get(), DType::kUInt8, sz.buffer, 7);
  row.buffer_bytes = static_cast<int64_t>(send.bytes() + recv.bytes());
  const int world = comm_.world_size();
  ncclComm_t nc = impl_->comm;
  auto nccl_check = [](ncclResult_t r, const char* what) {
    EPKIT_CHECK(r == ncclSuccess, what, " failed: ", ncclGetErrorString(r));
  };
  std::function<void(size_t)> all_to_all;
#if NCCL_VERSION_CODE >= 22800
  if (mode_ == NcclMode::kAlltoAll) {
    row.path = "ncclAlltoAll, padded";
    all_to_all = [&](size_t chunk) {
      nccl_check(ncclAlltoAll(send.get(), recv.get(), chunk, ncclUint8, nc, stream), "ncclAlltoAll");
    };
  }
#endif
  if (!all_to_all) {
    row.path = "ncclSend/ncclRecv grouped, padded";
    if (mode_ == NcclMode::kAlltoAll) row.note = "ncclAlltoAll absent in this NCCL build; used grouped send/recv";
    all_to_all = [&](size_t chunk) {
      auto* s = static_cast<const uint8_t*>(send.get());
      auto* r = static_cast<uint8_t*>(recv.get());
      nccl_check(ncclGroupStart(), "ncclGroupStart");
      for (int p = 0; p < world; ++p) {
        nccl_check(ncclSend(s + p * chunk, chunk, ncclUint8, p, nc, stream), "ncclSend");
        nccl_check(ncclRecv(r + p * chunk, chunk, ncclUint8, p, nc, stream), "ncclRecv");
      }
      nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    };
  }
  time_dense(comm_, c, bytes, opt, ceilings, stream, sz, all_to_all, row);
#else
  (void)bytes, (void)opt, (void)ceilings, (void)stream, (void)mode_;
#endif
  return row;
}

Row run_nvshmem_baseline(const Communicator& comm, const Case& c, const AlgorithmicBytes& bytes, const Options& opt,
                         const Ceilings& ceilings, cudaStream_t stream) {
  Row row = make_row_identity(c, "nvshmem");
  row.path = "nvshmemx_alltoallmem_on_stream, padded";
  if (!comm.nvshmem_collectives_supported()) {
    row.note = nvshmem_baseline_skip_reason(comm);
    return row;
  }
  const DenseSizes sz = dense_sizes(c.cfg);
  // Symmetric allocation released on every exit path (collective, like the allocation).
  struct Sym {
    const Communicator& comm;
    void* p;
    ~Sym() { comm.symmetric_free(p); }
  };
  Sym src{comm, comm.symmetric_malloc(sz.buffer)};
  Sym dst{comm, comm.symmetric_malloc(sz.buffer)};
  fill_random(src.p, DType::kUInt8, sz.buffer, 11);
  row.symmetric_bytes = static_cast<int64_t>(2 * sz.buffer);
  time_dense(comm, c, bytes, opt, ceilings, stream, sz,
             [&](size_t chunk) { comm.alltoall_on_stream(dst.p, src.p, chunk, stream); }, row);
  return row;
}

}  // namespace epkit::bench
