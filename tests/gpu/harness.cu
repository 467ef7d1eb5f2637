#include "harness.hpp"

#include "comm/local/mapping.hpp"  // kLocalLargeTokens

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace epkit::test {

namespace {
Communicator* g_comm = nullptr;

void cuda_or_throw(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(e));
}

float decode(DType t, const uint8_t* p) {
  switch (t) {
    case DType::kBF16: { __nv_bfloat16 v; std::memcpy(&v, p, 2); return __bfloat162float(v); }
    case DType::kFP16: { __half v; std::memcpy(&v, p, 2); return __half2float(v); }
    case DType::kFP8E4M3: { __nv_fp8_e4m3 v; std::memcpy(&v, p, 1); return static_cast<float>(v); }
    case DType::kFP32: { float v; std::memcpy(&v, p, 4); return v; }
    default: throw Error("decode: unsupported dtype");
  }
}

float round_to(DType t, float v) {
  switch (t) {
    case DType::kBF16: return __bfloat162float(__float2bfloat16_rn(v));
    case DType::kFP16: return __half2float(__float2half_rn(v));
    default: return v;
  }
}

void encode(DType t, float v, uint8_t* p) {
  switch (t) {
    case DType::kBF16: { __nv_bfloat16 h = __float2bfloat16_rn(v); std::memcpy(p, &h, 2); break; }
    case DType::kFP16: { __half h = __float2half_rn(v); std::memcpy(p, &h, 2); break; }
    case DType::kFP8E4M3: { __nv_fp8_e4m3 h(v); std::memcpy(p, &h, 1); break; }
    default: throw Error("encode: unsupported dtype");
  }
}

// Fast host codecs, bit-identical to the cuda_fp16 / cuda_bf16 / cuda_fp8 host conversions above
// for the values the suite makes (finite, |v| < 448). The host reference of a large call converts
// tens of millions of elements, and those conversions (4-25 ns each, on the CPU machine) were most
// of the GPU suite's time in its largest cases. Checked against the library conversions by
// check_fast_codecs, once per test process (gpu_test_main).
uint32_t float_bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}
float bits_float(uint32_t u) {
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}
// Round to nearest even at bit 16 (finite v).
uint16_t bf16_bits_rn(float v) {
  const uint32_t u = float_bits(v);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
float bf16_round(float v) { return bits_float(static_cast<uint32_t>(bf16_bits_rn(v)) << 16); }
// e4m3 (bias 7, 3 mantissa bits): |v| >= 2^-6 (the smallest normal) rounds in the float's bits;
// smaller ones (subnormals) go through the library.
uint8_t fp8_e4m3_bits(float v) {
  const uint32_t u = float_bits(v), mag = u & 0x7FFFFFFFu;
  if (mag >= (121u << 23) && mag < (135u << 23)) {  // 2^-6 <= |v| < 256: a normal e4m3 or 448
    const uint32_t r = (mag + 0x7FFFFu + ((mag >> 20) & 1u)) >> 20;  // exponent and 3 mantissa bits, rounded
    const uint32_t code = r - (120u << 3);
    return static_cast<uint8_t>(((u >> 24) & 0x80u) | code);
  }
  __nv_fp8_e4m3 h(v);
  uint8_t b;
  std::memcpy(&b, &h, 1);
  return b;
}
const float* fp8_table() {
  static const std::vector<float> t = [] {
    std::vector<float> v(256);
    for (int i = 0; i < 256; ++i) {
      const uint8_t b = static_cast<uint8_t>(i);
      v[i] = decode(DType::kFP8E4M3, &b);
    }
    return v;
  }();
  return t.data();
}
const float* fp16_table() {
  static const std::vector<float> t = [] {
    std::vector<float> v(65536);
    for (int i = 0; i < 65536; ++i) {
      const uint16_t b = static_cast<uint16_t>(i);
      v[i] = decode(DType::kFP16, reinterpret_cast<const uint8_t*>(&b));
    }
    return v;
  }();
  return t.data();
}
// Element i of a row of dtype t (the row's bytes at p).
float fast_decode(DType t, const uint8_t* p, size_t i) {
  switch (t) {
    case DType::kFP8E4M3: return fp8_table()[p[i]];
    case DType::kBF16: {
      uint16_t b;
      std::memcpy(&b, p + 2 * i, 2);
      return bits_float(static_cast<uint32_t>(b) << 16);
    }
    case DType::kFP16: {
      uint16_t b;
      std::memcpy(&b, p + 2 * i, 2);
      return fp16_table()[b];
    }
    default: return decode(t, p + i * dtype_size(t));
  }
}
float fast_round_to(DType t, float v) { return t == DType::kBF16 ? bf16_round(v) : round_to(t, v); }
void fast_encode(DType t, float v, uint8_t* p) {
  switch (t) {
    case DType::kFP8E4M3: *p = fp8_e4m3_bits(v); break;
    case DType::kBF16: { const uint16_t b = bf16_bits_rn(v); std::memcpy(p, &b, 2); break; }
    default: encode(t, v, p);
  }
}
}  // namespace

