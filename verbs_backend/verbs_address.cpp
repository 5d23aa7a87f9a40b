// verbs_backend/verbs_address.cpp — encoding and checking of the address a
// task publishes for the verbs backend.
#include "verbs_address.hpp"

#include <infiniband/verbs.h>

#include <cstring>

#include "ami/device/byte_io.hpp"

namespace ami::verbs {

using ami::detail::load;
using ami::detail::store;

// magic u32, version u16, method u8, link layer u8, mtu u8, rd_atomic u8,
// lid u16, contexts u16, reserved u16, task u32, tasks u32, bounce u32,
// gid[16], nonce u64, ip family u8, reserved u8, reserved u16, ip[16]; then
// per context a u32: its UD QP number (handshake) or its rdma_cm port.
std::vector<std::byte> DomainAddress::encode() const {
  std::vector<std::byte> out(kFixedBytes + rendezvous.size() * kRendezvousBytes);
  std::byte* p = out.data();
  store(p, kMagic);
  store(p, kVersion);
  store(p, static_cast<std::uint8_t>(method));
  store(p, link_layer);
  store(p, mtu);
  store(p, rd_atomic);
  store(p, lid);
  store(p, contexts);
  store(p, std::uint16_t{0});
  store(p, task);
  store(p, tasks);
  store(p, bounce_bytes);
  std::memcpy(p, gid.data(), gid.size());
  p += gid.size();
  store(p, nonce);
  store(p, ip_family);
  store(p, std::uint8_t{0});
  store(p, std::uint16_t{0});
  std::memcpy(p, ip.data(), ip.size());
  p += ip.size();
  for (std::uint32_t r : rendezvous) store(p, r);
  return out;
}

Status DomainAddress::decode(std::span<const std::byte> bytes, DomainAddress& out) {
  if (bytes.size() < kFixedBytes) return {StatusCode::malformed_packet, "verbs address: truncated"};
  const std::byte* p = bytes.data();
  DomainAddress a;
  if (load<std::uint32_t>(p) != kMagic) return {StatusCode::malformed_packet, "verbs address: bad magic"};
  if (load<std::uint16_t>(p) != kVersion)
    return {StatusCode::malformed_packet, "verbs address: unsupported version"};
  const auto method = load<std::uint8_t>(p);
  if (method != static_cast<std::uint8_t>(ConnectMethod::handshake) &&
      method != static_cast<std::uint8_t>(ConnectMethod::rdma_cm))
    return {StatusCode::malformed_packet, "verbs address: unknown connection method"};
  a.method = static_cast<ConnectMethod>(method);
  a.link_layer = load<std::uint8_t>(p);
  a.mtu = load<std::uint8_t>(p);
  a.rd_atomic = load<std::uint8_t>(p);
  a.lid = load<std::uint16_t>(p);
  a.contexts = load<std::uint16_t>(p);
  (void)load<std::uint16_t>(p);
  a.task = load<std::uint32_t>(p);
  a.tasks = load<std::uint32_t>(p);
  a.bounce_bytes = load<std::uint32_t>(p);
  std::memcpy(a.gid.data(), p, a.gid.size());
  p += a.gid.size();
  a.nonce = load<std::uint64_t>(p);
  a.ip_family = load<std::uint8_t>(p);
  (void)load<std::uint8_t>(p);
  (void)load<std::uint16_t>(p);
  std::memcpy(a.ip.data(), p, a.ip.size());
  p += a.ip.size();

  if (a.contexts == 0 || a.tasks == 0 || a.task >= a.tasks)
    return {StatusCode::malformed_packet, "verbs address: task, tasks or contexts out of range"};
  if (a.link_layer != IBV_LINK_LAYER_INFINIBAND && a.link_layer != IBV_LINK_LAYER_ETHERNET)
    return {StatusCode::malformed_packet, "verbs address: unknown link layer"};
  if (a.mtu < 1 || a.mtu > 5) return {StatusCode::malformed_packet, "verbs address: bad MTU"};
  if (bytes.size() - kFixedBytes != std::size_t{a.contexts} * kRendezvousBytes)
    return {StatusCode::malformed_packet, "verbs address: length does not match its context count"};
  const bool cm = a.method == ConnectMethod::rdma_cm;
  if (cm && a.ip_family != 4 && a.ip_family != 6)
    return {StatusCode::malformed_packet, "verbs address: rdma_cm address without an IP address"};
  a.rendezvous.resize(a.contexts);
  for (std::uint32_t& r : a.rendezvous) {
    r = load<std::uint32_t>(p);
    if (r == 0 || r > (cm ? 0xFFFFu : 0xFFFFFFu))
      return {StatusCode::malformed_packet, cm ? "verbs address: rdma_cm port zero or wider than 16 bits"
                                               : "verbs address: UD QP number zero or wider than 24 bits"};
  }
  out = std::move(a);
  return Status::success();
}

}  // namespace ami::verbs
