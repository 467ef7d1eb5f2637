// epkit-run's logic as a small library: argument parsing and the local multi-process launch.
// main.cpp only maps its results to exit codes, so the tests can drive both halves.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace epkit::run {

// What one launch does. Filled by parse_args; every field has the default documented here.
struct LaunchOptions {
  int num_procs = 0;                 // -n N: processes to start on this host, 1..kMaxProcs
  std::vector<std::string> command;  // the program and its arguments (execvp: PATH lookup)
  int grace_ms = 5000;               // --grace-ms: SIGTERM -> SIGKILL delay when stopping ranks
  double timeout_s = 0;              // --timeout SEC: whole-job bound, 0 = none; exceeding it -> 124
  bool show_help = false;            // --help / -h
};

constexpr int kMaxProcs = 4096;
constexpr int kExitTimeout = 124;  // like coreutils timeout(1)
constexpr int kExitUsage = 2;      // bad command line

// Parses argv[1..] (without the program name). Throws epkit::Error naming the bad option/value.
LaunchOptions parse_args(const std::vector<std::string>& args);

// The --help text.
std::string usage();

// Runs the job: starts num_procs children with the torchrun environment (RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) plus EPKIT_RUN_SEED, prefixes their
// output lines with "[rank] ", and returns: 0 if all succeed; the first failure's exit code
// (128+signo for a signal) after stopping the others; 124 on --timeout; 128+signo when the launcher
// itself got SIGINT/SIGTERM/SIGHUP. Throws epkit::Error only when it cannot start (bad environment,
// pipe/fork failure); children already started are then stopped first.
int launch(const LaunchOptions& opt);

}  // namespace epkit::run
