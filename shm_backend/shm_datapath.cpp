// shm_backend/shm_datapath.cpp — the per-message path: lanes into peers'
// rings, and the context's own ring out to the protocol.
#include <algorithm>
#include <cstring>

#include "ami/device/coarse_clock.hpp"
#include "shared_region.hpp"
#include "shm_device.hpp"

namespace ami::shm {

namespace {
constexpr Status kPeerExited{StatusCode::peer_failed, "shm: the peer process exited"};
}  // namespace

ShmDevice::ShmDevice(ShmDomain& domain, std::uint16_t context, std::uint32_t fifo_depth)
    : domain_(domain), context_(context), fifo_depth_(fifo_depth),
      lanes_(std::size_t{domain.tasks()} * domain.contexts()),
      wake_fds_{domain.own_wake_fd(context), domain.deaths_fd()} {
  // Ring cells go back to the producers in batches of an eighth of the ring
  // (and in every lull, by return_credit()).
  device::ReceptionQueue& q = domain_.own_queue(context_);
  q.set_credit_batch(q.depth() / 8);
}

// Every peer learnt (at setup, or on demand), mapped yet or not.
bool ShmDevice::can_reach(Endpoint peer) const {
  return peer.task != domain_.task() && peer.context < domain_.contexts() &&
         domain_.reaches(peer.task);
}

// Made on first use, outside the per-message path: the first lane to a task
// in this process maps its segment. One that cannot be mapped is made
// failed, so that what is posted to it fails and the sink hears why.
device::Lane* ShmDevice::lane(Endpoint peer) {
  if (!can_reach(peer)) return nullptr;
  auto& l = lanes_[std::size_t{peer.task} * domain_.contexts() + peer.context];
  if (!l) {
    const Status mapped = domain_.map(peer.task);
    device::ReceptionQueue* target = mapped.ok() ? &domain_.peer_queue(peer.task, peer.context) : nullptr;
    l = std::make_unique<ShmLane>(*this, peer, fifo_depth_, target, domain_.pid(peer.task),
                                  mapped.ok() ? domain_.peer_wake_fd(peer.task, peer.context) : -1);
    active_.push_back(l.get());
    responses_.reserve(active_.size());  // at most one answer in flight per lane
    if (!mapped.ok()) fail_lane(*l, mapped);
    else if (domain_.dead(peer.task)) fail_lane(*l, kPeerExited);
  }
  return l.get();
}

// (A lane without a ring is failed and never sends: any size will do.)
std::size_t ShmLane::max_packet() const {
  return target_ != nullptr ? target_->max_data() : device_.domain_.own_queue(device_.context_).max_data();
}

// Its failure is reported once this context's ring gave up every cell
// reserved before now (see tend_failed_lanes).
void ShmDevice::fail_lane(ShmLane& lane, Status why) {
  if (!lane.failure_.ok()) return;
  lane.failure_ = why;
  lane.drain_to_ = domain_.own_queue(context_).tail();
  ++failed_lanes_;
}

bool ShmDevice::commit(ShmLane& lane, const device::ReceptionQueue::Reservation& r, std::size_t bytes,
                       std::uint16_t kind) {
  const bool committed = lane.target_->commit(r, static_cast<std::uint32_t>(bytes), me(kind));
  if (r.wake) [[unlikely]]
    device::notify(lane.target_wake_);  // it sleeps (docs/DESIGN.md, "Event-driven progress")
  if (committed) return true;
  fail_lane(lane, kCellSkipped);  // a packet of its ordered stream is lost
  return false;
}

ShmDevice::Step ShmDevice::send_packet(ShmLane& lane, const device::PacketDescriptor& p) {
  const std::size_t bytes = std::size_t{p.inline_len} + p.payload_len;
  if (bytes > lane.target_->max_data()) return Step::done;  // the engine never builds one
  auto r = lane.target_->reserve();
  if (!r) return Step::stalled;
  std::memcpy(r.data(), p.inline_data, p.inline_len);
  if (p.payload_len != 0) std::memcpy(r.data() + p.inline_len, p.payload, p.payload_len);
  return commit(lane, r, bytes, kPacketCell) ? Step::done : Step::stalled;  // (the failed lane fails it)
}

ShmDevice::Step ShmDevice::execute(ShmLane& lane, std::uint64_t n) {
  return device::visit(lane.fifo().at(n), device::cases(
      /*packet*/ [&](const device::PacketDescriptor& p) { return send_packet(lane, p); },
      /*put*/ [&](const device::RdmaDescriptor&) { return rdma(lane, n, true); },
      /*get*/ [&](const device::RdmaDescriptor&) { return rdma(lane, n, false); },
      // Built only for a region this process maps (offloads_atomic()).
      /*atomic*/ [&](const device::AtomicDescriptor& a) {
        atomic_mapped(lane, n, a);
        return Step::done;
      }));
}

// PUT and GET go the same way: into a mapped region, by CMA, or through
// the rings (one started through the rings goes on there).
ShmDevice::Step ShmDevice::rdma(ShmLane& lane, std::uint64_t n, bool put) {
  device::Descriptor& d = lane.fifo().at(n);
  const bool fresh = !lane.get_waiting_ && !lane.put_waiting_ && lane.put_sent_ == 0;
  std::uint32_t shared_fd = 0;
  if (fresh && !decode_entry(d.rdma.remote.entry(domain_.key_id()), shared_fd)) {
    // A key shm did not register (or one edited): nothing in it is shm's to read.
    lane.fifo().fail_one(n, {StatusCode::remote_access, d.kind == device::DescriptorKind::put
                                                            ? "put: the remote key has no shm entry"
                                                            : "get: the remote key has no shm entry"});
    return Step::done;
  }
  if (fresh && shared_fd != 0) return rdma_mapped(lane, n, shared_fd);
  if (fresh && domain_.cma()) return rdma_cma(lane, n);
  return put ? put_through_ring(lane, n) : get_through_ring(lane, n);
}

// Descriptors run strictly in order, so the counter is also the next one to
// run: a descriptor that cannot finish now holds back those behind it, as
// an RC send queue does.
std::size_t ShmDevice::drain_lane(ShmLane& lane, bool packets_only) {
  if (!lane.failure_.ok()) return 0;  // tend_failed_lanes() fails what it is given
  auto& fifo = lane.fifo();
  const std::uint64_t start = fifo.counter().snapshot();
  std::uint64_t n = start;
  while (n < fifo.injected()) {
    if (packets_only && fifo.at(n).kind != device::DescriptorKind::packet) break;
    if (execute(lane, n) != Step::done) break;
    ++n;
  }
  if (n != start) fifo.counter().advance_to(n);
  return n - start;
}

void ShmLane::ring() { device_.drain_lane(*this, true); }

// (A task not learnt yet, with addresses on demand, is learnt now: it put
// the cell into this task's ring, so it is a peer of this host.)
ShmLane* ShmDevice::lane_from(const device::ReceptionQueue::Origin& origin) {
  const Endpoint from{origin.task, origin.context};
  if (!can_reach(from) && (from.context >= domain_.contexts() || !domain_.learn_on_demand(from.task) ||
                           !can_reach(from)))
    return nullptr;
  return static_cast<ShmLane*>(lane(from));
}

void ShmDevice::deliver(device::PacketSink& sink, const device::ReceptionQueue::Arrival& a) {
  const Endpoint from{a.origin.task, a.origin.context};
  if (a.origin.kind == kPacketCell) {
    sink.on_packet(from, a.data);  // the engine checks the origin and the bytes
    return;
  }
  RdmaChunk c;
  // A ring-copy PUT or GET from a peer this context has no lane to yet
  // makes one, which maps the peer's segment if no context has.
  ShmLane* lane = lane_from(a.origin);
  if (lane == nullptr) {
    // From a task shm does not reach (not learnt at setup): no data can go
    // back, so a GET request would wait for ever unseen. The sink counts it
    // (and fails the origin if nothing reaches it).
    ++dropped_;
    sink.on_unknown_origin(from);
    return;
  }
  if (lane->target_ == nullptr) {
    ++dropped_;  // its segment could not be mapped: the lane is failed, and the sink hears why
    return;
  }
  if (a.data.size() < sizeof c) {
    ++dropped_;
    return;
  }
  std::memcpy(&c, a.data.data(), sizeof c);
  const auto data = a.data.subspan(sizeof c);
  switch (a.origin.kind) {
    case kPutDataCell: on_put_data(*lane, c, data); break;
    case kPutDoneCell: on_put_done(*lane, c); break;
    case kGetRequestCell: on_get_request(from, c); break;
    case kGetDataCell: on_get_data(*lane, c, data); break;
    default: ++dropped_; break;
  }
}

// As when the process watch sees the peer exit: reported once this
// context's ring gave up every cell reserved before now.
bool ShmDevice::abandon(Endpoint peer, Status why) {
  if (!can_reach(peer)) return false;
  ShmLane* lane = made_lane(peer);
  if (lane == nullptr) return false;
  fail_lane(*lane, why);
  return true;
}

// Lanes whose peer process exited — to every context of its task — and
// lanes failed otherwise: what their FIFOs hold fails, GETs being answered
// for the peer are dropped, and the sink hears of each once — after this
// context's ring has given up every cell reserved before the failure was
// seen, so what the peer sent before it died is delivered first.
std::size_t ShmDevice::tend_failed_lanes(device::PacketSink& sink) {
  std::size_t work = 0;
  if ((++progress_calls_ & 255) == 0) domain_.watch();
  const std::uint64_t deaths = domain_.deaths();
  device::ReceptionQueue& own = domain_.own_queue(context_);
  if (deaths != deaths_seen_) {
    deaths_seen_ = deaths;
    // A process that exited takes every context of its task with it: each
    // of its endpoints fails now, not only those this context has talked to
    // (lane() makes the others failed; to a task that died before it was
    // mapped here, they are failed from the start). A death is rare; the
    // lanes are made outside the per-message path.
    for (const std::uint32_t task : domain_.dead_tasks())
      for (std::uint16_t context = 0; context < domain_.contexts(); ++context)
        if (device::Lane* l = lane({task, context})) fail_lane(static_cast<ShmLane&>(*l), kPeerExited);
    std::erase_if(responses_, [&](const GetResponse& r) { return domain_.dead(r.to.task); });
  }
  // (A process can die holding a cell here before any lane to it exists.)
  if ((progress_calls_ & 255) == 0) skip_stalled_cell();
  if (failed_lanes_ == 0) return 0;
  // By index: the sink's callbacks may make lanes, which grows active_.
  for (std::size_t i = 0; i < active_.size(); ++i) {
    ShmLane* lane = active_[i];
    if (lane->failure_.ok() || own.consumed() < lane->drain_to_) continue;
    auto& fifo = lane->fifo();
    if (fifo.counter().snapshot() < fifo.injected()) work += fifo.fail_pending(lane->failure_);
    if (!lane->reported_) {
      lane->reported_ = true;
      sink.on_lane_failed(lane->peer(), lane->failure_);
      ++work;
    }
  }
  return work;
}

// Once a peer failed, a cell it reserved in this context's ring and never
// committed would hold back every cell behind it, other peers' included, and
// the failed lane's report (it waits for the ring to pass its cells). A cell
// that stays so for AMI_SHM_STALL_TIMEOUT is skipped; should its producer
// be alive after all, its commit fails and its lane to here fails with it.
// While no failure is known the cell is not skipped, but the peers this
// process never mapped, which nothing watches, are looked at once per
// timeout: one of them may have died holding it.
// (Its copy into the cell may still land after the cell was reused, and a
// commit stalled between its look and its store is lost unseen — see
// ReceptionQueue::commit: the price of not waiting forever, paid only by a
// producer stalled for the whole timeout inside a few instructions.)
void ShmDevice::skip_stalled_cell() {
  device::ReceptionQueue& own = domain_.own_queue(context_);
  std::uint64_t position = 0;
  if (!own.stalled(position)) {
    stalled_since_ns_ = 0;
    return;
  }
  const std::int64_t now = device::coarse_now_ns();
  if (stalled_since_ns_ == 0 || position != stalled_position_) {
    stalled_position_ = position;
    stalled_since_ns_ = now;
    return;
  }
  if (now - stalled_since_ns_ < std::int64_t{domain_.stall_timeout_ms()} * 1'000'000) return;
  if (failed_lanes_ == 0 && deaths_seen_ == 0 && !domain_.look_at_unmapped_peers()) {
    stalled_since_ns_ = now;  // a producer only slow, as far as is known: look again later
    return;
  }
  if (own.give_up(position)) ++cells_skipped_;
  stalled_since_ns_ = 0;
}

// (docs/DESIGN.md, "Event-driven progress") The ring is armed last: a
// producer that finds it armed writes the eventfd drained first.
Status ShmDevice::arm() {
  (void)device::drain(wake_fds_[0]);  // a hint only: the ring says
  if (domain_.death_pending()) domain_.watch(true);
  return arm_quiet();
}

// Its eventfd and the deaths' set were just seen quiet by the context.
Status ShmDevice::arm_quiet() {
  if (domain_.unwakeable())
    return {StatusCode::not_supported, "shm: a peer could not take this context's wake-up eventfd "
                                       "(pidfd_getfd refused): its packets could not wake a sleeper"};
  if (domain_.deaths() != deaths_seen_ || !responses_.empty())
    return {StatusCode::busy, "shm: a peer exited, or GETs are being answered"};
  for (ShmLane* l : active_) {
    auto& fifo = l->fifo();
    const std::uint64_t head = fifo.counter().snapshot();
    // (A ring-copy PUT or GET waiting for the peer's answer waits on this ring.)
    const bool answered = (l->put_waiting_ && l->put_answered_) ||
                          (l->get_waiting_ && l->get_received_ >= fifo.at(head).rdma.length);
    const bool moving = head < fifo.injected() && (answered || (!l->put_waiting_ && !l->get_waiting_));
    if (moving || (!l->failure_.ok() && !l->reported_))
      return {StatusCode::busy, "shm: a lane has descriptors to move or a failure to report"};
  }
  if (!domain_.own_queue(context_).arm()) return {StatusCode::busy, "shm: a cell is in the ring"};
  return Status::success();
}

std::size_t ShmDevice::progress(device::PacketSink& sink, std::size_t budget) {
  std::size_t work = tend_failed_lanes(sink);
  for (std::size_t i = 0; i < active_.size(); ++i) work += drain_lane(*active_[i]);
  if (!responses_.empty()) work += serve_get_responses();
  device::ReceptionQueue& q = domain_.own_queue(context_);
  device::ReceptionQueue::Arrival a;
  load_fresh_ = false;
  for (std::size_t i = 0; i < budget && q.peek(a); ++i, ++work) {
    deliver(sink, a);
    q.release();
  }
  return work;
}

}  // namespace ami::shm

