// The rendezvous pieces on their own: the stop policy, the registration
// cache, and the protocol driven step by step over the self backend, whose
// lanes a test can hold back and release descriptor by descriptor, so a STOP
// lands exactly where each case says. Then through a Client: what the stop
// counters say under each AMI_RNDV_MODE, and accept() when no registration
// is free.
#include <doctest/doctest.h>

#include <array>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "ami/ami.hpp"
#include "ami/device/region_table.hpp"
#include "eager/am_engine.hpp"
#include "rndv/policy.hpp"
#include "wire/packet.hpp"
#include "self_device.hpp"
#include "registration_cache.hpp"

using namespace ami;
using protocol::rndv::Mode;
using protocol::rndv::StopPath;
using protocol::rndv::StopReason;

TEST_CASE("stop policy: each input stops for its own reason; auto moves the rest by stop_put") {
  protocol::rndv::Inputs in{.total = 1 << 20, .received = 512, .has_buffer = true,
                            .zero_copy = false, .reception_load = 10, .low_water = 75,
                            .crossover = 1 << 20, .configured = Mode::automatic};
  CHECK_FALSE(protocol::rndv::decide(in).stop);  // small enough for the bounce path, buffers plenty

  auto d = protocol::rndv::decide([&] { auto i = in; i.crossover = 4096; return i; }());
  CHECK(d.stop);
  CHECK(d.reason == StopReason::large);
  CHECK(d.mode == wire::StopMode::stop_put);  // the sender PUTs the rest

  d = protocol::rndv::decide([&] { auto i = in; i.reception_load = 75; i.received = 300000; return i; }());
  CHECK(d.stop);
  CHECK(d.reason == StopReason::reception_low);
  CHECK(d.mode == wire::StopMode::stop_put);  // mid-message, short of reception buffers: the sender's work too
  CHECK(d.path == StopPath::stop_put);

  d = protocol::rndv::decide([&] { auto i = in; i.zero_copy = true; return i; }());
  CHECK(d.reason == StopReason::zero_copy);

  // A lane whose GET beats its PUT: auto is split_get; a mode asked for stays.
  d = protocol::rndv::decide([&] { auto i = in; i.crossover = 4096; i.get_beats_put = true; return i; }());
  CHECK(d.mode == wire::StopMode::split_get);
  CHECK(d.path == StopPath::split_get);
  CHECK(d.put_end == in.total);
  d = protocol::rndv::decide([&] { auto i = in; i.crossover = 4096; i.get_beats_put = true; i.configured = Mode::stop_put; return i; }());
  CHECK(d.mode == wire::StopMode::stop_put);

  // A peer competing for the host's CPUs: auto has the receiver GET the
  // whole rest alone (before the lane's GET preference); a mode asked for stays.
  d = protocol::rndv::decide([&] { auto i = in; i.crossover = 4096; i.oversubscribed = true; i.get_beats_put = true; return i; }());
  CHECK(d.stop);
  CHECK(d.mode == wire::StopMode::discard_get);
  CHECK(d.path == StopPath::discard_get);
  CHECK(d.put_end == in.total);
  d = protocol::rndv::decide([&] { auto i = in; i.crossover = 4096; i.oversubscribed = true; i.configured = Mode::stop_put;
                                      i.split_min = 16384; return i; }());
  CHECK(d.mode == wire::StopMode::stop_put);
  CHECK(d.put_end != in.total);  // shared with a GET, as without oversubscription

  // A lane whose GET beats the eager packets in flight: auto drops them and
  // GETs the whole rest (before the lane's GET-over-PUT preference); a mode
  // asked for stays.
  d = protocol::rndv::decide([&] { auto i = in; i.crossover = 4096; i.get_beats_eager = true; i.get_beats_put = true;
                                      i.split_min = 16384; return i; }());
  CHECK(d.stop);
  CHECK(d.mode == wire::StopMode::discard_get);
  CHECK(d.path == StopPath::discard_get);
  CHECK(d.put_end == in.total);
  d = protocol::rndv::decide([&] { auto i = in; i.crossover = 4096; i.get_beats_eager = true; i.configured = Mode::split_get; return i; }());
  CHECK(d.mode == wire::StopMode::split_get);
  d = protocol::rndv::decide([&] { auto i = in; i.crossover = 1u << 30; i.get_beats_eager = true; return i; }());
  CHECK_FALSE(d.stop);  // the preference picks a mode; it stops nothing by itself

  d = protocol::rndv::decide([&] { auto i = in; i.has_buffer = false; i.configured = Mode::stop_put; return i; }());
  CHECK(d.reason == StopReason::no_buffer);
  CHECK(d.mode == wire::StopMode::discard_get);  // on the wire: drop what still comes, whatever the mode
  CHECK(d.path == StopPath::discard);            // counted: nothing is fetched

  for (Mode m : {Mode::automatic, Mode::discard_get, Mode::split_get, Mode::stop_put}) {
    d = protocol::rndv::decide([&] { auto i = in; i.has_buffer = false; i.deferred = true; i.configured = m; return i; }());
    CHECK(d.reason == StopReason::deferred);
    CHECK(d.mode == wire::StopMode::discard_get);
    CHECK(d.path == StopPath::deferred_get);  // GET it all once accepted
  }

  for (Mode m : {Mode::discard_get, Mode::split_get, Mode::stop_put}) {
    d = protocol::rndv::decide([&] { auto i = in; i.zero_copy = true; i.configured = m; return i; }());
    CHECK(static_cast<int>(d.mode) == static_cast<int>(m));
    CHECK(static_cast<int>(d.path) == static_cast<int>(m) - 1);
  }
  // Reception pressure stops a message only while kPressureMin or more is
  // still to come.
  d = protocol::rndv::decide([&] {
    auto i = in;
    i.reception_load = 90;
    i.received = i.total - protocol::rndv::kPressureMin + 1;
    return i;
  }());
  CHECK_FALSE(d.stop);
  CHECK_FALSE(protocol::rndv::may_stop_later(protocol::rndv::kPressureMin - 1));
  CHECK(protocol::rndv::may_stop_later(protocol::rndv::kPressureMin));
  // A stop_put with a long rest shares it with a GET from where a
  // kSplitAlign multiple lies about half-way; a short rest, or another mode,
  // is not shared.
  d = protocol::rndv::decide([&] {
    auto i = in;
    i.crossover = 4096;
    i.split_min = protocol::rndv::kSplitMin;
    return i;
  }());
  CHECK(d.mode == wire::StopMode::stop_put);
  CHECK(d.put_end == (512 + ((1 << 20) - 512) / 2) / protocol::rndv::kSplitAlign * protocol::rndv::kSplitAlign);
  CHECK(protocol::rndv::decide([&] { auto i = in; i.crossover = 4096; return i; }()).put_end == in.total);
  CHECK(protocol::rndv::decide([&] {
          auto i = in;
          i.crossover = 4096;
          i.split_min = protocol::rndv::kSplitMin;
          i.received = i.total - protocol::rndv::kSplitMin + 1;
          return i;
        }()).put_end == in.total);
  CHECK(protocol::rndv::decide([&] {
          auto i = in;
          i.crossover = 4096;
          i.split_min = protocol::rndv::kSplitMin;
          i.configured = Mode::split_get;
          return i;
        }()).put_end == in.total);
  // Nothing left to stop once every byte is in.
  CHECK_FALSE(protocol::rndv::decide([&] { auto i = in; i.received = i.total; i.zero_copy = true; return i; }()).stop);
}

