// fuzz_packets.cpp — libFuzzer target: arbitrary bytes as a stream of
// packets from one peer into an engine (self backend, a handler that takes
// every message into a buffer, a registration cache for the rendezvous),
// with a sender engine alongside so acks, stops and cts/fin meet live
// requests too. The input is cut into packets by a 2-byte length prefix;
// every third packet also goes in compact form (its first 4 bytes as the
// immediate, the rest as what followed it, as verbs delivers a SEND with
// immediate).
// What must hold: no crash or sanitizer report; a packet the decoder
// refuses is counted as malformed and never dispatched.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "ami/device/region_table.hpp"
#include "eager/am_engine.hpp"
#include "wire/packet.hpp"
#include "self_device.hpp"
#include "registration_cache.hpp"

namespace {

using namespace ami;

struct Rig {
  device::RegionTable regions{1, 0, 64};
  self::SelfDomain domain{0, 2, 16, 2048, regions};
  self::SelfDevice da{domain, 0, 32}, db{domain, 1, 32};
  ContextStats sa, sb;
  detail::RegistrationCache ca, cb;
  protocol::AmEngine ea, eb;
  std::vector<std::byte> target = std::vector<std::byte>(1 << 14);
  std::vector<std::byte> source = std::vector<std::byte>(1 << 13, std::byte{7});
  int dispatched = 0;

  static detail::RegistrationCache cache(device::RegionTable& regions) {
    return detail::RegistrationCache(
        [&regions](void* a, std::size_t n, RemoteKey& key, LocalKeys& local) {
          local.fill(1);
          return regions.add(a, n, key);
        },
        [&regions](std::uint32_t region) { regions.remove(region); }, {}, 4096);
  }
  static protocol::AmEngine::Shape shape() {
    return {.tasks = 1, .contexts = 2, .options = {.max_requests = 64, .ack_idle_threshold = 2, .keepalive_ms = 0}};
  }
  Rig() : ca(cache(regions)), cb(cache(regions)), ea(shape(), sa), eb(shape(), sb) {
    ea.add_device(da);
    eb.add_device(db);
    ea.set_registrar(&ca);
    eb.set_registrar(&cb);
    for (std::uint16_t id = 0; id < 8; ++id) (void)eb.set_dispatch(id, {&Rig::take, this});
  }
  static void take(void* c, const Incoming& in, Receive* recv) {
    auto* r = static_cast<Rig*>(c);
    ++r->dispatched;
    if (recv == nullptr) return;
    if (in.total_bytes <= r->target.size()) recv->buffer = r->target.data();
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Rig r;
  // Live requests at b's peer for acks, stops and ends to meet.
  (void)r.ea.send({.dest = {0, 1}, .dispatch = 1, .payload = std::as_bytes(std::span(r.source)),
                   .remote_done = {+[](void*, Status) {}, nullptr}});
  (void)r.ea.fence({0, 1}, {});
  std::span<const std::uint8_t> rest(data, size);
  while (rest.size() >= 2) {
    const std::size_t n = std::min<std::size_t>(rest[0] | (rest[1] << 8), rest.size() - 2);
    const auto packet = std::as_bytes(rest.subspan(2, n));
    rest = rest.subspan(2 + n);
    wire::PacketView view;
    const bool valid = wire::decode(packet, view) == wire::DecodeError::none;
    const std::uint64_t malformed = r.sb.malformed_packets;
    const int dispatched = r.dispatched;
    // Alternately as a's packet to b (the receive side) and b's to a (the
    // side holding requests).
    if (packet.size() % 2 == 0) {
      r.eb.on_packet({0, 0}, packet);
      if (!valid && (r.sb.malformed_packets != malformed + 1 || r.dispatched != dispatched)) __builtin_trap();
    } else {
      const std::uint64_t before = r.sa.malformed_packets;
      r.ea.on_packet({0, 1}, packet);
      if (!valid && r.sa.malformed_packets != before + 1) __builtin_trap();
    }
    if (packet.size() >= 4 && packet.size() % 3 == 0) {
      std::uint32_t imm;
      std::memcpy(&imm, packet.data(), sizeof imm);
      const bool compact_valid = wire::decode_compact(imm, packet.subspan(4), view) == wire::DecodeError::none;
      const std::uint64_t before = r.sb.malformed_packets;
      r.eb.on_compact_packet({0, 0}, imm, packet.subspan(4));
      if (!compact_valid && r.sb.malformed_packets != before + 1) __builtin_trap();
    }
    (void)r.ea.advance();
    (void)r.eb.advance();
  }
  for (int i = 0; i < 16; ++i) {
    (void)r.ea.advance();
    (void)r.eb.advance();
  }
  return 0;
}
