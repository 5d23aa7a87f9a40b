// Active messages, PUT and GET through every backend: the whole path (public
// API, engine, device contract, reception queues, remote keys). Each
// TEST_CASE_TEMPLATE runs once per backend pair (pair.hpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <atomic>
#include <functional>
#include <cstring>
#include <numeric>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ami/ami.hpp"
#include "backends.hpp"
#include "pair.hpp"

using namespace ami;

namespace {

ClientOptions options(std::uint16_t contexts, std::uint64_t fifo_depth = 256) {
  ClientOptions o;
  o.name = "test";
  o.contexts = contexts;
  REQUIRE(o.config.set("AMI_FIFO_DEPTH", std::to_string(fifo_depth)).ok());
  return o;
}

Config fifo(std::uint64_t depth) { return test::config_with({{"AMI_FIFO_DEPTH", std::to_string(depth)}}); }

// Compiled once, linked twice (tests/backends/meson.build): test_backends
// runs the pairs of this host, test_backends_verbs those that need an RDMA
// port (the rxe VM), chosen by name ("...<VerbsPair>"). Between them they
// cover every backend in the registry (checked at the end of this file).
#define BACKENDS_HERE test::SelfPair, test::ShmPair, test::OfiTcpPair, test::OfiShmPair
#define BACKENDS_RDMA test::VerbsPair, test::OfiVerbsPair
#define BACKENDS BACKENDS_HERE, BACKENDS_RDMA

// The registry's ids (transport/src/backends.cpp): each backend's entry in keys.
std::uint8_t key_id(std::string_view backend) {
  return backend == "self" ? 0 : backend == "shm" ? 1 : backend == "verbs" ? 2 : 3;
}

// shm's entry of a key: the owner's memfd + 1, 0 for memory only registered.
std::uint32_t shm_fd(const RemoteKey& key) {
  const KeyEntry* e = key.entry(key_id("shm"));
  REQUIRE(e != nullptr);
  REQUIRE(e->length == sizeof(std::uint32_t));
  std::uint32_t fd = 0;
  std::memcpy(&fd, e->bytes.data(), sizeof fd);
  return fd;
}

// The key without the backend's entry.
RemoteKey without_entry(const RemoteKey& key, std::uint8_t backend) {
  RemoteKey out = key;
  out.entry_count = 0;
  out.entries = {};
  for (std::uint8_t i = 0; i < key.entry_count; ++i)
    if (key.entries[i].backend != backend) REQUIRE(out.add_entry(key.entries[i].backend, key.entries[i].value()).ok());
  return out;
}

std::span<const std::byte> bytes_of(const std::vector<std::uint8_t>& v) {
  return std::as_bytes(std::span(v));
}

std::vector<std::uint8_t> pattern(std::size_t n, std::uint8_t seed) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>(seed + i * 7 + (i >> 9));
  return v;
}

// A receiver that takes whole messages into vectors.
struct Sink {
  std::vector<std::vector<std::uint8_t>> headers, payloads;
  std::vector<Endpoint> origins;
  int done = 0;
  std::vector<std::uint8_t> big;  // the last message's payload, however it came

  static void on_done(void* c, Status s) {
    CHECK(s.ok());
    ++static_cast<Sink*>(c)->done;
  }
  static void handler(void* cookie, const Incoming& in, Receive* recv) {
    auto* s = static_cast<Sink*>(cookie);
    auto h = reinterpret_cast<const std::uint8_t*>(in.header.data());
    s->headers.emplace_back(h, h + in.header.size());
    s->origins.push_back(in.origin);
    if (recv == nullptr) {
      auto p = reinterpret_cast<const std::uint8_t*>(in.payload.data());
      s->payloads.emplace_back(p, p + in.payload.size());
      s->big.assign(p, p + in.payload.size());
      ++s->done;
      return;
    }
    s->big.assign(in.total_bytes, 0);
    recv->buffer = s->big.data();
    recv->done = {&Sink::on_done, s};
  }
};

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

// What a context did, for the log of a test that timed out waiting.
std::string progress(const char* name, const Context& c) {
  const ContextStats& s = c.stats();
  std::ostringstream o;
  o << name << ": sent " << s.messages_sent << " msgs/" << s.packets_sent << " pkts/" << s.bytes_sent
    << " B, received " << s.messages_received << "/" << s.packets_received << "/" << s.bytes_received
    << " B, queued " << s.queued << ", puts " << s.puts << ", gets " << s.gets << "; rndv sent "
    << s.rndv_sent << " stopped " << s.rndv_stopped << " decisions " << s.rndv_decisions << " stops "
    << s.rndv_stops_by_mode[0] << "/" << s.rndv_stops_by_mode[1] << "/" << s.rndv_stops_by_mode[2]
    << " get " << s.rndv_get_bytes << " B put " << s.rndv_put_bytes << " B late " << s.rndv_late_bytes
    << " B eager-complete " << s.rndv_eager_complete << "; acks sent " << s.acks_sent << " received "
    << s.acks_received << " (messages " << s.messages_acked << "/" << s.messages_ack_received
    << "), remote-done " << s.remote_done_sent << "/" << s.remote_done_received << ", malformed "
    << s.malformed_packets << ", peers failed " << s.peers_failed;
  return o.str();
}

// A deadline, not a count of rounds: a 64 MiB rendezvous on soft-RoCE in an
// emulated VM takes many more rounds than a small message on self.
void advance_until(Context& a, Context& b, const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!done() && std::chrono::steady_clock::now() < deadline)
    for (int i = 0; i < 64; ++i) {
      (void)a.advance();
      (void)b.advance();
    }
  if (!done()) {
    MESSAGE(progress("a", a));
    MESSAGE(progress("b", b));
  }
  REQUIRE(done());
}

}  // namespace

TEST_CASE_TEMPLATE("small, empty and header-only messages between two contexts", P, BACKENDS) {
  P pair(fifo(256));
  Context &a = pair.a(), &b = pair.b();
  Sink sink;
  REQUIRE(b.set_dispatch(5, {&Sink::handler, &sink}).ok());
  CHECK(a.backend_for(pair.to_b()) == P::kBackend);

  const auto hdr = pattern(12, 1), pay = pattern(100, 2);
  Counter local;
  REQUIRE(a.send({.dest = pair.to_b(), .dispatch = 5, .header = bytes_of(hdr), .payload = bytes_of(pay),
                  .local_done = local.cb()}).ok());
  REQUIRE(a.send({.dest = pair.to_b(), .dispatch = 5}).ok());  // nothing at all
  advance_until(a, b, [&] { return sink.done == 2 && local.calls == 1; });
  CHECK(sink.headers[0] == hdr);
  CHECK(sink.payloads[0] == pay);
  CHECK(sink.headers[1].empty());
  CHECK(sink.payloads[1].empty());
  CHECK(sink.origins[0] == pair.to_a());
  CHECK(local.last.ok());
  CHECK(a.stats().messages_sent == 2);
  CHECK(b.stats().messages_received == 2);
}

