// fork() with a live Client: in the child every call on the inherited
// objects fails, naming the fork, advance() takes nothing from the parent's
// rings, and destroying the copies leaves the parent's registrations alone;
// the parent goes on as if nothing had happened.
//
// Every forked child here runs plain code and leaves by _exit() with a code
// its parent checks: it never returns into doctest, nor flushes the stdio
// buffers it inherited (its messages go to stderr, unbuffered).
#include <doctest/doctest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ami/ami.hpp"
#include "jobs.hpp"
#include "pair.hpp"

using namespace ami;
using namespace test;

namespace {

constexpr std::uint16_t kEcho = 1;   // rank 0 -> rank 1: header holds an index
constexpr std::uint16_t kReply = 2;  // rank 1 -> rank 0: the same index back
constexpr std::uint16_t kBye = 3;
constexpr std::uint16_t kKeys = 4;   // the owner's remote keys
constexpr std::uint16_t kGo = 5;     // the forked child has come and gone
constexpr std::uint16_t kDone = 6;   // the writer's PUTs are placed; header: how many failed
constexpr std::uint16_t kUnused = 7;
constexpr int kMessages = 256;

// Is s the fork refusal, naming call?
bool names_fork(Status s, const char* call) {
  const std::string expected = "not_supported: " + std::string(call) + ": this process was forked";
  return s == StatusCode::not_supported && to_string(s).rfind(expected, 0) == 0;
}

// In a forked child: counts the calls that did not refuse as they should.
struct Refusals {
  int wrong = 0;
  void expect(Status s, const char* call) {
    if (names_fork(s, call)) return;
    std::fprintf(stderr, "forked child: %s returned '%s'\n", call, to_string(s).c_str());
    ++wrong;
  }
};

// Every post call, setter and query of c that must refuse in a child.
void expect_refusals(Refusals& r, Context& c, Endpoint peer, const Memory& local) {
  std::uint64_t v = 7;
  const auto payload = std::as_bytes(std::span(&v, 1));
  r.expect(c.send({.dest = peer, .dispatch = kEcho, .payload = payload}), "send");
  r.expect(c.send_immediate({.dest = peer, .dispatch = kEcho, .payload = payload}), "send_immediate");
  r.expect(c.put({.dest = peer, .local = &local, .remote = local.remote_key(), .bytes = 8}), "put");
  r.expect(c.get({.dest = peer, .local = &local, .remote = local.remote_key(), .bytes = 8}), "get");
  r.expect(c.fence(peer, {}), "fence");
  r.expect(c.fence_all({}), "fence_all");
  r.expect(c.set_dispatch(kUnused, {}), "set_dispatch");  // kReply's handler stays, as in the parent
  r.expect(c.post({}), "post");
  r.expect(c.peer_status(peer), "peer_status");
  r.expect(c.accept(Deferred{.id = 1, .origin = peer, .total_bytes = 8}, &v, {}), "accept");
  if (c.immediate_limit(peer) != 0) {
    std::fprintf(stderr, "forked child: immediate_limit is not 0\n");
    ++r.wrong;
  }
  if (!c.backend_for(peer).empty()) {
    std::fprintf(stderr, "forked child: backend_for names a backend\n");
    ++r.wrong;
  }
}

// Replies handled, by index (kMessages: the warm-up's).
struct Replies {
  std::vector<int> seen = std::vector<int>(kMessages + 1, 0);
  int total = 0;
  int bad = 0;
  static void handler(void* r, const Incoming& in, Receive*) {
    auto* k = static_cast<Replies*>(r);
    std::uint32_t i = 0;
    if (in.header.size() != sizeof i) {
      ++k->bad;
      return;
    }
    std::memcpy(&i, in.header.data(), sizeof i);
    if (i > kMessages) {
      ++k->bad;
      return;
    }
    ++k->seen[i];
    ++k->total;
  }
};

Status send_index(Context& c, Endpoint to, std::uint16_t dispatch, const std::uint32_t& index) {
  Status s;
  while ((s = c.send_immediate({.dest = to, .dispatch = dispatch, .header = std::as_bytes(std::span(&index, 1))})) ==
         StatusCode::no_resource)
    (void)c.advance();
  return s;
}

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

// The forked child of test (a): every call refuses; then it advances the
// inherited context until the parent says stop, while the parent's replies
// flow into the ring they share. Not one event may happen here.
[[noreturn]] void echo_child(Client& client, const Memory& local, const Replies& replies, int stop_fd) {
  Context& c = client.context(0);
  Refusals r;
  expect_refusals(r, c, {1, 0}, local);
  const int replies_before = replies.total;
  std::size_t events = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!readable(stop_fd) && std::chrono::steady_clock::now() < end) events += c.advance(16);
  if (events != 0) std::fprintf(stderr, "forked child: advance() handled %zu events\n", events);
  if (replies.total != replies_before)
    std::fprintf(stderr, "forked child: handled %d of the parent's replies\n", replies.total - replies_before);
  _exit(r.wrong != 0 ? 1 : events != 0 || replies.total != replies_before ? 2 : 0);
}

