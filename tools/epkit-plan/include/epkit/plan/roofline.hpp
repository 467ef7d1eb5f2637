// Roofline timing of one kernel: max(FLOP / peak, bytes / bandwidth) scaled by efficiency, plus launch cost.
#pragma once

#include <string>

#include "epkit/plan/config.hpp"
#include "epkit/plan/specs.hpp"

namespace epkit::plan {

// What a kernel is, for the per-layer breakdown (the deployment study's categories).
enum class KernelClass { kGemm, kGroupGemm, kAttention, kRouter, kSharedExpert, kElementwise, kDispatch, kCombine, kTpAllReduce };

// "gemm", "group_gemm", "attention", "router", "shared_expert", "elementwise", "dispatch", "combine", "tp_allreduce".
std::string to_string(KernelClass k);

// One kernel launch (or a fused group of them) and its modelled or measured time.
struct KernelCost {
  std::string name;
  KernelClass cls = KernelClass::kGemm;
  double flop = 0;            // floating-point operations
  double bytes = 0;           // HBM bytes read + written
  double time_us = 0;         // time on the GPU, µs, launch cost included
  bool compute_bound = false; // the FLOP term was the larger one
  bool measured = false;      // time_us came from a calibration file
  bool interpolated = false;  // measured, between two measured points
  std::string note;           // measured: which rows; modelled under a kernel calibration: why no row applied
  // Arithmetic intensity, FLOP per byte (0 when bytes == 0).
  double intensity() const { return bytes > 0 ? flop / bytes : 0; }
};

// Roofline time in µs: max(flop / (peak_tflops*1e12*eff_compute), bytes / (bw_tb_per_s*1e12*eff_memory)) + launch_us.
double roofline_us(double flop, double bytes, double peak_tflops, double bw_tb_per_s, double eff_compute,
                   double eff_memory, double launch_us, bool* compute_bound = nullptr);

// A GEMM [m,k] x [k,n] -> [m,n]: FLOP = 2mkn, bytes = m*k*a_bytes + k*n*w_bytes + m*n*out_bytes (the deployment study
// counts one byte per element; the planner uses the real element sizes). FP8 peak when w_bytes == 1.
KernelCost gemm_cost(const std::string& name, KernelClass cls, double m, double k, double n, double w_bytes,
                     double a_bytes, double out_bytes, const GpuSpec& g, const Efficiency& e);

// A GroupGEMM of `groups` groups with `total_m` rows in all: FLOP = 2*total_m*k*n,
// bytes = groups*k*n*w_bytes + total_m*(k*a_bytes + n*out_bytes).
KernelCost group_gemm_cost(const std::string& name, double groups, double total_m, double k, double n, double w_bytes,
                           double a_bytes, double out_bytes, const GpuSpec& g, const Efficiency& e);

// A memory-bound kernel moving `bytes` through HBM.
KernelCost elementwise_cost(const std::string& name, KernelClass cls, double bytes, const GpuSpec& g, const Efficiency& e);

}  // namespace epkit::plan