TEST_CASE_TEMPLATE("large messages are cut into packets and reassembled, with remote done", P, BACKENDS) {
  P pair(fifo(8));  // a small FIFO: packets wait in the work queue
  Context &a = pair.a(), &b = pair.b();
  Sink sink;
  REQUIRE(b.set_dispatch(1, {&Sink::handler, &sink}).ok());
  for (std::size_t size : {std::size_t{8000}, std::size_t{8192}, std::size_t{16301}, std::size_t{100000},
                           std::size_t{1} << 20, (std::size_t{16} << 20) + 3}) {
    CAPTURE(size);
    const auto pay = pattern(size, static_cast<std::uint8_t>(size));
    // (The largest header too: a long message's first packet holds it, its
    // rendezvous key and data, on the smallest default packets.)
    const auto hdr = pattern(size == std::size_t{1} << 20 ? Context::kMaxHeaderBytes : 40, 9);
    Counter local, remote;
    const int before = sink.done;
    REQUIRE(a.send({.dest = pair.to_b(), .dispatch = 1, .header = bytes_of(hdr), .payload = bytes_of(pay),
                    .local_done = local.cb(), .remote_done = remote.cb()}).ok());
    advance_until(a, b, [&] { return remote.calls == 1 && local.calls == 1; });
    CHECK(sink.done == before + 1);
    CHECK(sink.big == pay);
    CHECK(sink.headers.back() == hdr);
    CHECK(remote.last.ok());
  }
  CHECK(a.stats().queued > 0);
  CHECK(b.stats().malformed_packets == 0);
}

TEST_CASE_TEMPLATE("a message to a context with no handler is dropped and counted; remote done says so", P,
                   BACKENDS) {
  P pair(fifo(256));
  Context &a = pair.a(), &b = pair.b();
  const auto pay = pattern(50000, 3);
  Counter local, remote;
  REQUIRE(a.send({.dest = pair.to_b(), .dispatch = 77, .payload = bytes_of(pay), .local_done = local.cb(),
                  .remote_done = remote.cb()}).ok());
  advance_until(a, b, [&] { return remote.calls == 1 && local.calls == 1; });
  CHECK(remote.last == StatusCode::unknown_dispatch);
  CHECK(b.stats().unknown_dispatch == 1);
  // Nobody keeps the data, so the receiver stops the eager packets at the
  // first one: no more than what was already in flight is dropped.
  CHECK(b.stats().rndv_stops_by_reason[0] == 1);  // no_buffer
  CHECK(a.stats().rndv_stopped == 1);
  CHECK(b.stats().discarded_bytes <= pay.size());
  CHECK(b.stats().rndv_get_bytes == 0);
  CHECK(b.stats().malformed_packets == 0);
}

TEST_CASE("send to self context, and many messages keep their order") {
  Client client(options(1, 16));
  Context& a = client.context(0);
  struct Order {
    std::uint32_t next = 0;
    bool ok = true;
    static void h(void* c, const Incoming& in, Receive*) {
      auto* o = static_cast<Order*>(c);
      std::uint32_t v;
      std::memcpy(&v, in.payload.data(), sizeof v);
      if (v != o->next++) o->ok = false;
    }
  } order;
  REQUIRE(a.set_dispatch(0, {&Order::h, &order}).ok());
  std::vector<std::uint32_t> values(5000);
  std::iota(values.begin(), values.end(), 0u);
  for (auto& v : values) {  // more than the FIFO holds: the rest queue in order
    Status s;
    while ((s = a.send({.dest = {0, 0}, .dispatch = 0, .payload = std::as_bytes(std::span(&v, 1))})) ==
           StatusCode::no_resource)
      (void)a.advance();  // every request is queued: let some go
    REQUIRE(s.ok());
  }
  for (int i = 0; i < 100000 && order.next < values.size(); ++i) (void)a.advance();
  CHECK(order.next == values.size());
  CHECK(order.ok);
}

TEST_CASE_TEMPLATE("send_immediate: buffer reusable on return; a full FIFO is no_resource, not queued", P,
                   BACKENDS) {
  P pair(fifo(4));
  Context &a = pair.a(), &b = pair.b();
  const Endpoint to_b = pair.to_b();
  Sink sink;
  REQUIRE(b.set_dispatch(2, {&Sink::handler, &sink}).ok());
  std::vector<std::uint8_t> buf = pattern(64, 4);
  const auto expect = buf;
  int accepted = 0;
  Status last;
  // The FIFO (and for shm, first the peer's ring) fills; then no_resource.
  for (int i = 0; i < 100000; ++i) {
    last = a.send_immediate({.dest = to_b, .dispatch = 2, .payload = bytes_of(buf)});
    if (!last.ok()) break;
    std::fill(buf.begin(), buf.end(), 0xEE);  // reuse at once
    buf = expect;
    ++accepted;
  }
  CHECK(accepted >= 4);
  CHECK(last == StatusCode::no_resource);
  CHECK(a.stats().queued == 0);
  advance_until(a, b, [&] { return sink.done == accepted; });
  for (auto& p : sink.payloads) CHECK(p == expect);
  // Room again once the sender has seen its sends complete, which over a
  // provider that reports them by CQ entry (ofi) may come an advance after
  // the receiver has the packets: no_resource until then, nothing else.
  Status again;
  bool answered = false;  // (advance_until asks once more at the end)
  advance_until(a, b, [&] {
    if (!answered) {
      again = a.send_immediate({.dest = to_b, .dispatch = 2, .payload = bytes_of(buf)});
      answered = again != StatusCode::no_resource;
    }
    return answered;
  });
  CHECK(again.ok());

  std::vector<std::uint8_t> too_big(a.immediate_limit(to_b) + 1);
  CHECK(a.send_immediate({.dest = to_b, .dispatch = 2, .payload = bytes_of(too_big)}) ==
        StatusCode::invalid_argument);
}

TEST_CASE_TEMPLATE("send queues when the FIFO is full; only an exhausted pool is no_resource", P, BACKENDS) {
  P pair(test::config_with({{"AMI_FIFO_DEPTH", "4"}, {"AMI_MAX_REQUESTS", "3"}}));
  Context &a = pair.a(), &b = pair.b();
  Sink sink;
  REQUIRE(b.set_dispatch(2, {&Sink::handler, &sink}).ok());
  const auto pay = pattern(16, 5);
  int accepted = 0;
  Status s;
  while ((s = a.send({.dest = pair.to_b(), .dispatch = 2, .payload = bytes_of(pay)})).ok()) ++accepted;
  CHECK(accepted >= 4 + 3);  // into the FIFO (shm: the peer's ring first), then three requests queued
  CHECK(s == StatusCode::no_resource);
  CHECK(std::string(s.what()).find("AMI_MAX_REQUESTS") != std::string::npos);
  advance_until(a, b, [&] { return sink.done == accepted; });
  CHECK(a.stats().queued == 3);
}

