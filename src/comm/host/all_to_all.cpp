// Host orchestration of AllToAll: config agreement, buffer allocation, argument validation, error
// reporting and kernel launches. No host synchronisation or allocation on the call path.
#include <nvshmem.h>
#include <nvshmemx.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <vector>

#include "epkit/all_to_all.hpp"
#include "epkit/error.hpp"
#include "comm/host/comm_params.hpp"
#include "comm/host/launch_plan.hpp"
#include "comm/host/validate.hpp"
#include "comm/kernels/launch.hpp"
#include "transport/control.cuh"
#include "common/cuda_check.hpp"

namespace epkit {

using kernels::CommParams;
using kernels::ErrorRecord;

namespace {

enum class Next { kDispatchSend, kDispatchRecv, kCombineSend, kCombineRecv };
const char* next_name(Next n) {
  switch (n) {
    case Next::kDispatchSend: return "dispatch_send (or dispatch)";
    case Next::kDispatchRecv: return "dispatch_recv";
    case Next::kCombineSend: return "combine_send (or combine)";
    case Next::kCombineRecv: return "combine_recv";
  }
  return "?";
}
const char* phase_name(int p) {
  static const char* n[] = {"dispatch_send", "dispatch_recv", "combine_send", "combine_recv"};
  return p >= 0 && p < 4 ? n[p] : "?";
}
const char* wait_name(int w) {
  static const char* n[] = {"nothing", "the dispatch counts", "the dispatched tokens", "the router weights",
                            "the combine partial", "the combine-entry barrier flag",
                            "an earlier block's histogram (same rank)"};
  return w >= 0 && w < 7 ? n[w] : "?";
}

// EPKIT_LOCAL_KERNELS=0: world size 1 runs the general (multi-rank) kernels instead of the local
// ones, so that their fixed costs can be measured and A/B'd on one GPU. Any other value, or none:
// the local kernels.
bool local_kernels_enabled() {
  const char* e = std::getenv("EPKIT_LOCAL_KERNELS");
  return !(e && std::strcmp(e, "0") == 0);
}

}  // namespace

struct AllToAll::Impl {
  AllToAllConfig cfg;
  SymmetricLayout sym_layout;
  WorkspaceLayout ws_layout;
  uint8_t* sym = nullptr;
  uint8_t* ws = nullptr;
  ErrorRecord* err_host = nullptr;
  ErrorRecord* err_dev = nullptr;
  CommParams params{};
  kernels::LaunchShape dispatch_shape{}, combine_shape{};
  // World size 1: every call takes the local kernels (local.cu), which need no peer.
  bool local = false;
  int p2p_peers = 0;
  Next next = Next::kDispatchSend;
  host::LayerDTypes layer{};  // the dtypes the send halves of the layer in flight took from their tensors
  bool dead = false;
  bool single_process = false;  // world size 1 without a Communicator: no NVSHMEM anywhere
  cudaStream_t aux = nullptr;

  template <typename Alloc, typename PeerOf>
  void setup(bool every_rank_p2p, Alloc alloc_sym, PeerOf peer_of);
  void set_shapes();

