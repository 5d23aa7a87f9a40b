// verbs_backend/verbs_device.cpp — setting up a context's device and its
// lanes: registering the FIFO's descriptors and the staging ring,
// pre-linking the work requests. The per-message path is verbs_datapath.cpp.
#include "verbs_device.hpp"

#include <algorithm>
#include <cstring>
#include <exception>

#include "ami/error.hpp"

namespace ami::verbs {

VerbsLane::VerbsLane(VerbsDevice& device, Endpoint peer, std::uint32_t index, ibv_qp* qp,
                     std::uint32_t fifo_depth, std::size_t max_packet)
    : Lane(peer, fifo_depth),
      device_(device),
      qp_(qp),
      index_(index),
      max_packet_(max_packet),
      staging_size_((std::uint64_t{device.domain_.options().staging_bytes} + 63) / 64 * 64),
      staging_end_(std::make_unique<std::uint64_t[]>(fifo_depth)),
      refused_(std::make_unique<Status[]>(fifo_depth)),
      results_(std::make_unique<void*[]>(fifo_depth)) {
  ibv_pd* pd = device.domain_.pd();
  // The descriptors stay put while their slot is in flight, so a packet's
  // inline bytes are sent straight from the slot, and an atomic's old value
  // lands in it (AtomicDescriptor::landing).
  slots_mr_ = register_memory(pd, &fifo().at(0), std::size_t{fifo_depth} * sizeof(device::Descriptor),
                              IBV_ACCESS_LOCAL_WRITE, "injection FIFO");
  staging_ = allocate_pages(staging_size_);
  staging_mr_ = register_memory(pd, staging_.get(), staging_size_, 0, "staging ring");
  for (std::uint32_t i = 0; i < kPostBatch; ++i) {
    wr_[i].next = i + 1 < kPostBatch ? &wr_[i + 1] : nullptr;
    wr_[i].sg_list = &sge_[2 * i];
  }
  sends_compact_ = device.domain_.options().immediate;
}


VerbsDevice::VerbsDevice(VerbsDomain& domain, std::uint16_t context, std::uint32_t fifo_depth)
    : domain_(domain),
      queues_(domain.queues(context)),
      context_(context),
      fifo_depth_(fifo_depth),
      repost_batch_(std::clamp<std::uint32_t>(domain.options().srq_depth / 4, 1, 64)),
      doorbell_batch_(domain.options().doorbell_batch),
      immediate_(domain.options().immediate),
      key_id_(domain.options().key_id),
      max_inline_(domain.port().max_inline),
      signal_interval_(domain.options().signal_interval),
      lanes_(std::size_t{domain.tasks()} * domain.contexts()),
      ud_qpn_(domain.queues(context).ud ? domain.queues(context).ud->qp_num : ~std::uint32_t{0}),
      cm_(domain.method() == ConnectMethod::rdma_cm) {
  if (context >= domain.contexts()) throw Error("verbs: context index out of range");
  if (fifo_depth < 2 || (fifo_depth & (fifo_depth - 1)) != 0)
    throw Error("verbs: the injection FIFO depth must be a power of two");
  // Every FIFO slot may be on the send queue at once, plus the retire probe.
  if (fifo_depth + 1 > domain.options().sq_depth)
    throw Error("verbs: the injection FIFO depth (" + std::to_string(fifo_depth) +
                ") must be below sq_depth (" + std::to_string(domain.options().sq_depth) + ")");
  active_.reserve(lanes_.size());
  wake_fds_[wake_count_++] = queues_.channel->fd;
  if (cm_) wake_fds_[wake_count_++] = queues_.cm_channel->fd;
}

VerbsDevice::~VerbsDevice() {
  // ibv_destroy_cq waits for every event taken off the channel to be acknowledged.
  if (unacked_events_ != 0) ibv_ack_cq_events(queues_.cq.get(), unacked_events_);
  // The lanes' registrations go with them: stop any WR still reading them.
  for (VerbsLane* l : active_) {
    if (l->broken_ || l->fifo().counter().snapshot() >= l->posted_) continue;
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    if (int rc = ibv_modify_qp(l->qp_, &a, IBV_QP_STATE))
      log_qp(l->qp_, "ibv_modify_qp to ERR", errno_of_rc(rc));
  }
}

std::uint64_t VerbsLane::max_rdma() const {
  const std::uint64_t port = device_.domain_.port().max_msg;
  const std::optional<std::uint64_t>& cap = device_.domain_.options().max_rdma;
  return cap ? std::min(*cap, port) : port;
}

unsigned VerbsDevice::reception_load() const {
  const std::uint32_t depth = domain_.options().srq_depth;
  const std::uint32_t posted = std::min(queues_.receives_posted, depth);
  return static_cast<unsigned>(std::uint64_t{depth - posted} * 100 / depth);
}

bool VerbsDevice::can_reach(Endpoint peer) const {
  return peer.task < domain_.tasks() && peer.task != domain_.task() && peer.context < domain_.contexts() &&
         domain_.knows(peer.task);
}

// The first call for a peer makes the lane, and its queue pair and
// connection unless the peer asked first.
device::Lane* VerbsDevice::lane(Endpoint peer) {
  if (!can_reach(peer)) return nullptr;
  const std::size_t i = domain_.lane_index(peer);
  if (lanes_[i]) return lanes_[i].get();
  Connection* c = connection(i);
  try {
    // The request goes before the lane's registrations are made: the peer
    // makes its queue pair meanwhile.
    if (c == nullptr) {
      c = &domain_.new_connection(context_, peer, true);
      start_request(*c, peer);
    }
    lanes_[i] = std::make_unique<VerbsLane>(*this, peer, static_cast<std::uint32_t>(i), c->qp.get(), fifo_depth_,
                                            domain_.max_packet(peer.task));
  } catch (const std::exception& e) {
    log("no lane from context %u to task %u context %u: %s", context_, peer.task, peer.context, e.what());
    return nullptr;
  }
  VerbsLane& lane = *lanes_[i];
  active_.push_back(&lane);
  lane.ready_ = c->state == Connection::State::ready;
  if (c->state == Connection::State::failed)
    fail_unconnected(lane, {StatusCode::peer_failed, "verbs: the lane's connection failed (see the log)"});
  return &lane;
}

bool VerbsLane::offloads_atomic(const RemoteKey& key, AtomicOp op, AtomicType type) {
  return key.atomics == AtomicDomain::nic && nic_native(op, type) && device_.domain_.port().atomics() &&
         key.entry(device_.key_id_) != nullptr;
}

// The owner's NIC does the atomics on its NIC-domain regions that reach it
// as messages (and its own), so that every one on a word is the NIC's: a
// queue pair of this context connected to itself, made at the first need.
// It shares the context's CQ; the engine drives its FIFO as any lane's.
device::Lane* VerbsDevice::atomic_loopback() {
  if (loopback_ != nullptr || loopback_failed_ || !domain_.port().atomics()) return loopback_;
  // (Its slot in lanes_ is never a peer's: can_reach() excludes this task.)
  const Endpoint self{domain_.task(), context_};
  const std::size_t i = domain_.lane_index(self);
  try {
    Connection& c = domain_.new_connection(context_, self, false);
    if (int err = domain_.connect_loopback(c))
      throw Error("verbs: the loopback queue pair: " + std::string(std::strerror(err)));
    c.state = Connection::State::ready;
    lanes_[i] = std::make_unique<VerbsLane>(*this, self, static_cast<std::uint32_t>(i), c.qp.get(), fifo_depth_,
                                            device::kPacketInlineBytes);
  } catch (const std::exception& e) {
    log("no atomic loopback on context %u: %s", context_, e.what());
    loopback_failed_ = true;
    return nullptr;
  }
  loopback_ = lanes_[i].get();
  loopback_->loopback_ = true;
  loopback_->ready_ = true;
  active_.push_back(loopback_);
  return loopback_;
}

// (docs/DESIGN.md, "Event-driven progress") The channel is non-blocking:
// taking its events ends at EAGAIN. They are acknowledged kAckBatch at a
// time, since ibv_ack_cq_events takes the CQ's lock.
Status VerbsDevice::arm() {
  while (stashed_ == 0 && queues_.channel != nullptr) {
    ibv_cq* cq = nullptr;
    void* cookie = nullptr;
    if (ibv_get_cq_event(queues_.channel.get(), &cq, &cookie) != 0) break;
    if (++unacked_events_ >= kAckBatch) {
      ibv_ack_cq_events(cq, unacked_events_);
      unacked_events_ = 0;
    }
  }
  if (stashed_ != 0 || handshakes_ != 0 || tending_ || broken_lanes_ != 0)
    return {StatusCode::busy, "verbs: completions, a handshake or a lane to tend"};
  if (int rc = ibv_req_notify_cq(queues_.cq.get(), 0)) {
    log("ibv_req_notify_cq: %s", std::strerror(errno_of_rc(rc)));
    return {StatusCode::device_error, "verbs: ibv_req_notify_cq failed (see the log)"};
  }
  // What came before the request raised no event: look once more.
  stashed_ = ibv_poll_cq(queues_.cq.get(), kPollBatch, stash_);
  if (stashed_ < 0) {
    log("ibv_poll_cq on context %u: error %d", context_, stashed_);
    stashed_ = 0;
    return {StatusCode::device_error, "verbs: ibv_poll_cq failed (see the log)"};
  }
  if (stashed_ != 0) return {StatusCode::busy, "verbs: completions came while arming"};
  return Status::success();
}

void VerbsDevice::consume_event() {
  ibv_cq* cq = nullptr;
  void* cookie = nullptr;
  if (ibv_get_cq_event(queues_.channel.get(), &cq, &cookie) == 0) ++unacked_events_;
}

}  // namespace ami::verbs