namespace {

struct Registry {
  device::RegionTable regions{1, 0, 64};
  int registered = 0;
  int deregistered = 0;
  bool fail = false;
  detail::RegistrationCache make(detail::RegistrationCache::Limits limits) {
    return detail::RegistrationCache(
        [this](void* a, std::size_t n, RemoteKey& key, LocalKeys& local) {
          if (fail) return Status{StatusCode::no_resource, "refused"};
          ++registered;
          local = {7, 8, 9, 10};
          return regions.add(a, n, key);
        },
        [this](std::uint32_t region) {
          ++deregistered;
          regions.remove(region);
        },
        limits, 4096);
  }
};

}  // namespace

TEST_CASE("registration cache: whole pages, shared while in use, idle ones kept and evicted oldest first") {
  Registry r;
  alignas(4096) static std::byte memory[16 * 4096];
  {
    auto cache = r.make({.max_entries = 3, .max_bytes = 1 << 20, .idle = 2});
    device::Registration a, b, c, d;
    REQUIRE(cache.acquire(memory + 100, 5000, a).ok());  // pages 0-1
    CHECK(a.key.address == reinterpret_cast<std::uintptr_t>(memory));
    CHECK(a.key.length == 2 * 4096);
    CHECK(a.local_keys == LocalKeys{7, 8, 9, 10});
    REQUIRE(cache.acquire(memory + 4096, 10, b).ok());  // inside pages 0-1: shared
    CHECK(b.key == a.key);
    CHECK(r.registered == 1);
    CHECK(cache.counters().hits == 1);
    cache.release(a);
    cache.release(b);
    CHECK(cache.idle() == 1);
    CHECK(r.deregistered == 0);  // kept idle
    REQUIRE(cache.acquire(memory + 8, 8, c).ok());  // hit on the idle one
    CHECK(r.registered == 1);
    cache.release(c);

    // Three more distinct ranges: the cache holds 3, two of them idle at most.
    device::Registration e[3];
    for (int i = 0; i < 3; ++i) REQUIRE(cache.acquire(memory + (4 + 3 * i) * 4096, 100, e[i]).ok());
    CHECK(r.registered == 4);
    CHECK(r.deregistered == 1);  // the idle one made room
    CHECK(cache.in_use() == 3);
    // Full of registrations in use: refused, nothing leaked.
    Status s = cache.acquire(memory + 15 * 4096, 100, d);
    CHECK(s == StatusCode::no_resource);
    CHECK(to_string(s).find("AMI_RCACHE_MAX_ENTRIES") != std::string::npos);
    for (auto& x : e) cache.release(x);
    CHECK(cache.idle() == 2);  // the third was dropped at once
    CHECK(r.deregistered == 2);
    // A failed registration leaves the cache as it was.
    r.fail = true;
    CHECK_FALSE(cache.acquire(memory + 15 * 4096 + 8, 8, d).ok());
    CHECK(cache.idle() == 2);
  }
  CHECK(r.deregistered == r.registered);  // the destructor drops the rest
}

