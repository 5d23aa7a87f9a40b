// shm_backend/shm_domain.hpp — what the contexts of one task share for
// shared memory: its own segment, the peers on this host and their
// segments once mapped, the region table remote accesses are checked
// against, and whether PUT/GET use CMA (process_vm_writev/readv) or the copy
// through the rings.
//
// Owned by the task's shm backend (shm_backend.cpp); built before the
// contexts and destroyed after them.
//
// A peer is learnt during setup or, with addresses on demand, when first
// needed (learn(), from connect()): its pid, the
// number of its segment's descriptor and its contexts, checked as far as
// that can be done without touching the peer. Its segment is opened and
// mapped the first time a context needs it (map(): a lane to the peer is
// made, or a cell of the device's own traffic comes from it), once for all
// the contexts of the task. Contexts may be advanced by different threads:
// the first mapping of a peer is made under a mutex and published through
// an atomic pointer, which the data path reads without a lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "ami/device/peer_directory.hpp"
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
  std::uint32_t tasks() const { return tasks_; }
  std::uint16_t contexts() const { return own_.contexts(); }
  int segment_fd() const { return own_.fd(); }
  const device::RegionTable& regions() const { return regions_; }
  std::uint32_t stall_timeout_ms() const { return stall_timeout_ms_; }
  // CPUs online on this host, read once.
  std::uint32_t cpus() const { return cpus_; }
  std::uint8_t key_id() const { return key_id_; }

  // Records a peer of this host: at setup, or on demand while contexts run
  // (the pid is stored last, with release: reaches() sees a whole peer).
  // Nothing of the peer is touched; its status says why a peer stays
  // unreachable: it names no other task of the job, no segment, or has
  // another number of contexts.
  Status learn(const PeerAddress& peer);
  // Learnt: the peer is reached by shm, mapped or not.
  bool reaches(std::uint32_t task) const { return task < tasks_ && pid(task) != 0; }
  std::uint32_t pid(std::uint32_t task) const { return peers_[task].pid.load(std::memory_order_acquire); }
  std::uint32_t peers_known() const { return peers_known_.load(std::memory_order_relaxed); }
  // Asks the Client about a task not learnt yet (addresses on demand):
  // true once shm reaches it. Blocks while the address is fetched.
  bool learn_on_demand(std::uint32_t task) {
    return reaches(task) ||
           (directory_ != nullptr && task < tasks_ && directory_->learn(task).empty() && reaches(task));
  }
  void set_directory(device::PeerDirectory* directory) { directory_ = directory; }

  // Maps a learnt peer's segment, the first time any context asks; later
  // calls return what the first one found. Not ok: the segment cannot be
  // used (the peer exited, its segment cannot be opened or is not what it
  // should be), as a peer_failed status naming why, for the lane to fail
  // with. Safe from every context's thread; a peer is mapped once.
  Status map(std::uint32_t task) {
    if (const Attachment* a = peers_[task].attachment.load(std::memory_order_acquire)) return a->status;
    return map_first(task);
  }
  // Segments of peers mapped so far (each counted once), for describe()
  // and the tests.
  std::uint32_t segments_mapped() const { return segments_mapped_.load(std::memory_order_relaxed); }

  // The calls below want the task's segment mapped (map() returned ok).
  device::ReceptionQueue& peer_queue(std::uint32_t task, std::uint16_t context) {
    return segment(task).queue(context);
  }
  // May this process copy into or out of [address, + bytes) of task's
  // memory with the key? Checked against the region table the peer
  // publishes in its segment, as the peer itself would check it.
  Status check_peer_key(std::uint32_t task, const RemoteKey& key, std::uint64_t address,
                        std::uint64_t bytes) const {
    const PeerSegment& s = segment(task);
    return device::RegionTable::check_published(s.regions(), s.region_capacity(), regions_.job(), task,
                                                key, address, bytes);
  }

  // Mapped peers whose process exited. Each context's device calls watch()
  // now and then (it looks at most every 10 ms, whichever context asks);
  // deaths() counts the exits seen so far, dead(task) says which, and
  // dead_tasks() lists them. A peer not mapped here is not watched: the TCP
  // bootstrap tells the contexts of its end (PMIx does not), and mapping it
  // fails.
  // now_please: look at once, not only after 10 ms (a sleeping context
  // woken by deaths_fd()).
  void watch(bool now_please = false);
  // An epoll set of the mapped peers' pidfds: readable while one of them
  // exited and watch() has not seen it yet (docs/DESIGN.md, "Event-driven
  // progress"); death_pending() asks it without blocking.
  int deaths_fd() const { return deaths_fd_; }
  bool death_pending() const;
  // A context's ring is held up by a cell its producer reserved and never
  // committed, and no peer is known to have failed: the producer may be one
  // that died without this process ever mapping it (so never watched). The
  // one look at unmapped peers: each learnt one's process, by its pid
  // (nothing of its segment), counted as a death once exited. Returns
  // whether any peer is known dead now.
  bool look_at_unmapped_peers();
  std::uint64_t deaths() const { return deaths_.load(std::memory_order_acquire); }
  bool dead(std::uint32_t task) const {
    return task < tasks_ && peers_[task].dead.load(std::memory_order_acquire);
  }
  std::vector<std::uint32_t> dead_tasks();

  device::ReceptionQueue& own_queue(std::uint16_t context) { return own_.queue(context); }
  // The context's wake-up eventfd, which peers write when they find its
  // ring armed; and whether some peer could not take it.
  const int& own_wake_fd(std::uint16_t context) const { return own_.wake_fd(context); }
  bool unwakeable() const { return own_.unwakeable(); }
  // A mapped peer context's wake-up eventfd (-1: it could not be taken).
  int peer_wake_fd(std::uint32_t task, std::uint16_t context) const { return segment(task).wake_fd(context); }

  bool cma() const { return cma_.load(std::memory_order_relaxed); }
  // CMA was refused (EPERM, ENOSYS): every context switches to the rings.
  void disable_cma() { cma_.store(false, std::memory_order_relaxed); }
  std::string_view rdma_mode() const { return cma() ? "cma" : "ring-copy"; }

 private:
  // A peer's segment once mapped here, or why it could not be mapped. Made
  // once per peer, on first use, and kept until the domain goes.
  struct Attachment {
    std::uint32_t task = 0;
    Status status;        // ok: segment is mapped
    PeerSegment segment;
    int pidfd = -1;  // readable once the process exited; -1: checked by kill(pid, 0)
  };
  // What the domain holds for every task of the job, learnt or not: 24
  // bytes until the peer is first used.
  struct Peer {
    std::atomic<Attachment*> attachment{nullptr};  // published once, under lock_
    std::atomic<std::uint32_t> pid{0};             // 0: not learnt (another host, or refused)
    std::int32_t fd = -1;                          // the segment's descriptor in the peer
    std::atomic<bool> dead{false};
  };
  static_assert(sizeof(Peer) <= 24);

  Status map_first(std::uint32_t task);
  void mark_dead(std::uint32_t task);  // under lock_
  Status open_segment(const Peer& p, Attachment& a);
  PeerSegment& segment(std::uint32_t task) const {
    return peers_[task].attachment.load(std::memory_order_acquire)->segment;
  }

  std::uint32_t task_;
  std::uint32_t tasks_;
  const device::RegionTable& regions_;
  OwnSegment own_;
  std::unique_ptr<Peer[]> peers_;  // by task
  std::atomic<std::uint32_t> peers_known_{0};
  device::PeerDirectory* directory_ = nullptr;  // the Client's
  std::atomic<bool> cma_;
  std::uint32_t stall_timeout_ms_;
  std::uint32_t cpus_;
  std::uint8_t key_id_;
  // Taken to map a peer for the first time, by watch() and
  // look_at_unmapped_peers() (which skip a round while it is held), and by
  // dead_tasks(); never on the data path.
  std::mutex lock_;
  std::vector<std::unique_ptr<Attachment>> attachments_;  // under lock_; in the order made
  std::vector<std::uint32_t> dead_list_;                   // under lock_; as seen
  std::int64_t next_watch_ns_ = 0;                         // under lock_
  std::atomic<std::uint32_t> segments_mapped_{0};
  std::atomic<std::uint64_t> deaths_{0};
  int deaths_fd_ = -1;  // epoll of the mapped peers' pidfds
};

}  // namespace ami::shm
