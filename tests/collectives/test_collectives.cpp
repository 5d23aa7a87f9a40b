// Collectives on active messages (docs/DESIGN.md, method 5): barrier, broadcast,
// reduce, allreduce and allgather in jobs of real processes, every result
// checked against a serial computation of the same rank-dependent inputs.
//
// First the pieces that need no job (topologies, members, kernels, the
// header, the argument checks); then jobs of 1, 2, 3, 4, 5 and 8 processes on shm
// running every collective with every type and operator; back-to-back
// barriers with slow ranks (fast ranks are in the next barrier before the
// slow ones leave the last); collectives in flight on two geometries at
// once; large data (1 MiB) that goes by the rendezvous and arrives before
// its call; a stale sequence number.
//
// Built once, run on each backend AMI_TEST_BACKEND names
// (backend_under_test.hpp): shm, the default, with every job size and the
// cases that need no job; ofi at 2, 3 and 4 processes; verbs at 2, in the
// soft-RoCE VM.
#include <doctest/doctest.h>

#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "ami/ami.hpp"
#include "backend_under_test.hpp"
#include "jobs.hpp"
#include "combine.hpp"
#include "members.hpp"
#include "topology.hpp"
#include "wire.hpp"

using namespace ami;
using namespace test;

namespace {

constexpr std::uint16_t kDispatch = 40;

const std::vector<std::uint32_t>& job_sizes() {
  static const std::vector<std::uint32_t> sizes =
      test::backend_under_test().name == "verbs" ? std::vector<std::uint32_t>{2}
      : test::backend_under_test().is_default()  ? std::vector<std::uint32_t>{1, 2, 3, 4, 5, 8}
                                                 : std::vector<std::uint32_t>{2, 3, 4};
  return sizes;
}

Config job_config() {
  Config c;
  test::backend_under_test().configure(c);
  return c;
}

constexpr DataType kTypes[] = {DataType::int32, DataType::int64, DataType::uint64, DataType::float32,
                               DataType::float64};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min,
                             ReduceOp::max, ReduceOp::band, ReduceOp::bor};

// ---- inputs and their serial reduction ----

template <typename F>
void with_type(DataType t, F&& f) {
  switch (t) {
    case DataType::int32: f(std::int32_t{}); break;
    case DataType::int64: f(std::int64_t{}); break;
    case DataType::uint64: f(std::uint64_t{}); break;
    case DataType::float32: f(float{}); break;
    case DataType::float64: f(double{}); break;
  }
}

// Small integers (exact in floating point, so any order of combining gives
// the same result); products of at most 8 of -1, 1, 2.
template <typename T>
T input(ReduceOp op, std::uint32_t rank, std::size_t i) {
  const long long signed_shift = std::is_unsigned_v<T> ? 0 : 1;
  switch (op) {
    case ReduceOp::sum: return static_cast<T>(static_cast<long long>((rank * 7 + i * 3) % 13) - 6 * signed_shift);
    case ReduceOp::prod: {
      const std::size_t k = (rank + i) % 3;
      return static_cast<T>(k == 0 ? (signed_shift != 0 ? -1 : 1) : static_cast<long long>(k));
    }
    case ReduceOp::min:
    case ReduceOp::max:
      return static_cast<T>(static_cast<long long>((rank * 31 + i * 17) % 101) - 50 * signed_shift);
    case ReduceOp::band:
    case ReduceOp::bor:
      if constexpr (std::is_integral_v<T>) {
        const std::uint64_t x = (0x9E3779B97F4A7C15ull * (rank + 1)) ^ (i * 0xBF58476D1CE4E5B9ull);
        return static_cast<T>(x >> (i % 17));
      }
      return T{};
  }
  return T{};
}

template <typename T>
T apply(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::sum: return static_cast<T>(a + b);
    case ReduceOp::prod: return static_cast<T>(a * b);
    case ReduceOp::min: return std::min(a, b);
    case ReduceOp::max: return std::max(a, b);
    case ReduceOp::band:
      if constexpr (std::is_integral_v<T>) return a & b;
      return a;
    case ReduceOp::bor:
      if constexpr (std::is_integral_v<T>) return a | b;
      return a;
  }
  return a;
}

template <typename T>
T expected(ReduceOp op, std::uint32_t n, std::size_t i) {
  T acc = input<T>(op, 0, i);
  for (std::uint32_t r = 1; r < n; ++r) acc = apply(op, acc, input<T>(op, r, i));
  return acc;
}

std::vector<std::byte> inputs(DataType t, ReduceOp op, std::uint32_t rank, std::size_t count) {
  std::vector<std::byte> v(count * size_of(t));
  with_type(t, [&](auto zero) {
    using T = decltype(zero);
    for (std::size_t i = 0; i < count; ++i) {
      const T x = input<T>(op, rank, i);
      std::memcpy(v.data() + i * sizeof(T), &x, sizeof(T));
    }
  });
  return v;
}

// The first element that differs from the serial result, or -1.
long long first_wrong(DataType t, ReduceOp op, std::uint32_t n, const std::byte* got, std::size_t count) {
  long long bad = -1;
  with_type(t, [&](auto zero) {
    using T = decltype(zero);
    for (std::size_t i = 0; i < count && bad < 0; ++i) {
      T x;
      std::memcpy(&x, got + i * sizeof(T), sizeof(T));
      if (!(x == expected<T>(op, n, i))) bad = static_cast<long long>(i);
    }
  });
  return bad;
}

