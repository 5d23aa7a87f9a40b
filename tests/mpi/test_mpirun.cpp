// Jobs started by a PMIx launcher (mpirun.sh runs this under mpirun with 1,
// 2 and 4 processes): every rank's Client learns its place from PMIx, then
// every rank sends every rank, itself included, active messages of 1 B,
// 1000 B (several shm packets) and 100 KB (stopped by its receiver, the
// rest moved by GET or PUT), each with a remote-done, three rounds, and
// checks every byte that arrives. Addresses are learnt on first use
// (AMI_ADDRESSES=auto under PMIx): a ring job learns only its neighbours, a
// job told start learns all at once, a peer whose address does not fit
// fails at first use, not at creation. The test
// speaks PMIx itself too: to read rank and size independently of ami, and
// to meet the other ranks at the end without ceasing to advance.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <pmix.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ami/ami.hpp"
#include "pmix_job.hpp"

// Under LeakSanitizer: libpmix keeps a few bytes of PMIx_Init (a failed
// one too) past PMIx_Finalize, which are not ours to free.
extern "C" const char* __lsan_default_suppressions() { return "leak:libpmix.so\n"; }

namespace {

using test::Clock;

ami::Client* the_client = nullptr;  // every rank's one Client, built by main
std::uint32_t expected_ranks = 0;   // from --ranks=N: what the launcher was asked for; 0: unchecked
pmix_proc_t pmix_self{};            // the test's own view of the job

constexpr std::uint16_t kDispatch = 11;
constexpr std::array<std::size_t, 3> kSizes = {1, 1000, 100 * 1000};
constexpr std::uint32_t kRounds = 3;
constexpr auto kDeadline = std::chrono::seconds(60);
constexpr std::size_t kMaxProblems = 20;  // reported in full; the rest only counted

std::uint8_t byte_at(std::size_t i, std::uint32_t origin, std::uint32_t dest, std::uint32_t size_index,
                     std::uint32_t round) {
  return static_cast<std::uint8_t>(i * 131 + (i >> 10) + origin * 29 + dest * 17 + size_index * 7 + round * 3);
}

struct Header {
  std::uint32_t origin, size_index, round;
};

// What went wrong, in words, on this rank; the first kMaxProblems kept.
struct Problems {
  std::vector<std::string> text;
  std::size_t count = 0;
  void add(std::string what) {
    if (count++ < kMaxProblems) text.push_back(std::move(what));
  }
};

struct Exchange;

// One expected message at the receiver: (origin, size, round).
struct Slot {
  Exchange* exchange = nullptr;
  Header id{};
  std::vector<std::uint8_t> buffer;
  bool arrived = false;  // the handler saw it
  bool complete = false;  // every byte in place and checked
};

// One message this rank sends: its payload stays put until local done.
struct Outgoing {
  Exchange* exchange = nullptr;
  Header id{};
  std::uint32_t dest = 0;
  std::vector<std::uint8_t> payload;
  bool local_done = false;
  bool remote_done = false;
};

struct Exchange {
  std::uint32_t me = 0, ranks = 0;
  std::vector<Slot> slots;  // indexed by slot_of()
  std::vector<Outgoing> outgoing;
  std::size_t completed = 0, local_done = 0, remote_done = 0;
  Problems problems;

  Exchange(std::uint32_t task, std::uint32_t size) : me(task), ranks(size), slots(size * kSizes.size() * kRounds) {
    for (std::uint32_t o = 0; o < size; ++o)
      for (std::uint32_t s = 0; s < kSizes.size(); ++s)
        for (std::uint32_t r = 0; r < kRounds; ++r) slots[slot_of({o, s, r})] = Slot{this, {o, s, r}, {}, false, false};
  }

  std::size_t slot_of(const Header& h) const { return (h.origin * kSizes.size() + h.size_index) * kRounds + h.round; }

  static std::string name(const Header& h, std::uint32_t dest) {
    return "message " + std::to_string(h.origin) + "->" + std::to_string(dest) + " of " +
           std::to_string(kSizes[h.size_index]) + " B, round " + std::to_string(h.round);
  }