void check_fast_codecs() {
  std::mt19937_64 rng(0x5eed);
  std::uniform_real_distribution<float> wide(-300.f, 300.f), narrow(-2.5f, 2.5f);
  std::uniform_int_distribution<uint32_t> bits(0, 0xFFFFFFFFu);
  for (int i = 0; i < 1000000; ++i) {
    float v = i % 3 == 0 ? wide(rng) : i % 3 == 1 ? narrow(rng) : bits_float(bits(rng));
    if (!std::isfinite(v) || std::abs(v) >= 448.f) v = narrow(rng);
    uint8_t a8, b8[2];
    encode(DType::kFP8E4M3, v, &a8);
    fast_encode(DType::kFP8E4M3, v, b8);
    if (a8 != b8[0]) throw Error("harness: fast e4m3 encode of " + std::to_string(v) + " differs");
    uint8_t a16[2], b16[2];
    encode(DType::kBF16, v, a16);
    fast_encode(DType::kBF16, v, b16);
    if (std::memcmp(a16, b16, 2) != 0) throw Error("harness: fast bf16 encode of " + std::to_string(v) + " differs");
    if (float_bits(round_to(DType::kBF16, v)) != float_bits(fast_round_to(DType::kBF16, v)))
      throw Error("harness: fast bf16 rounding of " + std::to_string(v) + " differs");
    const uint8_t byte = static_cast<uint8_t>(i);
    const uint16_t half = static_cast<uint16_t>(bits(rng));
    const float d8 = decode(DType::kFP8E4M3, &byte), f8 = fast_decode(DType::kFP8E4M3, &byte, 0);
    const float d16 = decode(DType::kFP16, reinterpret_cast<const uint8_t*>(&half));
    const float f16 = fast_decode(DType::kFP16, reinterpret_cast<const uint8_t*>(&half), 0);
    if (float_bits(d8) != float_bits(f8) && !(std::isnan(d8) && std::isnan(f8)))
      throw Error("harness: fast e4m3 decode differs");
    if (float_bits(d16) != float_bits(f16) && !(std::isnan(d16) && std::isnan(f16)))
      throw Error("harness: fast fp16 decode differs");
  }
}

bool g_single = false;

int TestWorld::rank() const { return g_single ? 0 : g_comm->rank(); }
int TestWorld::world_size() const { return g_single ? 1 : g_comm->world_size(); }
void TestWorld::barrier() const {
  if (!g_single) g_comm->barrier();
}
void TestWorld::allgather(const void* data, size_t n, void* out) const {
  if (g_single) {
    std::memcpy(out, data, n);
  } else {
    g_comm->allgather(data, n, out);
  }
}
bool TestWorld::single_process() const { return g_single; }
const TestWorld& comm() {
  static const TestWorld w;
  return w;
}

std::unique_ptr<AllToAll> make_all_to_all(const AllToAllConfig& cfg) {
  return g_single ? std::make_unique<AllToAll>(cfg) : std::make_unique<AllToAll>(*g_comm, cfg);
}
const Communicator* communicator() { return g_single ? nullptr : g_comm; }

int gpu_test_main(int argc, char** argv, void (*parse)(int argc, char** argv)) {
  ::testing::InitGoogleTest(&argc, argv);
  if (parse) parse(argc, argv);
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("skipped: no GPU\n");
    return 77;
  }
  // The tests draw their inputs from the launch's seed: without epkit-run each test that draws one
  // fails on its own (14 of test_moe_layer's 16, say, each with the same exception), which reads like
  // 14 findings. One clear line instead.
  if (const char* s = std::getenv("EPKIT_RUN_SEED"); s == nullptr || *s == '\0') {
    std::fprintf(stderr, "%s: EPKIT_RUN_SEED is not set: run GPU tests through epkit-run (e.g. build/bin/epkit-run "
                 "-n 1 -- %s; under a sanitizer: epkit-run -n 1 -- compute-sanitizer ... %s)\n", argv[0], argv[0], argv[0]);
    return 2;
  }
  try {
    check_fast_codecs();  // before any input or reference uses them
    if (const char* e = std::getenv("EPKIT_TEST_SINGLE_PROCESS"); e && std::strcmp(e, "1") == 0) {
      g_single = true;  // world size 1 without a Communicator: nothing initialises NVSHMEM
      return RUN_ALL_TESTS();
    }
    Communicator c = Communicator::from_env();
    g_comm = &c;
    const int rc = RUN_ALL_TESTS();
    c.barrier();
    g_comm = nullptr;
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fatal: %s\n", e.what());
    return 1;
  }
}

