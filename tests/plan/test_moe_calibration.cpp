// Calibration from epkit-moe JSON: row kinds, validation, the kernel lookup (nearest G, log-log fraction,
// range), measured kernels inside the layer model, the MoE block, and layer rows mapped onto deployments.
// Every number in these documents is synthetic (made up to exercise the code), not a measurement.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <tuple>

#include "epkit/error.hpp"
#include "epkit/plan/calibration.hpp"
#include "epkit/plan/cli.hpp"
#include "epkit/plan/estimate.hpp"
#include "plan/plan_testing.hpp"

using namespace epkit::plan;
using namespace epkit::plan::testing_util;

namespace {

constexpr double kHbm = 4000, kFp8 = 1400;  // synthetic ceilings, GB/s and TFLOP/s

std::string num(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

Json doc(const std::string& rows, const std::string& device = "NVIDIA H200") {
  return Json::parse(R"({"meta":{"device":")" + device + R"(","note":"synthetic"},"ceilings":{"hbm_read_GBps":)" +
                     num(kHbm) + R"(,"fp8_dense_TFLOPs":)" + num(kFp8) + R"(},"rows":[)" + rows + "]}");
}

// Weight bytes of G experts of [N, K] fp8 with fp32 128x128 block scales (epkit-moe's formula).
double gemm_weight_bytes(double G, int N, int K) { return G * (double(N) * K + ((N + 127) / 128) * (K / 128) * 4.0); }

std::string gemm_row(const std::string& variant, int G, int m, int N, int K, double us, const std::string& system = "epkit") {
  const double wb = gemm_weight_bytes(G, N, K);
  return R"({"kernel":"grouped_gemm","system":")" + system + R"(","variant":")" + variant + R"(","G":)" +
         std::to_string(G) + R"(,"m":)" + std::to_string(m) + R"(,"N":)" + std::to_string(N) + R"(,"K":)" +
         std::to_string(K) + R"(,"us_median":)" + num(us) + R"(,"us_p99":)" + num(us) + R"(,"bytes":)" +
         num(wb + double(G) * m * (K + 2.0 * N)) + R"(,"weight_bytes":)" + num(wb) + R"(,"flops":)" +
         num(2.0 * G * m * double(N) * K) + R"(,"pct_of_ceiling":0,"bound":"hbm","calls":20,"replays":50})";
}

// The time a grouped GEMM row must have to sit at fraction f of the synthetic roofline.
double gemm_us_at(double f, double G, double m, int N, int K) {
  return std::max(gemm_weight_bytes(G, N, K) / (kHbm * 1e9), 2.0 * G * m * N * K / (kFp8 * 1e12)) / f * 1e6;
}

std::string mem_row(const std::string& kernel, const std::string& variant, int G, int m, int N, int K, double us,
                    double bytes) {
  return R"({"kernel":")" + kernel + R"(","system":"epkit","variant":")" + variant + R"(","G":)" + std::to_string(G) +
         R"(,"m":)" + std::to_string(m) + R"(,"N":)" + std::to_string(N) + R"(,"K":)" + std::to_string(K) +
         R"(,"us_median":)" + num(us) + R"(,"bytes":)" + num(bytes) + R"(,"weight_bytes":0,"flops":0})";
}

std::string layer_row(const std::string& schedule, int W, int E, int batch, int q, double graph_us,
                      const std::string& layout = "masked", bool breakdown = false, const std::string& shared = "",
                      const std::string& gate_router = "") {
  std::string r = R"({"kernel":"moe_layer","system":"epkit","schedule":")" + schedule + R"(","layout":")" + layout +
                  (shared.empty() ? "" : R"(","shared":")" + shared) +
                  (gate_router.empty() ? "" : R"(","gate_router":")" + gate_router) +
                  R"(","world_size":)" + std::to_string(W) + R"(,"experts":)" + std::to_string(E) + R"(,"batch":)" +
                  std::to_string(batch) + R"(,"query_len":)" + std::to_string(q) + R"(,"tokens":)" +
                  std::to_string(batch * q) + R"(,"us_median":)" + num(graph_us * 1.2) + R"(,"us_p99":1,"graph_us_median":)" +
                  num(graph_us) + R"(,"graph_us_p99":)" + num(graph_us * 1.1) + R"(,"steps_us_sum":1,"graph_over_steps":1)";
  if (breakdown) r += R"(,"breakdown":[{"step":"gate","us_median":3},{"step":"quantize","us_median":2},{"step":"gemm_w13","us_median":40}])";
  return r + "}";
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const epkit::Error& e) {
    return e.what();
  }
  return "no error";
}

