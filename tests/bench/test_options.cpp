// Option parsing: defaults, overrides, and errors that name the option, the value and the limit.
#include <gtest/gtest.h>

#include <string>

#include "epkit/error.hpp"
#include "options.hpp"

namespace epkit::bench {
namespace {

std::string error_of(const std::vector<std::string>& args) {
  try {
    parse_options(args);
  } catch (const epkit::Error& e) {
    return e.what();
  }
  return "";
}

TEST(BenchOptions, Defaults) {
  const Options o = parse_options({});
  EXPECT_EQ(o.presets, (std::vector<std::string>{"decode", "decode-v2lite", "prefill"}));
  EXPECT_EQ(o.iters, 200);
  EXPECT_TRUE(o.baselines);
  EXPECT_FALSE(o.portable);
  EXPECT_FALSE(o.tokens.has_value());
  EXPECT_EQ(o.dp_size, 1);
  EXPECT_FALSE(o.profile_graph);
}

TEST(BenchOptions, Overrides) {
  const Options o = parse_options({"--preset", "decode", "--preset=prefill,decode-v2lite", "--tokens", "1,8,128",
                                   "--hidden=4096", "--experts", "64", "--topk", "4", "--dispatch-dtype", "bf16",
                                   "--dp-size", "2", "--routing", "skewed", "--iters", "500", "--warmup", "0",
                                   "--portable", "--num-sms", "24", "--json", "out.json", "--csv", "out.csv",
                                   "--no-baselines", "--nccl-mode", "sendrecv", "--zipf-s", "1.2"});
  EXPECT_EQ(o.presets, (std::vector<std::string>{"decode", "prefill", "decode-v2lite"}));
  EXPECT_EQ(*o.tokens, (std::vector<int>{1, 8, 128}));
  EXPECT_EQ(*o.hidden, 4096);
  EXPECT_EQ(*o.experts, 64);
  EXPECT_EQ(*o.topk, 4);
  EXPECT_EQ(*o.dispatch_dtype, DType::kBF16);
  EXPECT_EQ(o.dp_size, 2);
  EXPECT_EQ(o.routing, RoutingKind::kSkewed);
  EXPECT_EQ(o.iters, 500);
  EXPECT_EQ(o.warmup, 0);
  EXPECT_TRUE(o.portable);
  EXPECT_EQ(o.num_sms, 24);
  EXPECT_EQ(o.json_path, "out.json");
  EXPECT_EQ(o.csv_path, "out.csv");
  EXPECT_FALSE(o.baselines);
  EXPECT_EQ(o.nccl_mode, NcclMode::kSendRecv);
  EXPECT_DOUBLE_EQ(o.zipf_s, 1.2);
  EXPECT_EQ(*parse_options({"--dispatch-dtype", "fp8_e4m3"}).dispatch_dtype, DType::kFP8E4M3);
  EXPECT_TRUE(parse_options({"--profile-graph"}).profile_graph);
  EXPECT_EQ(parse_options({}).layouts, (std::vector<ExpertLayout>{ExpertLayout::kMasked}));
  EXPECT_EQ(parse_options({"--layout", "packed"}).layouts, (std::vector<ExpertLayout>{ExpertLayout::kPacked}));
  EXPECT_EQ(parse_options({"--layout=masked,packed"}).layouts,
            (std::vector<ExpertLayout>{ExpertLayout::kMasked, ExpertLayout::kPacked}));
  EXPECT_NE(error_of({"--layout", "capacity"}).find("--layout: 'capacity' is not one of masked, packed"),
            std::string::npos);
}

TEST(BenchOptions, ErrorsNameValueAndLimit) {
  std::string e = error_of({"--iters", "199"});
  EXPECT_NE(e.find("--iters"), std::string::npos) << e;
  EXPECT_NE(e.find("199"), std::string::npos) << e;
  EXPECT_NE(e.find("200"), std::string::npos) << e;
  e = error_of({"--topk", "17"});
  EXPECT_NE(e.find("17"), std::string::npos) << e;
  EXPECT_NE(e.find("16"), std::string::npos) << e;
  e = error_of({"--tokens", "1,,8"});
  EXPECT_NE(e.find("empty item"), std::string::npos) << e;
  e = error_of({"--tokens", "0"});
  EXPECT_NE(e.find("out of range"), std::string::npos) << e;
  e = error_of({"--hidden", "12x"});
  EXPECT_NE(e.find("'12x' is not an integer"), std::string::npos) << e;
  e = error_of({"--dispatch-dtype", "fp32"});
  EXPECT_NE(e.find("'fp32'"), std::string::npos) << e;
  EXPECT_NE(error_of({"--combine-dtype", "fp8"}).find("bf16, fp16"), std::string::npos);
  EXPECT_NE(error_of({"--routing", "zipf"}).find("uniform, skewed"), std::string::npos);
  EXPECT_NE(error_of({"--bogus"}).find("unknown option '--bogus'"), std::string::npos);
  EXPECT_NE(error_of({"--hidden"}).find("needs a value"), std::string::npos);
  EXPECT_NE(error_of({"--portable=1"}).find("takes no value"), std::string::npos);
  EXPECT_NE(error_of({"--zipf-s", "nan"}).find("--zipf-s"), std::string::npos);
  EXPECT_NE(error_of({"--preset", ","}).find("empty item"), std::string::npos);
}

TEST(BenchOptions, SmokeShortensOnlyWhatIsNotGiven) {
  const Options s = parse_options({"--smoke"});
  EXPECT_TRUE(s.smoke);
  EXPECT_EQ(s.iters, kSmokeIters);
  EXPECT_EQ(s.warmup, kSmokeWarmup);
  EXPECT_EQ(s.graph_iters, kSmokeGraphIters);
  EXPECT_EQ(s.ceiling_bytes, kSmokeCeilingBytes);
  const Options g = parse_options({"--iters", "300", "--smoke", "--warmup=7", "--graph-iters", "3", "--ceiling-mib", "64"});
  EXPECT_EQ(g.iters, 300);
  EXPECT_EQ(g.warmup, 7);
  EXPECT_EQ(g.graph_iters, 3);
  EXPECT_EQ(g.ceiling_bytes, size_t{64} << 20);
  EXPECT_FALSE(parse_options({}).smoke);
  EXPECT_NE(error_of({"--smoke=1"}).find("takes no value"), std::string::npos);
}

TEST(BenchOptions, UsageMentionsEveryOption) {
  const std::string u = usage();
  for (const char* opt : {"--preset", "--tokens", "--hidden", "--experts", "--topk", "--dispatch-dtype", "--dp-size",
                          "--routing", "--iters", "--warmup", "--portable", "--num-sms", "--json", "--csv", "--layout",
                          "--no-baselines", "--smoke"}) {
    EXPECT_NE(u.find(opt), std::string::npos) << opt;
  }
}

}  // namespace
}  // namespace epkit::bench
