// A peer that fails: every pending operation to it completes once with an
// error, later ones are refused with peer_failed, the error handler runs,
// and traffic to other peers goes on.
//
// First the engine over the self backend, whose lanes a test can break on
// purpose, step by step; then jobs of real processes where the survivor
// kill -9s its peer in the middle of an eager stream, a rendezvous GET, and
// a PUT stream followed by a fence, on the backend AMI_TEST_BACKEND names
// (backend_under_test.hpp: shm by default; ofi; verbs in the soft-RoCE VM,
// one program built once for them all); and a job
// of tasks of two contexts, where the death of one task fails each of its
// endpoints at the survivor once, whether or not it ever talked to them.
#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "ami/ami.hpp"
#include "ami/device/region_table.hpp"
#include "backend_under_test.hpp"
#include "eager/am_engine.hpp"
#include "jobs.hpp"
#include "self_device.hpp"

using namespace ami;
using namespace test;

namespace {

// Three engines, contexts 0, 1 and 2 of one task, over the self backend.
struct Trio {
  device::RegionTable regions{1, 0, 16};
  self::SelfDomain domain{0, 3, 256, 1024, regions};
  self::SelfDevice da{domain, 0, 64}, db{domain, 1, 64}, dc{domain, 2, 64};
  ContextStats sa, sb, sc;
  protocol::AmEngine ea, eb, ec;
  struct Outcome {
    int calls = 0;
    Status last;
  };
  std::vector<Outcome> outcomes = std::vector<Outcome>(1000);
  std::size_t used = 0;
  int errors_reported = 0;
  Endpoint failed_peer{};

  static protocol::AmEngine::Shape shape(unsigned keepalive_ms) {
    return {.tasks = 1, .contexts = 3, .options = {.max_requests = 256, .keepalive_ms = keepalive_ms}};
  }
  explicit Trio(unsigned keepalive_ms = 0)
      : ea(shape(keepalive_ms), sa), eb(shape(keepalive_ms), sb), ec(shape(keepalive_ms), sc) {
    ea.add_device(da);
    eb.add_device(db);
    ec.add_device(dc);
    for (auto* e : {&ea, &eb, &ec})
      REQUIRE(e->set_dispatch(1, {+[](void*, const Incoming&, Receive*) {}, nullptr}).ok());
    ea.set_error_handler({+[](void* c, Endpoint peer, Status why) {
      auto* t = static_cast<Trio*>(c);
      ++t->errors_reported;
      t->failed_peer = peer;
      CHECK(why == StatusCode::peer_failed);
    }, this});
  }
  Callback record() {
    return {+[](void* c, Status s) {
      auto* o = static_cast<Outcome*>(c);
      ++o->calls;
      o->last = s;
    }, &outcomes[used++]};
  }
  Status send(protocol::AmEngine& e, Endpoint to) {
    static const std::uint64_t word = 9;
    return e.send({.dest = to, .dispatch = 1, .payload = std::as_bytes(std::span(&word, 1)),
                   .remote_done = record()});
  }
};

}  // namespace

TEST_CASE("a failed lane fails the atomics in its FIFO and its work queue with peer_failed, undone" * test::any_backend()) {
  Trio t;
  std::uint64_t word = 0;
  RemoteKey key;
  REQUIRE(t.regions.add(&word, sizeof word, key).ok());
  t.da.hold(1, true);
  std::uint64_t results[100] = {};
  for (auto& r : results)  // 64 in the held FIFO, the rest queued
    REQUIRE(t.ea.atomic({.dest = {0, 1}, .op = AtomicOp::fetch_add, .type = AtomicType::u64, .remote = key,
                         .operand = 1, .result = &r, .done = t.record()}).ok());
  REQUIRE(t.ea.fence({0, 1}, t.record()).ok());
  CHECK(t.sa.queued > 0);
  for (int i = 0; i < 10; ++i) (void)t.ea.advance();
  for (std::size_t i = 0; i < t.used; ++i) CHECK(t.outcomes[i].calls == 0);
  t.da.fail_lane(1, {});
  (void)t.ea.advance();
  for (std::size_t i = 0; i < t.used; ++i) {
    CAPTURE(i);
    CHECK(t.outcomes[i].calls == 1);
    CHECK(t.outcomes[i].last == StatusCode::peer_failed);
  }
  CHECK(word == 0);
  CHECK(t.ea.atomic({.dest = {0, 1}, .op = AtomicOp::add, .remote = key, .operand = 1}) == StatusCode::peer_failed);
}