const KernelCost& kernel(const PlanPoint& p, const std::string& name) {
  for (const auto& k : p.moe_kernels)
    if (k.name == name) return k;
  throw std::runtime_error("no kernel " + name);
}

bool has(const std::vector<std::string>& v, const std::string& s) { return std::find(v.begin(), v.end(), s) != v.end(); }

// Every default up_gate/down grouped GEMM row of the benchmark grid at one roofline fraction.
std::string gemm_grid(double f, const std::vector<int>& ms) {
  std::string rows;
  for (const auto& [variant, N, K] : {std::tuple{"up_gate", 4096, 7168}, std::tuple{"down", 7168, 2048}})
    for (int G : {2, 8, 16, 32, 64})
      for (int m : ms) rows += (rows.empty() ? "" : ",") + gemm_row(variant, G, m, N, K, gemm_us_at(f, G, m, N, K));
  return rows;
}

}  // namespace

TEST(PlanMoeCalibration, EachRowKindIsDetectedOnItsOwn) {
  const ModelSpec m = load_model("deepseek-v3");
  const std::string comm = R"({"system":"epkit","world_size":2,"tokens":16,"dispatch_us_median":20,"combine_us_median":21,"total_us_median":41})";
  const Calibration cal = calibration_from_json(
      doc(comm + "," + gemm_row("up_gate", 8, 16, 4096, 7168, 50) + "," +
          gemm_row("up_gate", 8, 16, 4096, 7168, 60, "torch_scaled_grouped_mm") + "," +
          gemm_row("up_gate uneven", 8, 16, 4096, 7168, 55) + "," + layer_row("none", 1, 32, 4, 2, 300)),
      m);
  EXPECT_EQ(cal.comm.size(), 1u);
  EXPECT_EQ(cal.kernels.size(), 1u);
  EXPECT_EQ(cal.kernel_rows_ignored, 2);  // another system, and a qualified variant
  EXPECT_EQ(cal.layers.size(), 1u);
  EXPECT_EQ(cal.kernels[0].device, "NVIDIA H200");
  EXPECT_DOUBLE_EQ(cal.kernels[0].hbm_GBps, kHbm);
  EXPECT_NE(error_of([&] { calibration_from_json(doc(R"({"system":"epkit","G":1})"), m); }).find("rows[0] has neither"),
            std::string::npos);
}

// deepgemm_baseline.py's rows of epkit's default config ("<shape> masked", system epkit_vs_deepgemm)
// stand for epkit-moe's own row of the point where the file has none; its uneven rows and DeepGEMM's
// are left out.
TEST(PlanMoeCalibration, EpkitRowsTimedBesideDeepGemmCountWhereTheFileHasNoOwnRow) {
  const ModelSpec m = load_model("deepseek-v3");
  const Calibration cal = calibration_from_json(
      doc(gemm_row("up_gate masked", 8, 16, 4096, 7168, 50, "epkit_vs_deepgemm") + "," +
          gemm_row("up_gate masked", 8, 16, 4096, 7168, 55, "deepgemm") + "," +
          gemm_row("up_gate masked uneven", 8, 16, 4096, 7168, 52, "epkit_vs_deepgemm") + "," +
          gemm_row("down masked", 8, 16, 7168, 2048, 30, "epkit_vs_deepgemm") + "," +
          gemm_row("down", 8, 16, 7168, 2048, 31)),
      m);
  ASSERT_EQ(cal.kernels.size(), 2u);
  EXPECT_EQ(cal.kernel_rows_ignored, 3);  // DeepGEMM's, the uneven one, and the down row the file has itself
  for (const auto& k : cal.kernels) {
    if (k.variant == "up_gate") EXPECT_DOUBLE_EQ(k.us, 50);
    else if (k.variant == "down") EXPECT_DOUBLE_EQ(k.us, 31);  // epkit-moe's own row wins
    else ADD_FAILURE() << "unexpected variant " << k.variant;
  }
}

