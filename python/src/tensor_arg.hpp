// Turns a DLPack CUDA array plus the epkit dtype the Python layer names into an epkit::Tensor.
// The dtype travels separately because DLPack producers disagree on fp8 and unsigned codes: the
// Python layer passes fp8 as a uint8 view and uint32 as an int32 view, and says what they really are.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/tuple.h>

#include <optional>
#include <tuple>

#include "epkit/types.hpp"

namespace epkit::py {

using CudaArray = nanobind::ndarray<nanobind::device::cuda>;
// (array, epkit::DType as int), or None for an absent optional tensor.
using TensorArg = std::optional<std::tuple<CudaArray, int>>;

// Checks device, contiguity and element size, naming `what` in any error. An absent argument gives
// an undefined Tensor (data == nullptr).
Tensor to_tensor(const TensorArg& arg, const char* what, int device);

// A one-element device count (num_tokens_device, bound_m): its bits are read as int32 by the
// kernels, so any 4-byte integer type is taken. nullptr for an absent argument.
const int32_t* device_int32(const TensorArg& arg, const char* what, int device);

}  // namespace epkit::py
