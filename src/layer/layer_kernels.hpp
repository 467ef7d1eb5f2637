// The layer's own small kernels: the shared expert's sum into the combined output, and the
// device-side split of m between the two halves of kMicrobatch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "epkit/moe/errors.hpp"

namespace epkit::layer {

// out[t, :] = bf16(out[t, :] + y[t, :]) for t < min(*m, rows), bf16 [rows, hidden]; hidden % 8 == 0.
cudaError_t launch_add_rows(void* out, const void* y, const int32_t* m, int rows, int hidden, cudaStream_t s);

// m_half[0] = min(m, split), m_half[1] = max(0, m - split) with m = *m clamped to [0, rows] (the rows
// of x, whose first `split` rows are half 0's); an m outside that range is recorded in err.
cudaError_t launch_split_tokens(const int32_t* m, int split, int rows, int32_t* m_half, moe::DeviceErrorRecord* err,
                                cudaStream_t s);

}  // namespace epkit::layer
