// Bindings of AllToAllConfig and AllToAll. Calls take the stream as an integer (the caller's
// current stream, read by the Python layer) so the extension does not depend on torch.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>

#include "bindings.hpp"
#include "epkit/all_to_all.hpp"
#include "epkit/config.hpp"
#include "epkit/shapes.hpp"
#include "runtime.hpp"
#include "tensor_arg.hpp"

namespace nb = nanobind;

namespace epkit::py {

namespace {

enum Mode : int { kBoth = 0, kSend = 1, kRecv = 2 };

// The Python object: an AllToAll held as runtime.hpp's Held describes (the instance list's with
// NVSHMEM initialized, else a single-process object on the current device, owned here).
class Handle {
 public:
  explicit Handle(const AllToAllConfig& cfg) {
    if (!runtime().comm && cfg.world_size == 1) {
      int dev = 0;
      const cudaError_t e = cudaGetDevice(&dev);
      EPKIT_CHECK(e == cudaSuccess, "cudaGetDevice: ", cudaGetErrorString(e));
      std::shared_ptr<AllToAll> a;
      {
        nb::gil_scoped_release release;
        a = std::make_shared<AllToAll>(cfg);
      }
      held_.adopt(std::move(a), true, dev);
      return;
    }
    const Communicator& c = comm();
    std::shared_ptr<AllToAll> a;
    {
      nb::gil_scoped_release release;  // collective: allocates and agrees on the config with peers
      DeviceGuard guard(c.device());
      a = std::make_shared<AllToAll>(c, cfg);
    }
    held_.adopt(std::move(a), false, c.device());
  }

  std::shared_ptr<AllToAll> get() const { return held_.get(); }
  int device() const { return held_.device(); }
  void destroy() { held_.destroy(); }
  bool alive() const { return held_.alive(); }