TEST_CASE("registration cache: no idle entries (as with verbs) deregisters at the last release; bytes bound") {
  Registry r;
  alignas(4096) static std::byte memory[8 * 4096];
  auto cache = r.make({.max_entries = 8, .max_bytes = 3 * 4096, .idle = 0});
  device::Registration a, b;
  REQUIRE(cache.acquire(memory, 2 * 4096, a).ok());
  CHECK(cache.acquire(memory + 4 * 4096, 2 * 4096, b) == StatusCode::no_resource);  // 4 pages > 3
  cache.release(a);
  CHECK(r.deregistered == 1);
  CHECK(cache.bytes() == 0);
  CHECK(cache.acquire(nullptr, 1, b) == StatusCode::invalid_argument);
}

namespace {

// Contexts 0 (a, the sender) and 1 (b, the receiver) of one task over self,
// with registration caches, both engines advanced by hand.
struct Rig {
  static constexpr std::uint32_t kCell = 1024;  // packets of at most 1000 bytes
  Registry registry;
  self::SelfDomain domain;
  self::SelfDevice da, db;
  ContextStats sa, sb;
  detail::RegistrationCache ca, cb;
  protocol::AmEngine ea, eb;
  std::vector<std::uint8_t> source, target;
  int received = 0;
  int sent = 0;
  Status receive_status, send_status;

  // sender_crossover: the sender's own AMI_RNDV_CROSSOVER, when it differs
  // from the receiver's (it paces its eager packets by it).
  Rig(Mode mode, std::uint32_t fifo, std::uint32_t queue, std::optional<std::uint64_t> crossover,
      unsigned low_water = 75, std::optional<std::optional<std::uint64_t>> sender_crossover = {})
      : domain(0, 2, queue, kCell, registry.regions), da(domain, 0, fifo), db(domain, 1, fifo),
        ca(registry.make({})), cb(registry.make({})),
        ea({.tasks = 1, .contexts = 2,
            .options = {.max_requests = 64, .rndv_mode = mode,
                        .rndv_crossover = sender_crossover.value_or(crossover), .rndv_low_water = low_water}}, sa),
        eb({.tasks = 1, .contexts = 2,
            .options = {.max_requests = 64, .rndv_mode = mode, .rndv_crossover = crossover,
                        .rndv_low_water = low_water}}, sb) {
    ea.add_device(da);
    eb.add_device(db);
    ea.set_registrar(&ca);
    eb.set_registrar(&cb);
    REQUIRE(eb.set_dispatch(3, {&Rig::handler, this}).ok());
    REQUIRE(eb.set_dispatch(4, {+[](void*, const Incoming&, Receive*) {}, nullptr}).ok());
  }
  static void handler(void* c, const Incoming& in, Receive* recv) {
    auto* r = static_cast<Rig*>(c);
    REQUIRE(recv != nullptr);
    r->target.assign(in.total_bytes, 0);
    recv->buffer = r->target.data();
    recv->done = {+[](void* c, Status s) {
      auto* r = static_cast<Rig*>(c);
      r->receive_status = s;
      ++r->received;
    }, r};
  }
  void send(std::size_t n) {
    source.resize(n);
    for (std::size_t i = 0; i < n; ++i) source[i] = static_cast<std::uint8_t>(i * 13 + (i >> 10));
    REQUIRE(ea.send({.dest = {0, 1}, .dispatch = 3, .payload = std::as_bytes(std::span(source)),
                     .local_done = {+[](void* c, Status s) {
                       auto* r = static_cast<Rig*>(c);
                       r->send_status = s;
                       ++r->sent;
                     }, this}}).ok());
  }
  // Executes what the sender's lane may carry without letting the sender's
  // engine see completions (so it injects nothing more).
  void carry(std::uint64_t n) {
    da.release(1, n);
    (void)da.progress(ea, 0);
  }
  void finish() {
    da.hold(1, false);
    for (int i = 0; i < 100000 && (received == 0 || sent == 0); ++i) {
      (void)ea.advance();
      (void)eb.advance();
    }
    REQUIRE(received == 1);
    REQUIRE(sent == 1);
    CHECK(receive_status.ok());
    CHECK(send_status.ok());
    CHECK(target == source);
    CHECK(sa.malformed_packets == 0);
    CHECK(sb.malformed_packets == 0);
    for (int i = 0; i < 10; ++i) {  // acks and ends drain; records go
      (void)ea.advance();
      (void)eb.advance();
    }
    CHECK(ca.in_use() == 0);
    CHECK(cb.in_use() == 0);
  }
  // The eager packets of a message its receiver is expected to stop start
  // at 512 bytes, headers included; the first carries the rendezvous info
  // too.
  std::uint64_t first_payload() const {
    return 512 - sizeof(ami::wire::PacketHeader) - ami::wire::RendezvousInfo::kBytes;
  }
  // Any other message goes in whole packets (the cell's 1000 bytes) from the first.
  static std::uint64_t whole_payload(bool first) {
    return 1000 - sizeof(ami::wire::PacketHeader) - (first ? ami::wire::RendezvousInfo::kBytes : 0);
  }
};

const Mode kModes[] = {Mode::discard_get, Mode::split_get, Mode::stop_put};

}  // namespace

