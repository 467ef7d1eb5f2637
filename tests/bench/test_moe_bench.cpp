// CPU tests of epkit-moe's options, derived rates, the uneven-count generator and its JSON.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "bench_core.hpp"
#include "epkit/error.hpp"

namespace epkit::moebench {
namespace {

std::string error_of(const std::vector<std::string>& a) {
  try {
    parse_options(a);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(MoeBenchOptions, ModesListsAndErrors) {
  Options o = parse_options({});
  EXPECT_EQ(o.mode, "kernels");
  EXPECT_EQ(o.groups, (std::vector<int>{2, 8, 16, 32, 64}));
  o = parse_options({"layer", "--experts", "32", "--batches", "1,128", "--schedules", "none,microbatch", "--json", "x.json"});
  EXPECT_EQ(o.mode, "layer");
  EXPECT_EQ(o.experts, std::vector<int>{32});
  EXPECT_EQ(o.batches, (std::vector<int>{1, 128}));
  EXPECT_EQ(o.schedules, (std::vector<std::string>{"none", "microbatch"}));
  EXPECT_EQ(o.json, "x.json");
  EXPECT_NE(error_of({"--kernels", "gemm"}).find("'gemm' is not one of"), std::string::npos);
  EXPECT_NE(error_of({"--groups", "0"}).find("0 is outside [1, 512]"), std::string::npos);
  EXPECT_NE(error_of({"--m", "x"}).find("'x' is not an integer"), std::string::npos);
  EXPECT_NE(error_of({"--schedules", "pipelined"}).find("'pipelined' is not one of"), std::string::npos);
  EXPECT_NE(error_of({"--bogus"}).find("unknown option '--bogus'"), std::string::npos);
  EXPECT_NE(error_of({"--json"}).find("--json needs a value"), std::string::npos);
  EXPECT_EQ(o.router_kernels, std::vector<std::string>{"auto"});
  EXPECT_EQ(o.rounds, 1);
  o = parse_options({"--kernels", "router", "--router-kernels", "general,warp_grouped", "--rounds", "3"});
  EXPECT_EQ(o.router_kernels, (std::vector<std::string>{"general", "warp_grouped"}));
  EXPECT_EQ(o.rounds, 3);
  EXPECT_NE(error_of({"--router-kernels", "fast"}).find("'fast' is not one of auto, general, warp_grouped"),
            std::string::npos);
  EXPECT_NE(error_of({"--rounds", "0"}).find("0 is outside [1, 100]"), std::string::npos);
}

TEST(MoeBenchRows, RatesAndTheCeilingThatBinds) {
  Row r;
  r.us_median = 100, r.bytes = 4e8, r.weight_bytes = 3e8, r.flops = 1e11;  // 4 TB/s, 3 TB/s weights, 1 PFLOP/s
  finish_row(r, 4000, 1500);
  EXPECT_DOUBLE_EQ(r.GBps, 4000);
  EXPECT_DOUBLE_EQ(r.weight_GBps, 3000);
  EXPECT_DOUBLE_EQ(r.TFLOPs, 1000);
  EXPECT_EQ(r.bound, "hbm");  // 3000/4000 = 75% of HBM on weights > 1000/1500 = 66.7% of FP8
  EXPECT_DOUBLE_EQ(r.pct_of_ceiling, 75);
  Row c = r;
  c.flops = 1.4e11;
  finish_row(c, 4000, 1500);
  EXPECT_EQ(c.bound, "fp8");
  EXPECT_NEAR(c.pct_of_ceiling, 100.0 * 1400 / 1500, 1e-9);
  Row q;  // no weights: the bandwidth term is on all bytes
  q.us_median = 10, q.bytes = 3.6e7;
  finish_row(q, 4000, 1500);
  EXPECT_DOUBLE_EQ(q.pct_of_ceiling, 90);
}

TEST(MoeBenchRows, UnevenCountsKeepTheTotalAndTheBounds) {
  std::mt19937 rng(std::random_device{}());
  for (int it = 0; it < 200; ++it) {
    const int G = 4 + static_cast<int>(rng() % 61), m = 3 + static_cast<int>(rng() % 4094);
    const std::vector<int32_t> h = uneven_counts(G, m);
    ASSERT_EQ(static_cast<int>(h.size()), G);
    EXPECT_EQ(std::accumulate(h.begin(), h.end(), 0L), static_cast<long>(G) * m) << "G " << G << " m " << m;
    EXPECT_EQ(std::count(h.begin(), h.end(), 0), G / 4) << "G " << G << " m " << m;
    EXPECT_LE(*std::max_element(h.begin(), h.end()), 2 * m);
    EXPECT_GE(*std::min_element(h.begin(), h.end()), 0);
  }
}

// tools/epkit-moe/deepgemm_baseline.py times DeepGEMM on the uneven counts of this generator: its
// Python copy must give the same rows, group for group.
TEST(MoeBenchRows, DeepGemmBaselineUsesTheSameUnevenCounts) {
  const std::string script = EPKIT_MOE_TOOLS_DIR "/deepgemm_baseline.py";
  if (std::system("python3 -c 'import sys' >/dev/null 2>&1") != 0) GTEST_SKIP() << "no python3 on this machine";
  std::vector<std::pair<int, int>> cases;
  std::string arg;
  for (int G : {4, 5, 7, 8, 16, 32, 64})
    for (int m : {3, 8, 32, 64, 128, 512, 1000, 1024, 4096}) {
      cases.push_back({G, m});
      arg += (arg.empty() ? "" : "/") + std::to_string(G) + "," + std::to_string(m);
    }
  const std::string cmd = "python3 " + script + " --uneven-counts " + arg;
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr) << cmd;
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  ASSERT_EQ(pclose(p), 0) << cmd << ": " << out;
  std::istringstream lines(out);
  for (const auto& [G, m] : cases) {
    std::string line;
    ASSERT_TRUE(std::getline(lines, line)) << "no line for G " << G << " m " << m;
    std::istringstream in(line);
    std::vector<int32_t> py;
    for (int32_t v; in >> v;) py.push_back(v);
    EXPECT_EQ(py, uneven_counts(G, m)) << "G " << G << " m " << m;
  }
}

TEST(MoeBenchJson, RowsCeilingsAndMergeKeepsOtherSystems) {
  Row e;
  e.kernel = "grouped_gemm", e.system = "epkit", e.variant = "up_gate", e.G = 32, e.m = 8, e.N = 4096, e.K = 7168;
  e.us_median = 230, e.pct_of_ceiling = 90, e.bound = "hbm";
  const plan::Json meta = plan::Json::object().set("commit", "abc");
  plan::Json old = plan::Json::parse(R"({"rows": [{"system": "torch", "kernel": "router"}, {"system": "epkit", "kernel": "old"}]})");
  const plan::Json doc = results_json(meta, 4530, 1458, "cuBLASLt", {e}, &old);
  EXPECT_EQ(doc.at("ceilings").at("hbm_read_GBps").as_number(), 4530);
  EXPECT_EQ(doc.at("ceilings").at("fp8_dense_TFLOPs").as_number(), 1458);
  const auto& rows = doc.at("rows").as_array();
  ASSERT_EQ(rows.size(), 2u);  // torch kept, the old epkit row replaced by this run's
  EXPECT_EQ(rows[0].at("system").as_string(), "torch");
  EXPECT_EQ(rows[1].at("kernel").as_string(), "grouped_gemm");
  for (const char* k : {"kernel", "system", "G", "m", "N", "K", "us_median", "pct_of_ceiling"})
    EXPECT_NE(rows[1].find(k), nullptr) << k;  // the fields docs/BENCH.md documents
  LayerRow l;
  l.schedule = "none", l.layout = "masked", l.experts = 256, l.batch = 1, l.query_len = 2, l.tokens = 2;
  l.us_median = 285, l.graph_us_median = 263, l.steps = {{"gate", 6.8}};
  const plan::Json j = layer_row_json(l);
  for (const char* k : {"schedule", "world_size", "experts", "batch", "query_len", "us_median", "graph_us_median",
                        "gate_router"})
    EXPECT_NE(j.find(k), nullptr) << k;  // the fields docs/BENCH.md documents
  EXPECT_EQ(j.at("breakdown").as_array().size(), 1u);
}

}  // namespace
}  // namespace epkit::moebench
