// protocol/eager/am_receive.cpp — the receive side: validating arrivals,
// dispatching, reassembly, remote-done answers; and the advance loop.
#include <cstring>

#include "protocol/eager/am_engine.hpp"

namespace ami::protocol {

namespace {
// Reasons beyond the decoder's, in ContextStats::malformed_by_reason.
constexpr std::size_t kOutOfSequence = 7;
constexpr std::size_t kBadOrigin = 8;
}  // namespace

std::size_t AmEngine::advance() {
  std::size_t work = 0;
  for (device::Device* d : devices_) work += d->progress(*this, 64);
  for (std::size_t i = 0; i < lanes_.size(); ++i) work += lanes_[i]->fifo().complete();
  for (std::size_t i = 0; i < busy_.size(); ++i) work += service(*busy_[i]);
  std::size_t kept = 0;
  for (Peer* p : busy_) {
    if (p->head != nullptr || !p->answers.empty())
      busy_[kept++] = p;
    else
      p->busy = false;
  }
  busy_.resize(kept);
  return work;
}

void AmEngine::count_malformed(std::size_t reason) {
  ++stats_.malformed_packets;
  ++stats_.malformed_by_reason[reason];
}

void AmEngine::on_packet(Endpoint origin, std::span<const std::byte> bytes) {
  wire::PacketView v;
  if (wire::DecodeError e = wire::decode(bytes, v); e != wire::DecodeError::none) {
    count_malformed(static_cast<std::size_t>(e) - 1);
    return;
  }
  Peer* peer = peer_for(origin);
  if (peer == nullptr || lane_for(*peer) == nullptr) {
    count_malformed(kBadOrigin);
    return;
  }
  ++stats_.packets_received;
  switch (v.type()) {
    case wire::PacketType::am_first:
    case wire::PacketType::am_short: on_first(*peer, v); break;
    case wire::PacketType::am_more: on_more(*peer, v); break;
    case wire::PacketType::remote_done: on_remote_done(v); break;
  }
}

void AmEngine::on_first(Peer& peer, const wire::PacketView& v) {
  Reassembly& rx = peer.rx;
  if (rx.active) {
    // A lane delivers a message's packets back to back; a new message while
    // one is incomplete means the origin broke that rule.
    count_malformed(kOutOfSequence);
    complete_rx(peer, {StatusCode::malformed_packet, "message cut short by a new one from its origin"});
  }
  ++stats_.messages_received;
  stats_.bytes_received += v.payload.size();
  const bool wants_answer = (v.header.flags & wire::kWantsRemoteDone) != 0;
  const Dispatch d = dispatch_[v.header.dispatch];
  if (d.fn == nullptr) {
    ++stats_.unknown_dispatch;
    stats_.discarded_bytes += v.payload.size();
    if (v.payload.size() == v.header.total_len) {
      if (wants_answer) answer(peer, v.header.message_id, wire::kDispatchMissing);
      return;
    }
    // Answered once the last packet has been dropped too.
    rx = Reassembly{true, v.header.message_id, v.header.total_len, v.payload.size(), nullptr, {},
                    wants_answer, wire::kDispatchMissing};
    return;
  }
  const Incoming in{peer.endpoint, v.header.dispatch, v.user_header, v.payload,
                    static_cast<std::size_t>(v.header.total_len)};
  if (v.payload.size() == v.header.total_len) {
    d.fn(d.cookie, in, nullptr);
    if (wants_answer) answer(peer, v.header.message_id, 0);
    return;
  }
  Receive recv;
  d.fn(d.cookie, Incoming{in.origin, in.dispatch, in.header, {}, in.total_bytes}, &recv);
  rx = Reassembly{true, v.header.message_id, v.header.total_len, v.payload.size(),
                  static_cast<std::byte*>(recv.buffer), recv.done, wants_answer, 0};
  if (rx.buffer != nullptr)
    std::memcpy(rx.buffer, v.payload.data(), v.payload.size());
  else
    stats_.discarded_bytes += v.payload.size();
}

void AmEngine::on_more(Peer& peer, const wire::PacketView& v) {
  Reassembly& rx = peer.rx;
  if (!rx.active || v.header.message_id != rx.message_id || v.header.offset != rx.received ||
      v.header.total_len != rx.total) {
    count_malformed(kOutOfSequence);
    return;
  }
  if (rx.buffer != nullptr)
    std::memcpy(rx.buffer + v.header.offset, v.payload.data(), v.payload.size());
  else
    stats_.discarded_bytes += v.payload.size();
  rx.received += v.payload.size();
  stats_.bytes_received += v.payload.size();
  if (rx.received == rx.total) complete_rx(peer, Status::success());
}

void AmEngine::complete_rx(Peer& peer, Status s) {
  Reassembly rx = peer.rx;
  peer.rx = Reassembly{};
  if (rx.done) rx.done(s);
  if (rx.wants_remote_done) answer(peer, rx.message_id, s.ok() ? rx.answer_flags : std::uint16_t{wire::kDispatchMissing});
}

void AmEngine::answer(Peer& peer, std::uint64_t message_id, std::uint16_t flags) {
  if (peer.answers.size() >= shape_.max_requests) {
    // More answers owed than the origin can have requests: not an honest peer.
    count_malformed(kOutOfSequence);
    return;
  }
  peer.answers.push_back(Answer{message_id, flags});
  mark_busy(peer);
}

void AmEngine::on_remote_done(const wire::PacketView& v) {
  Request* r = pool_.find(v.header.message_id);
  if (r == nullptr || r->kind != Request::Kind::send || !r->remote_pending) {
    count_malformed(kOutOfSequence);
    return;
  }
  ++stats_.remote_done_received;
  r->remote_pending = false;
  const bool missing = (v.header.flags & wire::kDispatchMissing) != 0;
  r->remote_done(missing ? Status{StatusCode::unknown_dispatch, "send: the target has no handler for the dispatch id"}
                         : Status::success());
  finish(*r);
}

}  // namespace ami::protocol