TEST_CASE("a failed lane fails every pending operation to its peer once; other peers go on" * test::any_backend()) {
  Trio t;
  for (int i = 0; i < 5; ++i) REQUIRE(t.send(t.ea, {0, 1}).ok());
  (void)t.ea.advance();  // delivered; b is never advanced, so never answers
  t.da.hold(1, true);
  for (int i = 0; i < 100; ++i) REQUIRE(t.send(t.ea, {0, 1}).ok());  // 64 in the held FIFO, the rest queued
  REQUIRE(t.ea.fence({0, 1}, t.record()).ok());
  const std::size_t pending = t.used;
  CHECK(t.sa.queued > 0);
  for (int i = 0; i < 10; ++i) (void)t.ea.advance();
  for (std::size_t i = 0; i < pending; ++i) CHECK(t.outcomes[i].calls == 0);

  t.da.fail_lane(1, {});
  (void)t.ea.advance();
  for (std::size_t i = 0; i < pending; ++i) {
    CAPTURE(i);
    CHECK(t.outcomes[i].calls == 1);
    CHECK(t.outcomes[i].last == StatusCode::peer_failed);
  }
  CHECK(t.errors_reported == 1);
  CHECK(t.failed_peer.context == 1);
  CHECK(t.sa.peers_failed == 1);
  // Refused from now on, by name.
  Status s = t.send(t.ea, {0, 1});
  CHECK(s == StatusCode::peer_failed);
  CHECK(std::string(s.what()).find("peer failed") != std::string::npos);
  CHECK(t.ea.fence({0, 1}, {}) == StatusCode::peer_failed);
  CHECK(t.ea.send_immediate({.dest = {0, 1}, .dispatch = 1}) == StatusCode::peer_failed);
  // What b still sends is dropped, not acted on.
  REQUIRE(t.send(t.eb, {0, 0}).ok());
  (void)t.eb.advance();
  (void)t.ea.advance();
  CHECK(t.sa.packets_from_failed >= 1);
  // c is untouched.
  const std::size_t first = t.used;
  for (int i = 0; i < 20; ++i) REQUIRE(t.send(t.ea, {0, 2}).ok());
  for (int i = 0; i < 50; ++i) {
    (void)t.ea.advance();
    (void)t.ec.advance();
  }
  for (std::size_t i = first; i < t.used; ++i) {
    CHECK(t.outcomes[i].calls == 1);
    CHECK(t.outcomes[i].last.ok());
  }
  for (int i = 0; i < 100; ++i) (void)t.ea.advance();
  CHECK(t.errors_reported == 1);  // once per peer
}

TEST_CASE("keepalives go to a quiet peer, owed an answer or not, and not to one that talks" * test::any_backend()) {
  Trio t(1);  // every millisecond
  REQUIRE(t.send(t.ea, {0, 1}).ok());
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (t.sa.keepalives_sent < 2 && std::chrono::steady_clock::now() < end) (void)t.ea.advance();
  CHECK(t.sa.keepalives_sent >= 2);
  for (int i = 0; i < 50; ++i) {
    (void)t.eb.advance();
    (void)t.ea.advance();
  }
  CHECK(t.sb.keepalives_received >= 1);
  CHECK(t.sb.malformed_packets == 0);
  CHECK(t.outcomes[0].calls == 1);
  CHECK(t.outcomes[0].last.ok());
  // Nothing owed any more, but b is still quiet: probed again, once a round.
  // (At least 20 ms, and until one came: a loaded machine may not run this
  // thread for longer than that. At most one per round of the interval.)
  std::uint64_t sent = t.sa.keepalives_sent;
  const auto start = std::chrono::steady_clock::now();
  while ((t.sa.keepalives_sent == sent && std::chrono::steady_clock::now() < start + std::chrono::seconds(10)) ||
         std::chrono::steady_clock::now() < start + std::chrono::milliseconds(20))
    (void)t.ea.advance();
  const auto rounds = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  CHECK(t.sa.keepalives_sent > sent);
  CHECK(t.sa.keepalives_sent - sent <= static_cast<std::uint64_t>(rounds.count()) + 1);
  // b talks (a message every round): a hears it and probes no more.
  for (int i = 0; i < 50; ++i) {
    (void)t.eb.advance();
    (void)t.ea.advance();
  }
  sent = t.sa.keepalives_sent;
  const auto talk = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
  while (std::chrono::steady_clock::now() < talk) {
    (void)t.eb.send_immediate({.dest = {0, 0}, .dispatch = 1});
    (void)t.eb.advance();
    for (int i = 0; i < 16; ++i) (void)t.ea.advance();
  }
  CHECK(t.sa.keepalives_sent - sent <= 1);  // at most the round that overlapped the switch
  // A peer never reached has no lane and is never probed.
  Trio quiet(1);
  const auto stop = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
  while (std::chrono::steady_clock::now() < stop) (void)quiet.ea.advance();
  CHECK(quiet.sa.keepalives_sent == 0);
}

