// Host orchestration of AllToAll: config agreement, buffer allocation, argument validation, error
// reporting and kernel launches. No host synchronisation or allocation on the call path.
#include <nvshmem.h>
#include <nvshmemx.h>

#include <cstdlib>
#include <cstring>
#include <sstream>
#include <vector>

#include "epkit/all_to_all.hpp"
#include "epkit/error.hpp"
#include "host/local_shape.hpp"
#include "host/validate.hpp"
#include "kernels/launch.hpp"
#include "transport/control.cuh"
#include "transport/cuda_check.hpp"

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

// The combine grid's warps per slice (kernels::combine_grid_group).
int combine_group(const kernels::CommParams& p, int max_blocks) {
  const int64_t slices = static_cast<int64_t>(p.world_size) * p.max_msgs_per_src * p.combine_slices;
  return kernels::combine_grid_group(slices, static_cast<int64_t>(max_blocks) * kernels::kWarpsPerBlock, p.all_p2p != 0);
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
  cudaStream_t aux = nullptr;

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
  I.sym_layout = SymmetricLayout::make(cfg, every_rank_p2p);
  I.ws_layout = WorkspaceLayout::make(cfg);
  I.sym = static_cast<uint8_t*>(comm.symmetric_malloc(I.sym_layout.total_bytes));
  EPKIT_CUDA_CHECK(cudaMemset(I.sym, 0, I.sym_layout.total_bytes));
  EPKIT_CUDA_CHECK(cudaMalloc(&I.ws, I.ws_layout.total_bytes));
  EPKIT_CUDA_CHECK(cudaMemset(I.ws, 0, I.ws_layout.total_bytes));
  {  // DeviceState::seq is the next call's sequence number: 1 (zeroed buffers carry no call's tag)
    const uint64_t first_seq = 1;
    EPKIT_CUDA_CHECK(cudaMemcpy(I.ws + I.ws_layout.state + offsetof(kernels::DeviceState, seq), &first_seq,
                                sizeof(first_seq), cudaMemcpyHostToDevice));
  }
  EPKIT_CUDA_CHECK(cudaHostAlloc(&I.err_host, sizeof(ErrorRecord), cudaHostAllocMapped));
  std::memset(static_cast<void*>(I.err_host), 0, sizeof(ErrorRecord));
  EPKIT_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&I.err_dev), I.err_host, 0));
  EPKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&I.aux, cudaStreamNonBlocking));

  std::vector<uint8_t*> peers(cfg.world_size, nullptr);
  for (int r = 0; r < cfg.world_size; ++r) {
    if (cfg.path == DataPath::kPortable) break;
    peers[r] = static_cast<uint8_t*>(nvshmem_ptr(I.sym, r));
    if (peers[r] && r != cfg.rank) ++I.p2p_peers;
  }
  uint8_t** peer_dev = reinterpret_cast<uint8_t**>(I.ws + I.ws_layout.peer_bases);
  EPKIT_CUDA_CHECK(cudaMemcpy(peer_dev, peers.data(), peers.size() * sizeof(uint8_t*), cudaMemcpyHostToDevice));

  const MessageLayout& msg = I.sym_layout.msg;
  CommParams& p = I.params;
  p.rank = cfg.rank;
  p.world_size = cfg.world_size;
  p.dp_size = cfg.dp_size;
  p.num_experts = cfg.num_experts;
  p.num_local_experts = num_local_experts(cfg);
  p.rank_div = kernels::expert_rank_div(p.num_local_experts);
  p.group_index = cfg.rank % cfg.dp_size;
  p.dp_mul = kernels::small_div_mul(cfg.dp_size);
  p.topk = cfg.experts_per_token;
  p.hidden = cfg.hidden;
  p.max_tokens = cfg.max_tokens_per_rank;
  p.max_msgs_per_src = max_tokens_per_sender(cfg);
  p.capacity = effective_capacity(cfg);
  p.packed = cfg.layout == ExpertLayout::kPacked ? 1 : 0;
  p.packed_rows = p.packed ? static_cast<int>(effective_packed_rows(cfg)) : 0;
  p.packed_row_align = cfg.packed_row_align;
  p.num_scales = scales_per_token(cfg);
  p.msg_bytes = static_cast<int>(msg.bytes);
  p.header_bytes = static_cast<int>(msg.header_bytes);
  p.payload_bytes = static_cast<int>(msg.payload_bytes);
  p.topk_mul = kernels::small_div_mul(p.topk);
  for (int u : {kernels::kLocalSmallPieceChunks, kernels::kLocalLargePieceChunks, kernels::kLocalWidePieceChunks})
    p.piece_mul[kernels::piece_mul_index(u)] = kernels::small_div_mul(kernels::local_pieces_per_row(p.payload_bytes, u));
  for (int c = 1; c <= 2; ++c) p.wave_units_mul[c - 1] = kernels::small_div_mul(kernels::local_combine_units(p.hidden, c));
  p.payload_offset = static_cast<int>(msg.payload_offset);
  p.out_row_bytes = static_cast<int>(cfg.hidden * dtype_size(cfg.combine_out_dtype));
  p.dispatch_slices = static_cast<int>(msg.slices);
  p.combine_slices = static_cast<int>(I.sym_layout.combine_slices);
  p.dispatch_slices_mul = kernels::small_div_mul(p.dispatch_slices);
  p.combine_slices_mul = kernels::small_div_mul(p.combine_slices);
  p.counts_row_mul = kernels::small_div_mul(p.num_local_experts + 1);
  p.weights_at_dispatch = cfg.weights_at_dispatch ? 1 : 0;
  p.timeout_ns = static_cast<uint64_t>(resolved_timeout_ms(cfg)) * 1000000ull;
  p.sym = I.sym;
  p.peer_bases = peer_dev;
  for (int r = 0; r < kernels::kParamPeers; ++r) p.peer_param[r] = r < cfg.world_size ? peers[r] : nullptr;
  p.all_p2p = 1;
  for (uint8_t* pb : peers) p.all_p2p &= pb != nullptr ? 1 : 0;
  EPKIT_CHECK(p.all_p2p == (maps_all ? 1 : 0), "rank ", cfg.rank, ": nvshmem_ptr ",
              maps_all ? "lost" : "found", " a peer mapping between the control block and this object's buffers");
  // Tagged partials where the layout made room for them: every rank maps every peer (agreed above),
  // so every call takes the small P2P variants (such objects are too small for the large one).
  p.combine_row_bytes = static_cast<int>(I.sym_layout.combine_row_bytes);
  p.tagged_partials = p.combine_row_bytes == 2 * p.out_row_bytes ? 1 : 0;
  EPKIT_CHECK(!p.tagged_partials || !kernels::large_capable(p), "tagged partials on an object of ",
              p.max_msgs_per_src, " messages per source (the large variant does not read them)");
  const SymmetricLayout& s = I.sym_layout;
  p.off_dispatch_recv = s.dispatch_recv;
  p.off_dispatch_stage = s.dispatch_stage;
  p.off_dispatch_counts = s.dispatch_counts;
  p.off_dispatch_count_stage = s.dispatch_count_stage;
  p.off_dispatch_count_flag = s.dispatch_count_flag;
  p.off_dispatch_recv_ctr = s.dispatch_recv_ctr;
  p.off_weights_recv = s.weights_recv;
  p.off_weights_stage = s.weights_stage;
  p.off_weights_recv_ctr = s.weights_recv_ctr;
  p.off_combine_recv = s.combine_recv;
  p.off_combine_stage = s.combine_stage;
  p.off_combine_flag = s.combine_flag;
  p.off_barrier_flag = s.barrier_flag;
  const WorkspaceLayout& w = I.ws_layout;
  static_assert(sizeof(kernels::DeviceState) <= 4096, "DeviceState outgrew its workspace region");
  p.state = reinterpret_cast<kernels::DeviceState*>(I.ws + w.state);
  p.send_slot = reinterpret_cast<int32_t*>(I.ws + w.send_slot);
  p.num_msgs = reinterpret_cast<int32_t*>(I.ws + w.num_msgs);
  p.recv_base = reinterpret_cast<uint64_t*>(I.ws + w.recv_base);
  p.weights_base = reinterpret_cast<uint64_t*>(I.ws + w.weights_base);
  p.recv_map = reinterpret_cast<int32_t*>(I.ws + w.recv_map);
  p.block_hist = reinterpret_cast<int32_t*>(I.ws + w.block_hist);
  p.block_flag = reinterpret_cast<uint64_t*>(I.ws + w.block_flag);
  p.hist_stride = static_cast<int>(w.hist_stride);
  p.err = I.err_dev;
  p.local_counts = reinterpret_cast<int32_t*>(I.ws + w.local_counts);

  int dev = 0, sms = 0;
  EPKIT_CUDA_CHECK(cudaGetDevice(&dev));
  EPKIT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  // One block per SM at most: the fused kernels spin-wait, so every block must be resident. Fewer
  // when the largest possible call has less work than that: the general kernels one block per
  // decode unit (host::general_blocks), the local ones per local_shapes.
  int max_blocks = cfg.num_sms > 0 && cfg.num_sms < sms ? cfg.num_sms : sms;
  if (max_blocks > kMaxGridBlocks) max_blocks = kMaxGridBlocks;
  const host::GeneralBlocks gb = host::general_blocks(
      static_cast<int64_t>(p.world_size) * p.max_msgs_per_src, p.max_tokens, p.max_msgs_per_src, p.topk, p.dispatch_slices,
      p.combine_slices,
      kernels::combine_units(p.world_size, p.max_msgs_per_src, p.max_tokens, p.combine_slices,
                             combine_group(p, max_blocks)),
      max_blocks);
  I.dispatch_shape = {gb.dispatch, kernels::dispatch_smem_bytes(cfg.world_size, cfg.num_experts, cfg.experts_per_token)};
  I.combine_shape = {gb.combine, kernels::combine_smem_bytes(cfg.world_size)};
  I.local = cfg.world_size == 1 && local_kernels_enabled();
  if (I.local) {
    const host::LocalShapes ls =
        host::local_shapes(p.max_tokens, p.topk, cfg.num_experts, p.payload_bytes, cfg.hidden, max_blocks);
    I.dispatch_shape = ls.dispatch;
    I.combine_shape = ls.combine;
    p.local_piece_chunks = ls.piece_chunks;
  }
  EPKIT_CUDA_CHECK(cudaDeviceSynchronize());
  comm.barrier();  // every rank's buffers are zeroed before any peer writes into them
}