// Rank 0 of test (a): forks once its lanes are up, then exchanges
// kMessages with rank 1 while the child advances its copy.
int forking_sender(Client& client) {
  Context& c = client.context(0);
  Replies replies;
  if (!c.set_dispatch(kReply, {&Replies::handler, &replies}).ok()) return 2;
  std::vector<std::uint8_t> buffer(64);
  Memory local;
  if (!client.register_memory(buffer.data(), buffer.size(), local).ok()) return 3;
  const std::uint32_t warm_up = kMessages;
  if (!send_index(c, {1, 0}, kEcho, warm_up).ok()) return 4;
  if (!progress_until(c, [&] { return replies.total == 1; })) return 5;

  int stop[2];
  if (::pipe(stop) != 0) return 6;
  const pid_t pid = ::fork();
  if (pid < 0) return 7;
  if (pid == 0) {
    ::close(stop[1]);
    echo_child(client, local, replies, stop[0]);
  }
  ::close(stop[0]);
  std::vector<std::uint32_t> index(kMessages);
  int rc = 0;
  for (std::uint32_t i = 0; i < kMessages && rc == 0; ++i) {
    index[i] = i;
    if (!send_index(c, {1, 0}, kEcho, index[i]).ok()) rc = 8;
    (void)c.advance();
  }
  if (rc == 0 && !progress_until(c, [&] { return replies.total == kMessages + 1; })) rc = 9;
  // A while longer: a reply handled twice, or an echo of something the
  // child sent, would come now.
  const auto linger = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  while (std::chrono::steady_clock::now() < linger) (void)c.advance();
  if (::write(stop[1], "x", 1) != 1 && rc == 0) rc = 14;
  ::close(stop[1]);
  const int child = wait_all({pid}, std::chrono::seconds(40))[0];
  if (child != 0) {
    std::fprintf(stderr, "rank 0: the forked child exited with %d\n", child);
    if (rc == 0) rc = 10;
  }
  for (int i = 0; i <= kMessages; ++i)
    if (replies.seen[i] != 1) {
      std::fprintf(stderr, "rank 0: reply %d handled %d times\n", i, replies.seen[i]);
      if (rc == 0) rc = 11;
    }
  if (replies.bad != 0 && rc == 0) rc = 12;
  const std::uint32_t none = 0;
  if (!send_index(c, {1, 0}, kBye, none).ok() && rc == 0) rc = 13;
  for (int i = 0; i < 2000; ++i) (void)c.advance();
  return rc;
}

