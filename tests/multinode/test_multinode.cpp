// test_multinode.cpp — a job that spans machines: srun --mpi=pmix across the
// two soft-RoCE VMs of cluster.sh (suite.sh runs it). Each task must reach
// the tasks of its own node by shm and the others by verbs; active messages
// of 1 B to 64 MiB in every rendezvous mode arrive whole both ways; PUT,
// GET and fence work across nodes; every collective runs on the world and
// on a geometry of tasks spread unevenly over the nodes. With --kill, the
// last task kills itself (SIGKILL) once the job has formed, and every
// survivor, on either node, must see it fail in bounded time and go on
// among the others.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <pmix.h>
#include <signal.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "ami/ami.hpp"
#include "pmix_job.hpp"

// Under LeakSanitizer: libpmix keeps a few bytes of PMIx_Init past
// PMIx_Finalize, which are not ours to free.
extern "C" const char* __lsan_default_suppressions() { return "leak:libpmix.so\n"; }

namespace {

using test::advance_until;
using test::Clock;

constexpr std::uint16_t kDispatch = 21;
constexpr std::uint16_t kCollectives = 22;
constexpr auto kDeadline = std::chrono::seconds(120);

// Whether a callback ran, and the status it was given.
struct Outcome {
  bool done = false;
  ami::Status status;
  ami::Callback callback() {
    return {+[](void* cookie, ami::Status s) {
              auto* o = static_cast<Outcome*>(cookie);
              o->done = true;
              o->status = s;
            },
            this};
  }
};

pmix_proc_t pmix_self{};
std::vector<bool> on_my_node;  // by task: shares this task's node (PMIX_LOCAL_PEERS)
bool kill_mode = false;
const char* stop_file = nullptr;  // --stop-node=FILE
bool failure_mode() { return kill_mode || stop_file != nullptr; }

std::uint8_t byte_at(std::size_t i, std::uint32_t origin, std::uint32_t dest, std::size_t size) {
  return static_cast<std::uint8_t>(i * 7 + (i >> 12) + origin * 31 + dest * 13 + size % 251);
}

// The tasks on this node, as the launcher says: "0,1" (PMIX_LOCAL_PEERS).
std::vector<bool> local_tasks(std::uint32_t size) {
  std::vector<bool> local(size, false);
  pmix_proc_t job = pmix_self;
  job.rank = PMIX_RANK_WILDCARD;
  pmix_value_t* v = nullptr;
  if (PMIx_Get(&job, PMIX_LOCAL_PEERS, nullptr, 0, &v) != PMIX_SUCCESS || v == nullptr) return local;
  if (v->type == PMIX_STRING && v->data.string != nullptr) {
    std::string_view list(v->data.string);
    while (!list.empty()) {
      const std::size_t comma = list.find(',');
      const std::uint32_t t = static_cast<std::uint32_t>(std::atoi(std::string(list.substr(0, comma)).c_str()));
      if (t < size) local[t] = true;
      list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
    }
  }
  PMIX_VALUE_RELEASE(v);
  return local;
}

bool meet(ami::Context& c) {
  std::string why;
  const bool met = test::meet_everyone(c, pmix_self, why, kDeadline);
  if (!met) FAIL_CHECK(why);
  return met;
}

// A task's remote key through the launcher, under prefix + its task:
// published here, fetched by the others once all have met.
void publish_key(const ami::RemoteKey& key, const std::string& prefix, std::uint32_t me) {
  const auto bytes = key.to_bytes();
  pmix_value_t value;
  PMIX_VALUE_CONSTRUCT(&value);
  value.type = PMIX_BYTE_OBJECT;
  value.data.bo.bytes = const_cast<char*>(reinterpret_cast<const char*>(bytes.data()));
  value.data.bo.size = bytes.size();
  const std::string name = prefix + std::to_string(me);
  REQUIRE(PMIx_Put(PMIX_GLOBAL, name.c_str(), &value) == PMIX_SUCCESS);
  REQUIRE(PMIx_Commit() == PMIX_SUCCESS);
}

ami::RemoteKey fetch_key(const std::string& prefix, std::uint32_t task) {
  pmix_proc_t p = pmix_self;
  p.rank = task;
  pmix_value_t* v = nullptr;
  const std::string name = prefix + std::to_string(task);
  REQUIRE(PMIx_Get(&p, name.c_str(), nullptr, 0, &v) == PMIX_SUCCESS);
  ami::RemoteKey key;
  const ami::Status s = ami::RemoteKey::from_bytes(std::as_bytes(std::span(v->data.bo.bytes, v->data.bo.size)), key);
  PMIX_VALUE_RELEASE(v);
  REQUIRE(s.ok());
  return key;
}

ami::Config config_with(std::string_view name, std::string_view value) {
  ami::Config c = ami::Config::from_environment();
  REQUIRE(c.set(name, value).ok());
  return c;
}

// Every message this task expects and sends, with their checks.
struct Exchange {
  std::uint32_t me = 0;
  std::size_t arrived = 0, verified = 0, remote_done = 0, problems = 0;
  std::deque<std::vector<std::uint8_t>> buffers;  // (a deque: each stays put while more come)

