// Roofline kernel times (the deployment study, "Roofline").
#include "epkit/plan/roofline.hpp"

#include <algorithm>

namespace epkit::plan {

std::string to_string(KernelClass k) {
  switch (k) {
    case KernelClass::kGemm: return "gemm";
    case KernelClass::kGroupGemm: return "group_gemm";
    case KernelClass::kAttention: return "attention";
    case KernelClass::kRouter: return "router";
    case KernelClass::kSharedExpert: return "shared_expert";
    case KernelClass::kElementwise: return "elementwise";
    case KernelClass::kDispatch: return "dispatch";
    case KernelClass::kCombine: return "combine";
    case KernelClass::kTpAllReduce: return "tp_allreduce";
  }
  return "?";
}

double roofline_us(double flop, double bytes, double peak_tflops, double bw_tb_per_s, double eff_compute,
                   double eff_memory, double launch_us, bool* compute_bound) {
  const double t_compute = flop / (peak_tflops * 1e12 * eff_compute) * 1e6;
  const double t_memory = bytes / (bw_tb_per_s * 1e12 * eff_memory) * 1e6;
  if (compute_bound) *compute_bound = t_compute > t_memory;
  return std::max(t_compute, t_memory) + launch_us;
}

KernelCost gemm_cost(const std::string& name, KernelClass cls, double m, double k, double n, double w_bytes,
                     double a_bytes, double out_bytes, const GpuSpec& g, const Efficiency& e) {
  KernelCost c;
  c.name = name;
  c.cls = cls;
  c.flop = 2.0 * m * k * n;
  c.bytes = m * k * a_bytes + k * n * w_bytes + m * n * out_bytes;
  const double peak = w_bytes <= 1 ? g.peak_fp8_tflops : g.peak_bf16_tflops;
  c.time_us = roofline_us(c.flop, c.bytes, peak, g.hbm_bandwidth_tb_per_s, e.gemm_compute, e.gemm_memory,
                          g.kernel_launch_us, &c.compute_bound);
  return c;
}

KernelCost group_gemm_cost(const std::string& name, double groups, double total_m, double k, double n, double w_bytes,
                           double a_bytes, double out_bytes, const GpuSpec& g, const Efficiency& e) {
  KernelCost c;
  c.name = name;
  c.cls = KernelClass::kGroupGemm;
  c.flop = 2.0 * total_m * k * n;
  c.bytes = groups * k * n * w_bytes + total_m * (k * a_bytes + n * out_bytes);
  const double peak = w_bytes <= 1 ? g.peak_fp8_tflops : g.peak_bf16_tflops;
  c.time_us = roofline_us(c.flop, c.bytes, peak, g.hbm_bandwidth_tb_per_s, e.gemm_compute, e.gemm_memory,
                          g.kernel_launch_us, &c.compute_bound);
  return c;
}

KernelCost elementwise_cost(const std::string& name, KernelClass cls, double bytes, const GpuSpec& g,
                            const Efficiency& e) {
  KernelCost c;
  c.name = name;
  c.cls = cls;
  c.bytes = bytes;
  c.time_us = roofline_us(0, bytes, 1, g.hbm_bandwidth_tb_per_s, 1, e.elementwise_memory, g.kernel_launch_us);
  return c;
}

}  // namespace epkit::plan
