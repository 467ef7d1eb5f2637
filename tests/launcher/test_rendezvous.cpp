// The TCP rendezvous on loopback: every rank is a thread of this process.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "epkit/error.hpp"
#include "transport/rendezvous.hpp"

namespace {

using epkit::RendezvousOptions;
using Blob = std::vector<uint8_t>;
using Clock = std::chrono::steady_clock;

// A port free right now (bind port 0). Each test takes its own so tests cannot disturb each other.
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

RendezvousOptions options(int port, int rank, int world, int timeout_ms = 20000) {
  RendezvousOptions o;
  o.port = port;
  o.rank = rank;
  o.world_size = world;
  o.timeout_ms = timeout_ms;
  return o;
}

Blob random_blob(std::mt19937_64& rng, size_t max_bytes) {
  Blob b(rng() % (max_bytes + 1));
  for (auto& x : b) x = uint8_t(rng());
  return b;
}

// Runs fn(rank) on `world` threads; returns each rank's exception text ("" if none).
std::vector<std::string> run_ranks(int world, const std::function<void(int)>& fn) {
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(Rendezvous, BroadcastReturnsRootBlobEverywhere) {
  const int world = 4, port = free_port();
  const Blob root_blob = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<Blob> got(world);
  expect_no_errors(run_ranks(world, [&](int r) {
    Blob mine = r == 0 ? root_blob : Blob{uint8_t(100 + r)};  // ignored off rank 0
    got[size_t(r)] = epkit::rendezvous_broadcast(options(port, r, world), mine);
  }));
  for (int r = 0; r < world; ++r) EXPECT_EQ(got[size_t(r)], root_blob) << "rank " << r;
}

TEST(Rendezvous, AllgatherReturnsBlobsByRank) {
  const int world = 5, port = free_port();
  std::vector<std::vector<Blob>> got(world);
  auto blob_of = [](int r) { return Blob(size_t(r * 3), uint8_t(r + 1)); };  // rank 0: empty
  expect_no_errors(run_ranks(world, [&](int r) {
    got[size_t(r)] = epkit::rendezvous_allgather(options(port, r, world), blob_of(r));
  }));
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(got[size_t(r)].size(), size_t(world));
    for (int s = 0; s < world; ++s) EXPECT_EQ(got[size_t(r)][size_t(s)], blob_of(s)) << r << "<-" << s;
  }
}

TEST(Rendezvous, ManyOperationsBackToBackOnOnePort) {
  // Random blobs and random per-rank delays: fast ranks reach operation k+1 while rank 0 still
  // answers operation k, which the protocol must absorb.
  const int world = 4, num_ops = 40, port = free_port();
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::vector<std::vector<std::vector<Blob>>> got(world);  // [rank][op][src]
  auto blob = [&](int op, int r) {
    std::mt19937_64 rng(seed ^ (uint64_t(op) << 20) ^ uint64_t(r));
    return random_blob(rng, 300);
  };
  expect_no_errors(run_ranks(world, [&](int r) {
    std::mt19937_64 delay(seed + uint64_t(r));
    for (int op = 0; op < num_ops; ++op) {
      if (delay() % 4 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay() % 5));
      if (op % 2 == 0)
        got[size_t(r)].push_back({epkit::rendezvous_broadcast(options(port, r, world), blob(op, r))});
      else
        got[size_t(r)].push_back(epkit::rendezvous_allgather(options(port, r, world), blob(op, r)));
    }
  }));
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(got[size_t(r)].size(), size_t(num_ops));
    for (int op = 0; op < num_ops; ++op) {
      const auto& g = got[size_t(r)][size_t(op)];
      if (op % 2 == 0) {
        EXPECT_EQ(g.at(0), blob(op, 0)) << "rank " << r << " op " << op;
      } else {
        ASSERT_EQ(g.size(), size_t(world));
        for (int s = 0; s < world; ++s) EXPECT_EQ(g[size_t(s)], blob(op, s)) << r << " op " << op;
      }
    }
  }
}

TEST(Rendezvous, RankZeroStartingLateIsWaitedFor) {
  const int world = 3, port = free_port();
  std::vector<Blob> got(world);
  expect_no_errors(run_ranks(world, [&](int r) {
    if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(400));
    got[size_t(r)] = epkit::rendezvous_broadcast(options(port, r, world), Blob{42});
  }));
  for (int r = 0; r < world; ++r) EXPECT_EQ(got[size_t(r)], Blob{42});
}

