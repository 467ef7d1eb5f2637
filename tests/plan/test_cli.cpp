// The epkit-plan command line: explain's JSON fields, sweep outputs, user spec files, and input errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "epkit/error.hpp"
#include "epkit/plan/cli.hpp"
#include "epkit/plan/json.hpp"
#include "plan/plan_testing.hpp"
#include "epkit/plan/specs.hpp"

using namespace epkit::plan;
using namespace epkit::plan::testing_util;

namespace {

std::string run(const std::vector<std::string>& args) {
  std::ostringstream os;
  EXPECT_EQ(run_cli(args, os), 0);
  return os.str();
}

std::string error_of(const std::vector<std::string>& args) {
  std::ostringstream os;
  try {
    run_cli(args, os);
  } catch (const epkit::Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST(PlanCli, ExplainJsonHasTheIssueFields) {
  const Json j = Json::parse(run({"explain", "--model", "deepseek-v3", "--gpu", "h200", "--nodes", "1", "--ep", "8",
                                  "--tp", "1", "--batch", "128", "--json"}));
  for (const char* k : {"kv_bytes_per_token", "weights_bytes_per_gpu", "max_batch_per_gpu", "tokens_per_expert",
                        "layer_time_us", "output_tokens_per_s_per_request", "throughput_tokens_per_s_per_node", "fits",
                        "layer_breakdown_us", "measured_terms", "modelled_terms"})
    EXPECT_NE(j.find(k), nullptr) << k;
  EXPECT_DOUBLE_EQ(j.at("kv_bytes_per_token").as_number(), 70272);
  EXPECT_FALSE(j.at("fits").as_bool());
  EXPECT_NEAR(j.at("weights_bytes_per_gpu").as_number(), 100e9, 5e9);
  EXPECT_NEAR(j.at("max_batch_per_gpu").as_number(), 100, 15);
  EXPECT_DOUBLE_EQ(j.at("tokens_per_expert").as_number(), 128.0 * 2 * 8 * 8 / 256);
  EXPECT_GT(j.at("layer_time_us").as_number(), 0);
}

TEST(PlanCli, ExplainM1024AndContextOption) {
  const Json j = Json::parse(run({"explain", "--gpu", "h100", "--nodes", "16", "--ep", "128", "--batch", "128",
                                  "--query-len", "2", "--json"}));
  EXPECT_DOUBLE_EQ(j.at("tokens_per_expert").as_number(), 1024);
  EXPECT_TRUE(j.at("fits").as_bool());
  const Json shorter = Json::parse(run({"explain", "--ep", "8", "--batch", "1", "--context", "2500", "--json"}));
  const Json longer = Json::parse(run({"explain", "--ep", "8", "--batch", "1", "--json"}));
  EXPECT_GT(shorter.at("max_batch_per_gpu").as_number(), 1.9 * longer.at("max_batch_per_gpu").as_number());
  EXPECT_NE(run({"explain", "--ep", "8", "--batch", "4"}).find("one MoE layer"), std::string::npos);
}

TEST(PlanCli, SweepTableCsvAndJson) {
  const std::string table = run({});
  EXPECT_NE(table.find("EP8 (1 x h200) Pareto frontier"), std::string::npos);
  EXPECT_NE(table.find("EP128 (16 x h100-sxm) Pareto frontier"), std::string::npos);
  const std::string csv = run({"--csv", "--ep", "8,128"});
  EXPECT_EQ(csv.rfind("model,gpu,ep,dp,tp", 0), 0u);
  // Every line has as many fields as the header, breakdown columns included.
  std::istringstream lines(csv);
  std::string line, header;
  std::getline(lines, header);
  EXPECT_NE(header.find("group_gemm_us"), std::string::npos);
  const auto fields = [](const std::string& l) { return std::count(l.begin(), l.end(), ',') + 1; };
  int rows = 0;
  while (std::getline(lines, line)) {
    EXPECT_EQ(fields(line), fields(header)) << line;
    ++rows;
  }
  EXPECT_GT(rows, 5);
  const Json j = Json::parse(run({"sweep", "--json", "--ep", "8,128", "--batch", "1,32,128"}));
  const auto& points = j.at("points").as_array();
  EXPECT_FALSE(points.empty());
  for (const auto& idx : j.at("pareto").at("ep128").as_array()) {
    const Json& p = points.at(static_cast<size_t>(idx.as_number()));
    EXPECT_TRUE(p.at("fits").as_bool());
    EXPECT_DOUBLE_EQ(p.at("config").at("ep").as_number(), 128);
  }
  EXPECT_NE(j.at("summary").find("band_ratio_40_80"), nullptr);
}

TEST(PlanCli, QueryLengthFollowsTheModelsMtp) {
  const Json ds = Json::parse(run({"explain", "--ep", "8", "--batch", "4", "--json"}));
  EXPECT_DOUBLE_EQ(ds.at("config").at("query_len").as_number(), 2);
  EXPECT_DOUBLE_EQ(ds.at("tokens_per_step").as_number(), 1.6);
  const Json mx = Json::parse(run({"explain", "--model", "mixtral-8x7b", "--ep", "8", "--batch", "4", "--json"}));
  EXPECT_DOUBLE_EQ(mx.at("config").at("query_len").as_number(), 1);
  EXPECT_DOUBLE_EQ(mx.at("tokens_per_step").as_number(), 1);
  const Json forced = Json::parse(run({"explain", "--model", "mixtral", "--query-len", "3", "--json"}));
  EXPECT_DOUBLE_EQ(forced.at("config").at("query_len").as_number(), 3);
}

TEST(PlanCli, UserSpecFiles) {
  Json g = to_json(load_gpu("h100"));
  g.set("name", "my-gpu").set("hbm_capacity_gb", 192.0).set("network_gbit_per_s", 800.0);
  Json m = to_json(load_model("deepseek-v3"));
  m.set("name", "tiny-moe").set("num_layers", 4).set("num_dense_layers", 1);
  const std::string gp = temp_file("plan_gpu.json", g.dump(2)), mp = temp_file("plan_model.json", m.dump(2));
  const Json j = Json::parse(run({"explain", "--model", mp, "--gpu", gp, "--ep", "8", "--batch", "8", "--json"}));
  EXPECT_EQ(j.at("gpu").as_string(), "my-gpu");
  EXPECT_EQ(j.at("model").as_string(), "tiny-moe");
  EXPECT_DOUBLE_EQ(j.at("kv_bytes_per_token").as_number(), 4.0 * 576 * 2);
  const std::string broken = temp_file("plan_broken.json", "{\"name\": \"x\",");
  EXPECT_NE(error_of({"explain", "--gpu", broken}).find("plan_broken.json"), std::string::npos);
}

TEST(PlanCli, BadInputNamesValueAndLimit) {
  EXPECT_NE(error_of({"explain", "--ep", "12"}).find("ep = 12"), std::string::npos);
  EXPECT_NE(error_of({"explain", "--batch", "0"}).find("--batch = 0 must be in [1"), std::string::npos);
  EXPECT_NE(error_of({"explain", "--batch", "12x"}).find("'12x' is not an integer"), std::string::npos);
  EXPECT_NE(error_of({"explain", "--acceptance", "1.5"}).find("--acceptance = 1.5 must be in [0, 1]"),
            std::string::npos);
  EXPECT_NE(error_of({"explain", "--ep", "8", "--nodes", "2"}).find("--nodes = 2"), std::string::npos);
  EXPECT_NE(error_of({"explain", "--ep", "16", "--tp", "16"}).find("gpus_per_node = 8"), std::string::npos);
  EXPECT_NE(error_of({"explain", "--gpu", "a100"}).find("unknown GPU 'a100'"), std::string::npos);
  EXPECT_NE(error_of({"explain", "--model", "llama"}).find("unknown model 'llama'"), std::string::npos);
  EXPECT_NE(error_of({"explain", "--schedule", "fast"}).find("unknown schedule 'fast'"), std::string::npos);
  EXPECT_NE(error_of({"--frobnicate"}).find("unknown option '--frobnicate'"), std::string::npos);
  EXPECT_NE(error_of({"explain", "--ep"}).find("--ep needs a value"), std::string::npos);
  EXPECT_NE(error_of({"--json", "--csv"}).find("exclusive"), std::string::npos);
  EXPECT_NE(error_of({"--eff", "comm=2"}).find("must be in [1e-06, 1]"), std::string::npos);
  EXPECT_NE(error_of({"--model", "mixtral", "--ep", "16,32"}).find("no valid point"), std::string::npos);
  EXPECT_NE(error_of({"--calibrate", "/nonexistent.json"}).find("/nonexistent.json"), std::string::npos);
}
