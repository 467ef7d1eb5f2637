// Argument validation of every AllToAll call (src/host/validate.cpp), on the CPU: each bad tensor
// or m gets an epkit::Error naming it, and good arguments become the raw-pointer structs the
// kernels take. Pointers are never dereferenced here, so fake aligned addresses stand in.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "epkit/error.hpp"
#include "comm/host/validate.hpp"

namespace epkit {
namespace {

void* addr(uintptr_t i) { return reinterpret_cast<void*>(0x100000 + 0x1000 * i); }

AllToAllConfig cfg(bool fp8 = true, bool wad = false) {
  AllToAllConfig c;
  c.world_size = 4, c.rank = 1, c.dp_size = 2, c.num_experts = 16, c.topk = 4, c.hidden = 256;
  c.max_tokens_per_rank = 8;
  c.dispatch_dtype = fp8 ? DType::kFP8E4M3 : DType::kBF16;
  c.weights_at_dispatch = wad;
  validate(c);
  return c;
}

DispatchArgs good_dispatch(const AllToAllConfig& c) {
  const int64_t M = c.max_tokens_per_rank, H = c.hidden, K = c.topk, L = 4, cap = 16, ns = 2;
  DispatchArgs a;
  a.x = Tensor(addr(1), c.dispatch_dtype, {M, H});
  if (c.dispatch_dtype == DType::kFP8E4M3) a.x_scale = Tensor(addr(2), DType::kFP32, {M, ns});
  a.topk_idx = Tensor(addr(3), DType::kInt64, {M, K});
  a.num_tokens = 5;
  a.expert_x = Tensor(addr(4), c.dispatch_dtype, {L, cap, H});
  if (c.dispatch_dtype == DType::kFP8E4M3) a.expert_x_scale = Tensor(addr(5), DType::kFP32, {L, cap, ns});
  a.expert_num_tokens = Tensor(addr(6), DType::kInt32, {L});
  if (c.weights_at_dispatch) a.topk_weights = Tensor(addr(7), DType::kFP32, {M, K});
  return a;
}

CombineArgs good_combine(const AllToAllConfig& c) {
  const int64_t M = c.max_tokens_per_rank, H = c.hidden, K = c.topk, L = 4, cap = 16;
  CombineArgs a;
  a.expert_y = Tensor(addr(8), c.combine_in_dtype, {L, cap, H});
  a.topk_idx = Tensor(addr(3), DType::kInt32, {M, K});
  if (!c.weights_at_dispatch) a.topk_weights = Tensor(addr(9), DType::kFP32, {M, K});
  a.num_tokens = 5;
  a.out = Tensor(addr(10), c.combine_out_dtype, {M, H});
  return a;
}

template <typename F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Validate, GoodDispatchBecomesKernelArguments) {
  const AllToAllConfig c = cfg();
  const DispatchArgs a = good_dispatch(c);
  const kernels::DispatchIO io = host::check_dispatch_args(c, a, true, true, "dispatch");
  EXPECT_EQ(io.x, a.x.data);
  EXPECT_EQ(io.x_scale, a.x_scale.data);
  EXPECT_EQ(io.topk_idx, a.topk_idx.data);
  EXPECT_EQ(io.idx_type, kernels::kIdxInt64);
  EXPECT_EQ(io.m.host_m, 5);
  EXPECT_EQ(io.m.dev_m, nullptr);
  EXPECT_EQ(io.m.rows, 8);
  EXPECT_EQ(io.expert_x, a.expert_x.data);
  EXPECT_EQ(io.expert_num_tokens, a.expert_num_tokens.data);
  EXPECT_EQ(io.topk_weights, nullptr);
}

TEST(Validate, HalvesCheckOnlyWhatTheyRead) {
  const AllToAllConfig c = cfg();
  DispatchArgs send_only = good_dispatch(c);
  send_only.expert_x = Tensor();  // the send half never touches the outputs
  EXPECT_NO_THROW(host::check_dispatch_args(c, send_only, true, false, "dispatch_send"));
  DispatchArgs recv_only = good_dispatch(c);
  recv_only.x = Tensor();  // nor the receive half the inputs
  EXPECT_NO_THROW(host::check_dispatch_args(c, recv_only, false, true, "dispatch_recv"));
  EXPECT_THROW(host::check_dispatch_args(c, send_only, true, true, "dispatch"), Error);
}

TEST(Validate, DeviceMRowsAreTheSmallestInput) {
  const AllToAllConfig c = cfg();
  DispatchArgs a = good_dispatch(c);
  a.num_tokens = -1;
  a.num_tokens_device = static_cast<const int32_t*>(addr(11));
  a.topk_idx.shape[0] = 6;  // fewer rows than M: the kernels clamp a device m to 6
  const auto io = host::check_dispatch_args(c, a, true, false, "dispatch_send");
  EXPECT_EQ(io.m.host_m, -1);
  EXPECT_EQ(io.m.dev_m, a.num_tokens_device);
  EXPECT_EQ(io.m.rows, 6);
}

TEST(Validate, EachBadDispatchArgumentIsNamed) {
  const AllToAllConfig c = cfg();
  auto bad = [&](const std::function<void(DispatchArgs&)>& mutate, const std::string& needle) {
    DispatchArgs a = good_dispatch(c);
    mutate(a);
    expect_error([&] { host::check_dispatch_args(c, a, true, true, "dispatch"); }, needle);
  };
  bad([](auto& a) { a.x.dtype = DType::kBF16; }, "x has dtype bf16, expected fp8_e4m3");
  bad([](auto& a) { a.x.shape[1] = 128; }, "x has shape [8, 128]: dim 1 is 128, expected 256");
  bad([](auto& a) { a.x.ndim = 3; }, "x has shape");
  bad([](auto& a) { a.x.data = reinterpret_cast<char*>(a.x.data) + 8; }, "x data pointer is not 16-byte aligned");
  bad([](auto& a) { a.x_scale = Tensor(); }, "x_scale is missing");
  bad([](auto& a) { a.x_scale.shape[1] = 3; }, "x_scale has shape");
  bad([](auto& a) { a.topk_idx.dtype = DType::kFP32; }, "topk_idx has dtype fp32, expected int32 or int64 or uint32");
  bad([](auto& a) { a.topk_idx.shape[1] = 5; }, "dim 1 is 5, expected 4");
  bad([](auto& a) { a.num_tokens = 9; }, "num_tokens = 9 exceeds max_tokens_per_rank = 8");
  bad([](auto& a) { a.num_tokens = -2; }, "num_tokens = -2 must be >= 0");
  bad([](auto& a) { a.x.shape[0] = 3; }, "num_tokens = 5 exceeds the tensors' first dimension = 3");
  bad([](auto& a) { a.num_tokens_device = static_cast<const int32_t*>(addr(11)); }, "not both");
  bad([](auto& a) { a.expert_x.shape[1] = 15; }, "expert_x has shape [4, 15, 256]: dim 1 is 15, expected 16");
  bad([](auto& a) { a.expert_x_scale.dtype = DType::kBF16; }, "expert_x_scale has dtype bf16");
  bad([](auto& a) { a.expert_num_tokens.shape[0] = 5; }, "expert_num_tokens has shape [5]");
  bad([](auto& a) { a.topk_weights = Tensor(addr(7), DType::kFP32, {8, 4}); }, "weights_at_dispatch = false");
}

TEST(Validate, EmptyTokenTensorsMayHaveNoStorage) {
  const AllToAllConfig c = cfg();
  DispatchArgs a = good_dispatch(c);
  a.x = Tensor(nullptr, c.dispatch_dtype, {0, 256});
  a.x_scale = Tensor(nullptr, DType::kFP32, {0, 2});
  a.topk_idx = Tensor(nullptr, DType::kInt32, {0, 4});
  a.num_tokens = 0;
  const auto io = host::check_dispatch_args(c, a, true, true, "dispatch");
  EXPECT_EQ(io.m.host_m, 0);
  EXPECT_EQ(io.m.rows, 0);
  a.num_tokens = 1;  // but no tokens can come from zero rows
  expect_error([&] { host::check_dispatch_args(c, a, true, true, "dispatch"); }, "first dimension = 0");
  a.expert_x = Tensor(nullptr, c.dispatch_dtype, {4, 16, 256});  // outputs are never empty
  a.num_tokens = 0;
  expect_error([&] { host::check_dispatch_args(c, a, true, true, "dispatch"); }, "expert_x is missing");
}

TEST(Validate, ScalesOnlyWithFp8) {
  const AllToAllConfig c = cfg(false);
  DispatchArgs a = good_dispatch(c);
  EXPECT_NO_THROW(host::check_dispatch_args(c, a, true, true, "dispatch"));
  a.x_scale = Tensor(addr(2), DType::kFP32, {8, 2});
  expect_error([&] { host::check_dispatch_args(c, a, true, true, "dispatch"); }, "carries no scales");
}

// expert_scales_mn_major: expert_x_scale is each expert's [ns, capacity], and the row-major shape is refused.
TEST(Validate, MnMajorScaleShape) {
  AllToAllConfig c = cfg();
  c.expert_scales_mn_major = true;
  validate(c);
  DispatchArgs a = good_dispatch(c);
  expect_error([&] { host::check_dispatch_args(c, a, true, true, "dispatch"); },
               "expert_x_scale has shape [4, 16, 2]: dim 1 is 16, expected 2");
  a.expert_x_scale = Tensor(addr(5), DType::kFP32, {4, 2, 16});
  const kernels::DispatchIO io = host::check_dispatch_args(c, a, true, true, "dispatch");
  EXPECT_EQ(io.expert_x_scale, static_cast<float*>(addr(5)));
}

TEST(Validate, EachBadCombineArgumentIsNamed) {
  const AllToAllConfig c = cfg();
  auto bad = [&](const std::function<void(CombineArgs&)>& mutate, const std::string& needle) {
    CombineArgs a = good_combine(c);
    mutate(a);
    expect_error([&] { host::check_combine_args(c, a, true, true, "combine"); }, needle);
  };
  const kernels::CombineIO io = host::check_combine_args(c, good_combine(c), true, true, "combine");
  EXPECT_EQ(io.idx_type, kernels::kIdxInt32);
  EXPECT_EQ(io.m.host_m, 5);
  bad([](auto& a) { a.expert_y.dtype = DType::kFP32; }, "expert_y has dtype fp32, expected bf16 or fp16 (combine_in_dtype is 2-byte");
  bad([](auto& a) { a.expert_y.dtype = DType::kFP8E4M3; }, "expert_y has dtype fp8_e4m3");
  bad([](auto& a) { a.expert_y.shape[2] = 128; }, "expert_y has shape");
  bad([](auto& a) { a.topk_weights = Tensor(); }, "topk_weights is missing");
  bad([](auto& a) { a.topk_weights.dtype = DType::kBF16; }, "topk_weights has dtype bf16");
  bad([](auto& a) { a.out.dtype = DType::kFP32; }, "out has dtype fp32, expected bf16 or fp16");
  bad([](auto& a) { a.out.shape[0] = 4; }, "exceeds the tensors' first dimension = 4");
  bad([](auto& a) { a.topk_idx.shape[0] = -1; }, "topk_idx has negative dim 0");
}

// The config fixes element sizes; each call picks the types of that size from its tensors.
TEST(Validate, DTypesComeFromTheTensorsWithinTheConfigsElementSizes) {
  const AllToAllConfig c16 = cfg(false);  // bf16 payload, bf16 expert outputs, bf16 out
  for (DType x : {DType::kBF16, DType::kFP16}) {
    DispatchArgs d = good_dispatch(c16);
    d.x.dtype = d.expert_x.dtype = x;
    host::LayerDTypes layer = host::config_dtypes(c16);
    EXPECT_NO_THROW(host::check_dispatch_args(c16, d, true, true, "dispatch", layer));
    EXPECT_EQ(layer.payload, x);
  }
  for (DType in : {DType::kBF16, DType::kFP16})
    for (DType out : {DType::kBF16, DType::kFP16}) {
      CombineArgs cb = good_combine(c16);
      cb.expert_y.dtype = in;
      cb.out.dtype = out;
      host::LayerDTypes layer = host::config_dtypes(c16);
      EXPECT_NO_THROW(host::check_combine_args(c16, cb, true, true, "combine", layer));
      EXPECT_EQ(layer.combine_in, in);
      EXPECT_EQ(layer.combine_out, out);
    }
  DispatchArgs d = good_dispatch(c16);
  d.x.dtype = DType::kFP8E4M3;  // another element size
  expect_error([&] { host::check_dispatch_args(c16, d, true, true, "dispatch"); },
               "x has dtype fp8_e4m3, expected bf16 or fp16");
  d = good_dispatch(c16);
  d.expert_x.dtype = DType::kFP16;  // bytes of bf16 under an fp16 label
  expect_error([&] { host::check_dispatch_args(c16, d, true, true, "dispatch"); },
               "dispatch: expert_x is fp16 but x is bf16");

  const AllToAllConfig c8 = cfg(true);  // fp8 payload, bf16 expert outputs: fp16 combine is fine
  CombineArgs cb = good_combine(c8);
  cb.expert_y.dtype = DType::kFP16;
  cb.out.dtype = DType::kFP16;
  EXPECT_NO_THROW(host::check_combine_args(c8, cb, true, true, "combine"));
  DispatchArgs d8 = good_dispatch(c8);
  d8.x.dtype = d8.expert_x.dtype = DType::kFP16;
  expect_error([&] { host::check_dispatch_args(c8, d8, true, true, "dispatch"); },
               "x has dtype fp16, expected fp8_e4m3");

  AllToAllConfig c32 = cfg(false);
  c32.combine_in_dtype = DType::kFP32;  // 4-byte expert outputs: fp32 only
  cb = good_combine(c32);
  EXPECT_NO_THROW(host::check_combine_args(c32, cb, true, true, "combine"));
  cb.expert_y.dtype = DType::kBF16;
  expect_error([&] { host::check_combine_args(c32, cb, true, true, "combine"); },
               "expert_y has dtype bf16, expected fp32 (combine_in_dtype = fp32)");
}

// A receive half has no inputs to read the dtypes from: it must match what its send half recorded.
TEST(Validate, ReceiveHalvesMatchTheirSendHalf) {
  const AllToAllConfig c = cfg(false);
  host::LayerDTypes layer = host::config_dtypes(c);
  DispatchArgs d = good_dispatch(c);
  d.x.dtype = d.expert_x.dtype = DType::kFP16;
  EXPECT_NO_THROW(host::check_dispatch_args(c, d, true, false, "dispatch_send", layer));
  EXPECT_EQ(layer.payload, DType::kFP16);
  EXPECT_NO_THROW(host::check_dispatch_args(c, d, false, true, "dispatch_recv", layer));
  DispatchArgs other = d;
  other.expert_x.dtype = DType::kBF16;
  expect_error([&] { host::check_dispatch_args(c, other, false, true, "dispatch_recv", layer); },
               "dispatch_recv: expert_x is bf16 but x was (at dispatch_send) fp16");

  CombineArgs cb = good_combine(c);
  cb.out.dtype = DType::kFP16;
  EXPECT_NO_THROW(host::check_combine_args(c, cb, true, false, "combine_send", layer));
  EXPECT_EQ(layer.combine_out, DType::kFP16);
  EXPECT_NO_THROW(host::check_combine_args(c, cb, false, true, "combine_recv", layer));
  CombineArgs swapped = cb;
  swapped.out.dtype = DType::kBF16;
  expect_error([&] { host::check_combine_args(c, swapped, false, true, "combine_recv", layer); },
               "combine_recv: out is bf16 but combine_send packed this layer's partials as fp16");
  // A send half without out packs in the config's type; a failed check records nothing.
  CombineArgs no_out = good_combine(c);
  no_out.out = Tensor();
  EXPECT_NO_THROW(host::check_combine_args(c, no_out, true, false, "combine_send", layer));
  EXPECT_EQ(layer.combine_out, DType::kBF16);
  CombineArgs bad = good_combine(c);
  bad.expert_y.dtype = DType::kFP16;
  bad.out.dtype = DType::kFP16;
  bad.topk_weights = Tensor();
  EXPECT_THROW(host::check_combine_args(c, bad, true, false, "combine_send", layer), Error);
  EXPECT_EQ(layer.combine_in, DType::kBF16);
  EXPECT_EQ(layer.combine_out, DType::kBF16);
  // An empty out (m = 0, no storage) still says its type.
  CombineArgs empty = good_combine(c);
  empty.num_tokens = 0;
  empty.out = Tensor(nullptr, DType::kFP16, {0, c.hidden});
  EXPECT_NO_THROW(host::check_combine_args(c, empty, true, true, "combine", layer));
  EXPECT_EQ(layer.combine_out, DType::kFP16);
}

TEST(Validate, WeightsAtDispatchMoveTheWeights) {
  const AllToAllConfig c = cfg(true, true);
  const DispatchArgs d = good_dispatch(c);
  EXPECT_EQ(host::check_dispatch_args(c, d, true, false, "dispatch_send").topk_weights, d.topk_weights.data);
  DispatchArgs nod = d;
  nod.topk_weights = Tensor();
  expect_error([&] { host::check_dispatch_args(c, nod, true, false, "dispatch_send"); },
               "topk_weights (weights_at_dispatch) is missing");
  CombineArgs cb = good_combine(c);
  EXPECT_NO_THROW(host::check_combine_args(c, cb, true, true, "combine"));
  cb.topk_weights = Tensor(addr(9), DType::kFP32, {8, 4});
  expect_error([&] { host::check_combine_args(c, cb, true, true, "combine"); }, "dispatch carried them");
}

TEST(Validate, PackedLayoutShapes) {
  AllToAllConfig c = cfg();
  c.layout = ExpertLayout::kPacked;
  c.packed_rows = 40;
  validate(c);
  const int64_t H = c.hidden, R = 40, L = 4;
  DispatchArgs d = good_dispatch(c);
  d.expert_x = Tensor(addr(4), c.dispatch_dtype, {R, H});
  d.expert_x_scale = Tensor(addr(5), DType::kFP32, {R, 2});
  d.expert_offsets = Tensor(addr(12), DType::kInt32, {L + 1});
  const kernels::DispatchIO io = host::check_dispatch_args(c, d, true, true, "dispatch");
  EXPECT_EQ(io.expert_offsets, d.expert_offsets.data);
  EXPECT_EQ(io.expert_x, d.expert_x.data);
  auto bad = [&](const std::function<void(DispatchArgs&)>& mutate, const std::string& needle) {
    DispatchArgs a = d;
    mutate(a);
    expect_error([&] { host::check_dispatch_args(c, a, true, true, "dispatch"); }, needle);
  };
  bad([&](auto& a) { a.expert_x = Tensor(addr(4), c.dispatch_dtype, {4, 16, H}); }, "expert_x has shape [4, 16, 256] (3 dims), expected 2 dims");
  bad([&](auto& a) { a.expert_x.shape[0] = 41; }, "expert_x has shape [41, 256]: dim 0 is 41, expected 40");
  bad([&](auto& a) { a.expert_x_scale.shape[0] = 39; }, "expert_x_scale has shape [39, 2]");
  bad([&](auto& a) { a.expert_offsets = Tensor(); }, "expert_offsets (layout = packed) is missing");
  bad([&](auto& a) { a.expert_offsets.shape[0] = L; }, "expert_offsets (layout = packed) has shape [4]: dim 0 is 4, expected 5");
  bad([&](auto& a) { a.expert_offsets.dtype = DType::kInt64; }, "expert_offsets (layout = packed) has dtype int64");
  // The send half reads no outputs, in either layout.
  DispatchArgs send_only = d;
  send_only.expert_offsets = Tensor();
  EXPECT_NO_THROW(host::check_dispatch_args(c, send_only, true, false, "dispatch_send"));
  // The masked layout takes no offsets.
  const AllToAllConfig m = cfg();
  DispatchArgs with_offsets = good_dispatch(m);
  with_offsets.expert_offsets = Tensor(addr(12), DType::kInt32, {L + 1});
  expect_error([&] { host::check_dispatch_args(m, with_offsets, true, true, "dispatch"); },
               "dispatch: expert_offsets given but layout = masked");
  // Combine reads expert_y in the same packed rows.
  CombineArgs cb = good_combine(c);
  cb.expert_y = Tensor(addr(8), c.combine_in_dtype, {R, H});
  EXPECT_NO_THROW(host::check_combine_args(c, cb, true, true, "combine"));
  cb.expert_y = Tensor(addr(8), c.combine_in_dtype, {L, 16, H});
  expect_error([&] { host::check_combine_args(c, cb, true, true, "combine"); }, "expert_y has shape [4, 16, 256] (3 dims)");
  // R defaults to the bound: M * (W / D) * min(K, L) = 8 * 2 * 4 = 64 at alignment 1.
  c.packed_rows = 0;
  d.expert_x.shape[0] = d.expert_x_scale.shape[0] = 64;
  EXPECT_NO_THROW(host::check_dispatch_args(c, d, true, true, "dispatch"));
}

}  // namespace
}  // namespace epkit
