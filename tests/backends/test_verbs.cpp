// test_verbs.cpp — the verbs backend on a real RDMA port (soft-RoCE rxe0 in
// the tests/rxe VM): two tasks in one process, each a VerbsDomain with its
// VerbsDevices, knowing each other from their published addresses, lanes
// connected on first use by the handshake (or by rdma_cm), driven
// from one thread. verbs_main.cpp skips it where no port is active.
#include <doctest/doctest.h>

#include <endian.h>
#include <infiniband/verbs.h>
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ami/device/device.hpp"
#include "ami/device/region_table.hpp"
#include "ami/error.hpp"
#include "verbs_device.hpp"
#include "verbs_domain.hpp"

namespace {

using namespace std::chrono_literals;
using ami::Callback;
using ami::Endpoint;
using ami::Status;
using ami::StatusCode;
using ami::device::Descriptor;
using ami::device::DescriptorKind;
using ami::device::Lane;
using ami::verbs::VerbsDevice;
using ami::verbs::VerbsDomain;
using ami::verbs::VerbsLane;
using ami::verbs::VerbsOptions;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

VerbsOptions base_options() {
  VerbsOptions o;
  o.net_devices = env("AMI_NET_DEVICES");
  o.use_rdma_cm = false;
  return o;
}

std::byte pattern(std::size_t i, unsigned seed) {
  return static_cast<std::byte>((i * 131u + seed * 7u + 1u) & 0xFF);
}

struct Sink final : ami::device::PacketSink {
  struct Packet {
    Endpoint origin;
    std::vector<std::byte> bytes;
    std::optional<std::uint32_t> immediate;  // sent in its compact form
  };
  std::vector<Packet> packets;
  void on_packet(Endpoint origin, std::span<const std::byte> bytes) override {
    packets.push_back({origin, {bytes.begin(), bytes.end()}, std::nullopt});
  }
  void on_compact_packet(Endpoint origin, std::uint32_t immediate, std::span<const std::byte> rest) override {
    packets.push_back({origin, {rest.begin(), rest.end()}, immediate});
  }
  std::vector<std::pair<Endpoint, Status>> failed;
  void on_lane_failed(Endpoint peer, Status why) override { failed.emplace_back(peer, why); }
};

// Records every callback: which operation, in which order, with what status.
struct Recorder {
  struct Token {
    Recorder* recorder;
    int id;
  };
  struct Call {
    int id;
    Status status;
  };
  std::vector<Token> tokens;
  std::vector<Call> calls;
  explicit Recorder(int n) {
    tokens.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) tokens.push_back({this, i});
  }
  Callback callback(int id) {
    return {+[](void* cookie, Status s) {
              auto* t = static_cast<Token*>(cookie);
              t->recorder->calls.push_back({t->id, s});
            },
            &tokens[static_cast<std::size_t>(id)]};
  }
};

struct Task {
  Task(std::uint32_t task, std::uint16_t contexts, const VerbsOptions& o)
      : regions(7, task, 64), domain(task, 2, contexts, o, regions) {}
  ami::device::RegionTable regions;
  VerbsDomain domain;
  std::vector<std::unique_ptr<VerbsDevice>> devices;
  std::vector<Sink> sinks;
};

// Two tasks of a job of two, in this process.
struct Pair {
  explicit Pair(VerbsOptions o = base_options(), std::uint32_t fifo_depth = 64, std::uint16_t contexts = 1)
      : contexts(contexts),
        t{std::make_unique<Task>(0, contexts, o), std::make_unique<Task>(1, contexts, o)} {
    // Either method only learns the peer here: lanes connect on first use.
    const Status s0 = t[0]->domain.connect(1, t[1]->domain.local_address());
    const Status s1 = t[1]->domain.connect(0, t[0]->domain.local_address());
    REQUIRE_MESSAGE(s0.ok(), ami::to_string(s0));
    REQUIRE_MESSAGE(s1.ok(), ami::to_string(s1));
    for (auto& task : t) {
      task->sinks.resize(contexts);
      for (std::uint16_t c = 0; c < contexts; ++c)
        task->devices.push_back(std::make_unique<VerbsDevice>(task->domain, c, fifo_depth));
    }
  }

  VerbsDevice& device(int task, std::uint16_t context = 0) { return *t[task]->devices[context]; }
  Sink& sink(int task, std::uint16_t context = 0) { return t[task]->sinks[context]; }
  // The lane from (task, context) to the other task's peer_context, made on
  // first use; unless told not to, its connection is waited for (both tasks
  // advancing), so what is posted on it goes straight to the wire.
  Lane& lane(int task, std::uint16_t context = 0, std::uint16_t peer_context = 0, bool wait = true) {
    Lane* l = device(task, context).lane(Endpoint{static_cast<std::uint32_t>(1 - task), peer_context});
    REQUIRE(l != nullptr);
    auto& mine = made[task];
    if (std::find(mine.begin(), mine.end(), l) == mine.end()) mine.push_back(l);
    auto* v = static_cast<VerbsLane*>(l);
    if (wait) REQUIRE(run_until([&] { return v->ready() || v->broken(); }));
    return *l;
  }

  // One round of what Context::advance() does, for the given tasks.
  void advance(bool task0 = true, bool task1 = true) {
    for (int i = 0; i < 2; ++i) {
      if ((i == 0 && !task0) || (i == 1 && !task1)) continue;
      for (std::uint16_t c = 0; c < contexts; ++c) (void)device(i, c).progress(sink(i, c), 64);
      for (Lane* l : made[i]) l->fifo().complete();
    }
  }

  template <typename Done>
  bool run_until(Done done, std::chrono::seconds limit = 60s) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (!done()) {
      if (std::chrono::steady_clock::now() > end) return false;
      advance();
    }
    return true;
  }

  std::uint16_t contexts;
  std::unique_ptr<Task> t[2];
  std::vector<Lane*> made[2];  // each task's lanes made so far
};

bool post_packet(Lane& lane, std::span<const std::byte> header, std::span<const std::byte> payload,
                 Callback cb = {}, std::uint16_t compact_prefix = 0, std::uint32_t immediate = 0) {
  Descriptor* d = lane.fifo().try_reserve();
  if (d == nullptr) return false;
  d->kind = DescriptorKind::packet;
  d->packet.compact_prefix = compact_prefix;
  d->packet.immediate = immediate;
  d->packet.inline_len = static_cast<std::uint16_t>(header.size());
  if (!header.empty()) std::memcpy(d->packet.inline_data, header.data(), header.size());
  d->packet.payload = payload.data();
  d->packet.payload_len = static_cast<std::uint32_t>(payload.size());
  lane.fifo().commit(cb);
  return true;
}

struct Region {
  Region(VerbsDomain& domain, std::size_t bytes, unsigned seed)
      : domain(domain), number(next_number++), memory(bytes) {
    for (std::size_t i = 0; i < bytes; ++i) memory[i] = pattern(i, seed);
    const Status s = domain.register_region(number, memory.data(), bytes, lkey, rkey);
    REQUIRE_MESSAGE(s.ok(), ami::to_string(s));
    key.task = domain.task();
    REQUIRE(key.add_entry(domain.options().key_id, ami::verbs::rkey_entry(rkey)).ok());
    local_keys[domain.options().key_id] = lkey;
    key.address = reinterpret_cast<std::uintptr_t>(memory.data());
    key.length = bytes;
  }
  ~Region() { domain.deregister_region(number); }
  static inline std::uint32_t next_number = 0;
  VerbsDomain& domain;
  std::uint32_t number;
  std::vector<std::byte> memory;
  std::uint32_t lkey = 0, rkey = 0;
  ami::RemoteKey key;
  ami::LocalKeys local_keys{};
};

