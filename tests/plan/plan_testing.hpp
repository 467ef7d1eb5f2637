// Helpers shared by the planner's CPU tests (one binary, test_plan).
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "epkit/plan/config.hpp"

namespace epkit::plan::testing_util {

// A deployment point of one node-group: EP, TP, batch per GPU and the overlap schedule.
inline DeployConfig cfg(int ep, int tp, int batch, Schedule s = Schedule::kNoOverlap) {
  DeployConfig c;
  c.ep = ep;
  c.tp = tp;
  c.batch = batch;
  c.schedule = s;
  return c;
}

// Writes `text` to a file named `name` in the test's temporary folder; returns its path.
inline std::string temp_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

}  // namespace epkit::plan::testing_util
