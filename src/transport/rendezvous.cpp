// TCP rendezvous behind include/epkit/rendezvous.hpp.
//
// Protocol: one TCP connection per rank > 0 and operation; rank 0 serves.
//   rank r -> rank 0 : HELLO  header [+ its blob, allgather only]
//   rank 0 -> rank r : REPLY  header + payload (broadcast: root's blob; allgather: every blob)
//                      ERROR  header + text, when rank 0 saw ranks disagree (then both sides throw)
// Every header is 32 bytes, big-endian: magic, version, type, op kind, op sequence number, sender
// rank, world size, payload length.
//
// Rank 0 listens only while it collects the hellos of one operation, and closes that listener
// before it sends any reply. So a fast rank that already began the next operation never reaches
// the previous one: it finds no listener (connection refused) or, at worst, a connection that is
// reset before any reply byte; both are retried until rank 0 listens again or the deadline
// passes. The sequence number (per host, port and rank in this process, advanced on success) turns
// ranks calling operations in different orders into a loud error instead of wrong blobs.
//
// Sockets are non-blocking and every wait is a poll() bounded by the operation's deadline.
#include "transport/rendezvous.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <utility>

#include "epkit/error.hpp"

namespace epkit {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMagic = 0x45505256;  // "EPRV"
constexpr uint16_t kVersion = 1;
constexpr size_t kHeaderBytes = 32;
constexpr uint64_t kMaxPayload = uint64_t(64) << 20;  // bounds memory a garbage length could claim

enum class FrameType : uint16_t { kHello = 1, kReply = 2, kError = 3 };
enum class OpKind : uint16_t { kBroadcast = 1, kAllgather = 2 };

const char* op_name(OpKind k) { return k == OpKind::kBroadcast ? "broadcast" : "allgather"; }

struct Header {
  uint32_t magic = kMagic;
  uint16_t version = kVersion;
  FrameType type = FrameType::kHello;
  OpKind op = OpKind::kBroadcast;
  uint32_t seq = 0;
  int32_t rank = 0;
  int32_t world_size = 0;
  uint64_t payload_bytes = 0;
};

void put_be(uint8_t* p, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i, v >>= 8) p[i] = uint8_t(v & 0xff);
}
uint64_t get_be(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | p[i];
  return v;
}

std::array<uint8_t, kHeaderBytes> encode(const Header& h) {
  std::array<uint8_t, kHeaderBytes> b{};
  put_be(&b[0], h.magic, 4);
  put_be(&b[4], h.version, 2);
  put_be(&b[6], uint16_t(h.type), 2);
  put_be(&b[8], uint16_t(h.op), 2);
  // bytes 10..11 reserved (zero)
  put_be(&b[12], h.seq, 4);
  put_be(&b[16], uint32_t(h.rank), 4);
  put_be(&b[20], uint32_t(h.world_size), 4);
  put_be(&b[24], h.payload_bytes, 8);
  return b;
}

Header decode(const uint8_t* b) {
  Header h;
  h.magic = uint32_t(get_be(&b[0], 4));
  h.version = uint16_t(get_be(&b[4], 2));
  h.type = FrameType(get_be(&b[6], 2));
  h.op = OpKind(get_be(&b[8], 2));
  h.seq = uint32_t(get_be(&b[12], 4));
  h.rank = int32_t(uint32_t(get_be(&b[16], 4)));
  h.world_size = int32_t(uint32_t(get_be(&b[20], 4)));
  h.payload_bytes = get_be(&b[24], 8);
  return h;
}

// A failure the client side may retry (rank 0 not listening yet, stale backlog reset, ...).
struct Retryable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string errno_text(int e) { return std::strerror(e); }

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// Milliseconds left before `deadline`, clamped to [0, INT_MAX] for poll().
int ms_left(Clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return int(std::clamp<long long>(ms, 0, INT_MAX));
}

// Everything one operation needs: options, kind, sequence number and a message prefix.
struct Op {
  RendezvousOptions opt;
  OpKind kind;
  uint32_t seq;
  Clock::time_point deadline;

  std::string where() const {
    return detail::concat("rendezvous ", op_name(kind), " #", seq, " (rank ", opt.rank, " of ",
                          opt.world_size, ", rank 0 at ", opt.host, ":", opt.port, ")");
  }
};