bool post_rdma(Lane& lane, DescriptorKind kind, Region& local, std::size_t local_offset, const Region& remote,
               std::size_t remote_offset, std::size_t bytes, Callback cb) {
  Descriptor* d = lane.fifo().try_reserve();
  if (d == nullptr) return false;
  d->kind = kind;
  d->rdma = ami::device::RdmaDescriptor{.local = local.memory.data() + local_offset,
                                        .length = bytes,
                                        .local_keys = local.local_keys,
                                        .remote_address = remote.key.address + remote_offset,
                                        .remote = remote.key};
  lane.fifo().commit(cb);
  return true;
}

void check_in_order_once(const Recorder& r, int n) {
  REQUIRE(r.calls.size() == static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) CHECK(r.calls[static_cast<std::size_t>(i)].id == i);
}

}  // namespace

TEST_CASE("the port, the GID and the published address") {
  VerbsOptions o = base_options();
  ami::device::RegionTable regions(7, 0, 8);
  VerbsDomain d(0, 2, 1, o, regions);
  MESSAGE(d.describe());
  CHECK(d.describe().find("verbs: ") == 0);
  if (!env("RXE_GID_INDEX").empty()) CHECK(d.port().gid_index == std::stoi(env("RXE_GID_INDEX")));
  if (d.port().link_layer == IBV_LINK_LAYER_ETHERNET) CHECK(d.port().roce_v2);
  CHECK(d.port().max_inline > 0);

  const auto mine = d.local_address();
  ami::verbs::DomainAddress a;
  REQUIRE(ami::verbs::DomainAddress::decode(mine, a).ok());
  CHECK(a.task == 0);
  CHECK(a.tasks == 2);
  REQUIRE(a.rendezvous.size() == 1);
  CHECK(a.rendezvous[0] == d.queues(0).ud->qp_num);
  CHECK(d.queue_pairs_made() == 0);  // no lane has a queue pair before it is used
  // The same size in a job of 4096 tasks: nothing in it grows with the job.
  {
    ami::device::RegionTable big_regions(7, 0, 8);
    VerbsDomain big(0, 4096, 1, o, big_regions);
    CHECK(big.local_address().size() == mine.size());
    CHECK(big.queue_pairs_made() == 0);
  }

  SUBCASE("malformed peer bytes are a status, never a crash") {
    ami::device::RegionTable r1(7, 1, 8);
    VerbsDomain peer(1, 2, 1, o, r1);
    auto theirs = peer.local_address();
    auto bad = theirs;
    CHECK(d.connect(1, std::span(bad).first(10)) == StatusCode::malformed_packet);
    bad[0] = std::byte{0};
    CHECK(d.connect(1, bad) == StatusCode::malformed_packet);
    bad = theirs;
    bad.push_back(std::byte{1});
    CHECK(d.connect(1, bad) == StatusCode::malformed_packet);
    bad = theirs;
    std::memset(bad.data() + ami::verbs::DomainAddress::kFixedBytes, 0, 4);  // UD QP number 0
    CHECK(d.connect(1, bad) == StatusCode::malformed_packet);
    CHECK(d.connect(1, mine) == StatusCode::invalid_argument);    // task 0's bytes, not task 1's
    CHECK(d.connect(0, theirs) == StatusCode::invalid_argument);  // connecting to itself
    CHECK_FALSE(d.knows(1));
    CHECK(d.connect(1, theirs).ok());
    CHECK(d.knows(1));
    CHECK(d.connect(1, theirs) == StatusCode::invalid_argument);  // twice
    CHECK(d.queue_pairs_made() == 0);
    CHECK(d.qp(0, Endpoint{1, 0}) == nullptr);
    CHECK(d.describe_lane(0, Endpoint{1, 0}).find("none") != std::string::npos);

    // perftest's banner fields for the lane: both ends' QPNs, once connected.
    REQUIRE(peer.connect(0, mine).ok());
    VerbsDevice dev0(d, 0, 16), dev1(peer, 0, 16);
    Sink s0, s1;
    auto* lane = static_cast<VerbsLane*>(dev0.lane(Endpoint{1, 0}));
    REQUIRE(lane != nullptr);
    const auto end = std::chrono::steady_clock::now() + 30s;
    while (!lane->ready() && std::chrono::steady_clock::now() < end) {
      (void)dev0.progress(s0, 64);
      (void)dev1.progress(s1, 64);
    }
    REQUIRE(lane->ready());
    CHECK(d.queue_pairs_made() == 1);
    CHECK(peer.queue_pairs_made() == 1);
    const std::string text = d.describe_lane(0, Endpoint{1, 0});
    MESSAGE(text);
    char qpn[32];
    std::snprintf(qpn, sizeof qpn, "QPN %#08x", d.qp(0, Endpoint{1, 0})->qp_num);
    CHECK(text.find(std::string(" local address: LID ")) != std::string::npos);
    CHECK(text.find(qpn) < text.find(" remote address:"));
    REQUIRE(peer.qp(0, Endpoint{0, 0}) != nullptr);
    std::snprintf(qpn, sizeof qpn, "QPN %#08x", peer.qp(0, Endpoint{0, 0})->qp_num);
    CHECK(text.find(qpn) > text.find(" remote address:"));
    CHECK(text.find(" Device          : " + d.port().device + "\n") != std::string::npos);
    CHECK(text.find(" Mtu             : ") != std::string::npos);
  }
  SUBCASE("queue invariants are checked at setup") {
    VerbsOptions bad = o;
    bad.sq_depth = 16;
    bad.signal_interval = 16;
    CHECK_THROWS_AS(VerbsDomain(0, 2, 1, bad, regions), ami::Error);
    CHECK_THROWS_AS(VerbsDevice(d, 0, 256), ami::Error);  // FIFO depth must stay below sq_depth
    CHECK_THROWS_AS(VerbsDevice(d, 0, 48), ami::Error);   // not a power of two
    bad = o;
    bad.doorbell_batch = 0;
    CHECK_THROWS_AS(VerbsDomain(0, 2, 1, bad, regions), ami::Error);
    bad = o;
    bad.max_rdma = 0;
    CHECK_THROWS_AS(VerbsDomain(0, 2, 1, bad, regions), ami::Error);
    bad = o;
    bad.net_devices = "no_such_device:1";
    CHECK_THROWS_AS(VerbsDomain(0, 2, 1, bad, regions), ami::Error);
    std::string why;
    CHECK_FALSE(VerbsDomain::available(&why, "no_such_device:1"));
    CHECK(why.find("no_such_device") != std::string::npos);
  }
}

TEST_CASE("receive buffers sized by the device's kind unless set") {
  ami::device::RegionTable regions(7, 0, 64);
  VerbsOptions o = base_options();
  {
    VerbsDomain d(0, 2, 1, o, regions);
    const bool software = d.port().software;
    CHECK(software == (d.port().device.rfind("rxe", 0) == 0 || d.port().device.rfind("siw", 0) == 0));
    CHECK(d.options().bounce_bytes == (software ? 128u * 1024 : 8u * 1024));
    CHECK(d.options().srq_depth == (software ? 128u : 512u));
    CHECK(d.options().staging_bytes >= 2 * d.options().bounce_bytes);
  }
  o.bounce_bytes = 4096;
  o.srq_depth = 64;
  VerbsDomain d(0, 2, 1, o, regions);
  CHECK(d.options().bounce_bytes == 4096);
  CHECK(d.options().srq_depth == 64);
  CHECK(d.describe().find("64 receive buffers of 4 KiB") != std::string::npos);
}

