#include "device.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "epkit/error.hpp"

namespace epkit::bench {

void cuda_check(cudaError_t err, const char* what) {
  EPKIT_CHECK(err == cudaSuccess, what, " failed: ", cudaGetErrorString(err));
}

DeviceBuffer::DeviceBuffer(size_t bytes, const char* what) : bytes_(bytes) {
  if (bytes == 0) return;
  const cudaError_t err = cudaMalloc(&ptr_, bytes);
  if (err != cudaSuccess) {
    size_t free_b = 0, total_b = 0;
    cudaGetLastError();
    cudaMemGetInfo(&free_b, &total_b);
    EPKIT_FAIL("cudaMalloc of ", bytes, " bytes for ", what, " failed (", cudaGetErrorString(err), "; ", free_b,
               " of ", total_b, " bytes free)");
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

Stream::Stream() { cuda_check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "cudaStreamCreate"); }
Stream::~Stream() {
  if (s_) cudaStreamDestroy(s_);
}

void copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy host to device");
  // A pageable copy may return before its DMA lands, and the bench's stream does not wait on the
  // legacy stream: synchronise so kernels on any stream see the data.
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

void fill_random(void* dst, DType t, size_t count, uint64_t seed) {
  const size_t elem = dtype_size(t);
  const size_t total = count * elem;
  if (total == 0) return;
  // One seeded host pattern of up to 8 MiB, then doubled on the device: large buffers fill at device speed.
  const size_t chunk = std::min(total, size_t{8} << 20) / elem * elem;
  std::vector<uint8_t> host(chunk);
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (size_t i = 0; i < chunk; i += elem) {
    const uint64_t r = next();
    const float u = static_cast<float>(r >> 40) * 0x1.0p-24f;  // [0, 1)
    switch (t) {
      case DType::kFP8E4M3: host[i] = static_cast<uint8_t>(r & 0xb7); break;  // exponent <= 6: finite, <= 1
      case DType::kBF16: {
        const float v = 2.f * u - 1.f;
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        const uint16_t h = static_cast<uint16_t>(bits >> 16);
        std::memcpy(&host[i], &h, 2);
        break;
      }
      case DType::kFP16: {  // sign, exponent 0..14 (|v| < 1), mantissa
        const uint16_t h = static_cast<uint16_t>((r & 0x83ff) | (((r >> 16) % 15) << 10));
        std::memcpy(&host[i], &h, 2);
        break;
      }
      case DType::kFP32: {
        const float v = 0.5f + u;
        std::memcpy(&host[i], &v, 4);
        break;
      }
      default: std::memcpy(&host[i], &r, elem); break;
    }
  }
  auto* d = static_cast<uint8_t*>(dst);
  copy_to_device(d, host.data(), chunk);
  size_t done = chunk;
  while (done < total) {
    const size_t n = std::min(done, total - done);
    cuda_check(cudaMemcpy(d + done, d, n, cudaMemcpyDeviceToDevice), "cudaMemcpy device to device");
    done += n;
  }
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

}  // namespace epkit::bench