  void verify(Slot& slot, const std::uint8_t* data, std::size_t bytes) {
    slot.complete = true;
    ++completed;
    const Header& h = slot.id;
    if (bytes != kSizes[h.size_index]) {
      problems.add(name(h, me) + ": " + std::to_string(bytes) + " bytes arrived");
      return;
    }
    for (std::size_t i = 0; i < bytes; ++i)
      if (data[i] != byte_at(i, h.origin, me, h.size_index, h.round)) {
        problems.add(name(h, me) + ": byte " + std::to_string(i) + " is " + std::to_string(data[i]) +
                     ", expected " + std::to_string(byte_at(i, h.origin, me, h.size_index, h.round)));
        return;
      }
  }

  static void on_message(void* cookie, const ami::Incoming& in, ami::Receive* recv) {
    auto& x = *static_cast<Exchange*>(cookie);
    Header h{};
    if (in.header.size() != sizeof h) {
      x.problems.add("a header of " + std::to_string(in.header.size()) + " bytes from task " +
                     std::to_string(in.origin.task));
      return;
    }
    std::memcpy(&h, in.header.data(), sizeof h);
    if (h.origin != in.origin.task || h.origin >= x.ranks || h.size_index >= kSizes.size() || h.round >= kRounds) {
      x.problems.add("a header naming origin " + std::to_string(h.origin) + ", size index " +
                     std::to_string(h.size_index) + ", round " + std::to_string(h.round) + " from task " +
                     std::to_string(in.origin.task));
      return;
    }
    Slot& slot = x.slots[x.slot_of(h)];
    if (slot.arrived) {
      x.problems.add(name(h, x.me) + " arrived twice");
      return;
    }
    slot.arrived = true;
    if (recv == nullptr) {
      x.verify(slot, reinterpret_cast<const std::uint8_t*>(in.payload.data()), in.payload.size());
      return;
    }
    slot.buffer.assign(in.total_bytes, 0);
    recv->buffer = slot.buffer.data();
    recv->done = {+[](void* c, ami::Status s) {
                    auto& slot = *static_cast<Slot*>(c);
                    if (!s.ok()) slot.exchange->problems.add(name(slot.id, slot.exchange->me) + ": " + ami::to_string(s));
                    slot.exchange->verify(slot, slot.buffer.data(), slot.buffer.size());
                  },
                  &slot};
  }

  static void on_local(void* cookie, ami::Status s) {
    auto& m = *static_cast<Outgoing*>(cookie);
    if (!s.ok()) m.exchange->problems.add(name(m.id, m.dest) + ": local done: " + ami::to_string(s));
    m.local_done = true;
    ++m.exchange->local_done;
  }

  static void on_remote(void* cookie, ami::Status s) {
    auto& m = *static_cast<Outgoing*>(cookie);
    if (!s.ok()) m.exchange->problems.add(name(m.id, m.dest) + ": remote done: " + ami::to_string(s));
    m.remote_done = true;
    ++m.exchange->remote_done;
  }

  bool finished() const {
    return completed == slots.size() && local_done == outgoing.size() && remote_done == outgoing.size();
  }

  // What is still missing, for a timeout's report.
  std::string missing() const {
    std::string text = "completed " + std::to_string(completed) + " of " + std::to_string(slots.size()) +
                       " incoming, local done " + std::to_string(local_done) + " and remote done " +
                       std::to_string(remote_done) + " of " + std::to_string(outgoing.size()) + " outgoing";
    std::size_t listed = 0;
    for (const Slot& s : slots)
      if (!s.complete && listed++ < kMaxProblems)
        text += "\n  not complete: " + name(s.id, me) + (s.arrived ? " (handler ran)" : " (never arrived)");
    for (const Outgoing& m : outgoing)
      if ((!m.local_done || !m.remote_done) && listed++ < kMaxProblems)
        text += "\n  waiting: " + name(m.id, m.dest) + (m.local_done ? "" : " (no local done)") +
                (m.remote_done ? "" : " (no remote done)");
    return text;
  }
};

using test::advance_until;

bool meet_everyone(ami::Context& c, std::string& why) { return test::meet_everyone(c, pmix_self, why); }

std::uint32_t pmix_job_size() {
  pmix_proc_t job = pmix_self;
  job.rank = PMIX_RANK_WILDCARD;
  pmix_value_t* v = nullptr;
  if (PMIx_Get(&job, PMIX_JOB_SIZE, nullptr, 0, &v) != PMIX_SUCCESS || v == nullptr) return 0;
  const std::uint32_t size = v->type == PMIX_UINT32 ? v->data.uint32 : 0;
  PMIX_VALUE_RELEASE(v);
  return size;
}

std::size_t open_fds() {
  std::size_t n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++n;
  return n;
}

}  // namespace

