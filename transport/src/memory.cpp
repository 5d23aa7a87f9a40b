// memory.cpp — remote key serialisation and the Memory owner.
#include "ami/memory.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "ami/device/region_table.hpp"
#include "ami/device/byte_io.hpp"
#include "fork_guard.hpp"

namespace ami {

namespace {

using detail::load;
using detail::store;

}  // namespace

Status RemoteKey::add_entry(std::uint8_t backend, std::span<const std::byte> bytes) {
  if (entry(backend) != nullptr)
    return {StatusCode::invalid_argument, "remote key: the backend has an entry already"};
  if (entry_count >= kMaxKeyBackends)
    return {StatusCode::no_resource, "remote key: no room for another backend's entry"};
  if (bytes.size() > KeyEntry::kRoom)
    return {StatusCode::invalid_argument, "remote key: more key bytes than an entry holds"};
  KeyEntry& e = entries[entry_count++];
  e = KeyEntry{.backend = backend, .length = static_cast<std::uint8_t>(bytes.size())};
  if (!bytes.empty()) std::memcpy(e.bytes.data(), bytes.data(), bytes.size());
  return Status::success();
}

// Layout (little-endian, 120 bytes): magic u32, task u32, region u32,
// generation u32, job u64, address u64, length u64, entry count u8, atomic
// domain u8 (0 cpu, 1 nic), 2 bytes zero, then kMaxKeyBackends entries of 18 bytes (backend u8, length u8,
// bytes[16]; those past the count all zero), then 4 bytes zero.
std::array<std::byte, RemoteKey::kSerializedSize> RemoteKey::to_bytes() const {
  std::array<std::byte, kSerializedSize> out{};
  std::byte* p = out.data();
  store(p, kMagic);
  store(p, task);
  store(p, region);
  store(p, generation);
  store(p, job);
  store(p, address);
  store(p, length);
  store(p, entry_count);
  store(p, static_cast<std::uint8_t>(atomics));
  p += 2;
  for (std::uint8_t i = 0; i < entry_count && i < kMaxKeyBackends; ++i) {
    store(p, entries[i].backend);
    store(p, entries[i].length);
    std::memcpy(p, entries[i].bytes.data(), KeyEntry::kRoom);
    p += KeyEntry::kRoom;
  }
  return out;
}

namespace {

constexpr std::size_t kEntriesAt = 44;
constexpr std::size_t kEntryBytes = 2 + KeyEntry::kRoom;
static_assert(kEntriesAt + kMaxKeyBackends * kEntryBytes + 4 == RemoteKey::kSerializedSize);

// Reads the entries after the fixed fields into k (whose count is read).
Status load_entries(const std::byte* p, RemoteKey& k) {
  if (k.entry_count > kMaxKeyBackends)
    return {StatusCode::invalid_argument, "remote key: more backend entries than a key holds"};
  const std::uint8_t n = k.entry_count;
  k.entry_count = 0;
  for (std::uint8_t i = 0; i < n; ++i) {
    const auto backend = load<std::uint8_t>(p);
    const auto length = load<std::uint8_t>(p);
    if (length > KeyEntry::kRoom)
      return {StatusCode::invalid_argument, "remote key: an entry is longer than its room"};
    if (k.entry(backend) != nullptr)
      return {StatusCode::invalid_argument, "remote key: two entries of one backend"};
    KeyEntry& e = k.entries[k.entry_count++];
    e.backend = backend;
    e.length = length;
    std::memcpy(e.bytes.data(), p, length);  // the rest stays zero, as add_entry() leaves it
    p += KeyEntry::kRoom;
  }
  return Status::success();
}

}  // namespace

Status RemoteKey::from_bytes(std::span<const std::byte> bytes, RemoteKey& out) {
  if (bytes.size() < kSerializedSize)
    return {StatusCode::invalid_argument, "remote key: fewer bytes than a serialised key"};
  const std::byte* p = bytes.data();
  if (load<std::uint32_t>(p) != kMagic)
    return {StatusCode::invalid_argument, "remote key: bad magic (not a key of this version)"};
  RemoteKey k;
  k.task = load<std::uint32_t>(p);
  k.region = load<std::uint32_t>(p);
  k.generation = load<std::uint32_t>(p);
  k.job = load<std::uint64_t>(p);
  k.address = load<std::uint64_t>(p);
  k.length = load<std::uint64_t>(p);
  k.entry_count = load<std::uint8_t>(p);
  const auto domain = load<std::uint8_t>(p);
  if (domain > kLastAtomicDomain)
    return {StatusCode::invalid_argument, "remote key: unknown atomic domain"};
  k.atomics = static_cast<AtomicDomain>(domain);
  if (k.address + k.length < k.address)
    return {StatusCode::invalid_argument, "remote key: region wraps around the address space"};
  if (Status s = load_entries(bytes.data() + kEntriesAt, k); !s.ok()) return s;
  out = k;
  return Status::success();
}

Memory::Memory(Memory&& other) noexcept
    : table_(std::exchange(other.table_, nullptr)), region_(other.region_), key_(other.key_),
      address_(other.address_), length_(other.length_), local_keys_(other.local_keys_),
      mapping_(std::exchange(other.mapping_, nullptr)), mapping_bytes_(other.mapping_bytes_),
      fd_(std::exchange(other.fd_, -1)), fork_generation_(other.fork_generation_) {}

Memory& Memory::operator=(Memory&& other) noexcept {
  if (this != &other) {
    release();
    table_ = std::exchange(other.table_, nullptr);
    region_ = other.region_;
    key_ = other.key_;
    address_ = other.address_;
    length_ = other.length_;
    local_keys_ = other.local_keys_;
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapping_bytes_ = other.mapping_bytes_;
    fd_ = std::exchange(other.fd_, -1);
    fork_generation_ = other.fork_generation_;
  }
  return *this;
}

Memory::~Memory() { release(); }

void Memory::release() {
  // A copy a fork left in a child: the registration, the region table's
  // published slots and the header are the parent's, and it still uses
  // them. Only the child's own mapping and descriptor go.
  const bool owner = !detail::in_forked_child(fork_generation_);
  if (table_ != nullptr && owner) table_->remove(region_);
  table_ = nullptr;
  if (mapping_ != nullptr) {
    // (A backend that shares the mapping marked it freed when the region
    // table's remove() deregistered it.)
    ::munmap(mapping_, mapping_bytes_);
    mapping_ = nullptr;
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace ami