void validate(const RendezvousOptions& o) {
  EPKIT_CHECK(!o.host.empty(), "rendezvous: host (MASTER_ADDR) is empty");
  EPKIT_CHECK(o.port >= 1 && o.port <= 65535, "rendezvous: port ", o.port, " not in [1, 65535]");
  EPKIT_CHECK(o.world_size >= 1, "rendezvous: world_size ", o.world_size, " must be >= 1");
  EPKIT_CHECK(o.rank >= 0 && o.rank < o.world_size, "rendezvous: rank ", o.rank, " not in [0, ",
              o.world_size, ")");
  EPKIT_CHECK(o.timeout_ms > 0, "rendezvous: timeout_ms ", o.timeout_ms, " must be > 0");
}

// Per-process operation counter keyed by (host, port, rank): threads may act as different ranks.
std::mutex g_seq_mutex;
std::map<std::tuple<std::string, int, int>, uint32_t> g_seq;

uint32_t current_seq(const RendezvousOptions& o) {
  std::lock_guard<std::mutex> lock(g_seq_mutex);
  return g_seq[{o.host, o.port, o.rank}];
}
void advance_seq(const RendezvousOptions& o) {
  std::lock_guard<std::mutex> lock(g_seq_mutex);
  ++g_seq[{o.host, o.port, o.rank}];
}

struct Addrs {
  addrinfo* list = nullptr;
  ~Addrs() {
    if (list) freeaddrinfo(list);
  }
};

// getaddrinfo is bounded by the resolver's own timeouts (resolv.conf), not by ours.
void resolve(const Op& op, bool passive, Addrs& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  const std::string port = std::to_string(op.opt.port);
  int rc = getaddrinfo(op.opt.host.c_str(), port.c_str(), &hints, &out.list);
  EPKIT_CHECK(rc == 0 && out.list, op.where(), ": cannot resolve host '", op.opt.host,
              "': ", gai_strerror(rc));
}

std::string peer_name(const sockaddr_storage& ss) {
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&ss), sizeof(ss), host, sizeof(host), serv,
                  sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "?";
  return std::string(host) + ":" + serv;
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // best effort: latency only
}

// Short sleep between retries, never past the deadline.
void backoff(int& delay_ms, Clock::time_point deadline) {
  std::this_thread::sleep_for(std::chrono::milliseconds(std::min(delay_ms, ms_left(deadline))));
  delay_ms = std::min(delay_ms * 2, 200);
}

// Waits for `events` on fd until the deadline. Returns false on timeout.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, ms_left(deadline));
    if (rc > 0) return true;  // readiness or error: the following call reports which
    if (rc == 0) return false;
    if (errno != EINTR) throw Retryable(std::string("poll: ") + errno_text(errno));
  }
}

// Sends all bytes or throws Retryable (peer gone) / Error (timeout).
void send_all(int fd, const uint8_t* p, size_t n, const Op& op, const char* what) {
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k > 0) {
      p += k;
      n -= size_t(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_fd(fd, POLLOUT, op.deadline))
        EPKIT_FAIL(op.where(), ": timed out after ", op.opt.timeout_ms, " ms sending ", what);
      continue;
    }
    throw Retryable(std::string("sending ") + what + ": " + errno_text(k < 0 ? errno : EPIPE));
  }
}

// Receives exactly n bytes. EOF or reset throws Retryable; the deadline throws Error.
void recv_all(int fd, uint8_t* p, size_t n, const Op& op, const char* what) {
  while (n > 0) {
    ssize_t k = ::recv(fd, p, n, 0);
    if (k > 0) {
      p += k;
      n -= size_t(k);
      continue;
    }
    if (k == 0) throw Retryable(std::string("connection closed by rank 0 while reading ") + what);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_fd(fd, POLLIN, op.deadline))
        EPKIT_FAIL(op.where(), ": timed out after ", op.opt.timeout_ms, " ms waiting for ", what,
                   " (is rank 0 still waiting for other ranks?)");
      continue;
    }
    throw Retryable(std::string("reading ") + what + ": " + errno_text(errno));
  }
}

// ---------------------------------------------------------------------------------------------
// Payload encodings.

// Allgather reply: for each rank, an 8-byte length then the bytes.
std::vector<uint8_t> pack_all(const std::vector<std::vector<uint8_t>>& blobs) {
  size_t total = 0;
  for (const auto& b : blobs) total += 8 + b.size();
  std::vector<uint8_t> out(total);
  uint8_t* p = out.data();
  for (const auto& b : blobs) {
    put_be(p, b.size(), 8);
    if (!b.empty()) std::memcpy(p + 8, b.data(), b.size());
    p += 8 + b.size();
  }
  return out;
}