uint64_t case_seed(uint64_t case_id) {
  static const uint64_t base = [] {
    const char* s = std::getenv("EPKIT_RUN_SEED");
    if (!s) throw Error("EPKIT_RUN_SEED is not set: run GPU tests through epkit-run");
    return std::strtoull(s, nullptr, 10);
  }();
  uint64_t z = base + 0x9e3779b97f4a7c15ull * (case_id + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

bool all_ranks(bool ok) {
  std::vector<int32_t> all(comm().world_size());
  int32_t mine = ok ? 1 : 0;
  comm().allgather(&mine, sizeof(mine), all.data());
  return std::all_of(all.begin(), all.end(), [](int32_t v) { return v == 1; });
}

DeviceBuffer::DeviceBuffer(size_t n) : bytes(n) {
  if (n) cuda_or_throw(cudaMalloc(&ptr, n), "cudaMalloc");
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr) cudaFree(ptr);
    ptr = o.ptr, bytes = o.bytes;
    o.ptr = nullptr, o.bytes = 0;
  }
  return *this;
}
DeviceBuffer::~DeviceBuffer() {
  if (ptr) cudaFree(ptr);
}

const char* routing_name(Routing r) {
  switch (r) {
    case Routing::kUniform: return "uniform";
    case Routing::kOneExpert: return "one_expert";
    case Routing::kOneRank: return "one_rank";
    case Routing::kMasked: return "masked";
  }
  return "?";
}

std::vector<GroupInputs> make_inputs(const AllToAllConfig& cfg, Routing routing, int m, uint64_t seed) {
  const int G = num_dp_groups(cfg), M = cfg.max_tokens_per_rank, H = cfg.hidden, K = cfg.topk;
  const int E = cfg.num_experts, L = num_local_experts(cfg), ns = scales_per_token(cfg);
  const size_t es = dtype_size(cfg.dispatch_dtype);
  std::mt19937_64 shared(seed);
  const int hot_expert = static_cast<int>(shared() % E);
  const int hot_rank = static_cast<int>(shared() % cfg.world_size);
  std::vector<GroupInputs> out(G);
  for (int g = 0; g < G; ++g) {
    std::mt19937_64 rng(seed ^ (0x1234567ull * (g + 1)));
    std::uniform_real_distribution<float> val(-2.f, 2.f), sc(0.5f, 2.f), wt(0.05f, 1.f), unit(0.f, 1.f);
    GroupInputs& in = out[g];
    in.m = m;
    in.x.resize(static_cast<size_t>(M) * H * es);
    for (size_t i = 0; i < static_cast<size_t>(M) * H; ++i) fast_encode(cfg.dispatch_dtype, val(rng), &in.x[i * es]);
    in.x_scale.resize(static_cast<size_t>(M) * ns);
    for (float& s : in.x_scale) s = sc(rng);
    in.weights.resize(static_cast<size_t>(M) * K);
    for (float& w : in.weights) w = wt(rng);
    in.topk_idx.assign(static_cast<size_t>(M) * K, -1);
    for (int t = 0; t < M; ++t) {
      int32_t* row = &in.topk_idx[static_cast<size_t>(t) * K];
      auto distinct = [&](int lo, int n) {  // K distinct experts from [lo, lo + n), repeats once n < K
        std::vector<int> pool(n);
        for (int i = 0; i < n; ++i) pool[i] = lo + i;
        std::shuffle(pool.begin(), pool.end(), rng);
        for (int k = 0; k < K; ++k) row[k] = pool[k % n];
      };
      switch (routing) {
        case Routing::kUniform: distinct(0, E); break;
        case Routing::kMasked:
          distinct(0, E);
          for (int k = 0; k < K; ++k)
            if (unit(rng) < 0.3f || t % 5 == 3) row[k] = -1;  // every 5th token fully masked
          break;
        case Routing::kOneExpert: {
          distinct(0, E);
          bool has = false;
          for (int k = 0; k < K; ++k) has |= row[k] == hot_expert;
          if (!has) row[rng() % K] = hot_expert;
          break;
        }
        case Routing::kOneRank: distinct(hot_rank * L, L); break;
      }
    }
  }
  return out;
}

float expert_scale(int e) { return 1.0f + 0.125f * static_cast<float>(e % 7); }
float expert_bias(int e) { return 0.01f * static_cast<float>(e % 5); }

void host_expert_output(const AllToAllConfig& cfg, const GroupInputs& in, int t, int e, float* y) {
  const size_t es = dtype_size(cfg.dispatch_dtype);
  const int H = cfg.hidden, ns = scales_per_token(cfg);
  const uint8_t* row = &in.x[static_cast<size_t>(t) * H * es];
  const float* sc = ns ? &in.x_scale[static_cast<size_t>(t) * ns] : nullptr;
  const float c = expert_scale(e), d = expert_bias(e);
  for (int h = 0; h < H; ++h) {
    float x = fast_decode(cfg.dispatch_dtype, row, h);
    if (ns) x = x * sc[h / kScaleBlock];
    y[h] = fast_round_to(cfg.combine_in_dtype, x * c + d);
  }
}

