// The reception queue: a ring of cells in memory it does not own.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "ami/device/reception_queue.hpp"

using ami::device::ReceptionQueue;

namespace {

struct Buffer {
  explicit Buffer(std::size_t n) : bytes(n), p(std::aligned_alloc(64, (n + 63) / 64 * 64)) {}
  ~Buffer() { std::free(p); }
  std::size_t bytes;
  void* p;
};

}  // namespace

TEST_CASE("reserve, commit, discard and wrap") {
  Buffer mem(ReceptionQueue::bytes_needed(4, 128));
  auto q = ReceptionQueue::create(mem.p, 4, 128);
  CHECK(q.max_data() == 128 - ReceptionQueue::kCellHeader);
  ReceptionQueue::Arrival a;
  CHECK_FALSE(q.peek(a));
  for (int round = 0; round < 10; ++round) {
    auto r1 = q.reserve();
    auto r2 = q.reserve();
    REQUIRE(r1);
    REQUIRE(r2);
    std::memcpy(r2.data(), "second", 6);
    CHECK(q.commit(r2, 6, {2, 0, 0}));
    CHECK_FALSE(q.peek(a));  // r1 not yet committed: order is kept
    CHECK(q.discard(r1));
    REQUIRE(q.peek(a));  // the discarded cell is skipped
    CHECK(a.origin.task == 2);
    CHECK(std::memcmp(a.data.data(), "second", 6) == 0);
    q.release();
    CHECK_FALSE(q.peek(a));
  }
}

TEST_CASE("a full ring refuses a reservation instead of waiting") {
  Buffer mem(ReceptionQueue::bytes_needed(4, 128));
  auto q = ReceptionQueue::create(mem.p, 4, 128);
  for (int i = 0; i < 4; ++i) {
    auto r = q.reserve();
    REQUIRE(r);
    CHECK(q.commit(r, 0, {}));
  }
  CHECK_FALSE(q.reserve());
  ReceptionQueue::Arrival a;
  REQUIRE(q.peek(a));
  q.release();
  CHECK(q.reserve());
}

TEST_CASE("a cell held too long is given up: the cells behind it flow, its late commit fails") {
  Buffer mem(ReceptionQueue::bytes_needed(4, 128));
  auto q = ReceptionQueue::create(mem.p, 4, 128);
  ReceptionQueue::Arrival a;
  std::uint64_t position = 99;
  CHECK_FALSE(q.stalled(position));  // empty: nothing waits
  for (int round = 0; round < 6; ++round) {  // several laps of the ring
    auto held = q.reserve();
    auto behind = q.reserve();
    REQUIRE(held);
    REQUIRE(behind);
    std::memcpy(behind.data(), "behind", 6);
    CHECK(q.commit(behind, 6, {3, 0, 0}));
    CHECK_FALSE(q.peek(a));  // blocked by the held cell
    REQUIRE(q.stalled(position));
    CHECK(position == held.position);
    CHECK_FALSE(q.give_up(position + 1));  // only the next cell can be given up
    CHECK(q.give_up(position));
    CHECK_FALSE(q.stalled(position));
    REQUIRE(q.peek(a));
    CHECK(a.origin.task == 3);
    CHECK(std::memcmp(a.data.data(), "behind", 6) == 0);
    q.release();
    std::memcpy(held.data(), "late", 4);
    CHECK_FALSE(q.commit(held, 4, {4, 0, 0}));  // the producer learns its packet is lost
    CHECK_FALSE(q.peek(a));                      // and the consumer never sees it
    q.publish();
  }
  // A cell committed just before the consumer gives up is delivered, not skipped.
  auto r = q.reserve();
  REQUIRE(q.stalled(position));
  CHECK(q.commit(r, 0, {5, 0, 0}));
  CHECK_FALSE(q.give_up(position));
  REQUIRE(q.peek(a));
  CHECK(a.origin.task == 5);
}