// Rank 1 of test (a): answers every kEcho with its index, until kBye.
int echo(Client& client) {
  Context& c = client.context(0);
  struct State {
    std::vector<std::uint32_t> pending;
    int received = 0;
    int bad = 0;
    bool bye = false;
  } st;
  auto on_echo = +[](void* s, const Incoming& in, Receive*) {
    auto* k = static_cast<State*>(s);
    ++k->received;
    std::uint32_t i = 0;
    if (in.header.size() != sizeof i) {
      ++k->bad;
      return;
    }
    std::memcpy(&i, in.header.data(), sizeof i);
    k->pending.push_back(i);
  };
  if (!c.set_dispatch(kEcho, {on_echo, &st}).ok()) return 2;
  if (!c.set_dispatch(kBye, {+[](void* s, const Incoming&, Receive*) { static_cast<State*>(s)->bye = true; }, &st})
           .ok())
    return 2;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(40);
  std::vector<std::uint32_t> answering;
  while (!st.bye) {
    (void)c.advance();
    answering.swap(st.pending);
    for (const std::uint32_t& i : answering)
      if (!send_index(c, {0, 0}, kReply, i).ok()) return 3;
    answering.clear();
    if (std::chrono::steady_clock::now() > end) return 4;
  }
  for (int i = 0; i < 2000; ++i) (void)c.advance();
  if (st.received != kMessages + 1) {
    std::fprintf(stderr, "rank 1: %d echo requests, expected %d\n", st.received, kMessages + 1);
    return 5;
  }
  return st.bad == 0 ? 0 : 6;
}

std::uint8_t pattern(std::size_t i, std::uint32_t seed) {
  return static_cast<std::uint8_t>((i * 29 + seed * 13) & 0xFF);
}

constexpr std::size_t kRegionBytes = 3 * 4096 + 17;

// Rank 0 of test (b): owns two regions (allocated, registered) and sends
// their keys; a forked child destroys its copies of them and of the
// Client; then rank 1 PUTs into both.
int forking_owner(Client& client) {
  Context& c = client.context(0);
  std::vector<std::uint8_t> storage(kRegionBytes, 0);
  std::optional<Memory> allocated(std::in_place), registered(std::in_place);
  if (!client.allocate_memory(kRegionBytes, *allocated).ok()) return 2;
  if (!client.register_memory(storage.data(), storage.size(), *registered).ok()) return 2;
  bool done = false;
  std::uint32_t failures = ~0u;
  struct DoneBox {
    bool* done;
    std::uint32_t* failures;
  } box{&done, &failures};
  auto on_done = +[](void* b, const Incoming& in, Receive*) {
    auto* k = static_cast<DoneBox*>(b);
    if (in.header.size() == sizeof(std::uint32_t)) std::memcpy(k->failures, in.header.data(), sizeof(std::uint32_t));
    *k->done = true;
  };
  if (!c.set_dispatch(kDone, {on_done, &box}).ok()) return 3;
  std::array<std::byte, 2 * RemoteKey::kSerializedSize> keys{};
  const auto a = allocated->remote_key().to_bytes();
  const auto r = registered->remote_key().to_bytes();
  std::memcpy(keys.data(), a.data(), a.size());
  std::memcpy(keys.data() + a.size(), r.data(), r.size());
  int sent = 0;
  if (!c.send({.dest = {1, 0}, .dispatch = kKeys, .payload = keys,
               .local_done = {+[](void* n, Status s) { *static_cast<int*>(n) = s.ok() ? 1 : -1; }, &sent}})
           .ok())
    return 4;
  if (!progress_until(c, [&] { return sent != 0; }) || sent != 1) return 5;

  const pid_t pid = ::fork();
  if (pid < 0) return 6;
  if (pid == 0) {
    // The child's copies go, the way a child that never heard of ami
    // would let them go on its way out.
    allocated.reset();
    registered.reset();
    std::destroy_at(&client);
    _exit(0);
  }
  const int child = wait_all({pid}, std::chrono::seconds(30))[0];
  if (child != 0) {
    std::fprintf(stderr, "rank 0: the forked child exited with %d\n", child);
    return 7;
  }
  const std::uint32_t none = 0;
  if (!send_index(c, {1, 0}, kGo, none).ok()) return 8;
  if (!progress_until(c, [&] { return done; })) return 9;
  if (failures != 0) {
    std::fprintf(stderr, "rank 0: %u of the peer's PUTs failed\n", failures);
    return 10;
  }
  const auto* in_allocated = static_cast<const std::uint8_t*>(allocated->address());
  for (std::size_t i = 0; i < kRegionBytes; ++i)
    if (in_allocated[i] != pattern(i, 1) || storage[i] != pattern(i, 2)) return 11;
  for (int i = 0; i < 2000; ++i) (void)c.advance();
  return 0;
}