void RankBuffers::allocate(const AllToAllConfig& cfg, DType idx) {
  const size_t M = cfg.max_tokens_per_rank, H = cfg.hidden, K = cfg.topk;
  const size_t L = num_local_experts(cfg), rows = expert_rows(cfg), ns = scales_per_token(cfg);
  idx_dtype = idx;
  x = DeviceBuffer(M * H * dtype_size(cfg.dispatch_dtype));
  x_scale = DeviceBuffer(M * ns * 4);
  topk_idx = DeviceBuffer((M * K + kMaxIdxOffset) * dtype_size(idx));
  weights = DeviceBuffer(M * K * 4);
  expert_x = DeviceBuffer(rows * H * dtype_size(cfg.dispatch_dtype));
  expert_x_scale = DeviceBuffer(rows * ns * 4);
  expert_num_tokens = DeviceBuffer(L * 4);
  expert_offsets = DeviceBuffer(cfg.layout == ExpertLayout::kPacked ? (L + 1) * 4 : 0);
  expert_y = DeviceBuffer(rows * H * dtype_size(cfg.combine_in_dtype));
  out = DeviceBuffer(M * H * dtype_size(cfg.combine_out_dtype));
  m_dev = DeviceBuffer(4);
}

void RankBuffers::upload(const AllToAllConfig& cfg, const GroupInputs& in, cudaStream_t st) {
  const size_t M = cfg.max_tokens_per_rank, K = cfg.topk;
  cuda_or_throw(cudaMemcpyAsync(x.ptr, in.x.data(), x.bytes, cudaMemcpyHostToDevice, st), "upload x");
  if (x_scale.bytes)
    cuda_or_throw(cudaMemcpyAsync(x_scale.ptr, in.x_scale.data(), x_scale.bytes, cudaMemcpyHostToDevice, st), "scale");
  EPKIT_CHECK(idx_offset >= 0 && idx_offset <= kMaxIdxOffset, "idx_offset ", idx_offset, " is not in [0, ", kMaxIdxOffset,
              "]");
  std::vector<uint8_t> idx(M * K * dtype_size(idx_dtype));
  for (size_t i = 0; i < M * K; ++i) {
    const int32_t v = in.topk_idx[i];
    if (idx_dtype == DType::kInt64) {
      const int64_t w = v;
      std::memcpy(&idx[i * 8], &w, 8);
    } else {
      std::memcpy(&idx[i * 4], &v, 4);  // uint32: -1 becomes 0xffffffff, the pplx "no expert"
    }
  }
  // Host-side staging must outlive the async copy: copy synchronously with respect to the stream.
  cuda_or_throw(cudaMemcpyAsync(idx_ptr(), idx.data(), idx.size(), cudaMemcpyHostToDevice, st), "idx");
  cuda_or_throw(cudaMemcpyAsync(weights.ptr, in.weights.data(), weights.bytes, cudaMemcpyHostToDevice, st), "w");
  const int32_t m = in.m;
  cuda_or_throw(cudaMemcpyAsync(m_dev.ptr, &m, 4, cudaMemcpyHostToDevice, st), "m");
  cuda_or_throw(cudaMemsetAsync(expert_x.ptr, 0xA5, expert_x.bytes, st), "poison");
  if (expert_x_scale.bytes) cuda_or_throw(cudaMemsetAsync(expert_x_scale.ptr, 0xFF, expert_x_scale.bytes, st), "p");
  cuda_or_throw(cudaMemsetAsync(expert_num_tokens.ptr, 0xF9, expert_num_tokens.bytes, st), "poison");
  if (expert_offsets.bytes) cuda_or_throw(cudaMemsetAsync(expert_offsets.ptr, 0xF9, expert_offsets.bytes, st), "p");
  cuda_or_throw(cudaMemsetAsync(expert_y.ptr, 0xFF, expert_y.bytes, st), "poison");
  cuda_or_throw(cudaMemsetAsync(out.ptr, 0xFF, out.bytes, st), "poison");
  cuda_or_throw(cudaStreamSynchronize(st), "upload sync");
}

namespace {
// The expert-major tensor view of `buf` in the config's layout, with trailing dim `inner`.
Tensor expert_view(const AllToAllConfig& cfg, void* buf, DType t, int64_t inner) {
  if (cfg.layout == ExpertLayout::kPacked) return Tensor(buf, t, {effective_packed_rows(cfg), inner});
  return Tensor(buf, t, {num_local_experts(cfg), effective_capacity(cfg), inner});
}
}  // namespace

