// Shared pieces of the MoE validation functions (host, epkit_core): one tensor check and one
// token-count check, so that every call words its errors the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "epkit/types.hpp"

namespace epkit::moe::detail {

// Checks that `t` (named `name` in the message, prefixed by `call`) is present, has one of
// `dtypes`, `dims.size()` dims matching `dims` (-1 = any, checked >= 0) and a data pointer aligned
// to `align` bytes (0 = its element size). An empty tensor may have a null pointer. Returns dim 0.
int64_t check_tensor(const char* call, const Tensor& t, const char* name, std::initializer_list<DType> dtypes,
                     std::initializer_list<int64_t> dims, size_t align = 0);

// Whether an optional tensor was given at all (a pointer or a shape).
inline bool given(const Tensor& t) { return t.data != nullptr || t.ndim > 0; }

// Throws unless `t` is absent (null data and no shape).
void check_absent(const char* call, const Tensor& t, const char* name, const char* why);

// m given on the host (0 <= m <= rows) or on the device (num_tokens = -1), not both.
void check_token_count(const char* call, int num_tokens, const int32_t* num_tokens_device, int64_t rows);

}  // namespace epkit::moe::detail

namespace epkit::moe {
struct RouterConfig;
namespace detail {
// The configuration part of warp_router_applies (router.hpp): everything but the tensors.
bool warp_router_config_applies(const RouterConfig& cfg, const char** why);
}  // namespace detail
}  // namespace epkit::moe
