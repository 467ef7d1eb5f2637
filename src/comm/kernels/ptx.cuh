// PTX primitives of the communication kernels: system-scope loads, stores and reductions for flags
// that peers (other GPUs, other processes) read, programmatic dependent launch, named barriers, and
// the launch helper every kernel goes through.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "comm/kernels/params.hpp"

namespace epkit::kernels {

constexpr int kWarpSize = 32;
constexpr int kThreads = kThreadsPerBlock;
constexpr int kWarps = kWarpsPerBlock;

__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// Release fence at system scope (the fence half of st.release.sys; lighter than __threadfence_system's fence.sc).
__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
__device__ __forceinline__ void st_relaxed_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t ld_relaxed_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_sys_add(uint64_t* p, uint64_t v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// GPU scope: for a reader on this GPU (our own counters), where the system-scope fence is not needed.
__device__ __forceinline__ void red_release_gpu_add(uint64_t* p, uint64_t v) {
  asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// 16-byte load that bypasses L1: the data may have been written by a peer during this kernel.
__device__ __forceinline__ int4 ld_cg16(const void* p) { return __ldcg(reinterpret_cast<const int4*>(p)); }
__device__ __forceinline__ void st16(void* p, int4 v) { *reinterpret_cast<int4*>(p) = v; }

// Programmatic dependent launch (every kernel here is launched with launch_after_previous): the
// kernel may be scheduled before the previous kernel in the stream has finished, so its first
// statement waits for that kernel's completion and memory (griddepcontrol.wait; a no-op when not
// launched that way), and it then lets the next such kernel be scheduled. Nothing is read or
// written before the wait, so the only overlap is the launch and block scheduling.
__device__ __forceinline__ void wait_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // older GPUs serialise the launches anyway
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<shape.blocks, kThreads, shape.smem_bytes, stream>>>(args...), allowed to be scheduled
// before the previous kernel in the stream ends (programmatic stream serialization); the kernel
// must start with wait_previous_kernel(). Capturable: graphs keep it as a programmatic edge. More
// than 48 KB of dynamic shared memory is opted into here, for every kernel.
template <typename... Params, typename... Args>
cudaError_t launch_after_previous(void (*kernel)(Params...), const LaunchShape& shape, cudaStream_t stream,
                                  Args&&... args) {
  if (shape.smem_bytes > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(shape.smem_bytes));
    if (e != cudaSuccess) return e;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(shape.blocks);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = shape.smem_bytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// bar.sync on a named barrier (1..15; 0 is __syncthreads) for `threads` threads, whole warps.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// Every 64-byte line of a kernel's parameter objects into the SM's constant cache at once. A
// kernel's first read of a parameter line misses on every SM, and the decode path reads its
// parameters where it needs them, so those misses can come one after the other on the chain. Every
// thread calls it before wait_previous_kernel (parameters are valid at launch, so with a
// programmatic launch the fills overlap the previous kernel); one warp of the block loads, and
// waits for the loads at once, the others find the lines filled or on their way. Measured: -0.1 to
// -0.3 us per pair in the W = 1 graph replay; in the general kernels only on a warp with no decode
// work (below). The xor of the words means nothing: its store to a shared word nobody reads keeps
// the loads (an empty asm did not, and behind a branch that is never taken the compiler moved them
// under the branch).
template <typename T>
__device__ __forceinline__ uint32_t param_lines_xor(const T& a) {
  static_assert(sizeof(T) % 4 == 0, "parameter objects are whole words");
  const uint32_t* w = reinterpret_cast<const uint32_t*>(&a);
  uint32_t x = w[sizeof(T) / 4 - 1];  // the last line, wherever the stride below ends
#pragma unroll
  for (size_t i = 0; i < sizeof(T) / 4; i += 16) x ^= w[i];
  return x;
}
template <typename IO>
__device__ __forceinline__ void touch_param_lines(const CommParams& p, const IO& io, int warp = kWarps - 1) {
  __shared__ uint32_t sink;
  if (threadIdx.x / kWarpSize != warp) return;
  const uint32_t x = param_lines_xor(p) ^ param_lines_xor(io);
  if (threadIdx.x % kWarpSize == 0) *static_cast<volatile uint32_t*>(&sink) = x;
}
// The general decode kernels touch them on a warp that has no work at decode (dispatch: warp 14,
// past the sending block's slice, send_slot and count warps for up to 288 experts; combine: warp
// 13, between the partial groups and the weights' warp): graph 0 to -0.3 us per pair. On the last
// warp, which has work in these kernels, the touch cost +0.1 to +0.3 us. The immediate-constant
// cache is per SM sub-partition (2-4 KB, a miss about 60 cycles, one H100): touching by ULDC, on
// one warp per sub-partition, or pinning the token side's parameters together measured no better.
constexpr int kDispatchTouchWarp = kWarps - 2;
constexpr int kCombineTouchWarp = kWarps - 3;

}  // namespace epkit::kernels
