// The gate projection and the grouped router in one kernel (epkit/moe/gate.hpp, GateRouter).
//
// Grid: (E / 16 expert tiles) x (H / 512 slices), 4 warps a block. Warp w of block (tile, slice)
// computes the 16 x NT*8 partial logits of experts [16 tile, 16 tile + 16) over the 128 columns
// [512 slice + 128 w, + 128) with mma.m16n8k16 (bf16 in, fp32 accumulate): the weights are the M
// side (16 experts), the tokens the N side (8 per n-tile, NT n-tiles for up to 32 tokens). Every
// load is one 16-byte word per lane straight into the fragments: lane (g, q) = (lane / 4, lane % 4)
// loads columns [8q, 8q + 8) of each 32-column step for its rows g and g + 8 and for token g, and
// both operands map the fragment's k slots (2q, 2q + 1, 2q + 8, 2q + 9 of two k16 mmas) onto those
// same 8 memory columns, so each product pairs the same column of W and x. All 4 steps' weights are
// loaded before the first mma (the weights stream once, at HBM rate).
//
// The 4 warps' sums are added in shared memory (warp 0 + 1 + 2 + 3), and the block writes them to
// partial[slice][token][expert]. Each block then takes a ticket from a 64-bit arrival counter that
// only grows (launch e's tickets are [e T, e T + T), T the grid's blocks, so nothing is reset),
// with release semantics after a barrier, so its partials are visible to whoever acquires that
// count. The R blocks holding the last tickets (R = ceil(rows / 4)) route: each waits (acquire)
// until the counter reaches the launch's end, then its warps take one token each, add the slices'
// partials in slice order
// (deterministic), write the logits and route them with the warp router's code. Only blocks that
// finished their own work wait, and they wait for blocks that have started or will start on the
// SMs the others free: no co-residency is assumed.
#include <cuda_runtime.h>

#include "epkit/error.hpp"
#include "epkit/moe/gate.hpp"
#include "moe/kernel_util.cuh"
#include "moe/router_warp.cuh"

namespace epkit::moe {
namespace {

constexpr int kWarps = 4;
constexpr int kSteps = 4;  // 32-column steps per warp: kWarps * kSteps * 32 = kGateRouterSlice
constexpr int kMaxRows = kGateRouterMaxTokens;
static_assert(kWarps * kSteps * 32 == kGateRouterSlice, "a block covers one slice");

struct GateRouterParams {
  const uint16_t* x;   // [rows_x, H] bf16 bits
  const uint16_t* w;   // [E, H] bf16 bits
  float* logits;       // [rows, E]
  float* partial;      // [slices, kMaxRows, E]
  unsigned long long* counter;
  const float* bias;   // [E] or nullptr
  int hidden;
  int gemm_rows;       // rows of x the GEMM reads: m on the host, else the smallest rows (<= 32)
  int router_blocks;   // R
  int num_tokens;
  const int32_t* num_tokens_device;
  int32_t* num_tokens_out;
  int rows;            // the clamp of a device m
  DeviceErrorRecord* error;
  detail::WarpRoute route;
};

__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The block's ticket. Release (gpu scope, cumulative): every store the block made before the
// __syncthreads() that precedes it is visible to whoever acquires the count it produced.
__device__ __forceinline__ unsigned long long take_ticket(unsigned long long* p) {
  unsigned long long v;
  asm volatile("atom.add.acq_rel.gpu.global.u64 %0, [%1], 1;\n" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ unsigned long long load_acquire(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];\n" : "=l"(v) : "l"(p) : "memory");
  return v;
}

template <int NT, int V>
__global__ void __launch_bounds__(kWarps * 32) gate_router_kernel(const GateRouterParams p) {
  constexpr int E = 32 * V;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int tile = blockIdx.x, slice = blockIdx.y, H = p.hidden;

  // ---- the block's partial logits ----
  const int col = slice * kGateRouterSlice + warp * (kSteps * 32) + 8 * q;
  const uint16_t* wr = p.w + static_cast<size_t>(tile * 16 + g) * H + col;
  uint4 a_lo[kSteps], a_hi[kSteps];  // rows g and g + 8 of the tile
#pragma unroll
  for (int i = 0; i < kSteps; ++i) {
    a_lo[i] = __ldg(reinterpret_cast<const uint4*>(wr + 32 * i));
    a_hi[i] = __ldg(reinterpret_cast<const uint4*>(wr + static_cast<size_t>(8) * H + 32 * i));
  }
  uint4 b[NT][kSteps];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int t = 8 * j + g;
    const uint16_t* xr = p.x + static_cast<size_t>(t) * H + col;
#pragma unroll
    for (int i = 0; i < kSteps; ++i)
      b[j][i] = t < p.gemm_rows ? __ldg(reinterpret_cast<const uint4*>(xr + 32 * i)) : make_uint4(0, 0, 0, 0);
  }
  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
  for (int i = 0; i < kSteps; ++i) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      mma_bf16(acc[j], a_lo[i].x, a_hi[i].x, a_lo[i].y, a_hi[i].y, b[j][i].x, b[j][i].y);
      mma_bf16(acc[j], a_lo[i].z, a_hi[i].z, a_lo[i].w, a_hi[i].w, b[j][i].z, b[j][i].w);
    }
  }

