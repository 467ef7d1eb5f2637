// epkit-run's command line: options first, then `--` (optional) and the command, which keeps
// every later argument, dashes included.
#include <cerrno>
#include <cctype>
#include <cmath>
#include <algorithm>
#include <cstdlib>
#include <utility>

#include "epkit/error.hpp"
#include "launcher.hpp"

namespace epkit::run {
namespace {

// Usage errors carry no file:line: they are about the user's command line, not this code.
template <typename... Args>
void require(bool ok, Args&&... msg) {
  if (!ok) throw Error(detail::concat(std::forward<Args>(msg)...));
}

long parse_long(const std::string& opt, const std::string& v, long lo, long hi) {
  errno = 0;
  char* end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  const bool plain = !v.empty() && (std::isdigit(uint8_t(v[0])) || (v[0] == '-' && v.size() > 1));
  require(plain && *end == '\0' && errno == 0 && x >= lo && x <= hi, "bad ", opt, " value '",
              v, "': expected an integer in [", lo, ", ", hi, "]");
  return x;
}

double parse_seconds(const std::string& opt, const std::string& v) {
  errno = 0;
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  require(!v.empty() && *end == '\0' && errno == 0 && std::isfinite(x) && x > 0 && x <= 1e9,
              "bad ", opt, " value '", v, "': expected seconds in (0, 1e9]");
  return x;
}

}  // namespace

std::string usage() {
  return "usage: epkit-run -n N [--grace-ms MS] [--timeout SEC] [--] CMD [ARGS...]\n"
         "\n"
         "Starts N local processes of CMD (torchrun convention) and waits for them.\n"
         "  -n, --nproc N    number of processes, 1.." + std::to_string(kMaxProcs) + "\n"
         "  --grace-ms MS    SIGTERM -> SIGKILL delay when stopping ranks (default 5000)\n"
         "  --timeout SEC    stop everything and exit 124 after SEC seconds (default: none)\n"
         "  -h, --help       this text\n"
         "\n"
         "Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR (kept if set,\n"
         "else 127.0.0.1), MASTER_PORT (kept if set, else a free port) and EPKIT_RUN_SEED (kept if\n"
         "set, else a fresh random 64-bit value shared by all ranks). GPUs are not assigned here:\n"
         "epkit's Communicator uses device LOCAL_RANK % device_count; CUDA_VISIBLE_DEVICES is\n"
         "left alone. Output lines are prefixed with \"[rank] \" (stdout and stderr kept apart).\n"
         "Exit code: 0 if all ranks succeed; else the first failure's code (128+signal), after\n"
         "stopping the other ranks; 124 on --timeout; 128+signal if epkit-run is interrupted.\n";
}

LaunchOptions parse_args(const std::vector<std::string>& args) {
  LaunchOptions o;
  bool have_n = false;
  size_t i = 0;
  // Returns the value of option `name`, either inline ("--x=v", "-nV") or the next argument.
  auto value = [&](const std::string& name, const std::string& inline_value, bool has_inline) {
    if (has_inline) return inline_value;
    require(i + 1 < args.size(), "option ", name, " needs a value");
    return args[++i];
  };
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a.empty() || a[0] != '-') break;  // the command starts here
    std::string name = a, inline_value;
    bool has_inline = false;
    if (size_t eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      name = a.substr(0, eq);
      inline_value = a.substr(eq + 1);
      has_inline = true;
    } else if (a.size() > 2 && a.rfind("-n", 0) == 0 && a[1] == 'n') {
      name = "-n";
      inline_value = a.substr(2);
      has_inline = true;
    }
    if (name == "-h" || name == "--help") {
      o.show_help = true;
      return o;
    } else if (name == "-n" || name == "--nproc" || name == "--nproc-per-node") {
      o.num_procs = int(parse_long(name, value(name, inline_value, has_inline), 1, kMaxProcs));
      have_n = true;
    } else if (name == "--grace-ms") {
      o.grace_ms = int(parse_long(name, value(name, inline_value, has_inline), 0, 3600 * 1000));
    } else if (name == "--timeout") {
      o.timeout_s = parse_seconds(name, value(name, inline_value, has_inline));
    } else {
      require(false, "unknown option '", a, "' (put -- before a command that starts with '-')");
    }
  }
  o.command.assign(args.begin() + long(std::min(i, args.size())), args.end());
  require(have_n, "missing -n N (number of processes)");
  require(!o.command.empty(), "missing the command to run");
  return o;
}

}  // namespace epkit::run
