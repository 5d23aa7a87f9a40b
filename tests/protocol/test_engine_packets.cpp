// The engine's receive path fed hand-built packets, as a hostile or broken
// peer would send them. Each case says what must happen.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ami/device/region_table.hpp"
#include "eager/am_engine.hpp"
#include "rdma_chunk.hpp"
#include "shm_device.hpp"
#include "self_device.hpp"

using namespace ami;
using namespace ami::wire;

namespace {

struct Rig {
  device::RegionTable regions{1, 0, 16};
  self::SelfDomain domain{0, 2, 64, 1024, regions};
  self::SelfDevice dev{domain, 0, 16};
  ContextStats stats;
  protocol::AmEngine engine{{1, 2, 16}, stats};
  int dispatched = 0;
  std::vector<std::uint8_t> buffer;
  int done = 0;
  Status done_status;

  Rig() {
    engine.add_device(dev);
    REQUIRE(engine.set_dispatch(4, {&Rig::handler, this}).ok());
  }
  static void handler(void* c, const Incoming& in, Receive* recv) {
    auto* r = static_cast<Rig*>(c);
    ++r->dispatched;
    if (recv != nullptr) {
      r->buffer.assign(in.total_bytes, 0);
      recv->buffer = r->buffer.data();
      recv->done = {&Rig::on_done, r};
    }
  }
  static void on_done(void* c, Status s) {
    auto* r = static_cast<Rig*>(c);
    ++r->done;
    r->done_status = s;
  }
  void feed(const PacketHeader& h, std::size_t user, std::size_t payload) {
    std::vector<std::byte> p(sizeof h + user + payload, std::byte{1});
    std::memcpy(p.data(), &h, sizeof h);
    engine.on_packet({0, 1}, p);
  }
};

}  // namespace

TEST_CASE("garbage is dropped and counted by reason, never dispatched") {
  Rig r;
  std::vector<std::byte> junk(10, std::byte{0xAB});
  r.engine.on_packet({0, 1}, junk);  // Expect: truncated
  PacketHeader h = make_header(PacketType::am_first, 4, 0, 8, 0, 8, 0);
  h.magic = 1;
  r.feed(h, 0, 8);  // Expect: bad_magic
  h = make_header(PacketType::am_first, 4, 0, 8, 0, 8, 0);
  r.feed(h, 0, 9);  // Expect: bad_length
  CHECK(r.dispatched == 0);
  CHECK(r.stats.malformed_packets == 3);
  CHECK(r.stats.malformed_by_reason[0] == 1);
  CHECK(malformed_reason_name(0) == "truncated");
  CHECK(r.stats.malformed_by_reason[1] == 1);
  CHECK(r.stats.malformed_by_reason[5] == 1);
  CHECK(malformed_reason_name(5) == "bad_length");
}

