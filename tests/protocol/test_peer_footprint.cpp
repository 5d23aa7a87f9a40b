// What a context keeps for the peers of a large job. Every endpoint of the
// job has a small record in the engine; the rest of a peer's state comes
// with its lane, the first time the two talk. So an endpoint the context
// never talks to costs at most 48 bytes (the protocol layer's budget per
// peer endpoint: the engine's record, and nothing in the ack dispatcher),
// reading a peer's failure allocates nothing, and a send to a peer with a
// lane allocates nothing either.
//
// Bytes are counted by this program's own operator new: the allocations of
// the counting thread while a case counts (the engine's included, as
// libami calls the program's operator new).
#include <doctest/doctest.h>

#include <cstdlib>
#include <new>
#include <span>
#include <string>
#include <utility>

#include "ami/device/region_table.hpp"
#include "eager/am_engine.hpp"
#include "self_device.hpp"

namespace {

thread_local bool counting = false;
thread_local std::size_t counted = 0;

void* allocate(std::size_t n) {
  if (counting) counted += n;
  if (void* p = std::malloc(n != 0 ? n : 1)) return p;
  throw std::bad_alloc();
}

// Bytes fn() allocated on this thread.
template <class F>
std::size_t bytes_allocated(F&& fn) {
  counted = 0;
  counting = true;
  fn();
  counting = false;
  return counted;
}

}  // namespace

