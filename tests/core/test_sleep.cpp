// Sleeping contexts (docs/DESIGN.md, "Event-driven progress"): a context
// that armed and sleeps on its event_fd() is woken by each source — a
// packet from another context (self) or process (shm), a timer advance()
// keeps (keepalives), post() and signal() from another thread, a peer's
// death — no wake-up is lost when arrivals race with arm() over thousands
// of rounds, and acks and reception credit still flow when a receiver only
// sleeps and wakes. Built into the plain and ASan suites, and run under
// ThreadSanitizer by .ci/run.
#include <doctest/doctest.h>
#include <poll.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "ami/ami.hpp"
#include "ami/wait.hpp"
#include "jobs.hpp"

using namespace ami;

namespace {

constexpr int kWakeMs = 10000;  // a wake-up that has not come by then was lost

ClientOptions contexts(std::uint16_t n) {
  ClientOptions o;
  o.name = "test";
  o.contexts = n;
  REQUIRE(o.config.set("AMI_FIFO_DEPTH", "16").ok());
  return o;
}

// Drains, then arms; the arm's verdict once it is not busy.
Status settle(Context& c) {
  for (int i = 0; i < 100000; ++i) {
    while (c.advance(16) != 0) {
    }
    const Status s = c.arm();
    if (s.code() != StatusCode::busy) return s;
  }
  return {StatusCode::busy, "still busy"};
}

bool readable(Context& c, int ms) {
  pollfd p{c.event_fd(), POLLIN, 0};
  return ::poll(&p, 1, ms) == 1;
}

// Settles and sleeps until woken; false when the wake-up never came.
bool sleep_once(Context& c) { return settle(c).ok() && readable(c, kWakeMs); }

struct Count {
  std::atomic<int> n{0};
  static void on_message(void* c, const Incoming&, Receive*) { static_cast<Count*>(c)->n.fetch_add(1); }
  static void on_done(void* c, Status s) {
    if (s.ok()) static_cast<Count*>(c)->n.fetch_add(1);
  }
};

std::uint64_t word = 7;
std::span<const std::byte> payload() { return std::as_bytes(std::span(&word, 1)); }

}  // namespace

TEST_CASE("self: a sleeping context wakes for a packet, and not before") {
  Client client(contexts(2));
  Context& a = client.context(0);
  Context& b = client.context(1);
  Count got;
  REQUIRE(b.set_dispatch(1, {&Count::on_message, &got}).ok());
  REQUIRE(b.event_fd() >= 0);
  REQUIRE(settle(b).ok());
  CHECK_FALSE(readable(b, 0));
  REQUIRE(a.send({.dest = {0, 1}, .dispatch = 1, .payload = payload()}).ok());
  while (a.advance(16) != 0) {
  }
  REQUIRE(readable(b, kWakeMs));
  for (int i = 0; i < 1000 && got.n.load() == 0; ++i) b.advance();
  CHECK(got.n.load() == 1);
  CHECK(settle(b).ok());
  CHECK_FALSE(readable(b, 0));
}

TEST_CASE("signal() while awake makes arm() busy once; from another thread it wakes a sleeper") {
  Client client(contexts(1));
  Context& c = client.context(0);
  REQUIRE(settle(c).ok());
  c.signal();
  CHECK(c.arm() == StatusCode::busy);
  CHECK(c.arm().ok());
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    c.signal();
  });
  CHECK(readable(c, kWakeMs));
  t.join();
}

TEST_CASE("post() from another thread, under the lock, wakes a sleeping context and runs there") {
  Client client(contexts(1));
  Context& c = client.context(0);
  Count ran;
  c.lock();
  REQUIRE(settle(c).ok());
  c.unlock();
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    c.lock();
    REQUIRE(c.post({&Count::on_done, &ran}).ok());
    c.unlock();
  });
  CHECK(readable(c, kWakeMs));
  t.join();
  c.lock();
  c.advance();
  c.unlock();
  CHECK(ran.n.load() == 1);
}

