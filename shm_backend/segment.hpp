// shm_backend/segment.hpp — a process's receive segment and its mappings of
// its peers' segments.
//
// A segment is an anonymous memfd (mode 0600 by construction), so nothing is
// ever left in /dev/shm, whatever way the process dies: the memory goes when
// the last mapping goes. Peers on the same host open it through
// /proc/<pid>/fd/<fd> while its owner is alive (the bootstrap guarantees
// that) and map it. The segment starts with a versioned header holding
// offsets only, checked field by field when a peer maps it; after it come
// one reception queue per context of the owner, each written by every peer,
// and the owner's published region table (device::RegionSlot), which peers
// check a remote key against before they copy into the owner with CMA.
// The header also names each context's wake-up eventfd, which a peer takes
// (pidfd_getfd) when it maps the segment, to wake a context that sleeps
// (docs/DESIGN.md, "Event-driven progress").
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ami/device/reception_queue.hpp"
#include "ami/device/region_table.hpp"
#include "ami/device/wake.hpp"
#include "ami/status.hpp"

namespace ami::shm {

inline constexpr std::uint16_t kMaxContexts = 64;

struct alignas(device::kCacheLine) SegmentHeader {
  static constexpr std::uint64_t kMagic = 0x31304D4853494D41ull;  // "AMISHM01"
  static constexpr std::uint32_t kVersion = 3;  // 3: wake_fd, unwakeable

  std::uint64_t magic;
  std::uint32_t version;
  std::uint32_t header_bytes;
  std::uint64_t total_bytes;
  std::uint32_t owner_pid;
  std::uint32_t owner_task;
  std::uint16_t contexts;
  std::uint16_t reserved0;
  std::uint32_t queue_bytes;  // bytes of one reception queue
  std::uint64_t queue_offset[kMaxContexts];
  std::uint64_t regions_offset;    // the published region table
  std::uint32_t region_capacity;   // its slots
  std::uint32_t reserved1;
  std::int32_t wake_fd[kMaxContexts];  // each context's eventfd, a descriptor number in the owner
  // Set by a peer that could not take a wake_fd: a context of the owner
  // must not sleep, as that peer's packets would not wake it.
  std::atomic<std::uint32_t> unwakeable;
};

// Owns a mapping; unmaps on destruction. Move-only.
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* address, std::size_t bytes) : address_(address), bytes_(bytes) {}
  Mapping(Mapping&& o) noexcept;
  Mapping& operator=(Mapping&& o) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping();

  std::byte* data() const { return static_cast<std::byte*>(address_); }
  std::size_t size() const { return bytes_; }
  explicit operator bool() const { return address_ != nullptr; }

 private:
  void* address_ = nullptr;
  std::size_t bytes_ = 0;
};

// This process's segment: creates the memfd, lays out the header and the
// queues. Throws ami::Error naming the failing call.
class OwnSegment {
 public:
  OwnSegment(std::uint32_t task, std::uint16_t contexts, std::uint32_t queue_depth,
             std::uint32_t cell_bytes, std::uint32_t region_capacity);
  OwnSegment(OwnSegment&&) = delete;
  ~OwnSegment();

  int fd() const { return fd_; }
  device::ReceptionQueue& queue(std::uint16_t context) { return queues_[context]; }
  std::uint16_t contexts() const { return contexts_; }
  device::RegionSlot* regions() const { return regions_; }
  const int& wake_fd(std::uint16_t context) const { return wake_fds_[context]; }
  // A peer could not take a wake-up eventfd of this segment.
  bool unwakeable() const;

 private:
  int fd_ = -1;
  std::vector<device::EventFd> wakes_;  // by context
  std::vector<int> wake_fds_;
  device::RegionSlot* regions_ = nullptr;
  std::uint16_t contexts_ = 0;
  Mapping mapping_;
  device::ReceptionQueue queues_[kMaxContexts];
};

// A peer's segment, mapped and checked.
class PeerSegment {
 public:
  PeerSegment() { wake_fds_.fill(-1); }
  PeerSegment(const PeerSegment&) = delete;
  PeerSegment& operator=(const PeerSegment&) = delete;
  ~PeerSegment();
  // Opens /proc/<pid>/fd/<fd>, maps it and validates the header against what
  // the peer announced, then takes the contexts' wake-up eventfds through
  // pidfd (one it cannot take marks the segment unwakeable). Returns a
  // status naming what was wrong.
  Status open(std::uint32_t pid, int fd, std::uint32_t task, std::uint16_t contexts, int pidfd);
  // The peer context's wake-up eventfd, -1 when it could not be taken.
  int wake_fd(std::uint16_t context) const { return wake_fds_[context]; }

  bool valid() const { return static_cast<bool>(mapping_); }
  device::ReceptionQueue& queue(std::uint16_t context) { return queues_[context]; }
  const device::RegionSlot* regions() const { return regions_; }
  std::uint32_t region_capacity() const { return region_capacity_; }

 private:
  Mapping mapping_;
  device::ReceptionQueue queues_[kMaxContexts];
  const device::RegionSlot* regions_ = nullptr;
  std::uint32_t region_capacity_ = 0;
  std::array<int, kMaxContexts> wake_fds_;
};

}  // namespace ami::shm
