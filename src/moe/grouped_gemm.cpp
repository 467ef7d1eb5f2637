// GroupedGemm: validation, then the compiled instantiation chosen by config (the one runtime ->
// template dispatch, over gemm_configs.def).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "epkit/error.hpp"
#include "epkit/moe/grouped_gemm.hpp"
#include "moe/gemm/gemm_impl.hpp"

namespace epkit::moe {

namespace detail {

void gemm_cuda_check(cudaError_t e, const char* what, const GemmConfig& cfg) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    EPKIT_FAIL("grouped GEMM ", to_string(cfg), ": ", what, " failed: ", cudaGetErrorString(e));
  }
}

GemmDevice current_gemm_device(const GemmConfig& cfg) {
  GemmDevice d;
  int major = 0;
  gemm_cuda_check(cudaGetDevice(&d.device), "cudaGetDevice", cfg);
  gemm_cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d.device), "cudaDeviceGetAttribute",
                  cfg);
  gemm_cuda_check(cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, d.device),
                  "cudaDeviceGetAttribute", cfg);
  gemm_cuda_check(cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, d.device),
                  "cudaDeviceGetAttribute", cfg);
  EPKIT_CHECK(major == 9, "grouped GEMM: device ", d.device, " has compute capability ", major,
              ".x; the kernels are built for sm_90a (Hopper) only");
  return d;
}

}  // namespace detail

namespace {

std::unique_ptr<detail::GemmImpl> make_impl(const GroupedGemmShape& shape, const GemmConfig& cfg) {
  validate(shape);
#define EPKIT_GEMM_CONFIG(id, swap, sched, tm, tn, cm, cn)                         \
  if (cfg == GemmConfig{tm, tn, 128, swap, GemmSchedule::sched, cm, cn}) {         \
    return detail::make_gemm_##id(shape);                                          \
  }
#define EPKIT_GEMM_OWN_CONFIG EPKIT_GEMM_CONFIG
#include "moe/gemm/gemm_configs.def"
  std::string names;
  for (const GemmConfig& c : available_gemm_configs()) names += (names.empty() ? "" : ", ") + to_string(c);
  EPKIT_FAIL("grouped GEMM: config ", to_string(cfg), " is not compiled in (compiled: ", names, ")");
}

}  // namespace

GroupedGemm::GroupedGemm(const GroupedGemmShape& shape) : GroupedGemm(shape, choose_gemm_config(shape)) {}

// EPKIT_MOE_LOG=1 prints each object's shape and config (which instantiation a layer really runs).
GroupedGemm::GroupedGemm(const GroupedGemmShape& shape, const GemmConfig& cfg) : impl_(make_impl(shape, cfg)) {
  if (const char* e = std::getenv("EPKIT_MOE_LOG"); e && *e && *e != '0') {
    std::fprintf(stderr, "[epkit] grouped GEMM G=%d n=%d k=%d %s rows=%d expected_m=%d -> %s (%s), workspace %zu B\n",
                 shape.num_groups, shape.n, shape.k, layout_name(shape.layout), shape.rows, shape.expected_m,
                 to_string(cfg).c_str(), cfg == choose_gemm_config(shape) ? "heuristic" : "forced",
                 impl_->workspace_bytes());
  }
}

GroupedGemm::~GroupedGemm() = default;
GroupedGemm::GroupedGemm(GroupedGemm&&) noexcept = default;
GroupedGemm& GroupedGemm::operator=(GroupedGemm&&) noexcept = default;

void GroupedGemm::run(const GroupedGemmArgs& args, cudaStream_t stream) {
  EPKIT_CHECK(impl_ != nullptr, "grouped GEMM: run() on a moved-from GroupedGemm");
  check_grouped_gemm_args(impl_->shape(), args);
  int dev = -1;
  const cudaError_t e = cudaGetDevice(&dev);
  EPKIT_CHECK(e == cudaSuccess, "grouped GEMM: cudaGetDevice failed: ", cudaGetErrorString(e));
  EPKIT_CHECK(dev == impl_->device(), "grouped GEMM: run() on device ", dev, " but the object was built on device ",
              impl_->device());
  detail::GemmLaunch l;
  l.a = static_cast<const uint8_t*>(args.a.data);
  l.a_scale = static_cast<const float*>(args.a_scale.data);
  l.b = static_cast<const uint8_t*>(args.b.data);
  l.b_scale = static_cast<const float*>(args.b_scale.data);
  l.d = static_cast<uint16_t*>(args.d.data);
  l.counts = static_cast<const int32_t*>(args.expert_num_tokens.data);
  l.offsets = static_cast<const int32_t*>(args.expert_offsets.data);
  l.error = args.error;
  impl_->run(l, stream);
}

const GroupedGemmShape& GroupedGemm::shape() const { return impl_->shape(); }
const GemmConfig& GroupedGemm::config() const { return impl_->config(); }
size_t GroupedGemm::workspace_bytes() const { return impl_->workspace_bytes(); }

}  // namespace epkit::moe