DispatchArgs RankBuffers::dispatch_args(const AllToAllConfig& cfg, int m, bool device_m) const {
  const int64_t M = cfg.max_tokens_per_rank, H = cfg.hidden, K = cfg.topk;
  const int64_t L = num_local_experts(cfg), ns = scales_per_token(cfg);
  DispatchArgs a;
  a.x = Tensor(x.ptr, cfg.dispatch_dtype, {M, H});
  if (ns) a.x_scale = Tensor(x_scale.ptr, DType::kFP32, {M, ns});
  a.topk_idx = Tensor(idx_ptr(), idx_dtype, {M, K});
  if (device_m) a.num_tokens_device = m_dev.as<int32_t>(); else a.num_tokens = m;
  a.expert_x = expert_view(cfg, expert_x.ptr, cfg.dispatch_dtype, H);
  if (ns)
    a.expert_x_scale = cfg.expert_scales_mn_major
                           ? Tensor(expert_x_scale.ptr, DType::kFP32, {L, ns, effective_capacity(cfg)})
                           : expert_view(cfg, expert_x_scale.ptr, DType::kFP32, ns);
  a.expert_num_tokens = Tensor(expert_num_tokens.ptr, DType::kInt32, {L});
  if (cfg.layout == ExpertLayout::kPacked) a.expert_offsets = Tensor(expert_offsets.ptr, DType::kInt32, {L + 1});
  if (cfg.weights_at_dispatch) a.topk_weights = Tensor(weights.ptr, DType::kFP32, {M, K});
  return a;
}

CombineArgs RankBuffers::combine_args(const AllToAllConfig& cfg, int m, bool device_m) const {
  const int64_t M = cfg.max_tokens_per_rank, H = cfg.hidden, K = cfg.topk;
  CombineArgs a;
  a.expert_y = expert_view(cfg, expert_y.ptr, cfg.combine_in_dtype, H);
  a.topk_idx = Tensor(idx_ptr(), idx_dtype, {M, K});
  if (!cfg.weights_at_dispatch) a.topk_weights = Tensor(weights.ptr, DType::kFP32, {M, K});
  if (device_m) a.num_tokens_device = m_dev.as<int32_t>(); else a.num_tokens = m;
  a.out = Tensor(out.ptr, cfg.combine_out_dtype, {M, H});
  return a;
}

namespace {
template <typename Tx>
__device__ float dev_decode(const Tx* p) { return static_cast<float>(*p); }
template <>
__device__ float dev_decode<__nv_bfloat16>(const __nv_bfloat16* p) { return __bfloat162float(*p); }
template <>
__device__ float dev_decode<__half>(const __half* p) { return __half2float(*p); }

template <typename Ty>
__device__ Ty dev_encode(float v);
template <>
__device__ __nv_bfloat16 dev_encode<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __half dev_encode<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ float dev_encode<float>(float v) { return v; }

// Element of expert_x_scale holding scale i of expert_x row `row`: row-major [rows, ns], or with
// mn_cap = capacity (expert_scales_mn_major, masked) each expert's [ns, cap] block.
__device__ __forceinline__ size_t scale_at(size_t row, int i, int ns, int mn_cap) {
  if (!mn_cap) return row * ns + i;
  const size_t e = row / mn_cap;
  return (e * ns + i) * mn_cap + (row - e * mn_cap);
}

// offsets: the packed layout's first rows (null: masked, el * cap). counts are the placed rows.
template <typename Tx, typename Ty>
__global__ void expert_kernel(const Tx* x, const float* scale, const int32_t* counts, const int32_t* offsets, Ty* y,
                              int rank, int L, int cap, int H, int ns, int mn_cap) {
  const int el = blockIdx.y;
  const int n = offsets ? counts[el] : min(counts[el], cap);
  const size_t first = offsets ? static_cast<size_t>(offsets[el]) : static_cast<size_t>(el) * cap;
  const int e = rank * L + el;
  const float c = 1.0f + 0.125f * static_cast<float>(e % 7), d = 0.01f * static_cast<float>(e % 5);
  for (int pos = blockIdx.x; pos < n; pos += gridDim.x) {
    const size_t row = first + pos;
    for (int h = threadIdx.x; h < H; h += blockDim.x) {
      float v = dev_decode(x + row * H + h);
      if (ns) v = __fmul_rn(v, scale[scale_at(row, h / 128, ns, mn_cap)]);
      y[row * H + h] = dev_encode<Ty>(__fadd_rn(__fmul_rn(v, c), d));
    }
  }
}

template <typename Tx>
void launch_expert_in(const AllToAllConfig& cfg, const RankBuffers& b, cudaStream_t st) {
  const int L = num_local_experts(cfg), cap = effective_capacity(cfg), H = cfg.hidden, ns = scales_per_token(cfg);
  const int mn_cap = cfg.expert_scales_mn_major ? cap : 0;
  dim3 grid(64, L);
  auto* x = b.expert_x.as<Tx>();
  auto* s = b.expert_x_scale.as<float>();
  auto* c = b.expert_num_tokens.as<int32_t>();
  auto* o = cfg.layout == ExpertLayout::kPacked ? b.expert_offsets.as<int32_t>() : nullptr;
  switch (cfg.combine_in_dtype) {
    case DType::kBF16: expert_kernel<<<grid, 256, 0, st>>>(x, s, c, o, b.expert_y.as<__nv_bfloat16>(), cfg.rank, L, cap, H, ns, mn_cap); break;
    case DType::kFP16: expert_kernel<<<grid, 256, 0, st>>>(x, s, c, o, b.expert_y.as<__half>(), cfg.rank, L, cap, H, ns, mn_cap); break;
    default: expert_kernel<<<grid, 256, 0, st>>>(x, s, c, o, b.expert_y.as<float>(), cfg.rank, L, cap, H, ns, mn_cap); break;
  }
}
}  // namespace