  void check(const std::uint8_t* data, std::size_t bytes, std::uint32_t origin) {
    ++verified;
    for (std::size_t i = 0; i < bytes; ++i)
      if (data[i] != byte_at(i, origin, me, bytes)) {
        if (problems++ < 5)
          FAIL_CHECK("task ", me, ": byte ", i, " of ", bytes, " from task ", origin, " is wrong");
        return;
      }
  }

  static void on_message(void* cookie, const ami::Incoming& in, ami::Receive* recv) {
    auto& x = *static_cast<Exchange*>(cookie);
    ++x.arrived;
    const std::uint32_t origin = in.origin.task;
    if (recv == nullptr) return x.check(reinterpret_cast<const std::uint8_t*>(in.payload.data()), in.payload.size(), origin);
    auto& buffer = x.buffers.emplace_back(in.total_bytes);
    recv->buffer = buffer.data();
    struct Done {
      Exchange* x;
      std::vector<std::uint8_t>* buffer;
      std::uint32_t origin;
    };
    auto* d = new Done{&x, &buffer, origin};
    recv->done = {+[](void* cookie, ami::Status s) {
                    std::unique_ptr<Done> d(static_cast<Done*>(cookie));
                    if (!s.ok()) {  // its bytes are not all there: nothing to check
                      FAIL_CHECK("a receive completed with ", ami::to_string(s));
                      ++d->x->verified;
                    } else {
                      d->x->check(d->buffer->data(), d->buffer->size(), d->origin);
                    }
                    std::vector<std::uint8_t>().swap(*d->buffer);  // 64 MiB each: given back at once
                  },
                  d};
  }
};

}  // namespace

TEST_CASE("each task reaches its own node's tasks by shm and the other node's by verbs") {
  if (failure_mode()) return;
  ami::Client client(ami::ClientOptions{.name = "reach", .contexts = 1});
  ami::Context& c = client.context(0);
  bool other_node = false;
  for (std::uint32_t t = 0; t < client.size(); ++t) {
    if (t == client.task()) continue;
    const std::string_view via = c.backend_for({t, 0});
    MESSAGE("task ", client.task(), ": task ", t, " by ", via);
    CHECK(via == (on_my_node[t] ? "shm" : "verbs"));
    other_node = other_node || !on_my_node[t];
  }
  CHECK_MESSAGE(other_node, "the job does not span two nodes");
  meet(c);
}