TEST_CASE("active-message packets both ways, byte for byte, across sizes and alignments") {
  Pair p;
  const std::size_t max = p.lane(0).max_packet();
  CHECK(max == p.t[0]->domain.options().bounce_bytes);
  std::vector<std::byte> source(max + 64);
  for (std::size_t i = 0; i < source.size(); ++i) source[i] = pattern(i, 3);
  const std::size_t headers[] = {0, 1, 16, 57, 320};
  const std::size_t payloads[] = {0, 1, 7, 64, 100, 255, 1000, 4096, 7000};
  const std::size_t offsets[] = {0, 1, 3, 8};

  struct Sent {
    std::size_t header, payload, offset;
  };
  std::vector<Sent> sent;
  for (std::size_t h : headers)
    for (std::size_t n : payloads)
      for (std::size_t off : offsets)
        if (h + n <= max) sent.push_back({h, n, off});
  sent.push_back({320, max - 320, 5});  // exactly max_packet()
  sent.push_back({0, max, 0});

  for (int from = 0; from < 2; ++from) {
    Lane& lane = p.lane(from);
    Sink& sink = p.sink(1 - from);
    sink.packets.clear();
    std::size_t next = 0;
    REQUIRE(p.run_until([&] {
      while (next < sent.size()) {
        const Sent& s = sent[next];
        std::vector<std::byte> header(s.header);
        for (std::size_t i = 0; i < s.header; ++i) header[i] = pattern(i, 11 + static_cast<unsigned>(next));
        if (!post_packet(lane, header, std::span(source).subspan(s.offset, s.payload))) break;
        ++next;
      }
      lane.ring();
      return sink.packets.size() == sent.size();
    }));
    for (std::size_t k = 0; k < sent.size(); ++k) {
      const Sent& s = sent[k];
      const auto& got = sink.packets[k];
      CHECK(got.origin == Endpoint{static_cast<std::uint32_t>(from), 0});
      REQUIRE(got.bytes.size() == s.header + s.payload);
      bool same = true;
      for (std::size_t i = 0; i < s.header; ++i)
        same = same && got.bytes[i] == pattern(i, 11 + static_cast<unsigned>(k));
      if (s.payload != 0)
        same = same && std::memcmp(got.bytes.data() + s.header, source.data() + s.offset, s.payload) == 0;
      CHECK_MESSAGE(same, "packet ", k, ": header ", s.header, " payload ", s.payload, " offset ", s.offset);
    }
  }
  CHECK(p.device(0).counters().dropped == 0);
  CHECK(p.device(1).counters().receive_errors == 0);
}

TEST_CASE("a packet's compact form goes as a SEND with immediate, without its prefix") {
  for (const bool enabled : {true, false}) {
    CAPTURE(enabled);
    VerbsOptions o = base_options();
    o.immediate = enabled;
    Pair p(o);
    const std::size_t max = p.lane(0).max_packet();
    std::vector<std::byte> source(max);
    for (std::size_t i = 0; i < source.size(); ++i) source[i] = pattern(i, 5);
    struct Sent {
      std::size_t header, prefix, payload;
    };
    // Inline and not, an empty rest, a whole bounce buffer, no compact form.
    const Sent sent[] = {{16, 16, 0}, {16, 16, 2}, {20, 16, 100}, {16, 16, 4096},
                         {144, 16, 4096}, {16, 16, max - 16}, {16, 0, 64}, {40, 40, 7}};
    Lane& lane = p.lane(0);
    Sink& sink = p.sink(1);
    std::size_t next = 0;
    REQUIRE(p.run_until([&] {
      for (; next < std::size(sent); ++next) {
        const Sent& s = sent[next];
        std::vector<std::byte> header(s.header);
        for (std::size_t i = 0; i < s.header; ++i) header[i] = pattern(i, 17 + static_cast<unsigned>(next));
        const auto imm = static_cast<std::uint32_t>(0xA5000000u + next);
        if (!post_packet(lane, header, std::span(source).first(s.payload), {},
                         static_cast<std::uint16_t>(s.prefix), imm))
          break;
      }
      lane.ring();
      return sink.packets.size() == std::size(sent);
    }));
    std::uint64_t compact = 0;
    for (std::size_t k = 0; k < std::size(sent); ++k) {
      CAPTURE(k);
      const Sent& s = sent[k];
      const auto& got = sink.packets[k];
      const std::size_t skip = enabled ? s.prefix : 0;
      if (skip != 0) {
        ++compact;
        REQUIRE(got.immediate.has_value());
        CHECK(*got.immediate == 0xA5000000u + k);
      } else {
        CHECK_FALSE(got.immediate.has_value());
      }
      REQUIRE(got.bytes.size() == s.header - skip + s.payload);
      bool same = true;
      for (std::size_t i = skip; i < s.header; ++i)
        same = same && got.bytes[i - skip] == pattern(i, 17 + static_cast<unsigned>(k));
      if (s.payload != 0)
        same = same && std::memcmp(got.bytes.data() + s.header - skip, source.data(), s.payload) == 0;
      CHECK(same);
    }
    CHECK(p.device(0).counters().compact_sent == compact);
  }
}

TEST_CASE("send_compact: a small packet's parts straight to the wire, the first of a burst only") {
  SUBCASE("taken: bytes and immediate arrive as a compact packet; the FIFO slot is counted") {
    Pair p;
    Lane& lane = p.lane(0);
    REQUIRE(lane.sends_compact());
    const std::size_t max_inline = p.t[0]->domain.port().max_inline;
    REQUIRE(max_inline >= 64);
    std::vector<std::byte> bytes(max_inline);
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = pattern(i, 9);
    struct Sent {
      std::size_t head, payload;
    };
    // Empty parts, a byte, unaligned splits, exactly the inline cap.
    const Sent sent[] = {{0, 0}, {0, 1}, {3, 0}, {5, 2}, {16, 48}, {7, max_inline - 7}};
    Sink& sink = p.sink(1);
    for (std::size_t k = 0; k < std::size(sent); ++k) {
      CAPTURE(k);
      const Sent& s = sent[k];
      const auto imm = static_cast<std::uint32_t>(0xA7000000u + k);
      const std::uint64_t before = lane.fifo().injected();
      // Spans are free on return: scribble over them before the packet arrives.
      std::vector<std::byte> head(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(s.head));
      std::vector<std::byte> payload(bytes.begin() + static_cast<std::ptrdiff_t>(s.head),
                                     bytes.begin() + static_cast<std::ptrdiff_t>(s.head + s.payload));
      REQUIRE(lane.send_compact(imm, head, payload));
      std::fill(head.begin(), head.end(), std::byte{0});
      std::fill(payload.begin(), payload.end(), std::byte{0});
      CHECK(lane.fifo().injected() == before + 1);
      REQUIRE(p.run_until([&] { return sink.packets.size() == k + 1; }));
      const auto& got = sink.packets[k];
      REQUIRE(got.immediate.has_value());
      CHECK(*got.immediate == imm);
      REQUIRE(got.bytes.size() == s.head + s.payload);
      CHECK(std::equal(got.bytes.begin(), got.bytes.end(), bytes.begin()));  // (memcmp: no null with 0)
    }
    CHECK(p.device(0).counters().compact_direct == std::size(sent));
    CHECK(p.device(0).counters().compact_sent == std::size(sent));
    // A descriptor after them, with a callback: its completion retires the
    // direct ones too, in order.
    Recorder r(1);
    const std::byte payload[8] = {};
    REQUIRE(post_packet(lane, std::span(payload, 8), std::span(payload), r.callback(0)));
    lane.ring();
    REQUIRE(p.run_until([&] { return r.calls.size() == 1; }));
    CHECK(r.calls[0].status.ok());
    CHECK(lane.fifo().counter().snapshot() == std::size(sent) + 1);
  }
  SUBCASE("refused, nothing done: later in a burst, bytes past the inline cap, something unposted") {
    VerbsOptions o = base_options();
    o.doorbell_batch = 4;
    Pair p(o);
    Lane& lane = p.lane(0);
    const std::size_t max_inline = p.t[0]->domain.port().max_inline;
    std::vector<std::byte> big(max_inline + 1);
    const std::byte two[2] = {std::byte{1}, std::byte{2}};
    CHECK_FALSE(lane.send_compact(0xA7000000u, {}, big));
    CHECK(lane.fifo().injected() == 0);
    REQUIRE(lane.send_compact(0xA7000001u, {}, two));  // the first of the burst
    CHECK_FALSE(lane.send_compact(0xA7000002u, {}, two));  // the second waits for a doorbell batch
    CHECK(lane.fifo().injected() == 1);
    // What the caller does then: a descriptor, held back by ring() ...
    REQUIRE(post_packet(lane, std::span(two), {}, {}, 0, 0));
    lane.ring();
    CHECK(lane.fifo().injected() == 2);
    // ... and while it waits unposted, nothing may pass it.
    CHECK_FALSE(lane.send_compact(0xA7000003u, {}, two));
    Sink& sink = p.sink(1);
    REQUIRE(p.run_until([&] { return sink.packets.size() == 2; }));
    CHECK(sink.packets[0].immediate == std::optional<std::uint32_t>(0xA7000001u));
    CHECK_FALSE(sink.packets[1].immediate.has_value());
    // A new burst (progress() ran): taken again, behind them.
    REQUIRE(lane.send_compact(0xA7000004u, {}, two));
    REQUIRE(p.run_until([&] { return sink.packets.size() == 3; }));
    CHECK(sink.packets[2].immediate == std::optional<std::uint32_t>(0xA7000004u));
    CHECK(p.device(0).counters().compact_direct == 2);
  }
  SUBCASE("a device that sends no immediates takes none") {
    VerbsOptions o = base_options();
    o.immediate = false;
    Pair p(o);
    Lane& lane = p.lane(0);
    const std::byte two[2] = {};
    CHECK_FALSE(lane.sends_compact());
    CHECK_FALSE(lane.send_compact(0xA7000000u, {}, two));
    CHECK(lane.fifo().injected() == 0);
  }
}

