#include "moe/args_check.hpp"

#include <string>

#include "epkit/error.hpp"

namespace epkit::moe::detail {

int64_t check_tensor(const char* call, const Tensor& t, const char* name, std::initializer_list<DType> dtypes,
                     std::initializer_list<int64_t> dims, size_t align) {
  const bool empty = t.ndim > 0 && t.numel() == 0;
  EPKIT_CHECK(t.data != nullptr || empty, call, ": ", name, " is missing (null data pointer)");
  bool ok = false;
  for (DType d : dtypes) ok |= t.dtype == d;
  if (!ok) {
    std::string allowed;
    for (DType d : dtypes) allowed += (allowed.empty() ? "" : " or ") + std::string(dtype_name(d));
    EPKIT_FAIL(call, ": ", name, " has dtype ", dtype_name(t.dtype), ", expected ", allowed);
  }
  EPKIT_CHECK(t.ndim == static_cast<int>(dims.size()), call, ": ", name, " has shape ", t.shape_str(), " (",
              t.ndim, " dims), expected ", dims.size(), " dims");
  int i = 0;
  for (int64_t d : dims) {
    EPKIT_CHECK(t.shape[i] >= 0, call, ": ", name, " has shape ", t.shape_str(), ": dim ", i, " is negative");
    EPKIT_CHECK(d < 0 || t.shape[i] == d, call, ": ", name, " has shape ", t.shape_str(), ": dim ", i, " is ",
                t.shape[i], ", expected ", d);
    ++i;
  }
  if (align == 0) align = dtype_size(t.dtype);
  EPKIT_CHECK(empty || reinterpret_cast<uintptr_t>(t.data) % align == 0, call, ": ", name,
              " data pointer is not ", align, "-byte aligned");
  return t.ndim > 0 ? t.shape[0] : 0;
}

void check_absent(const char* call, const Tensor& t, const char* name, const char* why) {
  EPKIT_CHECK(t.data == nullptr && t.ndim == 0, call, ": ", name, " given (shape ", t.shape_str(), ") but ", why);
}

void check_token_count(const char* call, int num_tokens, const int32_t* num_tokens_device, int64_t rows) {
  if (num_tokens_device != nullptr) {
    EPKIT_CHECK(num_tokens < 0, call, ": give m either on the host (num_tokens = ", num_tokens,
                ") or on the device (num_tokens_device), not both");
    return;
  }
  EPKIT_CHECK(num_tokens >= 0, call, ": num_tokens = ", num_tokens, " must be >= 0 (or pass num_tokens_device)");
  EPKIT_CHECK(num_tokens <= rows, call, ": num_tokens = ", num_tokens, " exceeds the tensors' rows = ", rows);
}

}  // namespace epkit::moe::detail