TEST_CASE_TEMPLATE("put and get move bytes; callbacks say when", P, BACKENDS) {
  for (const char* cma : {"on", "off"}) {
  CAPTURE(cma);
  P pair(test::config_with({{"AMI_SHM_CMA", cma}, {"AMI_SHM_CELL_SIZE", "4096"}}));
  Context &a = pair.a(), &b = pair.b();
  std::vector<std::uint8_t> target(1 << 16, 0), source = pattern(1 << 16, 7), back(1 << 16, 0);
  Memory tm, sm, bm;
  REQUIRE(pair.client_b().register_memory(target.data(), target.size(), tm).ok());
  REQUIRE(pair.client_a().register_memory(source.data(), source.size(), sm).ok());
  REQUIRE(pair.client_a().register_memory(back.data(), back.size(), bm).ok());

  // The key travels as bytes, as it would to another process.
  const auto wire = tm.remote_key().to_bytes();
  RemoteKey key;
  REQUIRE(RemoteKey::from_bytes(wire, key).ok());
  CHECK(key == tm.remote_key());

  Counter put_done, get_done;
  REQUIRE(a.put({.dest = pair.to_b(), .local = &sm, .local_offset = 100, .remote = key,
                 .remote_offset = 200, .bytes = 30000, .local_done = put_done.cb()}).ok());
  advance_until(a, b, [&] { return put_done.calls == 1; });
  CHECK(put_done.last.ok());
  CHECK(std::memcmp(target.data() + 200, source.data() + 100, 30000) == 0);
  CHECK(target[199] == 0);
  CHECK(target[200 + 30000] == 0);

  REQUIRE(a.get({.dest = pair.to_b(), .local = &bm, .local_offset = 0, .remote = key,
                 .remote_offset = 200, .bytes = 30000, .local_done = get_done.cb()}).ok());
  advance_until(a, b, [&] { return get_done.calls == 1; });
  CHECK(get_done.last.ok());
  CHECK(std::memcmp(back.data(), source.data() + 100, 30000) == 0);
  CHECK(a.stats().puts == 1);
  CHECK(a.stats().gets == 1);

  // Many outstanding, odd sizes and unaligned offsets, more than the FIFO holds.
  std::vector<Counter> done(300);
  for (std::size_t i = 0; i < done.size(); ++i) {
    const std::uint64_t off = (i * 211) % 60000, len = 1 + (i * 37) % 5000;
    const bool put = i % 2 == 0;
    RdmaParams p{.dest = pair.to_b(), .local = put ? &sm : &bm, .local_offset = off, .remote = key,
                 .remote_offset = off, .bytes = std::min<std::uint64_t>(len, 65536 - off),
                 .local_done = done[i].cb()};
    REQUIRE((put ? a.put(p) : a.get(p)).ok());
  }
  advance_until(a, b, [&] {
    return std::all_of(done.begin(), done.end(), [](const Counter& c) { return c.calls == 1; });
  });
  for (auto& c : done) CHECK(c.last.ok());
  }
}

TEST_CASE_TEMPLATE("allocated memory: PUT/GET by plain copy; a freed region's key is refused", P, BACKENDS) {
  P pair(fifo(16));
  Context &a = pair.a(), &b = pair.b();
  Memory target;
  REQUIRE(pair.client_b().allocate_memory(100000, target).ok());
  if (std::string(P::kBackend) == "shm") CHECK(shm_fd(target.remote_key()) != 0);
  CHECK(reinterpret_cast<std::uintptr_t>(target.address()) % 4096 == 0);
  auto* t = static_cast<std::uint8_t*>(target.address());
  CHECK(std::all_of(t, t + 100000, [](std::uint8_t x) { return x == 0; }));
  std::vector<std::uint8_t> src = pattern(100000, 3), back(100000, 0);
  Memory sm, bm;
  REQUIRE(pair.client_a().register_memory(src.data(), src.size(), sm).ok());
  REQUIRE(pair.client_a().register_memory(back.data(), back.size(), bm).ok());
  RemoteKey key;
  REQUIRE(RemoteKey::from_bytes(target.remote_key().to_bytes(), key).ok());
  CHECK(key == target.remote_key());
  std::vector<Counter> done(40);
  for (std::size_t i = 0; i < 20; ++i)  // odd pieces, more than the FIFO holds
    REQUIRE(a.put({.dest = pair.to_b(), .local = &sm, .local_offset = i * 5000 + 1, .remote = key,
                   .remote_offset = i * 5000 + 1, .bytes = 4999, .local_done = done[i].cb()}).ok());
  for (std::size_t i = 0; i < 20; ++i)
    REQUIRE(a.get({.dest = pair.to_b(), .local = &bm, .local_offset = i * 5000 + 1, .remote = key,
                   .remote_offset = i * 5000 + 1, .bytes = 4999, .local_done = done[20 + i].cb()}).ok());
  advance_until(a, b, [&] {
    return std::all_of(done.begin(), done.end(), [](const Counter& c) { return c.calls == 1; });
  });
  for (auto& c : done) CHECK(c.last.ok());
  for (std::size_t i = 0; i < 20; ++i) {
    CHECK(std::memcmp(t + i * 5000 + 1, src.data() + i * 5000 + 1, 4999) == 0);
    CHECK(std::memcmp(back.data() + i * 5000 + 1, src.data() + i * 5000 + 1, 4999) == 0);
  }
  target = Memory{};  // freed: the key is stale now
  Counter stale;
  REQUIRE(a.get({.dest = pair.to_b(), .local = &bm, .remote = key, .bytes = 8, .local_done = stale.cb()}).ok());
  advance_until(a, b, [&] { return stale.calls == 1; });
  CHECK(stale.last == P::kRefusedKey);
}

TEST_CASE_TEMPLATE("remote keys are checked: range, staleness, other jobs", P, BACKENDS) {
  for (const char* cma : {"on", "off"}) {
  CAPTURE(cma);
  P pair(test::config_with({{"AMI_SHM_CMA", cma}}));
  Client other(options(1));
  Context &a = pair.a(), &b = pair.b();
  const Endpoint to_b = pair.to_b();
  std::vector<std::uint8_t> buf(4096, 0x11), local(4096, 0), secret(4096, 0x22);
  Memory lm;
  REQUIRE(pair.client_a().register_memory(local.data(), local.size(), lm).ok());
  RemoteKey key;
  {
    Memory m;
    REQUIRE(pair.client_b().register_memory(buf.data(), buf.size(), m).ok());
    key = m.remote_key();
    CHECK(a.put({.dest = to_b, .local = &lm, .remote = key, .remote_offset = 4000, .bytes = 200}) ==
          StatusCode::remote_access);  // past the region, refused at the origin
  }
  // The target checks every key; a GET tells the origin what it decided.
  // On verbs the NIC's remote access error moves the RC queue pair into
  // the error state: the lane is gone and the peer is reported failed, so
  // later operations to it are refused with peer_failed. ofi does the same
  // (tcp;ofi_rxm drops its connection after one).
  const bool one_error_breaks_the_lane = std::string(P::kBackend) == "verbs" || std::string(P::kBackend) == "ofi";
  bool lane_broken = false;
  auto refused = [&](const RemoteKey& k, std::uint64_t offset, const char* why) {
    CAPTURE(why);
    if (lane_broken) {
      CHECK(a.get({.dest = to_b, .local = &lm, .remote = k, .remote_offset = offset, .bytes = 16}) ==
            StatusCode::peer_failed);
      return;
    }
    Counter done;
    REQUIRE(a.get({.dest = to_b, .local = &lm, .remote = k, .remote_offset = offset, .bytes = 16,
                   .local_done = done.cb()}).ok());
    advance_until(a, b, [&] { return done.calls == 1; });
    CHECK(done.last == P::kRefusedKey);
    CHECK(local[0] == 0);  // nothing was read
    if (one_error_breaks_the_lane) {
      for (int i = 0; i < 100; ++i) (void)a.advance();  // the device reports the broken lane
      lane_broken = true;
    }
  };
  refused(key, 0, "deregistered: the origin cannot know");

  Memory m;
  REQUIRE(pair.client_b().register_memory(buf.data(), 1024, m).ok());
  RemoteKey forged = m.remote_key();
  forged.length = 4096;
  refused(forged, 2048, "a forged key claiming more than was registered");

  std::vector<std::uint8_t> obuf(64);
  Memory om;
  REQUIRE(other.register_memory(obuf.data(), obuf.size(), om).ok());
  RemoteKey foreign = om.remote_key();
  foreign.task = to_b.task;
  refused(foreign, 0, "a key from another job");

  RemoteKey elsewhere = m.remote_key();
  elsewhere.address = reinterpret_cast<std::uintptr_t>(secret.data());
  refused(elsewhere, 0, "a live key whose address names memory the owner never registered");

  // A refused PUT completes with remote_access at the origin and leaves the
  // target untouched: a stale key, and a live one pointed elsewhere.
  auto put_refused = [&](const RemoteKey& k, const char* why) {
    CAPTURE(why);
    if (lane_broken) return;
    Counter put_done;
    REQUIRE(a.put({.dest = to_b, .local = &lm, .remote = k, .bytes = 16, .local_done = put_done.cb()}).ok());
    advance_until(a, b, [&] { return put_done.calls == 1; });
    CHECK(put_done.last == StatusCode::remote_access);
    Counter fenced;
    REQUIRE(a.fence(to_b, fenced.cb()).ok());
    advance_until(a, b, [&] { return fenced.calls == 1; });
  };
  put_refused(key, "deregistered");
  put_refused(elsewhere, "pointed at memory never registered");
  for (int i = 0; i < 100; ++i) (void)b.advance();
  CHECK(buf[0] == 0x11);
  CHECK(std::count(secret.begin(), secret.end(), 0x22) == 4096);
  // And local memory of another client is not registered here.
  CHECK(a.put({.dest = to_b, .local = &om, .remote = m.remote_key(), .bytes = 16}) ==
        StatusCode::not_registered);
  }
}

