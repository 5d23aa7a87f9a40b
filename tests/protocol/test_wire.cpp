// The wire decoder: every malformed header is rejected with its reason.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "wire/packet.hpp"

using namespace ami::wire;

namespace {

std::vector<std::byte> packet(const PacketHeader& h, std::size_t user, std::size_t payload) {
  std::vector<std::byte> p(sizeof h + user + payload, std::byte{0x5A});
  std::memcpy(p.data(), &h, sizeof h);
  return p;
}

PacketHeader good(std::uint32_t payload = 16, std::uint16_t user = 8) {
  return make_header(PacketType::am_first, 3, 42, payload, 0, payload, user);
}

DecodeError decode_bytes(const std::vector<std::byte>& p) {
  PacketView v;
  return decode(p, v);
}

}  // namespace

TEST_CASE("a well-formed packet decodes into its parts") {
  auto p = packet(good(16, 8), 8, 16);
  PacketView v;
  REQUIRE(decode(p, v) == DecodeError::none);
  CHECK(v.type() == PacketType::am_first);
  CHECK(v.header.dispatch == 3);
  CHECK(v.header.message_id == 42);
  CHECK(v.user_header.size() == 8);
  CHECK(v.payload.size() == 16);
  CHECK(v.payload.data() == p.data() + sizeof(PacketHeader) + 8);
}

TEST_CASE("truncated headers") {
  auto p = packet(good(), 8, 16);
  for (std::size_t n = 0; n < sizeof(PacketHeader); ++n) {
    std::vector<std::byte> cut(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(n));
    CHECK(decode_bytes(cut) == DecodeError::truncated);
  }
  // Fixed header whole, body cut short: the lengths no longer add up.
  std::vector<std::byte> cut(p.begin(), p.end() - 1);
  CHECK(decode_bytes(cut) == DecodeError::bad_length);
}

TEST_CASE("bad magic, version, type and flags") {
  PacketHeader h = good();
  h.magic = 0xDEADBEEF;
  CHECK(decode_bytes(packet(h, 8, 16)) == DecodeError::bad_magic);
  h = good();
  h.version = kVersion + 1;
  CHECK(decode_bytes(packet(h, 8, 16)) == DecodeError::bad_version);
  h = good();
  h.type = 0;
  CHECK(decode_bytes(packet(h, 8, 16)) == DecodeError::bad_type);
  h.type = kLastPacketType + 1;
  CHECK(decode_bytes(packet(h, 8, 16)) == DecodeError::bad_type);
  h = good();
  h.flags = 0x8000;
  CHECK(decode_bytes(packet(h, 8, 16)) == DecodeError::bad_flags);
  // Answer-soon only on a first packet that wants an answer.
  h = good();
  h.flags = kAnswerSoon;
  CHECK(decode_bytes(packet(h, 8, 16)) == DecodeError::bad_flags);
  h = make_header(PacketType::am_first, 3, 42, 64, 7, 16, 8, kWantsRemoteDone | kAnswerSoon);
  CHECK(decode_bytes(packet(h, 8, 16)) == DecodeError::none);
  h = make_header(PacketType::am_more, 3, 42, 64, 16, 16, 0, kAnswerSoon);
  CHECK(decode_bytes(packet(h, 0, 16)) == DecodeError::bad_flags);
}

TEST_CASE("oversize and inconsistent lengths") {
  PacketHeader h = good(16, kMaxUserHeader + 1);
  CHECK(decode_bytes(packet(h, kMaxUserHeader + 1, 16)) == DecodeError::bad_length);
  h = good(16, 8);
  h.payload_len = 17;  // claims more than the packet holds
  CHECK(decode_bytes(packet(h, 8, 16)) == DecodeError::bad_length);
  h = good(16, 8);
  CHECK(decode_bytes(packet(h, 8, 17)) == DecodeError::bad_length);  // trailing bytes
  h = good(16, 8);
  h.header_len = 0xFFFF;
  CHECK(decode_bytes(packet(h, 8, 16)) == DecodeError::bad_length);
  h = make_header(PacketType::ack, 0, 1, 0, 0, 4, 0);
  CHECK(decode_bytes(packet(h, 0, 4)) == DecodeError::bad_length);  // an answer has no payload
  h = make_header(PacketType::am_more, 0, 1, 64, 16, 16, 8);
  CHECK(decode_bytes(packet(h, 8, 16)) == DecodeError::bad_length);  // only a first packet has a user header
}