TEST_CASE("STOP before any eager packet after the first: nothing arrives late, the rest comes by RDMA") {
  for (Mode mode : kModes) {
    CAPTURE(static_cast<int>(mode));
    Rig r(mode, 4, 64, 0);
    r.da.hold(1, true);
    // Three held messages fill the FIFO but one slot: the big message gets
    // only its first packet in.
    const std::uint8_t small[4] = {1, 2, 3, 4};
    for (int i = 0; i < 3; ++i)
      REQUIRE(r.ea.send({.dest = {0, 1}, .dispatch = 4, .payload = std::as_bytes(std::span(small))}).ok());
    r.send(100000 + 3);
    r.carry(4);
    (void)r.eb.advance();  // the header: stop
    (void)r.eb.advance();  // the STOP leaves
    CHECK(r.sb.rndv_decisions == 1);
    (void)r.ea.advance();  // STOP in: nothing more goes eagerly
    CHECK(r.sa.rndv_stopped == 1);
    CHECK(r.sa.bytes_sent == 12 + r.first_payload());
    r.finish();
    CHECK(r.sb.rndv_late_bytes == 0);
    const std::uint64_t rest = r.source.size() - r.first_payload();
    if (mode == Mode::discard_get) CHECK(r.sb.rndv_get_bytes == r.source.size());
    if (mode == Mode::split_get) CHECK(r.sb.rndv_get_bytes == rest);
    if (mode == Mode::stop_put) {
      // A rest this long is shared: the sender PUTs the lower part, the
      // receiver GETs the upper one.
      CHECK(r.sa.rndv_put_bytes > 0);
      CHECK(r.sb.rndv_get_bytes > 0);
      CHECK(r.sa.rndv_put_bytes + r.sb.rndv_get_bytes == rest);
    }
  }
}

TEST_CASE("stop_put: a long rest is shared between the sender's PUT and the receiver's GET; a short one is not") {
  for (std::uint64_t size : {4 * protocol::rndv::kSplitMin + 9, protocol::rndv::kSplitMin / 2 + 9}) {
    CAPTURE(size);
    Rig r(Mode::stop_put, 4, 64, 0);
    r.da.hold(1, true);
    const std::uint8_t small[4] = {1, 2, 3, 4};
    for (int i = 0; i < 3; ++i)
      REQUIRE(r.ea.send({.dest = {0, 1}, .dispatch = 4, .payload = std::as_bytes(std::span(small))}).ok());
    r.send(size);
    r.carry(4);  // the three small ones and the first packet only
    (void)r.eb.advance();
    (void)r.eb.advance();
    (void)r.ea.advance();
    REQUIRE(r.sa.rndv_stopped == 1);
    r.finish();
    const std::uint64_t rest = size - r.first_payload();
    if (rest >= protocol::rndv::kSplitMin) {
      // The halves meet at a multiple of kSplitAlign about half-way; the
      // receiver GETs from its stop on, and the sender's buffer is free only
      // once the receiver acked.
      const std::uint64_t put_end = r.first_payload() + r.sa.rndv_put_bytes;
      CHECK(put_end % protocol::rndv::kSplitAlign == 0);
      CHECK(r.sb.rndv_get_bytes == size - put_end);
      CHECK(r.sa.rndv_put_bytes > rest / 2 - protocol::rndv::kSplitAlign);
      CHECK(r.sa.rndv_put_bytes <= rest / 2);
      CHECK(r.sb.messages_acked == 1);
      CHECK(r.sa.messages_ack_received == 1);
    } else {
      CHECK(r.sa.rndv_put_bytes == rest);  // all of it by PUT; the fin settles it, no ack
      CHECK(r.sb.rndv_get_bytes == 0);
      CHECK(r.sb.messages_acked == 0);
    }
  }
}

