// fabric_backend/ofi_wire.hpp — what the libfabric backend itself puts on
// the wire: the 32 bits of CQ data that name a packet's origin and its form,
// the sequence header some packets carry, and the task's entry in the
// address blob.
//
// The low 32 bits of every packet's CQ data: the origin (task << 8 |
// context), since not every provider reports a message's source (tcp;ofi_rxm
// has no FI_SOURCE), and two flags. kCompact: the packet's short header
// travels as the upper 32 bits of the CQ data, where the provider carries 8
// bytes of it. kSequenced: the packet starts with a SequenceHeader, the
// lane's count of packets, so that a receiver restores each origin's order
// where the provider completes receives out of order (rx comp_order without
// FI_ORDER_STRICT: tcp;ofi_rxm completes a large message after later small
// ones). Where receives complete in order (shm) packets carry no header at
// all. kBundle: the message holds several packets, each led by its length
// (4 bytes), in the order sent: small packets a lane sent together, in one
// provider call (ofi_device.hpp). A bundle is never compact, and takes one
// sequence number.
//
// All of it is untrusted input: a receiver drops and counts what does not
// parse or names no peer it knows.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace ami::ofi {

// The origin field's split: 21 bits of task, 8 of context, 3 flags.
inline constexpr std::uint32_t kMaxContexts = 256;
inline constexpr std::uint32_t kMaxTasks = 1u << 21;
inline constexpr std::uint32_t kCompact = 1u << 31;    // the CQ data's upper half is the short header
inline constexpr std::uint32_t kSequenced = 1u << 30;  // a SequenceHeader leads the packet
inline constexpr std::uint32_t kBundle = 1u << 29;     // packets, each after its length
inline constexpr std::uint32_t kFlags = kCompact | kSequenced | kBundle;

inline std::uint32_t origin_word(std::uint32_t task, std::uint16_t context) { return task << 8 | context; }
inline std::uint32_t origin_task(std::uint32_t word) { return (word & ~kFlags) >> 8; }
inline std::uint16_t origin_context(std::uint32_t word) { return static_cast<std::uint16_t>(word & 0xFF); }

struct SequenceHeader {
  std::uint16_t seq = 0;  // the lane's sequenced packets, counted from 0, wrapping
  std::uint16_t reserved = 0;
};
static_assert(sizeof(SequenceHeader) == 4);
inline constexpr std::size_t kHeaderBytes = sizeof(SequenceHeader);

// A bundle: each packet's length before it. (How large a bundle may be is
// the device's choice: ofi_device.hpp.)
inline constexpr std::size_t kBundleEntryBytes = sizeof(std::uint32_t);

// Bytes a packet may carry beyond AMI_OFI_PACKET_SIZE: room for the
// protocol's headers, so that a message of the packet size (64 KiB on shm,
// one CMA copy) is still one packet.
inline constexpr std::size_t kHeadroom = 64;
// The message bytes of a packet over rxm, whose eager size ami sets to hold
// them and the headers (ofi_fabric.cpp, set_rxm_eager()).
inline constexpr std::size_t kRxmPacketBytes = 16384;

// The task's entry in the address blob.
struct AddressEntry {
  static constexpr std::uint8_t kVersion = 1;
  std::string provider;
  std::vector<std::vector<std::byte>> names;  // one per context

  std::vector<std::byte> encode() const {
    const std::uint8_t version = kVersion, name_len = static_cast<std::uint8_t>(provider.size());
    // Names of one length (shm's are strings of any): the longest, the
    // others padded with zeros.
    std::size_t longest = 0;
    for (const auto& n : names) longest = std::max(longest, n.size());
    const auto addr_len = static_cast<std::uint16_t>(longest);
    const std::uint16_t count = static_cast<std::uint16_t>(names.size());
    // Sized once, then filled: (GCC 12 at -O3 takes byte-wise inserts for overflows.)
    std::vector<std::byte> out(2 + provider.size() + 4 + std::size_t{addr_len} * count);
    std::byte* p = out.data();
    auto put = [&p](const void* from, std::size_t n) {
      if (n != 0) std::memcpy(p, from, n);
      p += n;
    };
    put(&version, 1);
    put(&name_len, 1);
    put(provider.data(), provider.size());
    put(&addr_len, 2);
    put(&count, 2);
    for (const auto& n : names) {
      put(n.data(), n.size());
      p += addr_len - n.size();  // (zeros already)
    }
    return out;
  }

  // false for a truncated or inconsistent entry, or another version.
  static bool decode(std::span<const std::byte> in, AddressEntry& out) {
    std::size_t at = 0;
    auto get = [&in, &at](void* p, std::size_t n) {
      if (in.size() - at < n) return false;
      std::memcpy(p, in.data() + at, n);
      at += n;
      return true;
    };
    std::uint8_t version = 0, name_len = 0;
    std::uint16_t addr_len = 0, count = 0;
    if (!get(&version, 1) || version != kVersion || !get(&name_len, 1)) return false;
    out.provider.resize(name_len);
    if (!get(out.provider.data(), name_len) || !get(&addr_len, 2) || !get(&count, 2)) return false;
    if (addr_len == 0 || in.size() - at != std::size_t{addr_len} * count) return false;
    out.names.assign(count, std::vector<std::byte>(addr_len));
    for (auto& n : out.names) get(n.data(), addr_len);
    return true;
  }
};

}  // namespace ami::ofi
