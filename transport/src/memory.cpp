// memory.cpp — remote key serialisation and the Memory owner.
#include "ami/memory.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <utility>

#include "ami/device/region_table.hpp"
#include "byte_io.hpp"
#include "fork_guard.hpp"

namespace ami {

namespace {

using detail::load;
using detail::store;

}  // namespace

// Layout (little-endian): magic u32, task u32, region u32, generation u32,
// backend_key u32, shared_fd u32, job u64, address u64, length u64.
std::array<std::byte, RemoteKey::kSerializedSize> RemoteKey::to_bytes() const {
  std::array<std::byte, kSerializedSize> out{};
  std::byte* p = out.data();
  store(p, kMagic);
  store(p, task);
  store(p, region);
  store(p, generation);
  store(p, backend_key);
  store(p, shared_fd);
  store(p, job);
  store(p, address);
  store(p, length);
  return out;
}

Status RemoteKey::from_bytes(std::span<const std::byte> bytes, RemoteKey& out) {
  if (bytes.size() < kSerializedSize)
    return {StatusCode::invalid_argument, "remote key: fewer bytes than a serialised key"};
  const std::byte* p = bytes.data();
  if (load<std::uint32_t>(p) != kMagic)
    return {StatusCode::invalid_argument, "remote key: bad magic"};
  RemoteKey k;
  k.task = load<std::uint32_t>(p);
  k.region = load<std::uint32_t>(p);
  k.generation = load<std::uint32_t>(p);
  k.backend_key = load<std::uint32_t>(p);
  k.shared_fd = load<std::uint32_t>(p);
  k.job = load<std::uint64_t>(p);
  k.address = load<std::uint64_t>(p);
  k.length = load<std::uint64_t>(p);
  if (k.address + k.length < k.address)
    return {StatusCode::invalid_argument, "remote key: region wraps around the address space"};
  out = k;
  return Status::success();
}

Memory::Memory(Memory&& other) noexcept
    : table_(std::exchange(other.table_, nullptr)), region_(other.region_), key_(other.key_),
      address_(other.address_), length_(other.length_), local_key_(other.local_key_),
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
    local_key_ = other.local_key_;
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
    // Peers check the generation before each copy: from here on they refuse.
    auto* h = static_cast<SharedRegionHeader*>(mapping_);
    if (owner) std::atomic_ref<std::uint32_t>(h->generation).store(0, std::memory_order_release);
    ::munmap(mapping_, mapping_bytes_);
    mapping_ = nullptr;
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace ami