TEST_CASE("the Client's place in the job comes from the PMIx launcher") {
  ami::Client& client = *the_client;
  CHECK(client.bootstrap_name() == "pmix");
  CHECK(client.task() == pmix_self.rank);
  CHECK(client.size() == pmix_job_size());
  if (expected_ranks != 0) CHECK(client.size() == expected_ranks);
}

// AMI_ATOMIC_MODE=auto takes the NIC's atomic domain only for a job that
// spans hosts, which on first use the launcher's local size tells: a job
// on one host keeps its regions in the CPU's; one across the two VMs of
// tests/multinode (rxe: atomic_cap HCA) has them in the NIC's.
TEST_CASE("AMI_ATOMIC_MODE=auto: the CPU's atomic domain on one host, the NIC's across hosts") {
  ami::Client& client = *the_client;
  std::uint64_t words[4] = {};
  ami::Memory m;
  REQUIRE(client.register_memory(words, sizeof words, m).ok());
  pmix_proc_t job = pmix_self;
  job.rank = PMIX_RANK_WILDCARD;
  pmix_value_t* v = nullptr;
  REQUIRE(PMIx_Get(&job, PMIX_LOCAL_SIZE, nullptr, 0, &v) == PMIX_SUCCESS);
  const std::uint32_t local = v->type == PMIX_UINT32 ? v->data.uint32 : 0;
  PMIX_VALUE_RELEASE(v);
  REQUIRE(local != 0);
  const bool spans = local < client.size();
  // (describe_backends() names the verbs device's atomic_cap when verbs is in use)
  const std::string backends = client.describe_backends();
  const bool nic = backends.find("atomics HCA") != std::string::npos || backends.find("atomics GLOB") != std::string::npos;
  CHECK(m.remote_key().atomics == (spans && nic ? ami::AtomicDomain::nic : ami::AtomicDomain::cpu));
}

TEST_CASE("a second Client in the same processes bootstraps through PMIx too, and sees fresh blobs") {
  ami::Client& first = *the_client;
  ami::Client second(ami::ClientOptions{.name = "second", .contexts = 2});
  CHECK(second.bootstrap_name() == "pmix");
  CHECK(second.task() == first.task());
  CHECK(second.size() == first.size());
  // Expect: the job id is rank 0's new random one, not the first Client's,
  // which it would be had the second exchange read the first one's blobs.
  // (The PMIx session stays open across both: PMIx counts initialisations.)
  CHECK(second.job() != first.job());
}