TEST_CASE_TEMPLATE("a backend refuses a key without its own entry, or with it edited", P, BACKENDS) {
  P pair(fifo(16));
  Context &a = pair.a(), &b = pair.b();
  const Endpoint to_b = pair.to_b();
  std::vector<std::uint8_t> buf(4096, 0x11), local(4096, 0);
  Memory lm, m;
  REQUIRE(pair.client_a().register_memory(local.data(), local.size(), lm).ok());
  REQUIRE(pair.client_b().register_memory(buf.data(), buf.size(), m).ok());
  const RemoteKey key = m.remote_key();
  auto moved = [&](const RemoteKey& k, bool put) {
    Counter done;
    const RdmaParams p{.dest = to_b, .local = &lm, .remote = k, .bytes = 16, .local_done = done.cb()};
    REQUIRE((put ? a.put(p) : a.get(p)).ok());
    advance_until(a, b, [&] { return done.calls == 1; });
    return done.last;
  };

  // Another backend's entry is none of this one's business.
  RemoteKey extra = key;
  const std::byte other[8] = {std::byte{1}};
  std::uint8_t foreign = 0;
  while (foreign == key_id(P::kBackend) || key.entry(foreign) != nullptr) ++foreign;
  REQUIRE(foreign < kMaxKeyBackends);
  REQUIRE(extra.add_entry(foreign, other).ok());
  CHECK(moved(extra, false).ok());
  CHECK(local[0] == 0x11);
  local[0] = 0;

  const std::uint8_t own = key_id(P::kBackend);
  if (std::string(P::kBackend) == "self") {
    CHECK(moved(without_entry(key, own), false).ok());  // self reads no entry: the table decides
    return;
  }
  REQUIRE(key.entry(own) != nullptr);
  CHECK(moved(without_entry(key, own), false) == StatusCode::remote_access);
  CHECK(moved(without_entry(key, own), true) == StatusCode::remote_access);
  RemoteKey edited = key;
  for (KeyEntry& e : edited.entries)
    if (e.backend == own) e.length = KeyEntry::kRoom;  // not the length the backend writes
  CHECK(moved(edited, false) == StatusCode::remote_access);
  CHECK(moved(edited, true) == StatusCode::remote_access);
  CHECK(local[0] == 0);
  for (int i = 0; i < 100; ++i) (void)b.advance();
  CHECK(buf[0] == 0x11);
  if (std::string(P::kBackend) == "verbs") {
    // Another rkey: the peer's NIC refuses it (and the lane breaks).
    for (KeyEntry& e : edited.entries)
      if (e.backend == own) {
        e.length = sizeof(std::uint32_t);
        e.bytes[0] ^= std::byte{0x5A};
      }
    CHECK(moved(edited, false) == StatusCode::remote_access);
    CHECK(local[0] == 0);
  }
}

TEST_CASE("invalid arguments name the problem") {
  Client client(options(2));
  Context& a = client.context(0);
  std::vector<std::uint8_t> big_header(200);
  const Status cases[] = {
      a.send({.dest = {1, 0}}),
      a.send({.dest = {0, 9}}),
      a.send({.dest = {0, 1}, .dispatch = 300}),
      a.send({.dest = {0, 1}, .header = bytes_of(big_header)}),
      a.send({.dest = {0, 1}, .payload = {static_cast<const std::byte*>(nullptr), 12}}),
      a.set_dispatch(kMaxDispatch, {}),
      a.put({.dest = {0, 1}, .local = nullptr, .bytes = 1}),
      client.register_memory(nullptr, 16, *std::make_unique<Memory>()),
  };
  for (const Status& s : cases) {
    CAPTURE(to_string(s));
    CHECK(s.code() != StatusCode::ok);
    CHECK(std::string(s.what()).size() > 10);
  }
  CHECK(std::string(cases[4].what()) == "send: payload is null but its length is not zero");
  CHECK(cases[6] == StatusCode::not_registered);
}

TEST_CASE("two threads, two contexts, streaming both ways") {
  Client client(options(2, 16));
  constexpr int kMessages = 20000;
  struct Count {
    std::atomic<int> n{0};
    static void h(void* c, const Incoming&, Receive*) { static_cast<Count*>(c)->n.fetch_add(1); }
  } got[2];
  REQUIRE(client.context(0).set_dispatch(0, {&Count::h, &got[0]}).ok());
  REQUIRE(client.context(1).set_dispatch(0, {&Count::h, &got[1]}).ok());
  // A context's sends are carried out by its own advance (the self device
  // copies when its target's queue has room), so a thread that has all it
  // was sent keeps advancing until the other thread has all of its.
  std::atomic<int> finished{0};
  auto run = [&](std::uint16_t me) {
    Context& c = client.context(me);
    const std::uint16_t peer = me ^ 1;
    std::uint64_t value = me;
    int sent = 0;
    while (sent < kMessages || got[me].n.load() < kMessages) {
      if (sent < kMessages) {
        Status s = c.send_immediate({.dest = {0, peer}, .dispatch = 0,
                                     .payload = std::as_bytes(std::span(&value, 1))});
        if (s.ok()) ++sent;
        else REQUIRE(s == StatusCode::no_resource);
      }
      (void)c.advance();
    }
    finished.fetch_add(1);
    while (finished.load() < 2) (void)c.advance();
  };
  std::thread t0(run, 0), t1(run, 1);
  t0.join();
  t1.join();
  CHECK(got[0].n.load() == kMessages);
  CHECK(got[1].n.load() == kMessages);
}

// ---- the rendezvous (eager SEND, receiver STOP, GET or PUT) ----

