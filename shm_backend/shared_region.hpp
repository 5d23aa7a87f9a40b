// shm_backend/shared_region.hpp — how shm names memory from
// allocate_memory(): the header it writes in front of the region, and its
// entry of the region's remote keys.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ami/device/backend.hpp"
#include "ami/memory.hpp"

namespace ami::shm {

// The first page of a shared region's memfd (device::kSharedRegionPrefix
// bytes): who it belongs to, so a peer holding a key can tell a live region
// from a stale one (or from another file that reused the fd number) before
// every copy.
struct SharedRegionHeader {
  static constexpr std::uint64_t kMagic = 0x31474552494D41ull;  // "AMIREG1"
  static constexpr std::size_t kBytes = device::kSharedRegionPrefix;  // data starts here
  std::uint64_t magic;
  std::uint64_t job;
  std::uint32_t task;
  std::uint32_t region;
  std::uint32_t generation;  // 0 once the owner has freed it
  std::uint32_t reserved;
  std::uint64_t length;
};
static_assert(sizeof(SharedRegionHeader) <= SharedRegionHeader::kBytes);

// shm's entry of a remote key: the memfd's fd + 1 in the owner (u32), 0
// for memory that was only registered (reached with CMA or the rings).
inline constexpr std::size_t kEntryBytes = sizeof(std::uint32_t);

inline void encode_entry(std::uint32_t shared_fd, std::byte* out) { std::memcpy(out, &shared_fd, kEntryBytes); }

// Reads the entry; false when the key has none of the right size.
inline bool decode_entry(const KeyEntry* e, std::uint32_t& shared_fd) {
  if (e == nullptr || e->length != kEntryBytes) return false;
  std::memcpy(&shared_fd, e->bytes.data(), kEntryBytes);
  return true;
}

}  // namespace ami::shm