TEST(PlanMoeCalibration, MalformedRowsNameTheField) {
  const ModelSpec m = load_model("deepseek-v3");
  auto msg = [&](const Json& j) { return error_of([&] { calibration_from_json(j, m); }); };
  std::string no_time = gemm_row("up_gate", 8, 16, 4096, 7168, 50);
  no_time.replace(no_time.find("\"us_median\""), 11, "\"us_mean\"");
  EXPECT_NE(msg(doc(no_time)).find("rows[0].us_median is missing"), std::string::npos);
  EXPECT_NE(msg(doc(gemm_row("up_gate", 0, 16, 4096, 7168, 50))).find("rows[0].G = 0"), std::string::npos);
  EXPECT_NE(msg(doc(gemm_row("up_gate", 8, 16, 4096, 7168, 0))).find("rows[0].us_median = 0 must be > 0"),
            std::string::npos);
  EXPECT_NE(msg(doc(mem_row("router", "x", 1, 16, 256, 8, 5, 0))).find("no roofline"), std::string::npos);
  EXPECT_NE(msg(Json::parse("{\"rows\":[" + gemm_row("down", 8, 16, 7168, 2048, 50) + "]}")).find("ceilings is missing"),
            std::string::npos);
  EXPECT_NE(msg(Json::parse(R"({"ceilings":{"hbm_read_GBps":0,"fp8_dense_TFLOPs":1},"rows":[)" +
                            gemm_row("down", 8, 16, 7168, 2048, 50) + "]}"))
                .find("ceilings.hbm_read_GBps = 0"),
            std::string::npos);
  EXPECT_NE(msg(doc(layer_row("fast", 1, 32, 4, 2, 300))).find("rows[0].schedule = 'fast'"), std::string::npos);
  EXPECT_NE(msg(doc(layer_row("none", 1, 32, 4, 2, 300, "ragged"))).find("rows[0].layout = 'ragged'"), std::string::npos);
  std::string bad_tokens = layer_row("none", 1, 32, 4, 2, 300);
  bad_tokens.replace(bad_tokens.find("\"tokens\":8"), 10, "\"tokens\":5");
  EXPECT_NE(msg(doc(bad_tokens)).find("rows[0].tokens = 5 must equal batch * query_len = 8"), std::string::npos);
  std::string bad_step = layer_row("none", 1, 32, 4, 2, 300, "masked", true);
  bad_step.replace(bad_step.find("\"us_median\":2"), 13, "\"us\":2");
  EXPECT_NE(msg(doc(bad_step)).find("rows[0].breakdown[1].us_median is missing"), std::string::npos);
  EXPECT_NE(msg(doc(layer_row("none", 1, 32, 4, 2, 0))).find("rows[0].graph_us_median = 0"), std::string::npos);
  // The same point twice, in one file or across files, would make the answer depend on file order.
  const std::string row = layer_row("none", 1, 32, 4, 2, 300);
  EXPECT_NE(msg(doc(row + "," + row)).find("appears twice"), std::string::npos);
  const std::string a = temp_file("moe_layer_a.json", doc(row).dump()), b = temp_file("moe_layer_b.json", doc(row).dump());
  const std::string twice = error_of([&] { load_calibrations({a, b}, m); });
  EXPECT_NE(twice.find("appears twice (" + a + " and " + b + ")"), std::string::npos) << twice;
}