TEST_CASE("with keepalives off (interval 0) a quiet peer is never probed, by advance() or before sleeping" * test::any_backend()) {
  Trio t(0);
  REQUIRE(t.send(t.ea, {0, 1}).ok());
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(30);
  while (std::chrono::steady_clock::now() < end) {
    for (int i = 0; i < 64; ++i) {
      (void)t.ea.advance();
      (void)t.eb.advance();
    }
    (void)t.ea.prepare_sleep();
  }
  CHECK(t.outcomes[0].calls == 1);
  CHECK(t.sa.keepalives_sent == 0);
  CHECK(t.sb.keepalives_received == 0);
  CHECK(t.ea.next_deadline_ns() == 0);  // nothing to wake for
}

namespace {

constexpr std::uint16_t kHello = 10, kBig = 11, kData = 2, kBye = 3;
constexpr std::size_t kRegion = 1 << 20;
constexpr std::size_t kBigMessage = 64 << 20;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Config job_config(const char* extra_name = nullptr, const char* extra_value = nullptr) {
  Config c;
  test::backend_under_test().configure(c);
  REQUIRE(c.set("AMI_KEEPALIVE_INTERVAL", "200").ok());
  if (extra_name != nullptr) REQUIRE(c.set(extra_name, extra_value).ok());
  return c;
}

// Rank 1: says hello (its pid and a region's key) to rank 0, optionally
// sends it a 64 MiB message, then only advances until it is killed.
int victim(Client& client, bool big) {
  Context& c = client.context(0);
  if (!c.set_dispatch(kData, {+[](void*, const Incoming&, Receive*) {}, nullptr}).ok()) return 6;
  std::vector<std::uint8_t> region(kRegion, 1);
  Memory memory;
  if (!client.register_memory(region.data(), region.size(), memory).ok()) return 2;
  struct Hello {
    std::int32_t pid;
    std::array<std::byte, RemoteKey::kSerializedSize> key;
  } hello{static_cast<std::int32_t>(::getpid()), memory.remote_key().to_bytes()};
  if (!c.send({.dest = {0, 0}, .dispatch = kHello, .header = std::as_bytes(std::span(&hello, 1))}).ok())
    return 3;
  std::vector<std::uint8_t> payload;
  if (big) {
    payload.assign(kBigMessage, 0);
    for (std::size_t i = 0; i < payload.size(); i += 4096) payload[i] = static_cast<std::uint8_t>(i >> 12);
    if (!c.send({.dest = {0, 0}, .dispatch = kBig, .payload = std::as_bytes(std::span(payload))}).ok()) return 4;
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < end) (void)c.advance();
  return 5;  // never killed
}

// Rank 2: takes messages until rank 0 says bye.
int third(Client& client) {
  Context& c = client.context(0);
  bool bye = false;
  if (!c.set_dispatch(kData, {+[](void*, const Incoming&, Receive*) {}, nullptr}).ok()) return 2;
  if (!c.set_dispatch(kBye, {+[](void* b, const Incoming&, Receive*) { *static_cast<bool*>(b) = true; }, &bye})
           .ok())
    return 3;
  if (!progress_until(c, [&] { return bye; })) return 4;
  for (int i = 0; i < 2000; ++i) (void)c.advance();
  return 0;
}

// Rank 0's side of every case.
struct Survivor {
  Context& c;
  struct Hello {
    std::int32_t pid = 0;
    RemoteKey key{};
    bool seen = false;
  } hello;
  int errors = 0;
  std::int64_t error_ns = 0;
  std::int64_t kill_ns = 0;