TEST_CASE("STOP between eager packets: late ones are dropped by discard_get, kept by split_get and stop_put") {
  for (Mode mode : kModes) {
    CAPTURE(static_cast<int>(mode));
    Rig r(mode, 8, 64, 0);
    r.da.hold(1, true);
    r.send(64 * 1024 + 7);  // eight packets go into the FIFO, the rest waits
    const std::uint64_t injected = r.sa.bytes_sent;
    r.carry(1);
    (void)r.eb.advance();
    (void)r.eb.advance();
    (void)r.ea.advance();  // STOP: eight packets were injected, seven are still held
    CHECK(r.sa.rndv_stopped == 1);
    CHECK(r.sa.bytes_sent == injected);
    r.finish();
    const std::uint64_t late = injected - r.first_payload();
    CHECK(r.sb.rndv_late_bytes == late);
    const std::uint64_t rest = r.source.size() - injected;
    if (mode == Mode::discard_get) {
      CHECK(r.sb.discarded_bytes == late);
      CHECK(r.sb.rndv_get_bytes == r.source.size());
    } else {
      CHECK(r.sb.discarded_bytes == 0);
      if (mode == Mode::split_get) CHECK(r.sb.rndv_get_bytes == rest);
      if (mode == Mode::stop_put) {  // (a long rest: shared with the receiver's GET)
        CHECK(r.sa.rndv_put_bytes + r.sb.rndv_get_bytes == rest);
        CHECK(r.sb.rndv_get_bytes > 0);
      }
    }
  }
}

TEST_CASE("STOP after the last eager packet: the sender answers with everything sent, nothing moves twice") {
  for (Mode mode : kModes) {
    CAPTURE(static_cast<int>(mode));
    // (A sender that expects no stop does not pace its eager packets: all of
    // them are in the FIFO before the receiver sees the first.)
    Rig r(mode, 64, 64, 0, 75, std::uint64_t{1} << 40);
    r.da.hold(1, true);
    r.send(20000 + 1);  // every packet fits in the FIFO
    // (Eager packets go out a burst per pass of the work queue.)
    for (int i = 0; i < 10 && r.sa.bytes_sent < r.source.size(); ++i) (void)r.ea.advance();
    CHECK(r.sa.bytes_sent == r.source.size());
    r.carry(1);
    (void)r.eb.advance();
    (void)r.eb.advance();
    (void)r.ea.advance();
    CHECK(r.sa.rndv_stopped == 1);
    r.finish();
    CHECK(r.sb.rndv_late_bytes == r.source.size() - Rig::whole_payload(true));
    CHECK(r.sa.rndv_put_bytes == 0);  // stop_put: nothing left to PUT
    if (mode == Mode::discard_get) CHECK(r.sb.rndv_get_bytes == r.source.size());
    // split_get GETs its bottom half before it knows; the cts says the middle is covered.
    if (mode == Mode::split_get) CHECK(r.sb.rndv_get_bytes < r.source.size());
  }
}

TEST_CASE("eager packets grow only for a message its receiver is expected to stop") {
  // Crossover 4000: after a whole first packet, 3000 more bytes go eagerly;
  // 5000 more would be stopped, so that message starts at 512 bytes.
  for (const std::size_t extra : {std::size_t{3000}, std::size_t{5000}}) {
    CAPTURE(extra);
    const bool stopped = extra > 4000;
    Rig r(Mode::automatic, 64, 64, 4000);
    r.da.hold(1, true);
    r.send(Rig::whole_payload(true) + extra);
    (void)r.ea.advance();
    // What went before the receiver saw anything: paced, a first packet
    // of 512 bytes and one more (grown to a whole one); not, the whole
    // message in whole packets.
    if (stopped) {
      CHECK(r.sa.packets_sent == 2);
      CHECK(r.sa.bytes_sent == r.first_payload() + Rig::whole_payload(false));
    } else {
      CHECK(r.sa.bytes_sent == r.source.size());
      CHECK(r.sa.packets_sent == 1 + (extra + Rig::whole_payload(false) - 1) / Rig::whole_payload(false));
    }
    r.finish();
    CHECK(r.sa.rndv_stopped == (stopped ? 1 : 0));
    if (!stopped) CHECK(r.sb.rndv_get_bytes + r.sa.rndv_put_bytes == 0);  // every byte came eagerly
  }
}

TEST_CASE("a message its receiver will stop at the first packet has its eager packets paced by completions") {
  for (Mode mode : {Mode::automatic, Mode::discard_get, Mode::split_get, Mode::stop_put}) {
    CAPTURE(static_cast<int>(mode));
    Rig r(mode, 64, 64, 0);  // every byte past the first packet is more than the crossover
    r.da.hold(1, true);
    r.send(64 * 1024 + 7);
    // The FIFO has room for the whole message, but while nothing completes
    // only the first packet and one more go in, however often the sender
    // advances.
    for (int i = 0; i < 10; ++i) (void)r.ea.advance();
    const std::uint64_t second = 1000 - sizeof(wire::PacketHeader);  // (packets grow to the cell's 1000 bytes)
    CHECK(r.sa.bytes_sent == r.first_payload() + second);
    r.carry(1);            // the first packet's completion frees no room: one more is still in flight
    for (int i = 0; i < 3; ++i) (void)r.ea.advance();
    CHECK(r.sa.bytes_sent == r.first_payload() + 2 * second);
    (void)r.eb.advance();  // the first packet: stop
    (void)r.eb.advance();  // the STOP leaves
    (void)r.ea.advance();  // STOP in: what was not injected never goes eagerly
    CHECK(r.sa.rndv_stopped == 1);
    r.finish();
    CHECK(r.sb.rndv_late_bytes == 2 * second);
    const std::uint64_t rest = r.source.size() - r.first_payload() - 2 * second;
    if (mode == Mode::automatic || mode == Mode::stop_put) {
      CHECK(r.sa.rndv_put_bytes + r.sb.rndv_get_bytes == rest);
      CHECK(r.sa.rndv_put_bytes > 0);
      CHECK(r.sb.rndv_get_bytes > 0);
    }
    if (mode == Mode::split_get) CHECK(r.sb.rndv_get_bytes == rest);
    if (mode == Mode::discard_get) CHECK(r.sb.rndv_get_bytes == r.source.size());
  }
}