TEST(PlanMoeCalibration, GemmLookupReproducesMeasuredPointsAndInterpolatesTheFraction) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> frac(0.05, 0.95);
  const int N = 4096, K = 7168;
  const double f1 = frac(rng), f16 = frac(rng), f64 = frac(rng), f32g = frac(rng);
  const double t1 = gemm_us_at(f1, 8, 1, N, K), t16 = gemm_us_at(f16, 8, 16, N, K), t64 = gemm_us_at(f64, 8, 64, N, K);
  const Calibration cal = calibration_from_json(
      doc(gemm_row("up_gate", 8, 1, N, K, t1) + "," + gemm_row("up_gate", 8, 16, N, K, t16) + "," +
          gemm_row("up_gate", 8, 64, N, K, t64) + "," + gemm_row("up_gate", 32, 16, N, K, gemm_us_at(f32g, 32, 16, N, K))),
      load_model("deepseek-v3"));
  EXPECT_NEAR(cal.kernels[1].roofline_fraction(), f16, 1e-12);
  auto look = [&](double G, double m, const std::string& gpu = "h200") {
    return lookup_kernel(cal, {"grouped_gemm", "up_gate", N, K, G, m, gpu});
  };
  // A measured point gives back its own time.
  const KernelLookup exact = look(8, 16);
  ASSERT_TRUE(exact.found) << exact.what;
  EXPECT_FALSE(exact.interpolated);
  EXPECT_NEAR(exact.time_us, t16, 1e-9 * t16);
  // m = 4 lies halfway between 1 and 16 in log m: the fraction is the geometric mean of theirs.
  const KernelLookup mid = look(8, 4);
  ASSERT_TRUE(mid.found) << mid.what;
  EXPECT_TRUE(mid.interpolated);
  const double want = gemm_us_at(std::sqrt(f1 * f16), 8, 4, N, K);
  EXPECT_NEAR(mid.time_us, want, 1e-9 * want);
  // G = 10 takes G = 8's fraction on 10/8 of its weights and FLOP.
  const KernelLookup scaled = look(10, 16);
  EXPECT_EQ(scaled.groups_used, 8);
  EXPECT_NEAR(scaled.time_us, t16 * 10 / 8, 1e-9 * t16);
  // Nearest G by ratio: 20 is nearer 32 than 8; 16 is as near to both and goes to the larger.
  EXPECT_EQ(look(20, 16).groups_used, 32);
  EXPECT_EQ(look(16, 16).groups_used, 32);
  EXPECT_EQ(look(12, 16).groups_used, 8);
  // No extrapolation: outside [1, 64] at G = 8 there is no answer, and the reason says so.
  for (double m : {0.5, 65.0}) {
    const KernelLookup out = look(8, m);
    EXPECT_FALSE(out.found);
    EXPECT_NE(out.what.find("outside the measured [1, 64]"), std::string::npos) << out.what;
  }
  // At G = 32 only m = 16 was measured.
  EXPECT_FALSE(look(32, 20).found);
  EXPECT_FALSE(lookup_kernel(cal, {"grouped_gemm", "down", 7168, 2048, 8, 16, "h200"}).found);
}

TEST(PlanMoeCalibration, RowsApplyOnlyToTheirDevice) {
  const ModelSpec m = load_model("deepseek-v3");
  const std::string row = gemm_row("down", 8, 16, 7168, 2048, 50);
  auto found = [&](const std::string& device, const std::string& gpu) {
    const Calibration cal = calibration_from_json(doc(row, device), m);
    return lookup_kernel(cal, {"grouped_gemm", "down", 7168, 2048, 8, 16, gpu});
  };
  EXPECT_TRUE(found("NVIDIA H200", "h200").found);
  EXPECT_TRUE(found("NVIDIA H100 80GB HBM3", "h100-sxm").found);
  EXPECT_TRUE(found("", "h100-sxm").found);  // not recorded: the user's word
  const KernelLookup other = found("NVIDIA H200", "h100-sxm");
  EXPECT_FALSE(other.found);
  EXPECT_NE(other.what.find("measured on NVIDIA H200, not h100-sxm"), std::string::npos) << other.what;
  EXPECT_FALSE(found("NVIDIA H20", "h200").found);  // whole words only
}

