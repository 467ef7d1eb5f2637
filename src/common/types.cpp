#include "epkit/types.hpp"

#include "epkit/error.hpp"

namespace epkit {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kBF16: case DType::kFP16: return 2;
    case DType::kFP32: case DType::kInt32: case DType::kUInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kFP8E4M3: case DType::kUInt8: return 1;
  }
  EPKIT_FAIL("unknown dtype code ", static_cast<int>(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kBF16: return "bf16";
    case DType::kFP16: return "fp16";
    case DType::kFP32: return "fp32";
    case DType::kFP8E4M3: return "fp8_e4m3";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt32: return "uint32";
    case DType::kUInt8: return "uint8";
  }
  return "unknown";
}

DType parse_dtype(std::string_view n) {
  if (n == "bf16" || n == "bfloat16") return DType::kBF16;
  if (n == "fp16" || n == "float16" || n == "half") return DType::kFP16;
  if (n == "fp32" || n == "float32" || n == "float") return DType::kFP32;
  if (n == "fp8" || n == "fp8_e4m3" || n == "float8_e4m3fn" || n == "e4m3") return DType::kFP8E4M3;
  if (n == "int32") return DType::kInt32;
  if (n == "int64") return DType::kInt64;
  if (n == "uint32") return DType::kUInt32;
  if (n == "uint8") return DType::kUInt8;
  EPKIT_FAIL("unknown dtype '", n, "' (expected bf16, fp16, fp32, fp8_e4m3, int32, int64, uint32 or uint8)");
}

const char* layout_name(ExpertLayout l) {
  switch (l) {
    case ExpertLayout::kMasked: return "masked";
    case ExpertLayout::kPacked: return "packed";
  }
  return "unknown";
}

std::string Tensor::shape_str() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace epkit
