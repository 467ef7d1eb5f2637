// AllToAll: expert-parallel dispatch and combine over NVSHMEM, split into send and receive halves.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "epkit/communicator.hpp"
#include "epkit/config.hpp"
#include "epkit/shapes.hpp"
#include "epkit/types.hpp"

namespace epkit {

// dtypes: each call takes them from its tensors. The config fixes only element sizes (they size
// the symmetric buffers): payload bf16 or fp16 when dispatch_dtype is either (copied as bytes),
// fp8_e4m3 when it is fp8; expert_y bf16 or fp16 when combine_in_dtype is either, fp32 when it is
// fp32; out bf16 or fp16. Nothing is created per dtype, so a new dtype may first appear inside a
// CUDA graph capture. Every rank must pass the same payload and out dtypes to one call (as with
// pplx-kernels): a peer reads the payload and the combine partials in its own call's types; this
// is not checked. expert_y's dtype is local to each rank.

// Everything one dispatch call reads and writes. dispatch_send reads the inputs, dispatch_recv
// writes the outputs; pass the same struct to both halves. Token-side tensors with zero rows
// (m = 0) may have a null data pointer.
struct DispatchArgs {
  Tensor x;                  // [rows >= m, H], payload dtype (same element size as dispatch_dtype)
  Tensor x_scale;            // [rows >= m, ceil(H/128)] fp32; required iff the payload is fp8
  Tensor topk_idx;           // [rows >= m, K] int32, int64 or uint32; negative (or 0xffffffff) = no expert
  int num_tokens = -1;       // m on the host, 0 <= m <= M; or -1 with num_tokens_device
  const int32_t* num_tokens_device = nullptr;  // one-element device int holding m (one graph serves any m)
  // Outputs, in the config's layout (layout.hpp: ExpertShapes gives the shapes). Per expert, the rows
  // hold this rank's own tokens, then those sent by rank + 1, ..., W - 1, 0, ..., rank - 1, one
  // contiguous run per sender (ref::dispatch_slots); the order within one sender's run is unspecified.
  Tensor expert_x;           // masked [E/W, capacity, H]; packed [R, H]; x's dtype
  Tensor expert_x_scale;     // masked [E/W, capacity, ceil(H/128)] ([E/W, ceil(H/128), capacity] with
                             // config.expert_scales_mn_major); packed [R, ceil(H/128)]; fp32 (fp8 only)
  Tensor expert_num_tokens;  // [E/W] int32: rows placed per local expert
  Tensor expert_offsets;     // [E/W + 1] int32, packed only (required there, absent otherwise): expert e's
                             // rows are expert_offsets[e] + [0, expert_num_tokens[e]); each offset is a
                             // multiple of packed_row_align, and the last is the rows in use (<= R)
  Tensor topk_weights;       // [rows >= m, K] fp32: required iff config.weights_at_dispatch, else absent
};

// Everything one combine call reads and writes; pass the same struct to both halves.
struct CombineArgs {
  Tensor expert_y;           // masked [E/W, capacity, H]; packed [R, H]; bf16/fp16 (fp32 if combine_in_dtype is): expert outputs,
                             // row for row as dispatched (rows no expert_num_tokens covers are never read)
  Tensor topk_idx;           // [rows >= m, K], the same indices as the matching dispatch
  Tensor topk_weights;       // [rows >= m, K] fp32; absent when config.weights_at_dispatch (dispatch carried them)
  int num_tokens = -1;       // m, as in DispatchArgs
  const int32_t* num_tokens_device = nullptr;
  Tensor out;                // [rows >= m, H], bf16 or fp16 (output): sum_k w[t,k] * y(idx[t,k], t);
                             // rows t >= m are left untouched. combine_send packs the partials in
                             // out's type (combine_out_dtype if it has no out), so give it out too
};

class AllToAll {
 public:
  // Collective over all ranks of comm: checks that every rank passed the same config (throws
  // naming the field and the ranks otherwise) and allocates the symmetric buffers.
  AllToAll(const Communicator& comm, const AllToAllConfig& cfg);
  // World size 1 in one process, with no Communicator and no NVSHMEM: cfg.world_size must be 1 and
  // cfg.rank 0. Dispatch is then a permutation on this GPU (the current device) and combine its
  // inverse; every call and semantic is the same.
  explicit AllToAll(const AllToAllConfig& cfg);
  ~AllToAll();
  AllToAll(const AllToAll&) = delete;
  AllToAll& operator=(const AllToAll&) = delete;

  const AllToAllConfig& config() const;

  // Each call validates its arguments on the host, then launches on `stream` without host
  // synchronisation or allocation (capturable in a CUDA graph). A device-side timeout recorded
  // earlier is raised before launching (the object is then unusable); recoverable device errors
  // (capacity or packed-rows overflow, expert index >= E, device m > M) are raised after combine/combine_recv has
  // launched, or by check(), so that every rank always launches whole layers.
  // Calls must come in the order dispatch_send, dispatch_recv, combine_send, combine_recv per layer.
  // Each call's kernel may start before the previous kernel in the stream ends (programmatic
  // dependent launch) but touches no memory until that kernel has finished, and it lets the next
  // kernel start early: a kernel launched after a call with programmatic stream serialization must
  // call cudaGridDependencySynchronize() before reading the call's outputs (plain launches need nothing).
  void dispatch_send(const DispatchArgs& a, cudaStream_t stream);
  void dispatch_recv(const DispatchArgs& a, cudaStream_t stream);
  void dispatch(const DispatchArgs& a, cudaStream_t stream);  // both halves, one kernel
  void combine_send(const CombineArgs& a, cudaStream_t stream);
  void combine_recv(const CombineArgs& a, cudaStream_t stream);
  void combine(const CombineArgs& a, cudaStream_t stream);    // both halves, one kernel

  // Raises epkit::Error if a kernel recorded an error (timeout, capacity or packed-rows overflow, bad index, m > M).
  // Does not synchronise: call after cudaStreamSynchronize to see the errors of finished work.
  void check() const;
  // True once a device-side timeout has been recorded (read from host-mapped memory, without
  // synchronising) or raised: the object is unusable and every call and check() raise that timeout.
  bool failed() const;

  size_t symmetric_bytes() const;  // NVSHMEM heap taken by this object (device memory without a Communicator)
  size_t workspace_bytes() const;  // local device workspace taken by this object
  // Number of peers reached by direct loads/stores (the rest use put-with-signal).
  int num_p2p_peers() const;


  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace epkit
