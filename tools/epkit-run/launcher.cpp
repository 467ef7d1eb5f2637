// Runs N local ranks: fork/exec with the torchrun environment, one poll() loop over the children's
// pipes and a signalfd (SIGCHLD, SIGINT, SIGTERM, SIGHUP), and the stop protocol
// (SIGTERM to each rank's process group, SIGKILL after the grace period).
//
// No orphans: each child leads its own process group (so grandchildren are stopped with it), asks
// the kernel to SIGKILL it if the launcher dies (PR_SET_PDEATHSIG), and every group gets a final
// SIGKILL once its leader has been reaped, which also ends stray background processes.
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <algorithm>
#include <optional>
#include <random>

#include "epkit/error.hpp"
#include "launcher.hpp"
#include "line_prefixer.hpp"

extern char** environ;

namespace epkit::run {
namespace {

using Clock = std::chrono::steady_clock;

std::string errno_text() { return std::strerror(errno); }

// Writes all of `s` to fd. Output is best effort: a closed stdout must not stop the job.
void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t k = ::write(fd, s.data() + off, s.size() - off);
    if (k > 0) {
      off += size_t(k);
    } else if (k < 0 && errno == EINTR) {
      continue;
    } else if (k < 0 && errno == EAGAIN) {  // the caller left our stdout non-blocking
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 1000);
    } else {
      return;
    }
  }
}

void say(const std::string& msg) { write_all(STDERR_FILENO, "[epkit-run] " + msg + "\n"); }

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  return "stopped with status " + std::to_string(status);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

const char* getenv_nonempty(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

// A port nobody listens on right now, from binding port 0 on `host` (any address if that fails).
// Another process could take it before rank 0 binds; rank 0's listener then reports EADDRINUSE.
int pick_free_port(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  for (const char* h : {host.c_str(), static_cast<const char*>(nullptr)}) {
    addrinfo* list = nullptr;
    if (getaddrinfo(h, "0", &hints, &list) != 0) continue;
    for (addrinfo* a = list; a; a = a->ai_next) {
      int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      int port = -1;
      if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 &&
          ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
        port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                        : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
      }
      ::close(fd);
      if (port > 0) {
        freeaddrinfo(list);
        return port;
      }
    }
    freeaddrinfo(list);
  }
  EPKIT_FAIL("epkit-run: cannot find a free TCP port on ", host, " (set MASTER_PORT)");
}

uint64_t fresh_seed() {
  std::random_device rd;  // getrandom() on Linux
  return (uint64_t(rd()) << 32) ^ uint64_t(rd());
}

// The launch-wide part of the environment: MASTER_ADDR, MASTER_PORT, EPKIT_RUN_SEED.
struct JobEnv {
  std::string master_addr, master_port, seed;
};

JobEnv make_job_env() {
  JobEnv e;
  const char* addr = getenv_nonempty("MASTER_ADDR");
  e.master_addr = addr ? addr : "127.0.0.1";
  if (const char* port = getenv_nonempty("MASTER_PORT")) {
    char* end = nullptr;
    long p = std::strtol(port, &end, 10);
    EPKIT_CHECK(std::isdigit(uint8_t(port[0])) && *end == '\0' && p >= 1 && p <= 65535,
                "epkit-run: MASTER_PORT='", port,
                "' is not a port in [1, 65535]");
    e.master_port = port;
  } else {
    e.master_port = std::to_string(pick_free_port(e.master_addr));
  }
  if (const char* seed = getenv_nonempty("EPKIT_RUN_SEED")) {
    char* end = nullptr;
    errno = 0;
    std::strtoull(seed, &end, 10);
    EPKIT_CHECK(std::isdigit(uint8_t(seed[0])) && *end == '\0' && errno == 0,
                "epkit-run: EPKIT_RUN_SEED='", seed,
                "' is not a decimal 64-bit unsigned value");
    e.seed = seed;
  } else {
    e.seed = std::to_string(fresh_seed());
  }
  return e;
}

