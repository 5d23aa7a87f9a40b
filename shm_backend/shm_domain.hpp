// shm_backend/shm_domain.hpp — what the contexts of one task share for
// shared memory: its own segment, the mapped segments of the peers on this
// host, the region table remote accesses are checked against, and whether
// PUT/GET use CMA (process_vm_writev/readv) or the copy through the rings.
//
// Owned by the task's shm backend (shm_backend.cpp); built before the
// contexts and destroyed after them.
// attach() is called during setup only; the data path reads.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "ami/device/region_table.hpp"
#include "segment.hpp"
#include "shm_config.hpp"

namespace ami::shm {

// The domain's options: the shm backend's settings (shm_config.hpp).
using DomainOptions = Options;

// What a peer announces about its segment (from its address blob).
struct PeerAddress {
  std::uint32_t task = 0;
  std::uint32_t pid = 0;
  std::int32_t fd = -1;
  std::uint16_t contexts = 0;
};

class ShmDomain {
 public:
  // key_id: the registry's id of shm (BackendSetup::id), its entry in
  // remote keys and its index in LocalKeys.
  ShmDomain(std::uint32_t task, std::uint32_t tasks, std::uint16_t contexts,
            const DomainOptions& options, device::RegionTable& regions, std::uint8_t key_id = 1);
  ~ShmDomain();
  ShmDomain(const ShmDomain&) = delete;
  ShmDomain& operator=(const ShmDomain&) = delete;

  std::uint32_t task() const { return task_; }
  std::uint32_t tasks() const { return static_cast<std::uint32_t>(peers_.size()); }
  std::uint16_t contexts() const { return own_.contexts(); }
  int segment_fd() const { return own_.fd(); }
  const device::RegionTable& regions() const { return regions_; }
  std::uint32_t stall_timeout_ms() const { return stall_timeout_ms_; }
  std::uint8_t key_id() const { return key_id_; }

  // Maps a peer's segment; its status says why a peer stays unreachable.
  Status attach(const PeerAddress& peer);
  bool reaches(std::uint32_t task) const {
    return task < peers_.size() && peers_[task].segment != nullptr;
  }
  std::uint32_t pid(std::uint32_t task) const { return peers_[task].pid; }
  // May this process copy into or out of [address, + bytes) of task's
  // memory with the key? Checked against the region table the peer
  // publishes in its segment, as the peer itself would check it.
  Status check_peer_key(std::uint32_t task, const RemoteKey& key, std::uint64_t address,
                        std::uint64_t bytes) const {
    const PeerSegment& s = *peers_[task].segment;
    return device::RegionTable::check_published(s.regions(), s.region_capacity(), regions_.job(), task,
                                                key, address, bytes);
  }

  // Peer processes that exited. Each context's device calls watch() now and
  // then (it looks at most every 10 ms, whichever context asks); deaths()
  // counts the exits seen so far and dead(task) says which.
  void watch();
  std::uint64_t deaths() const { return deaths_.load(std::memory_order_acquire); }
  bool dead(std::uint32_t task) const {
    return task < peers_.size() && peers_[task].dead->load(std::memory_order_acquire);
  }

  device::ReceptionQueue& own_queue(std::uint16_t context) { return own_.queue(context); }
  device::ReceptionQueue& peer_queue(std::uint32_t task, std::uint16_t context) {
    return peers_[task].segment->queue(context);
  }

  bool cma() const { return cma_.load(std::memory_order_relaxed); }
  // CMA was refused (EPERM, ENOSYS): every context switches to the rings.
  void disable_cma() { cma_.store(false, std::memory_order_relaxed); }
  std::string_view rdma_mode() const { return cma() ? "cma" : "ring-copy"; }

 private:
  struct Peer {
    std::unique_ptr<PeerSegment> segment;
    std::uint32_t pid = 0;
    int pidfd = -1;  // readable once the process exited; -1: checked by kill(pid, 0)
    std::unique_ptr<std::atomic<bool>> dead = std::make_unique<std::atomic<bool>>(false);
  };

  std::uint32_t task_;
  const device::RegionTable& regions_;
  OwnSegment own_;
  std::vector<Peer> peers_;  // by task; empty where not on this host
  std::atomic<bool> cma_;
  std::uint32_t stall_timeout_ms_;
  std::uint8_t key_id_;
  std::mutex watch_lock_;
  std::int64_t next_watch_ns_ = 0;  // under watch_lock_
  std::atomic<std::uint64_t> deaths_{0};
};

}  // namespace ami::shm
