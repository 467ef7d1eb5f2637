// The gate projection through cuBLASLt. cuBLASLt is column-major: the row-major logits [m, E] are
// the column-major E x m matrix C = W_g x^T, with W_g [E, H] row-major read as the column-major
// H x E matrix A (op T) and x [m, H] as the column-major H x m matrix B (op N).
#include "epkit/moe/gate.hpp"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <unordered_map>

#include "epkit/error.hpp"
#include "common/cuda_check.hpp"

#define EPKIT_CUBLAS_CHECK(expr)                                                                           \
  do {                                                                                                     \
    const cublasStatus_t _s = (expr);                                                                      \
    if (_s != CUBLAS_STATUS_SUCCESS)                                                                       \
      throw ::epkit::Error(__FILE__, __LINE__,                                                             \
                           ::epkit::detail::concat(#expr, " failed: ", cublasLtGetStatusString(_s)));      \
  } while (0)

namespace epkit::moe {

namespace {
// cuBLAS's guidance for Hopper is 32 MiB for its widest split-K kernels; a gate GEMM (N = E <= 512)
// needs far less, and this buffer lives as long as the layer.
constexpr size_t kWorkspaceBytes = 8u << 20;
}  // namespace

struct GateProjection::Impl {
  GateShape shape;
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  void* workspace = nullptr;
  int layout_m = -1;  // the m that b and c describe now
  std::unordered_map<int, cublasLtMatmulAlgo_t> algos;

  ~Impl() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
    if (handle) cublasLtDestroy(handle);
    if (workspace) cudaFree(workspace);
  }

  void set_m(int m) {
    if (m == layout_m) return;
    const uint64_t cols = static_cast<uint64_t>(m);
    EPKIT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(b, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof(cols)));
    EPKIT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(c, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof(cols)));
    layout_m = m;
  }

  const cublasLtMatmulAlgo_t& algo(int m) {
    auto it = algos.find(m);
    if (it != algos.end()) return it->second;
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    EPKIT_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, op, a, b, c, c, pref, 1, &res, &found));
    EPKIT_CHECK(found > 0 && res.state == CUBLAS_STATUS_SUCCESS, "GateProjection: cuBLASLt has no algorithm for m = ",
                m, ", E = ", shape.num_experts, ", H = ", shape.hidden, " (bf16 x bf16 -> fp32)");
    return algos.emplace(m, res.algo).first->second;
  }
};

GateProjection::GateProjection(int hidden, int num_experts, int max_tokens) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.shape = GateShape{hidden, num_experts, max_tokens};
  validate(s.shape);
  const uint64_t H = static_cast<uint64_t>(hidden), E = static_cast<uint64_t>(num_experts);
  EPKIT_CUBLAS_CHECK(cublasLtCreate(&s.handle));
  EPKIT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&s.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  EPKIT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(s.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  EPKIT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(s.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  EPKIT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&s.a, CUDA_R_16BF, H, E, static_cast<int64_t>(H)));
  EPKIT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&s.b, CUDA_R_16BF, H, 1, static_cast<int64_t>(H)));
  EPKIT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&s.c, CUDA_R_32F, E, 1, static_cast<int64_t>(E)));
  s.layout_m = 1;
  EPKIT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&s.pref));
  const size_t ws = kWorkspaceBytes;
  EPKIT_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(s.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // check_gate_args guarantees 16-byte aligned pointers; without saying so cuBLASLt assumes 256.
  const uint32_t align = 16;
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    EPKIT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(s.pref, attr, &align, sizeof(align)));
  EPKIT_CUDA_CHECK(cudaMalloc(&s.workspace, kWorkspaceBytes));
}

GateProjection::~GateProjection() = default;

const GateShape& GateProjection::shape() const { return impl_->shape; }

size_t GateProjection::workspace_bytes() const { return kWorkspaceBytes; }

void GateProjection::run(const Tensor& x, const Tensor& w, const Tensor& logits, int m, cudaStream_t stream) {
  Impl& s = *impl_;
  check_gate_args(s.shape, x, w, logits, m);
  if (m == 0) return;
  s.set_m(m);
  const cublasLtMatmulAlgo_t& algo = s.algo(m);
  const float alpha = 1.0f, beta = 0.0f;
  EPKIT_CUBLAS_CHECK(cublasLtMatmul(s.handle, s.op, &alpha, w.data, s.a, x.data, s.b, &beta, logits.data, s.c,
                                    logits.data, s.c, &algo, s.workspace, kWorkspaceBytes, stream));
}

}  // namespace epkit::moe