TEST_CASE("offsets outside the message") {
  PacketHeader h = make_header(PacketType::am_first, 0, 1, 100, 10, 16, 0);
  CHECK(decode_bytes(packet(h, 0, 16)) == DecodeError::bad_offset);  // first not at 0
  h = make_header(PacketType::am_more, 0, 1, 100, 90, 16, 0);
  CHECK(decode_bytes(packet(h, 0, 16)) == DecodeError::bad_offset);  // past the end
  h = make_header(PacketType::am_more, 0, 1, 100, ~std::uint64_t{0} - 4, 16, 0);
  CHECK(decode_bytes(packet(h, 0, 16)) == DecodeError::bad_offset);  // wraps
  h = make_header(PacketType::am_first, 0, 1, 8, 0, 16, 0);
  CHECK(decode_bytes(packet(h, 0, 16)) == DecodeError::bad_offset);  // more than the total
  h = make_header(PacketType::am_more, 0, 1, 100, 0, 16, 0);
  CHECK(decode_bytes(packet(h, 0, 16)) == DecodeError::bad_offset);  // a later packet at 0
}

TEST_CASE("random garbage is never accepted with inconsistent lengths") {
  std::mt19937_64 rng(12345);
  int accepted = 0;
  for (int i = 0; i < 200000; ++i) {
    std::vector<std::byte> p(rng() % 256);
    for (auto& b : p) b = static_cast<std::byte>(rng());
    if (p.size() >= 6 && (rng() & 1)) {  // often a valid start, to get past the first checks
      std::memcpy(p.data(), &kMagic, 4);
      p[4] = std::byte{kVersion};
      p[5] = static_cast<std::byte>(1 + rng() % kLastPacketType);
    }
    PacketView v;
    if (decode(p, v) != DecodeError::none) continue;
    ++accepted;
    REQUIRE(sizeof(PacketHeader) + v.user_header.size() + v.payload.size() == p.size());
    REQUIRE(v.header.offset + v.payload.size() <= v.header.total_len);
  }
  MESSAGE("garbage packets that happened to be well-formed: " << accepted);
}

TEST_CASE("every decode error has a name") {
  for (int e = 0; e < static_cast<int>(kDecodeErrors); ++e)
    CHECK(to_string(static_cast<DecodeError>(e)) != "unknown");
}

TEST_CASE("a short packet: header of 16 bytes, whole message, nothing to answer") {
  std::vector<std::byte> p(kShortHeaderBytes + 4 + 8);
  const std::byte user[4] = {std::byte{1}, std::byte{2}, std::byte{3}, std::byte{4}};
  REQUIRE(encode_short(7, 8, user, p.data()) == kShortHeaderBytes + 4);
  PacketView v;
  REQUIRE(decode(p, v) == DecodeError::none);
  CHECK(v.type() == PacketType::am_short);
  CHECK(v.header.dispatch == 7);
  CHECK(v.header.total_len == 8);
  CHECK(v.header.offset == 0);
  CHECK(v.user_header.size() == 4);
  CHECK(v.payload.size() == 8);

  std::vector<std::byte> cut(p.begin(), p.begin() + 15);
  CHECK(decode(cut, v) == DecodeError::truncated);
  std::vector<std::byte> longer = p;
  longer.push_back(std::byte{0});
  CHECK(decode(longer, v) == DecodeError::bad_length);
  std::vector<std::byte> flagged = p;
  flagged[6] = std::byte{kWantsRemoteDone};  // flags live at bytes 6..7
  CHECK(decode(flagged, v) == DecodeError::bad_flags);
}