void* operator new(std::size_t n) { return allocate(n); }
void* operator new[](std::size_t n) { return allocate(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

using namespace ami;
using protocol::AmEngine;

namespace {

constexpr std::size_t kBudget = 48;          // bytes per peer endpoint never talked to
constexpr std::uint32_t kEndpoints = 16384;  // a large job's, as one context sees them

AmEngine::Shape shape(std::uint32_t tasks, std::uint16_t contexts) {
  return {.tasks = tasks, .contexts = contexts, .options = {.max_requests = 64}};
}

std::size_t engine_bytes(std::uint32_t tasks, std::uint16_t contexts) {
  ContextStats stats;
  return bytes_allocated([&] { AmEngine engine(shape(tasks, contexts), stats); });
}

}  // namespace

static_assert(AmEngine::idle_peer_bytes() <= kBudget, "an endpoint never talked to must cost a few dozen bytes");

TEST_CASE("an engine for 16,384 peer endpoints keeps at most 48 bytes for each one it never talked to") {
  // What grows with the job, whatever the split into tasks and contexts;
  // the rest (pools, tables by dispatch id) is the same at one endpoint.
  const std::size_t alone = engine_bytes(1, 1);
  for (const auto& [tasks, contexts] : {std::pair<std::uint32_t, std::uint16_t>{16384, 1}, {4096, 4}}) {
    CAPTURE(tasks);
    CAPTURE(contexts);
    const std::size_t grown = engine_bytes(tasks, contexts) - alone;
    MESSAGE("per idle endpoint: ", grown / (kEndpoints - 1), " bytes (record: ", AmEngine::idle_peer_bytes(), ")");
    CHECK(grown <= kBudget * (kEndpoints - 1));
    // The record is all: nothing else is sized by the job.
    CHECK(grown == AmEngine::idle_peer_bytes() * (kEndpoints - 1));
  }
}

TEST_CASE("reading what the engine knows of a peer it never talked to allocates nothing") {
  ContextStats stats;
  AmEngine engine(shape(kEndpoints, 1), stats);
  std::size_t failed = 0;
  std::uint64_t heard = 0;
  std::uint64_t acked = 0;
  const std::size_t bytes = bytes_allocated([&] {
    for (std::uint32_t t = 0; t < kEndpoints; ++t) {
      const Endpoint e{t, 0};
      failed += !engine.peer_status(e).ok();
      failed += !engine.check_alive(e, "send: the endpoint's peer failed").ok();
      heard += engine.heard(e);
      acked += engine.ack_stats(e).messages_acked;
    }
  });
  CHECK(bytes == 0);
  CHECK(failed == 0);
  CHECK(heard == 0);
  CHECK(acked == 0);
}

namespace {

struct Failures {
  int calls = 0;
  Endpoint last{};
  static void on_failure(void* c, Endpoint peer, Status) {
    auto* f = static_cast<Failures*>(c);
    ++f->calls;
    f->last = peer;
  }
};

}  // namespace

TEST_CASE("a peer never talked to fails without state: once, reported, refused after; nothing allocated") {
  ContextStats stats;
  AmEngine engine(shape(kEndpoints, 2), stats);
  Failures f;
  engine.set_error_handler({&Failures::on_failure, &f});
  const Status why{StatusCode::peer_failed, "the peer's process ended"};
  const std::size_t bytes = bytes_allocated([&] {
    engine.abandon_peer({9000, 1}, why);  // Expect: no lane to break: fails here, now
    engine.abandon_peer({9000, 1}, why);  // Expect: failed already: nothing
    engine.on_lane_failed({12, 0}, {});   // Expect: as a device would report it
  });
  CHECK(bytes == 0);
  CHECK(f.calls == 2);
  CHECK(f.last == Endpoint{12, 0});
  CHECK(stats.peers_failed == 2);
  CHECK(engine.peer_status({9000, 1}) == StatusCode::peer_failed);
  CHECK(std::string(engine.peer_status({9000, 1}).what()) == why.what());
  CHECK(engine.peer_status({12, 0}) == StatusCode::peer_failed);
  CHECK(engine.check_alive({12, 0}, "x") == StatusCode::peer_failed);
  CHECK(engine.peer_status({9000, 0}).ok());  // its other context is another endpoint
  const std::byte b[4]{};
  CHECK(engine.send({.dest = {9000, 1}, .dispatch = 1, .payload = b}) == StatusCode::peer_failed);
  CHECK(engine.send_immediate({.dest = {12, 0}, .dispatch = 1, .payload = b}) == StatusCode::peer_failed);
  CHECK(engine.heard({9000, 1}) == 0);
}

namespace {

// Contexts 0 and 1 of task 0 in a job of 8,192 tasks of two contexts, over
// the self backend (which reaches task 0 only).
struct Pair {
  device::RegionTable regions{1, 0, 16};
  self::SelfDomain domain{0, 2, 64, 1024, regions};
  self::SelfDevice da{domain, 0, 16}, db{domain, 1, 16};
  ContextStats sa, sb;
  AmEngine a{shape(kEndpoints / 2, 2), sa}, b{shape(kEndpoints / 2, 2), sb};
  int delivered = 0;

  Pair() {
    a.add_device(da);
    b.add_device(db);
    REQUIRE(b.set_dispatch(1, {+[](void* c, const Incoming&, Receive*) { ++*static_cast<int*>(c); }, &delivered})
                .ok());
  }
  void drain() {
    for (int i = 0; i < 100; ++i) (void)(a.advance() + b.advance());
  }
};

}  // namespace

TEST_CASE("a peer's state comes with its first lane; sends on it, and their arrival, allocate nothing") {
  Pair p;
  const std::byte payload[8]{};
  Status first, later;
  const std::size_t made = bytes_allocated([&] {  // Expect: the lane and the peer's state
    first = p.a.send({.dest = {0, 1}, .dispatch = 1, .payload = payload});
  });
  REQUIRE(first.ok());
  MESSAGE("the first send to a peer allocated ", made, " bytes (the engine's state for it: ",
          AmEngine::active_peer_bytes(), ")");
  CHECK(made >= AmEngine::active_peer_bytes() - AmEngine::idle_peer_bytes());
  p.drain();  // Expect: the receiver's state for its origin, made with the lane back
  REQUIRE(p.delivered == 1);
  const std::size_t steady = bytes_allocated([&] {
    for (int i = 0; i < 100; ++i) {
      later = p.a.send({.dest = {0, 1}, .dispatch = 1, .payload = payload});
      if (!later.ok()) break;
      later = p.a.send_immediate({.dest = {0, 1}, .dispatch = 1, .payload = payload});
      if (!later.ok()) break;
      for (int k = 0; k < 4; ++k) (void)(p.a.advance() + p.b.advance());
    }
  });
  CHECK(later.ok());
  CHECK(steady == 0);
  CHECK(p.delivered == 201);
  CHECK(p.b.heard({0, 0}) == 201);
}