TEST_CASE("PUT and GET with registered regions") {
  Pair p;
  constexpr std::size_t kBytes = 1 << 20;
  Region a(p.t[0]->domain, kBytes, 1), b(p.t[1]->domain, kBytes, 2);
  const std::size_t sizes[] = {0, 1, 13, 4096, 65537, kBytes - 64};
  const std::size_t offsets[] = {0, 1, 7, 64};
  Lane& lane = p.lane(0);
  for (std::size_t n : sizes)
    for (std::size_t off : offsets) {
      if (off + n > kBytes) continue;
      CAPTURE(n);
      CAPTURE(off);
      // PUT a's bytes at off into b at off / 2; then GET them back into a at off + 1.
      for (std::size_t i = 0; i < kBytes; ++i) a.memory[i] = pattern(i, static_cast<unsigned>(n + off));
      Recorder r(2);
      REQUIRE(post_rdma(lane, DescriptorKind::put, a, off, b, off / 2, n, r.callback(0)));
      lane.ring();
      REQUIRE(p.run_until([&] { return r.calls.size() == 1; }));
      CHECK(r.calls[0].status.ok());
      CHECK(std::memcmp(b.memory.data() + off / 2, a.memory.data() + off, n) == 0);
      const std::size_t back = off + 1 + n <= kBytes ? off + 1 : 0;
      std::vector<std::byte> before(a.memory);
      REQUIRE(post_rdma(lane, DescriptorKind::get, a, back, b, off / 2, n, r.callback(1)));
      lane.ring();
      REQUIRE(p.run_until([&] { return r.calls.size() == 2; }));
      CHECK(r.calls[1].status.ok());
      CHECK(std::memcmp(a.memory.data() + back, before.data() + off, n) == 0);
    }
}

TEST_CASE("one completion retires a run of unsignalled work requests, callbacks in order") {
  VerbsOptions o = base_options();
  o.signal_interval = 16;
  Pair p(o, 64);
  Lane& lane = p.lane(0);
  const std::byte payload[32] = {};
  auto& c = p.device(0).counters();

  SUBCASE("the signal_interval-th WR's completion") {
    Recorder r(16);
    for (int i = 0; i < 16; ++i)
      REQUIRE(post_packet(lane, std::span(payload, 8), std::span(payload), r.callback(i)));
    lane.ring();
    CHECK(c.signalled == 1);
    REQUIRE(p.run_until([&] { return r.calls.size() == 16; }));
    check_in_order_once(r, 16);
    CHECK(c.send_completions == 1);
    CHECK(c.probes == 0);
    CHECK(lane.fifo().counter().snapshot() == 16);
  }
  SUBCASE("a quiet lane's unsignalled tail: one retire probe") {
    Recorder r(5);
    for (int i = 0; i < 5; ++i)
      REQUIRE(post_packet(lane, std::span(payload, 8), std::span(payload), r.callback(i)));
    lane.ring();
    CHECK(c.signalled == 0);
    REQUIRE(p.run_until([&] { return r.calls.size() == 5; }));
    check_in_order_once(r, 5);
    CHECK(c.probes == 1);
    CHECK(c.send_completions == 1);
  }
  SUBCASE("ping-pong: a WR posted alone on an idle lane asks for its own completion") {
    Recorder r(3);
    for (int i = 0; i < 3; ++i) {
      REQUIRE(post_packet(lane, std::span(payload, 8), std::span(payload), r.callback(i)));
      lane.ring();
      CHECK(c.lone_signalled == static_cast<std::uint64_t>(i + 1));
      REQUIRE(p.run_until([&] { return r.calls.size() == static_cast<std::size_t>(i + 1); }));
    }
    check_in_order_once(r, 3);
    CHECK(c.signalled == 3);
    CHECK(c.probes == 0);
    CHECK(c.send_completions == 3);
  }
}

TEST_CASE("a burst rings the doorbell once per doorbell_batch work requests") {
  VerbsOptions o = base_options();
  o.doorbell_batch = 8;
  Pair p(o, 64);
  auto& lane = static_cast<ami::verbs::VerbsLane&>(p.lane(0));
  Sink& sink = p.sink(1);
  std::byte payload[32];
  for (std::size_t i = 0; i < sizeof payload; ++i) payload[i] = pattern(i, 9);
  Recorder r(21);
  auto post = [&](int i) {
    REQUIRE(post_packet(lane, std::span(payload, 8), std::span(payload), r.callback(i)));
    lane.ring();
  };
  post(0);
  CHECK(lane.posted() == 1);  // the first of a burst leaves at once
  for (int i = 1; i < 8; ++i) post(i);
  CHECK(lane.posted() == 1);  // seven wait for the eighth
  post(8);
  CHECK(lane.posted() == 9);  // eight in one chain
  for (int i = 9; i < 20; ++i) post(i);
  CHECK(lane.posted() == 17);
  p.device(0).flush();  // the engine's advance() ends with it
  CHECK(lane.posted() == 20);
  REQUIRE(p.run_until([&] { return r.calls.size() == 20; }));
  check_in_order_once(r, 20);
  post(20);
  CHECK(lane.posted() == 21);  // after progress(), a new burst: its first leaves at once
  REQUIRE(p.run_until([&] { return r.calls.size() == 21 && sink.packets.size() == 21; }));
  for (const auto& got : sink.packets) {
    REQUIRE(got.bytes.size() == 8 + sizeof payload);
    CHECK(std::memcmp(got.bytes.data() + 8, payload, sizeof payload) == 0);
  }
}