TEST_CASE("attach checks the header") {
  Buffer mem(ReceptionQueue::bytes_needed(8, 256));
  ReceptionQueue::create(mem.p, 8, 256);
  ReceptionQueue q;
  CHECK(ReceptionQueue::attach(mem.p, mem.bytes, q));
  CHECK_FALSE(ReceptionQueue::attach(mem.p, mem.bytes - 1, q));  // shorter than it says
  CHECK_FALSE(ReceptionQueue::attach(mem.p, 10, q));
  auto* h = static_cast<ReceptionQueue::Header*>(mem.p);
  h->version = 99;
  CHECK_FALSE(ReceptionQueue::attach(mem.p, mem.bytes, q));
  h->version = ReceptionQueue::kVersion;
  h->depth = 6;  // not a power of two
  CHECK_FALSE(ReceptionQueue::attach(mem.p, mem.bytes, q));
  h->depth = 8;
  h->magic = 0;
  CHECK_FALSE(ReceptionQueue::attach(mem.p, mem.bytes, q));
}

TEST_CASE("a cell claiming more data than a cell holds is dropped") {
  Buffer mem(ReceptionQueue::bytes_needed(4, 128));
  auto q = ReceptionQueue::create(mem.p, 4, 128);
  auto r = q.reserve();
  CHECK(q.commit(r, 4096, {}));
  ReceptionQueue::Arrival a;
  CHECK_FALSE(q.peek(a));
  CHECK(q.reserve());  // its cell went back to the producers
}

TEST_CASE("several producers, one consumer: every packet once, per-producer order kept") {
  constexpr int kProducers = 3;
  constexpr std::uint32_t kEach = 50000;
  Buffer mem(ReceptionQueue::bytes_needed(64, 128));
  auto q = ReceptionQueue::create(mem.p, 64, 128);
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p)
    producers.emplace_back([&q, p] {
      for (std::uint32_t i = 0; i < kEach;) {
        auto r = q.reserve();
        if (!r) {
          std::this_thread::yield();
          continue;
        }
        std::memcpy(r.data(), &i, sizeof i);
        if (!q.commit(r, sizeof i, {static_cast<std::uint32_t>(p), 0, 0})) std::abort();  // nobody gives up here
        ++i;
      }
    });
  std::vector<std::uint32_t> next(kProducers, 0);
  std::uint64_t received = 0;
  bool ordered = true;
  while (received < std::uint64_t{kProducers} * kEach) {
    ReceptionQueue::Arrival a;
    if (!q.peek(a)) continue;
    std::uint32_t v;
    std::memcpy(&v, a.data.data(), sizeof v);
    if (a.origin.task >= kProducers || v != next[a.origin.task]) ordered = false;
    else ++next[a.origin.task];
    q.release();
    ++received;
  }
  for (auto& t : producers) t.join();
  CHECK(ordered);
  for (int p = 0; p < kProducers; ++p) CHECK(next[p] == kEach);
}

// docs/DESIGN.md, "Event-driven progress": the consumer arms only an empty
// ring; the one reservation that takes the bit is told to wake it, and the
// position arithmetic never sees the bit.
TEST_CASE("arm: only an empty ring arms, and exactly one producer is told to wake the consumer") {
  Buffer mem(ReceptionQueue::bytes_needed(4, 128));
  auto q = ReceptionQueue::create(mem.p, 4, 128);
  CHECK(q.arm());
  CHECK(q.arm());  // armed already
  CHECK(q.tail() == 0);
  CHECK(q.occupancy() == 0);
  auto first = q.reserve();
  REQUIRE(first);
  CHECK(first.wake);
  CHECK(first.position == 0);
  auto second = q.reserve();
  REQUIRE(second);
  CHECK_FALSE(second.wake);
  CHECK(q.tail() == 2);
  CHECK(q.occupancy() == 2);
  CHECK_FALSE(q.arm());  // two cells reserved: consume first
  CHECK(q.commit(first, 1, {}));
  CHECK(q.commit(second, 1, {}));
  ReceptionQueue::Arrival a;
  for (int i = 0; i < 2; ++i) {
    REQUIRE(q.peek(a));
    q.release();
  }
  CHECK(q.arm());
  // A full ring stays full with the bit set: the producers still see it so.
  for (int i = 0; i < 4; ++i) {
    auto r = q.reserve();
    REQUIRE(r);
    CHECK(r.wake == (i == 0));
    CHECK(q.commit(r, 1, {}));
  }
  CHECK_FALSE(q.reserve());
}