std::vector<std::vector<uint8_t>> unpack_all(const std::vector<uint8_t>& in, int world, const Op& op) {
  std::vector<std::vector<uint8_t>> blobs(static_cast<size_t>(world));
  size_t off = 0;
  for (int r = 0; r < world; ++r) {
    EPKIT_CHECK(in.size() - off >= 8, op.where(), ": truncated allgather reply at rank ", r);
    uint64_t len = get_be(&in[off], 8);
    off += 8;
    EPKIT_CHECK(len <= in.size() - off, op.where(), ": allgather reply entry ", r, " claims ", len,
                " bytes, only ", in.size() - off, " left");
    blobs[size_t(r)].assign(in.begin() + long(off), in.begin() + long(off + len));
    off += len;
  }
  EPKIT_CHECK(off == in.size(), op.where(), ": ", in.size() - off, " trailing bytes in allgather reply");
  return blobs;
}

// ---------------------------------------------------------------------------------------------
// Rank 0.

Fd listen_on(const Op& op) {
  Addrs addrs;
  resolve(op, /*passive=*/true, addrs);
  std::string last = "no address";
  int delay_ms = 5;
  // EADDRINUSE is retried: the previous job or operation may still hold the port for a moment.
  for (;;) {
    for (addrinfo* a = addrs.list; a; a = a->ai_next) {
      Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
      if (fd.get() < 0) {
        last = "socket: " + errno_text(errno);
        continue;
      }
      int one = 1;
      setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
        last = "bind: " + errno_text(errno);
        continue;
      }
      if (::listen(fd.get(), std::max(op.opt.world_size, 128)) != 0) {
        last = "listen: " + errno_text(errno);
        continue;
      }
      return fd;
    }
    if (ms_left(op.deadline) == 0)
      EPKIT_FAIL(op.where(), ": timed out after ", op.opt.timeout_ms, " ms trying to listen (", last, ")");
    backoff(delay_ms, op.deadline);
  }
}

// One accepted connection whose hello is still arriving.
struct Incoming {
  Fd fd;
  std::string peer;
  std::vector<uint8_t> buf;  // header, then header + payload
  bool have_header = false;
  Header h;
};

// Best effort: tells every connected peer why rank 0 gives up, so they fail now, not at timeout.
void send_error_to_all(std::vector<Incoming>& conns, const Op& op, const std::string& msg) {
  Op quick = op;
  quick.deadline = std::min(op.deadline, Clock::now() + std::chrono::milliseconds(1000));
  for (auto& c : conns) {
    Header h;
    h.type = FrameType::kError;
    h.op = op.kind;
    h.seq = op.seq;
    h.rank = 0;
    h.world_size = op.opt.world_size;
    h.payload_bytes = msg.size();
    auto hb = encode(h);
    try {
      send_all(c.fd.get(), hb.data(), hb.size(), quick, "error header");
      send_all(c.fd.get(), reinterpret_cast<const uint8_t*>(msg.data()), msg.size(), quick, "error text");
    } catch (const std::exception&) {
      // The peer will time out on its own; rank 0's exception already carries the reason.
    }
  }
}

// Checks a complete hello against this operation; returns an empty string if it belongs here.
std::string hello_mismatch(const Header& h, const Op& op) {
  if (h.world_size != op.opt.world_size)
    return detail::concat("rank ", h.rank, " has world size ", h.world_size, ", rank 0 has ",
                          op.opt.world_size);
  if (h.rank <= 0 || h.rank >= op.opt.world_size)
    return detail::concat("a peer claims rank ", h.rank, ", outside [1, ", op.opt.world_size, ")");
  if (h.op != op.kind || h.seq != op.seq)
    return detail::concat("rank ", h.rank, " is at rendezvous op #", h.seq, " (",
                          h.op == OpKind::kBroadcast ? "broadcast" : h.op == OpKind::kAllgather ? "allgather" : "?",
                          ") but rank 0 is at op #", op.seq, " (", op_name(op.kind),
                          "): ranks called rendezvous operations in different orders");
  if (op.kind == OpKind::kBroadcast && h.payload_bytes != 0)
    return detail::concat("rank ", h.rank, " sent ", h.payload_bytes, " bytes with a broadcast hello");
  return {};
}

