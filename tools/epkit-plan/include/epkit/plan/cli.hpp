// The epkit-plan command line, as a library function so the CPU tests can drive it.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace epkit::plan {

// Runs `epkit-plan <args>` (args exclude the program name), writing its report to `out`.
// Subcommands: sweep (default), explain, roofline, specs; `--help` prints usage. Returns 0 on success.
// Throws epkit::Error on bad input, with a message naming the value and the limit.
int run_cli(const std::vector<std::string>& args, std::ostream& out);

// The usage text.
std::string cli_usage();

}  // namespace epkit::plan