TEST_CASE("active messages of 1 B to 64 MiB in every rendezvous mode, between and within nodes, every byte checked") {
  if (failure_mode()) return;
  constexpr std::array<std::size_t, 5> kSizes = {1, 4096, 65536, 1 << 20, 64 << 20};
  for (const char* mode : {"discard_get", "split_get", "stop_put"}) {
    CAPTURE(mode);
    ami::Client client(ami::ClientOptions{.name = "am", .contexts = 1, .config = config_with("AMI_RNDV_MODE", mode)});
    ami::Context& c = client.context(0);
    const std::uint32_t me = client.task(), n = client.size();
    Exchange x;
    x.me = me;
    REQUIRE(c.set_dispatch(kDispatch, {&Exchange::on_message, &x}).ok());
    // Every size to every task; 64 MiB only to the next one (and so from
    // the previous one), which crosses nodes where the next task is there.
    std::vector<std::vector<std::uint8_t>> payloads;
    std::size_t sent = 0, expected = 0;
    for (std::uint32_t step = 1; step < n; ++step) {
      const std::uint32_t dest = (me + step) % n;
      for (std::size_t size : kSizes) {
        if (size == kSizes.back() && step != 1) continue;
        auto& p = payloads.emplace_back(size);
        for (std::size_t i = 0; i < size; ++i) p[i] = byte_at(i, me, dest, size);
        const ami::SendParams params{.dest = {dest, 0}, .dispatch = kDispatch, .header = {},
                                     .payload = std::as_bytes(std::span(p)), .local_done = {},
                                     .remote_done = {+[](void* cookie, ami::Status s) {
                                                       if (!s.ok()) FAIL_CHECK("remote done: ", ami::to_string(s));
                                                       ++static_cast<Exchange*>(cookie)->remote_done;
                                                     },
                                                     &x}};
        ami::Status st;
        while ((st = c.send(params)) == ami::StatusCode::no_resource) (void)c.advance();
        REQUIRE_MESSAGE(st.ok(), ami::to_string(st));
        ++sent;
      }
      expected += kSizes.size() - 1 + (step == 1 ? 1 : 0);
    }
    CHECK_MESSAGE(advance_until(c, [&] { return x.verified == expected && x.remote_done == sent; },
                                Clock::now() + kDeadline),
                  "task ", me, ": ", x.verified, " of ", expected, " verified, ", x.remote_done, " of ", sent,
                  " remote done");
    CHECK(x.problems == 0);
    CHECK(c.stats().malformed_packets == 0);
    meet(c);
    (void)c.set_dispatch(kDispatch, {});
  }
}

TEST_CASE("PUT, GET and fence to every task, across nodes and within") {
  if (failure_mode()) return;
  constexpr std::size_t kBytes = 1 << 20;
  ami::Client client(ami::ClientOptions{.name = "rdma", .contexts = 1});
  ami::Context& c = client.context(0);
  const std::uint32_t me = client.task(), n = client.size();
  // One slot of kBytes per task in a region every task PUTs into; keys
  // travel through the launcher.
  std::vector<std::uint8_t> slots(n * kBytes), src(kBytes * 2);
  ami::Memory target, source;
  REQUIRE(client.register_memory(slots.data(), slots.size(), target).ok());
  REQUIRE(client.register_memory(src.data(), src.size(), source).ok());
  publish_key(target.remote_key(), "test.key.", me);
  REQUIRE(meet(c));
  std::vector<ami::RemoteKey> keys(n);
  for (std::uint32_t t = 0; t < n; ++t) keys[t] = fetch_key("test.key.", t);
  for (std::size_t i = 0; i < kBytes; ++i) src[i] = byte_at(i, me, 0, kBytes);
  std::size_t put_done = 0, fenced = 0, got = 0;
  auto count = +[](void* cookie, ami::Status s) {
    if (!s.ok()) FAIL_CHECK(ami::to_string(s));
    ++*static_cast<std::size_t*>(cookie);
  };
  // PUT my pattern into my slot at every task, fence each, then GET every
  // task's slot of the next task back from it.
  for (std::uint32_t t = 0; t < n; ++t) {
    REQUIRE(c.put({.dest = {t, 0}, .local = &source, .local_offset = 0, .remote = keys[t],
                   .remote_offset = std::uint64_t{me} * kBytes, .bytes = kBytes, .local_done = {count, &put_done}})
                .ok());
    REQUIRE(c.fence({t, 0}, {count, &fenced}).ok());
  }
  REQUIRE(advance_until(c, [&] { return put_done == n && fenced == n; }, Clock::now() + kDeadline));
  REQUIRE(meet(c));  // every task's PUTs have landed everywhere
  const std::uint32_t next = (me + 1) % n;
  for (std::uint32_t t = 0; t < n; ++t) {
    if (t == me) continue;
    std::memset(src.data() + kBytes, 0, kBytes);
    got = 0;
    REQUIRE(c.get({.dest = {t, 0}, .local = &source, .local_offset = kBytes, .remote = keys[t],
                   .remote_offset = std::uint64_t{next} * kBytes, .bytes = kBytes, .local_done = {count, &got}})
                .ok());
    REQUIRE(advance_until(c, [&] { return got == 1; }, Clock::now() + kDeadline));
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < kBytes; ++i) wrong += src[kBytes + i] != byte_at(i, next, 0, kBytes);
    CHECK_MESSAGE(wrong == 0, "task ", me, ": GET of task ", next, "'s slot from task ", t, ": ", wrong,
                  " bytes wrong");
  }
  meet(c);
}