 private:
  Held<AllToAll> held_{"AllToAll"};
};

void dispatch(Handle& h, int mode, const TensorArg& x, const TensorArg& x_scale, const TensorArg& topk_idx,
              int num_tokens, const TensorArg& num_tokens_device, const TensorArg& expert_x,
              const TensorArg& expert_x_scale, const TensorArg& expert_num_tokens, const TensorArg& expert_offsets,
              const TensorArg& topk_weights, uintptr_t stream) {
  auto a = h.get();
  const int dev = h.device();
  DispatchArgs args;
  args.x = to_tensor(x, "x", dev);
  args.x_scale = to_tensor(x_scale, "x_scale", dev);
  args.topk_idx = to_tensor(topk_idx, "topk_idx", dev);
  args.num_tokens = num_tokens;
  args.num_tokens_device = device_int32(num_tokens_device, "num_tokens_device", dev);
  args.expert_x = to_tensor(expert_x, "expert_x", dev);
  args.expert_x_scale = to_tensor(expert_x_scale, "expert_x_scale", dev);
  args.expert_num_tokens = to_tensor(expert_num_tokens, "expert_num_tokens", dev);
  args.expert_offsets = to_tensor(expert_offsets, "expert_offsets", dev);
  args.topk_weights = to_tensor(topk_weights, "topk_weights", dev);
  DeviceGuard guard(dev);
  switch (mode) {
    case kBoth: a->dispatch(args, as_stream(stream)); break;
    case kSend: a->dispatch_send(args, as_stream(stream)); break;
    case kRecv: a->dispatch_recv(args, as_stream(stream)); break;
    default: EPKIT_FAIL("dispatch mode ", mode, " is not 0 (both), 1 (send) or 2 (recv)");
  }
}

void combine(Handle& h, int mode, const TensorArg& expert_y, const TensorArg& topk_idx,
             const TensorArg& topk_weights, int num_tokens, const TensorArg& num_tokens_device,
             const TensorArg& out, uintptr_t stream) {
  auto a = h.get();
  const int dev = h.device();
  CombineArgs args;
  args.expert_y = to_tensor(expert_y, "expert_y", dev);
  args.topk_idx = to_tensor(topk_idx, "topk_idx", dev);
  args.topk_weights = to_tensor(topk_weights, "topk_weights", dev);
  args.num_tokens = num_tokens;
  args.num_tokens_device = device_int32(num_tokens_device, "num_tokens_device", dev);
  args.out = to_tensor(out, "out", dev);
  DeviceGuard guard(dev);
  switch (mode) {
    case kBoth: a->combine(args, as_stream(stream)); break;
    case kSend: a->combine_send(args, as_stream(stream)); break;
    case kRecv: a->combine_recv(args, as_stream(stream)); break;
    default: EPKIT_FAIL("combine mode ", mode, " is not 0 (both), 1 (send) or 2 (recv)");
  }
}

}  // namespace

void bind_all_to_all(nb::module_& m) {
  nb::enum_<DType>(m, "DType", nb::is_arithmetic())
      .value("bf16", DType::kBF16)
      .value("fp16", DType::kFP16)
      .value("fp32", DType::kFP32)
      .value("fp8_e4m3", DType::kFP8E4M3)
      .value("int32", DType::kInt32)
      .value("int64", DType::kInt64)
      .value("uint32", DType::kUInt32)
      .value("uint8", DType::kUInt8);
  nb::enum_<DataPath>(m, "DataPath", nb::is_arithmetic()).value("auto", DataPath::kAuto).value("portable", DataPath::kPortable);
  nb::enum_<ExpertLayout>(m, "ExpertLayout", nb::is_arithmetic())
      .value("masked", ExpertLayout::kMasked)
      .value("packed", ExpertLayout::kPacked);

  nb::class_<AllToAllConfig>(m, "AllToAllConfig")
      .def(nb::init<>())
      .def_rw("world_size", &AllToAllConfig::world_size)
      .def_rw("rank", &AllToAllConfig::rank)
      .def_rw("dp_size", &AllToAllConfig::dp_size)
      .def_rw("num_experts", &AllToAllConfig::num_experts)
      .def_rw("topk", &AllToAllConfig::topk)
      .def_rw("hidden", &AllToAllConfig::hidden)
      .def_rw("max_tokens_per_rank", &AllToAllConfig::max_tokens_per_rank)
      .def_rw("dispatch_dtype", &AllToAllConfig::dispatch_dtype)
      .def_rw("combine_in_dtype", &AllToAllConfig::combine_in_dtype)
      .def_rw("combine_out_dtype", &AllToAllConfig::combine_out_dtype)
      .def_rw("layout", &AllToAllConfig::layout)
      .def_rw("capacity", &AllToAllConfig::capacity)
      .def_rw("packed_rows", &AllToAllConfig::packed_rows)
      .def_rw("packed_row_align", &AllToAllConfig::packed_row_align)
      .def_rw("path", &AllToAllConfig::path)
      .def_rw("num_sms", &AllToAllConfig::num_sms)
      .def_rw("timeout_ms", &AllToAllConfig::timeout_ms)
      .def_rw("weights_at_dispatch", &AllToAllConfig::weights_at_dispatch)
      .def_rw("expert_scales_mn_major", &AllToAllConfig::expert_scales_mn_major)
      .def("validate", [](const AllToAllConfig& c) { validate(c); })
      .def("num_local_experts", [](const AllToAllConfig& c) { return num_local_experts(c); })
      .def("effective_capacity", [](const AllToAllConfig& c) { return effective_capacity(c); })
      .def("scales_per_token", [](const AllToAllConfig& c) { return scales_per_token(c); })
      .def("packed_row_bound", [](const AllToAllConfig& c) { return packed_row_bound(c); })
      .def("effective_packed_rows", [](const AllToAllConfig& c) { return effective_packed_rows(c); })
      .def("agreement_fields", [](const AllToAllConfig& c) { return agreement_fields(c); })
      .def("__repr__", [](const AllToAllConfig& c) { return to_string(c); });

  nb::class_<Handle>(m, "AllToAll")
      .def(nb::init<const AllToAllConfig&>(), nb::arg("config"),
           "Collective: checks every rank passed the same config and allocates the symmetric buffers. At world "
           "size 1 without NVSHMEM: the single-process object on the current device.")
      .def("dispatch", &dispatch, nb::arg("mode"), nb::arg("x").none(), nb::arg("x_scale").none(),
           nb::arg("topk_idx").none(), nb::arg("num_tokens"), nb::arg("num_tokens_device").none(),
           nb::arg("expert_x").none(), nb::arg("expert_x_scale").none(), nb::arg("expert_num_tokens").none(),
           nb::arg("expert_offsets").none(), nb::arg("topk_weights").none(), nb::arg("stream"))
      .def("combine", &combine, nb::arg("mode"), nb::arg("expert_y").none(), nb::arg("topk_idx").none(),
           nb::arg("topk_weights").none(), nb::arg("num_tokens"), nb::arg("num_tokens_device").none(),
           nb::arg("out").none(), nb::arg("stream"))
      .def("check", [](const Handle& h) { h.get()->check(); })
      .def("destroy", &Handle::destroy, "Collective: frees the symmetric buffers now. Idempotent.")
      .def_prop_ro("alive", &Handle::alive)
      .def_prop_ro("failed", [](const Handle& h) { return h.alive() && h.get()->failed(); },
                   "True once a device-side timeout was recorded: the object is unusable (no sync needed)")
      .def_prop_ro("device", &Handle::device)
      .def_prop_ro("config", [](const Handle& h) { return h.get()->config(); })
      .def_prop_ro("symmetric_bytes", [](const Handle& h) { return h.get()->symmetric_bytes(); })
      .def_prop_ro("workspace_bytes", [](const Handle& h) { return h.get()->workspace_bytes(); })
      .def_prop_ro("num_p2p_peers", [](const Handle& h) { return h.get()->num_p2p_peers(); });
}

}  // namespace epkit::py