TEST_CASE("AMI_VERBS_MAX_RDMA caps the RDMA a work request carries") {
  VerbsOptions o = base_options();
  Pair whole(o);
  CHECK(whole.lane(0).max_rdma() == whole.t[0]->domain.port().max_msg);
  o.max_rdma = 65536;
  Pair capped(o);
  CHECK(capped.lane(0).max_rdma() == 65536);
  o.max_rdma = std::uint64_t{1} << 40;  // above the port's: the port's
  Pair above(o);
  CHECK(above.lane(0).max_rdma() == above.t[0]->domain.port().max_msg);
}

TEST_CASE("a full injection FIFO (and send queue) refuses, then drains") {
  VerbsOptions o = base_options();
  o.sq_depth = 33;  // a FIFO of 32 plus the retire probe
  o.signal_interval = 12;
  Pair p(o, 32);
  Lane& lane = p.lane(0);
  std::vector<std::byte> payload(200, std::byte{7});
  Recorder r(96);
  int posted = 0;
  while (post_packet(lane, std::span(payload).first(8), payload, r.callback(posted))) ++posted;
  CHECK(posted == 32);
  CHECK(lane.fifo().try_reserve() == nullptr);
  lane.ring();
  CHECK(lane.fifo().try_reserve() == nullptr);
  // WRs 11 and 23 (every 12th) and 31, the last before the FIFO is full.
  CHECK(p.device(0).counters().signalled == 3);
  REQUIRE(p.run_until([&] { return r.calls.size() == 32; }));
  REQUIRE(lane.fifo().try_reserve() != nullptr);
  // Twice more through the whole FIFO, refilling as completions free slots.
  REQUIRE(p.run_until([&] {
    while (posted < 96 && post_packet(lane, std::span(payload).first(8), payload, r.callback(posted)))
      ++posted;
    lane.ring();
    return r.calls.size() == 96;
  }));
  check_in_order_once(r, 96);
  for (const auto& call : r.calls) CHECK(call.status.ok());
  REQUIRE(p.run_until([&] { return p.sink(1).packets.size() == 96; }));
}

TEST_CASE("many operations outstanding: packets and PUTs interleaved, nothing lost or reordered") {
  VerbsOptions o = base_options();
  o.staging_bytes = 32 * 1024;  // small: the staging ring fills and holds packets back
  Pair p(o, 128);
  constexpr int kOps = 3000;
  Region a(p.t[0]->domain, 1 << 16, 1), b(p.t[1]->domain, kOps * 8, 2);
  std::vector<std::byte> payload(3000);
  Recorder r(kOps);
  Lane& lane = p.lane(0);
  int posted = 0;
  REQUIRE(p.run_until(
      [&] {
        while (posted < kOps) {
          bool ok;
          if (posted % 3 == 2) {
            ok = post_rdma(lane, DescriptorKind::put, a, static_cast<std::size_t>(posted) % 4096, b,
                           static_cast<std::size_t>(posted) * 8, 8, r.callback(posted));
          } else {
            const std::size_t n = 1 + static_cast<std::size_t>(posted) * 37 % payload.size();
            std::memcpy(payload.data(), &posted, sizeof posted);
            ok = post_packet(lane, std::span(payload).first(sizeof posted), std::span(payload).first(n),
                             r.callback(posted));
          }
          if (!ok) break;
          ++posted;
        }
        lane.ring();
        return r.calls.size() == static_cast<std::size_t>(kOps);
      },
      300s));
  check_in_order_once(r, kOps);
  for (const auto& call : r.calls) CHECK(call.status.ok());
  REQUIRE(p.run_until([&] { return p.sink(1).packets.size() == kOps - kOps / 3; }));
  int expect = 0;
  for (const auto& pk : p.sink(1).packets) {
    if (expect % 3 == 2) ++expect;
    int got = -1;
    std::memcpy(&got, pk.bytes.data(), sizeof got);
    REQUIRE(got == expect);
    ++expect;
  }
  for (int i = 2; i < kOps; i += 3)
    CHECK(std::memcmp(b.memory.data() + static_cast<std::size_t>(i) * 8, a.memory.data() + i % 4096, 8) == 0);
  const auto& c = p.device(0).counters();
  MESSAGE("send completions " << c.send_completions << " for " << kOps << " WRs, probes " << c.probes
                              << ", staging stalls " << c.staging_stalls);
  CHECK(c.send_completions < static_cast<std::uint64_t>(kOps) / 4);
}

TEST_CASE("the SRQ runs dry under a send storm and nothing is lost") {
  VerbsOptions o = base_options();
  o.srq_depth = 16;
  Pair p(o, 64);
  constexpr int kPackets = 1500;
  Lane& lane = p.lane(0);
  std::vector<std::byte> payload(600);
  int posted = 0;
  auto storm = [&] {
    while (posted < kPackets) {
      std::memcpy(payload.data(), &posted, sizeof posted);
      if (!post_packet(lane, std::span(payload).first(4), payload)) break;
      ++posted;
    }
    lane.ring();
  };
  // The receiver does not poll: its 16 buffers fill, the sender is told
  // RNR and retries; its transfer counter stops near the SRQ's depth.
  const auto quiet_until = std::chrono::steady_clock::now() + 3s;
  while (std::chrono::steady_clock::now() < quiet_until) {
    storm();
    p.advance(true, false);
  }
  MESSAGE("while the receiver did not poll: " << lane.fifo().counter().snapshot() << " of " << posted
                                              << " sends completed");
  CHECK(lane.fifo().counter().snapshot() <= 2 * o.srq_depth);
  CHECK(posted > static_cast<int>(o.srq_depth));
  REQUIRE(p.run_until(
      [&] {
        storm();
        return p.sink(1).packets.size() == kPackets;
      },
      300s));
  for (int i = 0; i < kPackets; ++i) {
    int got = -1;
    std::memcpy(&got, p.sink(1).packets[static_cast<std::size_t>(i)].bytes.data(), sizeof got);
    REQUIRE(got == i);
  }
  CHECK(p.device(1).counters().receive_errors == 0);
  CHECK(p.device(1).counters().receives_reposted >= kPackets - o.srq_depth);
}

TEST_CASE("a QP forced into the error state fails pending operations instead of hanging") {
  Pair p(base_options(), 64);
  constexpr std::size_t kBytes = 4 << 20;
  Region a(p.t[0]->domain, kBytes, 1), b(p.t[1]->domain, kBytes, 2);
  Lane& lane = p.lane(0);
  auto* vlane = static_cast<ami::verbs::VerbsLane*>(&lane);
  Recorder r(64);
  int posted = 0;
  for (; posted < 32; ++posted)
    REQUIRE(post_rdma(lane, DescriptorKind::put, a, 0, b, 0, kBytes / 4, r.callback(posted)));
  lane.ring();
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  REQUIRE(ibv_modify_qp(vlane->qp(), &attr, IBV_QP_STATE) == 0);
  REQUIRE(p.run_until([&] { return r.calls.size() == 32; }, 120s));
  check_in_order_once(r, 32);
  std::size_t ok = 0;
  while (ok < r.calls.size() && r.calls[ok].status.ok()) ++ok;
  MESSAGE(ok << " of 32 completed before the error; then: " << ami::to_string(r.calls.back().status));
  REQUIRE(ok < 32);
  for (std::size_t i = ok; i < 32; ++i) {
    CHECK(r.calls[i].status == StatusCode::peer_failed);
    CHECK(std::string(r.calls[i].status.what()).find(ibv_wc_status_str(IBV_WC_WR_FLUSH_ERR)) !=
          std::string::npos);
  }
  CHECK(vlane->broken());
  // Later operations on the broken lane fail too, from advance().
  const std::byte payload[8] = {};
  REQUIRE(post_packet(lane, std::span(payload), {}, r.callback(posted++)));
  lane.ring();
  REQUIRE(p.run_until([&] { return r.calls.size() == 33; }));
  CHECK(r.calls.back().status == StatusCode::peer_failed);
}

