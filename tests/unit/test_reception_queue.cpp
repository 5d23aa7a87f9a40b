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
    q.commit(r2, 6, {2, 0, 0});
    CHECK_FALSE(q.peek(a));  // r1 not yet committed: order is kept
    q.discard(r1);
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
    q.commit(r, 0, {});
  }
  CHECK_FALSE(q.reserve());
  ReceptionQueue::Arrival a;
  REQUIRE(q.peek(a));
  q.release();
  CHECK(q.reserve());
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
  q.commit(r, 4096, {});
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
        q.commit(r, sizeof i, {static_cast<std::uint32_t>(p), 0, 0});
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
