// CUDA status → epkit::Error, for host code.
#pragma once

#include <cuda_runtime_api.h>

#include "epkit/error.hpp"

#define EPKIT_CUDA_CHECK(expr)                                                                       \
  do {                                                                                               \
    const cudaError_t _e = (expr);                                                                   \
    if (_e != cudaSuccess)                                                                           \
      throw ::epkit::Error(__FILE__, __LINE__, ::epkit::detail::concat(#expr, " failed: ", cudaGetErrorString(_e))); \
  } while (0)