TEST_CASE("timer: a keepalive round wakes a context that sleeps with a peer") {
  ClientOptions o = contexts(2);
  REQUIRE(o.config.set("AMI_KEEPALIVE_INTERVAL", "50").ok());
  Client client(o);
  Context& a = client.context(0);
  Context& b = client.context(1);
  Count got;
  REQUIRE(b.set_dispatch(1, {&Count::on_message, &got}).ok());
  REQUIRE(a.send({.dest = {0, 1}, .dispatch = 1, .payload = payload()}).ok());
  for (int i = 0; i < 1000 && got.n.load() == 0; ++i) {
    a.advance();
    b.advance();
  }
  REQUIRE(got.n.load() == 1);
  const std::uint64_t before = a.stats().keepalives_sent;
  const auto start = std::chrono::steady_clock::now();
  // b answers nothing (keepalives need no answer): a wakes by its timer
  // alone. (Bounded by time, not by wake-ups: b's acks wake a too.)
  while (a.stats().keepalives_sent == before && std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) {
    REQUIRE(sleep_once(a));
    a.advance();
    while (b.advance(16) != 0) {
    }
  }
  CHECK(a.stats().keepalives_sent > before);
}

// Two threads, a context each, ping-pong; each sleeps before every message
// it waits for. A wake-up lost to the race between an arrival and arm()
// would leave a side asleep: the poll's deadline fails the test.
TEST_CASE("no lost wake-up: thousands of ping-pong rounds, both sides sleeping (self)") {
  Client client(contexts(2));
  constexpr int kRounds = 3000;
  Count got[2];
  for (std::uint16_t i = 0; i < 2; ++i)
    REQUIRE(client.context(i).set_dispatch(1, {&Count::on_message, &got[i]}).ok());
  std::atomic<int> lost{0};
  auto side = [&](std::uint16_t me) {
    Context& c = client.context(me);
    const Endpoint peer{0, static_cast<std::uint16_t>(1 - me)};
    for (int round = 0; round < kRounds; ++round) {
      if ((round % 2) == me) {
        while (!c.send({.dest = peer, .dispatch = 1, .payload = payload()}).ok()) c.advance();
      }
      const int want = round / 2 + 1;
      if ((round % 2) != me) {
        while (got[me].n.load() < want) {
          if (c.advance(16) != 0) continue;
          if (got[me].n.load() >= want) break;
          const Status s = c.arm();
          if (s.ok() && !readable(c, kWakeMs)) {
            lost.fetch_add(1);
            return;
          }
        }
      }
    }
    for (int i = 0; i < 1000; ++i) c.advance();
  };
  std::thread t0(side, 0), t1(side, 1);
  t0.join();
  t1.join();
  CHECK(lost.load() == 0);
  CHECK(got[0].n.load() == kRounds / 2);
  CHECK(got[1].n.load() == kRounds / 2);
}

// ami::wait_until (ami/wait.hpp): the bounded spin, then sleep, of a
// blocking helper. The waiter's CPU time while it waits for a late packet
// shows it slept.
TEST_CASE("wait_until: spins a little, sleeps, wakes for the packet; times out; refuses bad options") {
  Client client(contexts(2));
  Context& a = client.context(0);
  Context& b = client.context(1);
  Count got;
  REQUIRE(b.set_dispatch(1, {&Count::on_message, &got}).ok());
  CHECK(wait_until(b, [&] { return got.n.load() != 0; }, {.batch = 0}) == StatusCode::invalid_argument);
  CHECK(wait_until(b, [&] { return got.n.load() != 0; }, {.spin = std::chrono::microseconds(-1)}) ==
        StatusCode::invalid_argument);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(wait_until(b, [&] { return got.n.load() != 0; }, {.timeout = std::chrono::milliseconds(30)}) ==
        StatusCode::timeout);
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(30));
  // Spinning with sched_yield(), then sleeping: the same answers.
  CHECK(wait_until(b, [&] { return got.n.load() != 0; },
                   {.spin = std::chrono::milliseconds(5), .timeout = std::chrono::milliseconds(20), .yield = true}) ==
        StatusCode::timeout);
  std::thread sender([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    a.lock();
    while (!a.send({.dest = {0, 1}, .dispatch = 1, .payload = payload()}).ok()) a.advance();
    for (int i = 0; i < 100; ++i) a.advance();
    a.unlock();
  });
  timespec c0{}, c1{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
  CHECK(wait_until(b, [&] { return got.n.load() != 0; }, {.timeout = std::chrono::seconds(10)}).ok());
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
  sender.join();
  CHECK(got.n.load() == 1);
  const double cpu = static_cast<double>(c1.tv_sec - c0.tv_sec) + static_cast<double>(c1.tv_nsec - c0.tv_nsec) * 1e-9;
  CHECK(cpu < 0.1);  // spinning through the 200 ms would take them all
  // Already true: returns at once, without advancing.
  CHECK(wait_until(b, [] { return true; }).ok());
}