AllToAll::~AllToAll() {
  if (!impl_) return;
  Impl& I = *impl_;
  if (!I.dead && !peers_unreachable()) {
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


// One protocol step: fatal errors first, then call order, argument checks, the launch, and the
// state the next call expects. A step that ends a layer may raise recoverable device errors.
void AllToAll::Impl::dispatch_step(const DispatchArgs& a, cudaStream_t st, bool send, bool recv, const char* call) {
  raise_fatal();
  expect(send ? Next::kDispatchSend : Next::kDispatchRecv, call);
  const auto io = host::check_dispatch_args(cfg, a, send, recv, call, layer);
  EPKIT_CUDA_CHECK(local ? kernels::launch_local_dispatch(params, io, send, recv, dispatch_shape, st)
                         : kernels::launch_dispatch(params, io, send, recv, dispatch_shape, st));
  next = recv ? Next::kCombineSend : Next::kDispatchRecv;
}

void AllToAll::Impl::combine_step(const CombineArgs& a, cudaStream_t st, bool send, bool recv, const char* call) {
  raise_fatal();
  expect(send ? Next::kCombineSend : Next::kCombineRecv, call);
  const auto io = host::check_combine_args(cfg, a, send, recv, call, layer);
  EPKIT_CUDA_CHECK(local ? kernels::launch_local_combine(params, io, layer.combine_in, layer.combine_out, send, recv,
                                                         combine_shape, st)
                         : kernels::launch_combine(params, io, layer.combine_in, layer.combine_out, send, recv,
                                                   combine_shape, st));
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