// KEY=VALUE strings for one rank: the launcher's environment with ours replacing the same keys.
std::vector<std::string> rank_env(const JobEnv& job, int rank, int world) {
  const std::vector<std::pair<std::string, std::string>> ours = {
      {"RANK", std::to_string(rank)},        {"WORLD_SIZE", std::to_string(world)},
      {"LOCAL_RANK", std::to_string(rank)},  {"LOCAL_WORLD_SIZE", std::to_string(world)},
      {"MASTER_ADDR", job.master_addr},      {"MASTER_PORT", job.master_port},
      {"EPKIT_RUN_SEED", job.seed}};
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string_view kv(*e);
    bool replaced = false;
    for (const auto& [k, v] : ours)
      replaced |= kv.size() > k.size() && kv.substr(0, k.size()) == k && kv[k.size()] == '=';
    if (!replaced) env.emplace_back(kv);
  }
  for (const auto& [k, v] : ours) env.push_back(k + "=" + v);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// One rank's output pipe and the lines still being assembled from it.
struct Stream {
  int fd = -1;        // read end; -1 once closed
  int dest = -1;      // STDOUT_FILENO or STDERR_FILENO
  LinePrefixer lines;
};

struct Child {
  int rank = 0;
  pid_t pid = -1;     // also its process group id
  bool running = false;
  Stream out, err;
};

// Blocks the signals the loop handles (so they queue on the signalfd) and restores them on exit.
class SignalScope {
 public:
  SignalScope() {
    sigset_t set;
    sigemptyset(&set);
    for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE}) sigaddset(&set, s);
    EPKIT_CHECK(sigprocmask(SIG_BLOCK, &set, &old_mask_) == 0, "epkit-run: sigprocmask: ", errno_text());
    sigdelset(&set, SIGPIPE);  // blocked only so that writes to a closed stdout return EPIPE
    fd_ = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (fd_ < 0) {
      int e = errno;
      sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
      EPKIT_FAIL("epkit-run: signalfd: ", std::strerror(e));
    }
    // An inherited SIG_IGN for SIGCHLD would make the kernel reap children behind our back.
    struct sigaction sa {};
    sa.sa_handler = SIG_DFL;
    sigaction(SIGCHLD, &sa, &old_chld_);
  }
  ~SignalScope() {
    ::close(fd_);
    sigaction(SIGCHLD, &old_chld_, nullptr);
    sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
  }
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;
  int fd() const { return fd_; }
  const sigset_t& old_mask() const { return old_mask_; }

 private:
  int fd_ = -1;
  sigset_t old_mask_{};
  struct sigaction old_chld_ {};
};

// The children of one launch. The destructor SIGKILLs and reaps whatever is left, so an exception
// anywhere in launch() still leaves no process behind.
class Job {
 public:
  explicit Job(int world) { children_.reserve(size_t(world)); }
  ~Job() {
    for (auto& c : children_) {
      if (c.pid > 0) ::kill(-c.pid, SIGKILL);
      if (c.running) {
        while (::waitpid(c.pid, nullptr, 0) < 0 && errno == EINTR) {
        }
      }
      for (Stream* s : {&c.out, &c.err})
        if (s->fd >= 0) ::close(s->fd);
    }
  }
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  std::vector<Child>& children() { return children_; }