std::uint8_t pattern(std::uint32_t seed, std::size_t i) {
  return static_cast<std::uint8_t>((i * 131 + seed * 29 + (i >> 9)) & 0xFF);
}

// ---- driving collectives from a rank's script ----

struct Done {
  bool fired = false;
  Status status;
  Callback callback() {
    return {+[](void* p, Status s) {
      auto* d = static_cast<Done*>(p);
      d->fired = true;
      d->status = s;
    }, this};
  }
};

// Advances until arrived() holds (yielding when idle: jobs larger than
// the host's cores share them) or 30 s pass: how a rank waits for its
// collectives to end, or for a peer's message to be here before its own
// call, by what the Collectives counted, not by how long it slept.
template <typename Arrived>
bool advance_until(Context& c, Arrived arrived) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!arrived()) {
    if (c.advance() == 0) sched_yield();
    if (std::chrono::steady_clock::now() > end) return false;
  }
  return true;
}

// Advances until every done fired or 30 s pass; true if all succeeded.
bool wait(Context& c, std::initializer_list<const Done*> dones) {
  if (!advance_until(c, [&] { return std::ranges::all_of(dones, [](const Done* d) { return d->fired; }); }))
    return false;
  for (const Done* d : dones)
    if (!d->status.ok()) {
      std::fprintf(stderr, "collective failed: %s\n", to_string(d->status).c_str());
      return false;
    }
  return true;
}

int report(std::uint32_t rank, const std::string& what, int code) {
  std::fprintf(stderr, "rank %u: %s\n", rank, what.c_str());
  return code;
}

// One collective, waited for; false (with a line on stderr) when it failed.
bool run(Context& c, Status posted, Done& d, const char* what) {
  if (!posted.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, to_string(posted).c_str());
    return false;
  }
  if (!wait(c, {&d})) {
    std::fprintf(stderr, "%s: did not complete\n", what);
    return false;
  }
  return true;
}

// Before a rank exits: a barrier (its messages want no answer), so no
// peer still waits for this rank's acknowledgement of a large message (a
// peer that exits fails what is pending to it), then a little more
// progress for the last acknowledgements.
bool farewell(Context& c, Geometry& w) {
  Done d;
  if (!run(c, w.barrier(d.callback()), d, "barrier")) return false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(10);
  while (std::chrono::steady_clock::now() < until) (void)c.advance();
  return true;
}

std::string name(DataType t, ReduceOp op, std::size_t count) {
  return std::string(to_string(t)) + "/" + std::string(to_string(op)) + " x" + std::to_string(count);
}

int check_broadcasts(Context& c, Geometry& g, const std::vector<std::size_t>& sizes) {
  for (std::uint32_t root = 0; root < g.size(); ++root)
    for (std::size_t bytes : sizes) {
      const auto seed = static_cast<std::uint32_t>(root * 1000 + bytes % 997);
      std::vector<std::uint8_t> buf(bytes, 0xEE);
      if (g.rank() == root)
        for (std::size_t i = 0; i < bytes; ++i) buf[i] = pattern(seed, i);
      Done d;
      if (!run(c, g.broadcast(root, buf.data(), bytes, d.callback()), d, "broadcast")) return 10;
      for (std::size_t i = 0; i < bytes; ++i)
        if (buf[i] != pattern(seed, i))
          return report(g.rank(), "broadcast from " + std::to_string(root) + " of " + std::to_string(bytes) +
                                      " B: byte " + std::to_string(i) + " is wrong",
                        11);
    }
  return 0;
}

// reduce (root rotating) and allreduce of every type with every operator.
int check_reductions(Context& c, Geometry& g, const std::vector<std::size_t>& counts) {
  const std::uint32_t n = g.size(), me = g.rank();
  int combo = 0;
  for (DataType t : kTypes)
    for (ReduceOp op : kOps) {
      if (!coll::allowed(t, op)) continue;
      for (std::size_t count : counts) {
        const std::vector<std::byte> send = inputs(t, op, me, count);
        std::vector<std::byte> recv(send.size(), std::byte{0xEE});
        const std::uint32_t root = static_cast<std::uint32_t>(combo++) % n;
        Done d;
        if (!run(c, g.reduce(root, send.data(), recv.data(), count, t, op, d.callback()), d, "reduce")) return 20;
        if (me == root)
          if (long long i = first_wrong(t, op, n, recv.data(), count); i >= 0)
            return report(me, "reduce " + name(t, op, count) + ": element " + std::to_string(i) + " is wrong", 21);
        std::fill(recv.begin(), recv.end(), std::byte{0xEE});
        Done a;
        if (!run(c, g.allreduce(send.data(), recv.data(), count, t, op, a.callback()), a, "allreduce")) return 22;
        if (long long i = first_wrong(t, op, n, recv.data(), count); i >= 0)
          return report(me, "allreduce " + name(t, op, count) + ": element " + std::to_string(i) + " is wrong", 23);
      }
    }
  return 0;
}

int check_allgathers(Context& c, Geometry& g, const std::vector<std::size_t>& sizes) {
  const std::uint32_t n = g.size(), me = g.rank();
  for (std::size_t bytes : sizes) {
    std::vector<std::uint8_t> send(bytes);
    for (std::size_t i = 0; i < bytes; ++i) send[i] = pattern(me + 7, i);
    std::vector<std::uint8_t> recv(bytes * n, 0xEE);
    Done d;
    if (!run(c, g.allgather(send.data(), bytes, recv.data(), d.callback()), d, "allgather")) return 30;
    for (std::uint32_t r = 0; r < n; ++r)
      for (std::size_t i = 0; i < bytes; ++i)
        if (recv[r * bytes + i] != pattern(r + 7, i))
          return report(me, "allgather of " + std::to_string(bytes) + " B: block " + std::to_string(r) + " is wrong",
                        31);
  }
  return 0;
}