  explicit Survivor(Client& client) : c(client.context(0)) {
    REQUIRE(c.set_dispatch(kHello, {+[](void* p, const Incoming& in, Receive*) {
                             auto* h = static_cast<Hello*>(p);
                             std::int32_t pid = 0;
                             std::array<std::byte, RemoteKey::kSerializedSize> key{};
                             if (in.header.size() != sizeof pid + key.size()) return;
                             std::memcpy(&pid, in.header.data(), sizeof pid);
                             std::memcpy(key.data(), in.header.data() + sizeof pid, key.size());
                             h->pid = pid;
                             h->seen = RemoteKey::from_bytes(key, h->key).ok();
                           }, &hello}).ok());
    c.set_error_handler({+[](void* p, Endpoint peer, Status) {
      auto* s = static_cast<Survivor*>(p);
      if (peer.task != 1) return;
      ++s->errors;
      s->error_ns = now_ns();
    }, this});
  }
  bool wait_hello() { return progress_until(c, [&] { return hello.seen; }); }
  void kill_victim() {
    kill_ns = now_ns();
    ::kill(hello.pid, SIGKILL);
  }
  // The error within 5 s of the kill, sends to the victim refused, and 100
  // messages to rank 2 answered; then bye. 0 when all of that held.
  int finish() {
    if (!progress_until(c, [&] { return errors != 0; })) return 20;
    const double seconds = static_cast<double>(error_ns - kill_ns) / 1e9;
    std::printf("peer failure seen %.3f s after the kill\n", seconds);
    if (seconds > 5.0) return 21;
    if (errors != 1) return 22;
    const std::uint64_t word = 1;
    if (c.send({.dest = {1, 0}, .dispatch = kData, .payload = std::as_bytes(std::span(&word, 1))}) !=
        StatusCode::peer_failed)
      return 23;
    int answered = 0, bad = 0;
    struct Count {
      int* answered;
      int* bad;
    } count{&answered, &bad};
    for (int i = 0; i < 100; ++i) {
      Status s = c.send({.dest = {2, 0}, .dispatch = kData, .payload = std::as_bytes(std::span(&word, 1)),
                         .remote_done = {+[](void* p, Status r) {
                           auto* k = static_cast<Count*>(p);
                           ++*k->answered;
                           if (!r.ok()) ++*k->bad;
                         }, &count}});
      if (!s.ok()) return 24;
    }
    if (!progress_until(c, [&] { return answered == 100; })) return 25;
    if (bad != 0) return 26;
    if (!c.send({.dest = {2, 0}, .dispatch = kBye}).ok()) return 27;
    for (int i = 0; i < 2000; ++i) (void)c.advance();
    return 0;
  }
};

struct Outcomes {
  int calls = 0;
  int failed = 0;     // with peer_failed
  int refused = 0;    // with remote_access
  int other = 0;      // any other error
  Status last;
  static void fn(void* p, Status s) {
    auto* o = static_cast<Outcomes*>(p);
    ++o->calls;
    o->last = s;
    if (s == StatusCode::peer_failed) ++o->failed;
    else if (s == StatusCode::remote_access) ++o->refused;
    else if (!s.ok()) ++o->other;
  }
};

// (a) an eager stream: many sends with remote-done in flight and queued.
int survivor_eager(Client& client) {
  Survivor s(client);
  if (!s.wait_hello()) return 2;
  std::vector<Outcomes> out(3000);
  const std::uint64_t word = 7;
  std::size_t posted = 0;
  while (posted < 1500) {  // some answered, many not
    if (!s.c.send({.dest = {1, 0}, .dispatch = kData, .payload = std::as_bytes(std::span(&word, 1)),
                   .remote_done = {&Outcomes::fn, &out[posted]}})
             .ok())
      break;
    ++posted;
    if (posted % 16 == 0) (void)s.c.advance();
  }
  s.kill_victim();
  // Posting goes on until the failure is known; then refused.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (posted < out.size() && s.errors == 0) {
    if (std::chrono::steady_clock::now() > give_up) return 19;
    Status st = s.c.send({.dest = {1, 0}, .dispatch = kData, .payload = std::as_bytes(std::span(&word, 1)),
                          .remote_done = {&Outcomes::fn, &out[posted]}});
    if (st.ok()) ++posted;
    (void)s.c.advance();
  }
  if (int rc = s.finish()) return rc;
  int failed = 0;
  for (std::size_t i = 0; i < posted; ++i) {
    if (out[i].calls != 1) return 30;  // every one exactly once, answered or failed
    if (out[i].other != 0) return 31;
    failed += out[i].failed;
  }
  std::printf("eager: %zu posted, %zu answered, %d failed with the peer\n", posted, posted - failed, failed);
  return failed > 0 ? 0 : 32;
}