void launch_expert(const AllToAllConfig& cfg, const RankBuffers& b, cudaStream_t st) {
  switch (cfg.dispatch_dtype) {
    case DType::kBF16: launch_expert_in<__nv_bfloat16>(cfg, b, st); break;
    case DType::kFP16: launch_expert_in<__half>(cfg, b, st); break;
    default: launch_expert_in<__nv_fp8_e4m3>(cfg, b, st); break;
  }
  cuda_or_throw(cudaGetLastError(), "expert kernel launch");
}

namespace {
std::vector<ref::GroupRouting> routings(const AllToAllConfig& cfg, const std::vector<GroupInputs>& groups) {
  std::vector<ref::GroupRouting> r(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    r[g].num_tokens = groups[g].m;
    r[g].topk_idx = groups[g].topk_idx;
  }
  (void)cfg;
  return r;
}
template <typename T>
std::vector<T> download(const DeviceBuffer& b) {
  std::vector<T> h(b.bytes / sizeof(T));
  cuda_or_throw(cudaMemcpy(h.data(), b.ptr, b.bytes, cudaMemcpyDeviceToHost), "download");
  return h;
}
}  // namespace

// written[r] for each of `rows` rows of expert_x (pb bytes) and their ns scales: bit 0 when a payload
// byte is not the poison 0xA5, bit 1 when a scale is not the poison 0xFFFFFFFF.
__global__ void written_rows_kernel(const uint8_t* x, const uint32_t* sc, size_t pb, int ns, int mn_cap, size_t rows,
                                    uint8_t* written) {
  for (size_t row = blockIdx.x; row < rows; row += gridDim.x) {
    int bad = 0, bad_sc = 0;
    for (size_t i = threadIdx.x; i < pb; i += blockDim.x) bad |= x[row * pb + i] != 0xA5;
    for (int i = threadIdx.x; i < ns; i += blockDim.x) bad_sc |= sc[scale_at(row, i, ns, mn_cap)] != 0xFFFFFFFFu;
    bad = __syncthreads_or(bad);
    bad_sc = __syncthreads_or(bad_sc);
    if (threadIdx.x == 0) written[row] = static_cast<uint8_t>((bad ? 1 : 0) | (bad_sc ? 2 : 0));
  }
}
// Rows idx[0..n) of expert_x and its scales, one after the other.
__global__ void gather_rows_kernel(const uint8_t* x, const float* sc, size_t pb, int ns, int mn_cap, const int64_t* idx,
                                   int n, uint8_t* gx, float* gs) {
  for (int i = blockIdx.x; i < n; i += gridDim.x) {
    const size_t r = static_cast<size_t>(idx[i]);
    for (size_t j = threadIdx.x; j < pb; j += blockDim.x) gx[static_cast<size_t>(i) * pb + j] = x[r * pb + j];
    for (int j = threadIdx.x; j < ns; j += blockDim.x) gs[static_cast<size_t>(i) * ns + j] = sc[scale_at(r, j, ns, mn_cap)];
  }
}