// Every collective, every type and operator, small to large.
int matrix(Client& client) {
  Context& c = client.context(0);
  Collectives coll(c, kDispatch);
  Geometry& w = coll.world();
  for (int i = 0; i < 3; ++i) {
    Done d;
    if (!run(c, w.barrier(d.callback()), d, "barrier")) return 1;
  }
  if (int rc = check_broadcasts(c, w, {0, 1, 100, 5000, 70000}); rc != 0) return rc;
  // 0, 1 and 7 by recursive doubling in one packet, 300 in several,
  // 20000 (80 or 160 KB) by the ring.
  if (int rc = check_reductions(c, w, {0, 1, 7, 300, 20000}); rc != 0) return rc;
  if (int rc = check_allgathers(c, w, {0, 8, 1000, 40000}); rc != 0) return rc;
  if (!farewell(c, w)) return 2;
  const CollectiveStats& s = coll.stats();
  if (s.stale != 0 || s.malformed != 0) return report(w.rank(), "stale or malformed messages counted", 3);
  return 0;
}

// 1 MiB: every message goes by the rendezvous, straight into place.
int large(Client& client) {
  Context& c = client.context(0);
  Collectives coll(c, kDispatch);
  Geometry& w = coll.world();
  constexpr std::size_t kMiB = 1 << 20;
  if (int rc = check_broadcasts(c, w, {kMiB}); rc != 0) return rc;
  for (DataType t : {DataType::float64, DataType::int32}) {
    const ReduceOp op = t == DataType::float64 ? ReduceOp::sum : ReduceOp::max;
    const std::size_t count = kMiB / size_of(t);
    const std::vector<std::byte> send = inputs(t, op, w.rank(), count);
    std::vector<std::byte> recv(kMiB);
    Done a;
    if (!run(c, w.allreduce(send.data(), recv.data(), count, t, op, a.callback()), a, "allreduce")) return 40;
    if (first_wrong(t, op, w.size(), recv.data(), count) >= 0) return report(w.rank(), "1 MiB allreduce wrong", 41);
    std::vector<std::byte> in_place = send;  // send == recv
    Done b;
    if (!run(c, w.allreduce(in_place.data(), in_place.data(), count, t, op, b.callback()), b, "allreduce")) return 42;
    if (first_wrong(t, op, w.size(), in_place.data(), count) >= 0)
      return report(w.rank(), "1 MiB allreduce in place wrong", 43);
    Done r;
    std::fill(recv.begin(), recv.end(), std::byte{0});
    if (!run(c, w.reduce(0, send.data(), recv.data(), count, t, op, r.callback()), r, "reduce")) return 44;
    if (w.rank() == 0 && first_wrong(t, op, w.size(), recv.data(), count) >= 0)
      return report(w.rank(), "1 MiB reduce wrong", 45);
  }
  if (int rc = check_allgathers(c, w, {kMiB}); rc != 0) return rc;
  return farewell(c, w) ? 0 : 46;
}

std::vector<Script> all(std::uint32_t n, const Script& s) { return std::vector<Script>(n, s); }

// Runs script at every rank of a job of n; true when every rank exited 0
// (the exit codes are in the failure message otherwise).
void check_job(std::uint32_t n, const Script& script, int seconds) {
  const std::vector<int> codes = run_job(n, job_config(), all(n, script), std::chrono::seconds(seconds));
  std::string text;
  for (int c : codes) text += std::to_string(c) + " ";
  CHECK_MESSAGE(codes == std::vector<int>(n, 0), "exit codes: " << text);
}

}  // namespace

// ---- the cases that need no job: once, in the default run ----

TEST_CASE("topologies: every rank is reached once, partners agree" * test::any_backend()) {
  for (std::uint32_t n = 1; n <= 40; ++n) {
    CAPTURE(n);
    for (std::uint32_t root = 0; root < n; ++root) {
      coll::topology::Tree t{n, root};
      std::vector<int> parents(n, 0);
      for (std::uint32_t r = 0; r < n; ++r) {
        const std::uint32_t kids = t.child_count(r);
        for (std::uint32_t i = 0; i < kids; ++i) {
          const std::uint32_t k = t.child(r, i);
          REQUIRE(k < n);
          CHECK(t.parent(k) == r);
          CHECK(t.child_index(r, k) == static_cast<int>(i));
          ++parents[k];
          if (i > 0) CHECK(t.relative(t.child(r, i - 1)) > t.relative(k));  // largest subtree first
        }
      }
      for (std::uint32_t r = 0; r < n; ++r) CHECK(parents[r] == (r == root ? 0 : 1));
      CHECK(t.child_index(0, root) == -1);
    }
    coll::topology::Doubling d{n};
    for (std::uint32_t r = 0; r < n; ++r) {
      if (d.extra(r)) continue;
      CHECK(d.real_rank(d.virtual_rank(r)) == r);
      for (std::uint32_t k = 1; k <= d.steps(); ++k) CHECK(d.partner(d.partner(r, k), k) == r);
    }
    if (std::has_single_bit(n)) {  // recursive halving: partners hold the same blocks and trade halves
      const coll::topology::Halving h{n};
      std::vector<int> owner(n, 0);
      for (std::uint32_t r = 0; r < n; ++r) {
        for (std::uint32_t k = 0; k < h.steps(); ++k) {
          const std::uint32_t p = h.partner(r, k);
          CHECK(h.partner(p, k) == r);
          CHECK(h.held(p, k).lo == h.held(r, k).lo);
          CHECK(h.held(p, k).hi == h.held(r, k).hi);
          CHECK(h.kept(p, k).lo == h.given(r, k).lo);
          CHECK(h.kept(p, k).hi == h.given(r, k).hi);
          CHECK(h.kept(r, k).hi - h.kept(r, k).lo == (n >> (k + 1)));
          CHECK(h.held(r, k + 1).lo == h.kept(r, k).lo);
        }
        const coll::topology::Halving::Blocks last = h.held(r, h.steps());
        REQUIRE(last.hi == last.lo + 1);
        ++owner[last.lo];
      }
      CHECK(owner == std::vector<int>(n, 1));  // each block ends at one rank
    }
    const std::uint32_t rounds = coll::topology::rounds(n);
    CHECK((n <= 1 || (1u << rounds) >= n));
    for (std::uint32_t r = 0; r < n; ++r)
      for (std::uint32_t k = 0; k < rounds; ++k)
        CHECK(coll::topology::dissemination_from(coll::topology::dissemination_to(r, n, k), n, k) == r);
  }
}

