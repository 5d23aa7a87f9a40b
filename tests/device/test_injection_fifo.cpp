// Callback completion (docs/DESIGN.md, method 1): the injection FIFO, its pending
// callback list and the transfer counter, driven by hand as a device would.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "ami/device/injection_fifo.hpp"

using ami::Callback;
using ami::Status;
using Fifo = ami::device::InjectionFifo<std::uint64_t>;

namespace {

// Records the order callbacks ran in.
struct Log {
  std::vector<std::uint64_t> order;
  std::vector<Status> statuses;
};
struct Tag {
  Log* log;
  std::uint64_t id;
};
void record(void* cookie, Status s) {
  auto* t = static_cast<Tag*>(cookie);
  t->log->order.push_back(t->id);
  t->log->statuses.push_back(s);
}

// Injects one instruction whose descriptor is its injection number.
bool inject(Fifo& f, Callback cb = {}) {
  std::uint64_t* slot = f.try_reserve();
  if (slot == nullptr) return false;
  *slot = f.injected();
  f.commit(cb);
  return true;
}

}  // namespace

TEST_CASE("nothing pending or counter unmoved: the advance step does nothing") {
  Fifo f(8);
  CHECK(f.complete() == 0);
  REQUIRE(inject(f));  // no callback: lists nothing
  f.counter().advance(1);
  CHECK(f.pending_callbacks() == 0);
  CHECK(f.complete() == 0);

  Log log;
  Tag t{&log, 7};
  REQUIRE(inject(f, {record, &t}));
  CHECK(f.pending_callbacks() == 1);
  CHECK(f.complete() == 0);  // counter has not moved past it
  CHECK(log.order.empty());
  f.counter().advance(1);
  CHECK(f.complete() == 1);
  CHECK(log.order == std::vector<std::uint64_t>{7});
  CHECK(f.pending_callbacks() == 0);
  CHECK(f.complete() == 0);  // called once only
}

TEST_CASE("wraparound many times over, callbacks in order, each exactly once") {
  constexpr std::uint32_t kDepth = 8;
  Fifo f(kDepth);
  Log log;
  std::vector<Tag> tags(1000);
  std::uint64_t next_tag = 0, device_done = 0;
  while (next_tag < tags.size()) {
    // Fill what is free, every third instruction with a callback.
    while (next_tag < tags.size()) {
      const std::uint64_t n = f.injected();
      tags[n] = Tag{&log, n};
      if (!inject(f, n % 3 == 0 ? Callback{record, &tags[n]} : Callback{})) break;
      ++next_tag;
    }
    CHECK(f.injected() - device_done <= kDepth);
    // The device completes a varying number, then software advances.
    const std::uint64_t step = 1 + (device_done % 5);
    device_done = std::min<std::uint64_t>(device_done + step, f.injected());
    f.counter().advance_to(device_done);
    f.complete();
  }
  f.counter().advance_to(f.injected());
  f.complete();
  std::vector<std::uint64_t> expected;
  for (std::uint64_t i = 0; i < tags.size(); i += 3) expected.push_back(i);
  CHECK(log.order == expected);
  CHECK(f.pending_callbacks() == 0);
  CHECK(f.injected() == tags.size());  // 125 times round the ring
}

TEST_CASE("a slot the device has passed is not free until its callback has run") {
  Fifo f(4);
  Log log;
  Tag t0{&log, 0};
  REQUIRE(inject(f, {record, &t0}));
  for (int i = 1; i < 4; ++i) REQUIRE(inject(f));
  CHECK(f.try_reserve() == nullptr);  // full: device not past anything

  f.counter().advance_to(4);  // device passed all four; no advance yet
  CHECK(f.try_reserve() == nullptr);  // slot 0 still lists its callback
  CHECK(log.order.empty());

  CHECK(f.complete() == 1);
  CHECK(log.order == std::vector<std::uint64_t>{0});
  CHECK(f.try_reserve() != nullptr);  // now free
}

TEST_CASE("a slot reused before the advance step cannot fire its new callback early") {
  Fifo f(4);
  for (int i = 0; i < 4; ++i) REQUIRE(inject(f));  // no callbacks
  f.counter().advance_to(4);                      // device passed them, no advance called
  Log log;
  Tag late{&log, 4};
  REQUIRE(inject(f, {record, &late}));  // injection 4 reuses slot 0
  CHECK(f.complete() == 0);             // 4 is not done: nothing may run
  CHECK(log.order.empty());
  f.counter().advance_to(5);
  CHECK(f.complete() == 1);
  CHECK(log.order == std::vector<std::uint64_t>{4});
}

