// protocol/wire/packet.hpp — the fixed, versioned header every ami packet
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
#include <span>
#include <string_view>

namespace ami::wire {

static_assert(std::endian::native == std::endian::little, "the wire format is little-endian");

inline constexpr std::uint32_t kMagic = 0x21494D41;  // "AMI!"
inline constexpr std::uint8_t kVersion = 1;
inline constexpr std::size_t kMaxUserHeader = 128;

enum class PacketType : std::uint8_t {
  am_first = 1,     // first packet of an active message: user header + payload from 0
  am_more = 2,      // a later fragment of the message in flight on this lane
  remote_done = 3,  // the target finished a message whose sender asked to know
  am_short = 4,     // a whole message, no answer wanted: the short header only
};
inline constexpr std::uint8_t kLastPacketType = 4;

enum PacketFlags : std::uint16_t {
  kWantsRemoteDone = 1u << 0,  // am_first: answer with remote_done when done
  kDispatchMissing = 1u << 1,  // remote_done: the target had no handler
};
inline constexpr std::uint16_t kKnownFlags = kWantsRemoteDone | kDispatchMissing;

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
  std::uint64_t offset;       // of this packet's payload in the message
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
  bad_offset,   // payload lies outside the message, or a first packet not at 0
};
inline constexpr std::size_t kDecodeErrors = 8;
std::string_view to_string(DecodeError e);

// An am_short arrives with message_id 0, total_len = payload_len, offset 0,
// and is dispatched as an am_first.
struct PacketView {
  PacketHeader header;
  std::span<const std::byte> user_header;
  std::span<const std::byte> payload;
  PacketType type() const { return static_cast<PacketType>(header.type); }
};

DecodeError decode(std::span<const std::byte> packet, PacketView& out);

// Writes the fixed header and the user header into out (which must hold
// sizeof(PacketHeader) + user_header.size() bytes); returns bytes written.
std::size_t encode(const PacketHeader& header, std::span<const std::byte> user_header,
                   std::byte* out);

// The same for an am_short: writes kShortHeaderBytes + user_header.size().
std::size_t encode_short(std::uint16_t dispatch, std::uint32_t payload_len,
                         std::span<const std::byte> user_header, std::byte* out);

PacketHeader make_header(PacketType type, std::uint16_t dispatch, std::uint64_t message_id,
                         std::uint64_t total_len, std::uint64_t offset,
                         std::uint32_t payload_len, std::uint16_t header_len,
                         std::uint16_t flags = 0);

}  // namespace ami::wire