TEST_CASE("members: the world of 16,384 tasks keeps nothing; another geometry keeps its members, not the job" * test::any_backend()) {
  constexpr std::uint32_t kJob = 16384;
  const coll::Members world = coll::Members::first(kJob);
  CHECK(world.bytes() == 0);
  CHECK(world.size() == kJob);
  for (std::uint32_t t : {0u, 1u, 9000u, kJob - 1}) {
    CHECK(world.rank(t) == t);
    CHECK(world.task(t) == t);
  }
  CHECK(world.rank(kJob) == coll::Members::kNotMember);
  // A list that is the world's order keeps nothing either.
  CHECK(coll::Members(std::vector<std::uint32_t>{0, 1, 2}).bytes() == 0);
  // Three tasks of the job, in the order the caller gave.
  const coll::Members three(std::vector<std::uint32_t>{16000, 7, 9000});
  CHECK(three.size() == 3);
  CHECK(three.bytes() <= 3 * (sizeof(std::uint32_t) + 2 * sizeof(std::uint32_t)));
  CHECK(three.task(0) == 16000);
  CHECK(three.task(1) == 7);
  CHECK(three.task(2) == 9000);
  CHECK(three.rank(16000) == 0);
  CHECK(three.rank(7) == 1);
  CHECK(three.rank(9000) == 2);
  for (std::uint32_t t : {0u, 6u, 8u, 8999u, 9001u, 16001u, kJob - 1, kJob})
    CHECK(three.rank(t) == coll::Members::kNotMember);
  // Every task of the job, backwards: each rank found again.
  std::vector<std::uint32_t> reversed(kJob);
  for (std::uint32_t r = 0; r < kJob; ++r) reversed[r] = kJob - 1 - r;
  const coll::Members backwards(reversed);
  bool agree = true;
  for (std::uint32_t r = 0; r < kJob; ++r) agree = agree && backwards.rank(backwards.task(r)) == r;
  CHECK(agree);
}

TEST_CASE("kernels: every type and operator; pieces that split elements combine the same" * test::any_backend()) {
  for (DataType t : kTypes)
    for (ReduceOp op : kOps) {
      CAPTURE(to_string(t));
      CAPTURE(to_string(op));
      if (!coll::allowed(t, op)) {
        CHECK((t == DataType::float32 || t == DataType::float64));
        CHECK((op == ReduceOp::band || op == ReduceOp::bor));
        continue;
      }
      const std::size_t count = 301, bytes = count * size_of(t);
      const std::vector<std::byte> a = inputs(t, op, 0, count), b = inputs(t, op, 1, count);
      std::vector<std::byte> out(bytes);
      coll::combine(t, op, out.data(), a.data(), b.data(), count);
      CHECK(first_wrong(t, op, 2, out.data(), count) == -1);
      // In place, both ways, and from an unaligned source.
      std::vector<std::byte> x = a;
      coll::combine(t, op, x.data(), x.data(), b.data(), count);
      CHECK(x == out);
      x = b;
      coll::combine(t, op, x.data(), a.data(), x.data(), count);
      CHECK(x == out);
      std::vector<std::byte> odd(bytes + 3);
      std::memcpy(odd.data() + 3, b.data(), bytes);
      coll::combine(t, op, x.data(), a.data(), odd.data() + 3, count);
      CHECK(x == out);
      // Pieces of 1, 3, 5, 13 and 250 bytes.
      for (std::size_t piece : {1, 3, 5, 13, 250}) {
        std::vector<std::byte> y(bytes);
        coll::PieceCombiner pc;
        pc.start(t, op, y.data(), a.data());
        for (std::size_t off = 0; off < bytes; off += piece)
          pc.piece(off, std::span(b).subspan(off, std::min(piece, bytes - off)));
        CHECK(pc.consumed() == bytes);
        CHECK(y == out);
      }
    }
}