TEST_CASE("paced eager packets still bring the whole message when its receiver does not stop it") {
  // The sender expects a stop (its crossover is 0); the receiver takes
  // everything eagerly (its crossover is 1 TiB).
  Rig r(Mode::automatic, 64, 64, std::uint64_t{1} << 40, 75, std::uint64_t{0});
  r.send(200 * 1000 + 11);
  r.finish();
  CHECK(r.sa.rndv_stopped == 0);
  CHECK(r.sb.rndv_eager_complete == 1);
  CHECK(r.sb.rndv_late_bytes == 0);
  CHECK(r.sa.rndv_put_bytes == 0);
  CHECK(r.sb.rndv_get_bytes == 0);
}

TEST_CASE("the STOP is injected while the first packet is handled, before the rest of the arrivals") {
  Rig r(Mode::stop_put, 64, 64, 0);
  r.source.assign(protocol::rndv::kSplitMin / 2, 7);  // (not shared with a GET: the STOP is all that goes)
  device::Registration reg;
  REQUIRE(r.ca.acquire(r.source.data(), r.source.size(), reg).ok());
  const wire::PacketHeader h = wire::make_header(wire::PacketType::am_first, 3, (1ull << 63) | 1, r.source.size(),
                                                 1, 8, 0, wire::kRendezvous);
  std::vector<std::byte> p(sizeof h + wire::RendezvousInfo::kBytes + 8);
  std::memcpy(p.data(), &h, sizeof h);
  wire::RendezvousInfo{reg.key, reinterpret_cast<std::uintptr_t>(r.source.data())}.encode(p.data() + sizeof h,
                                                                                           r.da.key_id());
  device::Lane* back = r.db.lane({0, 0});
  REQUIRE(back != nullptr);
  const std::uint64_t before = back->fifo().injected();
  r.eb.on_packet({0, 0}, p);  // as a device hands it over, inside progress()
  CHECK(r.sb.rndv_stops_by_mode[2] == 1);
  CHECK(back->fifo().injected() == before + 1);  // already on its way, not left for the end of the poll
  r.ca.release(reg);
}

TEST_CASE("a stop decided mid-message, when reception buffers run low, keeps what came (auto: stop_put)") {
  Rig r(Mode::automatic, 64, 8, std::uint64_t{1} << 40, 50);
  r.da.hold(1, true);
  r.send(64 * 1024);
  r.carry(1);
  (void)r.eb.advance();  // 1 of 8 cells in use: go on eagerly
  CHECK(r.sb.rndv_decisions == 1);
  CHECK(r.sa.rndv_stopped == 0);
  r.carry(5);
  (void)r.eb.advance();  // 5 of 8 cells in use at the second packet: stop
  CHECK(r.sb.rndv_stops_by_reason[2] == 1);  // reception_low
  CHECK(r.sb.rndv_stops_by_mode[2] == 1);    // stop_put: the sender moves the rest
  r.finish();
  CHECK(r.sb.discarded_bytes == 0);
  CHECK(r.sa.rndv_put_bytes > 0);
}

TEST_CASE("after the first packet the receiver asks the policy only while reception pressure could stop it") {
  Rig r(Mode::automatic, 64, 64, std::uint64_t{1} << 40);  // never stopped for its size
  constexpr std::uint64_t kSize = 8000;  // packets of 416 B, then 960 B
  r.send(kSize);
  r.finish();
  // Asked at the first packet and at each later one that leaves at least
  // kPressureMin to come: 7584, 6624, 5664, 4704 bytes; not at 3744 and after.
  std::uint64_t asked = 0;
  for (std::uint64_t left = kSize - r.first_payload(); left >= protocol::rndv::kPressureMin; left -= 960) ++asked;
  CHECK(asked == 4);
  CHECK(r.sb.rndv_decisions == asked);
  CHECK(r.sb.rndv_eager_complete == 1);
}

