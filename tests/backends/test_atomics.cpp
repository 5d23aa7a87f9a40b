// Remote atomics (Context::atomic) through every backend: each op, width
// and signedness; counters many tasks increment at once, by one path or by
// several to one word; a lock made of compare_swap; refusals by name; a
// fence behind atomics; a peer that dies with atomics in flight. Each
// TEST_CASE_TEMPLATE runs once per backend pair (pair.hpp), on a region the
// owner allocated (shm maps it: its peer does the atomics itself) and on one
// it only registered (shm reaches it by CMA only: the owner's engine does
// them). VerbsNicPair is verbs with the owner's regions in the NIC's
// atomic domain (AMI_ATOMIC_MODE=nic): its NIC does 64-bit fetch-add and
// compare-swap from the origin, and the owner's engine the rest through its
// own NIC. Compiled once and linked twice, as test_backends.cpp is: the
// pairs that need an RDMA port run, by name, in the rxe VM.
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "ami/ami.hpp"
#include "jobs.hpp"
#include "pair.hpp"

using namespace ami;

namespace test {
struct VerbsNicPair : VerbsPair {
  explicit VerbsNicPair(const Config& config) : VerbsPair(with_nic(config)) {}
  static Config with_nic(Config c) {
    REQUIRE(c.set("AMI_ATOMIC_MODE", "nic").ok());
    return c;
  }
};
}  // namespace test
TYPE_TO_STRING_AS("VerbsNicPair", test::VerbsNicPair);

namespace {

template <class P>
constexpr bool kNicDomain = std::is_same_v<P, test::VerbsNicPair>;

#define BACKENDS_HERE test::SelfPair, test::ShmPair, test::OfiTcpPair, test::OfiShmPair
#define BACKENDS_RDMA test::VerbsPair, test::VerbsNicPair, test::OfiVerbsPair
#define BACKENDS BACKENDS_HERE, BACKENDS_RDMA

struct Counter {
  int calls = 0;
  Status last;
  static void fn(void* c, Status s) {
    auto* k = static_cast<Counter*>(c);
    ++k->calls;
    k->last = s;
  }
  Callback cb() { return {&Counter::fn, this}; }
};

void advance_until(Context& a, Context& b, const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!done() && std::chrono::steady_clock::now() < deadline)
    for (int i = 0; i < 64; ++i) {
      (void)a.advance();
      (void)b.advance();
    }
  REQUIRE(done());
}

// The target's region: allocated (a memfd segment a shm peer maps) or a
// plain buffer registered (reached by CMA or messages only).
struct Region {
  Memory memory;
  std::vector<std::uint64_t> plain;  // (8-byte aligned)
  Region(Client& owner, bool allocated, std::size_t bytes) {
    if (allocated) {
      REQUIRE(owner.allocate_memory(bytes, memory).ok());
    } else {
      plain.assign(bytes / 8, 0);
      REQUIRE(owner.register_memory(plain.data(), bytes, memory).ok());
    }
    std::memset(memory.address(), 0, bytes);
  }
  std::byte* at(std::uint64_t offset) const { return static_cast<std::byte*>(memory.address()) + offset; }
};

// What op does to the word w with operand v and compare c, in the word's
// width: the reference the results are checked against.
std::uint64_t expected(AtomicOp op, std::uint64_t w, std::uint64_t v, std::uint64_t c, std::uint64_t mask) {
  switch (op) {
    case AtomicOp::fetch_add:
    case AtomicOp::add: return (w + v) & mask;
    case AtomicOp::swap: return v & mask;
    case AtomicOp::compare_swap: return (w == (c & mask)) ? v & mask : w;
    case AtomicOp::fetch_and: return w & v;
    case AtomicOp::fetch_or: return (w | v) & mask;
    case AtomicOp::fetch_xor: return (w ^ v) & mask;
  }
  return 0;
}

std::uint64_t load(const std::byte* p, std::size_t width) {
  std::uint64_t v = 0;
  std::memcpy(&v, p, width);
  return v;
}

}  // namespace

