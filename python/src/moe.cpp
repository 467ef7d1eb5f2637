// Bindings of the MoE expert compute (router, FP8 quantizers, grouped GEMM, SiLU-mul + quantize,
// gate projection, error records) and of MoELayer. As in all_to_all.cpp, every call takes the
// caller's stream as an integer, so the extension does not depend on torch. The kernels need no
// NVSHMEM: their calls take the CUDA device of their tensors, made current for the call. MoELayer
// owns AllToAll objects and so lives on the process's Communicator, like epkit.AllToAll.
#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "epkit/moe/activation.hpp"
#include "epkit/moe/errors.hpp"
#include "epkit/moe/gate.hpp"
#include "epkit/moe/grouped_gemm.hpp"
#include "epkit/moe/quant.hpp"
#include "epkit/moe/router.hpp"
#include "epkit/moe_layer.hpp"
#include "runtime.hpp"
#include "tensor_arg.hpp"

namespace nb = nanobind;

namespace epkit::py {

namespace {

// Lets this thread make calls a stream capture in "global" mode forbids (cudaHostAlloc) while a
// capture runs elsewhere or on this thread: torch's allocator does the same for its cudaMalloc.
// Only the one-off host-mapped allocation of an ErrorRecord uses it; it is not part of any graph.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

// ErrorRecord is host-mapped memory of the device current at creation; it remembers that device.
class Record {
 public:
  explicit Record(int device) : device_(device) {
    DeviceGuard guard(device);
    RelaxedCaptureMode relaxed;
    rec_ = std::make_unique<moe::ErrorRecord>();
  }
  moe::DeviceErrorRecord* device_ptr(int device) const {
    EPKIT_CHECK(device == device_, "this ErrorRecord was made for cuda:", device_, " but the call runs on cuda:", device);
    return rec_->device();
  }
  moe::ErrorRecord& get() { return *rec_; }
  int device() const { return device_; }

 private:
  int device_;
  std::unique_ptr<moe::ErrorRecord> rec_;
};

moe::DeviceErrorRecord* record_of(const Record* r, int device) { return r ? r->device_ptr(device) : nullptr; }

moe::GroupedGemmShape gemm_shape(int num_groups, int n, int k, ExpertLayout layout, int rows, int expected_m) {
  moe::GroupedGemmShape s;
  s.num_groups = num_groups, s.n = n, s.k = k, s.layout = layout, s.rows = rows, s.expected_m = expected_m;
  return s;
}

std::string shape_str(const moe::GroupedGemmShape& s) {
  std::ostringstream os;
  os << "GroupedGemmShape(num_groups=" << s.num_groups << ", n=" << s.n << ", k=" << s.k << ", layout="
     << layout_name(s.layout) << ", rows=" << s.rows << ", expected_m=" << s.expected_m << ")";
  return os.str();
}

// A GroupedGemm bound to the device it was built on (its workspace and TMA descriptors live there).
class Gemm {
 public:
  Gemm(int num_groups, int n, int k, ExpertLayout layout, int rows, int expected_m,
       const std::optional<std::string>& config, int device)
      : device_(device) {
    const moe::GroupedGemmShape s = gemm_shape(num_groups, n, k, layout, rows, expected_m);
    DeviceGuard guard(device);
    gemm_ = config ? std::make_unique<moe::GroupedGemm>(s, moe::parse_gemm_config(*config))
                   : std::make_unique<moe::GroupedGemm>(s);
  }

