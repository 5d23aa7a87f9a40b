// protocol/am/eager/am_rndv.cpp — the rendezvous: the receiver's stop and its
// GETs, the sender's answer (cts, or PUT and fin), and the records of
// stopped messages. See am_engine.hpp for the sequence.
#include <algorithm>

#include "am_engine.hpp"

namespace ami::protocol {

namespace {
constexpr std::size_t kBadRendezvous = 9;  // ContextStats::malformed_by_reason
}  // namespace

// Runs the stop policy for the message streaming from peer.
void AmEngine::consider_stop(Peer& peer) {
  const Reassembly& rx = peer.state->rx;
  if (rx.piece != nullptr) return;  // taken in pieces: there is no buffer to GET or PUT into
  const rndv::Inputs in{.total = rx.total,
                        .received = rx.received,
                        .has_buffer = rx.buffer != nullptr,
                        .deferred = rx.defer != nullptr,
                        .zero_copy = rx.zero_copy,
                        .reception_load = peer.state->device->reception_load(),
                        .low_water = shape_.options.rndv_low_water,
                        .crossover = shape_.options.rndv_crossover.value_or(peer.lane->rdma_crossover()),
                        .configured = shape_.options.rndv_mode,
                        .split_min = rndv::kSplitMin,
                        .get_beats_put = peer.lane->get_beats_put(),
                        .oversubscribed = peer.lane->oversubscribed(),
                        .get_beats_eager = peer.lane->get_beats_eager()};
  ++stats_.rndv_decisions;
  stats_.reception_load_max = std::max(stats_.reception_load_max, in.reception_load);
  const rndv::Decision d = rndv::decide(in);
  // Refused (no record free, the buffer cannot be registered): the message
  // goes on eagerly, and is not asked again.
  if (d.stop && !stop(peer, d)) peer.state->rx.stop_refused = true;
  // The stop goes out now, not after the rest of this poll's arrivals: every
  // eager packet its sender injects meanwhile is one the rendezvous redoes.
  if (d.stop) service(peer);
}

// Stops the streaming message: a record for it, the stop packet, and the
// GETs its mode starts with. False (the message goes on eagerly) when no
// record is free or the receive buffer cannot be registered.
bool AmEngine::stop(Peer& peer, const rndv::Decision& d) {
  Reassembly& rx = peer.state->rx;
  Inbound* record = inbound_.acquire();
  if (record == nullptr) return false;
  Inbound& in = *record;
  in.engine = this;
  in.peer = index_of(peer);
  in.message_id = rx.message_id;
  in.ack_seq = rx.ack_seq;
  in.total = rx.total;
  in.buffer = rx.buffer;
  in.done = rx.done;
  in.wants_remote_done = rx.wants_remote_done;
  in.answer_soon = rx.answer_soon;
  in.answer_flags = rx.answer_flags;
  in.mode = d.mode;
  in.source = rx.source;
  if (in.buffer != nullptr && !take_registration(in, rx.memory).ok()) {
    inbound_.release(in);
    return false;
  }
  rx.stopped = &in;
  if (rx.defer != nullptr) {
    in.waiting = true;
    *rx.defer = Deferred{in.id(), peer.state->endpoint, static_cast<std::size_t>(in.total)};
  }
  ++stats_.rndv_stops_by_reason[static_cast<std::size_t>(d.reason)];
  ++stats_.rndv_stops_by_mode[static_cast<std::size_t>(d.path)];

  // (A stop_put's stop says where the sender's PUT ends in total_len: the
  // receiver GETs the rest itself.)
  StopItem c{.mode = d.mode, .message_id = rx.message_id, .receiver_id = in.id(), .total = rx.total};
  if (d.mode == wire::StopMode::stop_put) {
    c.info = wire::RendezvousInfo{in.registration.key, reinterpret_cast<std::uintptr_t>(in.buffer)};
    c.total = d.put_end;
  }
  push_control(peer, c);
  if (in.buffer != nullptr) {  // (a deferred message has none yet)
    if (d.mode == wire::StopMode::discard_get) {
      get(peer, in, 0, in.total);
    } else if (d.mode == wire::StopMode::stop_put && d.put_end < in.total) {
      in.split = true;
      in.bottom = d.put_end;
      get(peer, in, d.put_end, in.total - d.put_end);
    } else if (d.mode == wire::StopMode::split_get) {
      // The bottom half of what is missing, at once; the eager packets still
      // in flight fill in from the top, and the cts says where they ended.
      std::uint64_t bottom = rx.received + (in.total - rx.received) / 2;
      bottom = std::max(rx.received, bottom & ~std::uint64_t{63});
      in.bottom = bottom;
      if (bottom < in.total) get(peer, in, bottom, in.total - bottom);
    }
  }
  check_inbound(in);
  return true;
}

// Registers in's buffer, or takes memory's registration when it covers it;
// on failure nothing of in changed. The registrar's status says why.
Status AmEngine::take_registration(Inbound& in, const Memory* m) {
  if (inside(m, in.buffer, in.total)) {
    in.registration = device::Registration{m->remote_key(), m->local_keys(), kBorrowed};
    return Status::success();
  }
  if (registrar_ == nullptr)
    return {StatusCode::not_registered, "rendezvous: no Memory covers the buffer and the context registers none"};
  Status s = registrar_->acquire(in.buffer, in.total, in.registration);
  if (s.ok()) in.owns_registration = true;
  return s;
}

// The buffer for a message its handler deferred: GET it all now. Only a
// registration can be missing (no request, record or FIFO slot is taken
// here: the record is the one the deferral took, the GETs go out as control
// work); then nothing changed and the message waits for another accept().
Status AmEngine::accept(std::uint64_t id, std::byte* buffer, Callback done, const Memory* memory) {
  Inbound* in = inbound_.find(id);
  if (in == nullptr || !in->waiting)
    return {StatusCode::invalid_argument, "accept: no deferred message has that id (accepted already?)"};
  if (!peers_[in->peer].failure.ok()) {
    inbound_.release(*in);
    return {StatusCode::peer_failed, "accept: the message's sender failed before it arrived"};
  }
  in->buffer = buffer;
  if (buffer != nullptr) {
    const Status s = take_registration(*in, memory);
    if (!s.ok()) {
      in->buffer = nullptr;
      // no_resource: registrations in use fill the cache (or the region
      // table, or what the NIC may pin); they go as transfers complete.
      if (s == StatusCode::no_resource)
        return {StatusCode::no_resource,
                "accept: every registration the buffer could take is in use (AMI_RCACHE_MAX_ENTRIES, "
                "AMI_RCACHE_MAX_MB); the message stays deferred: advance and retry"};
      return {s.code(), "accept: the buffer cannot be registered; the message stays deferred"};
    }
  }
  in->done = done;
  in->waiting = false;
  if (buffer != nullptr)
    get(peers_[in->peer], *in, 0, in->total);
  else
    accepted_.push_back(in);  // discarded: done runs in the next advance()
  return Status::success();
}

// GETs [offset, offset + bytes) of the message, in pieces the lane carries.
void AmEngine::get(Peer& peer, Inbound& in, std::uint64_t offset, std::uint64_t bytes) {
  const std::uint64_t piece = peer.lane->max_rdma();
  while (bytes != 0) {
    const std::uint64_t n = std::min(bytes, piece);
    ++in.gets_pending;
    push_control(peer, GetItem{.in = &in, .offset = offset, .length = n});
    offset += n;
    bytes -= n;
  }
}

void AmEngine::on_get_done(void* cookie, Status s) {
  auto& in = *static_cast<Inbound*>(cookie);
  --in.gets_pending;
  if (!s.ok() && in.failure.ok()) in.failure = s;
  in.engine->check_inbound(in);
}

// Done runs once every byte is in place, and the sender gets its ack; the
// record goes once the sender's cts or fin has come too.
void AmEngine::check_inbound(Inbound& in) {
  const bool placed = !in.waiting && in.gets_pending == 0 &&
                      (in.end_seen || in.eager_all || in.mode == wire::StopMode::discard_get);
  if (placed && !in.in_place) {
    in.in_place = true;
    if (in.owns_registration) registrar_->release(in.registration);
    in.owns_registration = false;
    if (in.done) in.done(in.failure);
    std::uint16_t flags = in.answer_flags;
    if (!in.failure.ok()) flags |= wire::kFailed;
    // (After a whole stop_put the sender's fin settled it; after one shared
    // with a GET it waits for this ack, as its buffer was read.)
    if (in.mode != wire::StopMode::stop_put || in.split || in.wants_remote_done)
      ack(peers_[in.peer], in.ack_seq, flags, in.wants_remote_done, in.answer_soon);
  }
  if (in.in_place && in.end_seen) {
    Reassembly& rx = peers_[in.peer].state->rx;
    if (rx.stopped == &in) rx = Reassembly{};
    inbound_.release(in);
  }
}

// Sender: the receiver stopped message v.message_id. No more eager packets;
// the answer follows the last one on the lane: a cts with the eager byte
// count, or (stop_put) the PUT of the rest up to the stop's total_len and
// then a fin. A stop_put that leaves the receiver a part to GET (total_len
// below the message's) is answered by the receiver's ack too, as a GET
// stop is: the buffer is not free before.
void AmEngine::on_stop(Peer& peer, const wire::PacketView& v) {
  Request* r = pool_.find(v.header.message_id);
  if (r == nullptr || r->kind != Request::Kind::send || !r->rndv || !r->verdict_pending || r->stopped ||
      r->peer != index_of(peer)) {
    count_malformed(kBadRendezvous);
    return;
  }
  const auto mode = static_cast<wire::StopMode>(v.header.dispatch);
  wire::RendezvousInfo target;
  const std::uint64_t put_end = v.header.total_len;
  if (mode == wire::StopMode::stop_put &&
      (!wire::RendezvousInfo::decode(v.payload, r->total, target) || put_end > r->total)) {
    count_malformed(kBadRendezvous);
    return;
  }
  r->stopped = true;
  r->eager_end = r->sent;  // no more eager packets
  ++stats_.rndv_stopped;
  PeerState& s = *peer.state;
  if (s.head == r) {
    // Cut short while first in the work queue: nothing of it is left to
    // inject, and its answer may complete (and free it) before service()
    // would have come back to it.
    s.head = r->next;
    if (s.head == nullptr) s.tail = nullptr;
  }
  // Cut short, the eager packets' last one carried no callback: the answer
  // carries r's local completion, so r lives until it is sent.
  const bool cut_short = r->sent < r->total;
  Request* owner = cut_short ? r : nullptr;
  if (mode != wire::StopMode::stop_put) {
    push_control(peer, CtsItem{.receiver_id = v.header.offset, .sent = r->sent, .total = r->total, .owner = owner});
  } else {
    push_control(peer, FinItem{.receiver_id = v.header.offset, .sent = r->sent, .total = r->total, .owner = owner,
                               .cursor = r->sent, .end = put_end,
                               .put = r->sent < put_end ? FinItem::Put::pending : FinItem::Put::done,
                               .target = target});
    // Nothing comes back but a remote-done, if asked; or, when the receiver
    // GETs a part, its ack.
    if (put_end == r->total) r->verdict_pending = false;
  }
  settle(*r);
}

// Sender: a piece of a stop_put's PUT completed; after the last, the fin
// may go (saying whether every piece arrived).
void AmEngine::on_put_done(void* cookie, Status s) {
  auto& r = *static_cast<Request*>(cookie);
  AmEngine& e = *r.engine;
  if (!s.ok() && r.failure.ok()) r.failure = s;
  --r.puts_pending;
  Peer& peer = e.peers_[r.peer];
  for (Control& c : peer.state->controls) {
    FinItem* f = std::get_if<FinItem>(&c);
    if (f == nullptr || f->owner != &r) continue;
    if (f->put == FinItem::Put::in_flight && r.puts_pending == 0) {
      f->put = FinItem::Put::done;
      if (!r.failure.ok()) f->flags = wire::kFailed;
    }
    break;
  }
  e.mark_busy(peer);
}

// Receiver: the sender's cts or fin. Every eager packet of the message is
// in; a split_get GETs the middle neither the eager packets nor its first
// GET covered.
void AmEngine::on_end(Peer& peer, const wire::PacketView& v) {
  Inbound* in = inbound_.find(v.header.message_id);
  const bool fin = v.type() == wire::PacketType::fin;
  if (in == nullptr || in->end_seen || &peers_[in->peer] != &peer || v.header.total_len != in->total ||
      fin != (in->mode == wire::StopMode::stop_put) || (!fin && v.header.flags != 0)) {
    count_malformed(kBadRendezvous);
    return;
  }
  in->end_seen = true;
  if (peer.state->rx.stopped == in) peer.state->rx = Reassembly{};  // its eager stream is over
  const std::uint64_t eager = v.header.offset;
  if (fin && (v.header.flags & wire::kFailed) && in->failure.ok())
    in->failure = {StatusCode::remote_access, "receive: the sender's PUT of the message failed"};
  if (in->mode == wire::StopMode::split_get && in->buffer != nullptr && eager < in->bottom)
    get(peer, *in, eager, in->bottom - eager);
  check_inbound(*in);
}

}  // namespace ami::protocol