// Remote atomics across the nodes (docs/DESIGN.md, "Remote atomics"): the
// job spans hosts, so under AMI_ATOMIC_MODE=auto task 0's region is in its
// NIC's domain. Every task adds to its word 0 (the other node's tasks by
// their NICs, task 0's node-mates by shm messages its NIC does, task 0 by
// its self lane) and fetch-adds 32-bit words to the low half of word 1 (a
// compare-and-swap loop on task 0's NIC); no increment may be lost.
TEST_CASE("atomics on a NIC-domain region from both nodes: by the NICs, by message, by a CAS loop") {
  if (failure_mode()) return;
  constexpr int kAdds = 400, kSmall = 100;
  ami::Client client(ami::ClientOptions{.name = "atomics", .contexts = 1});
  ami::Context& c = client.context(0);
  const std::uint32_t me = client.task(), n = client.size();
  std::vector<std::uint64_t> words(8, 0);
  ami::Memory target;
  REQUIRE(client.register_memory(words.data(), words.size() * 8, target).ok());
  const bool spans = std::find(on_my_node.begin(), on_my_node.end(), false) != on_my_node.end();
  CHECK(target.remote_key().atomics == (spans ? ami::AtomicDomain::nic : ami::AtomicDomain::cpu));
  publish_key(target.remote_key(), "test.atomic.key.", me);
  REQUIRE(meet(c));
  const ami::RemoteKey owner_key = fetch_key("test.atomic.key.", 0);
  // tally: atomics done, of which failed
  std::size_t tally[2] = {0, 0}, posted = 0;
  auto on = +[](void* cookie, ami::Status s) {
    auto* k = static_cast<std::size_t*>(cookie);
    if (!s.ok()) {
      FAIL_CHECK(ami::to_string(s));
      ++k[1];
    }
    ++k[0];
  };
  std::uint64_t old = 0;
  const std::size_t total = kAdds + kSmall;
  while (posted < total) {
    while (posted < total && posted - tally[0] < 32) {
      const bool small = posted >= kAdds;
      const ami::Status s = c.atomic({.dest = {0, 0}, .op = small ? ami::AtomicOp::fetch_add : ami::AtomicOp::add,
                                      .type = small ? ami::AtomicType::u32 : ami::AtomicType::u64,
                                      .remote = owner_key, .remote_offset = small ? 8u : 0u, .operand = 1,
                                      .result = small ? &old : nullptr, .done = {on, tally}});
      if (s == ami::StatusCode::no_resource) break;
      REQUIRE_MESSAGE(s.ok(), ami::to_string(s));
      ++posted;
    }
    (void)c.advance();
  }
  REQUIRE(advance_until(c, [&] { return tally[0] == total; }, Clock::now() + kDeadline));
  CHECK(tally[1] == 0);
  REQUIRE(meet(c));  // every task's atomics are done
  if (me == 0) {
    CHECK(std::atomic_ref<std::uint64_t>(words[0]).load() == std::uint64_t{n} * kAdds);
    CHECK(std::atomic_ref<std::uint64_t>(words[1]).load() == std::uint64_t{n} * kSmall);
  }
  meet(c);
}