TEST(PlanMoeCalibration, MemoryBoundKernelsInterpolateOverAllRows) {
  // A launch-bound kernel: the same time at 8 and 32 rows while its bytes grow with the rows. The
  // log-log interpolation keeps the time flat in between, whatever the split into groups.
  const int I = 2048;
  const double per_row = 2 * I * 2 + I + (I / 128) * 4;
  const Calibration cal = calibration_from_json(
      doc(mem_row("silu_mul_quantize", "masked", 8, 1, I, 0, 5.0, 8 * per_row) + "," +
          mem_row("silu_mul_quantize", "masked", 8, 4, I, 0, 5.0, 32 * per_row)),
      load_model("deepseek-v3"));
  const KernelLookup l = lookup_kernel(cal, {"silu_mul_quantize", "masked", I, -1, 4, 4, "h200"});
  ASSERT_TRUE(l.found) << l.what;
  EXPECT_NEAR(l.time_us, 5.0, 1e-9);
  // 2 groups of 2 rows are 4 rows in all: below the measured 8.
  EXPECT_FALSE(lookup_kernel(cal, {"silu_mul_quantize", "masked", I, -1, 2, 2, "h200"}).found);
}

TEST(PlanMoeCalibration, EstimateUsesMeasuredGroupGemmsWhereTheyApply) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const double f = std::uniform_real_distribution<double>(0.1, 0.9)(rng);
  const ModelSpec m = load_model("deepseek-v3");
  const GpuSpec g = load_gpu("h200");
  // One fraction everywhere, so that any interpolation must land on it: the expected time is the
  // roofline at the file's ceilings divided by f, at the planner's own G and m.
  const Calibration cal = calibration_from_json(doc(gemm_grid(f, {1, 4, 16, 64, 256, 1024, 4096})), m);
  for (int batch : {1, 16, 128}) {
    const PlanPoint p = estimate(m, g, cfg(8, 1, batch), {}, &cal);
    const double G = p.routing.active_experts_per_gpu, rows = p.routing.tokens_per_active_expert;
    for (const auto& [name, N, K] : {std::tuple{"moe_gate_up", 4096, 7168}, std::tuple{"moe_down", 7168, 2048}}) {
      const KernelCost& k = kernel(p, name);
      EXPECT_TRUE(k.measured) << name << ": " << k.note;
      const double want = gemm_us_at(f, G, rows, N, K);
      EXPECT_NEAR(k.time_us, want, 1e-9 * want) << name << " batch " << batch;
    }
    // The shared expert runs as a one-group grouped GEMM on the group's tokens.
    const double T = batch * 2.0;
    EXPECT_NEAR(kernel(p, "shared_down").time_us, gemm_us_at(f, 1, T, 7168, 2048), 1e-9 * kernel(p, "shared_down").time_us);
    // No silu rows: that kernel of the group_gemm category stays modelled, and the terms say which.
    EXPECT_FALSE(kernel(p, "moe_silu_quant").measured);
    EXPECT_TRUE(has(p.modelled_terms, "group_gemm[moe_silu_quant]"));
    EXPECT_EQ(std::count_if(p.measured_terms.begin(), p.measured_terms.end(),
                            [](const std::string& t) { return t.rfind("group_gemm[moe_gate_up+moe_down]", 0) == 0; }),
              1);
    // Kernels the calibration has nothing for keep their modelled time.
    EXPECT_DOUBLE_EQ(kernel(p, "attention").time_us, kernel(estimate(m, g, cfg(8, 1, batch)), "attention").time_us);
  }
  // Another GPU, a range that does not cover the point, a BF16 model: modelled, with the reason.
  const KernelCost on_h100 = kernel(estimate(m, load_gpu("h100"), cfg(8, 1, 128), {}, &cal), "moe_gate_up");
  EXPECT_FALSE(on_h100.measured);
  EXPECT_NE(on_h100.note.find("not h100-sxm"), std::string::npos) << on_h100.note;
  const Calibration narrow = calibration_from_json(doc(gemm_grid(f, {16, 64})), m);
  const PlanPoint small = estimate(m, g, cfg(8, 1, 1), {}, &narrow);
  EXPECT_FALSE(kernel(small, "moe_gate_up").measured);
  EXPECT_NE(kernel(small, "moe_gate_up").note.find("outside the measured [16, 64]"), std::string::npos);
  EXPECT_TRUE(has(small.modelled_terms, "group_gemm"));
  const ModelSpec mixtral = load_model("mixtral");
  const KernelCost bf16 = kernel(estimate(mixtral, g, cfg(8, 1, 16), {}, &cal), "moe_gate_up");
  EXPECT_FALSE(bf16.measured);
  EXPECT_NE(bf16.note.find("BF16"), std::string::npos);
}