TEST_CASE("a dead peer: transport retries run out and the operation fails") {
  VerbsOptions o = base_options();
  o.retry_count = 1;
  o.timeout = 10;  // about 4 ms
  Pair p(o, 64);
  Lane& lane = p.lane(0);
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  REQUIRE(ibv_modify_qp(p.t[1]->domain.qp(0, Endpoint{0, 0}), &attr, IBV_QP_STATE) == 0);
  Recorder r(2);
  const std::byte payload[64] = {};
  REQUIRE(post_packet(lane, std::span(payload).first(8), std::span(payload), r.callback(0)));
  REQUIRE(post_packet(lane, std::span(payload).first(8), std::span(payload), r.callback(1)));
  lane.ring();
  REQUIRE(p.run_until([&] { return r.calls.size() == 2; }, 120s));
  check_in_order_once(r, 2);
  MESSAGE(ami::to_string(r.calls[0].status));
  CHECK(r.calls[0].status == StatusCode::peer_failed);
  CHECK(std::string(r.calls[0].status.what()).find(ibv_wc_status_str(IBV_WC_RETRY_EXC_ERR)) !=
        std::string::npos);
  CHECK(r.calls[1].status == StatusCode::peer_failed);
}

TEST_CASE("an RDMA WRITE with immediate from the peer takes a receive but is never read as a packet") {
  Pair p;
  constexpr std::size_t kBytes = 20000;  // longer than a receive buffer
  Region a(p.t[0]->domain, kBytes, 1), b(p.t[1]->domain, kBytes, 2);
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(a.memory.data()), static_cast<std::uint32_t>(kBytes), a.lkey};
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;  // not something ami sends: as a hostile or foreign peer would
  wr.imm_data = htobe32(0xA2000001u);      // even an immediate that looks like a compact packet's
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.wr.rdma.remote_addr = b.key.address;
  wr.wr.rdma.rkey = b.rkey;
  ibv_send_wr* bad = nullptr;
  auto* lane = static_cast<ami::verbs::VerbsLane*>(&p.lane(0));
  REQUIRE(ibv_post_send(lane->qp(), &wr, &bad) == 0);  // unsignalled: no completion for the device
  REQUIRE(p.run_until([&] { return p.device(1).counters().dropped == 1; }));
  CHECK(p.sink(1).packets.empty());
  CHECK(std::memcmp(a.memory.data(), b.memory.data(), kBytes) == 0);  // the data went where the WRITE said
  // The lane carries on.
  const std::byte payload[5] = {std::byte{1}, std::byte{2}, std::byte{3}, std::byte{4}, std::byte{5}};
  REQUIRE(post_packet(p.lane(0), std::span(payload), {}));
  p.lane(0).ring();
  REQUIRE(p.run_until([&] { return p.sink(1).packets.size() == 1; }));
  CHECK(p.sink(1).packets[0].bytes.size() == 5);
  CHECK(p.device(1).counters().receive_errors == 0);
}

TEST_CASE("a descriptor the device refuses fails alone; the lane carries on") {
  Pair p;
  Region a(p.t[0]->domain, 4096, 1), b(p.t[1]->domain, 4096, 2);
  Lane& lane = p.lane(0);
  Recorder r(4);
  const std::byte payload[16] = {};
  REQUIRE(post_packet(lane, std::span(payload), {}, r.callback(0)));
  REQUIRE(post_rdma(lane, DescriptorKind::put, a, 0, b, 4000, 200, r.callback(1)));  // beyond b's key
  REQUIRE(post_rdma(lane, DescriptorKind::put, a, 0, b, 100, 200, r.callback(2)));
  REQUIRE(post_packet(lane, std::span(payload), {}, r.callback(3)));
  lane.ring();
  REQUIRE(p.run_until([&] { return r.calls.size() == 4 && p.sink(1).packets.size() == 2; }));
  check_in_order_once(r, 4);
  CHECK(r.calls[0].status.ok());
  CHECK(r.calls[1].status == StatusCode::remote_access);
  CHECK(r.calls[2].status.ok());
  CHECK(r.calls[3].status.ok());
  CHECK(std::memcmp(b.memory.data() + 100, a.memory.data(), 200) == 0);
  CHECK(p.device(0).counters().refused == 1);
}

TEST_CASE("a remote access error: that operation is refused, what waits behind it fails with the lane") {
  Pair p;
  Region a(p.t[0]->domain, 4096, 1), b(p.t[1]->domain, 4096, 2);
  p.t[1]->domain.deregister_region(b.number);  // the peer's NIC refuses the key from now on
  Lane& lane = p.lane(0);
  Recorder r(3);
  const std::byte payload[16] = {};
  REQUIRE(post_packet(lane, std::span(payload), {}, r.callback(0)));
  REQUIRE(post_rdma(lane, DescriptorKind::put, a, 0, b, 0, 200, r.callback(1)));
  REQUIRE(post_packet(lane, std::span(payload), {}, r.callback(2)));
  lane.ring();
  REQUIRE(p.run_until([&] { return r.calls.size() == 3 && !p.sink(0).failed.empty(); }));
  check_in_order_once(r, 3);
  CHECK(r.calls[0].status.ok());
  CHECK(r.calls[1].status == StatusCode::remote_access);
  CHECK(r.calls[2].status == StatusCode::peer_failed);
  REQUIRE(p.sink(0).failed.size() == 1);
  CHECK(p.sink(0).failed[0].second == StatusCode::peer_failed);  // the peer fails as when it is gone
}

TEST_CASE("several contexts: each lane reaches its own peer context, origins from the QP") {
  Pair p(base_options(), 16, 2);
  const std::byte payload[4] = {};
  for (int from = 0; from < 2; ++from)
    for (std::uint16_t c = 0; c < 2; ++c)
      for (std::uint16_t d = 0; d < 2; ++d) {
        std::byte header[4] = {std::byte(from), std::byte(c), std::byte(d), std::byte{0x5a}};
        REQUIRE(post_packet(p.lane(from, c, d), header, std::span(payload)));
        p.lane(from, c, d).ring();
      }
  REQUIRE(p.run_until([&] {
    std::size_t n = 0;
    for (int t = 0; t < 2; ++t)
      for (std::uint16_t c = 0; c < 2; ++c) n += p.sink(t, c).packets.size();
    return n == 8;
  }));
  for (int t = 0; t < 2; ++t)
    for (std::uint16_t d = 0; d < 2; ++d) {
      REQUIRE(p.sink(t, d).packets.size() == 2);
      for (const auto& pk : p.sink(t, d).packets) {
        CHECK(pk.origin.task == static_cast<std::uint32_t>(1 - t));
        CHECK(pk.bytes[0] == std::byte(1 - t));
        CHECK(static_cast<std::uint16_t>(pk.bytes[1]) == pk.origin.context);
        CHECK(static_cast<std::uint16_t>(pk.bytes[2]) == d);
      }
    }
}

TEST_CASE("a blocking wait: the completion channel wakes the receiver") {
  Pair p;
  VerbsDevice& receiver = p.device(1);
  Lane& lane = p.lane(0);  // connected first: the handshake's own completions wake it too
  bool armed = false;
  for (int i = 0; i < 100000 && !armed; ++i) {
    p.advance();
    armed = receiver.arm().ok();
  }
  REQUIRE(armed);
  pollfd pfd{receiver.completion_fd(), POLLIN, 0};
  CHECK(::poll(&pfd, 1, 0) == 0);  // nothing yet
  const std::byte payload[8] = {std::byte{42}};
  REQUIRE(post_packet(lane, std::span(payload), {}));
  lane.ring();
  REQUIRE(::poll(&pfd, 1, 30000) == 1);
  receiver.consume_event();
  REQUIRE(p.run_until([&] { return p.sink(1).packets.size() == 1; }));
  CHECK(p.sink(1).packets[0].bytes[0] == std::byte{42});
}

