#include "tensor_arg.hpp"

#include "epkit/error.hpp"

namespace epkit::py {

Tensor to_tensor(const TensorArg& arg, const char* what, int device) {
  if (!arg) return Tensor{};
  const auto& [a, code] = *arg;
  EPKIT_CHECK(code >= static_cast<int>(DType::kBF16) && code <= static_cast<int>(DType::kUInt8), what,
              ": unknown epkit dtype code ", code);
  auto dtype = static_cast<DType>(code);
  EPKIT_CHECK(a.device_id() == device, what, " is on cuda:", a.device_id(), " but this process's NVSHMEM PE uses cuda:",
              device);
  EPKIT_CHECK(a.ndim() >= 1 && a.ndim() <= 4, what, " has ", a.ndim(), " dimensions; epkit takes 1 to 4");
  EPKIT_CHECK(a.itemsize() == dtype_size(dtype), what, " has ", a.itemsize(), "-byte elements but is passed as ",
              dtype_name(dtype));
  Tensor t;
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  t.dtype = dtype;
  t.ndim = static_cast<int>(a.ndim());
  // Row-major contiguity: the kernels index rows by shape alone. Size-1 dims carry any stride.
  const int64_t* strides = a.stride_ptr();
  int64_t expected = 1;
  for (int i = 0; i < t.ndim; ++i) t.shape[i] = static_cast<int64_t>(a.shape(i));
  for (int i = t.ndim - 1; i >= 0; --i) {
    EPKIT_CHECK(strides == nullptr || t.shape[i] == 1 || strides[i] == expected, what, " is not contiguous (shape ",
                t.shape_str(), ", stride ", strides[i], " in dim ", i, " where ", expected, " is needed)");
    expected *= t.shape[i];
  }
  // Zero-element tensors may carry a null pointer; the C++ API treats null as "absent".
  EPKIT_CHECK(t.data != nullptr || t.numel() == 0, what, " has a null data pointer");
  return t;
}

const int32_t* device_int32(const TensorArg& arg, const char* what, int device) {
  Tensor t = to_tensor(arg, what, device);
  if (!t.defined()) return nullptr;
  EPKIT_CHECK(t.numel() == 1, what, " must hold exactly one element, got shape ", t.shape_str());
  EPKIT_CHECK(dtype_size(t.dtype) == 4, what, " must be a 4-byte integer (uint32 or int32), got ", dtype_name(t.dtype));
  return static_cast<const int32_t*>(t.data);
}

}  // namespace epkit::py