TEST_CASE("rendezvous packets that name nothing live are dropped and counted") {
  Rig r(Mode::automatic, 16, 64, 0);
  auto feed = [&](protocol::AmEngine& e, const wire::PacketHeader& h, std::size_t payload) {
    std::vector<std::byte> p(sizeof h + payload);
    std::memcpy(p.data(), &h, sizeof h);
    e.on_packet({0, 1}, p);
  };
  feed(r.ea, wire::make_header(wire::PacketType::stop, 1, (1ull << 63) | 5, 0, 9, 0, 0), 0);
  feed(r.eb, wire::make_header(wire::PacketType::cts, 0, (1ull << 63) | 5, 100, 10, 0, 0), 0);
  feed(r.eb, wire::make_header(wire::PacketType::fin, 0, 12345, 100, 10, 0, 0), 0);
  // A first packet whose key does not cover the message.
  wire::PacketHeader h = wire::make_header(wire::PacketType::am_first, 3, (1ull << 63) | 1, 1 << 20, 1, 8, 0,
                                           wire::kRendezvous);
  std::vector<std::byte> p(sizeof h + wire::RendezvousInfo::kBytes + 8);
  std::memcpy(p.data(), &h, sizeof h);
  RemoteKey key{.job = 1, .task = 0, .region = 0, .generation = 1, .address = 4096, .length = 100};
  wire::RendezvousInfo{key, 4096}.encode(p.data() + sizeof h, r.db.key_id());
  r.eb.on_packet({0, 0}, p);
  CHECK(r.sa.malformed_by_reason[9] == 1);
  CHECK(r.sb.malformed_by_reason[9] == 3);
  CHECK(r.received == 0);
}

// ---- Through a Client: AMI_RNDV_MODE, the stop counters, accept() ---------

namespace {

Config self_config(const char* name = nullptr, const char* value = nullptr) {
  Config c;
  REQUIRE(c.set("AMI_BACKENDS", "self").ok());
  if (name != nullptr) REQUIRE(c.set(name, value).ok());
  return c;
}

struct Count {
  int calls = 0;
  int failed = 0;
  static void fn(void* p, Status s) {
    auto* c = static_cast<Count*>(p);
    ++c->calls;
    if (!s.ok()) ++c->failed;
  }
  Callback cb() { return {&Count::fn, this}; }
};

std::vector<std::uint8_t> pattern(std::size_t n, unsigned seed) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>(i * seed + (i >> 12));
  return v;
}

template <class Pred>
bool advance_both(Context& a, Context& b, Pred done) {
  for (int i = 0; i < 1000000 && !done(); ++i) {
    (void)a.advance();
    (void)b.advance();
  }
  return done();
}

}  // namespace

TEST_CASE("stops are counted by the path the message took, for every AMI_RNDV_MODE") {
  constexpr std::size_t kBytes = 256 << 10;  // many packets on self, far above its crossover
  struct Case {
    const char* mode;
    std::size_t zero_copy_path;  // where a stop with a buffer is counted
  };
  for (const Case& k : {Case{"auto", 2}, Case{"discard_get", 0}, Case{"split_get", 1}, Case{"stop_put", 2}}) {
    CAPTURE(k.mode);
    Client client(ClientOptions{.name = "test", .contexts = 2, .job = {}, .config = self_config("AMI_RNDV_MODE", k.mode)});
    Context& a = client.context(0);
    Context& b = client.context(1);
    struct Receiver {
      std::vector<std::uint8_t> kept, later;
      Deferred deferred;
      Count dropped, kept_done, later_done;
    } r;
    // 1: no buffer (its data is dropped); 2: deferred; 3: a buffer, zero_copy.
    REQUIRE(b.set_dispatch(1, {+[](void* p, const Incoming&, Receive* recv) {
                             if (recv != nullptr) recv->done = static_cast<Receiver*>(p)->dropped.cb();
                           }, &r}).ok());
    REQUIRE(b.set_dispatch(2, {+[](void* p, const Incoming& in, Receive* recv) {
                             REQUIRE(in.can_defer);
                             recv->defer = &static_cast<Receiver*>(p)->deferred;
                           }, &r}).ok());
    REQUIRE(b.set_dispatch(3, {+[](void* p, const Incoming& in, Receive* recv) {
                             auto* x = static_cast<Receiver*>(p);
                             x->kept.assign(in.total_bytes, 0);
                             recv->buffer = x->kept.data();
                             recv->zero_copy = true;
                             recv->done = x->kept_done.cb();
                           }, &r}).ok());
    const auto source = pattern(kBytes, 7);
    Count sent;
    for (std::uint16_t id = 1; id <= 3; ++id)
      REQUIRE(a.send({.dest = {0, 1}, .dispatch = id, .payload = std::as_bytes(std::span(source)),
                      .local_done = sent.cb()}).ok());
    REQUIRE(advance_both(a, b, [&] { return r.deferred.id != 0; }));
    r.later.assign(r.deferred.total_bytes, 0);
    REQUIRE(b.accept(r.deferred, r.later.data(), r.later_done.cb()).ok());
    REQUIRE(advance_both(a, b, [&] {
      return sent.calls == 3 && r.dropped.calls == 1 && r.kept_done.calls == 1 && r.later_done.calls == 1;
    }));
    CHECK(sent.failed == 0);
    CHECK(r.kept_done.failed + r.later_done.failed + r.dropped.failed == 0);
    CHECK(r.kept == source);
    CHECK(r.later == source);

    const ContextStats& s = b.stats();
    CHECK(s.rndv_stops_by_reason[static_cast<std::size_t>(StopReason::no_buffer)] == 1);
    CHECK(s.rndv_stops_by_reason[static_cast<std::size_t>(StopReason::deferred)] == 1);
    CHECK(s.rndv_stops_by_reason[static_cast<std::size_t>(StopReason::zero_copy)] == 1);
    // Expect: the buffered message where the mode says; the other two on
    // their own paths whatever it says, and never as discard_get's.
    std::array<std::uint64_t, ContextStats::kStopModes> want{};
    want[k.zero_copy_path] = 1;
    want[3] = 1;  // discard
    want[4] = 1;  // deferred_get
    for (std::size_t m = 0; m < ContextStats::kStopModes; ++m) {
      CAPTURE(stop_mode_name(m));
      CHECK(s.rndv_stops_by_mode[m] == want[m]);
    }
    // The deferred message came by one GET of all of it, in every mode.
    CHECK(s.rndv_get_bytes >= kBytes);
    CHECK(a.stats().rndv_stopped == 3);
    CHECK(s.malformed_packets == 0);
  }
  CHECK(stop_mode_name(3) == "discard");
  CHECK(stop_mode_name(4) == "deferred_get");
}