namespace {

const char* const kRndvModes[] = {"discard_get", "split_get", "stop_put", "auto"};

// Sizes from one byte to 64 MiB, odd ones included, sent from and received
// into buffers at odd offsets, every byte checked.
void rndv_sizes(const char* mode, std::vector<std::size_t> sizes, const char* backend_pair,
                std::function<void(const Config&, const std::function<void(Context&, Context&, Endpoint)>&)> run) {
  const std::string mode_name = mode, backend_name = backend_pair;
  CAPTURE(mode_name);
  CAPTURE(backend_name);
  Config config = test::config_with({{"AMI_RNDV_MODE", mode}});
  run(config, [&](Context& a, Context& b, Endpoint to_b) {
    struct Target {
      std::vector<std::uint8_t> storage;
      std::size_t size = 0;
      int done = 0;
      Status status;
    } t;
    REQUIRE(b.set_dispatch(21, {+[](void* c, const Incoming& in, Receive* recv) {
      auto* t = static_cast<Target*>(c);
      t->storage.assign(in.total_bytes + 5, 0xEE);
      t->size = in.total_bytes;
      if (recv == nullptr) {
        std::memcpy(t->storage.data() + 5, in.payload.data(), in.payload.size());
        ++t->done;
        return;
      }
      recv->buffer = t->storage.data() + 5;  // unaligned
      recv->done = {+[](void* c, Status s) {
        auto* t = static_cast<Target*>(c);
        t->status = s;
        ++t->done;
      }, t};
    }, &t}).ok());
    std::vector<std::uint8_t> source;
    for (std::size_t n : sizes) {
      CAPTURE(n);
      source.assign(n + 3, 0);
      for (std::size_t i = 0; i < n; ++i) source[i + 3] = static_cast<std::uint8_t>(i * 131 + (i >> 13) + n);
      Counter local, remote;
      t.done = 0;
      REQUIRE(a.send({.dest = to_b, .dispatch = 21,
                      .payload = std::as_bytes(std::span(source)).subspan(3, n),
                      .local_done = local.cb(), .remote_done = remote.cb()}).ok());
      advance_until(a, b, [&] { return t.done == 1 && local.calls == 1 && remote.calls == 1; });
      CHECK_MESSAGE(t.status.ok(), to_string(t.status));
      CHECK_MESSAGE(local.last.ok(), to_string(local.last));
      CHECK_MESSAGE(remote.last.ok(), to_string(remote.last));
      REQUIRE(t.size == n);
      CHECK(std::memcmp(t.storage.data() + 5, source.data() + 3, n) == 0);
      CHECK(t.storage[4] == 0xEE);  // nothing before the buffer
      CHECK(t.storage.size() == n + 5);
    }
    CHECK(b.stats().malformed_packets == 0);
    CHECK(a.stats().malformed_packets == 0);
    if (std::string_view(mode) != "auto") {
      // Messages far above every lane's crossover are stopped in the mode asked for.
      const std::size_t m = std::string_view(mode) == "discard_get" ? 0 : std::string_view(mode) == "split_get" ? 1 : 2;
      CHECK(b.stats().rndv_stops_by_mode[m] > 0);
    }
    CHECK(a.stats().rndv_stopped > 0);
  });
}

}  // namespace

TEST_CASE_TEMPLATE("rendezvous: every mode moves 1 B..64 MiB byte for byte, odd sizes, unaligned", P, BACKENDS) {
  const std::vector<std::size_t> sizes = {1, 63, 4097, 16385, 65537, (1u << 20) + 13, (8u << 20) + 1, 64u << 20};
  for (const char* mode : kRndvModes)
    rndv_sizes(mode, sizes, P::kBackend, [](const Config& c, const auto& body) {
      P pair(c);
      body(pair.a(), pair.b(), pair.to_b());
    });
}

TEST_CASE_TEMPLATE("rendezvous: a handler asking for zero copy gets its data by RDMA only", P, BACKENDS) {
  P pair(fifo(256));
  Context &a = pair.a(), &b = pair.b();
  struct Z {
    std::vector<std::uint8_t> buf;
    int done = 0;
  } z;
  REQUIRE(b.set_dispatch(22, {+[](void* c, const Incoming& in, Receive* recv) {
    auto* z = static_cast<Z*>(c);
    REQUIRE(recv != nullptr);
    z->buf.assign(in.total_bytes, 0);
    recv->buffer = z->buf.data();
    recv->zero_copy = true;
    recv->done = {+[](void* c, Status s) {
      CHECK(s.ok());
      ++static_cast<Z*>(c)->done;
    }, z};
  }, &z}).ok());
  const auto pay = pattern(3000 * 7 + 1, 9);  // a few packets on every lane
  Counter local;
  REQUIRE(a.send({.dest = pair.to_b(), .dispatch = 22, .payload = bytes_of(pay), .local_done = local.cb()}).ok());
  advance_until(a, b, [&] { return z.done == 1 && local.calls == 1; });
  CHECK(z.buf == pay);
  CHECK(b.stats().rndv_stops_by_reason[1] == 1);  // zero_copy
}

TEST_CASE_TEMPLATE("rendezvous: given registrations are used, none are made", P, BACKENDS) {
  P pair(fifo(256));
  Context &a = pair.a(), &b = pair.b();
  std::vector<std::uint8_t> src = pattern(1 << 20, 4), dst(1 << 20, 0);
  Memory src_mem, dst_mem;
  REQUIRE(pair.client_a().register_memory(src.data(), src.size(), src_mem).ok());
  REQUIRE(pair.client_b().register_memory(dst.data(), dst.size(), dst_mem).ok());
  struct R {
    std::vector<std::uint8_t>* dst;
    const Memory* mem;
    int done = 0;
  } r{&dst, &dst_mem};
  REQUIRE(b.set_dispatch(23, {+[](void* c, const Incoming& in, Receive* recv) {
    auto* r = static_cast<R*>(c);
    REQUIRE(recv != nullptr);
    REQUIRE(in.total_bytes == r->dst->size() - 100);
    recv->buffer = r->dst->data() + 100;
    recv->memory = r->mem;
    recv->done = {+[](void* c, Status) { ++static_cast<R*>(c)->done; }, r};
  }, &r}).ok());
  Counter local;
  const auto misses_a = a.stats().rcache_misses, misses_b = b.stats().rcache_misses;
  REQUIRE(a.send({.dest = pair.to_b(), .dispatch = 23, .payload = bytes_of(src).subspan(100),
                  .local_done = local.cb(), .memory = &src_mem}).ok());
  advance_until(a, b, [&] { return r.done == 1 && local.calls == 1; });
  CHECK(std::equal(src.begin() + 100, src.end(), dst.begin() + 100));
  CHECK(a.stats().rcache_misses == misses_a);
  CHECK(b.stats().rcache_misses == misses_b);
  CHECK(a.stats().rndv_stopped == 1);

  // A payload outside the given memory is refused, naming the problem.
  std::vector<std::uint8_t> other(10);
  Status s = a.send({.dest = pair.to_b(), .dispatch = 23, .payload = bytes_of(other), .memory = &src_mem});
  CHECK(s == StatusCode::invalid_argument);
  CHECK(to_string(s).find("outside the given memory") != std::string::npos);
}

