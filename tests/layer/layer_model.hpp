// The MoE layer tests' model and oracle, shared by test_moe_layer (the suite), soak_moe_layer (make
// soak) and test_fault --api layer: a synthetic model in the DeepSeek-V3 checkpoint layout, drawn on
// the host from a seed (all E experts, the same on every rank), this rank's weights on the device,
// and the check of one forward against the host reference ref::moe_layer.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "epkit/moe_layer.hpp"
#include "harness.hpp"
#include "reference/moe/reference.hpp"
#include "reference/moe/reference_layer.hpp"

namespace epkit::test {

// A MoELayer of the test's world: collective, or the single-process one (EPKIT_TEST_SINGLE_PROCESS).
std::unique_ptr<MoELayer> make_layer(const MoELayerConfig& cfg, const MoELayerWeights& w);

// All E experts (every rank generates the same from the shared seed and uploads its local ones).
struct Model {
  MoELayerConfig cfg;
  std::vector<std::vector<uint8_t>> w13, w2;
  std::vector<std::vector<float>> w13s, w2s;
  std::vector<uint8_t> sw13, sw2;
  std::vector<float> sw13s, sw2s;
  std::vector<uint16_t> gate;  // [E, H] bf16 bits
  std::vector<float> bias;     // [E]
  std::vector<ref::Fp8Expert> experts;
  ref::Fp8Expert shared;
};
// skew_bias > 0 adds that much correction bias to experts 0..K-1 (every token then picks them).
Model make_model(const MoELayerConfig& cfg, uint64_t seed, float skew_bias);

// This rank's weights on the device.
struct DeviceModel {
  DeviceBuffer w13, w13s, w2, w2s, sw13, sw13s, sw2, sw2s, gate, bias;
  MoELayerWeights views;
};
void make_device_model(const Model& md, DeviceModel& d);

// The test shapes (H 512, I 256, E 16, K 4, M 24, grouped top-k 4/2, one shared expert) or, with
// deepseek, DeepSeek-V3's H and I (7168, 2048; 8 experts per rank, M 6), as rank `rank` of `world_size`.
MoELayerConfig base_config(MoESchedule sched, ExpertLayout layout, bool deepseek, int dp, int world_size, int rank);

// The tokens of this rank's DP group (identical on the group's ranks): [rows, H] bf16 bits.
std::vector<uint16_t> group_tokens(const MoELayerConfig& c, int rows, uint64_t seed);

// Checks one forward of m tokens (rows of x and out: `rows`): the gate logits against a double
// host GEMM, the routing exactly against ref::route of the device's logits, the output against
// ref::moe_layer (tolerance in layer_model.cpp), rows >= m of out still 0xffff. "" or the first problem.
std::string check_forward(MoELayer& layer, const Model& md, const std::vector<uint16_t>& x, int m, int rows,
                          bool device_m, const DeviceBuffer& out_dev);

template <typename T>
DeviceBuffer upload(const T* p, size_t n) {
  DeviceBuffer b(n * sizeof(T));
  if (n && cudaMemcpy(b.ptr, p, n * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess) throw Error("upload failed");
  return b;
}

template <typename T>
std::vector<T> download(const void* p, size_t n) {
  std::vector<T> h(n);
  if (n && cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess) throw Error("download failed");
  return h;
}

}  // namespace epkit::test