TEST_CASE_TEMPLATE("atomics: every op, width and signedness returns the old value and leaves the new one", P,
                   BACKENDS) {
  P pair(Config{});
  Context &a = pair.a(), &b = pair.b();
  for (bool allocated : {true, false}) {
    CAPTURE(allocated);
    Region region(pair.client_b(), allocated, 4096);
    const std::uint64_t executed = b.stats().atomics_executed;
    const AtomicOp ops[] = {AtomicOp::fetch_add, AtomicOp::add, AtomicOp::swap, AtomicOp::compare_swap,
                            AtomicOp::fetch_and, AtomicOp::fetch_or, AtomicOp::fetch_xor};
    const AtomicType types[] = {AtomicType::u32, AtomicType::i32, AtomicType::u64, AtomicType::i64};
    std::uint64_t offset = 0;
    for (AtomicOp op : ops)
      for (AtomicType type : types) {
        CAPTURE(static_cast<int>(op));
        CAPTURE(static_cast<int>(type));
        const std::size_t width = width_of(type);
        const std::uint64_t mask = width == 4 ? 0xFFFFFFFFu : ~std::uint64_t{0};
        const bool is_signed = type == AtomicType::i32 || type == AtomicType::i64;
        // Start near the top of the word so adds wrap; signed types from -2.
        std::uint64_t word = is_signed ? static_cast<std::uint64_t>(std::int64_t{-2}) & mask : mask - 1;
        std::memcpy(region.at(offset), &word, width);
        // Two rounds: one whose compare matches (and an add that wraps), one
        // whose does not.
        for (int round = 0; round < 2; ++round) {
          const std::uint64_t operand = round == 0 ? 3 : (0xA5A5A5A5F0F0F0F0ull & mask);
          const std::uint64_t compare = round == 0 ? word : word + 1;
          std::uint64_t result = 0xDEADBEEFDEADBEEFull;
          Counter done;
          REQUIRE(a.atomic({.dest = pair.to_b(), .op = op, .type = type, .remote = region.memory.remote_key(),
                            .remote_offset = offset, .operand = operand, .compare = compare,
                            .result = op == AtomicOp::add ? nullptr : &result, .done = done.cb()})
                      .ok());
          advance_until(a, b, [&] { return done.calls == 1; });
          CHECK(done.last.ok());
          if (op != AtomicOp::add) {
            CHECK(load(reinterpret_cast<std::byte*>(&result), width) == word);
            if (width == 4) CHECK((result >> 32) == 0xDEADBEEFu);  // 4 bytes written, no more
          }
          const std::uint64_t next = expected(op, word, operand, compare, mask);
          CHECK(load(region.at(offset), width) == next);
          word = next;
        }
        if (is_signed && (op == AtomicOp::fetch_add || op == AtomicOp::add)) {
          // -2 + 3 = 1, read back as the signed type.
          std::int64_t first = 0;
          if (width == 4) {
            std::int32_t v = 0;
            std::memcpy(&v, region.at(offset), 4);
            first = v;
          } else {
            std::memcpy(&first, region.at(offset), 8);
          }
          const std::int64_t want = width == 4 ? std::int64_t{static_cast<std::int32_t>(word)}
                                               : static_cast<std::int64_t>(word);
          CHECK(first == want);
        }
        offset += 8;
      }
    // The path each took: the owner's engine does them only where the
    // origin's device cannot reach the word (verbs, ofi; shm on registered
    // memory).
    const std::string backend = P::kBackend;
    const bool by_engine = backend != "self" && !(backend == "shm" && allocated);
    CHECK((b.stats().atomics_executed != executed) == by_engine);
  }
}

// atomic_now(): done in the call where the origin's own CPU reaches the
// word (self; shm on an allocated region) and nothing is outstanding to
// the peer; elsewhere posted as atomic() would be, its done reporting it.
// Mixed with atomic() on one word, every increment counts once.
TEST_CASE_TEMPLATE("atomics: atomic_now completes in the call where the CPU reaches the word, else posts", P,
                   BACKENDS) {
  P pair(Config{});
  Context &a = pair.a(), &b = pair.b();
  const std::string backend = P::kBackend;
  for (bool allocated : {true, false}) {
    CAPTURE(allocated);
    const bool in_place = backend == "self" || (backend == "shm" && allocated);
    Region region(pair.client_b(), allocated, 64);
    const RemoteKey key = region.memory.remote_key();
    std::uint64_t result = 99;
    Counter done;
    const Status first = a.atomic_now({.dest = pair.to_b(), .op = AtomicOp::fetch_add, .type = AtomicType::u64,
                                       .remote = key, .operand = 5, .result = &result, .done = done.cb()});
    if (in_place) {
      REQUIRE(first.ok());
      CHECK(result == 0);
      CHECK(load(region.at(0), 8) == 5);
    } else {
      REQUIRE(first == StatusCode::in_progress);
      advance_until(a, b, [&] { return done.calls == 1; });
      CHECK(done.last.ok());
      CHECK(result == 0);
    }
    for (int i = 0; i < 50; ++i) (void)a.advance(), (void)b.advance();
    CHECK(done.calls == (in_place ? 0 : 1));  // done runs only for one posted
    // Behind an atomic() still outstanding, atomic_now posts too (it would
    // overtake it), and the two land in order.
    std::uint64_t r1 = 0, r2 = 0;
    Counter d1, d2;
    REQUIRE(a.atomic({.dest = pair.to_b(), .op = AtomicOp::swap, .type = AtomicType::u64, .remote = key,
                      .operand = 100, .result = &r1, .done = d1.cb()})
                .ok());
    const Status second = a.atomic_now({.dest = pair.to_b(), .op = AtomicOp::fetch_add, .type = AtomicType::u64,
                                        .remote = key, .operand = 1, .result = &r2, .done = d2.cb()});
    REQUIRE(second == StatusCode::in_progress);
    advance_until(a, b, [&] { return d1.calls == 1 && d2.calls == 1; });
    CHECK(r1 == 5);
    CHECK(r2 == 100);
    CHECK(load(region.at(0), 8) == 101);
    // Refusals are atomic()'s, in the call.
    CHECK(a.atomic_now({.dest = pair.to_b(), .op = AtomicOp::fetch_add, .type = AtomicType::u64, .remote = key,
                        .remote_offset = 4, .operand = 1, .result = &r2})
              .code() == StatusCode::invalid_argument);
    // Many, both ways at once: each increment counts once.
    constexpr int kEach = 2000;
    int posted_done = 0, now_done = 0;
    std::uint64_t sink = 0;
    auto on = [](void* n, Status st) { *static_cast<int*>(n) += st.ok() ? 1 : 1000000; };
    for (int i = 0; i < kEach; ++i) {
      Status s = a.atomic_now({.dest = pair.to_b(), .op = AtomicOp::fetch_add, .type = AtomicType::u64,
                               .remote = key, .operand = 1, .result = &sink, .done = {on, &now_done}});
      if (s.ok()) ++now_done;
      else REQUIRE(s == StatusCode::in_progress);
      while (!(s = b.atomic({.dest = pair.to_b(), .op = AtomicOp::add, .type = AtomicType::u64, .remote = key,
                             .operand = 1, .done = {on, &posted_done}}))
                  .ok()) {
        REQUIRE(s == StatusCode::no_resource);
        (void)a.advance(), (void)b.advance();
      }
      (void)a.advance(), (void)b.advance();
    }
    advance_until(a, b, [&] { return now_done == kEach && posted_done == kEach; });
    CHECK(load(region.at(0), 8) == 101 + 2 * kEach);
  }
}