// (b) a rendezvous GET of 64 MiB from the victim, killed once the GET is
// under way.
int survivor_get(Client& client) {
  Survivor s(client);
  struct Big {
    std::vector<std::uint8_t> buffer;
    Outcomes done;
    bool arrived = false;
  } big;
  REQUIRE(s.c.set_dispatch(kBig, {+[](void* p, const Incoming& in, Receive* recv) {
                             auto* b = static_cast<Big*>(p);
                             b->arrived = true;
                             if (recv == nullptr) return;
                             b->buffer.assign(in.total_bytes, 0);
                             recv->buffer = b->buffer.data();
                             recv->done = {&Outcomes::fn, &b->done};
                           }, &big}).ok());
  if (!s.wait_hello()) return 2;
  if (!progress_until(s.c, [&] { return big.arrived && s.c.stats().gets > 0; })) return 3;
  s.kill_victim();
  if (int rc = s.finish()) return rc;
  if (!progress_until(s.c, [&] { return big.done.calls != 0; })) return 30;
  for (int i = 0; i < 1000; ++i) (void)s.c.advance();
  if (big.done.calls != 1) return 31;
  // A process being killed gives back its memory before its queue pairs:
  // a READ from it may meet a deregistered region (remote_access) rather
  // than a missing peer. Either is an error, at once; nothing else is.
  if (big.done.other != 0) {
    std::printf("get: the receive ended with %s\n", to_string(big.done.last).c_str());
    return 32;
  }
  std::printf("get: the receive %s\n", big.done.failed    ? "failed with the peer"
                                       : big.done.refused ? "failed: the dying peer's memory was gone"
                                                          : "completed before the peer died");
  return 0;
}

// (c) a PUT stream into the victim's region, the kill, then a fence.
int survivor_fence(Client& client) {
  Survivor s(client);
  if (!s.wait_hello()) return 2;
  std::vector<std::uint8_t> source(kRegion, 3);
  Memory memory;
  if (!client.register_memory(source.data(), source.size(), memory).ok()) return 3;
  std::vector<Outcomes> puts(256);
  for (std::size_t i = 0; i < puts.size(); ++i) {
    const std::size_t offset = (i * 4096) % kRegion;
    if (!s.c.put({.dest = {1, 0}, .local = &memory, .local_offset = offset, .remote = s.hello.key,
                  .remote_offset = offset, .bytes = 4096, .local_done = {&Outcomes::fn, &puts[i]}})
             .ok())
      return 4;
  }
  s.kill_victim();
  Outcomes fence;
  if (!s.c.fence({1, 0}, {&Outcomes::fn, &fence}).ok()) return 5;  // the failure is not known yet
  if (int rc = s.finish()) return rc;
  if (!progress_until(s.c, [&] { return fence.calls != 0; })) return 30;
  for (int i = 0; i < 1000; ++i) (void)s.c.advance();
  if (fence.calls != 1 || fence.failed != 1) {  // the fence cannot have been answered
    std::printf("fence: %d call(s), the last with %s\n", fence.calls, ami::to_string(fence.last).c_str());
    return 31;
  }
  for (const Outcomes& o : puts)
    if (o.calls != 1 || o.other != 0) return 32;
  return 0;
}

void run_kill_case(int (*survivor)(Client&), bool big, const Config& config) {
  const auto before = dev_shm();
  const auto codes = run_job(3, config,
                             {survivor, [big](Client& c) { return victim(c, big); }, third},
                             std::chrono::seconds(120));
  std::string text;
  for (int code : codes) text += std::to_string(code) + " ";
  INFO("exit codes (survivor, victim, third): " << text);
  CHECK(codes == std::vector<int>{0, -SIGKILL, 0});
  CHECK(dev_shm() == before);
}

}  // namespace

TEST_CASE("kill -9 of a peer in the middle of an eager stream") {
  run_kill_case(survivor_eager, false, job_config());
}