TEST_CASE("a dispatch id beyond the table is an unknown one, never an index") {
  Rig r;
  // am_short, dispatch 0xA601: found by fuzzing (it read past the table).
  const std::uint8_t packet[] = {0x41, 0x4d, 0x49, 0x21, 0x02, 0x04, 0x00, 0x00, 0x01, 0xa6, 0x00, 0x00,
                                 0x08, 0x00, 0x00, 0x00, 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x'};
  r.engine.on_packet({0, 1}, std::as_bytes(std::span(packet)));
  r.feed(make_header(PacketType::am_first, 0xFFFF, 1, 8, 3, 8, 0, kWantsRemoteDone), 0, 8);
  CHECK(r.dispatched == 0);
  CHECK(r.stats.unknown_dispatch == 2);
  CHECK(r.stats.malformed_packets == 0);
}

TEST_CASE("an origin outside the job is refused") {
  Rig r;
  std::vector<std::byte> p(sizeof(PacketHeader));
  const PacketHeader h = make_header(PacketType::am_first, 4, 0, 0, 0, 0, 0);
  std::memcpy(p.data(), &h, sizeof h);
  r.engine.on_packet({7, 0}, p);  // Expect: bad_origin, no dispatch
  CHECK(r.dispatched == 0);
  CHECK(r.stats.malformed_by_reason[8] == 1);
}

namespace {

// An engine of task 0 in a job of two tasks of one context each, whose only
// device cannot reach task 1; it records its error handler's calls.
struct Unreached {
  int failures = 0;
  Endpoint failed{};
  Status why;
  static void on_failure(void* c, Endpoint peer, Status why) {
    auto* u = static_cast<Unreached*>(c);
    ++u->failures;
    u->failed = peer;
    u->why = why;
  }
};

// A whole message of 8 bytes in one packet.
std::vector<std::byte> whole_packet(std::uint16_t dispatch) {
  std::vector<std::byte> p(sizeof(PacketHeader) + 8, std::byte{2});
  const PacketHeader h = make_header(PacketType::am_first, dispatch, 0, 8, 0, 8, 0);
  std::memcpy(p.data(), &h, sizeof h);
  return p;
}

}  // namespace

TEST_CASE("a packet from an endpoint of the job that no backend here reaches is counted, and fails it here") {
  device::RegionTable regions{1, 0, 16};
  self::SelfDomain domain{0, 1, 64, 1024, regions};  // reaches task 0 only
  self::SelfDevice dev{domain, 0, 16};
  ContextStats stats;
  protocol::AmEngine engine{{.tasks = 2, .contexts = 1, .options = {.max_requests = 16}}, stats};
  engine.add_device(dev);
  int dispatched = 0;
  REQUIRE(engine.set_dispatch(4, {+[](void* c, const Incoming&, Receive*) { ++*static_cast<int*>(c); }, &dispatched})
              .ok());
  Unreached u;
  engine.set_error_handler({&Unreached::on_failure, &u});
  REQUIRE(engine.peer_status({1, 0}).ok());

  engine.on_packet({1, 0}, whole_packet(4));  // Expect: counted, not dispatched; {1,0} fails here
  CHECK(dispatched == 0);
  CHECK(stats.packets_from_unknown_peers == 1);
  CHECK(stats.malformed_packets == 0);
  CHECK(stats.packets_received == 0);
  CHECK(u.failures == 1);
  CHECK(u.failed == Endpoint{1, 0});
  CHECK(engine.peer_status({1, 0}) == StatusCode::peer_failed);
  CHECK(std::string(engine.peer_status({1, 0}).what()).find("no backend here reaches it") != std::string::npos);
  engine.on_packet({1, 0}, whole_packet(4));  // Expect: counted again; the handler ran once
  CHECK(stats.packets_from_unknown_peers == 2);
  CHECK(u.failures == 1);
  CHECK(stats.peers_failed == 1);
  // A device that drops a cell of its own traffic from there says so too.
  engine.on_unknown_origin({1, 0});  // Expect: counted
  CHECK(stats.packets_from_unknown_peers == 3);
  engine.on_unknown_origin({9, 0});  // Expect: outside the job: bad_origin
  CHECK(stats.malformed_by_reason[8] == 1);
  CHECK(stats.packets_from_unknown_peers == 3);
}

TEST_CASE("shm: cells in a context's ring from a task it cannot reach are counted by the engine, not lost") {
  // Task 0 of two, which never learnt task 1 (no connect() ran for it):
  // nothing can go back to task 1 by shm. Cells are written into task 0's
  // own ring by hand.
  device::RegionTable regions{1, 0, 16};
  shm::ShmDomain domain(0, 2, 1, {.queue_depth = 16, .cell_bytes = 256}, regions);
  shm::ShmDevice device(domain, 0, 16);
  ContextStats stats;
  protocol::AmEngine engine{{.tasks = 2, .contexts = 1, .options = {.max_requests = 16}}, stats};
  engine.add_device(device);
  int dispatched = 0;
  REQUIRE(engine.set_dispatch(4, {+[](void* c, const Incoming&, Receive*) { ++*static_cast<int*>(c); }, &dispatched})
              .ok());
  Unreached u;
  engine.set_error_handler({&Unreached::on_failure, &u});
  device::ReceptionQueue& own = domain.own_queue(0);
  auto put_cell = [&](std::span<const std::byte> bytes, device::ReceptionQueue::Origin origin) {
    auto r = own.reserve();
    REQUIRE(r);
    std::memcpy(r.data(), bytes.data(), bytes.size());
    REQUIRE(own.commit(r, static_cast<std::uint32_t>(bytes.size()), origin));
  };
  shm::RdmaChunk request{};
  request.bytes = 4096;
  request.tag = 1;
  const auto chunk = std::as_bytes(std::span(&request, 1));
  put_cell(chunk, {1, 0, shm::kGetRequestCell});  // Expect: a GET request nobody can answer: counted
  put_cell(whole_packet(4), {1, 0, shm::kPacketCell});  // Expect: to the engine, which counts it
  put_cell(chunk, {5, 0, shm::kGetRequestCell});  // Expect: no task of the job: bad_origin
  for (int i = 0; i < 10; ++i) (void)engine.advance();
  CHECK(dispatched == 0);
  CHECK(stats.packets_from_unknown_peers == 2);
  CHECK(stats.malformed_by_reason[8] == 1);
  CHECK(device.dropped() == 2);
  CHECK(u.failures == 1);  // {1,0} fails here, once
  CHECK(u.failed == Endpoint{1, 0});
}

TEST_CASE("fragments out of sequence are dropped; the message completes only when whole") {
  Rig r;
  r.feed(make_header(PacketType::am_more, 4, 9, 100, 50, 50, 0), 0, 50);  // Expect: no message in flight
  CHECK(r.stats.malformed_by_reason[7] == 1);
  r.feed(make_header(PacketType::am_first, 4, 9, 100, 0, 40, 0), 0, 40);  // Expect: handler gives a buffer
  CHECK(r.dispatched == 1);
  r.feed(make_header(PacketType::am_more, 4, 9, 100, 60, 40, 0), 0, 40);  // Expect: gap, dropped
  r.feed(make_header(PacketType::am_more, 4, 8, 100, 40, 40, 0), 0, 40);  // Expect: other id, dropped
  r.feed(make_header(PacketType::am_more, 4, 9, 200, 40, 40, 0), 0, 40);  // Expect: other total, dropped
  CHECK(r.stats.malformed_by_reason[7] == 4);
  CHECK(r.done == 0);
  r.feed(make_header(PacketType::am_more, 4, 9, 100, 40, 60, 0), 0, 60);  // Expect: completes
  CHECK(r.done == 1);
  CHECK(r.done_status.ok());
}

TEST_CASE("a new message cutting an incomplete one fails the old one's done") {
  Rig r;
  r.feed(make_header(PacketType::am_first, 4, 1, 100, 0, 40, 0), 0, 40);
  r.feed(make_header(PacketType::am_first, 4, 2, 10, 0, 10, 0), 0, 10);  // Expect: old fails, new dispatched
  CHECK(r.done == 1);
  CHECK(r.done_status == StatusCode::malformed_packet);
  CHECK(r.dispatched == 2);
}

TEST_CASE("an ack answering no waiting message is dropped") {
  Rig r;
  r.feed(make_header(PacketType::ack, 0, 0, 1, 1, 0, 0), 0, 0);   // Expect: seq 1 was never sent
  r.feed(make_header(PacketType::ack, 0, 0, 3, 7, 0, 0), 0, 0);   // Expect: nor 7..9
  r.feed(make_header(PacketType::ack, 0, 0, 0, 1, 0, 0), 0, 0);   // Expect: bad_length, answers nothing
  CHECK(r.stats.malformed_by_reason[7] == 2);
  CHECK(r.stats.malformed_by_reason[5] == 1);
  CHECK(r.stats.remote_done_received == 0);
  CHECK(r.stats.messages_ack_received == 0);
}

TEST_CASE("a first packet's ack sequence number must agree with its flags") {
  Rig r;
  r.feed(make_header(PacketType::am_first, 4, 1, 8, 5, 8, 0), 0, 8);                     // Expect: bad_offset
  r.feed(make_header(PacketType::am_first, 4, 1, 8, 0, 8, 0, kWantsRemoteDone), 0, 8);  // Expect: bad_offset
  CHECK(r.stats.malformed_by_reason[6] == 2);
  CHECK(r.dispatched == 0);
  r.feed(make_header(PacketType::am_first, 4, 1, 8, 5, 8, 0, kWantsRemoteDone), 0, 8);  // Expect: dispatched
  CHECK(r.dispatched == 1);
  CHECK(r.stats.remote_done_sent == 1);
}
