// protocol/am/eager/packet_build.hpp — filling an injection FIFO slot with a
// packet: the fixed header, the user header, and the payload inline when it
// fits or referenced (with its registration's key, when it has one).
#pragma once

#include <cstring>
#include <span>

#include "ami/device/descriptor.hpp"
#include "wire/packet.hpp"

namespace ami::protocol {

// memcpy for the few bytes of a small message, without a call: copies of
// fixed sizes, overlapping in the middle, which the compiler inlines.
inline void copy_bytes(std::byte* to, const std::byte* from, std::size_t n) {
  if (n > 16) {
    std::memcpy(to, from, n);
  } else if (n >= 8) {
    std::memcpy(to, from, 8);
    std::memcpy(to + n - 8, from + n - 8, 8);
  } else if (n >= 4) {
    std::memcpy(to, from, 4);
    std::memcpy(to + n - 4, from + n - 4, 4);
  } else if (n >= 2) {
    std::memcpy(to, from, 2);
    std::memcpy(to + n - 2, from + n - 2, 2);
  } else if (n == 1) {
    *to = *from;
  }
}

// Completes d as a packet whose n header bytes are already inline: the
// payload goes inline too when it fits (so the caller's buffer is free at
// once), and is referenced otherwise.
// keys: the local keys of the payload's registration, when it has one.
inline void finish_packet(device::Descriptor& d, std::size_t n, std::span<const std::byte> payload,
                          const LocalKeys* keys = nullptr) {
  d.kind = device::DescriptorKind::packet;
  device::PacketDescriptor& p = d.packet;
  p.compact_prefix = 0;
  p.await_delivery = false;
  p.payload_keyed = keys != nullptr;
  if (keys != nullptr) p.payload_keys = *keys;
  if (n + payload.size() <= device::kPacketInlineBytes) {
    copy_bytes(p.inline_data + n, payload.data(), payload.size());
    n += payload.size();
    p.payload = nullptr;
    p.payload_len = 0;
  } else {
    p.payload = payload.data();
    p.payload_len = static_cast<std::uint32_t>(payload.size());
  }
  p.inline_len = static_cast<std::uint16_t>(n);
}

inline void build_packet(device::Descriptor& d, const wire::PacketHeader& h,
                         std::span<const std::byte> user_header, std::span<const std::byte> payload,
                         const LocalKeys* keys = nullptr) {
  finish_packet(d, wire::encode(h, user_header, d.packet.inline_data), payload, keys);
}

// A whole message that wants no answer: the short header.
inline void build_short(device::Descriptor& d, std::uint16_t dispatch, std::span<const std::byte> user_header,
                        std::span<const std::byte> payload, const LocalKeys* keys = nullptr) {
  const auto n = static_cast<std::uint32_t>(payload.size());
  finish_packet(d, wire::encode_short(dispatch, n, user_header, d.packet.inline_data), payload, keys);
  d.packet.compact_prefix = wire::kShortHeaderBytes;
  d.packet.immediate = wire::compact_short(dispatch, static_cast<std::uint16_t>(user_header.size()));
}

}  // namespace ami::protocol