TEST_CASE("kill -9 of a peer in the middle of a rendezvous GET") {
  // GET by the receiver; on shm through the rings, so the victim serves it
  // piece by piece and dies with most of it undone.
  Config c = job_config("AMI_RNDV_MODE", "discard_get");
  if (test::backend_under_test().is_default()) REQUIRE(c.set("AMI_SHM_CMA", "off").ok());
  run_kill_case(survivor_get, true, c);
}

TEST_CASE("kill -9 of a peer during a PUT stream, then a fence to it") {
  run_kill_case(survivor_fence, false, job_config());
}

namespace {

// A job of tasks with two contexts each: each rank a forked child running
// its script on its Client.
std::vector<int> run_job_of_two_contexts(const Config& given, const std::vector<Script>& scripts) {
  Config config = given;
  REQUIRE(config.set("AMI_JOB_KEY", make_job_key()).ok());
  const auto size = static_cast<std::uint32_t>(scripts.size());
  auto options = [&](std::uint32_t r, const std::string& address) {
    return ClientOptions{.name = "test", .contexts = 2,
                         .job = {.rank = r, .size = size, .bootstrap = address}, .config = config};
  };
  return wait_all(spawn_ranks(size, options, scripts), std::chrono::seconds(60));
}

// Rank 1 of the two-context job: its context 0 says hello to rank 0's
// context 0 (so that context has a lane to it), and once that is answered
// the task dies. Its context 1 never says anything.
int silent_victim(Client& client) {
  Context& c = client.context(0);
  bool answered = false;
  if (!c.send({.dest = {0, 0}, .dispatch = kHello,
               .remote_done = {+[](void* a, Status) { *static_cast<bool*>(a) = true; }, &answered}})
           .ok())
    return 2;
  if (!progress_until(c, [&] { return answered; })) return 3;
  ::raise(SIGKILL);
  return 4;
}

// Rank 0: advances both its contexts, sends nothing to rank 1, and records
// in which round each handler call came.
int endpoint_survivor(Client& client) {
  struct Seen {
    std::uint64_t* round;
    int calls[2] = {0, 0};          // by the dead task's context
    std::uint64_t first = ~std::uint64_t{0}, last = 0;  // rounds of the first and last call
    int foreign = 0;                // calls for any other endpoint
  };
  std::uint64_t round = 0;
  Seen seen[2] = {{&round}, {&round}};
  bool hello = false;
  for (std::uint16_t i = 0; i < 2; ++i) {
    Context& c = client.context(i);
    c.set_error_handler({+[](void* p, Endpoint peer, Status why) {
      auto* s = static_cast<Seen*>(p);
      if (peer.task != 1 || peer.context > 1 || why != StatusCode::peer_failed) {
        ++s->foreign;
        return;
      }
      ++s->calls[peer.context];
      s->first = std::min(s->first, *s->round);
      s->last = std::max(s->last, *s->round);
    }, &seen[i]});
  }
  if (!client.context(0)
           .set_dispatch(kHello, {+[](void* h, const Incoming&, Receive*) { *static_cast<bool*>(h) = true; }, &hello})
           .ok())
    return 2;
  auto both_advance = [&] {
    ++round;
    (void)client.context(0).advance();
    (void)client.context(1).advance();
  };
  auto all_seen = [&] {
    for (const Seen& s : seen)
      if (s.calls[0] == 0 || s.calls[1] == 0) return false;
    return true;
  };
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!hello && std::chrono::steady_clock::now() < end) both_advance();
  if (!hello) return 3;
  while (!all_seen() && std::chrono::steady_clock::now() < end) both_advance();
  if (!all_seen()) {
    std::printf("after 30 s: context 0 saw %d/%d, context 1 saw %d/%d calls for {1,0}/{1,1}\n",
                seen[0].calls[0], seen[0].calls[1], seen[1].calls[0], seen[1].calls[1]);
    return 4;
  }
  for (int i = 0; i < 2000; ++i) both_advance();  // nothing more comes
  for (std::uint16_t i = 0; i < 2; ++i) {
    const Seen& s = seen[i];
    std::printf("context %u: {1,0} failed %d time(s), {1,1} %d, %llu round(s) apart\n", i, s.calls[0], s.calls[1],
                static_cast<unsigned long long>(s.last - s.first));
    if (s.calls[0] != 1 || s.calls[1] != 1 || s.foreign != 0) return 10 + i;
    // Together: in the advance that learned of the end, or the next.
    if (s.last - s.first > 1) return 20 + i;
    Context& c = client.context(i);
    if (c.peer_status({1, 0}) != StatusCode::peer_failed || c.peer_status({1, 1}) != StatusCode::peer_failed)
      return 30 + i;
    if (c.stats().peers_failed != 2) return 40 + i;
    if (!c.peer_status({0, static_cast<std::uint16_t>(1 - i)}).ok()) return 50 + i;  // its own task is untouched
  }
  return 0;
}

}  // namespace

