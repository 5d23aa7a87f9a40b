// address_blob.cpp — encoding and checking address blobs.
#include "address_blob.hpp"

#include <cstring>
#include <fstream>

namespace ami {

namespace {

constexpr std::size_t kFixedBytes = 4 + 2 + 2 + 8 + 4 + 2 + 2 + 4 + 4 + AddressBlob::kBootIdBytes;

template <typename T>
void put(std::vector<std::byte>& out, T v) {
  const auto* p = reinterpret_cast<const std::byte*>(&v);
  out.insert(out.end(), p, p + sizeof v);
}
template <typename T>
T take(const std::byte*& p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  p += sizeof v;
  return v;
}

}  // namespace

// Layout: magic u32, version u16, backends u16, job u64, task u32,
// contexts u16, hostname length u16, pid u32, shm fd i32, boot id (40 bytes,
// NUL padded), hostname.
std::vector<std::byte> AddressBlob::encode() const {
  std::vector<std::byte> out;
  out.reserve(kFixedBytes + hostname.size());
  put(out, kMagic);
  put(out, kVersion);
  put(out, backends);
  put(out, job);
  put(out, task);
  put(out, contexts);
  put(out, static_cast<std::uint16_t>(std::min(hostname.size(), kMaxHostname)));
  put(out, pid);
  put(out, shm_fd);
  char boot[kBootIdBytes] = {};
  std::memcpy(boot, boot_id.data(), std::min(boot_id.size(), kBootIdBytes - 1));
  const auto* b = reinterpret_cast<const std::byte*>(boot);
  out.insert(out.end(), b, b + kBootIdBytes);
  const auto* h = reinterpret_cast<const std::byte*>(hostname.data());
  out.insert(out.end(), h, h + std::min(hostname.size(), kMaxHostname));
  return out;
}

Status AddressBlob::decode(std::span<const std::byte> bytes, AddressBlob& out) {
  if (bytes.size() < kFixedBytes) return {StatusCode::malformed_packet, "address blob is truncated"};
  const std::byte* p = bytes.data();
  if (take<std::uint32_t>(p) != kMagic) return {StatusCode::malformed_packet, "address blob has a bad magic"};
  if (take<std::uint16_t>(p) != kVersion)
    return {StatusCode::malformed_packet, "address blob has an unsupported version"};
  AddressBlob a;
  a.backends = take<std::uint16_t>(p);
  a.job = take<std::uint64_t>(p);
  a.task = take<std::uint32_t>(p);
  a.contexts = take<std::uint16_t>(p);
  const auto host_len = take<std::uint16_t>(p);
  a.pid = take<std::uint32_t>(p);
  a.shm_fd = take<std::int32_t>(p);
  const char* boot = reinterpret_cast<const char*>(p);
  p += kBootIdBytes;
  if ((a.backends & ~kShm) != 0) return {StatusCode::malformed_packet, "address blob offers unknown backends"};
  if (a.contexts == 0) return {StatusCode::malformed_packet, "address blob has no contexts"};
  if (host_len > kMaxHostname || bytes.size() != kFixedBytes + host_len)
    return {StatusCode::malformed_packet, "address blob length does not match its hostname"};
  if (std::memchr(boot, '\0', kBootIdBytes) == nullptr)
    return {StatusCode::malformed_packet, "address blob boot id is not terminated"};
  if ((a.backends & kShm) && (a.shm_fd < 0 || a.pid == 0))
    return {StatusCode::malformed_packet, "address blob offers shm without a segment"};
  a.boot_id = boot;
  a.hostname.assign(reinterpret_cast<const char*>(p), host_len);
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
