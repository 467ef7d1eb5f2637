// Kernel launchers: raw pointers and a stream in, cudaError_t out. Validation happened before.
#pragma once

#include <cuda_runtime_api.h>

#include "epkit/types.hpp"
#include "kernels/kernel_params.hpp"

namespace epkit::kernels {

// Dynamic shared memory the kernels need for this world size and expert count.
size_t dispatch_smem_bytes(int world_size, int num_experts, int topk);
size_t combine_smem_bytes(int world_size);
// Warp-sized work units of combine's largest half; with host::general_blocks they size its grid.
// group: warps per send slice the grid is sized for (combine_grid_group).
int combine_units(int world_size, int max_msgs_per_src, int max_tokens, int slices, int group);

cudaError_t launch_dispatch(const CommParams& p, const DispatchIO& io, bool do_send, bool do_recv,
                            const LaunchShape& shape, cudaStream_t stream);

// Dispatches on (in, out) dtype: in in {bf16, fp16, fp32}, out in {bf16, fp16}.
cudaError_t launch_combine(const CommParams& p, const CombineIO& io, DType in, DType out, bool do_send,
                           bool do_recv, const LaunchShape& shape, cudaStream_t stream);

// World size 1 (local.cu): the same calls without a peer; their shapes come from
// host/local_shape.hpp (CPU-tested), the small dispatch's piece in CommParams::local_piece_chunks.
cudaError_t launch_local_dispatch(const CommParams& p, const DispatchIO& io, bool do_send, bool do_recv,
                                  const LaunchShape& shape, cudaStream_t stream);
cudaError_t launch_local_combine(const CommParams& p, const CombineIO& io, DType in, DType out, bool do_send,
                                 bool do_recv, const LaunchShape& shape, cudaStream_t stream);

}  // namespace epkit::kernels