TEST_CASE("a task that dies fails every one of its endpoints, once each, together, without a send to them") {
  // Rank 0's context 0 has a lane to {1,0} only (it heard its hello),
  // context 1 none at all: either way both of the dead task's endpoints
  // fail, and the error handler runs once for each.
  const auto codes = run_job_of_two_contexts(job_config(), {endpoint_survivor, silent_victim});
  INFO("exit codes (survivor, victim): " << codes[0] << " " << codes[1]);
  CHECK(codes == std::vector<int>{0, -SIGKILL});
}

// ---- cases that do not depend on the backend: once, in the default run ----
namespace {

// Tasks that share no backend (self only): the only sign of a peer's end is
// its bootstrap connection hanging up. Rank `victim` dies at once; the
// other advances until it hears of it (keepalives off).
int connection_case(Client& client, std::uint32_t victim) {
  Context& c = client.context(0);
  if (client.task() == victim) ::raise(SIGKILL);
  const std::uint32_t other = victim;
  // The first failure heard, and how often the victim's was: a survivor
  // that is done may end before another has heard of the victim, which
  // then hears of that end too (rank 0 of three, gone while rank 1 waits).
  struct Heard {
    int errors = 0;
    int victim_errors = 0;
    std::uint32_t victim = 0;
    std::string why;
    Endpoint peer{};
  } heard;
  heard.victim = victim;
  c.set_error_handler({+[](void* p, Endpoint peer, Status why) {
    auto* h = static_cast<Heard*>(p);
    if (peer.task == h->victim) ++h->victim_errors;
    if (h->errors++ != 0) return;
    h->peer = peer;
    h->why = why.what();
  }, &heard});
  const auto start = std::chrono::steady_clock::now();
  if (!progress_until(c, [&] { return heard.errors != 0; })) return 2;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("task %u: the end of task %u seen after %.3f s: %s\n", client.task(), other, seconds,
              heard.why.c_str());
  if (seconds > 5.0) return 3;
  if (heard.peer.task != other || heard.peer.context != 0) return 4;
  if (heard.why.find("bootstrap connection closed") == std::string::npos) return 5;
  if (c.peer_status({other, 0}) != StatusCode::peer_failed) return 6;
  if (c.send_immediate({.dest = {other, 0}, .dispatch = kData}) != StatusCode::peer_failed) return 7;
  for (int i = 0; i < 1000; ++i) (void)c.advance();
  return heard.victim_errors == 1 ? 0 : 8;
}

}  // namespace

TEST_CASE("a peer whose bootstrap connection hangs up has ended: rank 0 sees a rank go and tells the others" * test::any_backend()) {
  Config config;
  REQUIRE(config.set("AMI_BACKENDS", "self").ok());
  REQUIRE(config.set("AMI_REACHABILITY", "symmetric").ok());  // apart on purpose: only the bootstrap joins them
  REQUIRE(config.set("AMI_KEEPALIVE_INTERVAL", "0").ok());
  SUBCASE("rank 1 dies") {
    const auto codes = run_job(2, config, {[](Client& c) { return connection_case(c, 1); },
                                           [](Client& c) { return connection_case(c, 1); }});
    CHECK(codes == std::vector<int>{0, -SIGKILL});
  }
  SUBCASE("rank 0 dies") {
    const auto codes = run_job(2, config, {[](Client& c) { return connection_case(c, 0); },
                                           [](Client& c) { return connection_case(c, 0); }});
    CHECK(codes == std::vector<int>{-SIGKILL, 0});
  }
  SUBCASE("rank 2 of 3 dies: rank 1, which has no way to it, hears of it from rank 0") {
    auto run = [](Client& c) { return connection_case(c, 2); };
    const auto codes = run_job(3, config, {run, run, run});
    INFO("exit codes: " << codes[0] << " " << codes[1] << " " << codes[2]);
    CHECK(codes == std::vector<int>{0, 0, -SIGKILL});
  }
}

AMI_TEST_NEEDS_RDMA_PORT_FROM_BACKEND
