// ami/asio.hpp (docs/DESIGN.md, "Event-driven progress"): contexts driven
// by an io_context run from 1 and from 4 threads exchange thousands of
// messages, each driver sleeping between them (a lost wake-up stalls the
// exchange past its deadline); an idle driver sleeps instead of spinning;
// post() from a thread outside the io_context wakes it; stop() ends it.
// Run under ThreadSanitizer by .ci/run.
#include <doctest/doctest.h>
#include <time.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <thread>
#include <vector>

#include "ami/ami.hpp"
#include "ami/asio.hpp"

using namespace ami;

namespace {

ClientOptions contexts(std::uint16_t n) {
  ClientOptions o;
  o.name = "test";
  o.contexts = n;
  REQUIRE(o.config.set("AMI_BACKENDS", "self").ok());
  return o;
}

double cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// Runs io from n threads until it runs out of work, or stops it and fails
// the test after deadline.
void run(boost::asio::io_context& io, unsigned n, std::chrono::seconds deadline, std::atomic<bool>& timed_out) {
  std::atomic<bool> finished{false};
  std::thread watchdog([&] {
    const auto end = std::chrono::steady_clock::now() + deadline;
    while (!finished.load() && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!finished.load()) {
      timed_out = true;
      io.stop();
    }
  });
  std::vector<std::thread> threads;
  for (unsigned i = 1; i < n; ++i) threads.emplace_back([&] { io.run(); });
  io.run();
  for (auto& t : threads) t.join();
  finished = true;
  watchdog.join();
}

// Two contexts play ping-pong: each handler answers from inside advance(),
// on its driver's strand. The last one stops both drivers.
struct PingPong {
  static constexpr std::uint16_t kId = 1;
  Context* ctx[2] = {};
  AsioDriver* driver[2] = {};
  int rounds = 0;
  std::atomic<int> got{0};
  std::atomic<int> in_handler[2] = {0, 0};
  std::atomic<int> overlaps{0};
  std::uint64_t word = 0;

  void send(int from) {
    const Status s = ctx[from]->send_immediate(
        {.dest = {0, static_cast<std::uint16_t>(1 - from)}, .dispatch = kId,
         .payload = std::as_bytes(std::span(&word, 1))});
    CHECK(s.ok());
  }
  template <int Me>
  static void on_message(void* self, const Incoming&, Receive*) {
    auto* p = static_cast<PingPong*>(self);
    if (p->in_handler[Me].fetch_add(1) != 0) p->overlaps.fetch_add(1);  // the strand's promise
    const int n = p->got.fetch_add(1) + 1;
    if (n < p->rounds) {
      p->send(Me);
    } else {
      p->driver[0]->stop();
      p->driver[1]->stop();
    }
    p->in_handler[Me].fetch_sub(1);
  }
};

void ping_pong(unsigned threads) {
  Client client(contexts(2));
  boost::asio::io_context io(static_cast<int>(threads));
  PingPong p;
  p.rounds = 4000;
  p.ctx[0] = &client.context(0);
  p.ctx[1] = &client.context(1);
  REQUIRE(p.ctx[0]->set_dispatch(PingPong::kId, {&PingPong::on_message<0>, &p}).ok());
  REQUIRE(p.ctx[1]->set_dispatch(PingPong::kId, {&PingPong::on_message<1>, &p}).ok());
  AsioDriver d0(io, *p.ctx[0]), d1(io, *p.ctx[1]);
  p.driver[0] = &d0;
  p.driver[1] = &d1;
  REQUIRE(d0.start().ok());
  REQUIRE(d1.start().ok());
  d0.post([&](Context&) { p.send(0); });
  std::atomic<bool> timed_out{false};
  run(io, threads, std::chrono::seconds(60), timed_out);
  CHECK_FALSE(timed_out.load());
  CHECK(p.got.load() == p.rounds);
  CHECK(p.overlaps.load() == 0);
  CHECK(d0.status().ok());
  CHECK(d1.status().ok());
  // Each side slept and was woken between messages, not only spun.
  CHECK(d0.wakeups() + d1.wakeups() > 0);
  INFO("wake-ups " << d0.wakeups() << " + " << d1.wakeups() << ", busy arms " << d0.busy_arms() << " + "
                   << d1.busy_arms());
}

}  // namespace

TEST_CASE("asio: ping-pong between two driven contexts, io_context on 1 thread") { ping_pong(1); }

TEST_CASE("asio: ping-pong between two driven contexts, io_context on 4 threads") { ping_pong(4); }

TEST_CASE("asio: an idle driver sleeps, and post() from another thread wakes it") {
  for (unsigned threads : {1u, 4u}) {
    CAPTURE(threads);
    Client client(contexts(2));
    Context& a = client.context(0);
    Context& b = client.context(1);
    std::atomic<int> got{0};
    const auto count = +[](void* c, const Incoming&, Receive*) { static_cast<std::atomic<int>*>(c)->fetch_add(1); };
    REQUIRE(b.set_dispatch(1, {count, &got}).ok());
    boost::asio::io_context io(static_cast<int>(threads));
    AsioDriver da(io, a), db(io, b);
    REQUIRE(da.start().ok());
    REQUIRE(db.start().ok());
    std::atomic<bool> timed_out{false};
    std::atomic<double> idle_cpu{0};
    std::thread outsider([&] {
      // Idle for 300 ms: the io_context's threads sleep in the reactor.
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const double c0 = cpu_seconds();
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      idle_cpu = cpu_seconds() - c0;
      // A send from a thread the io_context does not run wakes a's driver.
      std::uint64_t word = 9;
      da.post([word](Context& c) {
        CHECK(c.send_immediate({.dest = {0, 1}, .dispatch = 1, .payload = std::as_bytes(std::span(&word, 1))}).ok());
      });
      for (int i = 0; i < 10000 && got.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      da.stop();
      db.stop();
    });
    run(io, threads, std::chrono::seconds(30), timed_out);
    outsider.join();
    CHECK_FALSE(timed_out.load());
    CHECK(got.load() == 1);
    // Two contexts busy-polled would take 300 ms of CPU or more; asleep, a few.
    CHECK(idle_cpu.load() < 0.1);
  }
}

TEST_CASE("asio: bad arguments and a second start are refused") {
  Client client(contexts(1));
  boost::asio::io_context io;
  AsioDriver zero(io, client.context(0), 0);
  CHECK(zero.start() == StatusCode::invalid_argument);
  AsioDriver d(io, client.context(0));
  REQUIRE(d.start().ok());
  CHECK(d.start() == StatusCode::invalid_argument);
  d.stop();
  io.run();
}