TEST_CASE("a short packet's compact form: the immediate stands for the short header") {
  const std::byte user[4] = {std::byte{1}, std::byte{2}, std::byte{3}, std::byte{4}};
  std::vector<std::byte> whole(kShortHeaderBytes + 4 + 8);
  for (std::size_t i = 0; i < 8; ++i) whole[kShortHeaderBytes + 4 + i] = std::byte(0x40 + i);
  REQUIRE(encode_short(300, 8, user, whole.data()) == kShortHeaderBytes + 4);
  PacketView a, b;
  REQUIRE(decode(whole, a) == DecodeError::none);
  const std::uint32_t imm = compact_short(300, 4);
  const auto rest = std::span(whole).subspan(kShortHeaderBytes);
  REQUIRE(decode_compact(imm, rest, b) == DecodeError::none);
  // The same view as the whole packet's.
  CHECK(std::memcmp(&a.header, &b.header, sizeof a.header) == 0);
  CHECK(std::ranges::equal(a.user_header, b.user_header));
  CHECK(std::ranges::equal(a.payload, b.payload));
  CHECK(b.rendezvous.empty());
  // Nothing but the immediate: an empty message with no user header.
  REQUIRE(decode_compact(compact_short(0, 0), {}, b) == DecodeError::none);
  CHECK(b.type() == PacketType::am_short);
  CHECK(b.payload.empty());

  CHECK(decode_compact(imm ^ 0x80000000u, rest, b) == DecodeError::bad_magic);  // tag or version
  CHECK(decode_compact(compact_short(300, 13), rest, b) == DecodeError::bad_length);  // longer than what came
  CHECK(decode_compact(compact_short(300, kMaxUserHeader + 1), std::span(whole).first(0), b) ==
        DecodeError::bad_length);
  std::vector<std::byte> big(kMaxUserHeader + 2);
  CHECK(decode_compact(compact_short(1, kMaxUserHeader + 1), big, b) == DecodeError::bad_length);
}

namespace {

// A key as a registration with two backends would make it.
ami::RemoteKey two_entry_key() {
  ami::RemoteKey k{.job = 0x1122334455667788ull, .task = 3, .region = 9, .generation = 5,
                   .address = 0x7f0000001000ull, .length = 8192};
  const std::byte shm[4] = {std::byte{8}, {}, {}, {}};
  std::array<std::byte, ami::KeyEntry::kRoom> full{};
  for (std::size_t i = 0; i < full.size(); ++i) full[i] = static_cast<std::byte>(0xA0 + i);
  REQUIRE(k.add_entry(1, shm).ok());
  REQUIRE(k.add_entry(3, full).ok());  // a 64-bit key and 8 bytes more
  return k;
}

// Where the serialised key keeps its entry count and its first entry.
constexpr std::size_t kCountAt = 40;
constexpr std::size_t kEntriesAt = 44;
constexpr std::size_t kEntryBytes = 2 + ami::KeyEntry::kRoom;

}  // namespace

TEST_CASE("remote key: a round trip keeps every field and every backend's entry") {
  const ami::RemoteKey k = two_entry_key();
  ami::RemoteKey back;
  REQUIRE(ami::RemoteKey::from_bytes(k.to_bytes(), back).ok());
  CHECK(back == k);
  REQUIRE(back.entry(1) != nullptr);
  REQUIRE(back.entry(3) != nullptr);
  CHECK(back.entry(0) == nullptr);
  CHECK(back.entry(3)->length == ami::KeyEntry::kRoom);
  CHECK(std::ranges::equal(back.entry(3)->value(), k.entry(3)->value()));

  // As many entries as a key holds, and none at all.
  ami::RemoteKey many = k;
  REQUIRE(many.add_entry(0, {}).ok());
  REQUIRE(many.add_entry(2, std::span(k.entries[0].bytes).first(4)).ok());
  REQUIRE(ami::RemoteKey::from_bytes(many.to_bytes(), back).ok());
  CHECK(back == many);
  REQUIRE(ami::RemoteKey::from_bytes(ami::RemoteKey{}.to_bytes(), back).ok());
  CHECK(back == ami::RemoteKey{});
}

TEST_CASE("remote key: add_entry refuses a second entry of a backend, a full key, too many bytes") {
  ami::RemoteKey k = two_entry_key();
  const std::byte four[4] = {};
  CHECK(k.add_entry(1, four) == ami::StatusCode::invalid_argument);
  std::array<std::byte, ami::KeyEntry::kRoom + 1> long_bytes{};
  CHECK(k.add_entry(0, long_bytes) == ami::StatusCode::invalid_argument);
  REQUIRE(k.add_entry(0, four).ok());
  REQUIRE(k.add_entry(2, four).ok());
  CHECK(k.add_entry(7, four) == ami::StatusCode::no_resource);
  CHECK(k.entry_count == ami::kMaxKeyBackends);
}