  void run(const TensorArg& a, const TensorArg& a_scale, const TensorArg& b, const TensorArg& b_scale,
           const TensorArg& d, const TensorArg& expert_num_tokens, const TensorArg& expert_offsets, const Record* error,
           uintptr_t stream) {
    moe::GroupedGemmArgs g;
    g.a = to_tensor(a, "a", device_);
    g.a_scale = to_tensor(a_scale, "a_scale", device_);
    g.b = to_tensor(b, "b", device_);
    g.b_scale = to_tensor(b_scale, "b_scale", device_);
    g.d = to_tensor(d, "out", device_);  // the Python argument (GroupedGemmArgs::d)
    g.expert_num_tokens = to_tensor(expert_num_tokens, "expert_num_tokens", device_);
    g.expert_offsets = to_tensor(expert_offsets, "expert_offsets", device_);
    g.error = record_of(error, device_);
    DeviceGuard guard(device_);
    gemm_->run(g, as_stream(stream));
  }

  const moe::GroupedGemmShape& shape() const { return gemm_->shape(); }
  std::string config() const { return moe::to_string(gemm_->config()); }
  size_t workspace_bytes() const { return gemm_->workspace_bytes(); }
  int device() const { return device_; }

 private:
  int device_;
  std::unique_ptr<moe::GroupedGemm> gemm_;
};

class Gate {
 public:
  Gate(int hidden, int num_experts, int max_tokens, int device) : device_(device) {
    DeviceGuard guard(device);
    gate_ = std::make_unique<moe::GateProjection>(hidden, num_experts, max_tokens);
  }
  void run(const TensorArg& x, const TensorArg& w, const TensorArg& logits, int num_tokens, uintptr_t stream) {
    const Tensor tx = to_tensor(x, "x", device_), tw = to_tensor(w, "w", device_), tl = to_tensor(logits, "logits", device_);
    DeviceGuard guard(device_);
    gate_->run(tx, tw, tl, num_tokens, as_stream(stream));
  }
  const moe::GateShape& shape() const { return gate_->shape(); }
  size_t workspace_bytes() const { return gate_->workspace_bytes(); }
  int device() const { return device_; }

