#include "comm/host/validate.hpp"

#include <cstdint>
#include <initializer_list>
#include <string>

#include "epkit/error.hpp"
#include "common/buffer_layout.hpp"

namespace epkit::host {

namespace {

// The few dtypes a tensor may have, held without allocating.
struct DTypes {
  DType d[4] = {};
  int n = 0;
  DTypes(std::initializer_list<DType> l) {
    for (DType x : l)
      if (n < 4) d[n++] = x;
  }
  bool has(DType x) const {
    for (int i = 0; i < n; ++i)
      if (d[i] == x) return true;
    return false;
  }
};

const DTypes kIndexTypes = {DType::kInt32, DType::kInt64, DType::kUInt32};
const DTypes k16BitTypes = {DType::kBF16, DType::kFP16};

// What a call may pass where the config says `d` (see LayerDTypes): the types of d's element size.
DTypes payload_types(DType d) { return d == DType::kFP8E4M3 ? DTypes{d} : k16BitTypes; }
DTypes combine_in_types(DType d) { return d == DType::kFP32 ? DTypes{d} : k16BitTypes; }

void check_dtype(const Tensor& t, const char* name, const DTypes& dtypes, const char* hint = "") {
  if (dtypes.has(t.dtype)) return;
  std::string allowed;  // built only on failure: no host allocation on the call path
  for (int i = 0; i < dtypes.n; ++i) allowed += (i ? " or " : "") + std::string(dtype_name(dtypes.d[i]));
  EPKIT_FAIL(name, " has dtype ", dtype_name(t.dtype), ", expected ", allowed, hint);
}

// Checks dtype, rank and the fixed dims of a tensor (-1 = any) and its alignment; returns dim 0.
// Rows that kernels move with 16-byte vectors need 16-byte alignment; the rest their element size.
int64_t check_tensor(const Tensor& t, const char* name, const DTypes& dtypes, const int64_t* dims, int ndims,
                     size_t align = 0, const char* hint = "") {
  // An empty tensor may have no storage at all (torch gives a null pointer for m = 0).
  const bool empty = t.ndim > 0 && t.numel() == 0;
  EPKIT_CHECK(t.data != nullptr || empty, name, " is missing (null data pointer)");
  check_dtype(t, name, dtypes, hint);
  EPKIT_CHECK(t.ndim == ndims, name, " has shape ", t.shape_str(), " (", t.ndim, " dims), expected ", ndims, " dims");
  for (int i = 0; i < ndims; ++i) {
    EPKIT_CHECK(t.shape[i] >= 0, name, " has negative dim ", i);
    EPKIT_CHECK(dims[i] < 0 || t.shape[i] == dims[i], name, " has shape ", t.shape_str(), ": dim ", i, " is ",
                t.shape[i], ", expected ", dims[i]);
  }
  if (align == 0) align = dtype_size(t.dtype);
  EPKIT_CHECK(empty || reinterpret_cast<uintptr_t>(t.data) % align == 0, name, " data pointer is not ", align,
              "-byte aligned");
  return t.shape[0];
}
int64_t check_tensor(const Tensor& t, const char* name, const DTypes& dtypes, std::initializer_list<int64_t> dims,
                     size_t align = 0, const char* hint = "") {
  return check_tensor(t, name, dtypes, dims.begin(), static_cast<int>(dims.size()), align, hint);
}

kernels::IndexType index_type(const Tensor& t) {
  switch (t.dtype) {
    case DType::kInt32: return kernels::kIdxInt32;
    case DType::kInt64: return kernels::kIdxInt64;
    default: return kernels::kIdxUInt32;
  }
}

// m for the call: on the host (checked here) or on the device (checked and clamped by the kernels).
kernels::TokenCount token_count(const AllToAllConfig& c, int host_m, const int32_t* dev_m, int64_t rows,
                                const char* call) {
  const int M = c.max_tokens_per_rank;
  const int limit = static_cast<int>(rows < M ? rows : M);
  if (dev_m) {
    EPKIT_CHECK(host_m < 0, call, ": give m either on the host (num_tokens = ", host_m,
                ") or on the device (num_tokens_device), not both");
    return {-1, dev_m, limit};
  }
  EPKIT_CHECK(host_m >= 0, call, ": num_tokens = ", host_m, " must be >= 0 (or pass num_tokens_device)");
  EPKIT_CHECK(host_m <= M, call, ": num_tokens = ", host_m, " exceeds max_tokens_per_rank = ", M);
  EPKIT_CHECK(host_m <= rows, call, ": num_tokens = ", host_m, " exceeds the tensors' first dimension = ", rows);
  return {host_m, nullptr, limit};
}

}  // namespace

kernels::DispatchIO check_dispatch_args(const AllToAllConfig& c, const DispatchArgs& a, bool send, bool recv,
                                        const char* call, LayerDTypes& layer) {
  const int H = c.hidden, K = c.topk, L = num_local_experts(c);
  const int ns = scales_per_token(c);
  kernels::DispatchIO io{};
  DType payload = layer.payload;
  if (send) {
    int64_t rows = check_tensor(a.x, "x", payload_types(c.dispatch_dtype), {-1, H}, 16);
    payload = a.x.dtype;
    io.x = static_cast<const uint8_t*>(a.x.data);
    if (has_scales(c)) {
      const int64_t r = check_tensor(a.x_scale, "x_scale", {DType::kFP32}, {-1, ns});
      rows = r < rows ? r : rows;
      io.x_scale = static_cast<const float*>(a.x_scale.data);
    } else {
      EPKIT_CHECK(!a.x_scale.defined(), "x_scale given but dispatch_dtype = ", dtype_name(c.dispatch_dtype),
                  " carries no scales");
    }
    const int64_t r = check_tensor(a.topk_idx, "topk_idx", kIndexTypes, {-1, K});
    rows = r < rows ? r : rows;
    io.topk_idx = a.topk_idx.data;
    io.idx_type = index_type(a.topk_idx);
    if (c.weights_at_dispatch) {
      const int64_t rw = check_tensor(a.topk_weights, "topk_weights (weights_at_dispatch)", {DType::kFP32}, {-1, K});
      rows = rw < rows ? rw : rows;
      io.topk_weights = static_cast<const float*>(a.topk_weights.data);
    } else {
      EPKIT_CHECK(!a.topk_weights.defined(), call,
                  ": topk_weights given to dispatch but weights_at_dispatch = false; pass them to combine");
    }
    io.m = token_count(c, a.num_tokens, a.num_tokens_device, rows, call);
  }
  if (recv) {
    const ExpertShapes sh = ExpertShapes::make(c);
    check_tensor(a.expert_x, "expert_x", payload_types(c.dispatch_dtype), sh.expert_x, sh.ndim, 16);
    // The payload travels as bytes: the receiving tensor must be what the sender's x was.
    EPKIT_CHECK(a.expert_x.dtype == payload, call, ": expert_x is ", dtype_name(a.expert_x.dtype), " but x ",
                send ? "is " : "was (at dispatch_send) ", dtype_name(payload),
                "; the payload is copied as bytes, so they must be the same type");
    io.expert_x = static_cast<uint8_t*>(a.expert_x.data);
    if (has_scales(c)) {
      check_tensor(a.expert_x_scale, "expert_x_scale", {DType::kFP32}, sh.expert_x_scale, sh.ndim);
      io.expert_x_scale = static_cast<float*>(a.expert_x_scale.data);
    }
    check_tensor(a.expert_num_tokens, "expert_num_tokens", {DType::kInt32}, {L});
    io.expert_num_tokens = static_cast<int32_t*>(a.expert_num_tokens.data);
    if (c.layout == ExpertLayout::kPacked) {
      check_tensor(a.expert_offsets, "expert_offsets (layout = packed)", {DType::kInt32}, {L + 1});
      io.expert_offsets = static_cast<int32_t*>(a.expert_offsets.data);
    } else {
      EPKIT_CHECK(!a.expert_offsets.defined(), call,
                  ": expert_offsets given but layout = masked (each expert's rows start at e * capacity)");
    }
  }
  layer.payload = payload;
  return io;
}

kernels::CombineIO check_combine_args(const AllToAllConfig& c, const CombineArgs& a, bool send, bool recv,
                                      const char* call, LayerDTypes& layer) {
  const int H = c.hidden, K = c.topk;
  kernels::CombineIO io{};
  DType in = layer.combine_in, out = layer.combine_out;
  int64_t rows = check_tensor(a.topk_idx, "topk_idx", kIndexTypes, {-1, K});
  io.topk_idx = a.topk_idx.data;
  io.idx_type = index_type(a.topk_idx);
  if (send) {
    const ExpertShapes sh = ExpertShapes::make(c);  // expert_y has expert_x's rows
    check_tensor(a.expert_y, "expert_y", combine_in_types(c.combine_in_dtype), sh.expert_x, sh.ndim, 16,
                 c.combine_in_dtype == DType::kFP32 ? " (combine_in_dtype = fp32)"
                                                    : " (combine_in_dtype is 2-byte; fp32 needs combine_in_dtype = fp32)");
    io.expert_y = a.expert_y.data;
    in = a.expert_y.dtype;
    // The partials are packed in the output type: out's when the send half is given out (an empty
    // one may have no storage), else the config's.
    const bool has_out = a.out.defined() || a.out.ndim > 0;
    if (has_out) check_dtype(a.out, "out", k16BitTypes);
    out = has_out ? a.out.dtype : c.combine_out_dtype;
    if (c.weights_at_dispatch) {
      EPKIT_CHECK(!a.topk_weights.defined(), call,
                  ": topk_weights given to combine but weights_at_dispatch = true: dispatch carried them");
    } else {
      const int64_t r = check_tensor(a.topk_weights, "topk_weights", {DType::kFP32}, {-1, K});
      rows = r < rows ? r : rows;
      io.topk_weights = static_cast<const float*>(a.topk_weights.data);
    }
  }
  if (recv) {
    const int64_t r = check_tensor(a.out, "out", k16BitTypes, {-1, H}, 16);
    // Fused, out is what the send half packed; split, the send half may have had another (or none).
    EPKIT_CHECK(a.out.dtype == out, call, ": out is ", dtype_name(a.out.dtype),
                " but combine_send packed this layer's partials as ", dtype_name(out),
                " (it had no out tensor, or another one: pass the same CombineArgs to both halves)");
    rows = r < rows ? r : rows;
    io.out = a.out.data;
  }
  io.m = token_count(c, a.num_tokens, a.num_tokens_device, rows, call);
  layer.combine_in = in;
  layer.combine_out = out;
  return io;
}

}  // namespace epkit::host
