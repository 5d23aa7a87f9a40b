// protocol/am/wire/packet.cpp — encoding and validating packet headers.
#include "packet.hpp"

#include <cstring>
#include <limits>

namespace ami::wire {

std::string_view to_string(DecodeError e) {
  switch (e) {
    case DecodeError::none: return "none";
    case DecodeError::truncated: return "truncated";
    case DecodeError::bad_magic: return "bad_magic";
    case DecodeError::bad_version: return "bad_version";
    case DecodeError::bad_type: return "bad_type";
    case DecodeError::bad_flags: return "bad_flags";
    case DecodeError::bad_length: return "bad_length";
    case DecodeError::bad_offset: return "bad_offset";
  }
  return "unknown";
}

namespace {

// Bytes between the user header and the payload.
std::size_t extra_bytes(const PacketHeader& h) {
  const auto type = static_cast<PacketType>(h.type);
  return type == PacketType::am_first && (h.flags & kRendezvous) ? RendezvousInfo::kBytes : 0;
}

DecodeError check_lengths(const PacketHeader& h, std::size_t size) {
  if (h.header_len > kMaxUserHeader) return DecodeError::bad_length;
  const std::size_t body = size - sizeof(PacketHeader);
  const std::size_t extra = extra_bytes(h);
  if (std::size_t{h.header_len} + extra > body || h.payload_len != body - h.header_len - extra)
    return DecodeError::bad_length;
  // What each type may carry after the fixed header. (No default here or
  // below: a new type does not compile before it says how it is checked.)
  switch (static_cast<PacketType>(h.type)) {
    case PacketType::am_first:
    case PacketType::am_short: return DecodeError::none;
    case PacketType::am_more: return h.header_len == 0 ? DecodeError::none : DecodeError::bad_length;
    case PacketType::stop: {
      const bool put = h.dispatch == static_cast<std::uint16_t>(StopMode::stop_put);
      const bool ok = h.header_len == 0 && h.payload_len == (put ? RendezvousInfo::kBytes : 0);
      return ok ? DecodeError::none : DecodeError::bad_length;
    }
    case PacketType::atomic:
      return h.header_len == 0 && h.payload_len == AtomicArgs::kBytes ? DecodeError::none : DecodeError::bad_length;
    case PacketType::ack:
    case PacketType::cts:
    case PacketType::fin:
    case PacketType::fence:
    case PacketType::keepalive:
    case PacketType::atomic_reply:
      return h.header_len == 0 && h.payload_len == 0 ? DecodeError::none : DecodeError::bad_length;
  }
  return DecodeError::bad_type;
}

// The fixed header's dispatch, message_id, total_len and offset, as each
// type uses them (see PacketType).
DecodeError check_offsets(const PacketHeader& h) {
  switch (static_cast<PacketType>(h.type)) {
    case PacketType::stop:
      if (h.dispatch < static_cast<std::uint16_t>(StopMode::discard_get) ||
          h.dispatch > static_cast<std::uint16_t>(StopMode::stop_put))
        return DecodeError::bad_offset;
      return DecodeError::none;
    case PacketType::fence:
    case PacketType::keepalive: return DecodeError::none;
    case PacketType::atomic:
      return (h.dispatch & 0xFFu) > kLastAtomicOp || (h.dispatch >> 8) > kLastAtomicType ? DecodeError::bad_offset
                                                                                          : DecodeError::none;
    case PacketType::atomic_reply: return h.dispatch > kLastAtomicRefusal ? DecodeError::bad_offset : DecodeError::none;
    case PacketType::ack: return h.total_len == 0 ? DecodeError::bad_length : DecodeError::none;
    case PacketType::am_first:
      // offset is the ack sequence number: wanted exactly when an answer is
      if ((h.offset != 0) != ((h.flags & kWantsAnswer) != 0)) return DecodeError::bad_offset;
      return h.payload_len > h.total_len ? DecodeError::bad_offset : DecodeError::none;
    case PacketType::am_short: return DecodeError::none;  // (decode_short() checks it)
    case PacketType::cts:
    case PacketType::fin: return h.offset > h.total_len ? DecodeError::bad_offset : DecodeError::none;
    case PacketType::am_more:
      if (h.offset > h.total_len || h.payload_len > h.total_len - h.offset) return DecodeError::bad_offset;
      return h.offset == 0 || h.payload_len == 0 ? DecodeError::bad_offset : DecodeError::none;
  }
  return DecodeError::bad_type;
}

}  // namespace

namespace {

DecodeError decode_short(const PacketHeader& h, std::span<const std::byte> packet, PacketView& out) {
  if (h.flags != 0) return DecodeError::bad_flags;  // nothing to answer, nothing else to say
  if (h.header_len > kMaxUserHeader) return DecodeError::bad_length;
  const std::size_t body = packet.size() - kShortHeaderBytes;
  if (h.header_len > body || h.payload_len != body - h.header_len) return DecodeError::bad_length;
  out.header = h;
  out.header.message_id = 0;
  out.header.total_len = h.payload_len;
  out.header.offset = 0;
  out.user_header = packet.subspan(kShortHeaderBytes, h.header_len);
  out.rendezvous = {};
  out.payload = packet.subspan(kShortHeaderBytes + h.header_len, h.payload_len);
  return DecodeError::none;
}

}  // namespace

DecodeError decode(std::span<const std::byte> packet, PacketView& out) {
  if (packet.size() < kShortHeaderBytes) return DecodeError::truncated;
  PacketHeader h{};
  std::memcpy(&h, packet.data(), kShortHeaderBytes);
  if (h.magic != kMagic) return DecodeError::bad_magic;
  if (h.version != kVersion) return DecodeError::bad_version;
  if (h.type == 0 || h.type > kLastPacketType) return DecodeError::bad_type;
  if (h.type == static_cast<std::uint8_t>(PacketType::am_short)) return decode_short(h, packet, out);
  if (packet.size() < sizeof(PacketHeader)) return DecodeError::truncated;
  std::memcpy(&h, packet.data(), sizeof h);
  if ((h.flags & ~kKnownFlags) != 0) return DecodeError::bad_flags;
  // (Only a first packet that wants an answer can ask for it soon.)
  if ((h.flags & kAnswerSoon) != 0 &&
      (h.type != static_cast<std::uint8_t>(PacketType::am_first) || (h.flags & kWantsAnswer) == 0))
    return DecodeError::bad_flags;
  if (DecodeError e = check_lengths(h, packet.size()); e != DecodeError::none) return e;
  if (DecodeError e = check_offsets(h); e != DecodeError::none) return e;
  const std::size_t extra = extra_bytes(h);
  out.header = h;
  out.user_header = packet.subspan(sizeof h, h.header_len);
  out.rendezvous = packet.subspan(sizeof h + h.header_len, extra);
  out.payload = packet.subspan(sizeof h + h.header_len + extra, h.payload_len);
  return DecodeError::none;
}

DecodeError decode_compact(std::uint32_t immediate, std::span<const std::byte> rest, PacketView& out) {
  CompactView c;
  if (DecodeError e = decode_compact(immediate, rest, c); e != DecodeError::none) return e;
  const auto payload_len = static_cast<std::uint32_t>(c.payload.size());
  out.header = make_header(PacketType::am_short, c.dispatch, 0, payload_len, 0, payload_len,
                           static_cast<std::uint16_t>(c.user_header.size()));
  out.user_header = c.user_header;
  out.rendezvous = {};
  out.payload = c.payload;
  return DecodeError::none;
}

namespace {

// RendezvousInfo's layout (packet.hpp).
constexpr std::size_t kInfoEntry = 36;   // backend u8, length u8, bytes
constexpr std::size_t kInfoAddress = kInfoEntry + 2 + KeyEntry::kRoom;
static_assert(kInfoAddress + 8 == RendezvousInfo::kBytes);

}  // namespace

void RendezvousInfo::encode(std::byte* out, std::uint8_t backend) const {
  std::memset(out, 0, kBytes);
  out[kInfoEntry + 1] = std::byte{kNoEntry};
  std::memcpy(out, &key.job, 8);
  std::memcpy(out + 8, &key.address, 8);
  std::memcpy(out + 16, &key.length, 8);
  std::memcpy(out + 24, &key.task, 4);
  std::memcpy(out + 28, &key.region, 4);
  std::memcpy(out + 32, &key.generation, 4);
  if (const KeyEntry* e = key.entry(backend)) {
    out[kInfoEntry] = std::byte{e->backend};
    out[kInfoEntry + 1] = std::byte{e->length};
    std::memcpy(out + kInfoEntry + 2, e->bytes.data(), KeyEntry::kRoom);
  }
  std::memcpy(out + kInfoAddress, &address, sizeof address);
}

bool RendezvousInfo::decode(std::span<const std::byte> in, std::uint64_t total, RendezvousInfo& out) {
  if (in.size() != kBytes) return false;
  RendezvousInfo r;
  const std::byte* p = in.data();
  std::memcpy(&r.key.job, p, 8);
  std::memcpy(&r.key.address, p + 8, 8);
  std::memcpy(&r.key.length, p + 16, 8);
  std::memcpy(&r.key.task, p + 24, 4);
  std::memcpy(&r.key.region, p + 28, 4);
  std::memcpy(&r.key.generation, p + 32, 4);
  const auto entry_length = static_cast<std::uint8_t>(p[kInfoEntry + 1]);
  if (entry_length > KeyEntry::kRoom && entry_length != kNoEntry) return false;
  if (entry_length != kNoEntry &&
      !r.key.add_entry(static_cast<std::uint8_t>(p[kInfoEntry]), in.subspan(kInfoEntry + 2, entry_length)).ok())
    return false;
  std::memcpy(&r.address, p + kInfoAddress, sizeof r.address);
  // The key's range does not wrap, and the message's bytes lie inside it.
  if (r.key.address + r.key.length < r.key.address) return false;
  if (r.address < r.key.address || r.address - r.key.address > r.key.length ||
      total > r.key.length - (r.address - r.key.address))
    return false;
  out = r;
  return true;
}

std::size_t encode(const PacketHeader& header, std::span<const std::byte> user_header,
                   std::byte* out) {
  std::memcpy(out, &header, sizeof header);
  if (!user_header.empty()) std::memcpy(out + sizeof header, user_header.data(), user_header.size());
  return sizeof header + user_header.size();
}

PacketHeader make_header(PacketType type, std::uint16_t dispatch, std::uint64_t message_id,
                         std::uint64_t total_len, std::uint64_t offset,
                         std::uint32_t payload_len, std::uint16_t header_len,
                         std::uint16_t flags) {
  return PacketHeader{.magic = kMagic, .version = kVersion, .type = static_cast<std::uint8_t>(type),
                      .flags = flags, .dispatch = dispatch, .header_len = header_len,
                      .payload_len = payload_len, .message_id = message_id,
                      .total_len = total_len, .offset = offset};
}

}  // namespace ami::wire
