// ami/memory.hpp — registered memory and the remote keys that name it.
//
// Client::register_memory() returns a Memory: a move-only owner of one
// registration. The caller owns the buffer and must keep it alive while the
// Memory lives; the Memory must not outlive its Client. Destroying the Memory
// deregisters it; remote keys naming it are refused from then on.
//
// Client::allocate_memory() returns a Memory that also owns its buffer: a
// shared mapping (a memfd), which a backend may let peers on the same host
// reach without a system call per operation.
//
// A RemoteKey is plain data that the owner hands to peers (as bytes) so they
// can PUT into or GET from the region: what names the region (job, task,
// region, generation, range) and, for each backend that registered it, that
// backend's opaque key bytes. Wire input: from_bytes() validates it, every
// use is checked against the owner's registration, and a backend refuses a
// key without its own entry.
//
// After fork() the child's copy of a Memory is the parent's registration:
// destroying it there only unmaps and closes the child's copies; the
// parent's keys stay valid.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "ami/atomic.hpp"
#include "ami/status.hpp"

namespace ami {

namespace device {
class RegionTable;
}

namespace detail {
// The process's fork generation (transport/src/fork_guard.hpp): a Memory
// notes it, so that a copy a fork left in a child knows it is not the owner.
std::uint32_t current_fork_generation() noexcept;
}

// How many backends a key names, by the registry's id (the numbers
// transport/src/backends.cpp gives them, from 0): a RemoteKey's entries and
// a Memory's local keys have room for this many.
inline constexpr std::size_t kMaxKeyBackends = 4;

// One backend's share of a remote key: bytes only that backend reads (an
// RDMA key, a descriptor of shared memory), written when it registered the
// region. Room for a 64-bit key and 8 bytes more.
struct KeyEntry {
  static constexpr std::size_t kRoom = 16;
  std::uint8_t backend = 0;  // the registry's id
  std::uint8_t length = 0;   // bytes used of bytes
  std::array<std::byte, kRoom> bytes{};

  std::span<const std::byte> value() const { return {bytes.data(), std::min<std::size_t>(length, kRoom)}; }
  friend bool operator==(const KeyEntry&, const KeyEntry&) = default;
};

struct RemoteKey {
  // Layout in memory.cpp; a key of the first layout ("ARK1") is refused.
  static constexpr std::size_t kSerializedSize = 120;
  static constexpr std::uint32_t kMagic = 0x324B5241;  // "ARK2"

  std::uint64_t job = 0;         // the job that made it: keys of another job are refused
  std::uint32_t task = 0;        // the task owning the region
  std::uint32_t region = 0;      // index in the owner's region table
  std::uint32_t generation = 0;  // the registration's generation: stale keys are refused
  std::uint64_t address = 0;     // the region's first byte in the owner's address space
  std::uint64_t length = 0;
  // Where atomics on the region are done (the owner's choice): initiators
  // route theirs by it.
  AtomicDomain atomics = AtomicDomain::cpu;
  // One entry per backend that registered the region, each with its own
  // backend id; entries[entry_count..] stay zero.
  std::uint8_t entry_count = 0;
  std::array<KeyEntry, kMaxKeyBackends> entries{};

  // The backend's entry, nullptr when it has none: it did not register the
  // region, or the key was made by hand without it.
  const KeyEntry* entry(std::uint8_t backend) const {
    for (std::uint8_t i = 0; i < entry_count && i < kMaxKeyBackends; ++i)
      if (entries[i].backend == backend) return &entries[i];
    return nullptr;
  }
  // Adds the backend's entry; refuses a second one, a full key, and more
  // bytes than an entry holds.
  Status add_entry(std::uint8_t backend, std::span<const std::byte> bytes);

  std::array<std::byte, kSerializedSize> to_bytes() const;
  // Rejects a truncated buffer, a bad magic, a range that wraps, and bad
  // entries (too many, too long, two of one backend).
  static Status from_bytes(std::span<const std::byte> bytes, RemoteKey& out);

  friend bool operator==(const RemoteKey&, const RemoteKey&) = default;
};

// A registration's keys for its local side (of a PUT, a GET, or a payload
// sent from it), by backend id: one opaque 64-bit word each (an RDMA lkey, or
// a pointer to a descriptor a backend keeps), 0 where a backend keeps none.
// A fixed array, so that a device finds its own with one index.
using LocalKeys = std::array<std::uint64_t, kMaxKeyBackends>;

class Memory {
 public:
  Memory() = default;
  // local_keys: the backends' keys for local access.
  Memory(device::RegionTable* table, std::uint32_t region, RemoteKey key, void* address,
         std::size_t length, const LocalKeys& local_keys = {})
      : table_(table), region_(region), key_(key), address_(address), length_(length),
        local_keys_(local_keys) {}
  // Takes the shared mapping [mapping, mapping + mapping_bytes) and its memfd too.
  Memory(device::RegionTable* table, std::uint32_t region, RemoteKey key, void* address,
         std::size_t length, void* mapping, std::size_t mapping_bytes, int fd,
         const LocalKeys& local_keys = {})
      : table_(table), region_(region), key_(key), address_(address), length_(length),
        local_keys_(local_keys), mapping_(mapping), mapping_bytes_(mapping_bytes), fd_(fd) {}
  Memory(Memory&& other) noexcept;
  Memory& operator=(Memory&& other) noexcept;
  Memory(const Memory&) = delete;
  Memory& operator=(const Memory&) = delete;
  ~Memory();

  bool valid() const { return table_ != nullptr; }
  void* address() const { return address_; }
  std::size_t length() const { return length_; }
  std::uint32_t region() const { return region_; }
  const RemoteKey& remote_key() const { return key_; }
  const LocalKeys& local_keys() const { return local_keys_; }
  // True when [offset, offset + bytes) lies inside the registration.
  bool covers(std::uint64_t offset, std::uint64_t bytes) const {
    return offset <= length_ && bytes <= length_ - offset;
  }

 private:
  void release();

  device::RegionTable* table_ = nullptr;
  std::uint32_t region_ = 0;
  RemoteKey key_{};
  void* address_ = nullptr;
  std::size_t length_ = 0;
  LocalKeys local_keys_{};
  void* mapping_ = nullptr;  // allocate_memory() only
  std::size_t mapping_bytes_ = 0;
  int fd_ = -1;
  std::uint32_t fork_generation_ = detail::current_fork_generation();  // the process that made it
};

}  // namespace ami
