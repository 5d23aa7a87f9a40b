// address_blob.cpp — encoding and checking address blobs.
#include "address_blob.hpp"

#include <algorithm>

#include <cstring>
#include <fstream>

#include "byte_io.hpp"

namespace ami {

namespace {

constexpr std::size_t kFixedBytes = 4 + 2 + 2 + 8 + 4 + 2 + 2 + 4 + 4 + AddressBlob::kBootIdBytes;

using detail::load;
using detail::store;

}  // namespace

// Layout: magic u32, version u16, backends u16, job u64, task u32,
// contexts u16, hostname length u16, pid u32, shm fd i32, boot id (40 bytes,
// NUL padded), hostname; with kVerbs, then u32 length and the verbs address.
std::vector<std::byte> AddressBlob::encode() const {
  const std::size_t host_len = std::min(hostname.size(), kMaxHostname);
  const bool with_verbs = (backends & kVerbs) != 0;
  std::vector<std::byte> out(kFixedBytes + host_len + (with_verbs ? 4 + verbs.size() : 0));
  std::byte* p = out.data();
  store(p, kMagic);
  store(p, kVersion);
  store(p, backends);
  store(p, job);
  store(p, task);
  store(p, contexts);
  store(p, static_cast<std::uint16_t>(host_len));
  store(p, pid);
  store(p, shm_fd);
  std::memcpy(p, boot_id.data(), std::min(boot_id.size(), kBootIdBytes - 1));  // NUL padded
  p += kBootIdBytes;
  std::memcpy(p, hostname.data(), host_len);
  p += host_len;
  if (with_verbs) {
    store(p, static_cast<std::uint32_t>(verbs.size()));
    if (!verbs.empty()) std::memcpy(p, verbs.data(), verbs.size());
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
  a.backends = load<std::uint16_t>(p);
  a.job = load<std::uint64_t>(p);
  a.task = load<std::uint32_t>(p);
  a.contexts = load<std::uint16_t>(p);
  const auto host_len = load<std::uint16_t>(p);
  a.pid = load<std::uint32_t>(p);
  a.shm_fd = load<std::int32_t>(p);
  const char* boot = reinterpret_cast<const char*>(p);
  p += kBootIdBytes;
  if ((a.backends & ~(kShm | kVerbs)) != 0)
    return {StatusCode::malformed_packet, "address blob offers unknown backends"};
  if (a.contexts == 0) return {StatusCode::malformed_packet, "address blob has no contexts"};
  const bool with_verbs = (a.backends & kVerbs) != 0;
  if (host_len > kMaxHostname || bytes.size() < kFixedBytes + host_len + (with_verbs ? 4 : 0) ||
      (!with_verbs && bytes.size() != kFixedBytes + host_len))
    return {StatusCode::malformed_packet, "address blob length does not match its hostname"};
  if (std::memchr(boot, '\0', kBootIdBytes) == nullptr)
    return {StatusCode::malformed_packet, "address blob boot id is not terminated"};
  if ((a.backends & kShm) && (a.shm_fd < 0 || a.pid == 0))
    return {StatusCode::malformed_packet, "address blob offers shm without a segment"};
  a.boot_id = boot;
  a.hostname.assign(reinterpret_cast<const char*>(p), host_len);
  p += host_len;
  if (with_verbs) {
    const auto n = load<std::uint32_t>(p);
    if (n > kMaxVerbsBytes || bytes.size() != kFixedBytes + host_len + 4 + n)
      return {StatusCode::malformed_packet, "address blob length does not match its verbs address"};
    a.verbs.assign(p, p + n);
  }
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