std::string check_dispatch(const AllToAllConfig& cfg, const std::vector<GroupInputs>& groups, const RankBuffers& b) {
  const int L = num_local_experts(cfg), ns = scales_per_token(cfg);
  const int mn_cap = cfg.expert_scales_mn_major ? effective_capacity(cfg) : 0;
  const bool packed = cfg.layout == ExpertLayout::kPacked;
  const size_t pb = static_cast<size_t>(cfg.hidden) * dtype_size(cfg.dispatch_dtype);
  const size_t rows = static_cast<size_t>(expert_rows(cfg));
  const auto rt = routings(cfg, groups);
  const auto slots = ref::dispatch_slots(cfg, cfg.rank, rt);
  const ExpertPlacement place = ref::expert_placement(cfg, cfg.rank, rt);
  const auto counts = download<int32_t>(b.expert_num_tokens);
  const auto offsets = packed ? download<int32_t>(b.expert_offsets) : std::vector<int32_t>{};
  // Only the rows the reference places come back to the host (gathered on the GPU); every other row
  // is checked for its poison there (the whole of expert_x is hundreds of MB for V3 shapes, whose
  // download and scan were most of the time of the suite's large cases).
  std::vector<int64_t> placed;
  for (int el = 0; el < L; ++el)
    for (int pos = 0; pos < place.count[el]; ++pos) placed.push_back(place.first_row[el] + pos);
  std::vector<uint8_t> written(rows, 0), ex(placed.size() * pb);
  std::vector<float> es(placed.size() * ns);
  if (rows) {
    DeviceBuffer d_written(rows);
    written_rows_kernel<<<1024, 256>>>(b.expert_x.as<uint8_t>(), b.expert_x_scale.as<uint32_t>(), pb, ns, mn_cap, rows,
                                       d_written.as<uint8_t>());
    cuda_or_throw(cudaGetLastError(), "written_rows_kernel");
    cuda_or_throw(cudaMemcpy(written.data(), d_written.ptr, rows, cudaMemcpyDeviceToHost), "download written");
  }
  if (!placed.empty()) {
    DeviceBuffer d_idx(placed.size() * 8), d_x(ex.size()), d_s(es.size() * 4);
    cuda_or_throw(cudaMemcpy(d_idx.ptr, placed.data(), d_idx.bytes, cudaMemcpyHostToDevice), "upload rows");
    gather_rows_kernel<<<1024, 256>>>(b.expert_x.as<uint8_t>(), b.expert_x_scale.as<float>(), pb, ns, mn_cap,
                                      d_idx.as<int64_t>(), static_cast<int>(placed.size()), d_x.as<uint8_t>(),
                                      d_s.as<float>());
    cuda_or_throw(cudaGetLastError(), "gather_rows_kernel");
    cuda_or_throw(cudaMemcpy(ex.data(), d_x.ptr, ex.size(), cudaMemcpyDeviceToHost), "download rows");
    if (ns) cuda_or_throw(cudaMemcpy(es.data(), d_s.ptr, es.size() * 4, cudaMemcpyDeviceToHost), "download scales");
  }
  size_t next = 0;  // placed[next]: the next row the loop below reads, in the same order
  std::ostringstream err;
  for (int el = 0; packed && el <= L; ++el)
    if (offsets[el] != place.offsets[el]) {
      err << "expert_offsets[" << el << "] = " << offsets[el] << ", reference " << place.offsets[el];
      return err.str();
    }
  const char* local_env = std::getenv("EPKIT_LOCAL_KERNELS");
  const bool in_entry_order = cfg.world_size == 1 && cfg.max_tokens_per_rank < kernels::kLocalLargeTokens &&
                              !(local_env && std::string(local_env) == "0");
  std::vector<char> covered(rows, 0);
  for (int el = 0; el < L; ++el) {
    const int want = place.count[el];
    const int64_t first = place.first_row[el];
    if (counts[el] != want) {
      err << "expert " << cfg.rank * L + el << ": count " << counts[el] << ", reference " << want
          << (want < static_cast<int>(slots[el].size()) ? " (clamped to the room)" : "");
      return err.str();
    }
    const int total = static_cast<int>(slots[el].size());
    auto row_bytes = [&](const uint8_t* payload, const float* scale) {
      std::string s(reinterpret_cast<const char*>(payload), pb);
      if (ns) s.append(reinterpret_cast<const char*>(scale), ns * 4);
      return s;
    };
    std::vector<std::string> got, ref;
    for (int pos = 0; pos < want; ++pos) {
      const size_t row = static_cast<size_t>(first + pos);
      covered[row] = 1;
      got.push_back(row_bytes(&ex[next * pb], ns ? &es[next * ns] : nullptr));
      ++next;
    }
    for (const ref::Slot& sl : slots[el]) {
      const GroupInputs& in = groups[sl.group];
      ref.push_back(row_bytes(&in.x[static_cast<size_t>(sl.token) * pb],
                              ns ? &in.x_scale[static_cast<size_t>(sl.token) * ns] : nullptr));
    }
    // At world size 1 the small local dispatch ranks in entry order (local.cu): each expert's rows are
    // the reference's slots in (token, k) order, and a cut expert keeps its first ones.
    if (in_entry_order) {
      for (int pos = 0; pos < want; ++pos)
        if (got[pos] != ref[pos]) {
          const ref::Slot& sl = slots[el][pos];
          err << "expert " << el << ": row " << first + pos << " does not hold token " << sl.token << " (k = " << sl.k
              << "), its entry-order slot " << pos << " (world size 1, M < " << kernels::kLocalLargeTokens << ")";
          return err.str();
        }
      continue;
    }
    // One run per sender, in the order ref::dispatch_slots gives (own tokens first): each run must
    // hold exactly the reference's rows for that sender. Within a run the order is unspecified, so a
    // run cut by the end of the room holds some subset of its rows.
    for (int lo = 0; lo < total && lo < want;) {
      const int sender = dp_sender_rank(cfg, slots[el][lo].group, slots[el][lo].token);
      int hi = lo;
      while (hi < total && dp_sender_rank(cfg, slots[el][hi].group, slots[el][hi].token) == sender) ++hi;
      const int got_hi = std::min(hi, want);
      std::vector<std::string> g(got.begin() + lo, got.begin() + got_hi), r(ref.begin() + lo, ref.begin() + hi);
      std::sort(g.begin(), g.end());
      std::sort(r.begin(), r.end());
      const bool ok = got_hi == hi ? g == r : std::includes(r.begin(), r.end(), g.begin(), g.end());
      if (!ok) {
        std::vector<std::string> ga(got), ra(ref.begin(), ref.begin() + want);
        std::sort(ga.begin(), ga.end());
        std::sort(ra.begin(), ra.end());
        err << "expert " << cfg.rank * L + el << ": rows " << first + lo << ".." << first + got_hi - 1
            << " (the run from rank " << sender << (got_hi < hi ? ", cut by the room" : "") << ") do not hold "
            << (got_hi < hi ? "a subset of " : "") << "that rank's " << hi - lo << " rows"
            << (ga == ra ? ", though all rows are there: the runs are out of order"
                         : ": the (payload, scales) rows differ from the reference");
        return err.str();
      }
      lo = hi;
    }
  }
  for (size_t row = 0; row < rows; ++row) {  // nothing may be written outside the placed rows
    if (covered[row] || written[row] == 0) continue;
    if (written[row] & 1) {
      err << "expert_x row " << row << " is in no expert's placed rows but was written";
      if (!packed) err << " (expert " << cfg.rank * L + static_cast<int>(row) / effective_capacity(cfg) << ")";
    } else {
      err << "expert_x_scale row " << row << " is in no expert's placed rows but was written";
    }
    return err.str();
  }
  return "";
}