TEST(PlanMoeCalibration, MoeBlockIsTheLayerWithoutAttention) {
  const ModelSpec m = load_model("deepseek-v3");
  const GpuSpec g = load_gpu("h200");
  auto block_kernels_us = [](const PlanPoint& p) {
    double t = 0;
    bool in_block = false;
    for (const auto& k : p.moe_kernels) {
      in_block = in_block || k.name == "gate";  // the block starts at the gate GEMM
      if (in_block) t += k.time_us;
    }
    return t;
  };
  // One GPU: dispatch and combine are local, so nothing waits and the block is its kernels.
  const PlanPoint one = estimate(m, g, cfg(1, 1, 8));
  EXPECT_NEAR(one.moe_block_time_us, block_kernels_us(one), 1e-9);
  EXPECT_LT(one.moe_block_time_us, one.moe_layer_time_us);
  // Micro-batching on one GPU hides nothing: two halves cost two half-size blocks.
  EXPECT_NEAR(estimate(m, g, cfg(1, 1, 8, Schedule::kMicroBatch)).moe_block_time_us, 2 * estimate(m, g, cfg(1, 1, 4)).moe_block_time_us,
              1e-9);
  // Over NVLink the block waits for its transfers; the shared expert can hide part of dispatch's.
  const PlanPoint ep8 = estimate(m, g, cfg(8, 1, 32));
  EXPECT_GT(ep8.moe_block_time_us, block_kernels_us(ep8));
  EXPECT_LT(estimate(m, g, cfg(8, 1, 32, Schedule::kDispatchOverlap)).moe_block_time_us, ep8.moe_block_time_us);
}

// Schedule none is measured with the shared expert on its own branch (the layer's default) and in
// stream order; the planner compares against the default, and an unknown placement is an error.
TEST(PlanMoeCalibration, LayerRowsPreferTheDefaultSharedPlacement) {
  const ModelSpec m = load_model("deepseek-v3");
  const GpuSpec g = load_gpu("h200");
  const Calibration cal = calibration_from_json(
      doc(layer_row("none", 1, 256, 4, 2, 900, "packed", false, "in_stream") + "," +
          layer_row("none", 1, 256, 4, 2, 700, "packed", false, "concurrent") + "," +
          layer_row("none", 1, 256, 4, 2, 650, "masked", false, "concurrent")),
      m);
  const PlanPoint ep1 = estimate(m, g, cfg(1, 1, 4), {}, &cal);
  ASSERT_TRUE(ep1.layer_check.has_value()) << ep1.layer_check_note;
  EXPECT_EQ(ep1.layer_check->row.shared, "concurrent");
  EXPECT_EQ(ep1.layer_check->row.layout, "packed");
  EXPECT_DOUBLE_EQ(ep1.layer_check->row.graph_us, 700);
  const std::string bad = error_of(
      [&] { calibration_from_json(doc(layer_row("none", 1, 256, 4, 2, 900, "masked", false, "sideways")), m); });
  EXPECT_NE(bad.find("shared = 'sideways'"), std::string::npos) << bad;
}

