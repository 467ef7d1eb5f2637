#include "common/buffer_layout.hpp"

#include "epkit/error.hpp"
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
  m.header_bytes = align_up(16 + (c.weights_at_dispatch ? 12 : 8) * static_cast<size_t>(c.topk), 16);
  m.scale_bytes = align_up(static_cast<size_t>(scales_per_token(c)) * sizeof(float), 16);
  m.payload_bytes = static_cast<size_t>(c.hidden) * dtype_size(c.dispatch_dtype);
  m.payload_offset = m.header_bytes + m.scale_bytes;
  m.bytes = m.payload_offset + m.payload_bytes;
  m.slices = (m.payload_bytes + kSliceBytes - 1) / kSliceBytes;
  return m;
}

SymmetricLayout SymmetricLayout::make(const AllToAllConfig& c, bool every_rank_p2p) {
  SymmetricLayout s;
  s.msg = MessageLayout::make(c);
  const size_t W = c.world_size, L = num_local_experts(c), K = c.topk, M = c.max_tokens_per_rank;
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
  const bool tagged = every_rank_p2p && c.path != DataPath::kPortable && c.max_tokens_per_rank <= kTaggedPartialMaxTokens;
  s.combine_row_bytes = out_row * (tagged ? 2 : 1);
  s.combine_recv = cv.take(W * M * s.combine_row_bytes);
  s.combine_stage = cv.take(W * S * out_row);
  s.combine_slices = (out_row + kSliceBytes - 1) / kSliceBytes;
  s.combine_flag = cv.take(W * M * s.combine_slices * sizeof(uint64_t));
  s.barrier_flag = cv.take(W * sizeof(uint64_t));
  s.total_bytes = cv.cursor;
  return s;
}

WorkspaceLayout WorkspaceLayout::make(const AllToAllConfig& c) {
  WorkspaceLayout w;
  const size_t W = c.world_size, K = c.topk, S = max_tokens_per_sender(c);
  Carver cv;
  w.state = cv.take(4096);  // DeviceState; its size is checked against this bound at compile time
  w.send_slot = cv.take(S * W * sizeof(int32_t));
  w.num_msgs = cv.take(W * sizeof(int32_t));
  w.recv_base = cv.take(W * sizeof(uint64_t));
  w.weights_base = cv.take(W * sizeof(uint64_t));
  w.recv_map = cv.take(W * S * (kRecvMapHead + K) * sizeof(int32_t));
  w.peer_bases = cv.take(W * sizeof(void*));
  w.hist_stride = align_up(static_cast<size_t>(c.num_experts) + W, 4);
  w.block_hist = cv.take(kMaxGridBlocks * w.hist_stride * sizeof(int32_t));
  w.block_flag = cv.take(kMaxGridBlocks * sizeof(uint64_t));
  w.local_counts = cv.take(W == 1 ? static_cast<size_t>(c.num_experts) * sizeof(int32_t) : 0);
  w.total_bytes = cv.cursor;
  return w;
}

}  // namespace epkit

namespace epkit {

size_t symmetric_heap_bytes(const AllToAllConfig& c) { return SymmetricLayout::make(c, true).total_bytes; }

int64_t packed_row_bound(const AllToAllConfig& c) {
  const int64_t L = num_local_experts(c), K = c.topk, a = c.packed_row_align;
  const int64_t per_expert = static_cast<int64_t>(c.max_tokens_per_rank) * num_dp_groups(c);
  const int64_t n = per_expert * (K < L ? K : L);
  const int64_t first = n < L ? n : L;  // experts that can hold a row, one token each
  const int64_t runs = first + (n - first) / a;
  const int64_t by_rows = runs * a;
  const int64_t by_experts = L * ((per_expert + a - 1) / a * a);
  return by_rows < by_experts ? by_rows : by_experts;
}

int64_t effective_packed_rows(const AllToAllConfig& c) { return c.packed_rows ? c.packed_rows : packed_row_bound(c); }

int64_t expert_rows(const AllToAllConfig& c) {
  return c.layout == ExpertLayout::kPacked ? effective_packed_rows(c)
                                           : static_cast<int64_t>(num_local_experts(c)) * effective_capacity(c);
}

ExpertShapes ExpertShapes::make(const AllToAllConfig& c) {
  ExpertShapes s;
  const int64_t H = c.hidden, ns = scales_per_token(c);
  if (c.layout == ExpertLayout::kPacked) {
    const int64_t R = effective_packed_rows(c);
    s.ndim = 2;
    s.expert_x[0] = R, s.expert_x[1] = H;
    s.expert_x_scale[0] = R, s.expert_x_scale[1] = ns;
    s.expert_offsets = num_local_experts(c) + 1;
  } else {
    s.ndim = 3;
    s.expert_x[0] = num_local_experts(c), s.expert_x[1] = effective_capacity(c), s.expert_x[2] = H;
    s.expert_x_scale[0] = s.expert_x[0], s.expert_x_scale[1] = s.expert_x[1], s.expert_x_scale[2] = ns;
    if (c.expert_scales_mn_major) s.expert_x_scale[1] = ns, s.expert_x_scale[2] = s.expert_x[1];
  }
  return s;
}

ExpertTensorBytes ExpertTensorBytes::make(const AllToAllConfig& c) {
  ExpertTensorBytes b;
  const size_t rows = static_cast<size_t>(expert_rows(c)), H = c.hidden;
  b.expert_x = rows * H * dtype_size(c.dispatch_dtype);
  b.expert_x_scale = rows * static_cast<size_t>(scales_per_token(c)) * sizeof(float);
  b.expert_y = rows * H * dtype_size(c.combine_in_dtype);
  b.expert_offsets = c.layout == ExpertLayout::kPacked ? (static_cast<size_t>(num_local_experts(c)) + 1) * 4 : 0;
  b.total = b.expert_x + b.expert_x_scale + b.expert_y;
  return b;
}

ExpertPlacement ExpertPlacement::make(const AllToAllConfig& c, const std::vector<int>& received) {
  const int L = num_local_experts(c);
  EPKIT_CHECK(static_cast<int>(received.size()) == L, "ExpertPlacement: ", received.size(),
              " counts given, expected L = ", L);
  ExpertPlacement p;
  p.first_row.resize(L);
  p.count.resize(L);
  if (c.layout == ExpertLayout::kPacked) {
    const int64_t R = effective_packed_rows(c), a = c.packed_row_align;
    p.offsets.resize(static_cast<size_t>(L) + 1);
    int64_t at = 0;
    for (int e = 0; e < L; ++e) {
      const int64_t first = at < R ? at : R;
      const int64_t room = R - first;
      p.offsets[e] = first;
      p.first_row[e] = first;
      p.count[e] = static_cast<int>(received[e] < room ? received[e] : room);
      p.overflow |= p.count[e] < received[e];
      at += (received[e] + a - 1) / a * a;
    }
    p.offsets[L] = at < R ? at : R;
  } else {
    const int cap = effective_capacity(c);
    for (int e = 0; e < L; ++e) {
      p.first_row[e] = static_cast<int64_t>(e) * cap;
      p.count[e] = received[e] < cap ? received[e] : cap;
      p.overflow |= p.count[e] < received[e];
    }
  }
  return p;
}

}  // namespace epkit
