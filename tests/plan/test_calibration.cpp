// Calibration from epkit-bench JSON: which rows match, exact and interpolated lookups, and the report.
#include <gtest/gtest.h>

#include "epkit/error.hpp"
#include "epkit/plan/calibration.hpp"
#include "epkit/plan/estimate.hpp"

using namespace epkit::plan;

namespace {

Json bench(const std::string& rows) { return Json::parse(R"({"bench":"epkit-bench","rows":[)" + rows + "]}"); }

std::string row(const std::string& system, int ws, int tokens, double d, double c, const std::string& preset = "deepseek-v3") {
  return R"({"preset":")" + preset + R"(","tokens":)" + std::to_string(tokens) + R"(,"world_size":)" +
         std::to_string(ws) + R"(,"system":")" + system + R"(","dispatch_us_median":)" + std::to_string(d) +
         R"(,"combine_us_median":)" + std::to_string(c) + R"(,"total_us_median":)" + std::to_string(d + c) +
         R"(,"total_us_p99":)" + std::to_string(1.2 * (d + c)) + R"(,"hidden":7168})";
}

double category(const PlanPoint& p, const std::string& k) {
  for (const auto& [name, v] : p.moe_breakdown_us)
    if (name == k) return v;
  return -1;
}

DeployConfig ep128(int batch, Schedule s) {
  DeployConfig c;
  c.ep = 128;
  c.batch = batch;
  c.schedule = s;
  return c;
}

}  // namespace

TEST(PlanCalibration, KeepsOnlyTheChosenSystemAndModel) {
  const ModelSpec m = load_model("deepseek-v3");
  const Json j = bench(row("epkit", 128, 256, 593, 1012) + "," + row("nccl", 128, 256, 5000, 5000) + "," +
                       row("epkit", 128, 256, 1, 1, "mixtral") + "," + row("epkit", 8, 256, 90, 160, "dsv3"));
  const Calibration cal = calibration_from_json(j, m);
  ASSERT_EQ(cal.comm.size(), 2u);
  EXPECT_EQ(calibration_from_json(j, m, "nccl").comm.size(), 1u);
}

TEST(PlanCalibration, MeasuredTermsReplaceModelledOnes) {
  const ModelSpec m = load_model("deepseek-v3");
  const GpuSpec g = load_gpu("h100");
  // The deployment study's measured EP128 numbers at batch 128, query 2: 256 tokens per rank.
  const Calibration cal = calibration_from_json(bench(row("epkit", 128, 256, 593, 1012)), m);
  const PlanPoint p = estimate(m, g, ep128(128, Schedule::kNoOverlap), {}, &cal);
  EXPECT_NEAR(category(p, "dispatch"), 593, 1e-6);  // no overlap: the whole measured time is exposed
  EXPECT_NEAR(category(p, "combine"), 1012, 1e-6);
  EXPECT_EQ(p.measured_terms, (std::vector<std::string>{"dispatch", "combine"}));
  for (const auto& t : p.modelled_terms) EXPECT_NE(t, "dispatch");
  // Without calibration the same terms are modelled, and the time differs.
  const PlanPoint q = estimate(m, g, ep128(128, Schedule::kNoOverlap));
  EXPECT_TRUE(q.measured_terms.empty());
  EXPECT_NE(category(q, "dispatch"), category(p, "dispatch"));
  // Unmatched configs (other token counts, other EP) stay modelled.
  EXPECT_TRUE(estimate(m, g, ep128(4, Schedule::kNoOverlap), {}, &cal).measured_terms.empty());
}

TEST(PlanCalibration, InterpolatesInsideTheMeasuredRangeOnly) {
  const ModelSpec m = load_model("deepseek-v3");
  const Calibration cal =
      calibration_from_json(bench(row("epkit", 128, 128, 300, 500) + "," + row("epkit", 128, 512, 1100, 2100)), m);
  auto mid = lookup_comm(cal, 128, 256);
  ASSERT_TRUE(mid.has_value());
  EXPECT_TRUE(mid->interpolated);
  EXPECT_NEAR(mid->dispatch_us, 300 + (1100 - 300) / 3.0, 1e-9);
  EXPECT_NEAR(mid->combine_us, 500 + (2100 - 500) / 3.0, 1e-9);
  EXPECT_FALSE(lookup_comm(cal, 128, 64).has_value());
  EXPECT_FALSE(lookup_comm(cal, 128, 1024).has_value());
  EXPECT_FALSE(lookup_comm(cal, 64, 256).has_value());
  const PlanPoint p = estimate(m, load_gpu("h100"), ep128(128, Schedule::kNoOverlap), {}, &cal);
  EXPECT_EQ(p.measured_terms, (std::vector<std::string>{"dispatch (interpolated)", "combine (interpolated)"}));
}