 private:
  int device_;
  std::unique_ptr<moe::GateProjection> gate_;
};

void route(const moe::RouterConfig& cfg, const TensorArg& logits, const TensorArg& bias, int num_tokens,
           const TensorArg& num_tokens_device, const TensorArg& num_tokens_out, const TensorArg& topk_idx,
           const TensorArg& topk_weights, const Record* error, int device, uintptr_t stream) {
  moe::RouterArgs a;
  a.logits = to_tensor(logits, "logits", device);
  a.bias = to_tensor(bias, "bias", device);
  a.num_tokens = num_tokens;
  a.num_tokens_device = device_int32(num_tokens_device, "num_tokens_device", device);
  a.num_tokens_out = const_cast<int32_t*>(device_int32(num_tokens_out, "num_tokens_out", device));
  a.topk_idx = to_tensor(topk_idx, "topk_idx", device);
  a.topk_weights = to_tensor(topk_weights, "topk_weights", device);
  a.error = record_of(error, device);
  DeviceGuard guard(device);
  moe::route(cfg, a, as_stream(stream));
}

void quantize_activations(const TensorArg& x, const TensorArg& out, const TensorArg& scale, bool ue8m0, int num_tokens,
                          const TensorArg& num_tokens_device, const Record* error, int device, uintptr_t stream) {
  moe::ActQuantArgs a;
  a.x = to_tensor(x, "x", device);
  a.out = to_tensor(out, "out", device);
  a.scale = to_tensor(scale, "scale", device);
  a.ue8m0 = ue8m0;
  a.num_tokens = num_tokens;
  a.num_tokens_device = device_int32(num_tokens_device, "num_tokens_device", device);
  a.error = record_of(error, device);
  DeviceGuard guard(device);
  moe::quantize_activations(a, as_stream(stream));
}

void quantize_weights(const TensorArg& w, const TensorArg& out, const TensorArg& scale_inv, bool ue8m0, int device,
                      uintptr_t stream) {
  moe::WeightQuantArgs a;
  a.w = to_tensor(w, "w", device);
  a.out = to_tensor(out, "out", device);
  a.scale_inv = to_tensor(scale_inv, "scale_inv", device);
  a.ue8m0 = ue8m0;
  DeviceGuard guard(device);
  moe::quantize_weights(a, as_stream(stream));
}

void silu_mul_quantize(ExpertLayout layout, const TensorArg& in, const TensorArg& out, const TensorArg& scale,
                       const TensorArg& expert_num_tokens, const TensorArg& expert_offsets, bool ue8m0,
                       const Record* error, int device, uintptr_t stream) {
  moe::SiluMulQuantArgs a;
  a.layout = layout;
  a.in = to_tensor(in, "h", device);  // the Python argument (SiluMulQuantArgs::in)
  a.out = to_tensor(out, "out", device);
  a.scale = to_tensor(scale, "scale", device);
  a.expert_num_tokens = to_tensor(expert_num_tokens, "expert_num_tokens", device);
  a.expert_offsets = to_tensor(expert_offsets, "expert_offsets", device);
  a.ue8m0 = ue8m0;
  a.error = record_of(error, device);
  DeviceGuard guard(device);
  moe::silu_mul_quantize(a, as_stream(stream));
}

std::string router_repr(const moe::RouterConfig& c) {
  std::ostringstream os;
  os << "RouterConfig(mode=" << moe::router_mode_name(c.mode) << ", num_experts=" << c.num_experts
     << ", topk=" << c.topk << ", num_groups=" << c.num_groups << ", topk_groups=" << c.topk_groups
     << ", renormalize=" << (c.renormalize ? "True" : "False") << ", routed_scaling=" << c.routed_scaling << ")";
  return os.str();
}

std::string layer_config_repr(const MoELayerConfig& c) {
  std::ostringstream os;
  os << "MoELayerConfig(hidden=" << c.hidden << ", intermediate=" << c.intermediate << ", num_experts=" << c.num_experts
     << ", topk=" << c.topk << ", router_mode=" << moe::router_mode_name(c.router_mode) << ", num_groups=" << c.num_groups
     << ", topk_groups=" << c.topk_groups << ", renormalize=" << (c.renormalize ? "True" : "False")
     << ", routed_scaling=" << c.routed_scaling << ", num_shared_experts=" << c.num_shared_experts
     << ", shared_intermediate=" << c.shared_intermediate << ", world_size=" << c.world_size << ", rank=" << c.rank
     << ", dp_size=" << c.dp_size << ", max_tokens_per_rank=" << c.max_tokens_per_rank
     << ", schedule=" << schedule_name(c.schedule) << ", layout=" << layout_name(c.layout)
     << ", expected_tokens=" << c.expected_tokens
     << ", shared_concurrent=" << (c.shared_concurrent ? "True" : "False") << ", ue8m0_scales=" << (c.ue8m0_scales ? "True" : "False")
     << ", fused_gate_router=" << (c.fused_gate_router ? "True" : "False") << ", timeout_ms=" << c.timeout_ms << ")";
  return os.str();
}

// The Python MoELayer: held as runtime.hpp's Held describes (its AllToAll objects hold symmetric
// memory; at world size 1 without NVSHMEM it is the single-process MoELayer(cfg, w) on the current
// device). The weights are views of the caller's tensors; the Python object keeps those alive.
class LayerHandle {
 public:
  LayerHandle(const MoELayerConfig& cfg, const TensorArg& w13, const TensorArg& w13_scale, const TensorArg& w2,
              const TensorArg& w2_scale, const TensorArg& shared_w13, const TensorArg& shared_w13_scale,
              const TensorArg& shared_w2, const TensorArg& shared_w2_scale, const TensorArg& gate,
              const TensorArg& gate_bias) {
    const bool single = !runtime().comm && cfg.world_size == 1;
    int dev = 0;
    if (single) {
      const cudaError_t e = cudaGetDevice(&dev);
      EPKIT_CHECK(e == cudaSuccess, "cudaGetDevice: ", cudaGetErrorString(e));
    } else {
      dev = comm().device();
    }
    MoELayerWeights w;
    w.w13 = to_tensor(w13, "w13", dev);
    w.w13_scale = to_tensor(w13_scale, "w13_scale", dev);
    w.w2 = to_tensor(w2, "w2", dev);
    w.w2_scale = to_tensor(w2_scale, "w2_scale", dev);
    w.shared_w13 = to_tensor(shared_w13, "shared_w13", dev);
    w.shared_w13_scale = to_tensor(shared_w13_scale, "shared_w13_scale", dev);
    w.shared_w2 = to_tensor(shared_w2, "shared_w2", dev);
    w.shared_w2_scale = to_tensor(shared_w2_scale, "shared_w2_scale", dev);
    w.gate = to_tensor(gate, "gate", dev);
    w.gate_bias = to_tensor(gate_bias, "gate_bias", dev);
    std::shared_ptr<MoELayer> layer;
    {
      nb::gil_scoped_release release;  // collective: its AllToAll objects agree with peers and allocate
      DeviceGuard guard(dev);
      layer = single ? std::make_shared<MoELayer>(cfg, w) : std::make_shared<MoELayer>(comm(), cfg, w);
    }
    held_.adopt(std::move(layer), single, dev);
  }
  int device() const { return held_.device(); }
  std::shared_ptr<MoELayer> get() const { return held_.get(); }
  void destroy() { held_.destroy(); }
  bool alive() const { return held_.alive(); }

