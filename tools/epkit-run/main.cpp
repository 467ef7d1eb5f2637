// epkit-run: launches N local ranks of a command (see launcher.hpp; `epkit-run --help`).
#include <iostream>
#include <string>
#include <vector>

#include "epkit/error.hpp"
#include "launcher.hpp"

int main(int argc, char** argv) {
  epkit::run::LaunchOptions opt;
  try {
    opt = epkit::run::parse_args(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const epkit::Error& e) {
    std::cerr << "epkit-run: " << e.what() << "\n\n" << epkit::run::usage();
    return epkit::run::kExitUsage;
  }
  if (opt.show_help) {
    std::cout << epkit::run::usage();
    return 0;
  }
  try {
    return epkit::run::launch(opt);
  } catch (const std::exception& e) {
    std::cerr << "[epkit-run] error: " << e.what() << "\n";
    return 1;
  }
}