  void spawn(int rank, const std::vector<std::string>& command, std::vector<std::string> env,
             const sigset_t& child_mask) {
    int out_pipe[2], err_pipe[2];
    EPKIT_CHECK(::pipe2(out_pipe, O_CLOEXEC) == 0, "epkit-run: pipe: ", errno_text());
    if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
      int e = errno;
      ::close(out_pipe[0]);
      ::close(out_pipe[1]);
      EPKIT_FAIL("epkit-run: pipe: ", std::strerror(e));
    }
    std::vector<std::string> argv_s = command;
    std::vector<char*> argv = c_strings(argv_s);
    std::vector<char*> envp = c_strings(env);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) exec_child(parent, out_pipe[1], err_pipe[1], argv, envp, child_mask);
    int fork_errno = errno;
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    if (pid < 0) {
      ::close(out_pipe[0]);
      ::close(err_pipe[0]);
      EPKIT_FAIL("epkit-run: fork for rank ", rank, ": ", std::strerror(fork_errno));
    }
    // Read ends only: the loop must never block on one pipe while others or timers need it.
    ::fcntl(out_pipe[0], F_SETFL, O_NONBLOCK);
    ::fcntl(err_pipe[0], F_SETFL, O_NONBLOCK);
    ::setpgid(pid, pid);  // also done by the child: whoever runs first, the group exists before kill()
    const std::string prefix = "[" + std::to_string(rank) + "] ";
    children_.push_back(Child{rank, pid, true, Stream{out_pipe[0], STDOUT_FILENO, LinePrefixer(prefix)},
                              Stream{err_pipe[0], STDERR_FILENO, LinePrefixer(prefix)}});
  }

 private:
  // In the child: never returns. Only plain system calls between fork and exec.
  [[noreturn]] static void exec_child(pid_t parent, int out_fd, int err_fd, std::vector<char*>& argv,
                                      std::vector<char*>& envp, const sigset_t& mask) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the launcher died before prctl took effect
    int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    // stdin is /dev/null: ranks run in background process groups, where reading a terminal stops them.
    if (devnull < 0 || ::dup2(devnull, STDIN_FILENO) < 0 || ::dup2(out_fd, STDOUT_FILENO) < 0 ||
        ::dup2(err_fd, STDERR_FILENO) < 0)
      ::_exit(127);
    ::sigprocmask(SIG_SETMASK, &mask, nullptr);
    ::execvpe(argv[0], argv.data(), envp.data());
    const int e = errno;
    const char* why = std::strerror(e);
    for (const char* s : {"epkit-run: cannot execute '", static_cast<const char*>(argv[0]), "': ", why, "\n"})
      if (::write(STDERR_FILENO, s, std::strlen(s)) < 0) break;
    ::_exit(e == EACCES || e == ENOEXEC ? 126 : 127);  // the shell's codes for these
  }

  std::vector<Child> children_;
};

// Reads what is available on a child's (non-blocking) pipe and forwards whole lines; closes it at
// EOF. Returns true if it read bytes, so that more may follow.
bool pump(Stream& s) {
  if (s.fd < 0) return false;
  char buf[64 * 1024];
  ssize_t k = ::read(s.fd, buf, sizeof(buf));
  if (k < 0 && (errno == EINTR || errno == EAGAIN)) return k < 0 && errno == EINTR;
  if (k > 0) {
    write_all(s.dest, s.lines.feed(std::string_view(buf, size_t(k))));
    return true;
  }
  write_all(s.dest, s.lines.finish());
  ::close(s.fd);
  s.fd = -1;
  return false;
}

// Forwards what a rank wrote before it died, so its last words precede the launcher's verdict.
// Bounded: a background process of the rank may keep writing.
void drain(Child& c) {
  for (int i = 0; i < 64 && (pump(c.out) | pump(c.err)); ++i) {
  }
}

}  // namespace