// epkit-moe layer's same-run A/B of the fused gate + router gives a decode point twice: the planner
// keeps the fused row (the library's default), counts the other as ignored, and keeps a separate row
// that has no fused twin (above 32 tokens, or where the fused kernel does not apply).
TEST(PlanMoeCalibration, LayerRowsKeepTheFusedGateRouter) {
  const ModelSpec m = load_model("deepseek-v3");
  const GpuSpec g = load_gpu("h200");
  const Calibration cal = calibration_from_json(
      doc(layer_row("none", 1, 256, 4, 2, 650, "packed", false, "concurrent", "separate") + "," +
          layer_row("none", 1, 256, 4, 2, 640, "packed", false, "concurrent", "fused") + "," +
          layer_row("none", 1, 256, 64, 2, 900, "packed", false, "concurrent", "separate")),
      m);
  ASSERT_EQ(cal.layers.size(), 2u);
  EXPECT_EQ(cal.layer_rows_ignored, 1);
  const PlanPoint ep1 = estimate(m, g, cfg(1, 1, 4), {}, &cal);
  ASSERT_TRUE(ep1.layer_check.has_value()) << ep1.layer_check_note;
  EXPECT_EQ(ep1.layer_check->row.gate_router, "fused");
  EXPECT_DOUBLE_EQ(ep1.layer_check->row.graph_us, 640);
  const std::string bad = error_of([&] {
    calibration_from_json(doc(layer_row("none", 1, 256, 4, 2, 900, "masked", false, "", "half")), m);
  });
  EXPECT_NE(bad.find("gate_router = 'half'"), std::string::npos) << bad;
}

TEST(PlanMoeCalibration, LayerRowsMapOntoDeployments) {
  const ModelSpec m = load_model("deepseek-v3");
  const GpuSpec g = load_gpu("h200");
  const Calibration cal = calibration_from_json(
      doc(layer_row("none", 1, 256, 4, 2, 900) + "," + layer_row("none", 1, 32, 4, 2, 400, "masked") + "," +
          layer_row("none", 1, 32, 4, 2, 300, "packed", true) + "," + layer_row("microbatch", 2, 128, 4, 2, 500)),
      m);
  // E = 256 on one GPU is EP1 itself.
  const PlanPoint ep1 = estimate(m, g, cfg(1, 1, 4), {}, &cal);
  ASSERT_TRUE(ep1.layer_check.has_value()) << ep1.layer_check_note;
  EXPECT_EQ(ep1.layer_check->match, "exact");
  EXPECT_DOUBLE_EQ(ep1.layer_check->modelled_us, ep1.moe_block_time_us);
  EXPECT_DOUBLE_EQ(ep1.layer_check->ratio, 900 / ep1.moe_block_time_us);
  // E = 32 on one GPU stands for an EP8 rank: its model is one GPU whose routed experts are those 32.
  const PlanPoint ep8 = estimate(m, g, cfg(8, 1, 4), {}, &cal);
  ASSERT_TRUE(ep8.layer_check.has_value()) << ep8.layer_check_note;
  const LayerCheck& lc = *ep8.layer_check;
  EXPECT_EQ(lc.match, "w1_proxy");
  EXPECT_EQ(lc.row.layout, "packed");  // the layer's default layout is preferred
  EXPECT_DOUBLE_EQ(lc.row.graph_us, 300);
  ModelSpec rank = m;
  rank.num_routed_experts = 32;
  const PlanPoint twin = estimate(rank, g, cfg(1, 1, 4));
  EXPECT_DOUBLE_EQ(lc.modelled_us, twin.moe_block_time_us);
  EXPECT_NE(lc.modelled_us, ep8.moe_block_time_us);  // the deployment itself also pays the network
  ASSERT_EQ(lc.steps.size(), 3u);
  EXPECT_EQ(lc.steps[1].step, "quantize");
  EXPECT_EQ(lc.steps[1].modelled_us, -1);  // no planner kernel
  EXPECT_DOUBLE_EQ(lc.steps[2].modelled_us, kernel(twin, "moe_gate_up").time_us);
  EXPECT_DOUBLE_EQ(lc.steps[2].measured_us, 40);
  // W = 2 rows with 128 experts per GPU are EP2 itself, schedule by schedule.
  const PlanPoint ep2 = estimate(m, g, cfg(2, 1, 4, Schedule::kMicroBatch), {}, &cal);
  ASSERT_TRUE(ep2.layer_check.has_value()) << ep2.layer_check_note;
  EXPECT_EQ(ep2.layer_check->match, "exact");
  EXPECT_FALSE(estimate(m, g, cfg(2, 1, 4), {}, &cal).layer_check.has_value());
  // No row: another batch, TP above 1, another GPU. The note says why.
  const PlanPoint other_batch = estimate(m, g, cfg(8, 1, 5), {}, &cal);
  EXPECT_FALSE(other_batch.layer_check.has_value());
  EXPECT_NE(other_batch.layer_check_note.find("batch 5"), std::string::npos) << other_batch.layer_check_note;
  EXPECT_NE(estimate(m, g, cfg(8, 2, 4, Schedule::kNoOverlap), {}, &cal).layer_check_note.find("TP1"), std::string::npos);
  EXPECT_FALSE(estimate(m, load_gpu("h100"), cfg(8, 1, 4), {}, &cal).layer_check.has_value());
  // Without layer rows there is neither a check nor a note.
  EXPECT_TRUE(estimate(m, g, cfg(8, 1, 4)).layer_check_note.empty());
}