TEST(Rendezvous, LargeBlobsSurvivePartialReadsAndWrites) {
  const int world = 3, port = free_port();
  std::mt19937_64 rng(7);
  std::vector<Blob> blobs;
  for (int r = 0; r < world; ++r) blobs.push_back(Blob(size_t(4 << 20) + size_t(r), uint8_t(0)));
  for (auto& b : blobs)
    for (auto& x : b) x = uint8_t(rng());
  std::vector<std::vector<Blob>> got(world);
  expect_no_errors(run_ranks(world, [&](int r) {
    got[size_t(r)] = epkit::rendezvous_allgather(options(port, r, world), blobs[size_t(r)]);
  }));
  for (int r = 0; r < world; ++r) EXPECT_TRUE(got[size_t(r)] == blobs) << "rank " << r;
}

TEST(Rendezvous, WorldOfOneNeedsNoNetwork) {
  auto o = options(1, 0, 1);  // port 1 would need root: proves nothing is bound
  EXPECT_EQ(epkit::rendezvous_broadcast(o, Blob{9}), Blob{9});
  EXPECT_EQ(epkit::rendezvous_allgather(o, Blob{8}), std::vector<Blob>{Blob{8}});
}

TEST(Rendezvous, MissingRankTimesOutWithinTheBound) {
  const int world = 3, port = free_port(), timeout_ms = 500;
  const auto start = Clock::now();
  auto errors = run_ranks(2, [&](int r) {  // rank 2 never shows up
    epkit::rendezvous_allgather(options(port, r, world, timeout_ms), Blob{1});
  });
  const auto elapsed = Clock::now() - start;
  EXPECT_LT(elapsed, std::chrono::milliseconds(timeout_ms + 1500));
  EXPECT_GE(elapsed, std::chrono::milliseconds(timeout_ms - 50));
  ASSERT_NE(errors[0], "");
  EXPECT_NE(errors[0].find("timed out"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("rank(s) 2"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("127.0.0.1:" + std::to_string(port)), std::string::npos) << errors[0];
  ASSERT_NE(errors[1], "");
  EXPECT_NE(errors[1].find("rank 1 of 3"), std::string::npos) << errors[1];
}

TEST(Rendezvous, NoRankZeroTimesOutWithinTheBound) {
  const int port = free_port(), timeout_ms = 300;
  const auto start = Clock::now();
  try {
    epkit::rendezvous_broadcast(options(port, 1, 2, timeout_ms), {});
    FAIL() << "expected a timeout";
  } catch (const epkit::Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("timed out after 300 ms"), std::string::npos) << what;
    EXPECT_NE(what.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << what;
    EXPECT_NE(what.find("Connection refused"), std::string::npos) << what;
  }
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(timeout_ms + 1000));
}

TEST(Rendezvous, MismatchedOperationsFailLoudlyOnBothSides) {
  const int port = free_port();
  auto errors = run_ranks(2, [&](int r) {
    if (r == 0)
      epkit::rendezvous_broadcast(options(port, 0, 2, 5000), Blob{1});
    else
      epkit::rendezvous_allgather(options(port, 1, 2, 5000), Blob{2});
  });
  for (const auto& e : errors) EXPECT_NE(e.find("different orders"), std::string::npos) << e;
}

TEST(Rendezvous, WorldSizeMismatchFailsLoudly) {
  const int port = free_port();
  auto errors = run_ranks(2, [&](int r) {
    epkit::rendezvous_broadcast(options(port, r, r == 0 ? 2 : 3, 5000), Blob{1});
  });
  for (const auto& e : errors) EXPECT_NE(e.find("world size 3, rank 0 has 2"), std::string::npos) << e;
}

TEST(Rendezvous, StrayConnectionIsIgnored) {
  // Something that is not an epkit peer (a port probe) connects and sends junk first.
  const int world = 2, port = free_port();
  std::vector<Blob> got(world);
  std::thread probe([&] {
    for (int i = 0; i < 200; ++i) {
      int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(uint16_t(port));
      bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
      if (ok) {
        const char junk[] = "GET / HTTP/1.0\r\n\r\n-----------------";
        (void)!::write(fd, junk, sizeof(junk));
      }
      ::close(fd);
      if (ok) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  expect_no_errors(run_ranks(world, [&](int r) {
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));  // probe comes first
    got[size_t(r)] = epkit::rendezvous_broadcast(options(port, r, world, 5000), Blob{5});
  }));
  probe.join();
  EXPECT_EQ(got[1], Blob{5});
}

TEST(Rendezvous, InvalidOptionsAreRejected) {
  EXPECT_THROW(epkit::rendezvous_broadcast(options(29500, 2, 2), {}), epkit::Error);
  EXPECT_THROW(epkit::rendezvous_broadcast(options(0, 0, 2), {}), epkit::Error);
  EXPECT_THROW(epkit::rendezvous_broadcast(options(29500, 0, 0), {}), epkit::Error);
  EXPECT_THROW(epkit::rendezvous_broadcast(options(29500, 0, 2, 0), {}), epkit::Error);
}

// Sets and restores the four variables around each environment test.
class RendezvousEnv : public ::testing::Test {
 protected:
  static constexpr const char* kVars[] = {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"};
  void SetUp() override {
    for (const char* v : kVars) {
      const char* old = std::getenv(v);
      saved_.emplace_back(v, old ? std::optional<std::string>(old) : std::nullopt);
      ::unsetenv(v);
    }
  }
  void TearDown() override {
    for (auto& [k, v] : saved_) v ? (void)::setenv(k.c_str(), v->c_str(), 1) : (void)::unsetenv(k.c_str());
  }
  // The message of the error rendezvous_options_from_env throws, "" if none.
  static std::string env_error() {
    try {
      epkit::rendezvous_options_from_env();
    } catch (const epkit::Error& e) {
      return e.what();
    }
    return "";
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST_F(RendezvousEnv, DefaultsWhenUnset) {
  auto o = epkit::rendezvous_options_from_env();
  EXPECT_EQ(o.host, "127.0.0.1");
  EXPECT_EQ(o.port, 29500);
  EXPECT_EQ(o.rank, 0);
  EXPECT_EQ(o.world_size, 1);
}

TEST_F(RendezvousEnv, ReadsTorchrunVariables) {
  ::setenv("MASTER_ADDR", "node7", 1);
  ::setenv("MASTER_PORT", "12345", 1);
  ::setenv("RANK", "3", 1);
  ::setenv("WORLD_SIZE", "8", 1);
  auto o = epkit::rendezvous_options_from_env();
  EXPECT_EQ(o.host, "node7");
  EXPECT_EQ(o.port, 12345);
  EXPECT_EQ(o.rank, 3);
  EXPECT_EQ(o.world_size, 8);
}

TEST_F(RendezvousEnv, MalformedValuesNameTheVariableAndValue) {
  const std::vector<std::pair<const char*, const char*>> bad = {
      {"RANK", "abc"},       {"RANK", "-1"},          {"RANK", "1x"},         {"RANK", ""},
      {"WORLD_SIZE", "0"},   {"WORLD_SIZE", "2.5"},   {"MASTER_PORT", "0"},   {"MASTER_PORT", "70000"},
      {"MASTER_PORT", " 80"}, {"MASTER_PORT", "+80"}, {"WORLD_SIZE", "99999999999999999999"}};
  for (auto [var, value] : bad) {
    ::setenv(var, value, 1);
    std::string e = env_error();
    EXPECT_NE(e.find(std::string(var) + "='" + value + "'"), std::string::npos) << var << "=" << value << ": " << e;
    ::unsetenv(var);
  }
  ::setenv("MASTER_ADDR", "", 1);
  EXPECT_NE(env_error().find("MASTER_ADDR"), std::string::npos);
  ::unsetenv("MASTER_ADDR");
  ::setenv("RANK", "4", 1);
  ::setenv("WORLD_SIZE", "4", 1);
  std::string e = env_error();
  EXPECT_NE(e.find("RANK='4'"), std::string::npos) << e;
  EXPECT_NE(e.find("WORLD_SIZE='4'"), std::string::npos) << e;
}

}  // namespace