// Rank 1 of test (b): PUTs a pattern into each of rank 0's regions once
// told the child is gone, fences, and reports how many PUTs failed.
int writer(Client& client) {
  Context& c = client.context(0);
  struct State {
    RemoteKey allocated, registered;
    bool have_keys = false;
    bool bad_keys = false;
    bool go = false;
  } st;
  auto on_keys = +[](void* s, const Incoming& in, Receive*) {
    auto* k = static_cast<State*>(s);
    k->have_keys = true;
    k->bad_keys = in.payload.size() != 2 * RemoteKey::kSerializedSize ||
                  !RemoteKey::from_bytes(in.payload.first(RemoteKey::kSerializedSize), k->allocated).ok() ||
                  !RemoteKey::from_bytes(in.payload.subspan(RemoteKey::kSerializedSize), k->registered).ok();
  };
  if (!c.set_dispatch(kKeys, {on_keys, &st}).ok()) return 2;
  if (!c.set_dispatch(kGo, {+[](void* s, const Incoming&, Receive*) { static_cast<State*>(s)->go = true; }, &st})
           .ok())
    return 2;
  if (!progress_until(c, [&] { return st.have_keys && st.go; }) || st.bad_keys) return 3;
  std::vector<std::uint8_t> source(2 * kRegionBytes);
  for (std::size_t i = 0; i < kRegionBytes; ++i) {
    source[i] = pattern(i, 1);
    source[kRegionBytes + i] = pattern(i, 2);
  }
  Memory local;
  if (!client.register_memory(source.data(), source.size(), local).ok()) return 4;
  struct Count {
    int ok = 0;
    std::uint32_t failed = 0;
  } count;
  const Callback counted{+[](void* n, Status s) {
                           auto* k = static_cast<Count*>(n);
                           if (s.ok()) {
                             ++k->ok;
                             return;
                           }
                           std::fprintf(stderr, "rank 1: a PUT ended with '%s'\n", to_string(s).c_str());
                           ++k->failed;
                         },
                         &count};
  for (int i = 0; i < 2; ++i) {
    const Status s = c.put({.dest = {0, 0}, .local = &local, .local_offset = static_cast<std::uint64_t>(i) * kRegionBytes,
                            .remote = i == 0 ? st.allocated : st.registered, .bytes = kRegionBytes,
                            .local_done = counted});
    if (!s.ok()) {
      std::fprintf(stderr, "rank 1: put returned '%s'\n", to_string(s).c_str());
      ++count.failed;
      ++count.ok;  // counted as over
    }
  }
  bool fenced = false;
  if (!c.fence({0, 0}, {+[](void* f, Status) { *static_cast<bool*>(f) = true; }, &fenced}).ok()) return 5;
  if (!progress_until(c, [&] { return fenced && count.ok + static_cast<int>(count.failed) >= 2; })) return 6;
  if (!send_index(c, {0, 0}, kDone, count.failed).ok()) return 7;
  for (int i = 0; i < 2000; ++i) (void)c.advance();
  return count.failed == 0 ? 0 : 8;
}

// Two contexts of one Client: advances both until pred holds or 30 s pass.
bool progress_both(Context& a, Context& b, const std::function<bool()>& pred) {
  return progress_until(b, [&] {
    (void)a.advance();
    return pred();
  });
}

}  // namespace

TEST_CASE("fork: the child's copy of a job's Client refuses every call and takes none of the parent's replies") {
  // Without the guard the child sends as rank 0 and drains rank 0's ring:
  // replies are handled in both processes, or lost to the parent.
  CHECK(run_job(2, Config{}, {forking_sender, echo}) == std::vector<int>{0, 0});
}