TEST_CASE_TEMPLATE("rendezvous: many concurrent messages to a receiver that runs out of reception buffers", P,
                   BACKENDS) {
  // Size never triggers a stop here; only the receiver's buffers running low can.
  P pair(test::config_with({{"AMI_RNDV_CROSSOVER", "1099511627776"}, {"AMI_SELF_QUEUE_DEPTH", "16"},
                            {"AMI_SHM_RING_DEPTH", "16"}, {"AMI_VERBS_SRQ_DEPTH", "16"},
                            {"AMI_OFI_RECV_BUFFERS", "2"},
                            {"AMI_RNDV_LOW_WATER", "50"}, {"AMI_MAX_REQUESTS", "4096"}}));
  Context &a = pair.a(), &b = pair.b();
  constexpr int kMessages = 300;
  struct Many {
    std::vector<std::vector<std::uint8_t>> bufs;
    int done = 0;
    int bad = 0;
  } m;
  m.bufs.resize(kMessages);
  REQUIRE(b.set_dispatch(24, {+[](void* c, const Incoming& in, Receive* recv) {
    auto* m = static_cast<Many*>(c);
    std::uint32_t index = 0;
    std::memcpy(&index, in.header.data(), sizeof index);
    REQUIRE(recv != nullptr);
    m->bufs[index].assign(in.total_bytes, 0);
    recv->buffer = m->bufs[index].data();
    recv->done = {+[](void* c, Status s) {
      auto* m = static_cast<Many*>(c);
      if (!s.ok()) ++m->bad;
      ++m->done;
    }, m};
  }, &m}).ok());
  std::vector<std::vector<std::uint8_t>> sources(kMessages);
  std::vector<std::uint32_t> indices(kMessages);
  Counter local;
  for (int i = 0; i < kMessages; ++i) {
    sources[i] = pattern(20000 + 37 * i, static_cast<std::uint8_t>(i));
    indices[i] = static_cast<std::uint32_t>(i);
    REQUIRE(a.send({.dest = pair.to_b(), .dispatch = 24,
                    .header = std::as_bytes(std::span(&indices[i], 1)), .payload = bytes_of(sources[i]),
                    .local_done = local.cb()}).ok());
  }
  // The sender runs ahead; the receiver drains now and then.
  for (int round = 0; round < 2000000 && (m.done < kMessages || local.calls < kMessages); ++round) {
    for (int k = 0; k < 8; ++k) (void)a.advance();
    (void)b.advance();
  }
  if (m.done != kMessages) {
    MESSAGE(progress("a", a));
    MESSAGE(progress("b", b));
  }
  REQUIRE(m.done == kMessages);
  REQUIRE(local.calls == kMessages);
  CHECK(m.bad == 0);
  CHECK(local.last.ok());
  for (int i = 0; i < kMessages; ++i) CHECK(m.bufs[i] == sources[i]);
  CHECK(b.stats().rndv_stops_by_reason[2] > 0);  // reception_low
  CHECK(b.stats().reception_load_max >= 50);
  CHECK(b.stats().malformed_packets == 0);
}

TEST_CASE_TEMPLATE("rendezvous: a deferred message waits without a buffer until accept(), then comes by GET", P,
                   BACKENDS) {
  P pair(fifo(256));
  Context &a = pair.a(), &b = pair.b();
  struct Later {
    Deferred deferred[2];
    int seen = 0;
    bool could_defer = true;
  } later;
  REQUIRE(b.set_dispatch(25, {+[](void* c, const Incoming& in, Receive* recv) {
    auto* l = static_cast<Later*>(c);
    if (recv == nullptr || !in.can_defer) {
      l->could_defer = false;
      return;
    }
    recv->defer = &l->deferred[l->seen++];
  }, &later}).ok());
  const auto pay = pattern(200001, 5), other = pattern(70001, 6);
  Counter local, local2, done;
  REQUIRE(a.send({.dest = pair.to_b(), .dispatch = 25, .payload = bytes_of(pay), .local_done = local.cb()}).ok());
  REQUIRE(a.send({.dest = pair.to_b(), .dispatch = 25, .payload = bytes_of(other), .local_done = local2.cb()}).ok());
  advance_until(a, b, [&] { return later.seen == 2 && later.deferred[1].id != 0; });
  for (int i = 0; i < 2000; ++i) {  // the senders are stopped; nothing completes while they wait
    (void)a.advance();
    (void)b.advance();
  }
  REQUIRE(later.could_defer);
  CHECK(local.calls == 0);
  CHECK(local2.calls == 0);
  CHECK(later.deferred[0].total_bytes == pay.size());
  CHECK(later.deferred[0].origin == pair.to_a());
  CHECK(b.stats().rndv_stops_by_reason[4] == 2);  // deferred

  // Accepted in the other order, the second one discarded.
  std::vector<std::uint8_t> buf(pay.size(), 0);
  REQUIRE(b.accept(later.deferred[1], nullptr, done.cb()).ok());
  REQUIRE(b.accept(later.deferred[0], buf.data(), done.cb()).ok());
  advance_until(a, b, [&] { return done.calls == 2 && local.calls == 1 && local2.calls == 1; });
  CHECK(buf == pay);
  CHECK(done.last.ok());
  CHECK(local.last.ok());
  CHECK(local2.last.ok());
  // Once only; an id that names nothing is refused by name.
  Status s = b.accept(later.deferred[0], buf.data(), done.cb());
  CHECK(s == StatusCode::invalid_argument);
  CHECK(to_string(s).find("no deferred message") != std::string::npos);
  CHECK(b.accept(Deferred{}, buf.data(), done.cb()) == StatusCode::invalid_argument);
  CHECK(b.stats().malformed_packets == 0);
}

TEST_CASE_TEMPLATE("rendezvous: with the registration cache full, messages go eagerly and arrive whole", P, BACKENDS) {
  P pair(test::config_with({{"AMI_RCACHE_MAX_ENTRIES", "1"}, {"AMI_RCACHE_IDLE", "0"}}));
  Context &a = pair.a(), &b = pair.b();
  struct Two {
    std::vector<std::uint8_t> buf[3];
    int done = 0;
  } two;
  REQUIRE(b.set_dispatch(26, {+[](void* c, const Incoming& in, Receive* recv) {
    auto* t = static_cast<Two*>(c);
    REQUIRE(recv != nullptr);
    auto& buf = t->buf[in.header[0] == std::byte{0} ? 0 : in.header[0] == std::byte{1} ? 1 : 2];
    buf.assign(in.total_bytes, 0);
    recv->buffer = buf.data();
    recv->done = {+[](void* c, Status s) {
      CHECK(s.ok());
      ++static_cast<Two*>(c)->done;
    }, t};
  }, &two}).ok());
  const std::vector<std::uint8_t> pays[3] = {pattern(300001, 1), pattern(200003, 2), pattern(100005, 3)};
  Counter local;
  for (std::uint8_t i = 0; i < 3; ++i) {
    const std::byte h[1] = {std::byte{i}};
    REQUIRE(a.send({.dest = pair.to_b(), .dispatch = 26, .header = h, .payload = bytes_of(pays[i]),
                    .local_done = local.cb()}).ok());
  }
  advance_until(a, b, [&] { return two.done == 3 && local.calls == 3; });
  for (int i = 0; i < 3; ++i) CHECK(two.buf[i] == pays[i]);
  CHECK(a.stats().rndv_unregistered >= 1);  // the sender's one entry was taken
  CHECK(local.last.ok());
}