  // Raises a recorded device error. Recoverable ones (capacity, bad index, m clamped) are raised
  // only where this rank has launched the whole layer (after combine's launch, or from check()):
  // raising them before a launch in mid-layer would leave peers waiting on this rank.
  void raise_pending(bool recoverable_too = true);
  void raise_fatal() { raise_pending(false); }
  void dispatch_step(const DispatchArgs& a, cudaStream_t st, bool send, bool recv, const char* call);
  void combine_step(const CombineArgs& a, cudaStream_t st, bool send, bool recv, const char* call);
  void expect(Next want, const char* call) const {
    EPKIT_CHECK(!dead, call, ": this AllToAll saw a device-side timeout earlier and is unusable");
    EPKIT_CHECK(next == want, call, " called out of order: the next call must be ", next_name(next));
  }
};

void AllToAll::Impl::raise_pending(bool recoverable_too) {
  const int code = err_host->code;
  if (code == kernels::kErrNone) return;
  if (code != kernels::kErrTimeout && !recoverable_too) return;
  std::ostringstream os;
  const ErrorRecord& e = *err_host;
  os << "epkit: ";
  bool fatal = false;
  switch (code) {
    case kernels::kErrTimeout:
      fatal = true;
      os << "rank " << e.rank << " timed out after " << params.timeout_ns / 1000000
         << " ms in " << phase_name(e.phase) << " waiting for " << wait_name(e.what) << " from rank " << e.peer;
      if (e.token >= 0) os << " (token " << e.token << ")";
      os << " [call " << e.seq << ": flag = " << e.value << ", expected " << e.limit
         << "]. Rank " << e.peer
         << " is dead, stuck, or skipped a call. This AllToAll is unusable; NVSHMEM will not be finalized.";
      break;
    case kernels::kErrCapacity:
      os << "capacity overflow in dispatch_recv on rank " << e.rank << ": expert " << e.expert << " received "
         << e.value << " tokens but capacity = " << e.limit << "; " << (e.value - e.limit)
         << " were dropped and contribute nothing to combine. Raise AllToAllConfig::capacity (max M * W / D = "
         << static_cast<int64_t>(cfg.max_tokens_per_rank) * (cfg.world_size / cfg.dp_size) << ")";
      break;
    case kernels::kErrPackedRows:
      os << "packed rows overflow in dispatch_recv on rank " << e.rank << ": expert " << e.expert
         << " needs rows up to " << e.value << " but packed_rows = " << e.limit
         << "; its rows from there on and those of every later local expert that did not fit were dropped and "
            "contribute nothing to combine. Raise AllToAllConfig::packed_rows (0 selects the bound "
         << packed_row_bound(cfg) << ", which cannot overflow)";
      break;
    case kernels::kErrExpertIndex:
      os << "topk_idx holds expert " << e.value << " (token " << e.token << ", " << phase_name(e.phase)
         << " on rank " << e.rank << ") but num_experts = " << e.limit << "; the entry was skipped";
      break;
    case kernels::kErrNumTokens:
      os << "num_tokens_device holds m = " << e.value << " (" << phase_name(e.phase) << " on rank " << e.rank
         << ") but the limit is " << e.limit << " = min(max_tokens_per_rank, rows); it was clamped";
      break;
    default:
      os << "unknown device error code " << code;
  }
  if (fatal) {
    dead = true;
    mark_peers_unreachable();
  } else {
    // Recoverable: the protocol completed. Re-arm the record for the next error.
    err_host->code = kernels::kErrNone;
    cudaMemsetAsync(&params.state->error_lock, 0, sizeof(int32_t), aux);
  }
  throw Error(os.str());
}

// Allocates and zeroes the buffers (the symmetric region through `alloc_sym`), and builds the
// kernels' parameters with each rank's address of our symmetric base (`peer_of`, null: no P2P).
template <typename Alloc, typename PeerOf>
void AllToAll::Impl::setup(bool every_rank_p2p, Alloc alloc_sym, PeerOf peer_of) {
  sym_layout = SymmetricLayout::make(cfg, every_rank_p2p);
  ws_layout = WorkspaceLayout::make(cfg);
  sym = alloc_sym(sym_layout.total_bytes);
  EPKIT_CUDA_CHECK(cudaMemset(sym, 0, sym_layout.total_bytes));
  EPKIT_CUDA_CHECK(cudaMalloc(&ws, ws_layout.total_bytes));
  EPKIT_CUDA_CHECK(cudaMemset(ws, 0, ws_layout.total_bytes));
  {  // DeviceState::seq is the next call's sequence number: 1 (zeroed buffers carry no call's tag)
    const uint64_t first_seq = 1;
    EPKIT_CUDA_CHECK(cudaMemcpy(ws + ws_layout.state + offsetof(kernels::DeviceState, seq), &first_seq,
                                sizeof(first_seq), cudaMemcpyHostToDevice));
  }
  EPKIT_CUDA_CHECK(cudaHostAlloc(&err_host, sizeof(ErrorRecord), cudaHostAllocMapped));
  std::memset(static_cast<void*>(err_host), 0, sizeof(ErrorRecord));
  EPKIT_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&err_dev), err_host, 0));
  EPKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&aux, cudaStreamNonBlocking));
  std::vector<uint8_t*> peers(cfg.world_size, nullptr);
  for (int r = 0; r < cfg.world_size; ++r) {
    peers[r] = peer_of(r);
    if (peers[r] && r != cfg.rank) ++p2p_peers;
  }
  EPKIT_CUDA_CHECK(cudaMemcpy(ws + ws_layout.peer_bases, peers.data(), peers.size() * sizeof(uint8_t*),
                              cudaMemcpyHostToDevice));
  params = host::make_comm_params(cfg, sym_layout, ws_layout, {sym, ws, peers, err_dev});
}

// The grids of every call: one block per SM at most (the fused kernels spin-wait, so every block
// must be resident), fewer when the largest possible call has less work (host::object_shapes).
void AllToAll::Impl::set_shapes() {
  int dev = 0, sms = 0;
  EPKIT_CUDA_CHECK(cudaGetDevice(&dev));
  EPKIT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int max_blocks = std::min({cfg.num_sms > 0 ? cfg.num_sms : sms, sms, kMaxGridBlocks});
  const host::ObjectShapes shapes = host::object_shapes(params, max_blocks, local);
  dispatch_shape = shapes.dispatch;
  combine_shape = shapes.combine;
  params.local_piece_chunks = shapes.local_piece_chunks;
}

