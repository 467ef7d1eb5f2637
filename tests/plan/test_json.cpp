// The planner's JSON reader/writer: round trips, escapes, and rejection of malformed input.
#include <gtest/gtest.h>

#include "epkit/error.hpp"
#include "epkit/plan/json.hpp"

using epkit::plan::Json;

TEST(PlanJson, RoundTripKeepsOrderAndValues) {
  const std::string text = R"({"b":1,"a":[true,false,null,-2.5,1e3],"s":"x\"y\\z\n","o":{}})";
  Json j = Json::parse(text);
  EXPECT_EQ(j.dump(), R"({"b":1,"a":[true,false,null,-2.5,1000],"s":"x\"y\\z\n","o":{}})");
  EXPECT_EQ(Json::parse(j.dump(2)).dump(), j.dump());
  EXPECT_DOUBLE_EQ(j.at("a").as_array()[3].as_number(), -2.5);
}

TEST(PlanJson, UnicodeEscapes) {
  Json j = Json::parse(R"("\u00e9\ud83d\ude00")");
  EXPECT_EQ(j.as_string(), "\xC3\xA9\xF0\x9F\x98\x80");
  EXPECT_THROW(Json::parse(R"("\ud83d")"), epkit::Error);
}

TEST(PlanJson, SimpleEscapesAndControlCharacters) {
  const Json j = Json::parse(R"("q\"b\\s\/b\bf\fn\nr\rt\tu\u0001")");
  EXPECT_EQ(j.as_string(), std::string("q\"b\\s/b\bf\fn\nr\rt\tu\x01"));
  EXPECT_EQ(Json::parse(j.dump()).as_string(), j.as_string());
  EXPECT_THROW(Json::parse(R"("\x")"), epkit::Error);
  EXPECT_THROW(Json::parse(R"("\u12g4")"), epkit::Error);
}

TEST(PlanJson, RejectsMalformedInput) {
  for (const char* bad : {"", "{", "[1,]", "{\"a\":1,}", "01", "+1", "1.", ".5", "NaN", "\"abc", "tru", "[1] 2",
                          "{\"a\" 1}", "\"a\tb\"", "{1:2}"}) {
    EXPECT_THROW(Json::parse(bad), epkit::Error) << bad;
  }
}

TEST(PlanJson, TypeErrorsNameTheField) {
  Json j = Json::parse(R"({"n":"seven"})");
  try {
    j.at("n").as_number("spec.n");
    FAIL() << "no throw";
  } catch (const epkit::Error& e) {
    EXPECT_NE(std::string(e.what()).find("spec.n"), std::string::npos);
  }
  EXPECT_THROW(j.at("missing"), epkit::Error);
}

TEST(PlanJson, NonFiniteNumbersAreWrittenAsNull) {
  Json j = Json::object();
  j.set("x", 1.0 / 0.0);
  EXPECT_EQ(j.dump(), R"({"x":null})");
}
