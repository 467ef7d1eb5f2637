// Host-side argument validation of every AllToAll call: pure C++ (CPU-tested), run before any
// launch. Turns checked tensor views into the raw-pointer structs the kernels take.
#pragma once

#include "epkit/all_to_all.hpp"
#include "comm/kernels/params.hpp"

namespace epkit::host {

// The dtypes of the layer in flight. Each call takes them from its tensors; the config fixes only
// element sizes, which size the symmetric buffers: payload bf16 or fp16 where the config says a
// 2-byte one (copied as bytes), fp8 where it says fp8; expert outputs bf16 or fp16 where it says
// a 2-byte type, fp32 where it says fp32; the output (and so the partials on the wire) bf16 or
// fp16. A send half records them here and the receive half must match: it has no inputs to read
// them from, and the partials it sums were packed in the send half's output type.
struct LayerDTypes {
  DType payload;      // x, and so expert_x
  DType combine_in;   // expert_y
  DType combine_out;  // the partials combine_send packs, and so out
};
inline LayerDTypes config_dtypes(const AllToAllConfig& c) {
  return {c.dispatch_dtype, c.combine_in_dtype, c.combine_out_dtype};
}

// Checks the fields of `a` that the halves in use read (send: inputs; recv: outputs) against the
// config and `layer`; throws epkit::Error naming the tensor, the value and the limit. `call`
// prefixes messages. On success a send half stores its dtypes into `layer`.
kernels::DispatchIO check_dispatch_args(const AllToAllConfig& cfg, const DispatchArgs& a, bool send, bool recv,
                                        const char* call, LayerDTypes& layer);
kernels::CombineIO check_combine_args(const AllToAllConfig& cfg, const CombineArgs& a, bool send, bool recv,
                                      const char* call, LayerDTypes& layer);

// The same for a layer whose send half (if any) used the config's own dtypes.
inline kernels::DispatchIO check_dispatch_args(const AllToAllConfig& cfg, const DispatchArgs& a, bool send, bool recv,
                                               const char* call) {
  LayerDTypes layer = config_dtypes(cfg);
  return check_dispatch_args(cfg, a, send, recv, call, layer);
}
inline kernels::CombineIO check_combine_args(const AllToAllConfig& cfg, const CombineArgs& a, bool send, bool recv,
                                             const char* call) {
  LayerDTypes layer = config_dtypes(cfg);
  return check_combine_args(cfg, a, send, recv, call, layer);
}

}  // namespace epkit::host