TEST_CASE_TEMPLATE("a message taken in pieces arrives in order, eagerly, and is never stopped", P, BACKENDS) {
  P pair(fifo(64));
  Context &a = pair.a(), &b = pair.b();
  struct Pieces {
    std::vector<std::uint8_t> got;
    bool in_order = true;
    int pieces = 0;
    int done = 0;
  } p;
  REQUIRE(b.set_dispatch(27, {+[](void* c, const Incoming&, Receive* recv) {
    REQUIRE(recv != nullptr);
    recv->piece = +[](void* c, std::uint64_t offset, std::span<const std::byte> bytes) {
      auto* p = static_cast<Pieces*>(c);
      if (offset != p->got.size()) p->in_order = false;
      const auto* b = reinterpret_cast<const std::uint8_t*>(bytes.data());
      p->got.insert(p->got.end(), b, b + bytes.size());
      ++p->pieces;
    };
    recv->piece_cookie = c;
    recv->done = {+[](void* c, Status s) {
      CHECK(s.ok());
      ++static_cast<Pieces*>(c)->done;
    }, c};
  }, &p}).ok());
  const auto pay = pattern(1000003, 8);  // far above every lane's crossover
  Counter local;
  REQUIRE(a.send({.dest = pair.to_b(), .dispatch = 27, .payload = bytes_of(pay), .local_done = local.cb()}).ok());
  advance_until(a, b, [&] { return p.done == 1 && local.calls == 1; });
  CHECK(p.in_order);
  CHECK(p.pieces > 1);
  CHECK(p.got == pay);
  CHECK(a.stats().rndv_stopped == 0);
  CHECK(b.stats().rndv_eager_complete == 1);
}

// ---- the deterministic fence ----

namespace {

// Three registered regions at b, a shadow of what they should hold, and a
// source at a; PUTs of varied sizes at odd offsets go into the regions.
template <class P>
struct FenceRig {
  P& pair;
  std::vector<std::uint8_t> regions[3] = {std::vector<std::uint8_t>(100003), std::vector<std::uint8_t>(4097),
                                          std::vector<std::uint8_t>((1 << 20) + 5)};
  std::vector<std::uint8_t> shadow[3];
  Memory region_mem[3];
  std::vector<std::uint8_t> source = pattern((2 << 20) + 7, 11);
  Memory source_mem;
  explicit FenceRig(P& p) : pair(p) {
    for (int k = 0; k < 3; ++k) {
      REQUIRE(pair.client_b().register_memory(regions[k].data(), regions[k].size(), region_mem[k]).ok());
      shadow[k] = regions[k];
    }
    REQUIRE(pair.client_a().register_memory(source.data(), source.size(), source_mem).ok());
  }
  bool placed() const {
    for (int k = 0; k < 3; ++k)
      if (regions[k] != shadow[k]) return false;
    return true;
  }
  // PUT number i: its size and offsets vary; the shadow follows.
  void put(Context& a, int i, Counter& local) {
    const int k = i % 3;
    const std::size_t len = regions[k].size();
    const std::size_t size = std::min<std::size_t>(len, 1 + (static_cast<std::size_t>(i) * 7919) % 300000);
    const std::size_t dst = (static_cast<std::size_t>(i) * 997) % (len - size + 1);
    const std::size_t src = (static_cast<std::size_t>(i) * 131) % (source.size() - size);
    std::memcpy(shadow[k].data() + dst, source.data() + src, size);
    REQUIRE(a.put({.dest = pair.to_b(), .local = &source_mem, .local_offset = src,
                   .remote = region_mem[k].remote_key(), .remote_offset = dst, .bytes = size,
                   .local_done = local.cb()}).ok());
  }
};

}  // namespace

TEST_CASE_TEMPLATE("fence: every earlier PUT is placed when the target's fence handler runs and when done runs", P,
                   BACKENDS) {
  // An ordered lane fences by a message the target answers once every
  // earlier PUT is placed; an unordered one (ofi's shm provider, or any
  // provider told AMI_OFI_ORDERED=off) by waiting for every earlier
  // operation to complete, a PUT completing only once placed.
  std::vector<std::pair<bool, Config>> runs{{P::kOrdered, fifo(64)}};
  if (std::string(P::kBackend) == "ofi" && P::kOrdered)
    runs.push_back({false, test::config_with({{"AMI_FIFO_DEPTH", "64"}, {"AMI_OFI_ORDERED", "off"}})});
  for (auto& [ordered, config] : runs) {
  CAPTURE(ordered);
  P pair(config);
  Context &a = pair.a(), &b = pair.b();
  FenceRig<P> rig(pair);
  struct Seen {
    FenceRig<P>* rig;
    int fences = 0;
    int placed = 0;
    Endpoint origin;
  } seen{&rig};
  b.set_fence_handler({+[](void* c, Endpoint origin) {
    auto* s = static_cast<Seen*>(c);
    ++s->fences;
    s->origin = origin;
    if (s->rig->placed()) ++s->placed;
  }, &seen});
  Counter local, fenced;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 40; ++i) rig.put(a, round * 40 + i, local);
    REQUIRE(a.fence(pair.to_b(), fenced.cb()).ok());  // no waiting for the PUTs first
    advance_until(a, b, [&] { return fenced.calls == round + 1; });
    CHECK(fenced.last.ok());
    CHECK(rig.placed());
    if (ordered) {
      CHECK(seen.fences == round + 1);
      CHECK(seen.placed == round + 1);  // at the target, at the moment the fence arrived
    }
  }
  if (ordered) {
    CHECK(seen.origin == pair.to_a());
    CHECK(a.stats().fences_by_message == 3);
    CHECK(a.stats().fences_by_flush == 0);
    CHECK(b.stats().fences_answered == 3);
  } else {
    CHECK(seen.fences == 0);  // nothing went to the target
    CHECK(a.stats().fences_by_message == 0);
    CHECK(a.stats().fences_by_flush == 3);
  }
  advance_until(a, b, [&] { return local.calls == 120; });
  CHECK(local.last.ok());
  }
}

TEST_CASE_TEMPLATE("fence: every earlier GET's data is at the origin when done runs; fence_all", P, BACKENDS) {
  P pair(fifo(64));
  Context &a = pair.a(), &b = pair.b();
  std::vector<std::uint8_t> remote = pattern((1 << 20) + 3, 21), local((1 << 20) + 3, 0);
  Memory remote_mem, local_mem;
  REQUIRE(pair.client_b().register_memory(remote.data(), remote.size(), remote_mem).ok());
  REQUIRE(pair.client_a().register_memory(local.data(), local.size(), local_mem).ok());
  Counter got, fenced;
  std::size_t offset = 0;
  for (int i = 0; offset < remote.size(); ++i) {
    const std::size_t size = std::min<std::size_t>(remote.size() - offset, 1 + (static_cast<std::size_t>(i) * 4099) % 70000);
    REQUIRE(a.get({.dest = pair.to_b(), .local = &local_mem, .local_offset = offset, .remote = remote_mem.remote_key(),
                   .remote_offset = offset, .bytes = size, .local_done = got.cb()}).ok());
    offset += size;
  }
  struct AtDone {
    std::vector<std::uint8_t>* local;
    std::vector<std::uint8_t>* remote;
    bool equal = false;
    int calls = 0;
  } at{&local, &remote};
  REQUIRE(a.fence(pair.to_b(), {+[](void* c, Status s) {
    auto* at = static_cast<AtDone*>(c);
    CHECK(s.ok());
    at->equal = *at->local == *at->remote;  // checked inside the callback itself
    ++at->calls;
  }, &at}).ok());
  advance_until(a, b, [&] { return at.calls == 1; });
  CHECK(at.equal);
  // fence_all: one done for every lane this context has.
  std::fill(local.begin(), local.end(), 0);
  REQUIRE(a.get({.dest = pair.to_b(), .local = &local_mem, .remote = remote_mem.remote_key(),
                 .bytes = local.size(), .local_done = got.cb()}).ok());
  REQUIRE(a.fence_all(fenced.cb()).ok());
  CHECK(fenced.calls == 0);  // never inside the call
  advance_until(a, b, [&] { return fenced.calls == 1; });
  CHECK(fenced.last.ok());
  CHECK(local == remote);
}

