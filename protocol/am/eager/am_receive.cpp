// protocol/am/eager/am_receive.cpp — the receive side: validating arrivals,
// dispatching, eager reassembly, acks; and the advance loop.
#include <cstring>

#include "ami/device/coarse_clock.hpp"
#include "am_engine.hpp"

namespace ami::protocol {

namespace {
// Reasons beyond the decoder's, in ContextStats::malformed_by_reason.
constexpr std::size_t kOutOfSequence = 7;
constexpr std::size_t kBadOrigin = 8;
constexpr std::size_t kBadRendezvous = 9;
}  // namespace

std::size_t AmEngine::advance() {
  // The idle path (a poll with nothing in) is what a waiting process runs
  // between arrivals, and half of it lies on average between an arrival and
  // its handler: what is rarely there is checked once, done out of line.
  std::size_t work = 0;
  if (!posted_.empty() || !accepted_.empty() || !ready_.empty()) work += run_deferred();
  // (by index, here and below: a handler's send may make a lane, and that
  // may change polled_)
  std::size_t polled = 0;
  for (std::size_t i = 0; i < polled_.size(); ++i) polled += polled_[i]->progress(*this, 64);
  work += polled;
  for (std::size_t i = 0; i < lanes_.size(); ++i) work += lanes_[i]->fifo().complete();
  if (acks_.advance(stats_.packets_received, [this](std::uint32_t p, const AckDispatcher::Range& r) {
        emit_ack(p, r);
      }) &&
      credit_owed_) {
    // A lull: reception credit goes back too, once: only a device's
    // progress() takes credit.
    (void)return_credit();
  }
  if (acks_.unacked() != 0) ++work;  // answers still owed: not idle yet
  if ((++advances_ & 63) == 0) maybe_keepalive(device::coarse_now_ns());
  if (!busy_.empty()) work += service_busy();
  if (!nic_waiting_.empty()) work += post_nic_waiting();
  if (rung_) flush_rung();
  return work;
}

std::size_t AmEngine::return_credit() {
  credit_owed_ = false;
  std::size_t returned = 0;
  for (std::size_t i = 0; i < polled_.size(); ++i) returned += polled_[i]->return_credit();
  if (returned != 0) ++stats_.credit_returns;
  return returned;
}

void AmEngine::flush_rung() {
  rung_ = false;
  for (std::size_t i = 0; i < polled_.size(); ++i) polled_[i]->flush();
}

std::size_t AmEngine::prepare_sleep() {
  std::size_t work = 0;
  if (acks_.unacked() != 0) {
    work += acks_.unacked();
    acks_.flush_all([this](std::uint32_t p, const AckDispatcher::Range& r) { emit_ack(p, r); });
  }
  work += return_credit();
  // The precise clock is read only when a round may be due by the coarse
  // one and the most it lags: where the clock source is not readable from
  // user space (a guest's HPET), reading it is a system call.
  if (device::coarse_now_ns() + kCoarseLagNs >= next_keepalive_ns_) {
    const std::uint64_t probes = stats_.keepalives_sent;
    maybe_keepalive(device::precise_now_ns());
    work += stats_.keepalives_sent - probes;
  }
  if (!busy_.empty()) work += service_busy();
  if (rung_) flush_rung();
  return work;
}

bool AmEngine::has_pending_work() {
  if (!posted_.empty() || !accepted_.empty() || !ready_.empty() || !busy_.empty() || acks_.unacked() != 0 ||
      !nic_waiting_.empty())
    return true;
  for (device::Lane* lane : lanes_)
    if (lane->fifo().completions_due()) return true;
  return false;
}

std::int64_t AmEngine::next_deadline_ns() const {
  if (shape_.options.keepalive_ms == 0 || reached_.empty()) return 0;
  return next_keepalive_ns_;
}

std::size_t AmEngine::run_deferred() {
  std::size_t work = accepted_.size() + ready_.size() + posted_.size();
  if (!posted_.empty()) {
    running_.swap(posted_);  // work it posts runs in the next advance()
    for (const Callback& c : running_) c(Status::success());
    running_.clear();
  }
  for (std::size_t i = 0; i < accepted_.size(); ++i) check_inbound(*accepted_[i]);
  accepted_.clear();
  while (!ready_.empty()) {  // (settling one may make another ready)
    Request* r = ready_.back();
    ready_.pop_back();
    settle(*r);
  }
  return work;
}

std::size_t AmEngine::service_busy() {
  std::size_t work = 0;
  for (std::size_t i = 0; i < busy_.size(); ++i) work += service(*busy_[i]);
  std::size_t kept = 0;
  for (Peer* p : busy_) {
    PeerState& s = *p->state;
    if (s.head != nullptr || !s.controls.empty())
      busy_[kept++] = p;
    else
      s.busy = false;
  }
  busy_.resize(kept);
  return work;
}

void AmEngine::count_malformed(std::size_t reason) {
  ++stats_.malformed_packets;
  ++stats_.malformed_by_reason[reason];
}

// Every arrival took a reception resource (a ring cell, a receive buffer)
// that its device holds back for return_credit(); only arrivals do, so a
// poll that found completions of this side's own work (a GET's, an
// atomic's) owes none. (What a device drops without handing it up, it
// returns with its next batch or the next lull after an arrival.)
void AmEngine::on_packet(Endpoint origin, std::span<const std::byte> bytes) {
  credit_owed_ = true;
  wire::PacketView v;
  if (wire::DecodeError e = wire::decode(bytes, v); e != wire::DecodeError::none) {
    count_malformed(static_cast<std::size_t>(e) - 1);
    return;
  }
  handle(origin, v);
}

// (Always inline: on every small message's path.)
[[gnu::always_inline]] inline bool AmEngine::deliver_whole(Peer& peer, std::uint16_t dispatch,
                                                          std::span<const std::byte> user_header,
                                                          std::span<const std::byte> payload, std::uint64_t seq,
                                                          bool wants_answer, bool soon) {
  const Dispatch d = handler_for(dispatch);
  if (d.fn == nullptr) {
    ++stats_.unknown_dispatch;
    stats_.discarded_bytes += payload.size();
    if (seq != 0) ack(peer, seq, wire::kDispatchMissing, wants_answer, soon);
    return false;
  }
  d.fn(d.cookie, Incoming{peer.state->endpoint, dispatch, user_header, payload, payload.size(), false}, nullptr);
  if (seq != 0) ack(peer, seq, 0, wants_answer, soon);
  return true;
}

// A compact packet is a whole am_short that wants no answer: straight to
// its handler (what handle() and on_first() would do for it, without the
// general packet's fields).
void AmEngine::on_compact_packet(Endpoint origin, std::uint32_t immediate, std::span<const std::byte> rest) {
  credit_owed_ = true;
  wire::CompactView m;
  if (wire::DecodeError e = wire::decode_compact(immediate, rest, m); e != wire::DecodeError::none) {
    count_malformed(static_cast<std::size_t>(e) - 1);
    return;
  }
  Peer* peer = admit(origin);
  if (peer == nullptr) return;
  begin_message(*peer);
  ++stats_.messages_received;
  stats_.bytes_received += m.payload.size();
  deliver_whole(*peer, m.dispatch, m.user_header, m.payload, 0, false, false);
}

AmEngine::Peer* AmEngine::admit_other(Endpoint origin) {
  Peer* peer = peer_for(origin);
  if (peer == nullptr) {  // names no endpoint of the job
    count_malformed(kBadOrigin);
    return nullptr;
  }
  if (lane_for(*peer) == nullptr) {
    from_unknown_peer(*peer);
    return nullptr;
  }
  ++peer->state->heard;  // (a lane: its state is there)
  if (!peer->failure.ok()) {
    ++stats_.packets_from_failed;  // sent before it failed; nobody waits for them now
    return nullptr;
  }
  ++stats_.packets_received;
  return peer;
}

void AmEngine::on_unknown_origin(Endpoint origin) {
  Peer* peer = peer_for(origin);
  if (peer == nullptr)
    count_malformed(kBadOrigin);
  else
    from_unknown_peer(*peer);
}

// Whatever it asked for cannot be answered, and there is no path to tell
// it so. When no backend here reaches it at all, it fails here, once: what
// this context would do with it (a collective waiting for its messages,
// which are dropped) ends with peer_failed, and the error handler says so,
// instead of the packets vanishing while everyone waits.
void AmEngine::from_unknown_peer(Peer& peer) {
  static constexpr Status kUnanswerable{StatusCode::peer_failed,
                                        "the peer sends to this context, but no backend here reaches it"};
  ++stats_.packets_from_unknown_peers;
  if (peer.failure.ok() && lane_for(peer) == nullptr) fail_peer(peer, kUnanswerable);
}

void AmEngine::handle(Endpoint origin, const wire::PacketView& v) {
  Peer* peer = admit(origin);
  if (peer == nullptr) return;
  switch (v.type()) {
    case wire::PacketType::am_first:
    case wire::PacketType::am_short: on_first(*peer, v); break;
    case wire::PacketType::am_more: on_more(*peer, v); break;
    case wire::PacketType::ack: on_ack(*peer, v); break;
    case wire::PacketType::stop: on_stop(*peer, v); break;
    case wire::PacketType::cts:
    case wire::PacketType::fin: on_end(*peer, v); break;
    case wire::PacketType::fence: on_fence(*peer, v); break;
    case wire::PacketType::keepalive: ++stats_.keepalives_received; break;
    case wire::PacketType::atomic: on_atomic(*peer, v); break;
    case wire::PacketType::atomic_reply: on_atomic_reply(*peer, v); break;
  }
}

void AmEngine::end_previous(Peer& peer) {
  Reassembly& rx = peer.state->rx;
  if (rx.active && rx.stopped == nullptr) {
    // A lane delivers a message's eager packets back to back; a new message
    // while one is incomplete means the origin broke that rule.
    count_malformed(kOutOfSequence);
    complete_rx(peer, {StatusCode::malformed_packet, "message cut short by a new one from its origin"});
  }
  // A stopped message before this one has no eager packets left. (An idle
  // record stays as it is: nothing reads it until a message starts in it.)
  if (rx.active || rx.stopped != nullptr) rx = Reassembly{};
}

void AmEngine::on_first(Peer& peer, const wire::PacketView& v) {
  begin_message(peer);
  const bool rndv = (v.header.flags & wire::kRendezvous) != 0;
  if (!rndv && v.payload.size() == v.header.total_len) {  // whole, names no buffer: the short path
    ++stats_.messages_received;
    stats_.bytes_received += v.payload.size();
    deliver_whole(peer, v.header.dispatch, v.user_header, v.payload, v.header.offset,
                  (v.header.flags & wire::kWantsRemoteDone) != 0, (v.header.flags & wire::kAnswerSoon) != 0);
    return;
  }
  on_first_long(peer, v, rndv);
}

// A first packet that names its buffer or has more to come. (Apart from
// on_first(): its remote key is not made, nor zeroed, on the short path.)
void AmEngine::on_first_long(Peer& peer, const wire::PacketView& v, bool rndv) {
  Reassembly& rx = peer.state->rx;
  wire::RendezvousInfo named;
  if (rndv && !wire::RendezvousInfo::decode(v.rendezvous, v.header.total_len, named)) {
    count_malformed(kBadRendezvous);
    return;  // (not answered: what its sender could do with the answer is unknown)
  }
  ++stats_.messages_received;
  stats_.bytes_received += v.payload.size();
  const bool wants_answer = (v.header.flags & wire::kWantsRemoteDone) != 0;
  const bool soon = (v.header.flags & wire::kAnswerSoon) != 0;
  const std::uint64_t seq = v.header.offset;  // ack sequence number (0: no answer wanted)
  if (v.payload.size() == v.header.total_len) {  // whole
    if (deliver_whole(peer, v.header.dispatch, v.user_header, v.payload, seq, wants_answer, soon) && rndv)
      ++stats_.rndv_eager_complete;
    return;
  }
  const Dispatch d = handler_for(v.header.dispatch);
  if (d.fn == nullptr) {
    ++stats_.unknown_dispatch;
    stats_.discarded_bytes += v.payload.size();
    // Dropped as it comes (or stopped: nobody wants it); acked at the end.
    rx = Reassembly{.active = true, .message_id = v.header.message_id, .ack_seq = seq,
                    .total = v.header.total_len, .received = v.payload.size(), .wants_remote_done = wants_answer,
                    .answer_soon = soon, .answer_flags = wire::kDispatchMissing, .rndv = rndv, .source = named};
    if (rndv) consider_stop(peer);
    return;
  }
  Receive recv;
  // A message can wait for its buffer when it can be stopped and a record
  // is free for it (stop() below then cannot fail).
  const bool can_defer = rndv && !inbound_.exhausted();
  d.fn(d.cookie,
       Incoming{peer.state->endpoint, v.header.dispatch, v.user_header, {},
                static_cast<std::size_t>(v.header.total_len), can_defer},
       &recv);
  Deferred* defer = can_defer && recv.buffer == nullptr ? recv.defer : nullptr;
  rx = Reassembly{.active = true, .message_id = v.header.message_id, .ack_seq = seq,
                  .total = v.header.total_len, .received = v.payload.size(), .buffer = static_cast<std::byte*>(recv.buffer),
                  .done = recv.done, .wants_remote_done = wants_answer, .answer_soon = soon, .answer_flags = 0,
                  .rndv = rndv, .zero_copy = recv.zero_copy, .memory = recv.memory, .defer = defer,
                  .piece = recv.buffer == nullptr && defer == nullptr ? recv.piece : nullptr,
                  .piece_cookie = recv.piece_cookie,
                  .source = named};
  if (rx.piece != nullptr)
    rx.piece(rx.piece_cookie, 0, v.payload);
  else if (rx.buffer != nullptr)
    std::memcpy(rx.buffer, v.payload.data(), v.payload.size());
  else
    stats_.discarded_bytes += v.payload.size();
  if (rndv) consider_stop(peer);
}

void AmEngine::on_more(Peer& peer, const wire::PacketView& v) {
  Reassembly& rx = peer.state->rx;
  if (!rx.active || v.header.message_id != rx.message_id || v.header.offset != rx.received ||
      v.header.total_len != rx.total) {
    count_malformed(kOutOfSequence);
    return;
  }
  rx.received += v.payload.size();
  stats_.bytes_received += v.payload.size();
  if (Inbound* in = rx.stopped) {
    // In flight when the stop went: discard_get drops it (the GET brings
    // everything); split_get and stop_put keep it, their GET or PUT leaves
    // it out.
    stats_.rndv_late_bytes += v.payload.size();
    if (in->mode != wire::StopMode::discard_get && in->buffer != nullptr && !in->in_place) {
      std::memcpy(in->buffer + v.header.offset, v.payload.data(), v.payload.size());
      if (rx.received == rx.total) {
        // Every byte came eagerly after all: done need not wait for the
        // sender's cts or fin (only for a GET still writing the same bytes).
        in->eager_all = true;
        check_inbound(*in);
      }
    } else {
      stats_.discarded_bytes += v.payload.size();
    }
    return;
  }
  if (rx.piece != nullptr)
    rx.piece(rx.piece_cookie, v.header.offset, v.payload);
  else if (rx.buffer != nullptr)
    std::memcpy(rx.buffer + v.header.offset, v.payload.data(), v.payload.size());
  else
    stats_.discarded_bytes += v.payload.size();
  if (rx.received == rx.total) {
    if (rx.rndv) ++stats_.rndv_eager_complete;
    complete_rx(peer, Status::success());
  } else if (rx.rndv && !rx.stop_refused && rndv::may_stop_later(rx.total - rx.received)) {
    consider_stop(peer);
  }
}

// The eager stream ended (every byte came, or it was cut short): done runs,
// and the sender gets its ack when it waits for one.
void AmEngine::complete_rx(Peer& peer, Status s) {
  Reassembly rx = peer.state->rx;
  peer.state->rx = Reassembly{};
  if (rx.done) rx.done(s);
  std::uint16_t flags = rx.answer_flags;
  if (!s.ok()) flags |= wire::kFailed;
  if (rx.ack_seq != 0) ack(peer, rx.ack_seq, flags, rx.wants_remote_done, rx.answer_soon);
}

void AmEngine::ack(Peer& peer, std::uint64_t ack_seq, std::uint16_t flags, bool remote_done, bool urgent) {
  if (remote_done) ++stats_.remote_done_sent;
  acks_.complete(
      peer.state->acks, ack_seq, flags, [this](std::uint32_t p, const AckDispatcher::Range& r) { emit_ack(p, r); },
      urgent);
}

void AmEngine::emit_ack(std::uint32_t p, const AckDispatcher::Range& range) {
  Peer& peer = peers_[p];
  if (!peer.failure.ok()) return;  // nobody to tell
  if (peer.state->controls.size() >= 4 * std::size_t{shape_.options.max_requests}) {
    // More answers owed than the origin can have requests: not an honest peer.
    count_malformed(kOutOfSequence);
    return;
  }
  stats_.messages_acked += range.count;
  push_control(peer, AckItem{.flags = range.flags, .first = range.first, .count = range.count});
}

// Sender: the peer answers the messages [offset, offset + total_len) of its
// ack sequence. They wait in the peer's list in sequence order, usually at
// its head; messages answered by other means (a stop_put's fin) leave gaps.
void AmEngine::on_ack(Peer& peer, const wire::PacketView& v) {
  const std::uint64_t first = v.header.offset;
  const std::uint64_t count = v.header.total_len;
  Request* r = peer.state->unanswered.head;
  while (r != nullptr && r->ack_seq < first) r = r->ack_next;
  ++stats_.acks_received;
  for (std::uint64_t seq = first; seq - first < count; ++seq) {
    if (r == nullptr || r->ack_seq != seq) {
      // Answers a message that is not waiting: a duplicate or a forgery.
      count_malformed(kOutOfSequence);
      return;
    }
    Request* next = r->ack_next;
    ++stats_.messages_ack_received;
    answer(*r, v.header.flags);
    r = next;
  }
}

void AmEngine::answer(Request& r, std::uint16_t flags) {
  forget_answer(r);
  Status s = Status::success();
  if (flags & wire::kDispatchMissing)
    s = {StatusCode::unknown_dispatch, "send: the target has no handler for the dispatch id"};
  else if (flags & wire::kFailed)
    s = {StatusCode::remote_access, "send: the target could not place every byte of the message"};
  r.verdict_pending = false;
  if (r.remote_pending) {
    r.remote_pending = false;
    ++stats_.remote_done_received;
    r.remote_done(s);
  }
  settle(r);
}

}  // namespace ami::protocol