  MoEBatch batch(const TensorArg& x, const TensorArg& out, int num_tokens, const TensorArg& num_tokens_device) const {
    const int dev = held_.device();
    MoEBatch b;
    b.x = to_tensor(x, "x", dev);
    b.out = to_tensor(out, "out", dev);
    b.num_tokens = num_tokens;
    b.num_tokens_device = device_int32(num_tokens_device, "num_tokens_device", dev);
    return b;
  }

 private:
  Held<MoELayer> held_{"MoELayer"};
};

template <typename T>
nb::ndarray<nb::device::cuda> device_view(const Tensor& t, nb::handle owner, int device) {
  size_t shape[4] = {0, 0, 0, 0};
  for (int i = 0; i < t.ndim; ++i) shape[i] = static_cast<size_t>(t.shape[i]);
  return nb::ndarray<nb::device::cuda>(t.data, static_cast<size_t>(t.ndim), shape, owner, nullptr, nb::dtype<T>(),
                                       nb::device::cuda::value, device);
}

}  // namespace

void bind_moe(nb::module_& m) {
  nb::enum_<moe::RouterMode>(m, "RouterMode", nb::is_arithmetic())
      .value("softmax_topk", moe::RouterMode::kSoftmaxTopK)
      .value("grouped_topk", moe::RouterMode::kGroupedTopK);
  nb::enum_<MoESchedule>(m, "MoESchedule", nb::is_arithmetic())
      .value("none", MoESchedule::kNone)
      .value("dispatch_overlap", MoESchedule::kDispatchOverlap)
      .value("microbatch", MoESchedule::kMicrobatch);

  nb::class_<moe::RouterConfig>(m, "RouterConfig")
      .def(nb::init<>())
      .def_rw("mode", &moe::RouterConfig::mode)
      .def_rw("num_experts", &moe::RouterConfig::num_experts)
      .def_rw("topk", &moe::RouterConfig::topk)
      .def_rw("num_groups", &moe::RouterConfig::num_groups)
      .def_rw("topk_groups", &moe::RouterConfig::topk_groups)
      .def_rw("renormalize", &moe::RouterConfig::renormalize)
      .def_rw("routed_scaling", &moe::RouterConfig::routed_scaling)
      .def("validate", [](const moe::RouterConfig& c) { moe::validate(c); })
      .def("__repr__", &router_repr);

  nb::class_<MoELayerConfig>(m, "MoELayerConfig")
      .def(nb::init<>())
      .def_rw("hidden", &MoELayerConfig::hidden)
      .def_rw("intermediate", &MoELayerConfig::intermediate)
      .def_rw("num_experts", &MoELayerConfig::num_experts)
      .def_rw("topk", &MoELayerConfig::topk)
      .def_rw("router_mode", &MoELayerConfig::router_mode)
      .def_rw("num_groups", &MoELayerConfig::num_groups)
      .def_rw("topk_groups", &MoELayerConfig::topk_groups)
      .def_rw("renormalize", &MoELayerConfig::renormalize)
      .def_rw("routed_scaling", &MoELayerConfig::routed_scaling)
      .def_rw("num_shared_experts", &MoELayerConfig::num_shared_experts)
      .def_rw("shared_intermediate", &MoELayerConfig::shared_intermediate)
      .def_rw("world_size", &MoELayerConfig::world_size)
      .def_rw("rank", &MoELayerConfig::rank)
      .def_rw("dp_size", &MoELayerConfig::dp_size)
      .def_rw("max_tokens_per_rank", &MoELayerConfig::max_tokens_per_rank)
      .def_rw("schedule", &MoELayerConfig::schedule)
      .def_rw("layout", &MoELayerConfig::layout)
      .def_rw("expected_tokens", &MoELayerConfig::expected_tokens)
      .def_rw("shared_concurrent", &MoELayerConfig::shared_concurrent)
      .def_rw("ue8m0_scales", &MoELayerConfig::ue8m0_scales)
      .def_rw("fused_gate_router", &MoELayerConfig::fused_gate_router)
      .def_rw("timeout_ms", &MoELayerConfig::timeout_ms)
      .def("validate", [](const MoELayerConfig& c) { validate(c); })
      .def("num_local_experts", [](const MoELayerConfig& c) { return num_local_experts(c); })
      .def("effective_shared_intermediate", [](const MoELayerConfig& c) { return shared_intermediate(c); })
      .def("microbatch_split", [](const MoELayerConfig& c) { return microbatch_split(c); })
      .def("workspace_bytes", [](const MoELayerConfig& c) { return layer_workspace_bytes(c); })
      .def("router_config", [](const MoELayerConfig& c) { return router_config(c); })
      .def("all_to_all_config", [](const MoELayerConfig& c) { return all_to_all_config(c, microbatch_split(c)); })
      .def("__repr__", &layer_config_repr);

  nb::class_<Record>(m, "ErrorRecord")
      .def(nb::init<int>(), nb::arg("device"), "Host-mapped record of device-side violations, for kernels on `device`.")
      .def_prop_ro("pending", [](Record& r) { return r.get().pending(); })
      .def_prop_ro("device", &Record::device)
      .def("message", [](Record& r) { return r.get().message(); })
      .def("check", [](Record& r) { r.get().check(); }, "Raises EpkitError with the recorded violation (and re-arms).")
      .def("reset", [](Record& r) { r.get().reset(); });

  nb::class_<Gemm>(m, "GroupedGemm")
      .def(nb::init<int, int, int, ExpertLayout, int, int, const std::optional<std::string>&, int>(),
           nb::arg("num_groups"), nb::arg("n"), nb::arg("k"), nb::arg("layout"), nb::arg("rows"), nb::arg("expected_m"),
           nb::arg("config").none(), nb::arg("device"),
           "Allocates and initialises everything for one shape on `device` (not inside a CUDA graph capture).")
      .def("run", &Gemm::run, nb::arg("a"), nb::arg("a_scale"), nb::arg("b"), nb::arg("b_scale"), nb::arg("d"),
           nb::arg("expert_num_tokens"), nb::arg("expert_offsets").none(), nb::arg("error").none(), nb::arg("stream"))
      .def_prop_ro("config", &Gemm::config)
      .def_prop_ro("num_groups", [](const Gemm& g) { return g.shape().num_groups; })
      .def_prop_ro("n", [](const Gemm& g) { return g.shape().n; })
      .def_prop_ro("k", [](const Gemm& g) { return g.shape().k; })
      .def_prop_ro("layout", [](const Gemm& g) { return g.shape().layout; })
      .def_prop_ro("rows", [](const Gemm& g) { return g.shape().rows; })
      .def_prop_ro("expected_m", [](const Gemm& g) { return g.shape().expected_m; })
      .def_prop_ro("workspace_bytes", &Gemm::workspace_bytes)
      .def_prop_ro("device", &Gemm::device)
      .def("__repr__", [](const Gemm& g) { return shape_str(g.shape()) + " config " + g.config(); });
  m.def("available_gemm_configs", [] {
    std::vector<std::string> names;
    for (const moe::GemmConfig& c : moe::available_gemm_configs()) names.push_back(moe::to_string(c));
    return names;
  });
  m.def(
      "choose_gemm_config",
      [](int num_groups, int n, int k, ExpertLayout layout, int rows, int expected_m) {
        return moe::to_string(moe::choose_gemm_config(gemm_shape(num_groups, n, k, layout, rows, expected_m)));
      },
      nb::arg("num_groups"), nb::arg("n"), nb::arg("k"), nb::arg("layout"), nb::arg("rows"), nb::arg("expected_m"));

  nb::class_<Gate>(m, "GateProjection")
      .def(nb::init<int, int, int, int>(), nb::arg("hidden"), nb::arg("num_experts"), nb::arg("max_tokens"),
           nb::arg("device"))
      .def("run", &Gate::run, nb::arg("x"), nb::arg("w"), nb::arg("logits"), nb::arg("num_tokens"), nb::arg("stream"))
      .def_prop_ro("hidden", [](const Gate& g) { return g.shape().hidden; })
      .def_prop_ro("num_experts", [](const Gate& g) { return g.shape().num_experts; })
      .def_prop_ro("max_tokens", [](const Gate& g) { return g.shape().max_tokens; })
      .def_prop_ro("workspace_bytes", &Gate::workspace_bytes)
      .def_prop_ro("device", &Gate::device);

  m.def("route", &route, nb::arg("config"), nb::arg("logits").none(), nb::arg("bias").none(), nb::arg("num_tokens"),
        nb::arg("num_tokens_device").none(), nb::arg("num_tokens_out").none(), nb::arg("topk_idx").none(),
        nb::arg("topk_weights").none(), nb::arg("error").none(), nb::arg("device"), nb::arg("stream"));
  m.def("quantize_activations", &quantize_activations, nb::arg("x").none(), nb::arg("out").none(),
        nb::arg("scale").none(), nb::arg("ue8m0"), nb::arg("num_tokens"), nb::arg("num_tokens_device").none(),
        nb::arg("error").none(), nb::arg("device"), nb::arg("stream"));
  m.def("quantize_weights", &quantize_weights, nb::arg("w").none(), nb::arg("out").none(), nb::arg("scale_inv").none(),
        nb::arg("ue8m0"), nb::arg("device"), nb::arg("stream"));
  m.def("silu_mul_quantize", &silu_mul_quantize, nb::arg("layout"), nb::arg("input").none(), nb::arg("out").none(),
        nb::arg("scale").none(), nb::arg("expert_num_tokens").none(), nb::arg("expert_offsets").none(),
        nb::arg("ue8m0"), nb::arg("error").none(), nb::arg("device"), nb::arg("stream"));

  nb::class_<LayerHandle>(m, "MoELayer")
      .def(nb::init<const MoELayerConfig&, const TensorArg&, const TensorArg&, const TensorArg&, const TensorArg&,
                    const TensorArg&, const TensorArg&, const TensorArg&, const TensorArg&, const TensorArg&,
                    const TensorArg&>(),
           nb::arg("config"), nb::arg("w13").none(), nb::arg("w13_scale").none(), nb::arg("w2").none(),
           nb::arg("w2_scale").none(), nb::arg("shared_w13").none(), nb::arg("shared_w13_scale").none(),
           nb::arg("shared_w2").none(), nb::arg("shared_w2_scale").none(), nb::arg("gate").none(),
           nb::arg("gate_bias").none(),
           "Collective: validates config and weights, creates the layer's AllToAll objects and workspace. At "
           "world size 1 without NVSHMEM: the single-process layer on the current device.")
      .def(
          "forward",
          [](LayerHandle& h, const TensorArg& x, const TensorArg& out, int num_tokens, const TensorArg& num_tokens_device,
             uintptr_t stream) {
            auto l = h.get();
            const MoEBatch b = h.batch(x, out, num_tokens, num_tokens_device);
            DeviceGuard guard(h.device());
            l->forward(b, as_stream(stream));
          },
          nb::arg("x").none(), nb::arg("out").none(), nb::arg("num_tokens"), nb::arg("num_tokens_device").none(),
          nb::arg("stream"))
      .def(
          "begin",
          [](LayerHandle& h, const TensorArg& x, const TensorArg& out, int num_tokens, const TensorArg& num_tokens_device,
             uintptr_t stream) {
            auto l = h.get();
            const MoEBatch b = h.batch(x, out, num_tokens, num_tokens_device);
            DeviceGuard guard(h.device());
            l->begin(b, as_stream(stream));
          },
          nb::arg("x").none(), nb::arg("out").none(), nb::arg("num_tokens"), nb::arg("num_tokens_device").none(),
          nb::arg("stream"))
      .def(
          "stage",
          [](LayerHandle& h, int which, int half, uintptr_t stream) {
            auto l = h.get();
            DeviceGuard guard(h.device());
            switch (which) {
              case 0: l->stage_route(half, as_stream(stream)); break;
              case 1: l->stage_dispatch_send(half, as_stream(stream)); break;
              case 2: l->stage_experts(half, as_stream(stream)); break;
              case 3: l->stage_combine_recv(half, as_stream(stream)); break;
              default: EPKIT_FAIL("stage ", which, " is not 0 (route), 1 (dispatch_send), 2 (experts) or 3 (combine_recv)");
            }
          },
          nb::arg("which"), nb::arg("half"), nb::arg("stream"))
      .def("check", [](LayerHandle& h) { h.get()->check(); })
      .def(
          "routing",
          [](nb::handle_t<LayerHandle> self, int half) {
            LayerHandle& h = nb::cast<LayerHandle&>(self);
            auto l = h.get();
            const MoELayer::Routing r = l->routing(half);
            return std::make_tuple(device_view<float>(r.logits, self, h.device()),
                                   device_view<int32_t>(r.topk_idx, self, h.device()),
                                   device_view<float>(r.topk_weights, self, h.device()));
          },
          nb::arg("half"), "Device views of half `half`'s logits, topk_idx and topk_weights (valid until destroy()).")
      .def(
          "expert_counts",
          [](LayerHandle& h, int half) {
            auto l = h.get();
            nb::gil_scoped_release release;  // synchronises the device
            DeviceGuard guard(h.device());
            return l->expert_counts(half);
          },
          nb::arg("half"))
      .def("destroy", &LayerHandle::destroy, "Collective: frees the layer and its AllToAll buffers now. Idempotent.")
      .def_prop_ro("alive", &LayerHandle::alive)
      .def_prop_ro("device", &LayerHandle::device)
      .def_prop_ro("config", [](const LayerHandle& h) { return h.get()->config(); })
      .def_prop_ro("workspace_bytes", [](const LayerHandle& h) { return h.get()->workspace_bytes(); })
      .def_prop_ro("symmetric_bytes", [](const LayerHandle& h) {
        auto l = h.get();
        const int halves = l->config().schedule == MoESchedule::kMicrobatch ? 2 : 1;
        size_t total = 0;
        for (int i = 0; i < halves; ++i) total += l->all_to_all(i).symmetric_bytes();
        return total;
      });
}

}  // namespace epkit::py