TEST_CASE("fork: a child destroying its copies of a Memory and of the Client leaves the parent's keys valid") {
  for (const std::string cma : {"on", "off"}) {
    CAPTURE(cma);
    // Cells that carry both keys in one packet.
    const Config config = test::config_with({{"AMI_SHM_CMA", cma}, {"AMI_SHM_CELL_SIZE", "512"}});
    CHECK(run_job(2, config, {forking_owner, writer}) == std::vector<int>{0, 0});
  }
}

TEST_CASE("fork: a Client of one process; the child's calls fail naming the fork, a new Client there works") {
  const Config config = test::config_with({{"AMI_BACKENDS", "self"}});
  Client client(ClientOptions{.name = "test", .contexts = 2, .job = {}, .config = config});
  Context& a = client.context(0);
  Context& b = client.context(1);
  int handled = 0;
  auto on_message = +[](void* n, const Incoming&, Receive*) { ++*static_cast<int*>(n); };
  REQUIRE(b.set_dispatch(kEcho, {on_message, &handled}).ok());
  std::uint64_t v = 1;
  const auto payload = std::as_bytes(std::span(&v, 1));
  REQUIRE(a.send_immediate({.dest = {0, 1}, .dispatch = kEcho, .payload = payload}).ok());
  REQUIRE(progress_both(a, b, [&] { return handled == 1; }));
  std::optional<Memory> region(std::in_place);
  REQUIRE(client.allocate_memory(4096, *region).ok());
  // In flight at the fork: the parent's to handle, not the child's.
  REQUIRE(a.send_immediate({.dest = {0, 1}, .dispatch = kEcho, .payload = payload}).ok());

  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    Refusals r;
    expect_refusals(r, a, {0, 1}, *region);
    std::size_t events = 0;
    for (int i = 0; i < 1000; ++i) events += a.advance() + b.advance();
    int rc = r.wrong != 0 ? 1 : events != 0 || handled != 1 ? 2 : 0;
    // A Client made here is the child's own, and works.
    if (rc == 0) {
      try {
        Client fresh(ClientOptions{.name = "child", .contexts = 2, .job = {}, .config = config});
        int got = 0;
        if (!fresh.context(1).set_dispatch(kEcho, {on_message, &got}).ok() ||
            !fresh.context(0).send_immediate({.dest = {0, 1}, .dispatch = kEcho, .payload = payload}).ok() ||
            !progress_both(fresh.context(0), fresh.context(1), [&] { return got == 1; }))
          rc = 3;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "forked child: a new Client: %s\n", e.what());
        rc = 4;
      }
    }
    // The copies go; a context kept past them still refuses by name.
    region.reset();
    std::destroy_at(&client);
    if (rc == 0 && !names_fork(a.send_immediate({.dest = {0, 1}, .dispatch = kEcho, .payload = payload}),
                               "send_immediate"))
      rc = 5;
    _exit(rc);
  }
  CHECK(wait_all({pid}, std::chrono::seconds(30))[0] == 0);

  // The parent: the message in flight at the fork is handled here, once.
  CHECK(progress_both(a, b, [&] { return handled == 2; }));
  for (int i = 0; i < 100; ++i) (void)(a.advance() + b.advance());
  CHECK(handled == 2);
  REQUIRE(a.send_immediate({.dest = {0, 1}, .dispatch = kEcho, .payload = payload}).ok());
  CHECK(progress_both(a, b, [&] { return handled == 3; }));
  // The region whose copy the child destroyed still takes a PUT.
  std::vector<std::uint8_t> source(4096, 0x5A);
  Memory local;
  REQUIRE(client.register_memory(source.data(), source.size(), local).ok());
  int put_done = 0;
  REQUIRE(a.put({.dest = {0, 1}, .local = &local, .remote = region->remote_key(), .bytes = 4096,
                 .local_done = {+[](void* n, Status s) { *static_cast<int*>(n) = s.ok() ? 1 : -1; }, &put_done}})
              .ok());
  CHECK(progress_both(a, b, [&] { return put_done != 0; }));
  CHECK(put_done == 1);
  CHECK(std::memcmp(region->address(), source.data(), source.size()) == 0);
}
