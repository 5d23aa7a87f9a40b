// shm_backend/shm_device.hpp — one context's share of the shared-memory
// backend: a lane per peer context on this host, draining into the peer's
// reception queue, and the context's own queue to drain.
//
// A lane works through its injection FIFO in order: a packet is copied into
// the peer's ring, a PUT or GET is one process_vm_writev/readv (CMA), or,
// where CMA is refused, a pipelined copy through the rings. The transfer
// counter passes a descriptor when its data has left (or, for a GET, reached)
// the local buffer. A full ring stalls the lane; nothing ever spins.
//
// The first lane to a peer task, in any context of this task, maps the
// peer's segment (ShmDomain::map); so does a cell of the device's own
// traffic from a peer no lane here leads to yet. A segment that cannot be
// mapped makes the lane failed from the start: the sink hears why, as of
// any lane that broke.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "ami/device/device.hpp"
#include "rdma_chunk.hpp"
#include "shm_domain.hpp"

namespace ami::shm {

class ShmDevice;

// A peer skipped a cell of its ring that this process reserved and did not
// fill in time: a packet of the lane's ordered stream is lost.
inline constexpr Status kCellSkipped{StatusCode::peer_failed,
                                     "shm: the peer skipped a ring cell this process held too long "
                                     "(AMI_SHM_STALL_TIMEOUT)"};

class ShmLane final : public device::Lane {
 public:
  // target: the peer context's ring, nullptr when its segment could not be
  // mapped (the lane is then failed and carries nothing).
  ShmLane(ShmDevice& device, Endpoint peer, std::uint32_t fifo_depth, device::ReceptionQueue* target,
          std::uint32_t pid, int target_wake)
      : Lane(peer, fifo_depth), device_(device), target_(target), pid_(pid), target_wake_(target_wake) {}

  std::size_t max_packet() const override;
  // With CMA a GET is one system call and one copy; the rings move a few
  // hundred bytes per packet. Without CMA a GET goes through the rings too.
  std::uint64_t rdma_crossover() const override;
  bool oversubscribed() const override;
  // More than kBacklogCells of the peer's ring not handed back yet.
  bool backlogged() const override;
  static constexpr std::uint64_t kBacklogCells = 8;
  // Packets at the head of the FIFO go into the peer's ring at once, which
  // saves a round through advance() on the latency path; PUT and GET wait
  // for progress(), whose errors may run callbacks.
  void ring() override;
  // On a peer's allocate_memory() region that this process maps: the
  // device does the atomic on its mapping with the CPU, as the owner's
  // engine does on its own (docs/DESIGN.md, "Remote atomics"). A region
  // reached only by CMA (registered memory) is not: CMA copies, it cannot
  // do an atomic, so the owner's engine does those.
  bool offloads_atomic(const RemoteKey& key, AtomicOp op, AtomicType type) override;
  Status atomic_in_place(const device::AtomicRef& a) override;

 private:
  friend class ShmDevice;
  ShmDevice& device_;
  device::ReceptionQueue* target_;
  std::uint32_t pid_;
  int target_wake_;  // the peer context's eventfd (the domain's): written when its ring was armed
  // The head descriptor's progress on the ring-copy path: a PUT is done
  // when the peer said it placed (or refused) the bytes.
  std::uint64_t put_sent_ = 0;
  bool put_waiting_ = false;
  bool put_answered_ = false;
  bool get_waiting_ = false;
  std::uint64_t get_received_ = 0;
  Status failure_;         // not ok once the peer process exited
  std::uint64_t drain_to_ = 0;  // own ring position: its cells are all below (see tend_failed_lanes)
  bool reported_ = false;  // the sink has been told
  // The PUT this lane's peer is streaming into this process, if refused.
  std::uint64_t incoming_put_tag_ = 0;
  Status incoming_put_status_;
};

class ShmDevice final : public device::Device {
 public:
  ShmDevice(ShmDomain& domain, std::uint16_t context, std::uint32_t fifo_depth);

  std::string_view name() const override { return "shm"; }
  std::uint8_t key_id() const override { return domain_.key_id(); }
  bool can_reach(Endpoint peer) const override;
  device::Lane* lane(Endpoint peer) override;
  std::size_t progress(device::PacketSink& sink, std::size_t budget) override;
  unsigned reception_load() const override;
  // Publishes the head of the context's ring: cells consumed since the last
  // batch go back to the producers.
  std::size_t return_credit() override;
  bool abandon(Endpoint peer, Status why) override;
  // The context's eventfd (peers write it when they find its ring armed)
  // and the domain's set of peer exits.
  std::span<const int> wake_fds() const override { return wake_fds_; }
  // Busy while a lane has descriptors to move (a full peer ring is drained
  // by a peer that is awake), answers to serve or a death to report;
  // not_supported when a peer could not take this context's eventfd.
  Status arm() override;
  Status arm_quiet() override;

  // Cells dropped because they failed a check (origin, kind, key, tag).
  std::uint64_t dropped() const { return dropped_; }
  // Cells of the own ring skipped because their producer held them too long
  // after a peer failed (AMI_SHM_STALL_TIMEOUT).
  std::uint64_t cells_skipped() const { return cells_skipped_; }

