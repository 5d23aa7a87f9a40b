// protocol/am/eager/am_engine.cpp — setup, the send side and the work queue.
#include "am_engine.hpp"
#include "packet_build.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

namespace ami::protocol {

namespace {

constexpr std::size_t kWireHeader = sizeof(wire::PacketHeader);
constexpr std::size_t kShortHeader = wire::kShortHeaderBytes;
// The eager packets of a message its receiver is expected to stop (even a
// whole first packet leaves more than the crossover to come) grow from a
// quarter of the lane's largest (at least this much), doubling up to the
// largest: the receiver gets the header early and stops the message before
// much of it is on the wire. Any other message goes in whole packets from
// the first: it will most likely arrive eagerly, and each packet costs
// (over tcp;ofi_rxm a 64 KiB message took 6 packets growing from 4 KiB, 4
// whole ones: its ping-pong 37-44 us instead of 53-64).
constexpr std::uint64_t kFirstEager = 512;
// Eager packets of a message its receiver may stop go out at most this
// many per pass of the work queue, so the receiver's stop (which travels
// behind whatever its own lane holds) meets a short stream, not a FIFO's
// worth of packets the rendezvous then makes useless.
constexpr std::uint32_t kEagerBurst = 16;
// And when the receiver is expected to stop the message at its first
// packet (even a whole first packet leaves more than the crossover to come,
// Lane::rdma_crossover() or AMI_RNDV_CROSSOVER, which the receiver judges
// by too), they are paced by their completions: beyond the first, one goes
// out only while fewer than this many of the lane's descriptors injected
// since the first packet are still on it (not passed by its transfer
// counter). The stop then finds the rest unsent instead of a FIFO's worth
// of packets queued on a slow link, which it cannot call back. Where
// packets leave at once (shm: into the peer's ring) the window never
// fills: the lane's backlogged() paces them instead (docs/DESIGN.md,
// "Method 2"). The sender decides nothing by it: a receiver that does not
// stop gets every byte eagerly all the same.
constexpr std::uint64_t kEagerWindow = 2;

}  // namespace

AmEngine::AmEngine(Shape shape, ContextStats& stats)
    : shape_(shape),
      stats_(stats),
      pool_(shape.options.max_requests),
      inbound_(shape.options.max_requests),
      acks_(shape.options.ack_idle_threshold, shape.options.ack_max_unacked) {
  // Only the small record per endpoint: the rest comes with a lane
  // (make_lane()), and so do the lists of peers with one.
  peers_.resize(std::size_t{shape.tasks} * shape.contexts);
  posted_.reserve(64);
  running_.reserve(64);
  if (shape.options.keepalive_ms == 0) next_keepalive_ns_ = std::numeric_limits<std::int64_t>::max();
}

Status AmEngine::set_dispatch(std::uint16_t id, Dispatch dispatch) {
  if (id >= kMaxDispatch)
    return {StatusCode::invalid_argument, "set_dispatch: id is not below kMaxDispatch (256)"};
  dispatch_[id] = dispatch;
  return Status::success();
}

namespace {
std::size_t immediate_bytes(const device::Lane& lane) {
  return std::min(lane.max_packet(), device::kPacketInlineBytes) - kShortHeader;
}
}  // namespace

// The first device that reaches the peer makes the lane. None may yet
// because its task's address was never needed: the directory learns it
// (blocking while it is fetched), once, and the devices are asked again.
device::Lane* AmEngine::make_lane(Peer& peer) {
  const Endpoint e = endpoint_of(peer);
  const auto reaches = [e](const device::Device* d) { return d->can_reach(e); };
  if (directory_ != nullptr && std::none_of(devices_.begin(), devices_.end(), reaches) &&
      !directory_->learn(e.task).empty())
    return nullptr;
  for (device::Device* d : devices_) {
    if (!d->can_reach(e)) continue;
    device::Lane* lane = d->lane(e);
    if (lane == nullptr) return nullptr;
    peer.state = std::make_unique<PeerState>(e, index_of(peer));
    peer.state->device = d;
    peer.state->immediate = static_cast<std::uint32_t>(immediate_bytes(*lane));
    peer.lane = lane;
    lanes_.push_back(lane);
    reached_.push_back(&peer);
    // Any peer with a lane may be busy at once; the room is made here, not
    // in mark_busy() on the data path (doubling: lanes come one by one).
    if (busy_.capacity() < reached_.size()) busy_.reserve(2 * reached_.size());
    find_polled();
    return lane;
  }
  return nullptr;
}

void AmEngine::find_polled() {
  polled_.clear();
  for (device::Device* d : devices_)
    if (d->wants_progress()) polled_.push_back(d);
}

std::size_t AmEngine::immediate_limit(Endpoint dest) {
  Peer* peer = peer_for(dest);
  device::Lane* lane = peer ? lane_for(*peer) : nullptr;
  return lane != nullptr ? immediate_bytes(*lane) : 0;
}

std::string_view AmEngine::backend_for(Endpoint dest) {
  Peer* peer = peer_for(dest);
  return (peer && lane_for(*peer)) ? peer->state->device->name() : std::string_view{};
}

Status AmEngine::check_send(const SendParams& p) const {
  if (p.dest.task >= shape_.tasks)
    return {StatusCode::invalid_argument, "send: endpoint task is out of range"};
  if (p.dest.context >= shape_.contexts)
    return {StatusCode::invalid_argument, "send: endpoint context is out of range"};
  if (p.dispatch >= kMaxDispatch)
    return {StatusCode::invalid_argument, "send: dispatch id is not below kMaxDispatch (256)"};
  if (p.header.size() > wire::kMaxUserHeader)
    return {StatusCode::invalid_argument, "send: header is longer than kMaxHeaderBytes (128)"};
  if (p.header.data() == nullptr && !p.header.empty())
    return {StatusCode::invalid_argument, "send: header is null but its length is not zero"};
  if (p.payload.data() == nullptr && !p.payload.empty())
    return {StatusCode::invalid_argument, "send: payload is null but its length is not zero"};
  if (p.memory != nullptr && !p.memory->valid())
    return {StatusCode::not_registered, "send: memory is not a live registration"};
  if (p.memory != nullptr && !inside(p.memory, p.payload.data(), p.payload.size()))
    return {StatusCode::invalid_argument, "send: payload lies outside the given memory"};
  return Status::success();
}

// What send_immediate() refused: the Status that names why, or the
// message after all once the peer's first lane is made.
Status AmEngine::refuse_immediate(const SendImmediateParams& p) {
  if (Status s = check_send(SendParams{p.dest, p.dispatch, p.header, p.payload, {}, {}}); !s.ok()) return s;
  Peer& peer = *peer_for(p.dest);  // (in range: checked)
  if (!peer.failure.ok()) return {StatusCode::peer_failed, "send_immediate: the endpoint's peer failed"};
  device::Lane* lane = lane_for(peer);
  if (lane == nullptr) return {StatusCode::unreachable, "send_immediate: no backend reaches the endpoint"};
  if (p.header.size() + p.payload.size() > peer.state->immediate)
    return {StatusCode::invalid_argument, "send_immediate: header + payload exceed immediate_limit()"};
  if (peer.state->head != nullptr)
    return {StatusCode::no_resource, "send_immediate: earlier instructions to the endpoint are queued"};
  return inject_immediate(*lane, p);  // a lane made just now
}

Status AmEngine::send(const SendParams& p) {
  Status s = check_send(p);
  if (s.ok()) s = check_alive(p.dest, "send: the endpoint's peer failed");
  if (!s.ok()) return s;
  Peer& peer = *peer_for(p.dest);
  device::Lane* lane = lane_for(peer);
  if (lane == nullptr) return {StatusCode::unreachable, "send: no backend reaches the endpoint"};

  const bool one_packet = kShortHeader + p.header.size() + p.payload.size() <= lane->max_packet();
  if (!one_packet && kWireHeader + p.header.size() + wire::RendezvousInfo::kBytes >= lane->max_packet())
    return {StatusCode::invalid_argument,
            "send: the header leaves no room for data in the lane's packets (AMI_SHM_CELL_SIZE)"};
  if (one_packet && !p.remote_done && peer.state->head == nullptr) {
    // No callback: a device that sends the compact form may take the
    // message to the wire at once (it copies what it sends, as for
    // send_immediate(): a 4096-byte message over libfabric's shm is an
    // injected send), with no descriptor built.
    if (!p.local_done && lane->sends_compact() &&
        lane->send_compact(wire::compact_short(p.dispatch, static_cast<std::uint16_t>(p.header.size())), p.header,
                           p.payload)) {
      ++stats_.messages_sent;
      ++stats_.packets_sent;
      stats_.bytes_sent += p.payload.size();
      return Status::success();
    }
    // Fast path: no request at all; the user's callback is listed directly.
    if (device::Descriptor* d = lane->fifo().try_reserve()) {
      const auto n = static_cast<std::uint32_t>(p.payload.size());
      const bool keyed = inside(p.memory, p.payload.data(), p.payload.size());
      build_short(*d, p.dispatch, p.header, p.payload, keyed ? &p.memory->local_keys() : nullptr);
      lane->fifo().commit(p.local_done);
      ring(*lane);
      ++stats_.messages_sent;
      ++stats_.packets_sent;
      stats_.bytes_sent += n;
      return Status::success();
    }
  }
  Request* r = acquire();
  if (r == nullptr) return {StatusCode::no_resource, "send: every request (AMI_MAX_REQUESTS) is in use"};
  r->kind = Request::Kind::send;
  r->dispatch = p.dispatch;
  r->header_len = static_cast<std::uint16_t>(p.header.size());
  if (!p.header.empty()) std::memcpy(r->header.data(), p.header.data(), p.header.size());
  r->payload = p.payload.data();
  r->total = p.payload.size();
  r->eager_end = r->total;
  r->local_done = p.local_done;
  r->remote_done = p.remote_done;
  r->flags = p.remote_done ? wire::kWantsRemoteDone : 0;
  r->local_pending = true;
  r->remote_pending = static_cast<bool>(p.remote_done);
  if (!one_packet) register_send(*r, p);
  enqueue(peer, *r);
  ++stats_.messages_sent;
  return Status::success();
}

// A message of more than one packet is one its receiver may stop: its
// buffer must be registered for the receiver's GET (or the sender's PUT)
// until the receiver acks. When it cannot be, the message goes eagerly
// only, which is always correct, and is counted.
void AmEngine::register_send(Request& r, const SendParams& p) {
  device::Registration reg;
  bool ok = false;
  if (inside(p.memory, p.payload.data(), p.payload.size())) {
    reg = device::Registration{p.memory->remote_key(), p.memory->local_keys(), kBorrowed};
    ok = true;
  }
  if (!ok && registrar_ != nullptr) {
    ok = registrar_->acquire(p.payload.data(), p.payload.size(), reg).ok();
    r.owns_registration = ok;
  }
  if (!ok) {
    ++stats_.rndv_unregistered;
    return;
  }
  r.rndv = true;
  r.registration = reg;
  r.verdict_pending = true;
  r.flags |= wire::kRendezvous;
  ++stats_.rndv_sent;
}

Status AmEngine::rdma(device::DescriptorKind kind, const RdmaParams& p, std::byte* local,
                      const LocalKeys& local_keys) {
  const char* unreachable = kind == device::DescriptorKind::put
                                ? "put: no backend reaches the endpoint"
                                : "get: no backend reaches the endpoint";
  Peer* peer = peer_for(p.dest);
  if (peer == nullptr) return {StatusCode::invalid_argument, "rdma: endpoint is out of range"};
  if (lane_for(*peer) == nullptr) return {StatusCode::unreachable, unreachable};
  if (!peer->failure.ok())
    return {StatusCode::peer_failed, kind == device::DescriptorKind::put ? "put: the endpoint's peer failed"
                                                                         : "get: the endpoint's peer failed"};
  const device::RdmaDescriptor x{.local = local, .length = p.bytes, .local_keys = local_keys,
                                 .remote_address = p.remote.address + p.remote_offset, .remote = p.remote};
  ++(kind == device::DescriptorKind::put ? stats_.puts : stats_.gets);
  if (peer->state->head == nullptr) {
    // Nothing queued before it: straight into the FIFO, no request; the
    // user's callback (if any) is listed directly, as a short send's is.
    if (device::Descriptor* d = peer->lane->fifo().try_reserve()) {
      d->kind = kind;
      d->rdma = x;
      peer->lane->fifo().commit(p.local_done);
      if (kind == device::DescriptorKind::get) peer->state->last_get = peer->lane->fifo().injected();
      ring(*peer->lane);
      return Status::success();
    }
  }
  Request* r = acquire();
  if (r == nullptr) {
    --(kind == device::DescriptorKind::put ? stats_.puts : stats_.gets);
    return {StatusCode::no_resource, "rdma: every request (AMI_MAX_REQUESTS) is in use"};
  }
  r->kind = Request::Kind::rdma;
  r->rdma_kind = kind;
  r->rdma = x;
  r->local_done = p.local_done;
  r->local_pending = true;
  enqueue(*peer, *r);
  return Status::success();
}

Status AmEngine::post(Callback work) {
  if (!work) return {StatusCode::invalid_argument, "post: work has no function"};
  posted_.push_back(work);
  return Status::success();
}

Request* AmEngine::acquire() {
  Request* r = pool_.acquire();
  if (r != nullptr) r->engine = this;
  return r;
}

void AmEngine::mark_busy(Peer& peer) {
  if (peer.state->busy) return;
  peer.state->busy = true;
  busy_.push_back(&peer);
}

// Appends r to the peer's work queue and starts it at once when it is first.
void AmEngine::enqueue(Peer& peer, Request& r) {
  PeerState& s = *peer.state;
  r.peer = index_of(peer);
  r.next = nullptr;
  const bool first = s.head == nullptr;
  if (first) s.head = &r; else s.tail->next = &r;
  s.tail = &r;
  if (first) service(peer);
  if (s.head != nullptr) {
    ++stats_.queued;
    mark_busy(peer);
  }
}

// Injects as many eager packets of r as the FIFO takes; true when all are
// out (or a stop ended the eager part).
bool AmEngine::inject_send(Peer& peer, Request& r) {
  device::Lane& lane = *peer.lane;
  std::uint32_t burst = 0;
  while (!r.started || r.sent < r.eager_end) {
    if (r.rndv && !r.stopped) {
      if (++burst > kEagerBurst) return false;
      if (r.paced && eager_in_flight(lane, r) >= kEagerWindow) {
        ring(lane);  // a device that moves packets at once passes them here
        if (eager_in_flight(lane, r) >= kEagerWindow) return false;  // (service() comes back while r is queued)
      }
      // Where packets leave at once, the peer's backlog paces instead.
      if (r.paced && r.started && lane.backlogged()) return false;
    }
    device::Descriptor* d = lane.fifo().try_reserve();
    if (d == nullptr) return false;
    const std::size_t hdr = r.started ? 0 : r.header_len;
    const std::size_t info = (!r.started && r.rndv) ? wire::RendezvousInfo::kBytes : 0;
    const std::uint64_t overhead = kWireHeader + hdr + info;
    std::uint64_t room = lane.max_packet() - overhead;
    // Expected to be stopped: even a whole first packet leaves more than the
    // crossover to come. Only such a message grows its packets; the others
    // go in whole ones from the first. (Decided once, at the first packet.)
    if (!r.started)
      r.paced = r.rndv && r.total - std::min(room, r.total) >
                              shape_.options.rndv_crossover.value_or(lane.rdma_crossover());
    if (r.paced) {
      // The packet, headers included, is the growing size: a power of two,
      // so it fills whole MTU frames.
      const std::uint64_t first = std::max<std::uint64_t>(kFirstEager, lane.max_packet() / 4);
      room = std::min(room, (first << std::min<std::uint32_t>(r.packets, 40)) - overhead);
    }
    const auto n = static_cast<std::uint32_t>(std::min<std::uint64_t>(room, r.total - r.sent));
    if (r.started) {
      build_packet(*d, wire::make_header(wire::PacketType::am_more, r.dispatch, r.id(), r.total, r.sent, n, 0, 0),
                   {}, {r.payload + r.sent, n}, r.rndv ? &r.registration.local_keys : nullptr);
    } else {
      // Alone among this receiver's answers owed to us, it asks to be
      // answered when done: a batch would have nothing to join it, and a
      // sender waiting on it (a collective's step, a ping-pong of long
      // messages) would wait for the receiver's lull (docs/DESIGN.md, method 4).
      const bool alone = peer.state->unanswered.head == nullptr;
      const std::uint64_t seq = (r.flags & wire::kWantsAnswer) ? expect_answer(peer, r) : 0;
      const std::uint16_t flags = r.flags | (seq != 0 && alone ? wire::kAnswerSoon : 0);
      const wire::PacketHeader h = wire::make_header(wire::PacketType::am_first, r.dispatch, r.id(), r.total,
                                                     seq, n, static_cast<std::uint16_t>(hdr), flags);
      std::size_t k = wire::encode(h, {r.header.data(), hdr}, d->packet.inline_data);
      if (info != 0) {
        wire::RendezvousInfo{r.registration.key, reinterpret_cast<std::uintptr_t>(r.payload)}.encode(
            d->packet.inline_data + k, peer.state->device->key_id());
        k += info;
      }
      finish_packet(*d, k, {r.payload, n}, r.rndv ? &r.registration.local_keys : nullptr);
      r.eager_mark = lane.fifo().injected();
    }
    r.started = true;
    r.sent += n;
    ++r.packets;
    stats_.bytes_sent += n;
    ++stats_.packets_sent;
    const bool last = r.sent == r.total;
    // A paced packet asks for its completion (a callback that does
    // nothing), so a device that reports completions only when someone
    // waits for one (verbs: selective signalling) reports it.
    d->packet.await_delivery = r.paced;
    lane.fifo().commit(last ? Callback{&AmEngine::on_send_local, &r}
                            : r.paced ? Callback{&AmEngine::on_eager_paced, nullptr} : Callback{});
  }
  return true;
}

std::uint64_t AmEngine::eager_in_flight(device::Lane& lane, const Request& r) {
  return lane.fifo().injected() - std::max(lane.fifo().counter().snapshot(), r.eager_mark);
}

bool AmEngine::inject_rdma(Peer& peer, Request& r) {
  device::Descriptor* d = peer.lane->fifo().try_reserve();
  if (d == nullptr) return false;
  d->kind = r.rdma_kind;
  d->rdma = r.rdma;
  peer.lane->fifo().commit(Callback{&AmEngine::on_send_local, &r});
  if (r.rdma_kind == device::DescriptorKind::get) peer.state->last_get = peer.lane->fifo().injected();
  return true;
}

// One control item: a packet, a GET, or a piece of the PUT that goes
// before a fin. The slot of a cts or fin carries the sender's local
// completion when the stop cut its eager packets short (the last of them
// then had none).
bool AmEngine::inject_control(Peer& peer, Control& c) {
  device::Descriptor* d = peer.lane->fifo().try_reserve();
  if (d == nullptr) return false;
  std::visit(Overloaded{
                 [&](const AckItem& a) {
                   inject_packet(peer, *d, header_of(a), nullptr);
                   ++stats_.acks_sent;
                 },
                 [&](const GetItem& g) { inject_get(peer, *d, g); },
                 [&](const StopItem& s) {
                   const bool put = s.mode == wire::StopMode::stop_put;
                   inject_packet(peer, *d, header_of(s), nullptr, put ? &s.info : nullptr);
                 },
                 [&](const CtsItem& x) { inject_packet(peer, *d, header_of(x), x.owner); },
                 [&](FinItem& f) {
                   if (f.put == FinItem::Put::pending)
                     inject_put(peer, *d, f);
                   else
                     inject_packet(peer, *d, header_of(f), f.owner);
                 },
                 [&](const KeepaliveItem& k) { inject_packet(peer, *d, header_of(k), nullptr); },
                 [&](const AtomicReplyItem& a) { inject_packet(peer, *d, header_of(a), nullptr); },
             },
             c);
  return true;
}

// The receiver's GET of [offset, offset + length) of a stopped message.
void AmEngine::inject_get(Peer& peer, device::Descriptor& d, const GetItem& g) {
  Inbound& in = *g.in;
  d.kind = device::DescriptorKind::get;
  d.rdma = device::RdmaDescriptor{.local = in.buffer + g.offset, .length = g.length,
                                  .local_keys = in.registration.local_keys,
                                  .remote_address = in.source.address + g.offset,
                                  .remote = in.source.key};
  peer.lane->fifo().commit(Callback{&AmEngine::on_get_done, &in});
  peer.state->last_get = peer.lane->fifo().injected();
  stats_.rndv_get_bytes += g.length;
  ++stats_.gets;
}

// A piece of the PUT of a stop_put, [E, end) of the send buffer into the
// receive buffer (end: total, or where the receiver's GET begins), in
// pieces the lane carries.
void AmEngine::inject_put(Peer& peer, device::Descriptor& d, FinItem& f) {
  Request* r = f.owner;  // (a PUT is left only when the stop cut the message short)
  const std::uint64_t n = std::min(f.end - f.cursor, peer.lane->max_rdma());
  d.kind = device::DescriptorKind::put;
  d.rdma = device::RdmaDescriptor{.local = const_cast<std::byte*>(r->payload) + f.cursor,
                                  .length = n,
                                  .local_keys = r->registration.local_keys,
                                  .remote_address = f.target.address + f.cursor,
                                  .remote = f.target.key};
  peer.lane->fifo().commit(Callback{&AmEngine::on_put_done, r});
  ++r->puts_pending;
  stats_.rndv_put_bytes += n;
  f.cursor += n;
  // The fin itself goes once every piece has completed.
  if (f.cursor == f.end) f.put = FinItem::Put::in_flight;
}

// A control packet: its header, and a stop_put's receive buffer after it.
void AmEngine::inject_packet(Peer& peer, device::Descriptor& d, const wire::PacketHeader& h, Request* owner,
                             const wire::RendezvousInfo* info) {
  if (info == nullptr) {
    build_packet(d, h, {}, {});
  } else {
    const std::size_t k = wire::encode(h, {}, d.packet.inline_data);
    info->encode(d.packet.inline_data + k, peer.state->device->key_id());
    finish_packet(d, k + wire::RendezvousInfo::kBytes, {});
  }
  peer.lane->fifo().commit(owner != nullptr ? Callback{&AmEngine::on_send_local, owner} : Callback{});
  ++stats_.packets_sent;
}

// The fixed header's fields as each packet type uses them (see
// wire::PacketType).
wire::PacketHeader AmEngine::header_of(const AckItem& a) {
  return wire::make_header(wire::PacketType::ack, 0, 0, a.count, a.first, 0, 0, a.flags);
}

wire::PacketHeader AmEngine::header_of(const StopItem& s) {
  const bool put = s.mode == wire::StopMode::stop_put;
  return wire::make_header(wire::PacketType::stop, static_cast<std::uint16_t>(s.mode), s.message_id, s.total,
                           s.receiver_id, put ? wire::RendezvousInfo::kBytes : 0, 0, 0);
}

wire::PacketHeader AmEngine::header_of(const CtsItem& c) {
  return wire::make_header(wire::PacketType::cts, 0, c.receiver_id, c.total, c.sent, 0, 0, 0);
}

wire::PacketHeader AmEngine::header_of(const FinItem& f) {
  return wire::make_header(wire::PacketType::fin, 0, f.receiver_id, f.total, f.sent, 0, 0, f.flags);
}

wire::PacketHeader AmEngine::header_of(const KeepaliveItem&) {
  return wire::make_header(wire::PacketType::keepalive, 0, 0, 0, 0, 0, 0, 0);
}

void AmEngine::push_control(Peer& peer, const Control& c) {
  peer.state->controls.push_back(c);
  mark_busy(peer);
}

// Moves the peer's waiting control packets and then its instructions into
// its FIFO, in order; a fin waiting for its PUT holds back what follows.
std::size_t AmEngine::service(Peer& peer) {
  PeerState& s = *peer.state;
  std::size_t work = 0;
  std::size_t sent = 0;
  // The lane is rung for whatever went into its FIFO, a request's first
  // packets too when the rest must wait for slots.
  const std::uint64_t injected = peer.lane->fifo().injected();
  while (sent < s.controls.size()) {
    Control& c = s.controls[sent];
    const FinItem* fin = std::get_if<FinItem>(&c);
    if (fin != nullptr && fin->put == FinItem::Put::in_flight) break;
    if (!inject_control(peer, c)) break;
    ++work;
    if (fin != nullptr && fin->put != FinItem::Put::done) continue;  // more pieces, or their completion
    ++sent;
  }
  s.controls.erase(s.controls.begin(), s.controls.begin() + static_cast<std::ptrdiff_t>(sent));
  if (!s.controls.empty()) {
    if (peer.lane->fifo().injected() != injected) ring(*peer.lane);
    return work;
  }
  while (Request* r = s.head) {
    const bool done = r->kind == Request::Kind::send     ? inject_send(peer, *r)
                      : r->kind == Request::Kind::fence  ? inject_fence(peer, *r)
                      : r->kind == Request::Kind::atomic ? inject_atomic(peer, *r)
                                                         : inject_rdma(peer, *r);
    if (!done) break;
    s.head = r->next;
    if (s.head == nullptr) s.tail = nullptr;
    ++work;
  }
  if (peer.lane->fifo().injected() != injected) ring(*peer.lane);
  return work;
}

void AmEngine::on_send_local(void* cookie, Status s) {
  auto& r = *static_cast<Request*>(cookie);
  r.local_pending = false;
  if (!s.ok()) {
    if (r.failure.ok()) r.failure = s;
    r.verdict_pending = false;  // the lane failed: no ack will come
  }
  r.engine->settle(r);
}

// Runs r's callbacks once what they wait for has happened: local_done when
// the device is done with the buffer and (for a message the receiver could
// stop) the receiver has acked; r is released when remote_done has run too.
void AmEngine::settle(Request& r) {
  if (r.local_pending || r.verdict_pending) return;
  if (!r.local_fired) {
    r.local_fired = true;
    if (r.owns_registration) registrar_->release(r.registration);
    r.owns_registration = false;
    if (r.local_done) r.local_done(r.failure);
  }
  if (!r.failure.ok() && r.remote_pending) {
    r.remote_pending = false;  // the message may never have arrived (or its peer failed)
    r.remote_done(r.failure);
  }
  if (r.remote_pending) return;
  if (r.awaiting_ack) forget_answer(r);  // failed, or a stop_put's fin settled it
  pool_.release(r);
}

// The peer answers in ack sequence order per lane, so r joins the tail.
std::uint64_t AmEngine::expect_answer(Peer& peer, Request& r) {
  Unanswered& u = peer.state->unanswered;
  r.ack_seq = u.next_seq++;
  r.awaiting_ack = true;
  r.ack_next = nullptr;
  r.ack_prev = u.tail;
  if (u.tail != nullptr) u.tail->ack_next = &r; else u.head = &r;
  u.tail = &r;
  return r.ack_seq;
}

void AmEngine::forget_answer(Request& r) {
  Unanswered& u = list_of(r);
  if (r.ack_prev != nullptr) r.ack_prev->ack_next = r.ack_next; else u.head = r.ack_next;
  if (r.ack_next != nullptr) r.ack_next->ack_prev = r.ack_prev; else u.tail = r.ack_prev;
  r.ack_prev = r.ack_next = nullptr;
  r.awaiting_ack = false;
}

AckPeerStats AmEngine::ack_stats(Endpoint dest) const {
  if (dest.task >= shape_.tasks || dest.context >= shape_.contexts) return {};
  const Peer& peer = peers_[std::size_t{dest.task} * shape_.contexts + dest.context];
  if (peer.state == nullptr) return {};  // never talked to: nothing acked
  const AckDispatcher::PeerStats& s = peer.state->acks.stats();
  return AckPeerStats{s.messages_acked, s.acks_sent};
}

}  // namespace ami::protocol
