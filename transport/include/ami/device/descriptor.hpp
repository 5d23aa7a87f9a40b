// ami/device/descriptor.hpp — what software writes into an injection FIFO
// slot: a packet, a PUT or a GET.
//
// A packet carries up to kPacketInlineBytes copied into the descriptor
// (protocol header, user header, and a small payload, so an immediate send's
// buffer is reusable at once) plus an optional referenced payload that the
// device reads before it advances the transfer counter past the slot. The
// device never interprets the bytes: the protocol owns the wire format.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ami/memory.hpp"

namespace ami::device {

inline constexpr std::size_t kPacketInlineBytes = 320;

enum class DescriptorKind : std::uint8_t { packet, put, get };

struct PacketDescriptor {
  std::uint16_t inline_len = 0;
  const std::byte* payload = nullptr;  // referenced until the slot completes
  std::uint32_t payload_len = 0;
  // The payload lies in a registration with this backend key (the verbs
  // lkey): a device may send it from there instead of copying it first.
  bool payload_keyed = false;
  std::uint32_t payload_key = 0;
  // The packet's compact form, for a device that carries a 32-bit immediate
  // with a packet (verbs: SEND with immediate): it may leave out the first
  // compact_prefix inline bytes and send `immediate` instead; the receiving
  // device hands what arrived and the immediate to
  // PacketSink::on_compact_packet. 0: the packet has no compact form.
  std::uint16_t compact_prefix = 0;
  std::uint32_t immediate = 0;
  alignas(8) std::byte inline_data[kPacketInlineBytes];
};

struct RdmaDescriptor {
  std::byte* local = nullptr;      // inside a registration of this task
  std::uint64_t length = 0;
  std::uint32_t local_key = 0;     // backend key of the local registration
  std::uint64_t remote_address = 0;
  RemoteKey remote{};
};

struct Descriptor {
  DescriptorKind kind = DescriptorKind::packet;
  PacketDescriptor packet;
  RdmaDescriptor rdma;
};

}  // namespace ami::device
