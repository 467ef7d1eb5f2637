// epkit-plan: the deployment planner's command line (see docs/PLANNER.md).
#include <iostream>
#include <string>
#include <vector>

#include "epkit/error.hpp"
#include "epkit/plan/cli.hpp"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    return epkit::plan::run_cli(args, std::cout);
  } catch (const epkit::Error& e) {
    std::cerr << "epkit-plan: " << e.what() << "\n";
    return 2;
  }
}