TEST(PlanMoeCalibration, CliReadsSeveralFilesAndReportsTheLayer) {
  const std::string kernels = temp_file("moe_kernels.json", doc(gemm_grid(0.5, {1, 4, 16, 64, 256})).dump());
  const std::string layers = temp_file(
      "moe_layers.json", doc(layer_row("none", 1, 32, 4, 2, 300, "masked", true) + "," + layer_row("none", 1, 32, 16, 2, 320)).dump());
  std::ostringstream text;
  run_cli({"explain", "--ep", "8", "--batch", "4", "--calibrate", kernels, "--calibrate", layers}, text);
  for (const char* s : {"measured MoE layer", "W=1 proxy", "measured / modelled", "quantize", "(no planner kernel)",
                        "measured (grouped_gemm up_gate", "2 epkit-moe layer rows"})
    EXPECT_NE(text.str().find(s), std::string::npos) << s << "\n" << text.str();
  std::ostringstream js;
  run_cli({"explain", "--ep", "8", "--batch", "4", "--calibrate", kernels, "--calibrate", layers, "--json"}, js);
  const Json j = Json::parse(js.str());
  EXPECT_EQ(j.at("calibration").at("sources").as_array().size(), 2u);
  EXPECT_GT(j.at("calibration").at("kernel_rows_used").as_number(), 0);
  EXPECT_EQ(j.at("layer_check").at("match").as_string(), "w1_proxy");
  EXPECT_DOUBLE_EQ(j.at("layer_check").at("measured_us").as_number(), 300);
  EXPECT_TRUE(j.at("layer_check").at("steps").as_array()[1].at("modelled_us").is_null());
  // The sweep's CSV gets the layer columns; every line keeps the header's width.
  std::ostringstream csv;
  run_cli({"--csv", "--all", "--ep", "8", "--tp", "1", "--batch", "4,8,16", "--calibrate", layers}, csv);
  std::istringstream lines(csv.str());
  std::string header, line;
  std::getline(lines, header);
  EXPECT_NE(header.find(",moe_block_us,layer_match,measured_layer_us,modelled_layer_us,measured_over_modelled"),
            std::string::npos);
  const auto fields = [](const std::string& l) { return std::count(l.begin(), l.end(), ',') + 1; };
  int matched = 0;
  while (std::getline(lines, line)) {
    EXPECT_EQ(fields(line), fields(header)) << line;
    matched += line.find(",w1_proxy,") != std::string::npos;
  }
  EXPECT_EQ(matched, 2);  // batch 4 and 16 under schedule none; batch 8 has no row
  std::ostringstream os;
  EXPECT_NE(error_of([&] { run_cli({"explain", "--ep", "8", "--ep", "16"}, os); }).find("given twice"), std::string::npos);
}
