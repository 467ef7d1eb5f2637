// epkit-run, tested as a real binary over real processes (sh -c '...'), plus its parsing pieces.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "epkit/error.hpp"
#include "launcher.hpp"
#include "line_prefixer.hpp"

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

// Environment edits for one run: a value sets the variable, nullopt unsets it.
using EnvEdits = std::map<std::string, std::optional<std::string>>;

// The launch-related variables removed by default, so the outer environment cannot leak in.
EnvEdits clean_env(EnvEdits extra = {}) {
  EnvEdits e = {{"MASTER_ADDR", std::nullopt}, {"MASTER_PORT", std::nullopt},
                {"EPKIT_RUN_SEED", std::nullopt}, {"RANK", std::nullopt},
                {"WORLD_SIZE", std::nullopt}, {"LOCAL_RANK", std::nullopt}};
  for (auto& [k, v] : extra) e[k] = v;
  return e;
}

struct Result {
  int code = -1;  // exit code, or 128+signo
  std::string out, err;
  double seconds = 0;
};

// A started process with its stdout/stderr captured.
struct Proc {
  pid_t pid = -1;
  int out = -1, err = -1;
  Clock::time_point start;
};

Proc start(const std::vector<std::string>& argv, const EnvEdits& env) {
  int o[2], e[2];
  EXPECT_EQ(::pipe2(o, O_CLOEXEC), 0);
  EXPECT_EQ(::pipe2(e, O_CLOEXEC), 0);
  Proc p;
  p.start = Clock::now();
  p.pid = ::fork();
  if (p.pid == 0) {
    ::dup2(o[1], 1);
    ::dup2(e[1], 2);
    for (auto& [k, v] : env) v ? ::setenv(k.c_str(), v->c_str(), 1) : ::unsetenv(k.c_str());
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(126);
  }
  ::close(o[1]);
  ::close(e[1]);
  p.out = o[0];
  p.err = e[0];
  return p;
}

// Reads both pipes to EOF, then reaps. A hung launcher fails the test after 60 s instead of hanging.
Result finish(Proc& p) {
  Result r;
  const auto limit = p.start + std::chrono::seconds(60);
  int* fds[] = {&p.out, &p.err};
  std::string* bufs[] = {&r.out, &r.err};
  while (p.out >= 0 || p.err >= 0) {
    if (Clock::now() > limit) {
      ::kill(p.pid, SIGKILL);
      ADD_FAILURE() << "epkit-run did not finish within 60 s";
      break;
    }
    pollfd pf[2] = {{p.out, POLLIN, 0}, {p.err, POLLIN, 0}};
    ::poll(pf, 2, 200);
    for (int i = 0; i < 2; ++i) {
      if (*fds[i] < 0 || !pf[i].revents) continue;
      char buf[4096];
      ssize_t k = ::read(*fds[i], buf, sizeof(buf));
      if (k > 0) {
        bufs[i]->append(buf, size_t(k));
      } else if (k == 0 || errno != EINTR) {
        ::close(*fds[i]);
        *fds[i] = -1;
      }
    }
  }
  int status = 0;
  ::waitpid(p.pid, &status, 0);
  r.seconds = std::chrono::duration<double>(Clock::now() - p.start).count();
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

Result run(const std::vector<std::string>& launcher_args, const EnvEdits& env = clean_env()) {
  std::vector<std::string> argv = {EPKIT_RUN_PATH};
  argv.insert(argv.end(), launcher_args.begin(), launcher_args.end());
  Proc p = start(argv, env);
  return finish(p);
}

std::string describe(const Result& r) {
  return "exit " + std::to_string(r.code) + " after " + std::to_string(r.seconds) + " s\n--- stdout\n" +
         r.out + "--- stderr\n" + r.err;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

// A fresh directory for pid files, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/epkit-run-test-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// Waits (bounded) until a pid file has content; returns the pid or -1.
pid_t wait_pid_file(const std::string& file, double seconds = 20) {
  const auto limit = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < limit) {
    std::ifstream in(file);
    long pid = 0;
    if (in >> pid && pid > 0) return pid_t(pid);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

// True if pid no longer runs (gone, or a zombie waiting for a reaper that is not ours).
bool process_gone(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string content((std::istreambuf_iterator<char>(stat)), {});
  size_t paren = content.rfind(')');
  return paren == std::string::npos || (paren + 2 < content.size() && content[paren + 2] == 'Z');
}

bool gone_soon(pid_t pid) {  // the kernel may take a moment to tear a killed process down
  for (int i = 0; i < 100 && !process_gone(pid); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return process_gone(pid);
}

std::string seed_line_value(const std::string& err) {
  std::smatch m;
  static const std::regex re(R"(\[epkit-run\] seed=(\d+))");
  return std::regex_search(err, m, re) ? m[1].str() : "";
}

TEST(EpkitRun, SetsTheTorchrunEnvironmentPerRank) {
  const char* cvd_before = std::getenv("CUDA_VISIBLE_DEVICES");
  const Result r = run({"-n", "4", "--", "sh", "-c",
                        "echo \"r=$RANK w=$WORLD_SIZE l=$LOCAL_RANK lw=$LOCAL_WORLD_SIZE a=$MASTER_ADDR "
                        "p=$MASTER_PORT cvd=${CUDA_VISIBLE_DEVICES-unset}\""});
  ASSERT_EQ(r.code, 0) << describe(r);
  const std::string cvd = cvd_before ? cvd_before : "unset";  // launcher must not touch it
  std::set<std::string> ports;
  std::set<int> ranks;
  static const std::regex re(R"(\[(\d)\] r=(\d) w=4 l=(\d) lw=4 a=127\.0\.0\.1 p=(\d+) cvd=(.*))");
  for (const auto& line : lines_of(r.out)) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, re)) << line;
    EXPECT_EQ(m[1], m[2]);  // prefix is the rank
    EXPECT_EQ(m[2], m[3]);  // LOCAL_RANK == RANK on one host
    EXPECT_EQ(m[5], cvd);
    ranks.insert(std::stoi(m[2]));
    ports.insert(m[4]);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3}));
  ASSERT_EQ(ports.size(), 1u) << "all ranks share one MASTER_PORT";
  int port = std::stoi(*ports.begin());
  EXPECT_TRUE(port > 0 && port < 65536);
}