  __shared__ float red[kWarps][NT * 4 * 32];
  __shared__ unsigned long long ticket_s;
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) red[warp][(j * 4 + r) * 32 + lane] = acc[j][r];
  __syncthreads();
  for (int i = threadIdx.x; i < NT * 4 * 32; i += kWarps * 32) {
    const float v = __fadd_rn(__fadd_rn(__fadd_rn(red[0][i], red[1][i]), red[2][i]), red[3][i]);
    const int L = i & 31, jr = i >> 5, j = jr >> 2, r = jr & 3;
    const int e = tile * 16 + (L >> 2) + 8 * (r >> 1), t = 8 * j + 2 * (L & 3) + (r & 1);
    if (t < p.gemm_rows) p.partial[(static_cast<size_t>(slice) * kMaxRows + t) * E + e] = v;
  }
  __syncthreads();
  if (threadIdx.x == 0) ticket_s = take_ticket(p.counter);
  __syncthreads();

  // ---- the last R blocks: add the slices, route ----
  const unsigned long long total = static_cast<unsigned long long>(gridDim.x) * gridDim.y;
  const unsigned long long ticket = ticket_s;
  const int pos = static_cast<int>(ticket % total);
  const int first_router = static_cast<int>(total) - p.router_blocks;
  if (pos < first_router) return;
  const int rr = pos - first_router;
  if (threadIdx.x == 0) {
    const unsigned long long end = (ticket / total + 1) * total;
    while (load_acquire(p.counter) < end) __nanosleep(32);
  }
  __syncthreads();

  const bool reporter = rr == 0 && threadIdx.x == 0;
  const int m = detail::resolve_num_tokens(p.num_tokens, p.num_tokens_device, p.rows, p.error, KernelId::kRouter,
                                           reporter);
  if (p.num_tokens_out != nullptr && reporter) *p.num_tokens_out = m;
  const int slices = gridDim.y;
  float bias[V];
  detail::load_lane_bias<V>(p.bias, lane, bias);
  for (int t = rr * kWarps + warp; t < m; t += p.router_blocks * kWarps) {
    // The slices' partials in slice order, kChunk slices' loads in flight at a time (64 floats a lane).
    constexpr int kChunk = 64 / V;
    float s[V];
    const float* src = p.partial + static_cast<size_t>(t) * E + lane * V;
    for (int s0 = 0; s0 < slices; s0 += kChunk) {
      float4 v[kChunk][V / 4];
#pragma unroll
      for (int c = 0; c < kChunk; ++c)
#pragma unroll
        for (int i = 0; i < V / 4; ++i)
          v[c][i] = s0 + c < slices
                        ? __ldcg(reinterpret_cast<const float4*>(src + static_cast<size_t>(s0 + c) * kMaxRows * E) + i)
                        : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int c = 0; c < kChunk; ++c) {
        if (s0 + c >= slices) break;
#pragma unroll
        for (int i = 0; i < V / 4; ++i) {
          if (s0 + c == 0) {
            s[4 * i] = v[c][i].x, s[4 * i + 1] = v[c][i].y, s[4 * i + 2] = v[c][i].z, s[4 * i + 3] = v[c][i].w;
          } else {
            s[4 * i] = __fadd_rn(s[4 * i], v[c][i].x), s[4 * i + 1] = __fadd_rn(s[4 * i + 1], v[c][i].y);
            s[4 * i + 2] = __fadd_rn(s[4 * i + 2], v[c][i].z), s[4 * i + 3] = __fadd_rn(s[4 * i + 3], v[c][i].w);
          }
        }
      }
    }
    float* out = p.logits + static_cast<size_t>(t) * E + lane * V;
#pragma unroll
    for (int i = 0; i < V / 4; ++i)
      reinterpret_cast<float4*>(out)[i] = make_float4(s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]);
    detail::warp_route_token<V>(p.route, lane, t, s, bias);
  }
}