TEST_CASE("accept() says no_resource while registrations in use fill the cache; the message waits, a retry brings it") {
  // One registration per context: the first accepted message holds it
  // until its GET is done.
  Client client(ClientOptions{.name = "test", .contexts = 2, .job = {},
                              .config = self_config("AMI_RCACHE_MAX_ENTRIES", "1")});
  Context& a = client.context(0);
  Context& b = client.context(1);
  constexpr std::size_t kBytes = 300 << 10;
  const auto first = pattern(kBytes, 3), second = pattern(kBytes, 5);
  // The sender's buffers are registered already: it needs no cache entry.
  Memory m1, m2;
  REQUIRE(client.register_memory(const_cast<std::uint8_t*>(first.data()), first.size(), m1).ok());
  REQUIRE(client.register_memory(const_cast<std::uint8_t*>(second.data()), second.size(), m2).ok());
  std::vector<Deferred> deferred;
  deferred.reserve(2);
  REQUIRE(b.set_dispatch(9, {+[](void* p, const Incoming& in, Receive* recv) {
                           REQUIRE(in.can_defer);
                           auto* d = static_cast<std::vector<Deferred>*>(p);
                           d->emplace_back();
                           recv->defer = &d->back();
                         }, &deferred}).ok());
  Count sent;
  REQUIRE(a.send({.dest = {0, 1}, .dispatch = 9, .payload = std::as_bytes(std::span(first)),
                  .local_done = sent.cb(), .memory = &m1}).ok());
  REQUIRE(a.send({.dest = {0, 1}, .dispatch = 9, .payload = std::as_bytes(std::span(second)),
                  .local_done = sent.cb(), .memory = &m2}).ok());
  REQUIRE(advance_both(a, b, [&] { return deferred.size() == 2 && deferred[0].id != 0 && deferred[1].id != 0; }));

  std::vector<std::uint8_t> into1(kBytes), into2(kBytes);
  Count got1, got2;
  REQUIRE(b.accept(deferred[0], into1.data(), got1.cb()).ok());
  // Expect: no_resource, naming accept, the cause and what to do; twice,
  // since nothing changed.
  for (int i = 0; i < 2; ++i) {
    const Status s = b.accept(deferred[1], into2.data(), got2.cb());
    REQUIRE(s == StatusCode::no_resource);
    CHECK(std::string(s.what()).find("accept:") == 0);
    CHECK(std::string(s.what()).find("AMI_RCACHE_MAX_ENTRIES") != std::string::npos);
    CHECK(std::string(s.what()).find("advance and retry") != std::string::npos);
  }
  // Advancing lets the first GET finish and release its registration; the
  // second message is still there to accept, and its sender still waits.
  REQUIRE(advance_both(a, b, [&] { return got1.calls == 1 && sent.calls == 1; }));
  for (int i = 0; i < 100; ++i) {
    (void)a.advance();
    (void)b.advance();
  }
  CHECK(sent.calls == 1);
  CHECK(got2.calls == 0);
  Status s = Status{StatusCode::no_resource};
  for (int i = 0; i < 1000 && s == StatusCode::no_resource; ++i) {
    s = b.accept(deferred[1], into2.data(), got2.cb());
    (void)a.advance();
    (void)b.advance();
  }
  REQUIRE_MESSAGE(s.ok(), to_string(s));
  REQUIRE(advance_both(a, b, [&] { return got2.calls == 1 && sent.calls == 2; }));
  CHECK(got1.failed + got2.failed + sent.failed == 0);
  CHECK(into1 == first);
  CHECK(into2 == second);
  CHECK(b.stats().malformed_packets == 0);
  // Accepted once: a third call names nothing waiting.
  CHECK(b.accept(deferred[1], into2.data(), {}) == StatusCode::invalid_argument);
}
