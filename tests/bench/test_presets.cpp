// Preset table and its expansion into rows, with overrides.
#include <gtest/gtest.h>

#include "epkit/error.hpp"
#include "presets.hpp"

namespace epkit::bench {
namespace {

TEST(BenchPresets, DefaultExpansion) {
  const std::vector<Case> cases = expand_cases(parse_options({}), 2, 1);
  ASSERT_EQ(cases.size(), 7u + 7u + 1u);
  EXPECT_EQ(cases[0].preset, "decode");
  EXPECT_EQ(cases[0].num_tokens, 1);
  EXPECT_EQ(cases[6].num_tokens, 128);
  const AllToAllConfig& d = cases[6].cfg;
  EXPECT_EQ(d.world_size, 2);
  EXPECT_EQ(d.rank, 1);
  EXPECT_EQ(d.hidden, 7168);
  EXPECT_EQ(d.num_experts, 256);
  EXPECT_EQ(d.topk, 8);
  EXPECT_EQ(d.max_tokens_per_rank, 128);
  EXPECT_EQ(d.dispatch_dtype, DType::kFP8E4M3);
  EXPECT_EQ(d.combine_in_dtype, DType::kBF16);
  EXPECT_EQ(d.combine_out_dtype, DType::kBF16);
  EXPECT_EQ(d.path, DataPath::kAuto);
  const AllToAllConfig& v = cases[7].cfg;
  EXPECT_EQ(cases[7].preset, "decode-v2lite");
  EXPECT_EQ(v.hidden, 2048);
  EXPECT_EQ(v.num_experts, 64);
  EXPECT_EQ(v.topk, 6);
  EXPECT_EQ(cases[14].preset, "prefill");
  EXPECT_EQ(cases[14].num_tokens, 4096);
  EXPECT_EQ(cases[14].cfg.hidden, 7168);
}

TEST(BenchPresets, Overrides) {
  const Options o = parse_options({"--preset", "prefill", "--tokens", "64,2048", "--experts", "128", "--topk", "4",
                                   "--dispatch-dtype", "bf16", "--dp-size", "2", "--portable", "--num-sms", "16",
                                   "--max-tokens", "4096", "--capacity", "100"});
  const std::vector<Case> cases = expand_cases(o, 8, 3);
  ASSERT_EQ(cases.size(), 2u);
  for (const Case& c : cases) {
    EXPECT_EQ(c.cfg.num_experts, 128);
    EXPECT_EQ(c.cfg.topk, 4);
    EXPECT_EQ(c.cfg.dispatch_dtype, DType::kBF16);
    EXPECT_EQ(c.cfg.dp_size, 2);
    EXPECT_EQ(c.cfg.path, DataPath::kPortable);
    EXPECT_EQ(c.cfg.num_sms, 16);
    EXPECT_EQ(c.cfg.max_tokens_per_rank, 4096);
    EXPECT_EQ(c.cfg.capacity, 100);
  }
  EXPECT_EQ(cases[0].num_tokens, 64);
  EXPECT_EQ(cases[1].num_tokens, 2048);
}

TEST(BenchPresets, OneRowPerLayout) {
  const std::vector<Case> cases =
      expand_cases(parse_options({"--preset", "decode", "--tokens", "1,128", "--layout", "masked,packed"}), 1, 0);
  ASSERT_EQ(cases.size(), 4u);
  EXPECT_EQ(cases[0].num_tokens, 1);
  EXPECT_EQ(cases[0].cfg.layout, ExpertLayout::kMasked);
  EXPECT_EQ(cases[1].num_tokens, 1);
  EXPECT_EQ(cases[1].cfg.layout, ExpertLayout::kPacked);
  EXPECT_EQ(cases[3].num_tokens, 128);
  EXPECT_EQ(cases[3].cfg.layout, ExpertLayout::kPacked);
  for (const Case& c : cases) EXPECT_NO_THROW(validate(c.cfg));
}

TEST(BenchPresets, Errors) {
  try {
    expand_cases(parse_options({"--preset", "huge"}), 2, 0);
    FAIL() << "no throw";
  } catch (const epkit::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'huge'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("decode-v2lite"), std::string::npos);
  }
  EXPECT_THROW(expand_cases(parse_options({"--experts", "4", "--topk", "8"}), 2, 0), epkit::Error);
  EXPECT_THROW(expand_cases(parse_options({"--preset", "decode", "--max-tokens", "64"}), 2, 0), epkit::Error);
}

}  // namespace
}  // namespace epkit::bench