TEST_CASE("interleaved instructions with and without callbacks") {
  Fifo f(16);
  Log log;
  Tag tags[16];
  const bool has_cb[] = {true, false, false, true, true, false, true, false};
  for (std::uint64_t i = 0; i < 8; ++i) {
    tags[i] = Tag{&log, i};
    REQUIRE(inject(f, has_cb[i] ? Callback{record, &tags[i]} : Callback{}));
  }
  CHECK(f.pending_callbacks() == 4);
  f.counter().advance_to(2);  // covers 0 (cb) and 1 (none)
  CHECK(f.complete() == 1);
  CHECK(f.pending_callbacks() == 3);
  f.counter().advance_to(3);  // 2 has none: nothing to call
  CHECK(f.complete() == 0);
  f.counter().advance_to(8);
  CHECK(f.complete() == 3);
  CHECK(log.order == std::vector<std::uint64_t>{0, 3, 4, 6});
  CHECK(f.pending_callbacks() == 0);
}

TEST_CASE("a callback that injects again sees a consistent FIFO") {
  struct Chain {
    Fifo* f;
    int left;
    int ran = 0;
  };
  Fifo f(2);
  Chain c{&f, 5};
  auto again = [](void* cookie, Status) {
    auto* ch = static_cast<Chain*>(cookie);
    ++ch->ran;
    if (--ch->left > 0) {
      std::uint64_t* s = ch->f->try_reserve();
      REQUIRE(s != nullptr);
      ch->f->commit({+[](void* k, Status st) {
                       auto* cc = static_cast<Chain*>(k);
                       ++cc->ran;
                       (void)st;
                     },
                     ch});
    }
  };
  REQUIRE(inject(f, {again, &c}));
  f.counter().advance_to(1);
  CHECK(f.complete() == 1);
  CHECK(c.ran == 1);
  CHECK(f.complete() == 0);  // the new one is not done yet
  f.counter().advance_to(2);
  CHECK(f.complete() == 1);
  CHECK(c.ran == 2);
}

TEST_CASE("counter snapshot taken while the device keeps moving") {
  constexpr std::uint64_t kTotal = 200000;
  constexpr std::uint32_t kDepth = 64;
  Fifo f(kDepth);
  // Callback cookies live in a ring beside the FIFO: entry n % depth belongs
  // to instruction n until its callback has run, which is exactly when the
  // FIFO may hand its slot out again.
  struct Entry {
    std::uint64_t id;
    std::uint64_t* expect_next;
    bool* out_of_order;
  };
  std::uint64_t expect_next = 0;
  bool out_of_order = false;
  std::vector<Entry> entries(kDepth);
  auto cb = [](void* cookie, Status s) {
    auto* e = static_cast<Entry*>(cookie);
    if (e->id != *e->expect_next || !s.ok()) *e->out_of_order = true;
    ++*e->expect_next;
  };
  std::atomic<std::uint64_t> published{0};
  std::atomic<bool> stop{false};
  std::thread device([&] {  // advances the counter in uneven strides
    std::uint64_t done = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      const std::uint64_t p = published.load(std::memory_order_acquire);
      if (done < p) {
        done += 1 + (p - done) / 2;
        f.counter().advance_to(done);
      }
    }
  });
  std::uint64_t injected = 0, snapshots_moving = 0;
  while (injected < kTotal) {
    if (f.try_reserve() != nullptr) {
      entries[injected % kDepth] = Entry{injected, &expect_next, &out_of_order};
      f.commit({cb, &entries[injected % kDepth]});
      published.store(++injected, std::memory_order_release);
    }
    const std::uint64_t before = f.counter().snapshot();
    f.complete();
    if (f.counter().snapshot() != before) ++snapshots_moving;  // device moved during the step
  }
  while (expect_next < kTotal) f.complete();
  stop = true;
  device.join();
  CHECK_FALSE(out_of_order);
  CHECK(expect_next == kTotal);
  CHECK(f.pending_callbacks() == 0);
  MESSAGE("advance steps during which the device moved: " << snapshots_moving);
}

TEST_CASE("fail_one and fail_pending deliver the error once") {
  Fifo f(4);
  Log log;
  Tag t[4] = {{&log, 0}, {&log, 1}, {&log, 2}, {&log, 3}};
  for (auto& tag : t) REQUIRE(inject(f, {record, &tag}));
  f.fail_one(1, {ami::StatusCode::remote_access, "refused"});
  f.counter().advance_to(2);
  CHECK(f.complete() == 1);  // 0 with ok; 1 already ran
  CHECK(f.fail_pending({ami::StatusCode::peer_failed, "gone"}) == 2);
  REQUIRE(log.order == std::vector<std::uint64_t>{1, 0, 2, 3});
  CHECK(log.statuses[0] == ami::StatusCode::remote_access);
  CHECK(log.statuses[1].ok());
  CHECK(log.statuses[2] == ami::StatusCode::peer_failed);
  CHECK(log.statuses[3] == ami::StatusCode::peer_failed);
  CHECK(f.complete() == 0);
  CHECK(f.try_reserve() != nullptr);
}