TEST_CASE("every rank sends every rank 1 B, 1000 B and 100 KB with remote done; every byte checked") {
  ami::Client& client = *the_client;
  ami::Context& c = client.context(0);
  Exchange x(client.task(), client.size());
  REQUIRE(c.set_dispatch(kDispatch, {&Exchange::on_message, &x}).ok());

  x.outgoing.reserve(x.slots.size());
  for (std::uint32_t round = 0; round < kRounds; ++round)
    for (std::uint32_t s = 0; s < kSizes.size(); ++s)
      for (std::uint32_t step = 0; step < x.ranks; ++step) {
        const std::uint32_t dest = (x.me + step) % x.ranks;  // everyone starts with a different peer
        Outgoing& m = x.outgoing.emplace_back(Outgoing{&x, {x.me, s, round}, dest, {}, false, false});
        m.payload.resize(kSizes[s]);
        for (std::size_t i = 0; i < m.payload.size(); ++i) m.payload[i] = byte_at(i, x.me, dest, s, round);
        const ami::SendParams p{.dest = {dest, 0}, .dispatch = kDispatch,
                                .header = std::as_bytes(std::span(&m.id, 1)),
                                .payload = std::as_bytes(std::span(m.payload)),
                                .local_done = {&Exchange::on_local, &m},
                                .remote_done = {&Exchange::on_remote, &m}};
        ami::Status st;
        while ((st = c.send(p)) == ami::StatusCode::no_resource) (void)c.advance();
        if (!st.ok()) {  // no callback will come: nothing to wait for
          x.problems.add(Exchange::name(m.id, dest) + ": send: " + ami::to_string(st));
          m.local_done = m.remote_done = true;
          ++x.local_done, ++x.remote_done;
        }
      }

  const bool done = advance_until(c, [&] { return x.finished(); }, Clock::now() + kDeadline);
  INFO("rank ", x.me, " of ", x.ranks, ": ", x.missing());
  CHECK_MESSAGE(done, "timed out after ", kDeadline.count(), " s");
  for (const std::string& p : x.problems.text) FAIL_CHECK("rank ", x.me, ": ", p);
  CHECK(x.problems.count == 0);
  CHECK(c.stats().malformed_packets == 0);
  CHECK(c.stats().rndv_stopped > 0);  // the 100 KB messages went the rendezvous way
  CHECK(client.peers_joined() == client.size() - 1);  // everyone talked with everyone

  std::string why;
  CHECK_MESSAGE(meet_everyone(c, why), why);
  (void)c.set_dispatch(kDispatch, {});
}

// Every rank sends one message with a remote done to the next rank of a
// ring and waits for the previous one's: the receiver's ack goes back to
// the sender, so each rank ends up talking with exactly its two
// neighbours (one, in a job of two).
void ring_round(ami::Client& client, ami::Context& c) {
  const std::uint32_t me = client.task(), n = client.size();
  std::size_t arrived = 0;
  bool remote_done = false;
  ami::Status remote_status;
  REQUIRE(c.set_dispatch(kDispatch, {+[](void* cookie, const ami::Incoming& in, ami::Receive*) {
                                       if (in.payload.size() == 4) ++*static_cast<std::size_t*>(cookie);
                                     },
                                     &arrived})
              .ok());
  const std::uint32_t word = me;
  const std::uint32_t next = (me + 1) % n;
  struct Done {
    bool* done;
    ami::Status* status;
  } d{&remote_done, &remote_status};
  const ami::SendParams p{.dest = {next, 0}, .dispatch = kDispatch, .header = {},
                          .payload = std::as_bytes(std::span(&word, 1)), .local_done = {},
                          .remote_done = {+[](void* cookie, ami::Status s) {
                                            auto& dd = *static_cast<Done*>(cookie);
                                            *dd.done = true;
                                            *dd.status = s;
                                          },
                                          &d}};
  ami::Status st;
  while ((st = c.send(p)) == ami::StatusCode::no_resource) (void)c.advance();
  REQUIRE_MESSAGE(st.ok(), ami::to_string(st));
  CHECK_MESSAGE(advance_until(c, [&] { return arrived == 1 && remote_done; }, Clock::now() + kDeadline),
                "rank ", me, ": the ring's message or its remote done did not come");
  CHECK_MESSAGE(remote_status.ok(), ami::to_string(remote_status));
  std::string why;
  CHECK_MESSAGE(meet_everyone(c, why), why);
  (void)c.set_dispatch(kDispatch, {});
}

TEST_CASE("addresses on first use: a ring job learns its two neighbours' addresses, no others") {
  ami::Client client(ami::ClientOptions{.name = "ring", .contexts = 1});
  // (Unless the environment says otherwise, or a backend in use joins only
  // at start.)
  if (!client.addresses_on_demand()) return;
  CHECK(client.peers_joined() == 0);  // nothing talked yet
  CHECK(client.describe_backends().find("addresses: each fetched from the pmix launcher") != std::string::npos);
  ring_round(client, client.context(0));
  const std::uint32_t neighbours = client.size() > 2 ? 2 : client.size() - 1;
  CHECK(client.peers_joined() == neighbours);
  INFO(client.describe_backends());
  CHECK(client.describe_backends().find(std::to_string(neighbours) + " of " + std::to_string(client.size() - 1) +
                                        " peer task(s) learnt so far") != std::string::npos);
}

