// ami/memory.hpp — registered memory and the remote keys that name it.
//
// Client::register_memory() returns a Memory: a move-only owner of one
// registration. The caller owns the buffer and must keep it alive while the
// Memory lives; the Memory must not outlive its Client. Destroying the Memory
// deregisters it; remote keys naming it are refused from then on.
//
// Client::allocate_memory() returns a Memory that also owns its buffer: a
// shared mapping that peers on the same host map once and then PUT into or
// GET from with a plain copy (no system call per operation). Memory that was
// only registered is reached with CMA.
//
// A RemoteKey is plain data that the owner hands to peers (as bytes) so they
// can PUT into or GET from the region. Wire input: from_bytes() validates it
// and every use is checked against the owner's registration.
//
// After fork() the child's copy of a Memory is the parent's registration:
// destroying it there only unmaps and closes the child's copies; the
// parent's keys stay valid.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

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

struct RemoteKey {
  static constexpr std::size_t kSerializedSize = 48;
  static constexpr std::uint32_t kMagic = 0x314B5241;  // "ARK1"

  std::uint64_t job = 0;         // the job that made it: keys of another job are refused
  std::uint32_t task = 0;        // the task owning the region
  std::uint32_t region = 0;      // index in the owner's region table
  std::uint32_t generation = 0;  // the registration's generation: stale keys are refused
  std::uint32_t backend_key = 0; // e.g. the verbs rkey
  std::uint32_t shared_fd = 0;   // memory from allocate_memory(): its memfd's fd + 1 in the owner
  std::uint64_t address = 0;     // the region's first byte in the owner's address space
  std::uint64_t length = 0;

  std::array<std::byte, kSerializedSize> to_bytes() const;
  // Rejects a truncated buffer or a bad magic, and a range that wraps.
  static Status from_bytes(std::span<const std::byte> bytes, RemoteKey& out);

  friend bool operator==(const RemoteKey&, const RemoteKey&) = default;
};

class Memory {
 public:
  Memory() = default;
  // local_key: the backend's key for local access (the verbs lkey), 0 if none.
  Memory(device::RegionTable* table, std::uint32_t region, RemoteKey key, void* address,
         std::size_t length, std::uint32_t local_key = 0)
      : table_(table), region_(region), key_(key), address_(address), length_(length),
        local_key_(local_key) {}
  // Takes the shared mapping [mapping, mapping + mapping_bytes) and its memfd too.
  Memory(device::RegionTable* table, std::uint32_t region, RemoteKey key, void* address,
         std::size_t length, void* mapping, std::size_t mapping_bytes, int fd,
         std::uint32_t local_key = 0)
      : table_(table), region_(region), key_(key), address_(address), length_(length),
        local_key_(local_key), mapping_(mapping), mapping_bytes_(mapping_bytes), fd_(fd) {}
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
  std::uint32_t local_key() const { return local_key_; }
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
  std::uint32_t local_key_ = 0;
  void* mapping_ = nullptr;  // allocate_memory() only
  std::size_t mapping_bytes_ = 0;
  int fd_ = -1;
  std::uint32_t fork_generation_ = detail::current_fork_generation();  // the process that made it
};

// The first page of a shared region's memfd: who it belongs to, so a peer
// holding a key can tell a live region from a stale one (or from another
// file that reused the fd number) before every copy.
struct SharedRegionHeader {
  static constexpr std::uint64_t kMagic = 0x31474552494D41ull;  // "AMIREG1"
  static constexpr std::size_t kBytes = 4096;                   // data starts here
  std::uint64_t magic;
  std::uint64_t job;
  std::uint32_t task;
  std::uint32_t region;
  std::uint32_t generation;  // 0 once the owner has freed it
  std::uint32_t reserved;
  std::uint64_t length;
};

}  // namespace ami
