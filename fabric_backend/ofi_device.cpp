// fabric_backend/ofi_device.cpp — setting up a context's device: its
// receive buffers and staging pool, its lanes; and its teardown. The
// per-message path is ofi_datapath.cpp.
#include "ofi_device.hpp"

#include <rdma/fi_errno.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "ami/error.hpp"

namespace ami::ofi {

OfiLane::OfiLane(OfiDevice& device, Endpoint peer, fi_addr_t address, std::uint32_t fifo_depth)
    : Lane(peer, fifo_depth),
      device_(device),
      address_(address),
      ops_(std::make_unique<OpContext[]>(fifo_depth)),
      done_(std::make_unique<std::uint8_t[]>(fifo_depth)),
      staging_(std::make_unique<std::int32_t[]>(fifo_depth)),
      headers_(std::make_unique<SequenceHeader[]>(fifo_depth)),
      refused_status_(std::make_unique<Status[]>(fifo_depth)) {
  std::fill_n(staging_.get(), fifo_depth, -1);
  sends_compact_ = device.compact_ && !device.mr_local_;
  for (std::uint32_t i = 0; i < fifo_depth; ++i) ops_[i].lane = this;
}

std::size_t OfiLane::max_packet() const { return device_.max_packet_; }
bool OfiLane::ordered() const { return device_.fabric_.facts().ordered; }
std::uint64_t OfiLane::max_rdma() const {
  return std::min<std::uint64_t>(device_.fabric_.facts().max_msg, std::uint64_t{1} << 30);
}

bool OfiLane::get_beats_put() const { return !ordered() && !device_.fabric_.facts().on_shm; }

bool OfiLane::get_beats_eager() const {
  const ProviderFacts& f = device_.fabric_.facts();
  return f.over_rxm && !f.on_verbs;
}

std::uint64_t OfiLane::rdma_crossover() const {
  return device_.fabric_.facts().on_verbs ? 2 * max_packet() : device::Lane::rdma_crossover();
}

void OfiLane::ring() { device_.ring(*this); }

bool OfiLane::send_compact(std::uint32_t immediate, std::span<const std::byte> head,
                           std::span<const std::byte> payload) {
  return device_.send_compact(*this, immediate, head, payload);
}

OfiDevice::OfiDevice(OfiFabric& fabric, std::uint16_t context, std::uint32_t fifo_depth)
    : fabric_(fabric),
      ep_(fabric.endpoint(context)),
      context_(context),
      fifo_depth_(fifo_depth),
      key_id_(fabric.key_id()),
      origin_(origin_word(fabric.task(), context)),
      compact_(fabric.facts().cq_data >= 8),
      sequenced_(!fabric.facts().receives_in_order),
      delivery_complete_(fabric.facts().name != "shm"),
      mr_local_(fabric.facts().mr_local),
      virt_addr_((fabric.facts().mr_mode & FI_MR_VIRT_ADDR) != 0),
      inject_(fabric.facts().inject),
      max_packet_(fabric.max_packet()),
      bundle_max_(fabric.options().bundle),
      bundle_bytes_(inject_ >= 4096 ? std::min<std::size_t>(inject_, max_packet_) : max_packet_),
      recv_bytes_(fabric.recv_buffer_bytes()),
      lanes_(fabric.tasks()),
      inbound_(fabric.tasks()) {
  if (fifo_depth < 2 || (fifo_depth & (fifo_depth - 1)) != 0)
    throw Error("ofi: the injection FIFO depth must be a power of two");
  const std::uint32_t buffers = fabric.options().recv_buffers;
  // The rescue receive's packet follows the buffers, in their registration.
  // Page-aligned: on shm a packet above the inject size is copied in by
  // process_vm_readv, and one of 64 KiB landing at a page's start touches 16
  // pages, not 17 (malloc's large blocks start 16 bytes into a page): such
  // a copy took 6.85 us instead of 7.15, measured alone. Zeroed, so that no
  // arrival meets a page not yet mapped.
  const std::size_t recv_total = buffers * recv_bytes_ + max_packet_ + kHeaderBytes;
  recv_memory_ = device::allocate_pages(recv_total);
  std::memset(recv_memory_.get(), 0, recv_total);
  rescue_memory_ = recv_memory_.get() + buffers * recv_bytes_;
  if (mr_local_) {
    Status s = fabric.register_own(recv_memory_.get(), recv_total, recv_mr_);
    if (!s.ok()) throw Error(std::string("ofi: registering the receive buffers: ") + s.what());
    recv_desc_ = fi_mr_desc(recv_mr_.get());
  }
  if (mr_local_ || bundle_max_ > 1) {
    const std::uint32_t staging = fabric.options().staging;
    staging_bytes_ = (mr_local_ ? max_packet_ : bundle_bytes_) + kHeaderBytes;
    staging_memory_ = std::make_unique_for_overwrite<std::byte[]>(std::size_t{staging} * staging_bytes_);
    if (mr_local_) {
      const Status s = fabric.register_own(staging_memory_.get(), std::size_t{staging} * staging_bytes_, staging_mr_);
      if (!s.ok()) throw Error(std::string("ofi: registering the staging packets: ") + s.what());
      staging_desc_ = fi_mr_desc(staging_mr_.get());
    }
    for (std::int32_t i = static_cast<std::int32_t>(staging) - 1; i >= 0; --i) staging_free_.push_back(i);
  }
  recv_ops_ = std::make_unique<OpContext[]>(buffers);
  to_repost_.reserve(buffers);
  for (std::uint32_t i = 0; i < buffers; ++i) {
    recv_ops_[i].n = i;
    post_receive(i);  // (one the provider refuses now waits in to_repost_)
  }
  if (to_repost_.size() == buffers) throw Error("ofi: no receive buffer could be posted (see the log)");
}

// What the context sent last must still leave: descriptors the provider
// refused for now (rxm while it connects) are posted, and what was given to
// the provider gets a moment to complete (the counter says when all has),
// so that closing the endpoint does not cut it. Bounded: a peer that is
// gone does not hold the teardown up.
OfiDevice::~OfiDevice() {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::seconds(1);
  fi_cq_data_entry e[16];
  for (;;) {
    bool unposted = false;
    for (OfiLane* lane : active_) {
      if (lane->broken_) continue;
      if (lane->posted_ < lane->fifo().injected()) post(*lane);
      unposted = unposted || (!lane->broken_ && lane->posted_ < lane->fifo().injected());
    }
    const std::uint64_t done = fi_cntr_read(ep_.cntr.get()) + fi_cntr_readerr(ep_.cntr.get());
    if ((!unposted && done >= ops_posted_) || Clock::now() >= deadline) break;
    const ssize_t n = fi_cq_read(ep_.cq.get(), e, 16);
    for (ssize_t i = 0; i < n; ++i) {  // the lanes' slots only: arrivals have nobody to go to now
      auto* op = static_cast<OpContext*>(e[i].op_context);
      if (op != nullptr && op->lane != nullptr && !(e[i].flags & FI_RECV)) complete(*op);
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      (void)fi_cq_readerr(ep_.cq.get(), &err, 0);
    }
  }
  fabric_.close_endpoint(context_);
}

unsigned OfiDevice::reception_load() const {
  const std::uint32_t buffers = fabric_.options().recv_buffers;
  const std::size_t behind = std::min<std::size_t>(backlog_, kBacklogFull) * 100 / kBacklogFull;
  return static_cast<unsigned>(std::max(behind, to_repost_.size() * 100 / buffers));
}

bool OfiDevice::can_reach(Endpoint peer) const {
  return peer.task != fabric_.task() && fabric_.connected(peer.task) &&
         peer.context < fabric_.peer_contexts(peer.task);
}

device::Lane* OfiDevice::lane(Endpoint peer) {
  if (!can_reach(peer)) return nullptr;
  auto& row = lanes_[peer.task];
  if (!row) row = std::make_unique<std::unique_ptr<OfiLane>[]>(fabric_.peer_contexts(peer.task));
  std::unique_ptr<OfiLane>& l = row[peer.context];
  if (!l) {
    l = std::make_unique<OfiLane>(*this, peer, ep_.peers[peer.task][peer.context], fifo_depth_);
    active_.push_back(l.get());
  }
  return l.get();
}

// The provider keeps no connection ami could cut: the lane stops here, and
// what its FIFO holds fails in the next progress().
bool OfiDevice::abandon(Endpoint peer, Status why) {
  if (!can_reach(peer) || !lanes_[peer.task] || !lanes_[peer.task][peer.context]) return false;
  OfiLane& l = *lanes_[peer.task][peer.context];
  if (!l.broken_) break_lane(l, why);
  return true;
}

std::span<const int> OfiDevice::wake_fds() const {
  if (ep_.wait_fd < 0) return {};
  return {&ep_.wait_fd, 1};
}

Status OfiDevice::arm() {
  if (held_) post_held();
  if (ep_.wait_fd < 0)
    return {StatusCode::not_supported,
            "ofi: the provider gives its completion queue no wait descriptor (shm has none), or AMI_OFI_WAIT "
            "is off: its contexts cannot sleep; advance them"};
  // A descriptor the provider refused for now (-FI_EAGAIN: rxm connecting,
  // a full queue), a buffer to post again or a failure to report: nothing
  // would raise a CQ entry for them.
  if (tending_ || broken_lanes_ != 0) return {StatusCode::busy, "ofi: work to post"};
  const int rc = fabric_.trywait(context_);
  if (rc == 0) return {};
  if (rc == -FI_EAGAIN) return {StatusCode::busy, "ofi: the completion queue has entries"};
  log("fi_trywait (context %u): %s", context_, fi_strerror(-rc));
  return {StatusCode::device_error, "ofi: fi_trywait failed (logged)"};
}

OfiDevice::Inbound* OfiDevice::inbound(Endpoint origin) {
  if (origin.task >= fabric_.tasks() || origin.task == fabric_.task()) return nullptr;
  const std::uint16_t contexts = fabric_.peer_contexts(origin.task);
  if (origin.context >= contexts) return nullptr;
  auto& row = inbound_[origin.task];
  if (!row) row = std::make_unique<Inbound[]>(contexts);
  return &row[origin.context];
}

}  // namespace ami::ofi
