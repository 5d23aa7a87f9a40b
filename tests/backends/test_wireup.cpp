// test_wireup.cpp — wire-up on first use, in jobs of real processes over
// verbs (the tests/rxe VM; skipped where no RDMA port is active): a task
// makes a queue pair only for the peer contexts it talks to, connections
// asked for from both sides at once end as one pair (by the handshake and
// by rdma_cm alike), and a peer that is gone
// before its lane was connected fails the operations given to it.
#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "ami/ami.hpp"
#include "jobs.hpp"

using namespace ami;

namespace {

constexpr std::uint16_t kPing = 11;
constexpr std::uint16_t kPong = 12;

// Verbs alone, lanes connected by the handshake (cm "off") or rdma_cm ("on").
Config verbs_job(const char* cm = "off") {
  return test::config_with({{"AMI_BACKENDS", "self,verbs"}, {"AMI_VERBS_CM", cm}});
}

// "…, 4 queue pair(s) made" in the verbs line of describe_backends().
long queue_pairs_made(Client& c) {
  const std::string text = c.describe_backends();
  const std::size_t at = text.find(" queue pair(s) made");
  if (at == std::string::npos) return -1;
  std::size_t from = at;
  while (from > 0 && text[from - 1] >= '0' && text[from - 1] <= '9') --from;
  return from == at ? -1 : std::stol(text.substr(from, at - from));
}

ClientOptions with_contexts(std::uint32_t rank, std::uint32_t size, const std::string& address, const Config& c,
                            std::uint16_t contexts) {
  ClientOptions o = test::job(rank, size, address, c);
  o.contexts = contexts;
  return o;
}

// Per context: what came, by origin task, as (dispatch, number) pairs.
struct Log {
  Context* context = nullptr;
  std::vector<std::vector<std::uint32_t>> pings;  // by origin task: numbers in arrival order
  std::uint32_t pongs = 0;
};

void on_ping(void* cookie, const Incoming& in, Receive*) {
  auto* log = static_cast<Log*>(cookie);
  std::uint32_t n = 0;
  std::memcpy(&n, in.header.data(), sizeof n);
  log->pings[in.origin.task].push_back(n);
  // Answered at once, on the lane the ping came by.
  const Status s = log->context->send_immediate({.dest = in.origin, .dispatch = kPong, .header = in.header});
  if (!s.ok()) std::fprintf(stderr, "pong: %s\n", to_string(s).c_str());
}

void on_pong(void* cookie, const Incoming&, Receive*) { ++static_cast<Log*>(cookie)->pongs; }

bool serve(Client& c, std::vector<Log>& logs) {
  logs.resize(c.context_count());
  for (std::uint16_t i = 0; i < c.context_count(); ++i) {
    logs[i].context = &c.context(i);
    logs[i].pings.resize(c.size());
    if (!c.context(i).set_dispatch(kPing, {on_ping, &logs[i]}).ok()) return false;
    if (!c.context(i).set_dispatch(kPong, {on_pong, &logs[i]}).ok()) return false;
  }
  return true;
}

bool ping(Context& ctx, Endpoint dest, std::uint32_t n) {
  std::byte header[4];
  std::memcpy(header, &n, sizeof n);
  for (;;) {
    const Status s = ctx.send_immediate({.dest = dest, .dispatch = kPing, .header = header});
    if (s.ok()) return true;
    if (s != StatusCode::no_resource) {
      std::fprintf(stderr, "ping: %s\n", to_string(s).c_str());
      return false;
    }
    (void)ctx.advance();
  }
}

// Advances every context until done() or 60 s.
template <typename Done>
bool advance_until(Client& c, Done done) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!done()) {
    for (std::uint16_t i = 0; i < c.context_count(); ++i) (void)c.context(i).advance();
    if (std::chrono::steady_clock::now() > end) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("a ring of 8 tasks, each context talking to its two neighbours: two queue pairs per context") {
  constexpr std::uint32_t kTasks = 8;
  constexpr std::uint16_t kContexts = 2;
  constexpr std::uint32_t kPings = 50;
  auto script = [](Client& c) -> int {
    if (queue_pairs_made(c) != 0) return 10;  // none at setup
    std::vector<Log> logs;
    if (!serve(c, logs)) return 11;
    const std::uint32_t right = (c.task() + 1) % c.size(), left = (c.task() + c.size() - 1) % c.size();
    for (std::uint32_t n = 0; n < kPings; ++n)
      for (std::uint16_t i = 0; i < kContexts; ++i)
        if (!ping(c.context(i), Endpoint{right, i}, n)) return 12;
    // Every context: its pongs back, and the left neighbour's pings (it
    // waits for our pongs).
    const bool all = advance_until(c, [&] {
      for (const Log& l : logs)
        if (l.pongs < kPings || l.pings[left].size() < kPings) return false;
      return true;
    });
    if (!all) return 13;
    for (const Log& l : logs)
      for (std::uint32_t n = 0; n < kPings; ++n)
        if (l.pings[left][n] != n) return 14;  // in order, none lost or repeated
    // Stay until both neighbours are done with us too: a last ping round
    // answered means the right one has served ours; the left one's pings
    // all came.
    const long made = queue_pairs_made(c);
    if (made != 2 * kContexts) {
      std::fprintf(stderr, "task %u: %ld queue pairs made, not %u\n", c.task(), made, 2 * kContexts);
      return 15;
    }
    // Linger so that the left neighbour's last pongs are not lost to our exit.
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    (void)advance_until(c, [&] { return std::chrono::steady_clock::now() > until; });
    return 0;
  };
  for (const char* cm : {"off", "on"}) {
    CAPTURE(cm);
    const Config config = verbs_job(cm);
    const auto pids = test::spawn_ranks(
        kTasks,
        [&](std::uint32_t r, const std::string& address) {
          return with_contexts(r, kTasks, address, config, kContexts);
        },
        std::vector<test::Script>(kTasks, script));
    CHECK(test::wait_all(pids, std::chrono::seconds(120)) == std::vector<int>(kTasks, 0));
  }
}

TEST_CASE("every task asking every other at once: one queue pair per peer, messages in order") {
  constexpr std::uint32_t kTasks = 5;
  constexpr std::uint32_t kPings = 40;
  auto script = [](Client& c) -> int {
    std::vector<Log> logs;
    if (!serve(c, logs)) return 11;
    Context& ctx = c.context(0);
    for (std::uint32_t n = 0; n < kPings; ++n)
      for (std::uint32_t t = 0; t < c.size(); ++t)
        if (t != c.task() && !ping(ctx, Endpoint{t, 0}, n)) return 12;
    const bool all = advance_until(c, [&] {
      if (logs[0].pongs < kPings * (c.size() - 1)) return false;
      for (std::uint32_t t = 0; t < c.size(); ++t)
        if (t != c.task() && logs[0].pings[t].size() < kPings) return false;
      return true;
    });
    if (!all) return 13;
    for (std::uint32_t t = 0; t < c.size(); ++t)
      for (std::uint32_t n = 0; t != c.task() && n < kPings; ++n)
        if (logs[0].pings[t][n] != n) return 14;
    if (queue_pairs_made(c) != static_cast<long>(c.size() - 1)) {
      std::fprintf(stderr, "task %u: %ld queue pairs made, not %u\n", c.task(), queue_pairs_made(c), c.size() - 1);
      return 15;
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    (void)advance_until(c, [&] { return std::chrono::steady_clock::now() > until; });
    return 0;
  };
  for (const char* cm : {"off", "on"}) {
    CAPTURE(cm);
    CHECK(test::run_job(kTasks, verbs_job(cm), std::vector<test::Script>(kTasks, script),
                        std::chrono::seconds(120)) == std::vector<int>(kTasks, 0));
  }
}

TEST_CASE("a peer gone before its lane was connected: the operations given to it fail, the others go on") {
  constexpr std::uint32_t kTasks = 3;
  std::vector<test::Script> scripts(kTasks);
  // Task 2 ends as soon as its Client is made, without a word to anyone.
  scripts[2] = [](Client&) -> int { _exit(0); };
  scripts[0] = [](Client& c) -> int {
    std::vector<Log> logs;
    if (!serve(c, logs)) return 11;
    Context& ctx = c.context(0);
    struct Result {
      bool done = false;
      Status status;
    } gone, alive;
    auto record = +[](void* cookie, Status s) {
      auto* r = static_cast<Result*>(cookie);
      r->done = true;
      r->status = s;
    };
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // task 2 is gone by now
    const std::byte payload[64] = {};
    if (!ctx.send({.dest = {2, 0}, .dispatch = kPing, .header = std::span(payload).first(4), .payload = payload,
                   .local_done = {record, &gone}})
             .accepted())
      return 12;
    if (!ctx.send({.dest = {1, 0}, .dispatch = kPing, .header = std::span(payload).first(4), .payload = payload,
                   .remote_done = {record, &alive}})
             .accepted())
      return 13;
    if (!advance_until(c, [&] { return gone.done && alive.done; })) return 14;
    if (gone.status != StatusCode::peer_failed) return 15;
    if (!alive.status.ok()) return 16;
    return 0;
  };
  scripts[1] = [](Client& c) -> int {
    std::vector<Log> logs;
    if (!serve(c, logs)) return 11;
    if (!advance_until(c, [&] { return logs[0].pings[0].size() == 1; })) return 12;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    (void)advance_until(c, [&] { return std::chrono::steady_clock::now() > until; });
    return 0;
  };
  const auto codes = test::run_job(kTasks, verbs_job(), scripts, std::chrono::seconds(90));
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 0);
}