TEST_CASE("AMI_ADDRESSES=start learns every address at creation, and the ring still runs") {
  ami::Config config = ami::Config::from_environment();
  REQUIRE(config.set("AMI_ADDRESSES", "start").ok());
  ami::Client client(ami::ClientOptions{.name = "start", .contexts = 1, .config = config});
  CHECK_FALSE(client.addresses_on_demand());
  CHECK(client.peers_joined() == client.size() - 1);
  ring_round(client, client.context(0));
  CHECK(client.peers_joined() == client.size() - 1);
}

TEST_CASE("on first use, a peer with another number of contexts is refused when first used, by name") {
  ami::Client& first = *the_client;
  if (first.size() < 2 || !first.addresses_on_demand()) return;
  // Rank 0 has one context, the others two: at start this would fail the
  // creation on every rank; on first use, the lanes between rank 0 and the
  // rest fail when first used, with unreachable.
  const std::uint16_t contexts = first.task() == 0 ? 1 : 2;
  ami::Client client(ami::ClientOptions{.name = "uneven", .contexts = contexts});
  ami::Context& c = client.context(0);
  const std::uint32_t me = client.task();
  const std::uint32_t word = me;
  const ami::SendParams to_zero{.dest = {0, 0}, .dispatch = kDispatch, .header = {},
                                .payload = std::as_bytes(std::span(&word, 1))};
  if (me != 0) {
    const ami::Status st = c.send(to_zero);
    CHECK(st.code() == ami::StatusCode::unreachable);
  } else {
    ami::SendParams to_one = to_zero;
    to_one.dest = {1, 0};
    CHECK(c.send(to_one).code() == ami::StatusCode::unreachable);
  }
  CHECK(client.peers_joined() == 0);
  std::string why;
  CHECK_MESSAGE(meet_everyone(c, why), why);
}

int main(int argc, char** argv) {
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a.starts_with("--ranks=")) expected_ranks = static_cast<std::uint32_t>(std::atoi(argv[i] + 8));
    else args.push_back(argv[i]);
  }
  if (std::getenv("PMIX_NAMESPACE") == nullptr || std::getenv("PMIX_RANK") == nullptr) {
    std::printf("SKIPPED: not started by a PMIx launcher (run it under mpirun, as tests/mpi/mpirun.sh does)\n");
    return 77;
  }
  const pmix_status_t rc = PMIx_Init(&pmix_self, nullptr, 0);
  if (rc != PMIX_SUCCESS) {
    std::fprintf(stderr, "test_mpirun: PMIx_Init: %s\n", PMIx_Error_string(rc));
    return 1;
  }
  int failed = 1;
  std::size_t fds = 0;
  try {
    // A first Client made and dropped: librdmacm keeps the device it first
    // used open for the process's life (two descriptors), which is not a
    // Client's to close. Every descriptor a Client opens after that must be
    // closed by its end.
    { ami::Client warm_up(ami::ClientOptions{.name = "warm_up", .contexts = 1}); }
    fds = open_fds();  // the test's own PMIx session is open already
    ami::Client client(ami::ClientOptions{.name = "test_mpirun", .contexts = 1});
    the_client = &client;
    doctest::Context context;
    context.setOption("no-colors", true);  // the launcher forwards output through a pseudo-terminal
    context.applyCommandLine(static_cast<int>(args.size()), args.data());
    failed = context.run();
    the_client = nullptr;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "test_mpirun: rank %u: %s\n", pmix_self.rank, e.what());
  }
  if (failed == 0 && open_fds() != fds) {
    std::fprintf(stderr, "test_mpirun: rank %u: %zu file descriptors open before the Client, %zu after\n",
                 pmix_self.rank, fds, open_fds());
    failed = 1;
  }
  (void)PMIx_Finalize(nullptr, 0);
  return failed != 0 ? 1 : 0;
}