namespace ami::shm {

// The tasks known on this host (learnt at setup, or as used) and this one,
// against the CPUs online.
bool ShmLane::oversubscribed() const { return device_.domain_.peers_known() + 1 > device_.domain_.cpus(); }

// With CMA: about where the rest of a message streamed through the ring
// takes as long as a stop and a PUT (shared with a GET, rndv::kSplitMin).
// The cost of the eager path is per packet, so it is counted in packets:
// with the default 256-byte cells (64 packets: 14.5 KiB), measured as
// bench/rndv_sweep.sh does, messages of 12 KiB arrived 12% sooner eagerly,
// of 16 KiB 7% sooner stopped at the first packet.
std::uint64_t ShmLane::rdma_crossover() const {
  return device_.domain_.cma() ? std::uint64_t{64} * max_packet() : std::uint64_t{1} << 20;
}

// (Cells go back in batches, or when the peer has nothing else to do: a
// receiver that takes a message whole without stopping it still gets the
// rest, as fast as it hands cells back.)
bool ShmLane::backlogged() const { return target_ != nullptr && target_->unconsumed() > kBacklogCells; }

std::size_t ShmDevice::return_credit() { return domain_.own_queue(context_).publish(); }

// Cells reserved and not yet consumed: the tail as this progress() call
// first read it, less what was consumed since (arrivals after that read are
// counted from the next call on).
unsigned ShmDevice::reception_load() const {
  device::ReceptionQueue& q = domain_.own_queue(context_);
  if (!load_fresh_) {
    load_tail_ = q.tail();
    load_fresh_ = true;
  }
  const std::uint64_t consumed = q.consumed();
  const std::uint64_t used = load_tail_ > consumed ? std::min<std::uint64_t>(load_tail_ - consumed, q.depth()) : 0;
  return static_cast<unsigned>(used * 100 / q.depth());
}

}  // namespace ami::shm