namespace {

Config shm_only() {
  Config c;
  REQUIRE(c.set("AMI_BACKENDS", "self,shm").ok());
  return c;
}

// Between processes over libfabric, asking for a CQ to sleep on: tcp;ofi_rxm
// sleeps on its wait descriptor (libfabric's shm provider has none).
Config ofi(const char* provider) {
  Config c;
  REQUIRE(c.set("AMI_BACKENDS", "self,ofi").ok());
  REQUIRE(c.set("AMI_OFI_PROVIDER", provider).ok());
  REQUIRE(c.set("AMI_OFI_WAIT", "auto").ok());
  return c;
}

// A side of a ping-pong across processes, sleeping before every message it
// waits for; returns 0, or the round whose wake-up never came + 1000.
int ping_pong(Client& client, int rounds) {
  Context& c = client.context(0);
  static Count got;
  if (!c.set_dispatch(1, {&Count::on_message, &got}).ok()) return 3;
  const std::uint32_t me = client.task();
  const Endpoint peer{1 - me, 0};
  for (int round = 0; round < rounds; ++round) {
    if (static_cast<std::uint32_t>(round % 2) == me) {
      while (!c.send({.dest = peer, .dispatch = 1, .payload = payload()}).ok()) c.advance();
      continue;
    }
    const int want = round / 2 + 1;
    while (got.n.load() < want) {
      if (c.advance(16) != 0) continue;
      if (got.n.load() >= want) break;
      const Status s = c.arm();
      if (s.code() == StatusCode::not_supported) return 4;
      if (s.ok() && !readable(c, kWakeMs)) return 1000 + round % 1000;
    }
  }
  // The last message's sender waits until the peer has it before it ends.
  for (int i = 0; i < 200; ++i) {
    c.advance();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return 0;
}

}  // namespace

TEST_CASE("shm: thousands of rounds between two processes that sleep before every message") {
  auto pids = test::spawn(2, shm_only(), {[](Client& c) { return ping_pong(c, 2000); },
                                          [](Client& c) { return ping_pong(c, 2000); }});
  const auto codes = test::wait_all(pids, std::chrono::seconds(120));
  CHECK(codes == std::vector<int>{0, 0});
}

TEST_CASE("ofi tcp;ofi_rxm: thousands of rounds between two processes that sleep before every message") {
  auto pids = test::spawn(2, ofi("tcp;ofi_rxm"), {[](Client& c) { return ping_pong(c, 2000); },
                                                  [](Client& c) { return ping_pong(c, 2000); }});
  const auto codes = test::wait_all(pids, std::chrono::seconds(120));
  CHECK(codes == std::vector<int>{0, 0});
}

TEST_CASE("ofi shm: arm() says the provider cannot sleep, by name") {
  auto pids = test::spawn(2, ofi("shm"), {[](Client& client) {
    Context& c = client.context(0);
    static Count got;
    if (!c.set_dispatch(1, {&Count::on_message, &got}).ok()) return 3;
    while (got.n.load() == 0) c.advance();  // the peer's lane exists
    const Status s = settle(c);
    if (s.code() != StatusCode::not_supported) return 4;
    if (std::string_view(s.what()).find("wait descriptor") == std::string_view::npos) return 5;
    for (int i = 0; i < 100; ++i) c.advance();
    return 0;
  }, [](Client& client) {
    Context& c = client.context(0);
    while (!c.send({.dest = {0, 0}, .dispatch = 1, .payload = payload()}).ok()) c.advance();
    for (int i = 0; i < 100; ++i) {
      c.advance();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return 0;
  }});
  const auto codes = test::wait_all(pids, std::chrono::seconds(60));
  CHECK(codes == std::vector<int>{0, 0});
}

// A peer's death is found by shm's watch of the mapped processes' pidfds,
// and between tcp;ofi_rxm peers by the bootstrap's connection watch.
static void peer_death_wakes(const Config& config) {
  auto pids = test::spawn(2, config, {[](Client& client) {
    Context& c = client.context(0);
    static Count got;
    static std::atomic<int> failed{0};
    if (!c.set_dispatch(1, {&Count::on_message, &got}).ok()) return 3;
    c.set_error_handler({+[](void*, Endpoint peer, Status) { if (peer.task == 1) failed.fetch_add(1); }, nullptr});
    while (got.n.load() == 0) c.advance();  // the peer is mapped, and watched
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (failed.load() == 0) {
      if (std::chrono::steady_clock::now() > end) return 5;
      const Status s = settle(c);
      if (!s.ok()) return 6;
      if (!readable(c, kWakeMs)) return 7;  // only the death can wake it
    }
    return 0;
  }, [](Client& client) -> int {
    Context& c = client.context(0);
    while (!c.send({.dest = {0, 0}, .dispatch = 1, .payload = payload()}).ok()) c.advance();
    for (int i = 0; i < 100; ++i) {
      c.advance();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::fflush(nullptr);
    _exit(0);  // without a goodbye
  }});
  const auto codes = test::wait_all(pids, std::chrono::seconds(60));
  CHECK(codes == std::vector<int>{0, 0});
}

TEST_CASE("shm: a peer's death wakes a sleeping context, which reports it") { peer_death_wakes(shm_only()); }

TEST_CASE("ofi tcp;ofi_rxm: a peer's death wakes a sleeping context, which reports it") {
  peer_death_wakes(ofi("tcp;ofi_rxm"));
}

// The sender asks for a remote_done on every message, which needs an ack,
// and sends more than the receiver's ring holds, which needs its credit:
// both only ever go out in a lull, and a receiver that only sleeps and
// wakes makes none but those arm() makes.
static void acks_flow_to_sleeper(Config config) {
  constexpr int kMessages = 4000;
  REQUIRE(config.set("AMI_ACK_IDLE_THRESHOLD", "1000").ok());
  auto pids = test::spawn(2, config, {[](Client& client) {
    Context& c = client.context(0);
    static Count done;
    int sent = 0;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (done.n.load() < kMessages) {
      if (std::chrono::steady_clock::now() > end) return 5;
      if (sent < kMessages && c.send({.dest = {1, 0}, .dispatch = 1, .payload = payload(),
                                      .remote_done = {&Count::on_done, &done}}).ok())
        ++sent;
      c.advance();
    }
    return 0;
  }, [](Client& client) {
    Context& c = client.context(0);
    static Count got;
    if (!c.set_dispatch(1, {&Count::on_message, &got}).ok()) return 3;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (got.n.load() < kMessages) {
      if (std::chrono::steady_clock::now() > end) return 5;
      if (c.advance() != 0) continue;  // no idle advances: never a lull of its own
      const Status s = c.arm();
      if (s.ok() && !readable(c, kWakeMs)) return 7;
    }
    // The last acks go as it arms once more and sleeps until the sender ends.
    for (int i = 0; i < 50; ++i) {
      while (c.advance() != 0) {
      }
      if (c.arm().ok()) (void)readable(c, 20);
    }
    return 0;
  }});
  const auto codes = test::wait_all(pids, std::chrono::seconds(120));
  CHECK(codes == std::vector<int>{0, 0});
}

TEST_CASE("shm: acks and credit flow when the receiver only sleeps and wakes") { acks_flow_to_sleeper(shm_only()); }

TEST_CASE("ofi tcp;ofi_rxm: acks and credit flow when the receiver only sleeps and wakes") {
  acks_flow_to_sleeper(ofi("tcp;ofi_rxm"));
}