TEST_CASE("remote key: from_bytes refuses every malformed form") {
  const auto good = two_entry_key().to_bytes();
  ami::RemoteKey out = two_entry_key();
  const ami::RemoteKey before = out;
  auto refused = [&](std::span<const std::byte> bytes, const char* why) {
    CAPTURE(why);
    const ami::Status s = ami::RemoteKey::from_bytes(bytes, out);
    CHECK(s == ami::StatusCode::invalid_argument);
    CHECK(out == before);  // nothing written
  };
  for (std::size_t n = 0; n < good.size(); n += 7) refused(std::span(good).first(n), "truncated");
  refused(std::span(good).first(good.size() - 1), "one byte short");

  auto bad = good;
  bad[0] = std::byte{'X'};
  refused(bad, "bad magic");
  bad = good;
  bad[3] = std::byte{'1'};  // "ARK1": the first layout
  refused(bad, "an older version");

  bad = good;
  bad[kCountAt] = std::byte{ami::kMaxKeyBackends + 1};
  refused(bad, "more entries than fit");
  bad[kCountAt] = std::byte{0xFF};
  refused(bad, "a count of 255");

  bad = good;
  bad[kEntriesAt + 1] = std::byte{ami::KeyEntry::kRoom + 1};
  refused(bad, "an entry longer than its room");
  bad = good;
  bad[kEntriesAt + kEntryBytes + 1] = std::byte{0xFF};
  refused(bad, "the second entry far longer than its room");

  bad = good;
  bad[kEntriesAt + kEntryBytes] = bad[kEntriesAt];  // the second entry names the first's backend
  refused(bad, "two entries of one backend");

  ami::RemoteKey wraps = two_entry_key();
  wraps.address = UINT64_MAX - 100;
  wraps.length = 200;
  refused(wraps.to_bytes(), "a range that wraps");
}

TEST_CASE("rendezvous info carries the key with the lane's backend entry, and refuses a malformed one") {
  const ami::RemoteKey whole = two_entry_key();
  RendezvousInfo info{.key = whole, .address = 0x7f0000001000ull + 100};
  // Where the entry's length lies.
  constexpr std::size_t kLengthAt = 37;
  for (std::uint8_t backend : {1, 3}) {
    CAPTURE(int{backend});
    std::array<std::byte, RendezvousInfo::kBytes> bytes{};
    info.encode(bytes.data(), backend);
    RendezvousInfo back;
    REQUIRE(RendezvousInfo::decode(bytes, 4000, back));
    CHECK(back.address == info.address);
    CHECK(back.key.job == whole.job);
    CHECK(back.key.task == whole.task);
    CHECK(back.key.region == whole.region);
    CHECK(back.key.generation == whole.generation);
    CHECK(back.key.address == whole.address);
    CHECK(back.key.length == whole.length);
    CHECK(back.key.entry_count == 1);  // only that backend's
    REQUIRE(back.key.entry(backend) != nullptr);
    CHECK(*back.key.entry(backend) == *whole.entry(backend));
    CHECK_FALSE(RendezvousInfo::decode(std::span(bytes).first(RendezvousInfo::kBytes - 1), 4000, back));
    CHECK_FALSE(RendezvousInfo::decode(bytes, 8192, back));  // past the key's range
    auto bad = bytes;
    bad[kLengthAt] = std::byte{ami::KeyEntry::kRoom + 1};
    CHECK_FALSE(RendezvousInfo::decode(bad, 4000, back));
    bad[kLengthAt] = std::byte{0xFE};
    CHECK_FALSE(RendezvousInfo::decode(bad, 4000, back));
  }
  // A backend the key has no entry for: the key arrives without entries,
  // and that backend refuses it when it is used.
  std::array<std::byte, RendezvousInfo::kBytes> bytes{};
  info.encode(bytes.data(), 2);
  RendezvousInfo back;
  REQUIRE(RendezvousInfo::decode(bytes, 4000, back));
  CHECK(back.key.entry_count == 0);
  // A key whose range wraps.
  info.key.address = UINT64_MAX - 100;
  info.address = info.key.address;
  info.key.length = 200;
  info.encode(bytes.data(), 1);
  CHECK_FALSE(RendezvousInfo::decode(bytes, 4, back));
}