TEST_CASE("the header: 16 bytes, decoded only when whole, with a known magic, kind, type and operator" * test::any_backend()) {
  const coll::Header h{.kind = coll::Kind::allreduce, .type = DataType::float64, .op = ReduceOp::max, .ring = true,
                       .step = 3, .geometry = 7, .seq = 9, .root = 2};
  const coll::HeaderBytes b = coll::encode(h);
  coll::Header out;
  REQUIRE(coll::decode(b, out) == coll::HeaderError::none);
  CHECK(out.kind == coll::Kind::allreduce);
  CHECK(out.type == DataType::float64);
  CHECK(out.op == ReduceOp::max);
  CHECK(out.ring);
  CHECK(out.step == 3);
  CHECK(out.geometry == 7);
  CHECK(out.seq == 9);
  CHECK(out.root == 2);
  CHECK(coll::decode(std::span(b).first(15), out) == coll::HeaderError::truncated);
  coll::HeaderBytes bad = b;
  bad[0] = std::byte{0x13};
  CHECK(coll::decode(bad, out) == coll::HeaderError::bad_magic);
  bad[0] = std::byte{0xC5};
  CHECK(coll::decode(bad, out) == coll::HeaderError::bad_kind);
  bad = b;
  bad[1] = std::byte{0x07};
  CHECK(coll::decode(bad, out) == coll::HeaderError::bad_type);
  bad[1] = std::byte{6 << 3};
  CHECK(coll::decode(bad, out) == coll::HeaderError::bad_op);
  bad[1] = std::byte{0x80};
  CHECK(coll::decode(bad, out) == coll::HeaderError::bad_op);
  // Sequence numbers wrap: compared as serial numbers.
  CHECK(coll::seq_diff(1, 0xFFFFFFFFu) == 2);
  CHECK(coll::seq_diff(0xFFFFFFFFu, 1) < 0);
}

TEST_CASE("a job of one: arguments checked by name, done never inside the call, one of a kind in flight" * test::any_backend()) {
  Client client(ClientOptions{.name = "test", .contexts = 1, .job = {}, .config = Config{}});
  Context& c = client.context(0);
  Collectives coll(c, kDispatch);
  Geometry& w = coll.world();
  CHECK(w.size() == 1);
  CHECK(w.rank() == 0);
  double x = 1.5, y = 0;
  Done d;
  Status s = w.allreduce(&x, &y, 1, DataType::float64, ReduceOp::band, d.callback());
  CHECK(s == StatusCode::invalid_argument);
  CHECK(std::string(s.what()) == "allreduce: band and bor take integer types only, not float32 or float64");
  s = w.reduce(0, &x, &y, 1, DataType::float32, ReduceOp::bor, d.callback());
  CHECK(std::string(s.what()) == "reduce: band and bor take integer types only, not float32 or float64");
  CHECK(w.broadcast(1, &x, 8, d.callback()) == StatusCode::invalid_argument);
  CHECK(w.reduce(0, &x, nullptr, 1, DataType::float64, ReduceOp::sum, d.callback()) == StatusCode::invalid_argument);
  CHECK(w.allreduce(&x, reinterpret_cast<std::byte*>(&x) + 1, 1, DataType::float64, ReduceOp::sum, d.callback()) ==
        StatusCode::invalid_argument);
  CHECK(w.allgather(nullptr, 8, &y, d.callback()) == StatusCode::invalid_argument);
  CHECK(!d.fired);

  REQUIRE(w.allreduce(&x, &y, 1, DataType::float64, ReduceOp::sum, d.callback()).ok());
  CHECK(!d.fired);  // complete at once, but done runs in advance()
  Done again;
  s = w.allreduce(&x, &y, 1, DataType::float64, ReduceOp::sum, again.callback());
  CHECK(s == StatusCode::no_resource);
  CHECK(std::string(s.what()) == "allreduce: an allreduce is in flight on this geometry already");
  Done b;
  REQUIRE(w.barrier(b.callback()).ok());  // another kind may go alongside
  (void)c.advance();
  CHECK(d.fired);
  CHECK(b.fired);
  CHECK(y == 1.5);

  Geometry* g = nullptr;
  const std::uint32_t other[] = {1};
  const std::uint32_t twice[] = {0, 0};
  const std::uint32_t mine[] = {0};
  CHECK(std::string(coll.create_geometry(0, mine, g).what()) == "create_geometry: the id is taken (0 is the world's)");
  CHECK(std::string(coll.create_geometry(3, other, g).what()) == "create_geometry: a task is out of the job's range");
  CHECK(std::string(coll.create_geometry(3, twice, g).what()) == "create_geometry: a task is listed twice");
  REQUIRE(coll.create_geometry(3, mine, g).ok());
  std::int64_t v[2] = {5, 6}, got[2] = {};
  Done e;
  REQUIRE(g->allgather(v, 16, got, e.callback()).ok());
  REQUIRE(wait(c, {&e}));
  CHECK(got[1] == 6);
}


TEST_CASE("every collective, type and operator at 1, 2, 3, 4, 5 and 8 processes, checked against a serial result") {
  for (std::uint32_t n : job_sizes()) {
    CAPTURE(n);
    check_job(n, matrix, 90);
  }
}

TEST_CASE("1 MiB broadcast, reduce, allreduce (in place too) and allgather go by the rendezvous into place") {
  for (std::uint32_t n : job_sizes()) {
    if (n == 1 || n == 8) continue;  // (8 oversubscribed is slow and adds nothing here)
    CAPTURE(n);
    check_job(n, large, 90);
  }
}

