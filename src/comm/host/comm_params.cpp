#include "comm/host/comm_params.hpp"

#include "comm/host/launch_plan.hpp"
#include "comm/kernels/fastdiv.hpp"
#include "comm/local/mapping.hpp"
#include "epkit/error.hpp"
#include "epkit/shapes.hpp"

namespace epkit::host {

kernels::CommParams make_comm_params(const AllToAllConfig& cfg, const SymmetricLayout& s, const WorkspaceLayout& w,
                                     const CommAddresses& at) {
  EPKIT_CHECK(static_cast<int>(at.peers.size()) == cfg.world_size, "make_comm_params: ", at.peers.size(),
              " peer addresses for world_size = ", cfg.world_size);
  using kernels::small_div_mul;
  const MessageLayout& msg = s.msg;
  kernels::CommParams p{};
  p.rank = cfg.rank;
  p.world_size = cfg.world_size;
  p.dp_size = cfg.dp_size;
  p.num_experts = cfg.num_experts;
  p.num_local_experts = num_local_experts(cfg);
  p.rank_div = kernels::expert_rank_div(p.num_local_experts);
  p.group_index = cfg.rank % cfg.dp_size;
  p.dp_mul = small_div_mul(cfg.dp_size);
  p.topk = cfg.topk;
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
  p.payload_offset = static_cast<int>(msg.payload_offset);
  p.out_row_bytes = static_cast<int>(cfg.hidden * dtype_size(cfg.combine_out_dtype));
  p.dispatch_slices = static_cast<int>(msg.slices);
  p.combine_slices = static_cast<int>(s.combine_slices);
  p.weights_at_dispatch = cfg.weights_at_dispatch ? 1 : 0;
  p.timeout_ns = static_cast<uint64_t>(resolved_timeout_ms(cfg)) * 1000000ull;
  // The multipliers of the kernels' unit arithmetic (fastdiv.hpp).
  p.topk_mul = small_div_mul(p.topk);
  for (int u : {kernels::kLocalSmallPieceChunks, kernels::kLocalLargePieceChunks, kernels::kLocalWidePieceChunks})
    p.piece_mul[kernels::piece_mul_index(u)] = small_div_mul(kernels::local_pieces_per_row(p.payload_bytes, u));
  for (int c = 1; c <= 2; ++c) p.wave_units_mul[c - 1] = small_div_mul(kernels::local_combine_units(p.hidden, c));
  p.dispatch_slices_mul = small_div_mul(p.dispatch_slices);
  p.combine_slices_mul = small_div_mul(p.combine_slices);
  p.counts_row_mul = small_div_mul(p.num_local_experts + 1);
  p.scales_mn_major = cfg.expert_scales_mn_major ? 1 : 0;
  p.capacity_mul = small_div_mul(p.capacity > 0 ? p.capacity : 1);
  // Peers: the first kParamPeers travel in the parameters, all of them in the workspace's table.
  p.sym = at.sym;
  p.peer_bases = reinterpret_cast<uint8_t* const*>(at.workspace + w.peer_bases);
  for (int r = 0; r < kernels::kParamPeers; ++r) p.peer_param[r] = r < cfg.world_size ? at.peers[r] : nullptr;
  p.all_p2p = 1;
  for (uint8_t* pb : at.peers) p.all_p2p &= pb != nullptr ? 1 : 0;
  // Tagged partials where the layout made room for them: every rank maps every peer (agreed before
  // the allocation), so every call takes the small P2P variants (such objects are too small for the
  // large one).
  p.combine_row_bytes = static_cast<int>(s.combine_row_bytes);
  p.tagged_partials = p.combine_row_bytes == 2 * p.out_row_bytes ? 1 : 0;
  EPKIT_CHECK(!p.tagged_partials || !large_capable(p), "tagged partials on an object of ", p.max_msgs_per_src,
              " messages per source (the large variant does not read them)");
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
  static_assert(sizeof(kernels::DeviceState) <= 4096, "DeviceState outgrew its workspace region");
  uint8_t* ws = at.workspace;
  p.state = reinterpret_cast<kernels::DeviceState*>(ws + w.state);
  p.send_slot = reinterpret_cast<int32_t*>(ws + w.send_slot);
  p.num_msgs = reinterpret_cast<int32_t*>(ws + w.num_msgs);
  p.recv_base = reinterpret_cast<uint64_t*>(ws + w.recv_base);
  p.weights_base = reinterpret_cast<uint64_t*>(ws + w.weights_base);
  p.recv_map = reinterpret_cast<int32_t*>(ws + w.recv_map);
  p.block_hist = reinterpret_cast<int32_t*>(ws + w.block_hist);
  p.block_flag = reinterpret_cast<uint64_t*>(ws + w.block_flag);
  p.hist_stride = static_cast<int>(w.hist_stride);
  p.local_counts = reinterpret_cast<int32_t*>(ws + w.local_counts);
  p.err = at.error;
  return p;
}

}  // namespace epkit::host
