// Kernel launchers: raw pointers, the variant the host chose (host/launch_plan.hpp) and a stream
// in, cudaError_t out. Validation and every choice happened before.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "comm/kernels/params.hpp"
#include "comm/local/mapping.hpp"
#include "epkit/types.hpp"

namespace epkit::kernels {

// The compiled variants of the general (W >= 2) kernels (host::dispatch_kernel, host::combine_kernel).
enum class DispatchKernel { kSmall, kSmallP2P, kDecode, kLarge };
enum class CombineKernel { kSmall, kSmallP2P, kDecode, kLarge };

cudaError_t launch_dispatch(const CommParams& p, const DispatchIO& io, DispatchKernel kernel, bool do_send, bool do_recv,
                            const LaunchShape& shape, cudaStream_t stream);
// Dispatches on (in, out) dtype: in in {bf16, fp16, fp32}, out in {bf16, fp16}.
cudaError_t launch_combine(const CommParams& p, const CombineIO& io, CombineKernel kernel, DType in, DType out,
                           bool do_send, bool do_recv, const LaunchShape& shape, cudaStream_t stream);

// World size 1 (local.cu): the same calls without a peer. `kernel`: a fused host-m call's one-path
// dispatch (host::local_fused_dispatch), or {false, ...} for the object's general kernel;
// `wave_chunks`: a fused host-m call's one-wave combine (host::local_fused_combine_chunks), or 0.
cudaError_t launch_local_dispatch(const CommParams& p, const DispatchIO& io, const LocalFusedDispatch& kernel,
                                  bool do_send, bool do_recv, const LaunchShape& shape, cudaStream_t stream);
cudaError_t launch_local_combine(const CommParams& p, const CombineIO& io, int wave_chunks, DType in, DType out,
                                 bool do_send, bool do_recv, const LaunchShape& shape, cudaStream_t stream);

}  // namespace epkit::kernels