namespace {

// A shared page: each rank's entry and exit time of every barrier.
struct Times {
  static constexpr int kBarriers = 60;
  std::int64_t enter[kBarriers][8];
  std::int64_t leave[kBarriers][8];
  std::uint64_t early[8];  // each rank's early arrivals
};

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Back to back; the slow rank of each barrier sleeps before it advances,
// so the others are in the next barrier before it has left this one.
int barriers(Client& client, Times* times) {
  Context& c = client.context(0);
  Collectives coll(c, kDispatch);
  Geometry& w = coll.world();
  for (int k = 0; k < Times::kBarriers; ++k) {
    times->enter[k][w.rank()] = now_ns();
    Done d;
    if (!w.barrier(d.callback()).ok()) return 1;
    if (w.rank() == static_cast<std::uint32_t>(k) % w.size())
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (!wait(c, {&d})) return 2;
    times->leave[k][w.rank()] = now_ns();
  }
  if (!farewell(c, w)) return 3;
  const CollectiveStats& s = coll.stats();
  std::printf("rank %u: %llu barrier messages came for the next barrier early\n", w.rank(),
              static_cast<unsigned long long>(s.early_arrivals));
  if (s.stale != 0 || s.malformed != 0) return 4;
  times->early[w.rank()] = s.early_arrivals;  // some rank must have seen them (checked by the job)
  return 0;
}

}  // namespace

