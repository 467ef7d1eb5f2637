#include "epkit/layout.hpp"

#include "epkit/types.hpp"

namespace epkit {

namespace {
// Every region starts on a 256-byte boundary so that 16-byte vector and TMA accesses stay aligned.
constexpr size_t kRegionAlign = 256;

struct Carver {
  size_t cursor = 0;
  size_t take(size_t bytes) {
    size_t at = cursor;
    cursor = align_up(cursor + bytes, kRegionAlign);
    return at;
  }
};
}  // namespace

MessageLayout MessageLayout::make(const AllToAllConfig& c) {
  MessageLayout m;
  m.header_bytes = align_up(16 + (c.weights_at_dispatch ? 12 : 8) * static_cast<size_t>(c.experts_per_token), 16);
  m.scale_bytes = align_up(static_cast<size_t>(scales_per_token(c)) * sizeof(float), 16);
  m.payload_bytes = static_cast<size_t>(c.hidden) * dtype_size(c.dispatch_dtype);
  m.payload_offset = m.header_bytes + m.scale_bytes;
  m.bytes = m.payload_offset + m.payload_bytes;
  m.slices = (m.payload_bytes + kSliceBytes - 1) / kSliceBytes;
  return m;
}

SymmetricLayout SymmetricLayout::make(const AllToAllConfig& c) {
  SymmetricLayout s;
  s.msg = MessageLayout::make(c);
  const size_t W = c.world_size, L = num_local_experts(c), K = c.experts_per_token, M = c.max_tokens_per_rank;
  const size_t S = max_tokens_per_sender(c);
  const size_t out_row = static_cast<size_t>(c.hidden) * dtype_size(c.combine_out_dtype);
  s.max_msgs_per_src = S;
  Carver cv;
  s.dispatch_recv = cv.take(W * S * s.msg.bytes);
  s.dispatch_stage = cv.take(S * s.msg.bytes);
  s.dispatch_counts = cv.take(W * (L + 1) * sizeof(uint64_t));
  s.dispatch_count_stage = cv.take(W * (L + 1) * sizeof(uint64_t));
  s.dispatch_count_flag = cv.take(W * sizeof(uint64_t));
  s.dispatch_recv_ctr = cv.take(W * sizeof(uint64_t));
  s.weights_recv = cv.take(W * S * K * sizeof(uint64_t));
  s.weights_stage = cv.take(S * K * sizeof(uint64_t));
  s.weights_recv_ctr = cv.take(W * sizeof(uint64_t));
  s.combine_recv = cv.take(W * M * out_row);
  s.combine_stage = cv.take(W * S * out_row);
  s.combine_slices = (out_row + kSliceBytes - 1) / kSliceBytes;
  s.combine_flag = cv.take(W * M * s.combine_slices * sizeof(uint64_t));
  s.barrier_flag = cv.take(W * sizeof(uint64_t));
  s.total_bytes = cv.cursor;
  return s;
}

WorkspaceLayout WorkspaceLayout::make(const AllToAllConfig& c) {
  WorkspaceLayout w;
  const size_t W = c.world_size, K = c.experts_per_token, S = max_tokens_per_sender(c);
  Carver cv;
  w.state = cv.take(4096);  // DeviceState; its size is checked against this bound at compile time
  w.send_slot = cv.take(S * W * sizeof(int32_t));
  w.num_msgs = cv.take(W * sizeof(int32_t));
  w.recv_base = cv.take(W * sizeof(uint64_t));
  w.weights_base = cv.take(W * sizeof(uint64_t));
  w.recv_map = cv.take(W * S * (K + 1) * sizeof(int32_t));
  w.peer_bases = cv.take(W * sizeof(void*));
  w.hist_stride = align_up(static_cast<size_t>(c.num_experts) + W, 4);
  w.block_hist = cv.take(kMaxGridBlocks * w.hist_stride * sizeof(int32_t));
  w.block_flag = cv.take(kMaxGridBlocks * sizeof(uint64_t));
  w.total_bytes = cv.cursor;
  return w;
}

}  // namespace epkit