TEST_CASE_TEMPLATE("atomics: both contexts increment one counter 10,000 times each, by their own paths", P,
                   BACKENDS) {
  // a reaches b's word through the backend; b (its owner) through its own
  // self lane; and a third stream from a's second word shows order per lane.
  P pair(Config{});
  Context &a = pair.a(), &b = pair.b();
  for (bool allocated : {true, false}) {
    CAPTURE(allocated);
    Region region(pair.client_b(), allocated, 64);
    const RemoteKey key = region.memory.remote_key();
    constexpr int kEach = 10000;
    int done_a = 0, done_b = 0, failed = 0;
    int posted_a = 0, posted_b = 0;
    auto on = [](void* n, Status s) { *static_cast<int*>(n) += s.ok() ? 1 : 1000000; };
    std::uint64_t last_a = 0;
    while (done_a + done_b < 2 * kEach) {
      // At most 64 in flight from each, posted as the callbacks come back.
      while (posted_a < kEach && posted_a - done_a < 64) {
        Status s = a.atomic({.dest = pair.to_b(), .op = AtomicOp::fetch_add, .type = AtomicType::u64,
                             .remote = key, .operand = 1, .result = &last_a, .done = {on, &done_a}});
        if (s == StatusCode::no_resource) break;
        REQUIRE(s.ok());
        ++posted_a;
      }
      while (posted_b < kEach && posted_b - done_b < 64) {
        Status s = b.atomic({.dest = pair.to_b(),
                             .op = AtomicOp::add, .type = AtomicType::u64, .remote = key, .operand = 1,
                             .done = {on, &done_b}});
        if (s == StatusCode::no_resource) break;
        REQUIRE(s.ok());
        ++posted_b;
      }
      for (int i = 0; i < 16; ++i) {
        (void)a.advance();
        (void)b.advance();
      }
      if (done_a >= 1000000 || done_b >= 1000000) ++failed;
      REQUIRE(failed == 0);
    }
    CHECK(load(region.at(0), 8) == 2 * kEach);
  }
}

