// The threaded parts: contexts driven by their own threads (reception
// queues with several producer threads, registration of memory from any
// thread), and one context shared by threads through its lock. Built into
// the plain and ASan suites like every test, and run under ThreadSanitizer
// by .ci/run.
#include <doctest/doctest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "ami/ami.hpp"

using namespace ami;

namespace {

ClientOptions contexts(std::uint16_t n) {
  ClientOptions o;
  o.name = "test";
  o.contexts = n;
  REQUIRE(o.config.set("AMI_FIFO_DEPTH", "16").ok());
  return o;
}

struct Tally {
  std::atomic<int> arrived{0};
  std::atomic<int> answered{0};
  std::atomic<int> errors{0};
  static void on_message(void* c, const Incoming& in, Receive*) {
    auto* t = static_cast<Tally*>(c);
    if (in.payload.size() != sizeof(std::uint64_t)) t->errors.fetch_add(1);
    t->arrived.fetch_add(1);
  }
  static void on_answer(void* c, Status s) {
    auto* t = static_cast<Tally*>(c);
    if (!s.ok()) t->errors.fetch_add(1);
    t->answered.fetch_add(1);
  }
};

}  // namespace

TEST_CASE("three contexts on three threads: two send to the third, which sends back; remote-dones") {
  Client client(contexts(3));
  constexpr int kEach = 5000;
  Tally at[3];
  for (std::uint16_t c = 0; c < 3; ++c)
    REQUIRE(client.context(c).set_dispatch(1, {&Tally::on_message, &at[c]}).ok());
  std::atomic<int> bad_status{0}, finished{0};
  auto run = [&](std::uint16_t me) {
    Context& c = client.context(me);
    const std::uint64_t word = me;
    // Contexts 1 and 2 send kEach to 0; 0 sends kEach to each of them.
    std::vector<std::uint16_t> targets = me == 0 ? std::vector<std::uint16_t>{1, 2} : std::vector<std::uint16_t>{0};
    const int want_in = me == 0 ? 2 * kEach : kEach;
    const int to_send = kEach * static_cast<int>(targets.size());
    int sent = 0;
    while (sent < to_send || at[me].arrived.load() < want_in || at[me].answered.load() < to_send) {
      if (sent < to_send) {
        Status s = c.send({.dest = {0, targets[static_cast<std::size_t>(sent) % targets.size()]}, .dispatch = 1,
                           .payload = std::as_bytes(std::span(&word, 1)),
                           .remote_done = {&Tally::on_answer, &at[me]}});
        if (s.ok()) ++sent;
        else if (s != StatusCode::no_resource) bad_status.fetch_add(1);
      }
      (void)c.advance();
    }
    // The others may still wait for this context's acks.
    finished.fetch_add(1);
    while (finished.load() < 3) (void)c.advance();
  };
  std::thread t0(run, 0), t1(run, 1), t2(run, 2);
  t0.join();
  t1.join();
  t2.join();
  CHECK(bad_status.load() == 0);
  CHECK(at[0].arrived.load() == 2 * kEach);
  CHECK(at[1].arrived.load() == kEach);
  CHECK(at[2].arrived.load() == kEach);
  for (const Tally& t : at) CHECK(t.errors.load() == 0);
}

TEST_CASE("one context shared by four threads through its lock") {
  Client client(contexts(2));
  Context &shared = client.context(0), &target = client.context(1);
  constexpr int kEach = 3000;
  Tally in;
  REQUIRE(target.set_dispatch(1, {&Tally::on_message, &in}).ok());
  std::atomic<int> answered{0}, bad_status{0};
  std::atomic<bool> stop{false};
  std::thread receiver([&] {
    while (!stop.load()) (void)target.advance();
  });
  auto run = [&](int me) {
    const std::uint64_t word = static_cast<std::uint64_t>(me);
    int sent = 0;
    while (sent < kEach) {
      shared.lock();
      Status s = shared.send({.dest = {0, 1}, .dispatch = 1, .payload = std::as_bytes(std::span(&word, 1)),
                              .remote_done = {+[](void* n, Status r) {
                                static_cast<std::atomic<int>*>(n)->fetch_add(r.ok() ? 1 : 1000000);
                              }, &answered}});
      if (s.ok()) ++sent;
      else if (s != StatusCode::no_resource) bad_status.fetch_add(1);
      (void)shared.advance();
      shared.unlock();
    }
    while (answered.load() < 4 * kEach) {
      if (shared.try_lock()) {
        (void)shared.advance();
        shared.unlock();
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back(run, i);
  for (auto& t : threads) t.join();
  stop.store(true);
  receiver.join();
  CHECK(bad_status.load() == 0);
  CHECK(answered.load() == 4 * kEach);
  CHECK(in.arrived.load() == 4 * kEach);
}

TEST_CASE("memory registered from several threads while contexts stream") {
  Client client(contexts(2));
  std::atomic<bool> stop{false};
  Tally in;
  REQUIRE(client.context(1).set_dispatch(1, {&Tally::on_message, &in}).ok());
  std::thread streamer([&] {
    Context& c = client.context(0);
    const std::uint64_t word = 3;
    while (!stop.load()) {
      (void)c.send_immediate({.dest = {0, 1}, .dispatch = 1, .payload = std::as_bytes(std::span(&word, 1))});
      (void)c.advance();
    }
  });
  std::thread drainer([&] {
    while (!stop.load()) (void)client.context(1).advance();
  });
  std::atomic<int> failures{0};
  auto registrar = [&] {
    std::vector<std::byte> buffer(1 << 16);
    for (int i = 0; i < 300; ++i) {
      Memory m;
      if (!client.register_memory(buffer.data() + i, 4096, m).ok()) failures.fetch_add(1);
    }
  };
  std::thread r0(registrar), r1(registrar);
  r0.join();
  r1.join();
  stop.store(true);
  streamer.join();
  drainer.join();
  CHECK(failures.load() == 0);
  CHECK(in.errors.load() == 0);
}