TEST(PlanCalibration, OverlapStillHidesMeasuredTransfers) {
  const ModelSpec m = load_model("deepseek-v3");
  const Calibration cal = calibration_from_json(bench(row("epkit", 128, 128, 300, 500) + "," +
                                                      row("epkit", 128, 256, 593, 1012)), m);
  const GpuSpec g = load_gpu("h100");
  const double none = estimate(m, g, ep128(128, Schedule::kNoOverlap), {}, &cal).moe_layer_time_us;
  const double mb = estimate(m, g, ep128(128, Schedule::kMicroBatch), {}, &cal).moe_layer_time_us;
  EXPECT_LT(mb, none);
}

TEST(PlanCalibration, MalformedRowsNameTheField) {
  const ModelSpec m = load_model("deepseek-v3");
  auto msg = [&](const std::string& text) {
    try {
      calibration_from_json(Json::parse(text), m);
    } catch (const epkit::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg(R"({"results":[]})").find("rows"), std::string::npos);
  EXPECT_NE(msg(R"({"rows":[{"system":"epkit","world_size":8,"tokens":16,"combine_us_median":1,"total_us_median":2}]})")
                .find("dispatch_us_median"), std::string::npos);
  EXPECT_NE(msg(R"({"rows":[{"system":"mpi","world_size":8,"tokens":16,"dispatch_us_median":1,"combine_us_median":1,"total_us_median":2}]})")
                .find("mpi"), std::string::npos);
  EXPECT_NE(msg(R"({"rows":[{"system":"epkit","world_size":8,"tokens":0,"dispatch_us_median":1,"combine_us_median":1,"total_us_median":2}]})")
                .find("rows[0].tokens = 0"), std::string::npos);
  EXPECT_THROW(load_calibration("/nonexistent/bench.json", m), epkit::Error);
}

TEST(PlanCalibration, BenchPresetsMatchByTheirShapeFields) {
  // epkit-bench names workloads ("decode", "prefill"), not models; its rows carry the shape. These rows
  // are synthetic, with the field names and values epkit-bench writes.
  const ModelSpec m = load_model("deepseek-v3");
  auto decode = [](const std::string& preset, int hidden, int experts, int topk, const std::string& path,
                   const std::string& dtype, int tokens) {
    return R"({"preset":")" + preset + R"(","tokens":)" + std::to_string(tokens) +
           R"(,"world_size":2,"system":"epkit","dp_size":1,"hidden":)" + std::to_string(hidden) + R"(,"experts":)" +
           std::to_string(experts) + R"(,"topk":)" + std::to_string(topk) + R"(,"dispatch_dtype":")" + dtype +
           R"(","combine_dtype":"bf16","routing":"uniform","path":")" + path +
           R"(","dispatch_us_median":20,"combine_us_median":21,"total_us_median":41})";
  };
  const Calibration cal = calibration_from_json(
      bench(decode("decode", 7168, 256, 8, "auto", "fp8_e4m3", 1) + "," +
            decode("decode-v2lite", 2048, 64, 6, "auto", "fp8_e4m3", 2) + "," +
            decode("decode", 7168, 256, 8, "auto+weights-at-dispatch", "fp8_e4m3", 3) + "," +
            decode("decode", 7168, 256, 8, "auto", "bf16", 4) + "," + decode("prefill", 7168, 256, 8, "auto", "fp8_e4m3", 4096)),
      m);
  ASSERT_EQ(cal.comm.size(), 2u);
  EXPECT_EQ(cal.comm[0].tokens, 1);
  EXPECT_EQ(cal.comm[1].tokens, 4096);
  // The V2-Lite rows are that model's.
  ModelSpec lite = m;
  lite.name = "v2-lite", lite.hidden = 2048, lite.num_routed_experts = 64, lite.top_k = 6;
  EXPECT_EQ(calibration_from_json(bench(decode("decode-v2lite", 2048, 64, 6, "auto", "fp8_e4m3", 2)), lite).comm.size(), 1u);
}