namespace {

// Runs one collective call to completion (or the deadline).
template <typename Call>
void collective(ami::Context& c, const char* what, Call call) {
  Outcome result;
  const ami::Status st = call(result.callback());
  REQUIRE_MESSAGE(st.ok(), what, ": ", ami::to_string(st));
  REQUIRE_MESSAGE(advance_until(c, [&] { return result.done; }, Clock::now() + kDeadline), what,
                  " did not complete");
  CHECK_MESSAGE(result.status.ok(), what, ": ", ami::to_string(result.status));
}

// barrier, broadcast, reduce, allreduce (8 B and 1 MiB), allgather on g,
// each result checked.
void every_collective(ami::Context& c, ami::Geometry& g) {
  const std::uint32_t n = g.size(), r = g.rank();
  collective(c, "barrier", [&](ami::Callback cb) { return g.barrier(cb); });
  std::vector<std::int64_t> data(1 << 17);  // 1 MiB
  if (r == n - 1) std::iota(data.begin(), data.end(), 5);
  collective(c, "broadcast", [&](ami::Callback cb) { return g.broadcast(n - 1, data.data(), data.size() * 8, cb); });
  CHECK(data[0] == 5);
  CHECK(data.back() == 5 + static_cast<std::int64_t>(data.size()) - 1);
  for (const std::size_t count : {std::size_t{1}, data.size()}) {
    std::vector<std::int64_t> mine(count, r + 1), sum(count, 0);
    collective(c, "allreduce", [&](ami::Callback cb) {
      return g.allreduce(mine.data(), sum.data(), count, ami::DataType::int64, ami::ReduceOp::sum, cb);
    });
    const std::int64_t want = std::int64_t{n} * (n + 1) / 2;
    CHECK(std::all_of(sum.begin(), sum.end(), [&](std::int64_t v) { return v == want; }));
    std::fill(sum.begin(), sum.end(), 0);
    collective(c, "reduce", [&](ami::Callback cb) {
      return g.reduce(0, mine.data(), sum.data(), count, ami::DataType::int64, ami::ReduceOp::max, cb);
    });
    if (r == 0) CHECK(std::all_of(sum.begin(), sum.end(), [&](std::int64_t v) { return v == n; }));
  }
  const std::uint64_t word = 1000 + g.task(r);
  std::vector<std::uint64_t> all(n);
  collective(c, "allgather", [&](ami::Callback cb) { return g.allgather(&word, sizeof word, all.data(), cb); });
  for (std::uint32_t i = 0; i < n; ++i) CHECK(all[i] == 1000 + g.task(i));
}

}  // namespace