template <int NT>
void launch_v(const GateRouterParams& p, int V, dim3 grid, cudaStream_t s) {
  switch (V) {
    case 4: gate_router_kernel<NT, 4><<<grid, kWarps * 32, 0, s>>>(p); break;
    case 8: gate_router_kernel<NT, 8><<<grid, kWarps * 32, 0, s>>>(p); break;
    case 16: gate_router_kernel<NT, 16><<<grid, kWarps * 32, 0, s>>>(p); break;
    default: EPKIT_FAIL("GateRouter: no kernel for ", V, " experts per lane");
  }
}

}  // namespace

struct GateRouter::Impl {
  GateShape shape;
  RouterConfig router;
  float* partial = nullptr;
  unsigned long long* counter = nullptr;
  size_t partial_bytes = 0;
  ~Impl() {
    if (partial) cudaFree(partial);
    if (counter) cudaFree(counter);
  }
};

GateRouter::GateRouter(int hidden, const RouterConfig& router, int max_tokens) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.shape = GateShape{hidden, router.num_experts, max_tokens};
  s.router = router;
  validate(s.shape);
  validate(router);
  const char* why = nullptr;
  EPKIT_CHECK(gate_router_applies(s.shape, router, &why), "GateRouter(hidden = ", hidden, ", E = ", router.num_experts,
              ", max_tokens = ", max_tokens, "): ", why);
  s.partial_bytes = static_cast<size_t>(hidden / kGateRouterSlice) * kMaxRows * router.num_experts * sizeof(float);
  EPKIT_CUDA_CHECK(cudaMalloc(&s.partial, s.partial_bytes));
  EPKIT_CUDA_CHECK(cudaMalloc(&s.counter, sizeof(unsigned long long)));
  EPKIT_CUDA_CHECK(cudaMemset(s.counter, 0, sizeof(unsigned long long)));
  EPKIT_CUDA_CHECK(cudaDeviceSynchronize());
}

GateRouter::~GateRouter() = default;

const GateShape& GateRouter::shape() const { return impl_->shape; }
const RouterConfig& GateRouter::router() const { return impl_->router; }
size_t GateRouter::workspace_bytes() const { return impl_->partial_bytes + sizeof(unsigned long long); }

void GateRouter::run(const Tensor& x, const Tensor& w, const RouterArgs& a, cudaStream_t stream) {
  const Impl& s = *impl_;
  check_gate_router_args(s.shape, s.router, x, w, a);
  const bool on_device = a.num_tokens_device != nullptr;
  if (!on_device && a.num_tokens == 0) {
    if (a.num_tokens_out) EPKIT_CUDA_CHECK(cudaMemsetAsync(a.num_tokens_out, 0, sizeof(int32_t), stream));
    return;
  }
  const RouterConfig& c = s.router;
  const int E = c.num_experts, G = c.num_groups, H = s.shape.hidden;
  int64_t rows = a.logits.shape[0];
  rows = a.topk_idx.shape[0] < rows ? a.topk_idx.shape[0] : rows;
  rows = a.topk_weights.shape[0] < rows ? a.topk_weights.shape[0] : rows;
  rows = x.shape[0] < rows ? x.shape[0] : rows;
  const int gemm_rows = on_device ? static_cast<int>(rows) : a.num_tokens;  // <= 32: checked

  GateRouterParams p{};
  p.x = static_cast<const uint16_t*>(x.data);
  p.w = static_cast<const uint16_t*>(w.data);
  p.logits = static_cast<float*>(a.logits.data);
  p.partial = s.partial;
  p.counter = s.counter;
  p.bias = static_cast<const float*>(a.bias.data);
  p.hidden = H;
  p.gemm_rows = gemm_rows;
  p.num_tokens = a.num_tokens;
  p.num_tokens_device = a.num_tokens_device;
  p.num_tokens_out = a.num_tokens_out;
  p.rows = static_cast<int>(rows);
  p.error = a.error;
  const bool use_groups = c.topk_groups < G;
  p.route = detail::WarpRoute{c.topk, c.topk_groups, use_groups ? 32 / G : 32, use_groups, c.routed_scaling,
                              static_cast<int32_t*>(a.topk_idx.data), static_cast<float*>(a.topk_weights.data)};
  const dim3 grid(static_cast<unsigned>(E / 16), static_cast<unsigned>(H / kGateRouterSlice));
  const int blocks = static_cast<int>(grid.x * grid.y);
  const int want = (gemm_rows + kWarps - 1) / kWarps;
  p.router_blocks = want < 1 ? 1 : (want > blocks ? blocks : want);
  const int V = E / 32;
  if (gemm_rows <= 8) launch_v<1>(p, V, grid, stream);
  else if (gemm_rows <= 16) launch_v<2>(p, V, grid, stream);
  else launch_v<4>(p, V, grid, stream);
  EPKIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace epkit::moe