AllToAll::AllToAll(const Communicator& comm, const AllToAllConfig& cfg_in) : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.cfg = cfg_in;
  const AllToAllConfig& cfg = I.cfg;
  I.layer = host::config_dtypes(cfg);

  // Agreement first (collective, fixed size), so that a config that is bad on one rank fails on all.
  std::string local_error;
  try {
    validate(cfg);
    EPKIT_CHECK(cfg.world_size == comm.world_size(), "world_size = ", cfg.world_size,
                " but the communicator has ", comm.world_size(), " ranks");
    EPKIT_CHECK(cfg.rank == comm.rank(), "rank = ", cfg.rank, " but the communicator's rank is ", comm.rank());
    (void)resolved_timeout_ms(cfg);
  } catch (const Error& e) {
    local_error = e.what();
  }
  auto fields = agreement_fields(cfg);
  const int nf = static_cast<int>(fields.size());
  std::vector<int64_t> mine(nf + 1), all(static_cast<size_t>(nf + 1) * comm.world_size());
  for (int i = 0; i < nf; ++i) mine[i] = fields[i].second;
  mine[nf] = local_error.empty() ? 1 : 0;
  comm.allgather(mine.data(), mine.size() * sizeof(int64_t), all.data());
  if (!local_error.empty()) throw Error("AllToAll config rejected on rank " + std::to_string(comm.rank()) + ": " + local_error);
  for (int r = 0; r < comm.world_size(); ++r)
    EPKIT_CHECK(all[static_cast<size_t>(r) * (nf + 1) + nf] == 1, "AllToAll config rejected on rank ", r,
                " (see that rank's error)");
  for (int i = 0; i < nf; ++i)
    for (int r = 0; r < comm.world_size(); ++r) {
      const int64_t v = all[static_cast<size_t>(r) * (nf + 1) + i];
      EPKIT_CHECK(v == mine[i], "AllToAll config mismatch on field '", fields[i].first, "': rank ", comm.rank(),
                  " has ", mine[i], ", rank ", r, " has ", v);
    }

  // Whether every rank maps every peer decides the width of combine_recv's rows and so whether
  // combine's partials travel as tagged words (layout.hpp), which both ends of every pair must agree
  // on. The ranks agree on it here, before the allocation, whose size must match everywhere
  // (nvshmem_ptr answers the same for every symmetric allocation: checked below on the real one).
  const bool maps_all = cfg.path != DataPath::kPortable && [&] {
    for (int r = 0; r < cfg.world_size; ++r)
      if (!comm.maps_peer(r)) return false;
    return true;
  }();
  bool every_rank_p2p = true;
  {
    const int32_t mine = maps_all ? 1 : 0;
    std::vector<int32_t> all(cfg.world_size);
    comm.allgather(&mine, sizeof(mine), all.data());
    for (int32_t v : all) every_rank_p2p = every_rank_p2p && v != 0;
  }
  I.setup(every_rank_p2p, [&](size_t bytes) { return static_cast<uint8_t*>(comm.symmetric_malloc(bytes)); },
          [&](int r) { return cfg.path == DataPath::kPortable ? nullptr : static_cast<uint8_t*>(nvshmem_ptr(I.sym, r)); });
  EPKIT_CHECK(I.params.all_p2p == (maps_all ? 1 : 0), "rank ", cfg.rank, ": nvshmem_ptr ",
              maps_all ? "lost" : "found", " a peer mapping between the control block and this object's buffers");
  I.local = cfg.world_size == 1 && local_kernels_enabled();
  I.set_shapes();
  EPKIT_CUDA_CHECK(cudaDeviceSynchronize());
  comm.barrier();  // every rank's buffers are zeroed before any peer writes into them
}

AllToAll::AllToAll(const AllToAllConfig& cfg_in) : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.cfg = cfg_in;
  const AllToAllConfig& cfg = I.cfg;
  EPKIT_CHECK(cfg.world_size == 1 && cfg.rank == 0, "AllToAll without a Communicator is the world-size-1 path: "
              "world_size = ", cfg.world_size, ", rank = ", cfg.rank, " (must be 1 and 0; other world sizes "
              "need a Communicator)");
  validate(cfg);
  (void)resolved_timeout_ms(cfg);
  I.layer = host::config_dtypes(cfg);
  I.single_process = true;
  // No peer and no NVSHMEM: the "symmetric" region (the split halves' staging) is plain device memory.
  I.setup(true,
          [](size_t bytes) {
            uint8_t* p = nullptr;
            EPKIT_CUDA_CHECK(cudaMalloc(&p, bytes));
            return p;
          },
          [&](int) { return I.sym; });
  I.local = true;
  I.set_shapes();
  EPKIT_CUDA_CHECK(cudaDeviceSynchronize());
}