TEST_CASE("every collective on the world, and on a geometry spread unevenly over the nodes") {
  if (failure_mode()) return;
  ami::Client client(ami::ClientOptions{.name = "collectives", .contexts = 1});
  ami::Context& c = client.context(0);
  ami::Collectives coll(c, kCollectives);
  every_collective(c, coll.world());
  // Every task on task 0's node and one of the other node: with two tasks
  // per node, three on one node and one on the other.
  std::vector<std::uint32_t> members;
  bool took_other = false;
  for (std::uint32_t t = 0; t < client.size(); ++t) {
    const bool with_zero = on_my_node[t] == on_my_node[0];
    if (with_zero || !took_other) members.push_back(t);
    if (!with_zero) took_other = true;
  }
  // (Every task computes the same list: "with task 0's node" is the same
  // fact on each side.)
  MESSAGE("uneven geometry of ", members.size(), " tasks");
  const bool member = std::find(members.begin(), members.end(), client.task()) != members.end();
  if (member) {
    ami::Geometry* g = nullptr;
    REQUIRE(coll.create_geometry(7, members, g).ok());
    every_collective(c, *g);
  }
  meet(c);
}

TEST_CASE("kill -9 of the last task: survivors on both nodes see it fail in bounded time and go on") {
  if (!kill_mode) return;
  ami::Client client(ami::ClientOptions{.name = "kill", .contexts = 1});
  ami::Context& c = client.context(0);
  ami::Collectives coll(c, kCollectives);
  const std::uint32_t n = client.size(), me = client.task(), victim = n - 1;
  // Everyone talks to everyone first, so the victim's lanes exist.
  every_collective(c, coll.world());
  REQUIRE(meet(c));
  if (me == victim) {
    // Leave the launcher first (this process's two PMIx sessions, the
    // test's and the Client's): Slurm's PMIx plugin ends the whole step
    // when a client it still serves dies. ami under PMIx does not rely on
    // the launcher to see a peer end; everything ami holds (queue pairs,
    // segments, lanes) is still there when the signal comes.
    (void)PMIx_Finalize(nullptr, 0);
    (void)PMIx_Finalize(nullptr, 0);
    ::raise(SIGKILL);
  }
  struct Seen {
    bool failed = false;
    ami::Status why;
  } seen;
  c.set_error_handler({+[](void* cookie, ami::Endpoint, ami::Status s) {
                         auto* seen = static_cast<Seen*>(cookie);
                         seen->failed = true;
                         seen->why = s;
                       },
                       &seen});
  // A message to it, whose remote done must come back failed.
  std::uint8_t byte = 1;
  Outcome reply;
  const ami::Status sent = c.send({.dest = {victim, 0}, .dispatch = kDispatch, .header = {},
                                   .payload = std::as_bytes(std::span(&byte, 1)), .local_done = {},
                                   .remote_done = reply.callback()});
  if (!sent.ok()) reply.done = true, reply.status = sent;  // failed already: refused at once
  const auto start = Clock::now();
  CHECK_MESSAGE(advance_until(c, [&] { return seen.failed && reply.done; }, start + std::chrono::seconds(60)),
                "task ", me, ": the killed task was not failed within 60 s");
  const std::string where = on_my_node[victim] ? "on this node" : "on the other node";
  MESSAGE("task ", me, ": the killed task (", where, ") failed after ",
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count(), " ms: ",
          ami::to_string(seen.why));
  CHECK(seen.why.code() == ami::StatusCode::peer_failed);
  CHECK_MESSAGE(!reply.status.ok(), "the message to it: ", ami::to_string(reply.status));
  // The survivors go on among themselves.
  std::vector<std::uint32_t> survivors(victim);
  std::iota(survivors.begin(), survivors.end(), 0u);
  ami::Geometry* g = nullptr;
  REQUIRE(coll.create_geometry(9, survivors, g).ok());
  every_collective(c, *g);
}