// Collects one hello from every rank 1..N-1; returns connections indexed by rank (0 unused).
std::vector<Incoming> gather_hellos(const Op& op) {
  const int world = op.opt.world_size;
  Fd listener = listen_on(op);
  std::vector<Incoming> pending;          // accepted, hello incomplete
  std::vector<Incoming> done(static_cast<size_t>(world));  // complete hellos by rank
  int num_done = 0;
  std::string dropped;  // why the last stray connection was dropped, for the timeout message

  auto fail = [&](const std::string& msg) {
    std::vector<Incoming> all;
    for (auto& c : done)
      if (c.fd.get() >= 0) all.push_back(std::move(c));
    for (auto& c : pending) all.push_back(std::move(c));
    send_error_to_all(all, op, msg);
    EPKIT_FAIL(op.where(), ": ", msg);
  };

  while (num_done < world - 1) {
    std::vector<pollfd> fds;
    fds.push_back({listener.get(), POLLIN, 0});
    for (auto& c : pending) fds.push_back({c.fd.get(), POLLIN, 0});
    int rc = ::poll(fds.data(), fds.size(), ms_left(op.deadline));
    if (rc < 0 && errno == EINTR) continue;
    EPKIT_CHECK(rc >= 0, op.where(), ": poll failed: ", errno_text(errno));
    if (rc == 0) {
      std::string missing;
      for (int r = 1; r < world; ++r)
        if (done[size_t(r)].fd.get() < 0) missing += (missing.empty() ? "" : ",") + std::to_string(r);
      fail(detail::concat("timed out after ", op.opt.timeout_ms, " ms waiting for rank(s) ", missing,
                          " to connect", dropped.empty() ? "" : " (dropped a stray connection: " + dropped + ")"));
    }
    // Connections first: fds[i + 1] belongs to pending[i] as polled.
    std::vector<bool> drop(pending.size(), false);
    for (size_t i = 0; i < pending.size(); ++i) {
      if (!fds[i + 1].revents) continue;
      Incoming& c = pending[i];
      size_t want = c.have_header ? kHeaderBytes + c.h.payload_bytes : kHeaderBytes;
      size_t have = c.buf.size();
      c.buf.resize(want);
      ssize_t k = ::recv(c.fd.get(), c.buf.data() + have, want - have, 0);
      if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) {
        c.buf.resize(have);
        continue;
      }
      if (k <= 0) {  // the peer gave up (it retries) or a probe closed: not an error of this op
        dropped = c.peer + (k == 0 ? " closed early" : ": " + errno_text(errno));
        drop[i] = true;
        continue;
      }
      c.buf.resize(have + size_t(k));
      if (!c.have_header && c.buf.size() == kHeaderBytes) {
        c.h = decode(c.buf.data());
        if (c.h.magic != kMagic) {  // not an epkit peer (port scanner, health probe): ignore it
          dropped = detail::concat(c.peer, " sent bad magic 0x", std::hex, c.h.magic);
          drop[i] = true;
          continue;
        }
        if (c.h.version != kVersion)
          fail(detail::concat("peer ", c.peer, " speaks rendezvous protocol version ", c.h.version,
                              ", this build speaks ", kVersion));
        if (c.h.type != FrameType::kHello)
          fail(detail::concat("peer ", c.peer, " sent frame type ", uint16_t(c.h.type), ", expected a hello"));
        if (c.h.payload_bytes > kMaxPayload)
          fail(detail::concat("peer ", c.peer, " announces ", c.h.payload_bytes, " bytes, limit ", kMaxPayload));
        c.have_header = true;
      }
      if (c.have_header && c.buf.size() == kHeaderBytes + c.h.payload_bytes) {
        std::string bad = hello_mismatch(c.h, op);
        if (!bad.empty()) fail(bad + " (peer " + c.peer + ")");
        if (done[size_t(c.h.rank)].fd.get() >= 0)
          fail(detail::concat("two processes claim rank ", c.h.rank, " (", done[size_t(c.h.rank)].peer,
                              " and ", c.peer, ")"));
        int r = c.h.rank;
        done[size_t(r)] = std::move(c);
        drop[i] = true;  // moved out of pending
        ++num_done;
      }
    }
    for (size_t i = pending.size(); i-- > 0;)
      if (drop[i]) pending.erase(pending.begin() + long(i));
    // Accept only while hellos are missing (no reply was sent yet, so nothing here can be a peer
    // of the next operation).
    if (num_done < world - 1 && (fds[0].revents & POLLIN)) {
      for (;;) {
        sockaddr_storage ss{};
        socklen_t len = sizeof(ss);
        int fd = ::accept4(listener.get(), reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          // Drained, or one connection died in the backlog: poll again. Anything else (EMFILE)
          // would keep the listener readable and spin, so it ends the operation.
          if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) break;
          fail("accept failed: " + errno_text(errno));
        }
        set_nodelay(fd);
        Incoming c;
        c.fd = Fd(fd);
        c.peer = peer_name(ss);
        pending.push_back(std::move(c));
      }
    }
  }
  return done;  // `listener` closes here, before any reply: see the protocol note at the top
}

