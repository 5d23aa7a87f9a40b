// protocol/am/eager/am_atomic.cpp — remote atomics (docs/DESIGN.md, "Remote
// atomics").
//
// An atomic goes one of two ways, chosen by the lane and the region, never
// by the operation: a lane whose device reaches the word itself
// (Lane::offloads_atomic: self, shm on a mapped segment) takes it as a
// descriptor, done like a PUT's; any other goes as an atomic packet that the
// target's engine does when it handles it, in order with the lane's other
// packets, with std::atomic_ref on its own memory after checking the word
// against its region table, and answers with an atomic_reply carrying the
// old value. Both ways end in the target host's CPU, so they are atomic
// against each other.
//
// A request sent as a packet waits in its peer's list of atomics (linked as
// an ack's would be, with no sequence number: the reply names the request's
// id), so a failed peer fails it with the rest of its work, and a fence on a
// lane that may reorder waits until the list is empty.
#include <cstring>

#include "ami/device/cpu_atomic.hpp"
#include "am_engine.hpp"
#include "packet_build.hpp"

namespace ami::protocol {

namespace {
constexpr std::size_t kOutOfSequence = 7;  // ContextStats::malformed_by_reason (am_receive.cpp)
}  // namespace

Status AmEngine::atomic(const AtomicParams& p) {
  Peer* peer = peer_for(p.dest);
  if (peer == nullptr) return {StatusCode::invalid_argument, "atomic: endpoint is out of range"};
  if (lane_for(*peer) == nullptr) return {StatusCode::unreachable, "atomic: no backend reaches the endpoint"};
  if (!peer->failure.ok()) return {StatusCode::peer_failed, "atomic: the endpoint's peer failed"};
  ++stats_.atomics;
  const device::AtomicDescriptor a{.op = p.op, .type = p.type, .operand = p.operand, .compare = p.compare,
                                   .result = returns_old(p.op) ? p.result : nullptr,
                                   .remote_address = p.remote.address + p.remote_offset, .remote = p.remote};
  if (peer->state->head == nullptr && peer->lane->offloads_atomic(p.remote)) {
    // Nothing queued before it and the device does it: straight into the
    // FIFO, the callback listed directly, as a PUT's is.
    if (device::Descriptor* d = peer->lane->fifo().try_reserve()) {
      d->kind = device::DescriptorKind::atomic;
      d->atomic = a;
      peer->lane->fifo().commit(p.done);
      peer->state->last_get = peer->lane->fifo().injected();  // (a fence waits for it as for a GET)
      ring(*peer->lane);
      return Status::success();
    }
  }
  Request* r = acquire();
  if (r == nullptr) {
    --stats_.atomics;
    return {StatusCode::no_resource, "atomic: every request (AMI_MAX_REQUESTS) is in use"};
  }
  r->kind = Request::Kind::atomic;
  r->atomic = a;
  r->local_done = p.done;
  enqueue(*peer, *r);
  return Status::success();
}

// In the call, where the lane's device reaches the word itself and nothing
// is outstanding to the peer (so it overtakes nothing of this context's);
// else as atomic() would, and its callback reports it.
Status AmEngine::atomic_now(const AtomicParams& p) {
  Peer* peer = peer_for(p.dest);
  if (peer != nullptr && peer->failure.ok() && lane_for(*peer) != nullptr && peer->state->head == nullptr) {
    device::Lane& lane = *peer->lane;
    auto& fifo = lane.fifo();
    if (fifo.injected() == fifo.counter().snapshot() && fifo.pending_callbacks() == 0) {
      const device::AtomicRef a{.op = p.op, .type = p.type, .operand = p.operand, .compare = p.compare,
                                .result = returns_old(p.op) ? p.result : nullptr,
                                .remote_address = p.remote.address + p.remote_offset, .remote = p.remote};
      // (not_supported: the lane does not reach the word itself, and
      // offloads_atomic() says the same: a message it is.)
      const Status s = lane.atomic_in_place(a);
      if (s.ok()) ++stats_.atomics;
      if (s != StatusCode::not_supported) return s;
    }
  }
  const Status s = atomic(p);
  return s.ok() ? Status{StatusCode::in_progress, "atomic_now: posted; done reports it"} : s;
}

// As a descriptor (the device does it) or as a packet (the target's engine).
bool AmEngine::inject_atomic(Peer& peer, Request& r) {
  device::Lane& lane = *peer.lane;
  device::Descriptor* d = lane.fifo().try_reserve();
  if (d == nullptr) return false;
  if (lane.offloads_atomic(r.atomic.remote)) {
    d->kind = device::DescriptorKind::atomic;
    d->atomic = r.atomic;
    r.local_pending = true;
    lane.fifo().commit(Callback{&AmEngine::on_send_local, &r});
    peer.state->last_get = lane.fifo().injected();
    return true;
  }
  const device::AtomicDescriptor& a = r.atomic;
  const wire::AtomicArgs args{.region = a.remote.region, .generation = a.remote.generation,
                              .operand = a.operand, .compare = a.compare};
  const auto what = static_cast<std::uint16_t>(static_cast<std::uint16_t>(a.op) |
                                               static_cast<std::uint16_t>(a.type) << 8);
  const wire::PacketHeader h = wire::make_header(wire::PacketType::atomic, what, r.id(), 0, a.remote_address,
                                                 static_cast<std::uint32_t>(wire::AtomicArgs::kBytes), 0, 0);
  const std::size_t k = wire::encode(h, {}, d->packet.inline_data);
  args.encode(d->packet.inline_data + k);
  finish_packet(*d, k + wire::AtomicArgs::kBytes, {});
  // The reply settles it; a lane that breaks first fails it through the
  // peer's list (fail_work), so its packet's slot needs no callback.
  r.verdict_pending = true;
  Unanswered& u = peer.state->atomics;
  r.awaiting_ack = true;
  r.ack_next = nullptr;
  r.ack_prev = u.tail;
  if (u.tail != nullptr) u.tail->ack_next = &r; else u.head = &r;
  u.tail = &r;
  lane.fifo().commit();
  ++stats_.packets_sent;
  return true;
}

// Target: the atomic is done here, now, in the order the lane brought it.
// The word is checked as a PUT's range is (the key's region, generation and
// range against this task's table) and for its alignment, which the origin
// checked too but a packet cannot be trusted for.
void AmEngine::on_atomic(Peer& peer, const wire::PacketView& v) {
  const wire::AtomicArgs args = wire::AtomicArgs::decode(v.payload);
  const auto op = static_cast<AtomicOp>(v.header.dispatch & 0xFFu);
  const auto type = static_cast<AtomicType>(v.header.dispatch >> 8);
  const std::uint64_t address = v.header.offset;
  const std::size_t width = width_of(type);
  AtomicReplyItem reply{.request_id = v.header.message_id};
  std::byte* word = nullptr;
  if (regions_ == nullptr) {
    reply.refusal = wire::AtomicRefusal::stale_key;
  } else {
    const RemoteKey key{.job = regions_->job(), .task = regions_->task(), .region = args.region,
                        .generation = args.generation};
    const Status s = regions_->check(key, address, width, word);
    // (The table says which in its words: a key that names no live region,
    // or a word outside the one it names.)
    if (!s.ok())
      reply.refusal = std::strstr(s.what(), "stale") != nullptr || std::strstr(s.what(), "names no region") != nullptr
                          ? wire::AtomicRefusal::stale_key
                          : wire::AtomicRefusal::out_of_bounds;
    else if (!aligned_for(address, type))
      reply.refusal = wire::AtomicRefusal::misaligned;
  }
  if (peer.state->controls.size() >= 4 * std::size_t{shape_.options.max_requests}) {
    // More answers owed than the origin can have requests: not an honest
    // peer (as emit_ack() judges); nothing is done for it.
    count_malformed(kOutOfSequence);
    return;
  }
  if (reply.refusal == wire::AtomicRefusal::none) {
    reply.old = device::cpu_atomic(op, type, word, args.operand, args.compare);
    ++stats_.atomics_executed;
  }
  push_control(peer, reply);
}

// Origin: the old value goes to the caller's buffer, then its callback.
void AmEngine::on_atomic_reply(Peer& peer, const wire::PacketView& v) {
  Request* r = pool_.find(v.header.message_id);
  if (r == nullptr || r->kind != Request::Kind::atomic || !r->awaiting_ack || r->peer != index_of(peer)) {
    count_malformed(kOutOfSequence);  // answers nothing waiting: a duplicate or a forgery
    return;
  }
  forget_answer(*r);
  switch (static_cast<wire::AtomicRefusal>(v.header.dispatch)) {
    case wire::AtomicRefusal::none: {
      const std::uint64_t old = v.header.offset;
      if (r->atomic.result != nullptr) std::memcpy(r->atomic.result, &old, width_of(r->atomic.type));
      break;
    }
    case wire::AtomicRefusal::stale_key:
      r->failure = {StatusCode::remote_access, "atomic: the target refused the remote key (stale, or no region)"};
      break;
    case wire::AtomicRefusal::out_of_bounds:
      r->failure = {StatusCode::remote_access,
                    "atomic: the target found the word outside the registered region (out of bounds)"};
      break;
    case wire::AtomicRefusal::misaligned:
      r->failure = {StatusCode::invalid_argument, "atomic: the target found the remote address misaligned"};
      break;
    case wire::AtomicRefusal::bad_op:
      r->failure = {StatusCode::invalid_argument, "atomic: the target does not know the op"};
      break;
  }
  r->verdict_pending = false;
  settle(*r);
}

wire::PacketHeader AmEngine::header_of(const AtomicReplyItem& a) {
  return wire::make_header(wire::PacketType::atomic_reply, static_cast<std::uint16_t>(a.refusal), a.request_id, 0,
                           a.old, 0, 0, 0);
}

}  // namespace ami::protocol