TEST_CASE_TEMPLATE("atomics: a compare_swap lock guards a counter of plain loads and stores", P, BACKENDS) {
  // Both contexts take the lock on b's word 0 by compare_swap 0 -> id, add
  // one to the plain counter at word 1 by GET and PUT, read it back until
  // the PUT is seen placed, and release the lock by swap; lost updates
  // would show in the sum.
  P pair(Config{});
  Context &a = pair.a(), &b = pair.b();
  Region region(pair.client_b(), true, 64);
  const RemoteKey key = region.memory.remote_key();
  struct Locker {
    Context* ctx;
    Endpoint to;
    std::uint64_t id;
    Memory local;
    std::uint64_t buf[3] = {0, 0, 0};  // the lock's old value, the counter, the counter read back
    enum class Step {
      acquire, wait_acquire, get, wait_get, put, wait_put, check, wait_check, release, wait_release, done
    } step = Step::acquire;
    int rounds = 0;
    Status error;
    static void next(void* c, Status s) {
      auto* l = static_cast<Locker*>(c);
      if (!s.ok()) l->error = s;
      l->step = static_cast<Step>(static_cast<int>(l->step) + 1);
    }
  };
  constexpr int kRounds = 200;
  Locker lockers[2] = {{&a, pair.to_b(), 1, {}}, {&b, pair.to_b(), 2, {}}};
  REQUIRE(pair.client_a().register_memory(lockers[0].buf, sizeof lockers[0].buf, lockers[0].local).ok());
  REQUIRE(pair.client_b().register_memory(lockers[1].buf, sizeof lockers[1].buf, lockers[1].local).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while ((lockers[0].rounds < kRounds || lockers[1].rounds < kRounds) &&
         std::chrono::steady_clock::now() < deadline) {
    for (Locker& l : lockers) {
      REQUIRE(l.error.ok());
      using S = Locker::Step;
      switch (l.step) {
        case S::acquire:
          if (l.rounds == kRounds) break;
          REQUIRE(l.ctx->atomic({.dest = l.to, .op = AtomicOp::compare_swap, .type = AtomicType::u64,
                                 .remote = key, .operand = l.id, .compare = 0, .result = &l.buf[0],
                                 .done = {&Locker::next, &l}}).ok());
          l.step = S::wait_acquire;
          break;
        case S::get:
          if (l.buf[0] != 0) {  // held by the other: try again
            l.step = S::acquire;
            break;
          }
          REQUIRE(l.ctx->get({.dest = l.to, .local = &l.local, .local_offset = 8, .remote = key, .remote_offset = 8,
                              .bytes = 8, .local_done = {&Locker::next, &l}}).ok());
          l.step = S::wait_get;
          break;
        case S::put:
          ++l.buf[1];
          REQUIRE(l.ctx->put({.dest = l.to, .local = &l.local, .local_offset = 8, .remote = key, .remote_offset = 8,
                              .bytes = 8, .local_done = {&Locker::next, &l}}).ok());
          l.step = S::wait_put;
          break;
        case S::check:  // the PUT must be placed before the lock is let go
          REQUIRE(l.ctx->get({.dest = l.to, .local = &l.local, .local_offset = 16, .remote = key,
                              .remote_offset = 8, .bytes = 8, .local_done = {&Locker::next, &l}}).ok());
          l.step = S::wait_check;
          break;
        case S::release:
          if (l.buf[2] != l.buf[1]) {
            l.step = S::check;
            break;
          }
          REQUIRE(l.ctx->atomic({.dest = l.to, .op = AtomicOp::swap, .type = AtomicType::u64, .remote = key,
                                 .operand = 0, .result = &l.buf[0], .done = {&Locker::next, &l}}).ok());
          l.step = S::wait_release;
          break;
        case S::done:
          CHECK(l.buf[0] == l.id);  // it held the lock it let go
          ++l.rounds;
          l.step = S::acquire;
          break;
        default: break;
      }
    }
    (void)a.advance();
    (void)b.advance();
  }
  CHECK(lockers[0].rounds == kRounds);
  CHECK(lockers[1].rounds == kRounds);
  CHECK(load(region.at(8), 8) == 2 * kRounds);
  CHECK(load(region.at(0), 8) == 0);
}

TEST_CASE_TEMPLATE("atomics: misaligned and out-of-bounds words, bad ops and a null result are refused by name", P,
                   BACKENDS) {
  P pair(Config{});
  Context &a = pair.a(), &b = pair.b();
  Region region(pair.client_b(), false, 64);
  const RemoteKey key = region.memory.remote_key();
  std::uint64_t result = 0;
  auto post = [&](AtomicParams p) {
    p.dest = pair.to_b();
    if (p.remote.length == 0) p.remote = key;
    return a.atomic(p);
  };
  Status s = post({.type = AtomicType::u64, .remote_offset = 4, .operand = 1, .result = &result});
  CHECK(s == StatusCode::invalid_argument);
  CHECK(std::string(s.what()).find("misaligned") != std::string::npos);
  s = post({.type = AtomicType::u32, .remote_offset = 2, .operand = 1, .result = &result});
  CHECK(s == StatusCode::invalid_argument);
  CHECK(std::string(s.what()).find("misaligned") != std::string::npos);
  CHECK(post({.type = AtomicType::u32, .remote_offset = 4, .operand = 1, .result = &result}).ok());
  s = post({.type = AtomicType::u64, .remote_offset = 64, .operand = 1, .result = &result});
  CHECK(s == StatusCode::remote_access);
  CHECK(std::string(s.what()).find("out of bounds") != std::string::npos);
  s = post({.type = AtomicType::u64, .remote_offset = 60, .operand = 1, .result = &result});
  CHECK(s == StatusCode::remote_access);
  CHECK(std::string(s.what()).find("out of bounds") != std::string::npos);
  s = post({.type = AtomicType::u64, .remote_offset = ~std::uint64_t{0} - 3, .operand = 1, .result = &result});
  CHECK(s == StatusCode::remote_access);
  s = post({.op = AtomicOp::fetch_add, .type = AtomicType::u64, .operand = 1, .result = nullptr});
  CHECK(s == StatusCode::invalid_argument);
  CHECK(std::string(s.what()).find("result is null") != std::string::npos);
  CHECK(post({.op = AtomicOp::add, .type = AtomicType::u64, .operand = 1, .result = nullptr}).ok());
  s = post({.op = static_cast<AtomicOp>(kLastAtomicOp + 1), .result = &result});
  CHECK(s == StatusCode::invalid_argument);
  s = post({.type = static_cast<AtomicType>(kLastAtomicType + 1), .result = &result});
  CHECK(s == StatusCode::invalid_argument);
  s = a.atomic({.dest = {pair.client_a().size(), 0}, .remote = key, .result = &result});
  CHECK(s == StatusCode::invalid_argument);

  // A key the owner refuses reaches the callback: one forged to claim more
  // than was registered (the word past the registration), and a stale one.
  RemoteKey forged = key;
  forged.length = 4096;
  Counter outside;
  REQUIRE(post({.type = AtomicType::u64, .remote = forged, .remote_offset = 1024, .operand = 1, .result = &result,
                .done = outside.cb()}).ok());
  advance_until(a, b, [&] { return outside.calls == 1; });
  CHECK(outside.last == StatusCode::remote_access);
  // (The NIC refused that one itself, which breaks its queue pair as a
  // refused PUT does: the stale key is the NIC-domain case's, on a new pair.)
  if constexpr (kNicDomain<P>) return;
  region.memory = Memory{};
  Counter stale;
  REQUIRE(post({.type = AtomicType::u64, .remote = key, .operand = 1, .result = &result, .done = stale.cb()}).ok());
  advance_until(a, b, [&] { return stale.calls == 1; });
  CHECK(stale.last == StatusCode::remote_access);
}

TEST_CASE_TEMPLATE("atomics: a fence's done runs after every earlier atomic is done at the target", P, BACKENDS) {
  P pair(Config{});
  Context &a = pair.a(), &b = pair.b();
  for (bool allocated : {true, false}) {
    CAPTURE(allocated);
    Region region(pair.client_b(), allocated, 64);
    std::vector<std::uint64_t> results(200, 0);
    int done = 0;
    int at_fence = -1;
    std::uint64_t word_at_fence = 0;
    struct Fenced {
      int* done;
      int* at_fence;
      std::uint64_t* word_at_fence;
      const std::byte* word;
    } f{&done, &at_fence, &word_at_fence, region.at(0)};
    auto on = [](void* n, Status s) { *static_cast<int*>(n) += s.ok() ? 1 : 100000; };
    for (std::size_t i = 0; i < results.size(); ++i)
      REQUIRE(a.atomic({.dest = pair.to_b(), .op = AtomicOp::fetch_add, .type = AtomicType::u64,
                        .remote = region.memory.remote_key(), .operand = 1, .result = &results[i],
                        .done = {on, &done}}).ok());
    REQUIRE(a.fence(pair.to_b(), {+[](void* c, Status s) {
                                    auto* k = static_cast<Fenced*>(c);
                                    CHECK(s.ok());
                                    *k->at_fence = *k->done;
                                    *k->word_at_fence = load(k->word, 8);
                                  },
                                  &f}).ok());
    advance_until(a, b, [&] { return at_fence >= 0; });
    CHECK(at_fence == 200);
    CHECK(word_at_fence == 200);
    std::sort(results.begin(), results.end());
    for (std::size_t i = 0; i < results.size(); ++i) CHECK(results[i] == i);
  }
}

// AMI_ATOMIC_MODE: nic asks for a NIC that does atomics and is refused,
// by name, where there is none; auto keeps a job on one host in the CPU's
// domain.
TEST_CASE("atomics: the atomic domain a region gets, and nic refused without a NIC that does atomics") {
  {
    test::ShmPair pair(test::config_with({{"AMI_ATOMIC_MODE", "nic"}}));
    Memory m;
    std::uint64_t words[4] = {};
    Status s = pair.client_b().register_memory(words, sizeof words, m);
    CHECK(s == StatusCode::not_supported);
    CHECK(std::string(s.what()).find("AMI_ATOMIC_MODE=nic") != std::string::npos);
    s = pair.client_b().allocate_memory(64, m);
    CHECK(s == StatusCode::not_supported);
  }
  for (const char* mode : {"auto", "cpu"}) {
    CAPTURE(mode);
    test::ShmPair pair(test::config_with({{"AMI_ATOMIC_MODE", mode}}));
    Region region(pair.client_b(), true, 64);
    CHECK(region.memory.remote_key().atomics == AtomicDomain::cpu);
  }
  // The domain travels in the key's bytes; one no version knows is refused.
  RemoteKey k{.job = 1, .task = 2, .region = 3, .generation = 5, .address = 4096, .length = 64};
  k.atomics = AtomicDomain::nic;
  auto bytes = k.to_bytes();
  RemoteKey back;
  REQUIRE(RemoteKey::from_bytes(bytes, back).ok());
  CHECK(back.atomics == AtomicDomain::nic);
  CHECK(back == k);
  bytes[41] = std::byte{2};
  CHECK(RemoteKey::from_bytes(bytes, back) == StatusCode::invalid_argument);
}

// The NIC's domain on verbs (docs/DESIGN.md, "Remote atomics"): the key
// says nic; 64-bit fetch_add and compare_swap are the origin NIC's (the
// owner's engine does nothing), the rest the owner's engine has its own NIC
// do by compare-and-swap on the 64-bit word, 32-bit ones in either half
// without touching the other; a 32-bit word whose 64-bit word is not all
// registered is refused; a stale key is the NIC's refusal.
TEST_CASE_TEMPLATE("atomics: a NIC-domain region: native ops by the origin's NIC, the rest by the owner's", P,
                   test::VerbsNicPair) {
  P pair(Config{});
  Context &a = pair.a(), &b = pair.b();
  Region region(pair.client_b(), false, 64);
  const RemoteKey key = region.memory.remote_key();
  REQUIRE(key.atomics == AtomicDomain::nic);
  auto run = [&](AtomicParams p) {
    Counter done;
    p.dest = pair.to_b();
    p.done = done.cb();
    if (p.remote.length == 0) p.remote = key;
    REQUIRE(a.atomic(p).ok());
    advance_until(a, b, [&] { return done.calls == 1; });
    return done.last;
  };
  std::uint64_t old = 0;
  const std::uint64_t executed = b.stats().atomics_executed;
  CHECK(run({.op = AtomicOp::fetch_add, .type = AtomicType::u64, .operand = 7, .result = &old}).ok());
  CHECK(run({.op = AtomicOp::compare_swap, .type = AtomicType::i64, .operand = 9, .compare = 7, .result = &old}).ok());
  CHECK(old == 7);
  CHECK(load(region.at(0), 8) == 9);
  CHECK(b.stats().atomics_executed == executed);  // both the origin NIC's
  CHECK(run({.op = AtomicOp::swap, .type = AtomicType::u64, .operand = 0x1111222233334444ull, .result = &old}).ok());
  CHECK(old == 9);
  CHECK(b.stats().atomics_executed == executed + 1);
  // Two 32-bit words in one 64-bit word: the high one wraps without
  // carrying into the low one, and each op sees only its own half.
  std::uint64_t word = 0x00000005FFFFFFFFull;  // low half 0xFFFFFFFF, high half 5
  std::memcpy(region.at(8), &word, 8);
  old = 0xDEADBEEF00000000ull;
  CHECK(run({.op = AtomicOp::fetch_add, .type = AtomicType::u32, .remote_offset = 8, .operand = 1, .result = &old})
            .ok());
  CHECK(old == 0xDEADBEEFFFFFFFFFull);  // 4 bytes written
  CHECK(load(region.at(8), 8) == 0x0000000500000000ull);
  CHECK(run({.op = AtomicOp::fetch_xor, .type = AtomicType::u32, .remote_offset = 12, .operand = 3, .result = &old})
            .ok());
  CHECK(load(reinterpret_cast<std::byte*>(&old), 4) == 5);
  CHECK(load(region.at(8), 8) == 0x0000000600000000ull);
  // A compare_swap whose half does not match writes nothing and says what
  // was there; one that matches swaps only its half.
  CHECK(run({.op = AtomicOp::compare_swap, .type = AtomicType::i32, .remote_offset = 12, .operand = 1, .compare = 5,
             .result = &old}).ok());
  CHECK(load(reinterpret_cast<std::byte*>(&old), 4) == 6);
  CHECK(run({.op = AtomicOp::compare_swap, .type = AtomicType::u32, .remote_offset = 8, .operand = 42, .compare = 0,
             .result = &old}).ok());
  CHECK(load(region.at(8), 8) == 0x000000060000002Aull);
  // The owner's own atomics go the same way: its engine, its NIC.
  Counter own;
  REQUIRE(b.atomic({.dest = pair.to_b(), .op = AtomicOp::fetch_add, .type = AtomicType::u64, .remote = key,
                    .remote_offset = 16, .operand = 3, .result = &old, .done = own.cb()}).ok());
  advance_until(a, b, [&] { return own.calls == 1; });
  CHECK(own.last.ok());
  CHECK(load(region.at(16), 8) == 3);
  // A 32-bit word at the end of a region whose 64-bit word is not all in it.
  std::uint64_t tail[2] = {};
  Memory short_region;
  REQUIRE(pair.client_b().register_memory(tail, 12, short_region).ok());
  Status s = run({.op = AtomicOp::fetch_add, .type = AtomicType::u32, .remote = short_region.remote_key(),
                  .remote_offset = 8, .operand = 1, .result = &old});
  CHECK(s == StatusCode::remote_access);
  CHECK(std::string(s.what()).find("out of bounds") != std::string::npos);
  CHECK(run({.op = AtomicOp::fetch_add, .type = AtomicType::u32, .remote = short_region.remote_key(),
             .remote_offset = 4, .operand = 1, .result = &old}).ok());
  // A stale key, refused by the NIC (last: it breaks the queue pair).
  const RemoteKey stale = short_region.remote_key();
  short_region = Memory{};
  CHECK(run({.op = AtomicOp::fetch_add, .type = AtomicType::u64, .remote = stale, .operand = 1, .result = &old}) ==
        StatusCode::remote_access);
}

TEST_CASE("atomics: a peer process that dies with atomics in flight fails them with peer_failed") {
  // Task 1 hands task 0 the key of a plain registered buffer (so shm sends
  // the atomics as messages to its engine), then stops advancing and exits;
  // task 0's atomics wait in its ring, unanswered, until shm sees the
  // process gone. Task 0 sends them only once task 1 has said it stopped
  // advancing (a second message, which shm writes into task 0's ring in the
  // call), so that none is answered before.
  auto owner = [](Client& client) {
    Context& c = client.context(0);
    static std::uint64_t words[8] = {};
    Memory m;
    if (!client.register_memory(words, sizeof words, m).ok()) return 2;
    const auto key = m.remote_key().to_bytes();
    Status s;
    do {
      s = c.send_immediate({.dest = {0, 0}, .dispatch = 3, .payload = std::as_bytes(std::span(key))});
      (void)c.advance();
    } while (s == StatusCode::no_resource);
    if (!s.ok()) return 3;
    for (int i = 0; i < 1000; ++i) (void)c.advance();  // (the packet is out)
    // From here on, no advance: nothing task 0 sends is answered.
    do {
      s = c.send_immediate({.dest = {0, 0}, .dispatch = 4});
    } while (s == StatusCode::no_resource);
    if (!s.ok()) return 4;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    _exit(0);
  };
  auto origin = [](Client& client) {
    Context& c = client.context(0);
    struct Got {
      bool have = false, stopped = false;
      RemoteKey key;
    } got;
    (void)c.set_dispatch(3, {+[](void* g, const Incoming& in, Receive*) {
                               auto* k = static_cast<Got*>(g);
                               k->have = RemoteKey::from_bytes(in.payload, k->key).ok();
                             },
                             &got});
    (void)c.set_dispatch(4, {+[](void* g, const Incoming&, Receive*) { static_cast<Got*>(g)->stopped = true; },
                             &got});
    if (!test::progress_until(c, [&] { return got.have && got.stopped; })) return 2;
    constexpr int kN = 16;
    std::uint64_t results[kN] = {};
    int refused = 0;
    auto on = [](void* n, Status s) {
      auto* k = static_cast<int*>(n);
      ++(s == StatusCode::peer_failed ? k[0] : k[1]);
    };
    int counts[2] = {0, 0};
    for (int i = 0; i < kN; ++i) {
      Status s = c.atomic({.dest = {1, 0}, .op = AtomicOp::fetch_add, .type = AtomicType::u64, .remote = got.key,
                           .remote_offset = 8 * static_cast<std::uint64_t>(i % 8), .operand = 1,
                           .result = &results[i], .done = {on, counts}});
      if (s == StatusCode::peer_failed) ++refused;  // it was known dead already
      else if (!s.ok()) return 3;
    }
    if (!test::progress_until(c, [&] { return counts[0] + counts[1] + refused == kN; })) return 4;
    for (int i = 0; i < 100; ++i) (void)c.advance();  // nothing more runs
    return counts[1] == 0 && counts[0] + refused == kN ? 0 : 5;
  };
  const std::vector<int> codes = test::run_job(2, Config{}, {origin, owner}, std::chrono::seconds(60));
  INFO("exit codes (origin, owner): " << codes[0] << " " << codes[1]);
  CHECK(codes == std::vector<int>{0, 0});
}

namespace {

// The four-process cases' plumbing: a message carrying remote keys (its
// handler takes one of several packets too), a notice, and a stream of adds.
constexpr int kHammerEach = 10000;

struct KeyMessages {
  int messages = 0;
  std::vector<RemoteKey> keys;
  std::vector<std::byte> buffer;  // a message of more than one packet
  void take(std::span<const std::byte> payload) {
    ++messages;
    for (std::size_t at = 0; at + RemoteKey::kSerializedSize <= payload.size(); at += RemoteKey::kSerializedSize) {
      RemoteKey k;
      if (RemoteKey::from_bytes(payload.subspan(at, RemoteKey::kSerializedSize), k).ok()) keys.push_back(k);
    }
  }
};

void on_key_message(void* c, const Incoming& in, Receive* recv) {
  auto* st = static_cast<KeyMessages*>(c);
  if (recv == nullptr) return st->take(in.payload);
  st->buffer.assign(in.total_bytes, std::byte{0});
  recv->buffer = st->buffer.data();
  recv->done = {+[](void* p, Status) {
                  auto* k = static_cast<KeyMessages*>(p);
                  k->take(k->buffer);
                },
                st};
}

bool tell(Context& c, Endpoint to, std::uint16_t id) {
  Status s;
  while ((s = c.send_immediate({.dest = to, .dispatch = id})) == StatusCode::no_resource) (void)c.advance();
  return s.ok();
}

// Adds 1 of type to each key's word kHammerEach times, 64 in flight; false
// on any error.
bool hammer(Context& c, Endpoint owner, const std::vector<RemoteKey>& keys, AtomicType type) {
  int done = 0, bad = 0, posted = 0;
  const int total = kHammerEach * static_cast<int>(keys.size());
  struct Tally {
    int* done;
    int* bad;
  } t{&done, &bad};
  auto on = [](void* p, Status s) {
    auto* k = static_cast<Tally*>(p);
    ++*(s.ok() ? k->done : k->bad);
  };
  while (done + bad < total) {
    while (posted < total && posted - done - bad < 64) {
      const RemoteKey& key = keys[static_cast<std::size_t>(posted) % keys.size()];
      Status s = c.atomic({.dest = owner, .op = AtomicOp::add, .type = type, .remote = key, .operand = 1,
                           .done = {on, &t}});
      if (s == StatusCode::no_resource) break;
      if (!s.ok()) return false;
      ++posted;
    }
    (void)c.advance();
  }
  return bad == 0;
}

}  // namespace

TEST_CASE("atomics: four processes increment two counters 10,000 times each, on the mapping, by message, by self") {
  // Task 0 owns an allocate_memory() word (tasks 1..3 map it: their CPUs do
  // the atomics) and a registered word (its engine does theirs); task 0
  // itself goes through its self lane to both. Each task adds 1 to both
  // words 10,000 times, 64 in flight, then tells task 0.
  constexpr int kEach = kHammerEach;
  constexpr std::uint16_t kKeys = 5, kDone = 6, kExit = 7, kReady = 8;
  auto owner = [&](Client& client) {
    Context& c = client.context(0);
    KeyMessages st, ready;
    if (!c.set_dispatch(kDone, {on_key_message, &st}).ok() || !c.set_dispatch(kReady, {on_key_message, &ready}).ok()) return 2;
    // (Each peer says when its handlers are set: a message before that is dropped.)
    if (!test::progress_until(c, [&] { return ready.messages == 3; })) return 9;
    Memory mapped, registered;
    static std::uint64_t plain[8] = {};
    if (!client.allocate_memory(64, mapped).ok() || !client.register_memory(plain, sizeof plain, registered).ok())
      return 3;
    std::array<std::byte, 2 * RemoteKey::kSerializedSize> keys{};
    const auto k0 = mapped.remote_key().to_bytes();
    const auto k1 = registered.remote_key().to_bytes();
    std::memcpy(keys.data(), k0.data(), k0.size());
    std::memcpy(keys.data() + k0.size(), k1.data(), k1.size());
    int sent = 0;
    for (std::uint32_t t = 1; t < 4; ++t)
      if (!c.send({.dest = {t, 0}, .dispatch = kKeys, .payload = keys,
                   .local_done = {+[](void* n, Status) { ++*static_cast<int*>(n); }, &sent}}).ok())
        return 4;
    if (!hammer(c, {0, 0}, {mapped.remote_key(), registered.remote_key()}, AtomicType::u64)) return 5;
    if (!test::progress_until(c, [&] { return sent == 3 && st.messages == 3; })) return 6;
    const std::uint64_t a = std::atomic_ref<std::uint64_t>(*static_cast<std::uint64_t*>(mapped.address())).load();
    const std::uint64_t b = std::atomic_ref<std::uint64_t>(plain[0]).load();
    for (std::uint32_t t = 1; t < 4; ++t)
      if (!tell(c, {t, 0}, kExit)) return 7;
    for (int i = 0; i < 1000; ++i) (void)c.advance();
    return a == 4 * kEach && b == 4 * kEach ? 0 : 8;
  };
  auto other = [&](Client& client) {
    Context& c = client.context(0);
    KeyMessages keys, exit;
    if (!c.set_dispatch(kKeys, {on_key_message, &keys}).ok() || !c.set_dispatch(kExit, {on_key_message, &exit}).ok()) return 2;
    if (!tell(c, {0, 0}, kReady)) return 7;
    if (!test::progress_until(c, [&] { return keys.keys.size() == 2; })) return 3;
    if (!hammer(c, {0, 0}, keys.keys, AtomicType::u64)) return 4;
    if (!tell(c, {0, 0}, kDone)) return 5;
    if (!test::progress_until(c, [&] { return exit.messages == 1; })) return 6;
    return 0;
  };
  CHECK(test::run_job(4, Config{}, {owner, other, other, other}, std::chrono::seconds(120)) ==
        std::vector<int>{0, 0, 0, 0});
}

// The NIC's domain with four processes on three paths to one word
// (AMI_ATOMIC_MODE=nic on every task, in the VM): task 1 runs without shm,
// so its 64-bit adds are its NIC's (IBV_WR_ATOMIC_FETCH_AND_ADD); tasks 2
// and 3 reach task 0 by shm, so theirs go as messages that task 0's engine
// has its own NIC do, task 3's as 32-bit adds on the low half (a loop of
// compare-and-swaps at the owner); task 0 adds through its self lane, as a
// message too. Each word ends at exactly 4 x 10,000.
TEST_CASE_TEMPLATE("atomics: four processes add to NIC-domain words by the NIC, by message and by a CAS loop", P,
                   test::VerbsNicPair) {
  constexpr int kEach = kHammerEach;
  constexpr std::uint16_t kKeys = 5, kDone = 6, kExit = 7, kReady = 8;
  auto owner = [&](Client& client) {
    Context& c = client.context(0);
    KeyMessages st, ready;
    if (!c.set_dispatch(kDone, {on_key_message, &st}).ok() || !c.set_dispatch(kReady, {on_key_message, &ready}).ok()) return 2;
    if (!test::progress_until(c, [&] { return ready.messages == 3; })) return 9;
    Memory mapped, registered;
    static std::uint64_t plain[8] = {};
    if (!client.allocate_memory(64, mapped).ok() || !client.register_memory(plain, sizeof plain, registered).ok())
      return 3;
    if (mapped.remote_key().atomics != AtomicDomain::nic || registered.remote_key().atomics != AtomicDomain::nic)
      return 10;
    std::array<std::byte, 2 * RemoteKey::kSerializedSize> keys{};
    const auto k0 = mapped.remote_key().to_bytes();
    const auto k1 = registered.remote_key().to_bytes();
    std::memcpy(keys.data(), k0.data(), k0.size());
    std::memcpy(keys.data() + k0.size(), k1.data(), k1.size());
    for (std::uint32_t t = 1; t < 4; ++t)
      if (!c.send({.dest = {t, 0}, .dispatch = kKeys, .payload = keys}).ok()) return 4;
    if (!hammer(c, {0, 0}, {mapped.remote_key(), registered.remote_key()}, AtomicType::u64)) return 5;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(110);  // (see other, below)
    while (st.messages != 3 && std::chrono::steady_clock::now() < end) (void)c.advance();
    if (st.messages != 3) return 6;
    // (Read through the NIC's domain's own rules: nothing is adding now.)
    const std::uint64_t a = std::atomic_ref<std::uint64_t>(*static_cast<std::uint64_t*>(mapped.address())).load();
    const std::uint64_t b = std::atomic_ref<std::uint64_t>(plain[0]).load();
    if (c.stats().atomics_executed < 3u * 2 * kEach) return 11;  // tasks 2, 3 and itself: by its engine
    for (std::uint32_t t = 1; t < 4; ++t)
      if (!tell(c, {t, 0}, kExit)) return 7;
    for (int i = 0; i < 1000; ++i) (void)c.advance();
    return a == 4 * kEach && b == 4 * kEach ? 0 : 8;
  };
  auto other = [&](Client& client) {
    Context& c = client.context(0);
    KeyMessages keys, exit;
    if (!c.set_dispatch(kKeys, {on_key_message, &keys}).ok() || !c.set_dispatch(kExit, {on_key_message, &exit}).ok()) return 2;
    if (!tell(c, {0, 0}, kReady)) return 7;
    if (!test::progress_until(c, [&] { return keys.keys.size() == 2; })) return 3;
    // The paths the case is about: task 1 by verbs, tasks 2 and 3 by shm.
    if (c.backend_for({0, 0}) != (client.task() == 1 ? "verbs" : "shm")) return 12;
    if (!hammer(c, {0, 0}, keys.keys, client.task() == 3 ? AtomicType::u32 : AtomicType::u64)) return 4;
    if (!tell(c, {0, 0}, kDone)) return 5;
    // (Task 1's adds are its NIC's and end long before the others', which
    // the owner's NIC does one loop at a time: under a sanitizer in the VM,
    // more than progress_until()'s 30 s. Exiting early would end the job.)
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(110);
    while (exit.messages != 1 && std::chrono::steady_clock::now() < end) (void)c.advance();
    return exit.messages == 1 ? 0 : 6;
  };
  Config nic = P::with_nic(Config{});
  REQUIRE(nic.set("AMI_JOB_KEY", test::make_job_key()).ok());
  Config no_shm = nic;
  REQUIRE(no_shm.set("AMI_BACKENDS", "self,verbs").ok());
  const auto pids = test::spawn_ranks(
      4, [&](std::uint32_t r, const std::string& at) { return test::job(r, 4, at, r == 1 ? no_shm : nic); },
      {owner, other, other, other});
  const std::vector<int> codes = test::wait_all(pids, std::chrono::seconds(120));
  CAPTURE(codes[0]);
  CAPTURE(codes[1]);
  CAPTURE(codes[2]);
  CAPTURE(codes[3]);
  CHECK(codes == std::vector<int>{0, 0, 0, 0});
}