 private:
  enum class Step { done, stalled, waiting };
  struct GetResponse {
    Endpoint to;
    const std::byte* source;
    std::uint64_t bytes;
    std::uint64_t sent;
    std::uint64_t tag;
    std::uint32_t status;
    std::uint16_t kind;  // kGetDataCell, or kPutDoneCell (no data)
  };

  // data path (shm_datapath.cpp)
  friend class ShmLane;
  std::size_t drain_lane(ShmLane& lane, bool packets_only = false);
  Step execute(ShmLane& lane, std::uint64_t n);
  Step send_packet(ShmLane& lane, const device::PacketDescriptor& p);
  Step rdma(ShmLane& lane, std::uint64_t n, bool put);
  void deliver(device::PacketSink& sink, const device::ReceptionQueue::Arrival& a);
  ShmLane* lane_from(const device::ReceptionQueue::Origin& origin);

  // PUT and GET (shm_rdma.cpp)
  struct SharedView {  // a peer's allocate_memory() region, mapped here
    std::uint32_t task;
    std::uint32_t shared_fd;
    Mapping mapping;
  };
  static constexpr std::size_t kMaxSharedViews = 64;
  // (inline, defined in shm_rdma.cpp, its only user: the mapped atomic is a
  // few nanoseconds' work, and these calls were most of it.)
  inline Status shared_target(const ShmLane& lane, const RemoteKey& k, std::uint64_t remote_address,
                              std::uint64_t length, std::uint32_t shared_fd, std::byte*& out);
  // Is key's region a peer's shared one this process maps (or can map now)?
  bool maps_region(const ShmLane& lane, const RemoteKey& key);
  void atomic_mapped(ShmLane& lane, std::uint64_t n, const device::AtomicDescriptor& a);
  // (shared_fd: the key's shm entry, decoded by the caller)
  inline Status atomic_on_mapping(ShmLane& lane, const device::AtomicRef& a, std::uint32_t shared_fd);
  // The view of the peer's shared region: found among those mapped, or
  // mapped now (map_new()); nullptr when it cannot be.
  SharedView* map_shared(const ShmLane& lane, std::uint32_t task, std::uint32_t shared_fd) {
    for (SharedView& v : shared_views_)
      if (v.task == task && v.shared_fd == shared_fd) return &v;
    return map_new(lane, task, shared_fd);
  }
  SharedView* map_new(const ShmLane& lane, std::uint32_t task, std::uint32_t shared_fd);
  Step rdma_mapped(ShmLane& lane, std::uint64_t n, std::uint32_t shared_fd);
  Step rdma_cma(ShmLane& lane, std::uint64_t n);
  Step put_through_ring(ShmLane& lane, std::uint64_t n);
  Step get_through_ring(ShmLane& lane, std::uint64_t n);
  void on_put_data(ShmLane& lane, const RdmaChunk& c, std::span<const std::byte> data);
  void on_put_done(ShmLane& lane, const RdmaChunk& c);
  void on_get_request(Endpoint from, const RdmaChunk& c);
  void on_get_data(ShmLane& lane, const RdmaChunk& c, std::span<const std::byte> data);
  std::size_t serve_get_responses();

  device::ReceptionQueue::Origin me(std::uint16_t kind) const {
    return {domain_.task(), context_, kind};
  }

  ShmDomain& domain_;
  std::uint16_t context_;
  std::uint32_t fifo_depth_;
  // Slots for every peer endpoint (8 bytes each); the lanes, their lists
  // and the room for answers grow only as lanes are made.
  std::vector<std::unique_ptr<ShmLane>> lanes_;  // by task * contexts + context
  std::vector<ShmLane*> active_;                 // lanes made so far
  std::vector<GetResponse> responses_;           // GETs being answered through the rings; room for one a lane
  std::vector<SharedView> shared_views_;         // bounded by kMaxSharedViews
  std::array<int, 2> wake_fds_;
  std::uint64_t dropped_ = 0;
  std::uint32_t progress_calls_ = 0;
  std::uint64_t deaths_seen_ = 0;                // domain_.deaths() when last looked
  std::size_t failed_lanes_ = 0;
  // The own ring's next cell, seen reserved but uncommitted (stalled_since_ns_ != 0).
  std::uint64_t stalled_position_ = 0;
  std::int64_t stalled_since_ns_ = 0;
  std::uint64_t cells_skipped_ = 0;
  // reception_load(): the producers' tail as read once per progress() call
  // (the first time a decision asks), so the stop policy, which asks at
  // every eager packet, does not pull the cache line every producer writes
  // per cell across cores at every packet.
  mutable std::uint64_t load_tail_ = 0;
  mutable bool load_fresh_ = false;
  std::size_t tend_failed_lanes(device::PacketSink& sink);
  void skip_stalled_cell();
  void fail_lane(ShmLane& lane, Status why);
  ShmLane* made_lane(Endpoint peer) const {
    return lanes_[std::size_t{peer.task} * domain_.contexts() + peer.context].get();
  }
  // Commits a cell of lane's peer's ring; a cell the peer gave up fails the lane.
  bool commit(ShmLane& lane, const device::ReceptionQueue::Reservation& r, std::size_t bytes, std::uint16_t kind);
};

}  // namespace ami::shm
