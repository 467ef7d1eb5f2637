// JSON / CSV / table writers: the required fields are present, missing numbers render as null /
// empty, strings are escaped, and JSON and CSV carry the same field list.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "report.hpp"

namespace epkit::bench {
namespace {

Report sample_report() {
  Report r;
  r.meta = {{"gpu", "NVIDIA H200"}, {"git_commit", "abc\"def"}};
  r.ceilings.p2p_gbps = 393.5;
  r.ceilings.p2p_bytes = 256 << 20;
  r.ceilings.p2p_method = "cudaMemcpyAsync";
  r.ceilings.hbm_copy_gbps = 4012.5;
  r.ceilings.hbm_copy_bytes = 256 << 20;
  r.ceilings.launch_floor_blocks = 64;
  r.ceilings.empty_kernel_us_median = 4.5;
  r.ceilings.empty_one_warp_us_median = 4.25;  // flag_exchange left unmeasured: must print null
  Row e;
  e.preset = "decode";
  e.tokens = 128;
  e.world_size = 2;
  e.system = "epkit";
  e.samples = 200;
  e.dispatch_us_median = 30.25;
  e.combine_us_median = 40.5;
  e.total_us_median = 71.0;
  e.total_us_p99 = 80.0;
  e.dispatch_pct_of_ceiling = 12.5;
  e.combine_pct_of_ceiling = 20.0;
  e.symmetric_bytes = 123456789;
  e.graph_total_us_median = 60.0;
  e.layout = "packed";
  Row n = e;
  n.layout = "";
  n.system = "nccl";
  n.note = "padded, \"grouped\"";
  n.graph_total_us_median = kNotMeasured;
  r.rows = {e, n};
  return r;
}

TEST(BenchReport, JsonHasRequiredFields) {
  std::ostringstream os;
  write_json(os, sample_report());
  const std::string j = os.str();
  for (const char* key : {"\"rows\": [", "\"preset\": \"decode\"", "\"tokens\": 128", "\"world_size\": 2",
                          "\"system\": \"epkit\"", "\"system\": \"nccl\"", "\"dispatch_us_median\": 30.25",
                          "\"combine_us_median\": 40.5", "\"total_us_median\": 71", "\"total_us_p99\": 80",
                          "\"dispatch_pct_of_ceiling\": 12.5", "\"combine_pct_of_ceiling\": 20",
                          "\"symmetric_bytes\": 123456789", "\"graph_total_us_median\": 60",
                          "\"graph_total_us_median\": null", "\"dispatch_send_us_median\": null",
                          "\"p2p_gbps\": 393.5", "\"gpu\": \"NVIDIA H200\"", "\"git_commit\": \"abc\\\"def\"",
                          "\"note\": \"padded, \\\"grouped\\\"\"", "\"launch_floor_blocks\": 64",
                          "\"empty_kernel_us_median\": 4.5", "\"empty_one_warp_us_median\": 4.25",
                          "\"flag_exchange_us_median\": null", "\"hbm_copy_gbps\": 4012.5",
                          "\"hbm_copy_us_median\": null", "\"hbm_copy_bytes\": 268435456",
                          "\"layout\": \"packed\"", "\"layout\": \"\""}) {
    EXPECT_NE(j.find(key), std::string::npos) << key << "\n" << j;
  }
  EXPECT_EQ(j.find("nan"), std::string::npos);
}

TEST(BenchReport, SetBandwidthUsesMedianTimesAndCeiling) {
  Row r;
  r.dispatch_us_median = 10.0;
  r.combine_us_median = 20.0;
  set_bandwidth(r, 2e6, 1e6, 400.0);  // 2 MB in 10 us = 200 GB/s, 1 MB in 20 us = 50 GB/s
  EXPECT_DOUBLE_EQ(r.dispatch_bytes_per_rank, 2e6);
  EXPECT_DOUBLE_EQ(r.dispatch_gbps, 200.0);
  EXPECT_DOUBLE_EQ(r.combine_gbps, 50.0);
  EXPECT_DOUBLE_EQ(r.dispatch_pct_of_ceiling, 50.0);
  EXPECT_DOUBLE_EQ(r.combine_pct_of_ceiling, 12.5);
  Row unmeasured = r;
  set_bandwidth(unmeasured, 2e6, 1e6, kNotMeasured);  // no ceiling: no percentage
  EXPECT_TRUE(std::isnan(unmeasured.dispatch_pct_of_ceiling));
}

TEST(BenchReport, CsvMatchesFieldList) {
  std::ostringstream os;
  write_csv(os, sample_report());
  std::istringstream is(os.str());
  std::string header, line1, line2;
  std::getline(is, header);
  std::getline(is, line1);
  std::getline(is, line2);
  const auto& fields = row_fields();
  std::string expect_header;
  for (size_t i = 0; i < fields.size(); ++i) expect_header += (i ? "," : "") + std::string(fields[i].name);
  EXPECT_EQ(header, expect_header + ",ceiling_p2p_gbps,ceiling_put_signal_us_median,ceiling_hbm_copy_gbps");
  EXPECT_EQ(line1.substr(line1.size() - 14), ",393.5,,4012.5") << line1;  // latency ceiling not measured: empty
  EXPECT_EQ(line1.rfind("decode,128,2,epkit,", 0), 0u) << line1;
  EXPECT_NE(line1.find(",30.25,"), std::string::npos);
  EXPECT_NE(line1.find(",123456789,"), std::string::npos);
  EXPECT_NE(line2.find("\"padded, \"\"grouped\"\"\""), std::string::npos) << line2;
  EXPECT_NE(line2.find(",,"), std::string::npos);  // unmeasured numbers are empty cells
  for (const char* name : {"preset", "tokens", "world_size", "system", "dispatch_us_median", "combine_us_median",
                           "total_us_median", "total_us_p99", "dispatch_pct_of_ceiling", "combine_pct_of_ceiling",
                           "symmetric_bytes", "dispatch_send_us_median", "dispatch_recv_us_p99",
                           "combine_send_us_median", "combine_recv_us_p99", "graph_total_us_median",
                           "workspace_bytes"}) {
    EXPECT_NE(header.find(name), std::string::npos) << name;
  }
}

TEST(BenchReport, TableAndPercent) {
  std::ostringstream os;
  print_table(os, sample_report());
  EXPECT_NE(os.str().find("decode"), std::string::npos);
  EXPECT_NE(os.str().find("393.5 GB/s"), std::string::npos);
  EXPECT_DOUBLE_EQ(pct_of(196.75, 393.5), 50.0);
  EXPECT_TRUE(std::isnan(pct_of(10, kNotMeasured)));
  EXPECT_TRUE(std::isnan(pct_of(10, 0)));
  EXPECT_EQ(json_quote("a\nb\x01"), "\"a\\nb\\u0001\"");
}

TEST(BenchReport, RunNotesSayWhatTheTimingsMean) {
  EXPECT_TRUE(run_notes(2, 2, false, 200).empty());
  const auto one = run_notes(1, 1, false, 200);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_NE(one[0].find("world size 1"), std::string::npos) << one[0];
  EXPECT_NE(one[0].find("no link"), std::string::npos) << one[0];
  EXPECT_NE(one[0].find("epkit-run -n N"), std::string::npos) << one[0];
  const auto shared = run_notes(4, 1, true, 20);
  ASSERT_EQ(shared.size(), 2u);
  EXPECT_NE(shared[0].find("4 ranks share 1 GPU"), std::string::npos) << shared[0];
  EXPECT_NE(shared[1].find("--smoke: 20 samples"), std::string::npos) << shared[1];

  Report r = sample_report();
  r.notes = shared;
  std::ostringstream table, json;
  print_table(table, r);
  EXPECT_EQ(table.str().rfind("NOTE: 4 ranks share", 0), 0u) << table.str();  // first, above the numbers
  write_json(json, r);
  EXPECT_NE(json.str().find("\"notes\": [\"4 ranks share"), std::string::npos) << json.str();
  std::ostringstream none;
  write_json(none, sample_report());
  EXPECT_NE(none.str().find("\"notes\": [],\n  \"ceilings\""), std::string::npos) << none.str();
}

}  // namespace
}  // namespace epkit::bench