TEST_CASE("back-to-back barriers with slow ranks: nobody leaves before everybody entered; early ones are kept") {
  for (std::uint32_t n : job_sizes()) {
    if (n == 1) continue;
    CAPTURE(n);
    void* page = mmap(nullptr, sizeof(Times), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(page != MAP_FAILED);
    auto* times = new (page) Times{};
    const Script s = [times](Client& client) { return barriers(client, times); };
    check_job(n, s, 60);
    for (int k = 0; k < Times::kBarriers; ++k) {
      std::int64_t last_in = 0, first_out = INT64_MAX;
      for (std::uint32_t r = 0; r < n; ++r) {
        last_in = std::max(last_in, times->enter[k][r]);
        first_out = std::min(first_out, times->leave[k][r]);
      }
      CAPTURE(k);
      CHECK(last_in <= first_out);
    }
    std::uint64_t early = 0;
    for (std::uint32_t r = 0; r < n; ++r) early += times->early[r];
    CHECK(early > 0);  // the case was exercised: messages for the next barrier came early somewhere
    munmap(page, sizeof(Times));
  }
}

namespace {

// The world and the even ranks at once: an allreduce, a broadcast and a
// barrier in flight on both; rank 2 creates the even geometry late, so its
// members' messages arrive before it exists there.
int two_geometries(Client& client) {
  Context& c = client.context(0);
  Collectives coll(c, kDispatch);
  Geometry& w = coll.world();
  const std::uint32_t n = w.size(), me = w.rank();
  std::vector<std::uint32_t> evens;
  for (std::uint32_t t = 0; t < n; t += 2) evens.push_back(t);
  const bool even = me % 2 == 0;
  Geometry* g_even = nullptr;
  if (even) {
    if (me == 2) std::this_thread::sleep_for(std::chrono::milliseconds(30));
    if (!coll.create_geometry(7, evens, g_even).ok()) return 1;
  }
  for (int round = 0; round < 20; ++round) {
    const std::size_t count = round % 2 == 0 ? 5 : 30000;
    const std::vector<std::byte> send = inputs(DataType::int64, ReduceOp::sum, me, count);
    std::vector<std::byte> world_sum(send.size()), even_max(count * 8);
    const std::vector<std::byte> even_in = inputs(DataType::int64, ReduceOp::max, me / 2, count);
    std::vector<std::uint8_t> world_bcast(3000), even_bcast(3000);
    if (me == 0)
      for (std::size_t i = 0; i < 3000; ++i) world_bcast[i] = pattern(round, i);
    if (me == 0)
      for (std::size_t i = 0; i < 3000; ++i) even_bcast[i] = pattern(round + 100, i);
    Done d[6];
    if (!w.allreduce(send.data(), world_sum.data(), count, DataType::int64, ReduceOp::sum, d[0].callback()).ok())
      return 2;
    if (!w.broadcast(0, world_bcast.data(), 3000, d[1].callback()).ok()) return 3;
    if (!w.barrier(d[2].callback()).ok()) return 4;
    if (even) {
      if (!g_even->allreduce(even_in.data(), even_max.data(), count, DataType::int64, ReduceOp::max, d[3].callback())
               .ok())
        return 5;
      if (!g_even->broadcast(0, even_bcast.data(), 3000, d[4].callback()).ok()) return 6;
      if (!g_even->barrier(d[5].callback()).ok()) return 7;
    } else {
      for (int i = 3; i < 6; ++i) d[i].fired = true;
    }
    if (!wait(c, {&d[0], &d[1], &d[2], &d[3], &d[4], &d[5]})) return 8;
    if (first_wrong(DataType::int64, ReduceOp::sum, n, world_sum.data(), count) >= 0) return 9;
    if (even && first_wrong(DataType::int64, ReduceOp::max, g_even->size(), even_max.data(), count) >= 0) return 10;
    for (std::size_t i = 0; i < 3000; ++i) {
      if (world_bcast[i] != pattern(round, i)) return 11;
      if (even && even_bcast[i] != pattern(round + 100, i)) return 12;
    }
  }
  if (!farewell(c, w)) return 13;
  const CollectiveStats& s = coll.stats();
  if (s.stale != 0 || s.malformed != 0) return 14;
  return 0;
}

}  // namespace

TEST_CASE("collectives in flight on two geometries at once: the world and the even ranks") {
  for (std::uint32_t n : job_sizes()) {
    if (n < 2) continue;
    CAPTURE(n);
    check_job(n, two_geometries, 60);
  }
}

namespace {

// Rank 0 broadcasts and reduces 1 MiB; its children in the broadcast tree
// call only once its broadcast is here: the data waits at its sender
// (deferred), never copied, and comes by the rendezvous into place.
int late_large(Client& client) {
  Context& c = client.context(0);
  Collectives coll(c, kDispatch);
  Geometry& w = coll.world();
  const CollectiveStats& s = coll.stats();
  const bool child_of_root = std::has_single_bit(w.rank());
  constexpr std::size_t kMiB = 1 << 20;
  for (int round = 0; round < 3; ++round) {
    // One broadcast deferred per round so far (later rounds may count a
    // grandchild's reduce contribution too; the first cannot).
    if (child_of_root && !advance_until(c, [&] { return s.early_deferred >= std::uint64_t(round) + 1; }))
      return report(w.rank(), "the root's broadcast was not deferred before the call", 5);
    std::vector<std::uint8_t> buf(kMiB, 0xEE);
    if (w.rank() == 0)
      for (std::size_t i = 0; i < kMiB; ++i) buf[i] = pattern(round, i);
    Done d;
    if (!run(c, w.broadcast(0, buf.data(), kMiB, d.callback()), d, "broadcast")) return 1;
    for (std::size_t i = 0; i < kMiB; ++i)
      if (buf[i] != pattern(round, i)) return 2;
    const std::size_t count = kMiB / 8;
    const std::vector<std::byte> send = inputs(DataType::float64, ReduceOp::sum, w.rank(), count);
    std::vector<std::byte> recv(kMiB);
    Done r;
    if (!run(c, w.reduce(0, send.data(), recv.data(), count, DataType::float64, ReduceOp::sum, r.callback()), r,
             "reduce"))
      return 3;
    if (w.rank() == 0 && first_wrong(DataType::float64, ReduceOp::sum, w.size(), recv.data(), count) >= 0) return 4;
  }
  if (!farewell(c, w)) return 6;
  std::printf("rank %u: %llu early arrivals, %llu deferred\n", w.rank(),
              static_cast<unsigned long long>(s.early_arrivals), static_cast<unsigned long long>(s.early_deferred));
  return 0;
}

}  // namespace

TEST_CASE("large data before its call waits at its sender and comes straight into place") {
  for (std::uint32_t n : job_sizes()) {
    if (n < 2 || n > 5) continue;
    CAPTURE(n);
    check_job(n, late_large, 60);
  }
}

namespace {

// The root calls reduces of 7 and of 128 Ki elements only once every
// child's contribution is here: the small ones wait in one early-arrival
// buffer, combined with one another as they come; the large ones wait at
// their senders, and the first of them is fetched straight into recv.
// (A small broadcast from the root after each reduce holds the children
// back, so every contribution the root counts is for the round it waits
// for: a leaf's reduce is over as soon as it has sent.)
int late_root(Client& client) {
  Context& c = client.context(0);
  Collectives coll(c, kDispatch);
  Geometry& w = coll.world();
  const CollectiveStats& s = coll.stats();
  const std::uint32_t children = coll::topology::Tree{w.size(), 0}.child_count(0);
  std::uint64_t rounds = 0;
  for (std::size_t count : {std::size_t{7}, std::size_t{1} << 17}) {
    for (int round = 0; round < 3; ++round) {
      ++rounds;
      if (w.rank() == 0 && !advance_until(c, [&] { return s.early_arrivals >= rounds * children; }))
        return report(w.rank(), "the children's contributions did not arrive before the call", 5);
      const std::vector<std::byte> send = inputs(DataType::int64, ReduceOp::sum, w.rank(), count);
      std::vector<std::byte> recv(send.size());
      Done d;
      if (!run(c, w.reduce(0, send.data(), recv.data(), count, DataType::int64, ReduceOp::sum, d.callback()), d,
               "reduce"))
        return 1;
      if (w.rank() == 0 && first_wrong(DataType::int64, ReduceOp::sum, w.size(), recv.data(), count) >= 0) return 2;
      std::uint64_t go = w.rank() == 0 ? rounds : 0;
      Done b;
      if (!run(c, w.broadcast(0, &go, sizeof go, b.callback()), b, "broadcast")) return 3;
      if (go != rounds) return report(w.rank(), "the broadcast between the reduces is wrong", 4);
    }
    // (Counted over the whole run: a small contribution is never deferred,
    // and a child's first large one may arrive while the root is still
    // finishing the broadcast that released it.)
    if (w.rank() == 0 && count > 7 && s.early_deferred < 3 * children)
      return report(w.rank(), "large contributions were not deferred", 6);
  }
  if (!farewell(c, w)) return 7;
  std::printf("rank %u: %llu early arrivals, %llu merged, %llu deferred\n", w.rank(),
              static_cast<unsigned long long>(s.early_arrivals), static_cast<unsigned long long>(s.early_merged),
              static_cast<unsigned long long>(s.early_deferred));
  if (w.rank() == 0 && children >= 2 && s.early_merged < 3 * (children - 1))
    return report(w.rank(), "small contributions were not combined before the call", 9);
  return 0;
}

}  // namespace

TEST_CASE("a late root: small contributions are combined with one another before its call, large ones wait") {
  for (std::uint32_t n : job_sizes()) {
    if (n < 2 || n > 5) continue;
    CAPTURE(n);
    check_job(n, late_root, 60);
  }
}

namespace {

// Rank 1 sends a barrier message of an old sequence number (hand-built):
// rank 0 counts it as stale and drops it; the next barrier is unharmed.
int stale(Client& client) {
  Context& c = client.context(0);
  Collectives coll(c, kDispatch);
  Geometry& w = coll.world();
  for (int i = 0; i < 3; ++i) {
    Done d;
    if (!run(c, w.barrier(d.callback()), d, "barrier")) return 1;
  }
  if (w.rank() == 1) {
    const coll::HeaderBytes old = coll::encode({.kind = coll::Kind::barrier, .step = 0, .geometry = 0, .seq = 1});
    if (!c.send({.dest = {0, 0}, .dispatch = kDispatch, .header = old}).ok()) return 2;
    coll::HeaderBytes junk = old;
    junk[0] = std::byte{0x0B};
    if (!c.send({.dest = {0, 0}, .dispatch = kDispatch, .header = junk}).ok()) return 3;
  }
  Done d;
  if (!run(c, w.barrier(d.callback()), d, "barrier")) return 4;
  if (!farewell(c, w)) return 5;
  const CollectiveStats& s = coll.stats();
  if (w.rank() == 0 && (s.stale != 1 || s.malformed != 1)) return 6;
  return 0;
}

}  // namespace

TEST_CASE("a message of an older sequence is an error: counted and dropped") {
  check_job(2, stale, 30);
}

namespace {

// A job of three whose rank 2 is killed after one barrier. Ranks 0 and 1
// are then in a 1 MiB allreduce and a barrier on the world, which cannot
// complete: both end with peer_failed, later calls on the world are
// refused at once, and a geometry of ranks 0 and 1 goes on.
int dying_member(Client& client) {
  Context& c = client.context(0);
  Collectives coll(c, kDispatch);
  Geometry& w = coll.world();
  const std::uint32_t me = w.rank();
  int errors = 0;
  c.set_error_handler({+[](void* p, Endpoint peer, Status) {
    if (peer.task == 2) ++*static_cast<int*>(p);
  }, &errors});
  Geometry* pair = nullptr;
  if (me < 2) {
    const std::uint32_t tasks[] = {0, 1};
    if (!coll.create_geometry(5, tasks, pair).ok()) return 1;
  }
  Done first;
  if (!run(c, w.barrier(first.callback()), first, "barrier")) return 2;
  if (me == 2) {
    // What it sent for the barrier leaves first; then it dies.
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
    while (std::chrono::steady_clock::now() < until) (void)c.advance();
    ::raise(SIGKILL);
  }
  constexpr std::size_t kCount = (std::size_t{1} << 20) / 8;
  const std::vector<std::byte> send = inputs(DataType::int64, ReduceOp::sum, me, kCount);
  std::vector<std::byte> recv(send.size());
  Done reduced, met;
  // Called before or after this task learnt of the death (a loaded host
  // may let its keepalive win): in flight, each ends with peer_failed; after,
  // the call itself refuses with it. Either is the answer.
  const auto started = [](Status st, Done& d) {
    if (st.ok()) return true;
    if (st.code() != StatusCode::peer_failed) return false;
    d.fired = true;
    d.status = st;
    return true;
  };
  if (!started(w.allreduce(send.data(), recv.data(), kCount, DataType::int64, ReduceOp::sum, reduced.callback()),
               reduced))
    return 3;
  if (!started(w.barrier(met.callback()), met)) return 4;
  if (!advance_until(c, [&] { return reduced.fired && met.fired; }))
    return report(me, "the world's collectives never ended", 5);
  if (reduced.status != StatusCode::peer_failed) return report(me, "allreduce: " + to_string(reduced.status), 6);
  if (met.status != StatusCode::peer_failed) return report(me, "barrier: " + to_string(met.status), 7);
  if (errors != 1) return 8;
  std::uint64_t word = 0;
  Done never;
  if (w.broadcast(0, &word, sizeof word, never.callback()) != StatusCode::peer_failed) return 9;
  if (w.barrier(never.callback()) != StatusCode::peer_failed) return 10;
  // The pair is untouched.
  const std::vector<std::byte> mine = inputs(DataType::int64, ReduceOp::sum, me, kCount);
  std::vector<std::byte> sum(mine.size());
  Done pair_sum;
  if (!run(c, pair->allreduce(mine.data(), sum.data(), kCount, DataType::int64, ReduceOp::sum, pair_sum.callback()),
           pair_sum, "allreduce on the pair"))
    return 11;
  if (first_wrong(DataType::int64, ReduceOp::sum, 2, sum.data(), kCount) >= 0) return 12;
  if (!farewell(c, *pair)) return 13;
  for (int i = 0; i < 20; ++i) (void)c.advance();
  return never.fired ? 14 : 0;
}

}  // namespace

TEST_CASE("a member dies: the world's collectives in flight fail, later ones are refused, a geometry without it goes on") {
  Config config = job_config();
  REQUIRE(config.set("AMI_KEEPALIVE_INTERVAL", "200").ok());
  const std::vector<int> codes = run_job(3, config, all(3, dying_member), std::chrono::seconds(90));
  std::string text;
  for (int code : codes) text += std::to_string(code) + " ";
  const std::vector<int> expected{0, 0, -SIGKILL};
  CHECK_MESSAGE(codes == expected, "exit codes: " << text);
}

AMI_TEST_NEEDS_RDMA_PORT_FROM_BACKEND