template <typename MakePayload>
void serve(const Op& op, MakePayload&& make_payload) {
  std::vector<Incoming> conns = gather_hellos(op);
  std::vector<uint8_t> payload = make_payload(conns);
  EPKIT_CHECK(payload.size() <= kMaxPayload, op.where(), ": reply of ", payload.size(),
              " bytes exceeds the limit of ", kMaxPayload);
  Header h;
  h.type = FrameType::kReply;
  h.op = op.kind;
  h.seq = op.seq;
  h.rank = 0;
  h.world_size = op.opt.world_size;
  h.payload_bytes = payload.size();
  auto hb = encode(h);
  for (int r = 1; r < op.opt.world_size; ++r) {
    try {
      send_all(conns[size_t(r)].fd.get(), hb.data(), hb.size(), op, "reply header");
      send_all(conns[size_t(r)].fd.get(), payload.data(), payload.size(), op, "reply");
    } catch (const Retryable& e) {
      EPKIT_FAIL(op.where(), ": rank ", r, " (", conns[size_t(r)].peer, ") left before its reply: ", e.what());
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Ranks 1..N-1.

// One non-blocking connect to any address of rank 0; throws Retryable when nothing answers.
Fd connect_once(const Op& op, const Addrs& addrs) {
  std::string last = "no address";
  for (addrinfo* a = addrs.list; a; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (fd.get() < 0) {
      last = "socket: " + errno_text(errno);
      continue;
    }
    int rc = ::connect(fd.get(), a->ai_addr, a->ai_addrlen);
    if (rc != 0 && (errno == EINPROGRESS || errno == EINTR)) {
      if (!wait_fd(fd.get(), POLLOUT, op.deadline)) {
        last = "connect: no answer before the deadline";
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err ? -1 : 0;
      errno = err;
    }
    if (rc != 0) {
      last = "connect: " + errno_text(errno);
      continue;
    }
    set_nodelay(fd.get());
    return fd;
  }
  throw Retryable(last);
}

// Sends this rank's hello and returns rank 0's reply payload. Retries until the deadline.
std::vector<uint8_t> request(const Op& op, const std::vector<uint8_t>& hello_payload) {
  EPKIT_CHECK(hello_payload.size() <= kMaxPayload, op.where(), ": blob of ", hello_payload.size(),
              " bytes exceeds the limit of ", kMaxPayload);
  Addrs addrs;
  resolve(op, /*passive=*/false, addrs);
  Header h;
  h.type = FrameType::kHello;
  h.op = op.kind;
  h.seq = op.seq;
  h.rank = op.opt.rank;
  h.world_size = op.opt.world_size;
  h.payload_bytes = hello_payload.size();
  const auto hb = encode(h);
  std::string last;
  int delay_ms = 5;
  int attempts = 0;
  while (ms_left(op.deadline) > 0) {
    ++attempts;
    try {
      Fd fd = connect_once(op, addrs);
      send_all(fd.get(), hb.data(), hb.size(), op, "hello");
      send_all(fd.get(), hello_payload.data(), hello_payload.size(), op, "blob");
      std::array<uint8_t, kHeaderBytes> rb{};
      recv_all(fd.get(), rb.data(), rb.size(), op, "rank 0's reply header");
      // From here on rank 0 has answered this operation: failures are final, not retried.
      Header r = decode(rb.data());
      EPKIT_CHECK(r.magic == kMagic, op.where(), ": bad magic 0x", std::hex, r.magic, " from rank 0");
      EPKIT_CHECK(r.version == kVersion, op.where(), ": rank 0 speaks protocol version ", r.version,
                  ", this build speaks ", kVersion);
      EPKIT_CHECK(r.payload_bytes <= kMaxPayload, op.where(), ": rank 0 announces ", r.payload_bytes,
                  " bytes, limit ", kMaxPayload);
      std::vector<uint8_t> payload(r.payload_bytes);
      try {
        recv_all(fd.get(), payload.data(), payload.size(), op, "rank 0's reply");
      } catch (const Retryable& e) {
        EPKIT_FAIL(op.where(), ": rank 0 broke off its reply: ", e.what());
      }
      if (r.type == FrameType::kError)
        EPKIT_FAIL(op.where(), ": rank 0 aborted: ", std::string(payload.begin(), payload.end()));
      EPKIT_CHECK(r.type == FrameType::kReply && r.op == op.kind && r.seq == op.seq, op.where(),
                  ": rank 0 answered frame type ", uint16_t(r.type), " for op #", r.seq);
      return payload;
    } catch (const Retryable& e) {
      last = e.what();
    }
    backoff(delay_ms, op.deadline);
  }
  EPKIT_FAIL(op.where(), ": timed out after ", op.opt.timeout_ms, " ms reaching rank 0 (", attempts,
             " attempts; last error: ", last.empty() ? "none" : last, ")");
}

Op begin(const RendezvousOptions& opt, OpKind kind) {
  validate(opt);
  return Op{opt, kind, current_seq(opt), Clock::now() + std::chrono::milliseconds(opt.timeout_ms)};
}

int parse_env_int(const char* name, int fallback, int lo, int hi) {
  const char* v = std::getenv(name);
  if (!v) return fallback;
  errno = 0;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  // strtol alone would accept " 80" and "+80": insist on a plain decimal.
  const bool plain = (*v >= '0' && *v <= '9') || (*v == '-' && v[1] >= '0' && v[1] <= '9');
  EPKIT_CHECK(plain && *end == '\0' && errno == 0 && x >= lo && x <= hi,
              "environment variable ", name, "='", v, "' is not an integer in [", lo, ", ", hi, "]");
  return int(x);
}

}  // namespace

RendezvousOptions rendezvous_options_from_env() {
  RendezvousOptions o;
  if (const char* addr = std::getenv("MASTER_ADDR")) {
    EPKIT_CHECK(*addr != '\0', "environment variable MASTER_ADDR is set but empty");
    o.host = addr;
  }
  o.port = parse_env_int("MASTER_PORT", o.port, 1, 65535);
  o.world_size = parse_env_int("WORLD_SIZE", o.world_size, 1, 1 << 20);
  o.rank = parse_env_int("RANK", o.rank, 0, (1 << 20) - 1);
  EPKIT_CHECK(o.rank < o.world_size, "environment variable RANK='", o.rank,
              "' is not below WORLD_SIZE='", o.world_size, "'");
  return o;
}

std::vector<uint8_t> rendezvous_broadcast(const RendezvousOptions& opt, const std::vector<uint8_t>& blob) {
  const Op op = begin(opt, OpKind::kBroadcast);
  std::vector<uint8_t> result;
  if (opt.world_size == 1) {
    result = blob;
  } else if (opt.rank == 0) {
    serve(op, [&](std::vector<Incoming>&) { return blob; });
    result = blob;
  } else {
    result = request(op, {});
  }
  advance_seq(opt);
  return result;
}

std::vector<std::vector<uint8_t>> rendezvous_allgather(const RendezvousOptions& opt,
                                                       const std::vector<uint8_t>& blob) {
  const Op op = begin(opt, OpKind::kAllgather);
  std::vector<std::vector<uint8_t>> result;
  if (opt.world_size == 1) {
    result = {blob};
  } else if (opt.rank == 0) {
    serve(op, [&](std::vector<Incoming>& conns) {
      result.assign(size_t(opt.world_size), {});
      result[0] = blob;
      for (int r = 1; r < opt.world_size; ++r) {
        auto& buf = conns[size_t(r)].buf;
        result[size_t(r)].assign(buf.begin() + long(kHeaderBytes), buf.end());
      }
      return pack_all(result);
    });
  } else {
    result = unpack_all(request(op, blob), opt.world_size, op);
  }
  advance_seq(opt);
  return result;
}

}  // namespace epkit