// The other node stopped whole (its VM paused, by whoever watches
// FILE): the tasks on task 0's node fail every task of the other node
// through keepalives and retries in bounded time, and go on among
// themselves; the stopped node's tasks only advance until then (frozen,
// they end with the step, which the launcher fails).
TEST_CASE("the other node stopped: this node's tasks fail all of its tasks in bounded time and go on") {
  if (stop_file == nullptr) return;
  ami::Client client(ami::ClientOptions{.name = "stop", .contexts = 1});
  ami::Context& c = client.context(0);
  ami::Collectives coll(c, kCollectives);
  const std::uint32_t n = client.size(), me = client.task();
  // Everyone talks to everyone first, so every lane exists.
  every_collective(c, coll.world());
  REQUIRE(meet(c));
  std::vector<std::uint32_t> here, there;
  for (std::uint32_t t = 0; t < n; ++t) (on_my_node[t] == on_my_node[0] ? here : there).push_back(t);
  REQUIRE_MESSAGE(!there.empty(), "the job does not span two nodes");
  if (!on_my_node[0]) {
    (void)advance_until(c, [] { return false; }, Clock::now() + kDeadline);
    return;
  }
  std::vector<bool> failed(n, false);
  std::size_t failures = 0;
  struct Seen {
    std::vector<bool>* failed;
    std::size_t* failures;
  } seen{&failed, &failures};
  c.set_error_handler({+[](void* cookie, ami::Endpoint e, ami::Status s) {
                         auto* seen = static_cast<Seen*>(cookie);
                         if (s.code() == ami::StatusCode::peer_failed && !(*seen->failed)[e.task]) {
                           (*seen->failed)[e.task] = true;
                           ++*seen->failures;
                         }
                       },
                       &seen});
  if (me == 0) {
    std::FILE* f = std::fopen(stop_file, "w");
    REQUIRE_MESSAGE(f != nullptr, "cannot ask for the other node to stop: ", stop_file);
    std::fclose(f);
  }
  const auto start = Clock::now();
  CHECK_MESSAGE(advance_until(c, [&] { return failures == there.size(); }, start + std::chrono::seconds(90)),
                "task ", me, ": ", failures, " of the stopped node's ", there.size(), " tasks failed within 90 s");
  MESSAGE("task ", me, ": the stopped node's ", there.size(), " tasks failed after ",
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count(), " ms");
  for (std::uint32_t t : there) CHECK(c.peer_status({t, 0}).code() == ami::StatusCode::peer_failed);
  // This node's tasks go on among themselves.
  ami::Geometry* g = nullptr;
  REQUIRE(coll.create_geometry(11, here, g).ok());
  every_collective(c, *g);
}

int main(int argc, char** argv) {
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--kill") kill_mode = true;
    else if (a.starts_with("--stop-node=")) stop_file = argv[i] + 12;
    else args.push_back(argv[i]);
  }
  if (std::getenv("PMIX_NAMESPACE") == nullptr || std::getenv("PMIX_RANK") == nullptr) {
    std::printf("SKIPPED: not started by a PMIx launcher (tests/multinode/suite.sh runs it under srun)\n");
    return 77;
  }
  if (PMIx_Init(&pmix_self, nullptr, 0) != PMIX_SUCCESS) {
    std::fprintf(stderr, "test_multinode: PMIx_Init failed\n");
    return 1;
  }
  int failed = 1;
  {
    pmix_proc_t job = pmix_self;
    job.rank = PMIX_RANK_WILDCARD;
    pmix_value_t* v = nullptr;
    std::uint32_t size = 0;
    if (PMIx_Get(&job, PMIX_JOB_SIZE, nullptr, 0, &v) == PMIX_SUCCESS && v != nullptr) {
      size = v->type == PMIX_UINT32 ? v->data.uint32 : 0;
      PMIX_VALUE_RELEASE(v);
    }
    on_my_node = local_tasks(size);
    doctest::Context context;
    context.setOption("no-colors", true);
    context.applyCommandLine(static_cast<int>(args.size()), args.data());
    try {
      failed = context.run();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "test_multinode: task %u: %s\n", pmix_self.rank, e.what());
    }
  }
  // (After a kill or a stopped node, the launcher's session has a dead or
  // frozen rank: no fence at the end, and finalising may not be answered.)
  if (!failure_mode()) (void)PMIx_Finalize(nullptr, 0);
  return failed != 0 ? 1 : 0;
}