AllToAll::~AllToAll() {
  if (!impl_) return;
  Impl& I = *impl_;
  if (I.single_process) {
    cudaDeviceSynchronize();
    cudaFree(I.sym);
  } else if (!I.dead && !peers_unreachable()) {
    cudaDeviceSynchronize();
    try {
      transport::control_barrier();  // no peer may still write into our buffers when we free them
      nvshmem_free(I.sym);
    } catch (const Error&) {
      // A peer never arrived: leak the buffers rather than free memory a peer may still write.
    }
  }
  cudaFree(I.ws);
  cudaFreeHost(I.err_host);
  if (I.aux) cudaStreamDestroy(I.aux);
}

const AllToAllConfig& AllToAll::config() const { return impl_->cfg; }
size_t AllToAll::symmetric_bytes() const { return impl_->sym_layout.total_bytes; }
size_t AllToAll::workspace_bytes() const { return impl_->ws_layout.total_bytes; }
int AllToAll::num_p2p_peers() const { return impl_->p2p_peers; }

void AllToAll::check() const { impl_->raise_pending(); }
bool AllToAll::failed() const { return impl_->dead || impl_->err_host->code == kernels::kErrTimeout; }


// One protocol step: fatal errors first, then call order, argument checks, the launch, and the
// state the next call expects. A step that ends a layer may raise recoverable device errors.
void AllToAll::Impl::dispatch_step(const DispatchArgs& a, cudaStream_t st, bool send, bool recv, const char* call) {
  raise_fatal();
  expect(send ? Next::kDispatchSend : Next::kDispatchRecv, call);
  const auto io = host::check_dispatch_args(cfg, a, send, recv, call, layer);
  if (local) {
    const kernels::LocalFusedDispatch one_path =
        send && recv && io.m.dev_m == nullptr
            ? host::local_fused_dispatch(kernels::local_large(params), io.m.host_m, params.topk, params.payload_bytes,
                                         dispatch_shape.blocks * kernels::kWarpsPerBlock)
            : kernels::LocalFusedDispatch{false, kernels::LocalSmallPath::kRank, 0};
    EPKIT_CUDA_CHECK(kernels::launch_local_dispatch(params, io, one_path, send, recv, dispatch_shape, st));
  } else {
    EPKIT_CUDA_CHECK(kernels::launch_dispatch(params, io, host::dispatch_kernel(params, io.m, dispatch_shape.blocks),
                                              send, recv, dispatch_shape, st));
  }
  next = recv ? Next::kCombineSend : Next::kDispatchRecv;
}

void AllToAll::Impl::combine_step(const CombineArgs& a, cudaStream_t st, bool send, bool recv, const char* call) {
  raise_fatal();
  expect(send ? Next::kCombineSend : Next::kCombineRecv, call);
  const auto io = host::check_combine_args(cfg, a, send, recv, call, layer);
  if (local) {
    const int wave = send && recv && io.m.dev_m == nullptr
                         ? host::local_fused_combine_chunks(io.m.host_m, params.hidden,
                                                            combine_shape.blocks * kernels::kWarpsPerBlock)
                         : 0;
    EPKIT_CUDA_CHECK(kernels::launch_local_combine(params, io, wave, layer.combine_in, layer.combine_out, send, recv,
                                                   combine_shape, st));
  } else {
    EPKIT_CUDA_CHECK(kernels::launch_combine(params, io, host::combine_kernel(params, io.m), layer.combine_in,
                                             layer.combine_out, send, recv, combine_shape, st));
  }
  next = recv ? Next::kDispatchSend : Next::kCombineRecv;
  if (recv) raise_pending();  // the layer is fully launched: recoverable errors may surface now
}

void AllToAll::dispatch_send(const DispatchArgs& a, cudaStream_t st) { impl_->dispatch_step(a, st, true, false, "dispatch_send"); }
void AllToAll::dispatch_recv(const DispatchArgs& a, cudaStream_t st) { impl_->dispatch_step(a, st, false, true, "dispatch_recv"); }
void AllToAll::dispatch(const DispatchArgs& a, cudaStream_t st) { impl_->dispatch_step(a, st, true, true, "dispatch"); }
void AllToAll::combine_send(const CombineArgs& a, cudaStream_t st) { impl_->combine_step(a, st, true, false, "combine_send"); }
void AllToAll::combine_recv(const CombineArgs& a, cudaStream_t st) { impl_->combine_step(a, st, false, true, "combine_recv"); }
void AllToAll::combine(const CombineArgs& a, cudaStream_t st) { impl_->combine_step(a, st, true, true, "combine"); }

}  // namespace epkit