TEST_CASE("fence: interleaved with sends from several contexts, each fence sees exactly its origin's earlier sends") {
  Client client(options(3, 16));
  Context* ctx[3] = {&client.context(0), &client.context(1), &client.context(2)};
  struct Target {
    int received[3] = {0, 0, 0};
    std::vector<int> expected[3];  // at each fence from that origin, in order
    int fences[3] = {0, 0, 0};
    int wrong = 0;
  } t;
  REQUIRE(ctx[2]->set_dispatch(30, {+[](void* c, const Incoming& in, Receive* recv) {
    auto* t = static_cast<Target*>(c);
    static std::vector<std::uint8_t> sink;
    if (recv != nullptr) {
      sink.assign(in.total_bytes, 0);
      recv->buffer = sink.data();
    }
    ++t->received[in.origin.context];
  }, &t}).ok());
  ctx[2]->set_fence_handler({+[](void* c, Endpoint origin) {
    auto* t = static_cast<Target*>(c);
    const int n = t->fences[origin.context]++;
    if (t->expected[origin.context].at(static_cast<std::size_t>(n)) != t->received[origin.context]) ++t->wrong;
  }, &t});
  Counter fenced;
  const auto big = pattern(50000, 3), small = pattern(40, 4);
  int sent[2] = {0, 0};
  for (int round = 0; round < 20; ++round)
    for (int o = 0; o < 2; ++o) {
      for (int k = 0; k < 1 + (round * 3 + o) % 5; ++k) {
        const auto& pay = (k + round) % 3 == 0 ? big : small;
        REQUIRE(ctx[o]->send({.dest = {0, 2}, .dispatch = 30, .payload = bytes_of(pay)}).ok());
        ++sent[o];
      }
      t.expected[o].push_back(sent[o]);
      REQUIRE(ctx[o]->fence({0, 2}, fenced.cb()).ok());
    }
  for (int i = 0; i < 1000000 && fenced.calls < 40; ++i)
    for (Context* c : ctx) (void)c->advance();
  REQUIRE(fenced.calls == 40);
  CHECK(fenced.last.ok());
  CHECK(t.wrong == 0);
  CHECK(t.fences[0] == 20);
  CHECK(t.fences[1] == 20);
}

TEST_CASE("fence: bad endpoints are refused by name") {
  Client client(options(1));
  Context& c = client.context(0);
  Counter done;
  Status s = c.fence({5, 0}, done.cb());
  CHECK(s == StatusCode::invalid_argument);
  CHECK(to_string(s).find("fence: endpoint is out of range") != std::string::npos);
  // No lane yet: fence_all has nothing to wait for, and still answers in advance().
  REQUIRE(c.fence_all(done.cb()).ok());
  CHECK(done.calls == 0);
  (void)c.advance();
  CHECK(done.calls == 1);
}

TEST_CASE_TEMPLATE("acks: a stream with remote-done, cut off at an arbitrary point, is answered exactly once", P,
                   BACKENDS) {
  P pair(Config{});
  Context &a = pair.a(), &b = pair.b();
  constexpr std::uint32_t kCount = 3001;
  std::vector<int> answered(kCount, 0);
  int failed = 0;
  std::uint32_t dispatched = 0;
  std::vector<std::uint8_t> big(30000, 3), into(30000);
  struct Token {
    std::vector<int>* answered;
    int* failed;
    std::uint32_t index;
  };
  std::vector<Token> tokens;
  tokens.reserve(kCount);
  REQUIRE(b.set_dispatch(1, {+[](void* p, const Incoming&, Receive* recv) {
                               auto* into = static_cast<std::vector<std::uint8_t>*>(p);
                               if (recv != nullptr) recv->buffer = into->data();
                             }, &into}).ok());
  REQUIRE(b.set_dispatch(2, {+[](void* p, const Incoming&, Receive*) { ++*static_cast<std::uint32_t*>(p); },
                             &dispatched}).ok());
  const std::uint64_t word = 5;
  std::uint32_t next = 0, burst = 7;
  while (next < kCount) {
    burst = (burst * 1103515245u + 12345u) >> 8;
    for (std::uint32_t k = 0, n = 1 + burst % 48; k < n && next < kCount; ++k) {
      tokens.push_back({&answered, &failed, next});
      const bool large = next % 101 == 0;
      Status s = a.send({.dest = pair.to_b(), .dispatch = static_cast<std::uint16_t>(large ? 1 : 2),
                         .payload = large ? bytes_of(big) : std::as_bytes(std::span(&word, 1)),
                         .remote_done = {+[](void* t, Status r) {
                           auto* tok = static_cast<Token*>(t);
                           ++(*tok->answered)[tok->index];
                           if (!r.ok()) ++*tok->failed;
                         }, &tokens.back()}});
      if (s == StatusCode::no_resource) {
        tokens.pop_back();
        break;
      }
      REQUIRE(s.ok());
      ++next;
    }
    for (std::uint32_t k = 0; k < burst % 5; ++k) {
      (void)a.advance();
      (void)b.advance();
    }
  }
  // Stopped, with nothing to say so: the tail is answered in b's lull.
  advance_until(a, b, [&] {
    return std::all_of(answered.begin(), answered.end(), [](int n) { return n != 0; });
  });
  for (int i = 0; i < 200; ++i) {
    (void)a.advance();
    (void)b.advance();
  }
  CHECK(std::all_of(answered.begin(), answered.end(), [](int n) { return n == 1; }));
  CHECK(failed == 0);
  CHECK(dispatched == kCount - (kCount + 100) / 101);
  CHECK(b.stats().messages_acked == kCount);
  CHECK(b.ack_stats(pair.to_a()).messages_acked == kCount);
  CHECK(a.stats().messages_ack_received == kCount);
  CHECK(a.stats().acks_received == b.stats().acks_sent);
  CHECK(b.stats().acks_sent < kCount / 2);  // coalesced
  MESSAGE(b.backend_for(pair.to_a()) << ": " << kCount << " messages answered by " << b.stats().acks_sent
                                     << " acks");
}

// The conformance tests run over every backend in the registry
// (transport/src/backends.cpp): a backend added there without its pair in
// pair.hpp and in one of the lists above fails here.
template <typename... Pairs>
std::vector<std::string_view> backend_names() {
  return {Pairs::kBackend...};
}

TEST_CASE("every backend in the registry has a pair the conformance tests run over") {
  std::vector<std::string_view> pairs = backend_names<BACKENDS_HERE>();
  for (std::string_view name : backend_names<BACKENDS_RDMA>()) pairs.push_back(name);
  for (const ami::detail::RegisteredBackend& b : ami::detail::registered_backends()) {
    INFO("backend ", std::string(b.info.name));
    CHECK(std::find(pairs.begin(), pairs.end(), b.info.name) != pairs.end());
  }
}