double combine_rel_tolerance(DType out) {
  const double half_ulp = out == DType::kBF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  return 1.01 * (2 * half_ulp + half_ulp * half_ulp + 16 * std::ldexp(1.0, -24));
}

std::string check_combine(const AllToAllConfig& cfg, const std::vector<GroupInputs>& groups, const RankBuffers& b) {
  const int g = cfg.rank / cfg.dp_size, H = cfg.hidden, M = cfg.max_tokens_per_rank;
  const GroupInputs& in = groups[g];
  const auto all = routings(cfg, groups);
  const auto& rt = all[g];
  // Entries dispatch dropped for lack of room contribute nothing; tokens with an entry that may or
  // may not have been dropped (or one expert listed twice among the dropped) are not checked.
  const ref::Drops drops = ref::dispatch_drops(cfg, all);
  const int K = cfg.topk;
  std::vector<char> skip(M, 0);
  std::vector<std::vector<int>> dropped_experts(M);
  for (const ref::Slot& s : drops.maybe_dropped)
    if (s.group == g) skip[s.token] = 1;
  for (const ref::Slot& s : drops.dropped)
    if (s.group == g) dropped_experts[s.token].push_back(in.topk_idx[static_cast<size_t>(s.token) * K + s.k]);
  for (int t = 0; t < M; ++t)
    for (int k = 0; k < K && !dropped_experts[t].empty(); ++k)
      for (int k2 = 0; k2 < k; ++k2)
        if (in.topk_idx[static_cast<size_t>(t) * K + k] == in.topk_idx[static_cast<size_t>(t) * K + k2]) skip[t] = 1;
  auto f = [&](int e, int t, float* y) {
    const auto& d = dropped_experts[t];
    if (std::find(d.begin(), d.end(), e) != d.end()) {
      std::fill(y, y + cfg.hidden, 0.f);
      return;
    }
    host_expert_output(cfg, in, t, e, y);
  };
  const ref::CombineSums sums = ref::combine_with_abs(cfg, rt, in.weights, f);
  const std::vector<float>& want = sums.sum;
  const std::vector<float>& mag = sums.abs;
  const auto raw = download<uint8_t>(b.out);
  const size_t os = dtype_size(cfg.combine_out_dtype);
  const double tol = combine_rel_tolerance(cfg.combine_out_dtype);
  std::ostringstream err;
  for (int t = 0; t < M; ++t)
    for (int h = 0; h < H; ++h) {
      const uint8_t* p = &raw[(static_cast<size_t>(t) * H + h) * os];
      if (t >= in.m) {  // rows past m stay poisoned
        if (p[0] != 0xFF || p[1] != 0xFF) {
          err << "out row " << t << " >= m = " << in.m << " was written";
          return err.str();
        }
        continue;
      }
      if (skip[t]) continue;
      const float got = fast_decode(cfg.combine_out_dtype, p, 0);
      const double w = want[static_cast<size_t>(t) * H + h], a = mag[static_cast<size_t>(t) * H + h];
      if (!(std::abs(got - w) <= tol * a + 1e-7)) {
        err << "out[" << t << "][" << h << "] = " << got << ", reference " << w << " (|w*y| sum " << a
            << ", tolerance " << tol * a + 1e-7 << ")";
        return err.str();
      }
    }
  return "";
}

}  // namespace epkit::test
