// Element types and a minimal non-owning tensor view used at the API boundary.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace epkit {

enum class DType : int32_t { kBF16 = 0, kFP16 = 1, kFP32 = 2, kFP8E4M3 = 3, kInt32 = 4, kInt64 = 5, kUInt32 = 6, kUInt8 = 7 };

// Bytes per element.
size_t dtype_size(DType t);
// Lower-case name ("bf16", "fp8_e4m3", ...).
const char* dtype_name(DType t);
// Inverse of dtype_name; also accepts "fp8". Throws epkit::Error on an unknown name.
DType parse_dtype(std::string_view name);

// How the rows of each local expert lie in expert-major tensors (dispatch's expert_x, combine's
// expert_y, the grouped GEMM's operands). Counts and offsets live on the device.
enum class ExpertLayout : int32_t {
  kMasked = 0,  // [L, capacity, ...]: expert e's rows are e * capacity + [0, count[e])
  kPacked = 1,  // [R, ...]: expert e's rows are offset[e] + [0, count[e]), offsets [L + 1] aligned to a row multiple
};
const char* layout_name(ExpertLayout l);  // "masked" / "packed"

// Elements per FP8 block scale (one fp32 scale per kScaleBlock elements of hidden).
constexpr int kScaleBlock = 128;
// Largest topk the kernels support.
constexpr int kMaxTopK = 16;

// A non-owning view of a contiguous row-major device tensor. Kernels never see it: the host layer
// checks it against the config and passes raw pointers down.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kUInt8;
  int ndim = 0;
  int64_t shape[4] = {0, 0, 0, 0};

  Tensor() = default;
  Tensor(void* d, DType t, std::initializer_list<int64_t> dims) : data(d), dtype(t) {
    for (int64_t s : dims) shape[ndim++] = s;
  }
  bool defined() const { return data != nullptr; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  std::string shape_str() const;
};

}  // namespace epkit
