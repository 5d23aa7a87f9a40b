// protocol/am/wire/packet.hpp — the fixed, versioned header every ami packet
// starts with, and the decoder that validates it.
//
// Layout of a packet: PacketHeader (40 bytes, little-endian), then
// header_len bytes of the user's header, then payload_len bytes of payload.
// A whole message in one packet that wants no answer (am_short) sends only
// the header's first kShortHeaderBytes, which keeps a small message within
// one cache line of a shared-memory ring.
// Wire input is untrusted: decode() checks magic, version, type, every length
// and offset before anything reads past the fixed header, and says what was
// wrong; the caller drops and counts a packet that fails.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string_view>

#include "ami/atomic.hpp"
#include "ami/memory.hpp"

namespace ami::wire {

static_assert(std::endian::native == std::endian::little, "the wire format is little-endian");

inline constexpr std::uint32_t kMagic = 0x21494D41;  // "AMI!"
inline constexpr std::uint8_t kVersion = 2;
inline constexpr std::size_t kMaxUserHeader = 128;

// The rendezvous packets (docs/DESIGN.md, method 2) use the fixed header's fields
// as their comments say; the others as the field names say. The engine
// builds them from typed items (AmEngine::header_of); decode() checks each
// type, and the engine dispatches each, in switches without a default, so
// a new type that either misses does not compile.
enum class PacketType : std::uint8_t {
  am_first = 1,  // first packet of an active message: user header + payload from 0; with
                 // kRendezvous, a RendezvousInfo sits between the user header and the payload.
                 // offset = its ack sequence number when it wants an answer (kWantsAnswer), else 0
  am_more = 2,   // a later eager packet of the message in flight on this lane
  ack = 3,       // the receiver is done with total_len messages, whose ack sequence numbers
                 // start at offset; flags: their common outcome
  am_short = 4,  // a whole message, no answer wanted: the short header only
  stop = 5,      // receiver to sender: stop sending eagerly. message_id = the sender's id,
                 // offset = the receiver's id for it, dispatch = the StopMode; with
                 // stop_put the payload is the receive buffer's RendezvousInfo
  cts = 6,       // sender's answer to a GET stop: message_id = the receiver's id,
                 // offset = eager bytes sent (all of them are ahead of this packet)
  fin = 7,       // after the PUT of a stop_put: fields as cts
  fence = 8,     // behind the origin's earlier operations on the lane: offset = its ack
                 // sequence number; answered by an ack once dispatched
  keepalive = 9, // the origin waits for an answer and heard nothing for a while: the lane
                 // carrying it (or failing to) says whether the peer lives; dropped on arrival
  atomic = 10,   // a remote atomic the target's engine does (docs/DESIGN.md, "Remote atomics"):
                 // message_id = the origin's id for it, offset = the word's address,
                 // dispatch = op | type << 8, payload = AtomicArgs
  atomic_reply = 11,  // its answer: message_id = the origin's id, offset = the word's old
                      // value, dispatch = an AtomicRefusal (none: done)
};
inline constexpr std::uint8_t kLastPacketType = 11;

// The rest of an atomic packet: the key's region and generation (the
// target checks them against its region table, with its own job and task)
// and the operands, little-endian.
struct AtomicArgs {
  static constexpr std::size_t kBytes = 24;
  std::uint32_t region = 0;
  std::uint32_t generation = 0;
  std::uint64_t operand = 0;
  std::uint64_t compare = 0;
  void encode(std::byte* out) const {
    std::memcpy(out, &region, 4);
    std::memcpy(out + 4, &generation, 4);
    std::memcpy(out + 8, &operand, 8);
    std::memcpy(out + 16, &compare, 8);
  }
  static AtomicArgs decode(std::span<const std::byte> in) {  // (decode() checked its length)
    AtomicArgs a;
    std::memcpy(&a.region, in.data(), 4);
    std::memcpy(&a.generation, in.data() + 4, 4);
    std::memcpy(&a.operand, in.data() + 8, 8);
    std::memcpy(&a.compare, in.data() + 16, 8);
    return a;
  }
};
// Why a target did not do an atomic; the origin's callback names it.
// nic_failed: the target's NIC failed the atomic on a NIC-domain region
// (its atomic loopback broke, or none could be made).
enum class AtomicRefusal : std::uint16_t { none, stale_key, out_of_bounds, misaligned, bad_op, nic_failed };
inline constexpr std::uint16_t kLastAtomicRefusal = static_cast<std::uint16_t>(AtomicRefusal::nic_failed);

enum PacketFlags : std::uint16_t {
  kWantsRemoteDone = 1u << 0,  // am_first: the sender wants a remote-done
  kDispatchMissing = 1u << 1,  // ack: the target had no handler
  kRendezvous = 1u << 2,       // am_first: the receiver may stop it; it must be acked
  kFailed = 1u << 3,           // ack: the data did not all arrive (a GET failed)
  kAnswerSoon = 1u << 4,       // am_first wanting an answer: nothing else of its sender's awaits one from
                               // this receiver, so no batch would share the ack: answer when done
};
inline constexpr std::uint16_t kKnownFlags = kWantsRemoteDone | kDispatchMissing | kRendezvous | kFailed | kAnswerSoon;
// An am_first with either flag wants an ack.
inline constexpr std::uint16_t kWantsAnswer = kWantsRemoteDone | kRendezvous;

enum class StopMode : std::uint16_t { discard_get = 1, split_get = 2, stop_put = 3 };

// Where a buffer of the rendezvous lies: its registration's remote key and
// its first byte's address (inside the key's range). On the wire the key
// has its backend-neutral fields and one entry, that of the backend that
// carries the lane (the peer reaches the buffer through the same backend),
// so that a long message's first packet keeps room for the largest user
// header on default shm cells: job, address, length (u64), task, region,
// generation (u32), the entry's backend and length (u8; kNoEntry: the key
// has none) and its KeyEntry::kRoom bytes, the buffer's address (u64).
struct RendezvousInfo {
  static constexpr std::size_t kBytes = 62;
  static constexpr std::uint8_t kNoEntry = 0xFF;
  RemoteKey key{};
  std::uint64_t address = 0;
  // Writes key's entry for backend (none when key has none: the peer's
  // backend then refuses the key).
  void encode(std::byte* out, std::uint8_t backend) const;
  // Rejects an entry longer than its room, a key range that wraps, and an
  // address outside the key's range.
  static bool decode(std::span<const std::byte> in, std::uint64_t total, RendezvousInfo& out);
};

struct PacketHeader {
  std::uint32_t magic;
  std::uint8_t version;
  std::uint8_t type;
  std::uint16_t flags;
  std::uint16_t dispatch;
  std::uint16_t header_len;   // user header bytes following this struct
  std::uint32_t payload_len;  // payload bytes in this packet
  std::uint64_t message_id;   // chosen by the origin
  std::uint64_t total_len;    // payload bytes of the whole message
  std::uint64_t offset;       // of this packet's payload in the message (see PacketType)
};
static_assert(sizeof(PacketHeader) == 40);
inline constexpr std::size_t kShortHeaderBytes = 16;  // magic..payload_len

enum class DecodeError : std::uint8_t {
  none,
  truncated,    // shorter than the fixed header
  bad_magic,
  bad_version,
  bad_type,
  bad_flags,
  bad_length,   // header/payload lengths disagree with the packet's size or limits
  bad_offset,   // payload lies outside the message, or an am_first's ack sequence number
                // disagrees with its flags
};
inline constexpr std::size_t kDecodeErrors = 8;
std::string_view to_string(DecodeError e);

// An am_short arrives with message_id 0, total_len = payload_len, offset 0,
// and is dispatched as an am_first.
struct PacketView {
  PacketHeader header;
  std::span<const std::byte> user_header;
  std::span<const std::byte> rendezvous;  // am_first with kRendezvous: RendezvousInfo::kBytes
  std::span<const std::byte> payload;
  PacketType type() const { return static_cast<PacketType>(header.type); }
};

DecodeError decode(std::span<const std::byte> packet, PacketView& out);

// Writes the fixed header and the user header into out (which must hold
// sizeof(PacketHeader) + user_header.size() bytes); returns bytes written.
std::size_t encode(const PacketHeader& header, std::span<const std::byte> user_header,
                   std::byte* out);

// The same for an am_short: writes kShortHeaderBytes + user_header.size().
// (Inline, with the compact form's two below: they are on every small
// message's path.)
inline std::size_t encode_short(std::uint16_t dispatch, std::uint32_t payload_len,
                                std::span<const std::byte> user_header, std::byte* out) {
  const PacketHeader h{.magic = kMagic, .version = kVersion, .type = static_cast<std::uint8_t>(PacketType::am_short),
                       .flags = 0, .dispatch = dispatch, .header_len = static_cast<std::uint16_t>(user_header.size()),
                       .payload_len = payload_len, .message_id = 0, .total_len = 0, .offset = 0};
  std::memcpy(out, &h, kShortHeaderBytes);
  if (!user_header.empty()) std::memcpy(out + kShortHeaderBytes, user_header.data(), user_header.size());
  return kShortHeaderBytes + user_header.size();
}

// The compact form of an am_short (device::PacketDescriptor::compact_prefix),
// for a device that sends a 32-bit immediate with a packet: the immediate
// stands for the short header (a tag with the version, the user header's
// length, the dispatch id) and the packet carries the user header and the
// payload only: a 4096-byte message fills one 4096-byte MTU frame, not two.
// Immediate: tag (bits 31..24), user header bytes (23..16), dispatch (15..0).
inline constexpr std::uint32_t kCompactTag = 0xA0u | kVersion;
constexpr std::uint32_t compact_short(std::uint16_t dispatch, std::uint16_t header_len) {
  return kCompactTag << 24 | std::uint32_t{header_len & 0xFFu} << 16 | dispatch;
}
// What a compact packet says: an am_short is nothing more.
struct CompactView {
  std::uint16_t dispatch = 0;
  std::span<const std::byte> user_header;
  std::span<const std::byte> payload;
};
// Checks the immediate as decode() checks a short header (a wrong tag is
// bad_magic) and fills out: as decode() would for the whole packet, or
// with the short message's three parts (the receive path's form).
inline DecodeError decode_compact(std::uint32_t immediate, std::span<const std::byte> rest, CompactView& out) {
  if (immediate >> 24 != kCompactTag) return DecodeError::bad_magic;
  const std::uint16_t header_len = (immediate >> 16) & 0xFFu;
  if (header_len > kMaxUserHeader || header_len > rest.size() ||
      rest.size() - header_len > std::numeric_limits<std::uint32_t>::max())
    return DecodeError::bad_length;
  out.dispatch = static_cast<std::uint16_t>(immediate & 0xFFFFu);
  out.user_header = rest.first(header_len);
  out.payload = rest.subspan(header_len);
  return DecodeError::none;
}
DecodeError decode_compact(std::uint32_t immediate, std::span<const std::byte> rest, PacketView& out);

PacketHeader make_header(PacketType type, std::uint16_t dispatch, std::uint64_t message_id,
                         std::uint64_t total_len, std::uint64_t offset,
                         std::uint32_t payload_len, std::uint16_t header_len,
                         std::uint16_t flags = 0);

}  // namespace ami::wire