// docs/DESIGN.md, "Event-driven progress": a completion that comes while
// the device arms raises no event; arm() finds it by its last look, keeps
// it for progress() and says busy. Events taken are acknowledged in
// batches, not one by one.
TEST_CASE("sleeping: arm() keeps what its last look finds, and acknowledges events in batches") {
  Pair p;
  VerbsDevice& receiver = p.device(1);
  Lane& lane = p.lane(0);
  CHECK(receiver.wake_fds().size() >= 1);
  CHECK(receiver.wake_fds()[0] == receiver.completion_fd());
  auto settle = [&] {
    for (int i = 0; i < 100000; ++i) {
      p.advance();
      const ami::Status s = receiver.arm();
      if (s.code() != ami::StatusCode::busy) return s;
    }
    return ami::Status{ami::StatusCode::busy, "still busy"};
  };
  for (int round = 0; round < 20; ++round) {
    REQUIRE(settle().ok());
    pollfd pfd{receiver.completion_fd(), POLLIN, 0};
    CHECK(::poll(&pfd, 1, 0) == 0);
    const std::byte payload[8] = {std::byte(round)};
    REQUIRE(post_packet(lane, std::span(payload), {}));
    lane.ring();
    REQUIRE(::poll(&pfd, 1, 30000) == 1);  // woken by the channel
    // arm() now takes the event, asks again and finds the completion itself.
    ami::Status s = receiver.arm();
    for (int i = 0; i < 1000 && s.ok(); ++i) s = receiver.arm();  // (the CQE may trail the event)
    CHECK(s.code() == ami::StatusCode::busy);
    REQUIRE(p.run_until([&] { return p.sink(1).packets.size() == static_cast<std::size_t>(round + 1); }));
    CHECK(p.sink(1).packets.back().bytes[0] == std::byte(round));
  }
  CHECK(receiver.unacked_events() >= 1);  // not acknowledged one at a time
  CHECK(receiver.unacked_events() < 64);
}

TEST_CASE("rdma_cm: connect, packets both ways, PUT and GET") {
  VerbsOptions o = base_options();
  o.use_rdma_cm = true;
  Pair p(o, 64, 2);
  CHECK(p.t[0]->domain.method() == ami::verbs::ConnectMethod::rdma_cm);
  MESSAGE(p.t[0]->domain.describe());
  Region a(p.t[0]->domain, 131072, 1), b(p.t[1]->domain, 131072, 2);
  std::vector<std::byte> payload(5000);
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = pattern(i, 9);
  Recorder r(2);
  for (int from = 0; from < 2; ++from)
    for (std::uint16_t c = 0; c < 2; ++c) {
      REQUIRE(post_packet(p.lane(from, c, 1 - c), std::span(payload).first(16), payload));
      p.lane(from, c, 1 - c).ring();
    }
  REQUIRE(post_rdma(p.lane(0, 1, 1), DescriptorKind::put, a, 3, b, 5, 60000, r.callback(0)));
  REQUIRE(post_rdma(p.lane(0, 1, 1), DescriptorKind::get, a, 65536, b, 70000, 50000, r.callback(1)));
  p.lane(0, 1, 1).ring();
  REQUIRE(p.run_until([&] {
    std::size_t n = 0;
    for (int t = 0; t < 2; ++t)
      for (std::uint16_t c = 0; c < 2; ++c) n += p.sink(t, c).packets.size();
    return n == 4 && r.calls.size() == 2;
  }));
  for (int t = 0; t < 2; ++t)
    for (std::uint16_t c = 0; c < 2; ++c) {
      REQUIRE(p.sink(t, c).packets.size() == 1);
      const auto& pk = p.sink(t, c).packets[0];
      CHECK(pk.origin == Endpoint{static_cast<std::uint32_t>(1 - t), static_cast<std::uint16_t>(1 - c)});
      CHECK(std::memcmp(pk.bytes.data() + 16, payload.data(), payload.size()) == 0);
    }
  CHECK(r.calls[0].status.ok());
  CHECK(r.calls[1].status.ok());
  CHECK(std::memcmp(b.memory.data() + 5, a.memory.data() + 3, 60000) == 0);
  CHECK(std::memcmp(a.memory.data() + 65536, b.memory.data() + 70000, 50000) == 0);
}

TEST_CASE("rdma_cm: three tasks asking each other at once end with one queue pair per pair of tasks") {
  VerbsOptions o = base_options();
  o.use_rdma_cm = true;
  constexpr std::uint32_t kTasks = 3;
  std::vector<std::unique_ptr<ami::device::RegionTable>> regions;
  std::vector<std::unique_ptr<VerbsDomain>> domains;
  std::vector<std::vector<std::byte>> addresses;
  for (std::uint32_t t = 0; t < kTasks; ++t) {
    regions.push_back(std::make_unique<ami::device::RegionTable>(7, t, 8));
    domains.push_back(std::make_unique<VerbsDomain>(t, kTasks, 1, o, *regions.back()));
    addresses.push_back(domains.back()->local_address());
  }
  for (std::uint32_t t = 0; t < kTasks; ++t)
    for (std::uint32_t peer = 0; peer < kTasks; ++peer)
      if (peer != t) {
        const Status s = domains[t]->connect(peer, addresses[peer]);
        REQUIRE_MESSAGE(s.ok(), t, " -> ", peer, ": ", ami::to_string(s));
      }
  for (const auto& d : domains) CHECK(d->queue_pairs_made() == 0);

  std::vector<std::unique_ptr<VerbsDevice>> devices;
  std::vector<Sink> sinks(kTasks);
  for (auto& d : domains) devices.push_back(std::make_unique<VerbsDevice>(*d, 0, 16));
  for (std::uint32_t t = 0; t < kTasks; ++t) {
    CHECK_FALSE(devices[t]->can_reach(Endpoint{t, 0}));
    for (std::uint32_t peer = 0; peer < kTasks; ++peer) {
      if (peer == t) continue;
      Lane* lane = devices[t]->lane(Endpoint{peer, 0});
      REQUIRE(lane != nullptr);
      const std::byte header[2] = {std::byte(t), std::byte(peer)};
      REQUIRE(post_packet(*lane, header, {}));
      lane->ring();
    }
  }
  const auto end = std::chrono::steady_clock::now() + 60s;
  auto arrived = [&] {
    std::size_t n = 0;
    for (auto& sk : sinks) n += sk.packets.size();
    return n;
  };
  while (arrived() < kTasks * (kTasks - 1) && std::chrono::steady_clock::now() < end)
    for (std::uint32_t t = 0; t < kTasks; ++t) (void)devices[t]->progress(sinks[t], 64);
  for (std::uint32_t t = 0; t < kTasks; ++t) {
    REQUIRE(sinks[t].packets.size() == kTasks - 1);
    for (const auto& pk : sinks[t].packets) {
      CHECK(static_cast<std::uint32_t>(pk.bytes[0]) == pk.origin.task);
      CHECK(static_cast<std::uint32_t>(pk.bytes[1]) == t);
    }
    CHECK(domains[t]->queue_pairs_made() == kTasks - 1);  // the crossed requests made one pair each
  }
}

// Connection on first use: the handshake (verbs_handshake.hpp).