TEST(EpkitRun, KeepsMasterAddressPortAndSeedFromTheEnvironment) {
  const Result r = run({"-n", "2", "sh", "-c", "echo \"$MASTER_ADDR $MASTER_PORT $EPKIT_RUN_SEED\""},
                       clean_env({{"MASTER_ADDR", "127.0.0.2"}, {"MASTER_PORT", "23456"},
                                  {"EPKIT_RUN_SEED", "18446744073709551615"}}));
  ASSERT_EQ(r.code, 0) << describe(r);
  for (const auto& line : lines_of(r.out)) EXPECT_EQ(line.substr(4), "127.0.0.2 23456 18446744073709551615");
  EXPECT_EQ(lines_of(r.out).size(), 2u);
  EXPECT_EQ(seed_line_value(r.err), "18446744073709551615");
}

TEST(EpkitRun, RejectsMalformedInheritedSettings) {
  Result r = run({"-n", "1", "true"}, clean_env({{"MASTER_PORT", "http"}}));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("MASTER_PORT='http'"), std::string::npos) << describe(r);
  r = run({"-n", "1", "true"}, clean_env({{"EPKIT_RUN_SEED", "-5"}}));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("EPKIT_RUN_SEED='-5'"), std::string::npos) << describe(r);
}

TEST(EpkitRun, PrefixesLinesAndKeepsStdoutAndStderrApart) {
  const Result r = run({"-n", "2", "--", "sh", "-c",
                        "printf 'out1\\nout2\\n'; printf 'err1\\n' >&2; printf \"tail-$RANK\"; "
                        "printf 'errtail' >&2"});
  ASSERT_EQ(r.code, 0) << describe(r);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string p = "[" + std::to_string(rank) + "] ";
    EXPECT_NE(r.out.find(p + "out1\n" + p + "out2\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(p + "tail-" + std::to_string(rank) + "\n"), std::string::npos) << r.out;
    EXPECT_NE(r.err.find(p + "err1\n"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(p + "errtail\n"), std::string::npos) << r.err;
  }
  EXPECT_EQ(r.out.find("err"), std::string::npos) << r.out;
  EXPECT_EQ(r.err.find("out"), std::string::npos) << r.err;
  for (const auto& line : lines_of(r.out)) EXPECT_TRUE(line.rfind("[0] ", 0) == 0 || line.rfind("[1] ", 0) == 0) << line;
}

TEST(EpkitRun, ReturnsTheFailingRanksExitCode) {
  const Result r = run({"-n", "3", "sh", "-c", "if [ \"$RANK\" = 1 ]; then echo dying >&2; exit 3; fi"});
  EXPECT_EQ(r.code, 3) << describe(r);
  const size_t verdict = r.err.find("rank 1 (pid");
  EXPECT_NE(verdict, std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("exited with code 3"), std::string::npos) << describe(r);
  EXPECT_LT(r.err.find("[1] dying\n"), verdict) << "the rank's last words come before the verdict";
}

TEST(EpkitRun, StopsTheOtherRanksWhenOneFailsAndLeavesNoOrphans) {
  TempDir dir;
  const std::string script =
      "if [ \"$RANK\" = 1 ]; then sleep 60 & echo $! > " + dir.file("grandchild") + "; echo $$ > " +
      dir.file("child") + "; wait; else while [ ! -s " + dir.file("child") +
      " ]; do sleep 0.05; done; exit 7; fi";
  const Result r = run({"-n", "2", "sh", "-c", script});
  EXPECT_EQ(r.code, 7) << describe(r);
  EXPECT_LT(r.seconds, 10) << describe(r);
  EXPECT_NE(r.err.find("rank 0"), std::string::npos) << describe(r);
  const pid_t child = wait_pid_file(dir.file("child"), 0.1), grandchild = wait_pid_file(dir.file("grandchild"), 0.1);
  ASSERT_GT(child, 0);
  ASSERT_GT(grandchild, 0);
  EXPECT_TRUE(gone_soon(child)) << "rank 1 (pid " << child << ") survived";
  EXPECT_TRUE(gone_soon(grandchild)) << "rank 1's sleep (pid " << grandchild << ") survived";
}

TEST(EpkitRun, KillsRanksThatIgnoreSigtermAfterTheGracePeriod) {
  TempDir dir;
  const std::string script =
      "if [ \"$RANK\" = 1 ]; then trap '' TERM; echo $$ > " + dir.file("child") +
      "; exec sleep 60; else while [ ! -s " + dir.file("child") + " ]; do sleep 0.05; done; exit 5; fi";
  const Result r = run({"-n", "2", "--grace-ms", "300", "sh", "-c", script});
  EXPECT_EQ(r.code, 5) << describe(r);
  EXPECT_LT(r.seconds, 5) << describe(r);
  EXPECT_NE(r.err.find("SIGKILL"), std::string::npos) << describe(r);
  const pid_t child = wait_pid_file(dir.file("child"), 0.1);
  ASSERT_GT(child, 0);
  EXPECT_TRUE(gone_soon(child));
}

TEST(EpkitRun, DeathBySignalGives128PlusSigno) {
  Result r = run({"-n", "2", "sh", "-c", "if [ \"$RANK\" = 0 ]; then kill -USR1 $$; fi; sleep 60"});
  EXPECT_EQ(r.code, 128 + SIGUSR1) << describe(r);
  EXPECT_NE(r.err.find("rank 0 (pid"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("signal " + std::to_string(SIGUSR1)), std::string::npos) << describe(r);
  EXPECT_LT(r.seconds, 10);
  r = run({"-n", "1", "sh", "-c", "kill -KILL $$"});
  EXPECT_EQ(r.code, 128 + SIGKILL) << describe(r);
}

TEST(EpkitRun, TimeoutStopsEverythingAndReturns124) {
  const Result r = run({"--timeout", "0.5", "-n", "2", "sleep", "60"});
  EXPECT_EQ(r.code, 124) << describe(r);
  EXPECT_GE(r.seconds, 0.45);
  EXPECT_LT(r.seconds, 5) << describe(r);
  EXPECT_NE(r.err.find("timeout"), std::string::npos) << describe(r);
}

TEST(EpkitRun, SeedIsSharedByAllRanksAndFreshPerLaunch) {
  std::set<std::string> per_launch;
  for (int launch = 0; launch < 2; ++launch) {
    const Result r = run({"-n", "3", "sh", "-c", "echo $EPKIT_RUN_SEED"});
    ASSERT_EQ(r.code, 0) << describe(r);
    const std::string printed = seed_line_value(r.err);
    ASSERT_FALSE(printed.empty()) << describe(r);
    const auto lines = lines_of(r.out);
    ASSERT_EQ(lines.size(), 3u);
    for (const auto& l : lines) EXPECT_EQ(l.substr(4), printed) << l;
    per_launch.insert(printed);
  }
  EXPECT_EQ(per_launch.size(), 2u) << "two launches drew the same seed";
}

TEST(EpkitRun, ForwardsSigtermToTheRanksAndLeavesNoOrphans) {
  TempDir dir;
  std::vector<std::string> argv = {EPKIT_RUN_PATH, "-n", "2", "sh", "-c",
                                   "echo $$ > " + dir.file("rank") + "$RANK; exec sleep 60"};
  Proc p = start(argv, clean_env());
  const pid_t r0 = wait_pid_file(dir.file("rank0")), r1 = wait_pid_file(dir.file("rank1"));
  ASSERT_GT(r0, 0);
  ASSERT_GT(r1, 0);
  ::kill(p.pid, SIGTERM);
  const Result r = finish(p);
  EXPECT_EQ(r.code, 128 + SIGTERM) << describe(r);
  EXPECT_LT(r.seconds, 20);
  EXPECT_TRUE(gone_soon(r0));
  EXPECT_TRUE(gone_soon(r1));
}

TEST(EpkitRun, RanksDieWithAKilledLauncher) {
  // SIGKILL cannot be forwarded: PR_SET_PDEATHSIG is what takes the ranks down.
  TempDir dir;
  std::vector<std::string> argv = {EPKIT_RUN_PATH, "-n", "2", "sh", "-c",
                                   "echo $$ > " + dir.file("rank") + "$RANK; exec sleep 60"};
  Proc p = start(argv, clean_env());
  const pid_t r0 = wait_pid_file(dir.file("rank0")), r1 = wait_pid_file(dir.file("rank1"));
  ASSERT_GT(r0, 0);
  ASSERT_GT(r1, 0);
  ::kill(p.pid, SIGKILL);
  const Result r = finish(p);
  EXPECT_EQ(r.code, 128 + SIGKILL);
  EXPECT_TRUE(gone_soon(r0)) << "rank 0 (pid " << r0 << ") outlived its launcher";
  EXPECT_TRUE(gone_soon(r1)) << "rank 1 (pid " << r1 << ") outlived its launcher";
}

TEST(EpkitRun, MissingCommandExits127) {
  const Result r = run({"-n", "1", "/nonexistent/epkit-no-such-program"});
  EXPECT_EQ(r.code, 127) << describe(r);
  EXPECT_NE(r.err.find("[0] epkit-run: cannot execute"), std::string::npos) << describe(r);
}

TEST(EpkitRun, HelpAndBadArguments) {
  Result r = run({"--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("usage: epkit-run -n N"), std::string::npos) << describe(r);
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"-n", "0", "true"}, "bad -n value '0'"},
      {{"-n", "abc", "true"}, "bad -n value 'abc'"},
      {{"-n", "99999", "true"}, "bad -n value '99999'"},
      {{"-n"}, "option -n needs a value"},
      {{"-n", "2"}, "missing the command"},
      {{"true"}, "missing -n"},
      {{"-n", "2", "--bogus", "true"}, "unknown option '--bogus'"},
      {{"--timeout", "-1", "-n", "1", "true"}, "bad --timeout value '-1'"},
  };
  for (const auto& [args, message] : bad) {
    r = run(args);
    EXPECT_EQ(r.code, epkit::run::kExitUsage) << describe(r);
    EXPECT_NE(r.err.find(message), std::string::npos) << describe(r);
  }
}

TEST(EpkitRun, RendezvousAcrossRealProcesses) {
  const Result r = run({"-n", "4", "--timeout", "60", EPKIT_RENDEZVOUS_PROBE_PATH});
  ASSERT_EQ(r.code, 0) << describe(r);
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_NE(r.out.find("[" + std::to_string(rank) + "] ok\n"), std::string::npos) << describe(r);
}

// --- the library pieces -----------------------------------------------------------------------

TEST(ParseArgs, OptionFormsAndTheCommandBoundary) {
  using epkit::run::parse_args;
  auto o = parse_args({"-n", "4", "--grace-ms", "100", "--timeout", "2.5", "prog", "-n", "9", "--x"});
  EXPECT_EQ(o.num_procs, 4);
  EXPECT_EQ(o.grace_ms, 100);
  EXPECT_DOUBLE_EQ(o.timeout_s, 2.5);
  EXPECT_EQ(o.command, (std::vector<std::string>{"prog", "-n", "9", "--x"}));  // the command's own args
  o = parse_args({"-n3", "--", "-weird-prog"});
  EXPECT_EQ(o.num_procs, 3);
  EXPECT_EQ(o.command, (std::vector<std::string>{"-weird-prog"}));
  o = parse_args({"--nproc=2", "--timeout=1", "a"});
  EXPECT_EQ(o.num_procs, 2);
  EXPECT_EQ(o.grace_ms, 5000);  // default
  EXPECT_TRUE(parse_args({"-h"}).show_help);
  EXPECT_THROW(parse_args({"-n", "2", "--"}), epkit::Error);
  EXPECT_THROW(parse_args({"-n", "1.5", "a"}), epkit::Error);
  EXPECT_THROW(parse_args({"-n", " 4", "a"}), epkit::Error);
  EXPECT_THROW(parse_args({"--grace-ms", "-1", "-n", "1", "a"}), epkit::Error);
}

TEST(LinePrefixer, WholeLinesPartialTailAndLongLines) {
  epkit::run::LinePrefixer p("[7] ", 8);
  EXPECT_EQ(p.feed("ab"), "");
  EXPECT_EQ(p.feed("c\nde\n\nf"), "[7] abc\n[7] de\n[7] \n");
  EXPECT_EQ(p.finish(), "[7] f\n");
  EXPECT_EQ(p.finish(), "");
  EXPECT_EQ(p.feed("0123456789\n"), "[7] 01234567\n[7] 89\n");  // cut at 8 bytes, memory bounded
}

}  // namespace
