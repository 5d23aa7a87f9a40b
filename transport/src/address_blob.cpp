// address_blob.cpp — encoding and checking address blobs.
#include "address_blob.hpp"

#include <algorithm>

#include <cstring>
#include <fstream>

#include "ami/device/byte_io.hpp"

namespace ami {

namespace {

constexpr std::size_t kFixedBytes = 4 + 2 + 2 + 8 + 4 + 2 + 2 + 4 + AddressBlob::kBootIdBytes;
constexpr std::size_t kEntryHeadBytes = 2 + 2 + 4;

using detail::load;
using detail::store;

}  // namespace

const std::vector<std::byte>* AddressBlob::entry(std::uint16_t backend) const {
  for (const Entry& e : entries)
    if (e.backend == backend) return &e.bytes;
  return nullptr;
}

// Layout: magic u32, version u16, entry count u16, job u64, task u32,
// contexts u16, hostname length u16, pid u32, boot id (40 bytes, NUL
// padded), hostname; then per entry: backend id u16, reserved u16, length
// u32, the backend's bytes.
std::vector<std::byte> AddressBlob::encode() const {
  const std::size_t host_len = std::min(hostname.size(), kMaxHostname);
  std::size_t size = kFixedBytes + host_len;
  for (const Entry& e : entries) size += kEntryHeadBytes + e.bytes.size();
  std::vector<std::byte> out(size);
  std::byte* p = out.data();
  store(p, kMagic);
  store(p, kVersion);
  store(p, static_cast<std::uint16_t>(entries.size()));
  store(p, job);
  store(p, task);
  store(p, contexts);
  store(p, static_cast<std::uint16_t>(host_len));
  store(p, pid);
  std::memcpy(p, boot_id.data(), std::min(boot_id.size(), kBootIdBytes - 1));  // NUL padded
  p += kBootIdBytes;
  std::memcpy(p, hostname.data(), host_len);
  p += host_len;
  for (const Entry& e : entries) {
    store(p, e.backend);
    store(p, std::uint16_t{0});
    store(p, static_cast<std::uint32_t>(e.bytes.size()));
    if (!e.bytes.empty()) std::memcpy(p, e.bytes.data(), e.bytes.size());
    p += e.bytes.size();
  }
  return out;
}

Status AddressBlob::decode(std::span<const std::byte> bytes, AddressBlob& out) {
  if (bytes.size() < kFixedBytes) return {StatusCode::malformed_packet, "address blob is truncated"};
  const std::byte* p = bytes.data();
  if (load<std::uint32_t>(p) != kMagic) return {StatusCode::malformed_packet, "address blob has a bad magic"};
  if (load<std::uint16_t>(p) != kVersion)
    return {StatusCode::malformed_packet, "address blob has an unsupported version"};
  AddressBlob a;
  const auto count = load<std::uint16_t>(p);
  a.job = load<std::uint64_t>(p);
  a.task = load<std::uint32_t>(p);
  a.contexts = load<std::uint16_t>(p);
  const auto host_len = load<std::uint16_t>(p);
  a.pid = load<std::uint32_t>(p);
  const char* boot = reinterpret_cast<const char*>(p);
  p += kBootIdBytes;
  if (count > kMaxEntries) return {StatusCode::malformed_packet, "address blob has too many backend entries"};
  if (a.contexts == 0) return {StatusCode::malformed_packet, "address blob has no contexts"};
  if (host_len > kMaxHostname || bytes.size() < kFixedBytes + host_len)
    return {StatusCode::malformed_packet, "address blob length does not match its hostname"};
  if (std::memchr(boot, '\0', kBootIdBytes) == nullptr)
    return {StatusCode::malformed_packet, "address blob boot id is not terminated"};
  a.boot_id = boot;
  a.hostname.assign(reinterpret_cast<const char*>(p), host_len);
  p += host_len;
  const std::byte* const end = bytes.data() + bytes.size();
  a.entries.resize(count);
  for (std::size_t i = 0; i < count; ++i) {
    if (static_cast<std::size_t>(end - p) < kEntryHeadBytes)
      return {StatusCode::malformed_packet, "address blob length does not match its backend entries"};
    Entry& e = a.entries[i];
    e.backend = load<std::uint16_t>(p);
    if (load<std::uint16_t>(p) != 0)
      return {StatusCode::malformed_packet, "address blob has a backend entry with reserved bits set"};
    const auto n = load<std::uint32_t>(p);
    if (n > kMaxEntryBytes || n > static_cast<std::size_t>(end - p))
      return {StatusCode::malformed_packet, "address blob length does not match its backend entries"};
    if (i > 0 && e.backend <= a.entries[i - 1].backend)
      return {StatusCode::malformed_packet, "address blob lists its backend entries out of order"};
    e.bytes.assign(p, p + n);
    p += n;
  }
  if (p != end) return {StatusCode::malformed_packet, "address blob length does not match its backend entries"};
  out = std::move(a);
  return Status::success();
}

std::string read_boot_id() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(f, id);
  return id;
}

}  // namespace ami
