// Host-side argument validation of every AllToAll call: pure C++ (CPU-tested), run before any
// launch. Turns checked tensor views into the raw-pointer structs the kernels take.
#pragma once

#include "epkit/all_to_all.hpp"
#include "kernels/kernel_params.hpp"

namespace epkit::host {

// Checks the fields of `a` that the halves in use read (send: inputs; recv: outputs) against the
// config; throws epkit::Error naming the tensor, the value and the limit. `call` prefixes messages.
kernels::DispatchIO check_dispatch_args(const AllToAllConfig& cfg, const DispatchArgs& a, bool send, bool recv,
                                        const char* call);
kernels::CombineIO check_combine_args(const AllToAllConfig& cfg, const CombineArgs& a, bool send, bool recv,
                                      const char* call);

}  // namespace epkit::host
