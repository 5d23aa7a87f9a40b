// ami/device/descriptor.hpp — what software writes into an injection FIFO
// slot: a packet, a PUT, a GET or an atomic.
//
// A packet carries up to kPacketInlineBytes copied into the descriptor
// (protocol header, user header, and a small payload, so an immediate send's
// buffer is reusable at once) plus an optional referenced payload that the
// device reads before it advances the transfer counter past the slot. The
// device never interprets the bytes: the protocol owns the wire format.
//
// A device reads a descriptor only through visit(), which hands each kind
// to its own member of a visitor: a kind added here that a backend's
// visitor lacks does not compile (docs/DESIGN.md, Dispatch).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "ami/atomic.hpp"
#include "ami/memory.hpp"

namespace ami::device {

inline constexpr std::size_t kPacketInlineBytes = 320;

enum class DescriptorKind : std::uint8_t { packet, put, get, atomic };

struct PacketDescriptor {
  // The fields a device reads for every packet come first (12 bytes);
  // the payload's place and keys, read only for a packet that has a
  // payload outside inline_data, follow.
  std::uint16_t inline_len = 0;
  // The packet's compact form, for a device that carries a 32-bit immediate
  // with a packet (verbs: SEND with immediate): it may leave out the first
  // compact_prefix inline bytes and send `immediate` instead; the receiving
  // device hands what arrived and the immediate to
  // PacketSink::on_compact_packet. 0: the packet has no compact form.
  std::uint16_t compact_prefix = 0;
  std::uint32_t immediate = 0;
  std::uint32_t payload_len = 0;
  // The payload lies in a registration with these local keys: a device may
  // send it from there (with payload_keys[its backend id]) instead of
  // copying it first. payload_keys is written only when this is true.
  bool payload_keyed = false;
  // The protocol paces what follows by this packet's completion (a
  // rendezvous it expects the receiver to stop): a device whose completion
  // would otherwise mean only that the packet left (a buffered send)
  // reports it once the packet is delivered, where it can.
  bool await_delivery = false;
  const std::byte* payload = nullptr;  // referenced until the slot completes
  LocalKeys payload_keys{};
  alignas(8) std::byte inline_data[kPacketInlineBytes];
};

struct RdmaDescriptor {
  std::byte* local = nullptr;      // inside a registration of this task
  std::uint64_t length = 0;
  LocalKeys local_keys{};           // of the local registration, by backend id
  std::uint64_t remote_address = 0;
  RemoteKey remote{};
};

// A remote atomic on one naturally aligned word of the key's region, for a
// lane whose device offloads atomics on that region (Lane::offloads_atomic);
// every other atomic goes as a message the target's engine executes
// (docs/DESIGN.md, "Remote atomics"). The device writes the word's old
// value to result (width bytes; null: none wanted) before the slot
// completes. op and type are ami::AtomicOp and ami::AtomicType.
struct AtomicDescriptor {
  AtomicOp op = AtomicOp::fetch_add;
  AtomicType type = AtomicType::u64;
  std::uint64_t operand = 0;
  std::uint64_t compare = 0;  // compare_swap
  void* result = nullptr;
  std::uint64_t remote_address = 0;
  RemoteKey remote{};
  // The device's own: where a NIC lands the old value (the slot stays put
  // until it completes, and verbs registers the slots) before the device
  // copies it to result.
  std::uint64_t landing = 0;
};

// The same atomic with the key by reference: what a device does in the call
// (Lane::atomic_in_place), with no key copied into a slot first.
struct AtomicRef {
  AtomicOp op;
  AtomicType type;
  std::uint64_t operand;
  std::uint64_t compare;
  void* result;
  std::uint64_t remote_address;
  const RemoteKey& remote;

  static AtomicRef of(const AtomicDescriptor& a) {
    return {a.op, a.type, a.operand, a.compare, a.result, a.remote_address, a.remote};
  }
};

// One slot holds one kind, so the kinds share its bytes: a slot is as large
// as a packet, not as a packet and a PUT together, and a FIFO of them stays
// small in cache. Only `kind`'s member is meaningful; the protocol sets kind
// and writes that member's fields (each kind is plain data, written by
// assignment), and a device reads it only through visit().
struct Descriptor {
  Descriptor() : packet() {}

  DescriptorKind kind = DescriptorKind::packet;
  union {
    PacketDescriptor packet;
    RdmaDescriptor rdma;
    AtomicDescriptor atomic;
  };
};
static_assert(std::is_trivially_copyable_v<PacketDescriptor> && std::is_trivially_copyable_v<RdmaDescriptor>
              && std::is_trivially_copyable_v<AtomicDescriptor> && std::is_trivially_destructible_v<Descriptor>,
              "a slot's kinds are plain data that share its bytes");

// What handles every kind of descriptor: one member per kind.
template <class V>
concept DescriptorVisitor = requires(V& v, const PacketDescriptor& p, const RdmaDescriptor& x,
                                     const AtomicDescriptor& a) {
  v.packet(p);
  v.put(x);
  v.get(x);
  v.atomic(a);
};

// Calls the visitor's member for d's kind and returns what it returns. The
// switch has no default: a kind it misses is a -Wswitch error, and the
// concept makes every visitor handle each kind it names. Inline, so a
// device pays what its own test of the kind cost.
template <class V>
  requires DescriptorVisitor<std::remove_reference_t<V>>
[[gnu::always_inline]] inline decltype(auto) visit(const Descriptor& d, V&& v) {
  switch (d.kind) {
    case DescriptorKind::packet: return v.packet(d.packet);
    case DescriptorKind::put: return v.put(d.rdma);
    case DescriptorKind::get: return v.get(d.rdma);
    case DescriptorKind::atomic: return v.atomic(d.atomic);
  }
  __builtin_unreachable();  // only the protocol writes kind, always a named one
}

// A visitor made of one callable per kind, for a device that handles each
// in place: visit(d, cases(packet, put, get, atomic)), each a callable
// taking that kind's descriptor.
template <class Packet, class Put, class Get, class Atomic>
struct Cases {
  Packet packet;
  Put put;
  Get get;
  Atomic atomic;
};
// (A function rather than deduction from Cases{.packet = ...}: compilers
// without C++20's deduction for aggregates, clang before 17, refuse that.)
template <class Packet, class Put, class Get, class Atomic>
Cases<Packet, Put, Get, Atomic> cases(Packet packet, Put put, Get get, Atomic atomic) {
  return {packet, put, get, atomic};
}

}  // namespace ami::device