namespace {

// Both ways of connecting on first use: the handshake over UD, and rdma_cm.
std::vector<VerbsOptions> both_methods(VerbsOptions o = base_options()) {
  o.use_rdma_cm = false;
  VerbsOptions cm = o;
  cm.use_rdma_cm = true;
  return {o, cm};
}

// Packets numbered 0..n-1 on lane, in as many rings as the FIFO takes.
void post_numbered(Pair& p, Lane& lane, std::uint32_t from, std::uint32_t n) {
  for (std::uint32_t i = from; i < from + n;) {
    std::byte header[4];
    std::memcpy(header, &i, sizeof i);
    if (post_packet(lane, header, {})) {
      ++i;
      continue;
    }
    lane.ring();
    p.advance();
  }
  lane.ring();
}

void check_numbered(const Sink& sink, std::uint32_t n) {
  REQUIRE(sink.packets.size() == n);
  for (std::uint32_t i = 0; i < n; ++i) {
    std::uint32_t got = 0;
    std::memcpy(&got, sink.packets[i].bytes.data(), sizeof got);
    REQUIRE(got == i);
  }
}

}  // namespace

TEST_CASE("on first use (handshake, rdma_cm): no queue pair before it; what waits for the connection goes in order") {
  for (const VerbsOptions& o : both_methods()) {
    CAPTURE(o.use_rdma_cm.value());
    Pair p(o, 16);
    CHECK(p.t[0]->domain.queue_pairs_made() == 0);
    CHECK(p.t[1]->domain.queue_pairs_made() == 0);
    p.advance();
    CHECK(p.t[0]->domain.queue_pairs_made() == 0);
    // More than a FIFO's worth posted before the peer ever answered.
    Lane& lane = p.lane(0, 0, 0, false);
    CHECK_FALSE(static_cast<VerbsLane&>(lane).ready());
    post_numbered(p, lane, 0, 100);
    REQUIRE(p.run_until([&] { return p.sink(1).packets.size() == 100; }));
    check_numbered(p.sink(1), 100);
    CHECK(p.t[0]->domain.queue_pairs_made() == 1);
    CHECK(p.t[1]->domain.queue_pairs_made() == 1);  // the replier's, made for the request
    // The way back uses the replier's queue pair: no second pair.
    Lane& back = p.lane(1);
    post_numbered(p, back, 0, 10);
    REQUIRE(p.run_until([&] { return p.sink(0).packets.size() == 10; }));
    check_numbered(p.sink(0), 10);
    CHECK(p.t[0]->domain.queue_pairs_made() == 1);
    CHECK(p.t[1]->domain.queue_pairs_made() == 1);
    CHECK(p.device(0).counters().connections_ready == 1);
    CHECK(p.device(1).counters().connections_ready == 1);
    CHECK(p.device(1).counters().handshakes_dropped == 0);
  }
}

TEST_CASE("on first use (handshake, rdma_cm): both sides asking at once end with one queue pair each, nothing lost or reordered") {
  for (const VerbsOptions& o : both_methods()) {
    CAPTURE(o.use_rdma_cm.value());
    for (int round = 0; round < 8; ++round) {
      CAPTURE(round);
      Pair p(o, 16, 2);
      // Every lane of both tasks asked for before either advances; then 50
      // packets each way on each.
      for (int t = 0; t < 2; ++t)
        for (std::uint16_t c = 0; c < 2; ++c)
          for (std::uint16_t d = 0; d < 2; ++d) (void)p.lane(t, c, d, false);
      for (int t = 0; t < 2; ++t)
        for (std::uint16_t c = 0; c < 2; ++c) post_numbered(p, p.lane(t, c, c, false), 0, 50);
      REQUIRE(p.run_until([&] {
        std::size_t n = 0;
        for (int t = 0; t < 2; ++t)
          for (std::uint16_t c = 0; c < 2; ++c) n += p.sink(t, c).packets.size();
        return n == 200;
      }));
      for (int t = 0; t < 2; ++t)
        for (std::uint16_t c = 0; c < 2; ++c) check_numbered(p.sink(t, c), 50);
      CHECK(p.t[0]->domain.queue_pairs_made() == 4);  // one per pair of contexts
      CHECK(p.t[1]->domain.queue_pairs_made() == 4);
    }
  }
}

TEST_CASE("handshake: a peer that answers late gets repeats, and answers each alike") {
  Pair p(base_options(), 16);
  Lane& lane = p.lane(0, 0, 0, false);
  post_numbered(p, lane, 0, 5);
  // Task 1 does not advance for 400 ms: task 0 asks again meanwhile.
  const auto until = std::chrono::steady_clock::now() + 400ms;
  while (std::chrono::steady_clock::now() < until) p.advance(true, false);
  CHECK(p.device(0).counters().handshakes_sent >= 3);
  REQUIRE(p.run_until([&] { return p.sink(1).packets.size() == 5; }));
  check_numbered(p.sink(1), 5);
  CHECK(p.t[1]->domain.queue_pairs_made() == 1);
  CHECK(p.device(1).counters().handshakes_received >= 3);
  CHECK(p.device(1).counters().connections_ready == 1);
}

TEST_CASE("on first use (handshake, rdma_cm): a peer that never answers fails the lane and what waited on it") {
  VerbsOptions base = base_options();
  base.connect_timeout_ms = 300;
  for (const VerbsOptions& o : both_methods(base)) {
    CAPTURE(o.use_rdma_cm.value());
    Pair p(o, 16);
    Lane& lane = p.lane(0, 0, 0, false);
    Recorder r(2);
    const std::byte payload[8] = {};
    REQUIRE(post_packet(lane, std::span(payload), {}, r.callback(0)));
    REQUIRE(post_packet(lane, std::span(payload), {}, r.callback(1)));
    lane.ring();
    const auto end = std::chrono::steady_clock::now() + 30s;
    while (r.calls.size() < 2 && std::chrono::steady_clock::now() < end) p.advance(true, false);
    check_in_order_once(r, 2);
    CHECK(r.calls[0].status == StatusCode::peer_failed);
    MESSAGE(ami::to_string(r.calls[0].status));
    REQUIRE(p.sink(0).failed.size() == 1);
    CHECK(p.sink(0).failed[0].first == Endpoint{1, 0});
    CHECK(static_cast<VerbsLane&>(lane).broken());
  }
}

TEST_CASE("on first use (handshake, rdma_cm): a request without the task's published nonce is dropped and counted") {
  VerbsOptions base = base_options();
  base.connect_timeout_ms = 300;
  for (const VerbsOptions& o : both_methods(base)) {
    CAPTURE(o.use_rdma_cm.value());
    // Task 1 learns task 0 with another nonce than task 0 sends.
    auto t0 = std::make_unique<Task>(0, 1, o), t1 = std::make_unique<Task>(1, 1, o);
    auto forged = t0->domain.local_address();
    forged[44] ^= std::byte{0x5a};  // the nonce's first byte (verbs_address.cpp)
    REQUIRE(t0->domain.connect(1, t1->domain.local_address()).ok());
    REQUIRE(t1->domain.connect(0, forged).ok());
    VerbsDevice d0(t0->domain, 0, 16), d1(t1->domain, 0, 16);
    Sink s0, s1;
    Lane* lane = d0.lane(Endpoint{1, 0});
    REQUIRE(lane != nullptr);
    const auto end = std::chrono::steady_clock::now() + 30s;
    while (!static_cast<VerbsLane*>(lane)->broken() && std::chrono::steady_clock::now() < end) {
      (void)d0.progress(s0, 64);
      (void)d1.progress(s1, 64);
    }
    CHECK(static_cast<VerbsLane*>(lane)->broken());
    CHECK(d1.counters().handshakes_dropped >= 1);
    CHECK(d1.counters().handshakes_received == 0);
    CHECK(t1->domain.queue_pairs_made() == 0);
  }
}