int launch(const LaunchOptions& opt) {
  EPKIT_CHECK(opt.num_procs >= 1 && opt.num_procs <= kMaxProcs, "epkit-run: -n ", opt.num_procs,
              " not in [1, ", kMaxProcs, "]");
  EPKIT_CHECK(!opt.command.empty(), "epkit-run: no command");
  const JobEnv job_env = make_job_env();
  say("seed=" + job_env.seed);

  SignalScope signals;
  Job job(opt.num_procs);
  for (int r = 0; r < opt.num_procs; ++r)
    job.spawn(r, opt.command, rank_env(job_env, r, opt.num_procs), signals.old_mask());

  const auto start = Clock::now();
  const std::optional<Clock::time_point> job_deadline =
      opt.timeout_s > 0 ? std::optional(start + std::chrono::duration_cast<Clock::duration>(
                                                    std::chrono::duration<double>(opt.timeout_s)))
                        : std::nullopt;
  std::optional<Clock::time_point> kill_deadline;   // set once stopping began
  std::optional<Clock::time_point> drain_deadline;  // set once every rank was reaped
  bool stopping = false, killed = false;
  int result = 0;
  std::vector<Child>& children = job.children();

  auto signal_groups = [&](int sig) {
    for (auto& c : children)
      if (c.running) ::kill(-c.pid, sig);
  };
  auto begin_stop = [&](int code, int sig) {
    stopping = true;
    result = code;
    signal_groups(sig);
    kill_deadline = Clock::now() + std::chrono::milliseconds(opt.grace_ms);
  };
  auto reap = [&] {
    for (auto& c : children) {
      if (!c.running) continue;
      int status = 0;
      pid_t rc = ::waitpid(c.pid, &status, WNOHANG);
      if (rc != c.pid) continue;
      c.running = false;
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (failed && !stopping) {
        drain(c);
        say("rank " + std::to_string(c.rank) + " (pid " + std::to_string(c.pid) + ") " +
            describe_status(status) + "; stopping the other ranks");
        begin_stop(exit_code_of(status), SIGTERM);
      }
    }
  };

  for (;;) {
    reap();
    bool any_running = false, any_open = false;
    for (auto& c : children) {
      any_running |= c.running;
      any_open |= c.out.fd >= 0 || c.err.fd >= 0;
    }
    if (!any_running && !drain_deadline) {
      // Whatever the ranks left behind in their groups (background jobs) goes now; their pipes
      // then reach EOF. A descendant that left the group could hold a pipe: bounded by the drain.
      for (auto& c : children) ::kill(-c.pid, SIGKILL);
      drain_deadline = Clock::now() + std::chrono::seconds(2);
    }
    const auto now = Clock::now();
    if (!any_running && (!any_open || now >= *drain_deadline)) {
      for (auto& c : children)
        for (Stream* s : {&c.out, &c.err})
          if (s->fd >= 0) write_all(s->dest, s->lines.finish());
      break;
    }
    if (!stopping && job_deadline && now >= *job_deadline) {
      say(detail::concat("timeout: the job exceeded ", opt.timeout_s, " s; stopping all ranks"));
      begin_stop(kExitTimeout, SIGTERM);
    }
    if (stopping && !killed && now >= *kill_deadline) {
      if (any_running) say("grace period over; sending SIGKILL");
      signal_groups(SIGKILL);
      killed = true;
    }

    // Sleep until output, a signal, or the nearest deadline.
    std::optional<Clock::time_point> wake;
    for (auto d : {stopping ? std::nullopt : job_deadline, killed ? std::nullopt : kill_deadline, drain_deadline})
      if (d && (!wake || *d < *wake)) wake = d;
    int timeout_ms = -1;
    if (wake) {
      auto ms = std::chrono::ceil<std::chrono::milliseconds>(*wake - Clock::now()).count();
      timeout_ms = int(std::clamp<long long>(ms, 0, INT_MAX));
    }
    std::vector<pollfd> fds{{signals.fd(), POLLIN, 0}};
    std::vector<Stream*> streams;
    for (auto& c : children)
      for (Stream* s : {&c.out, &c.err})
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          streams.push_back(s);
        }
    int rc = ::poll(fds.data(), fds.size(), timeout_ms);
    EPKIT_CHECK(rc >= 0 || errno == EINTR, "epkit-run: poll: ", errno_text());
    if (rc <= 0) continue;
    for (size_t i = 0; i < streams.size(); ++i)
      if (fds[i + 1].revents) pump(*streams[i]);
    if (fds[0].revents) {
      signalfd_siginfo si{};
      while (::read(signals.fd(), &si, sizeof(si)) == ssize_t(sizeof(si))) {
        const int sig = int(si.ssi_signo);
        if (sig == SIGCHLD) continue;  // reap() runs at the top of the loop
        if (!stopping) {
          say(std::string("got ") + strsignal(sig) + "; forwarding it to all ranks");
          begin_stop(128 + sig, sig);
        } else if (!killed) {  // asked twice: stop waiting for the grace period
          say(std::string("got ") + strsignal(sig) + " again; sending SIGKILL");
          signal_groups(SIGKILL);
          killed = true;
        }
      }
    }
  }

  if (result != 0) say("exit code " + std::to_string(result));
  return result;
}

}  // namespace epkit::run
