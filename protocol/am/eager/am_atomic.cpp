// protocol/am/eager/am_atomic.cpp — remote atomics (docs/DESIGN.md, "Remote
// atomics").
//
// An atomic goes one of two ways, chosen by the lane, the region's atomic
// domain (its key says: the owner host's CPUs or its NIC) and, in the NIC
// domain, the op: a lane whose device does it itself in the region's domain
// (Lane::offloads_atomic: self and shm on a mapped segment for a CPU-domain
// region; verbs for 64-bit fetch_add, add and compare_swap on a NIC-domain
// one) takes it as a descriptor, done like a PUT's; any other goes as an
// atomic packet that the target's engine does when it handles it. On a
// CPU-domain region it does it at once with std::atomic_ref on its own
// memory, in order with the lane's other packets; on a NIC-domain region it
// has its own NIC do it through the atomic loopback (natively, or by
// compare-and-swaps on the 64-bit word) and answers when that is done.
// Every path to a word thus ends in one piece of hardware.
//
// A request sent as a packet waits in its peer's list of atomics (linked as
// an ack's would be, with no sequence number: the reply names the request's
// id), so a failed peer fails it with the rest of its work, and a fence
// waits until the list is empty.
#include <cstring>

#include "ami/device/cpu_atomic.hpp"
#include "am_engine.hpp"
#include "packet_build.hpp"

namespace ami::protocol {

namespace {
constexpr std::size_t kOutOfSequence = 7;  // ContextStats::malformed_by_reason (am_receive.cpp)
constexpr Status kOutOfRange{StatusCode::invalid_argument, "atomic: endpoint is out of range"};

// The descriptor of p, written where it stays (a FIFO slot or a request):
// the key is copied once.
void describe(device::AtomicDescriptor& a, const AtomicParams& p) {
  a.op = p.op;
  a.type = p.type;
  a.operand = p.operand;
  a.compare = p.compare;
  a.result = returns_old(p.op) ? p.result : nullptr;
  a.remote_address = p.remote.address + p.remote_offset;
  a.remote = p.remote;
}
}  // namespace

Status AmEngine::atomic(const AtomicParams& p) {
  Peer* peer = peer_for(p.dest);
  if (peer == nullptr) return kOutOfRange;
  return post_atomic(*peer, p);
}

Status AmEngine::post_atomic(Peer& peer, const AtomicParams& p) {
  if (lane_for(peer) == nullptr) return {StatusCode::unreachable, "atomic: no backend reaches the endpoint"};
  if (!peer.failure.ok()) return {StatusCode::peer_failed, "atomic: the endpoint's peer failed"};
  ++stats_.atomics;
  device::Lane& lane = *peer.lane;
  if (peer.state->head == nullptr && !peer.state->offloaded_must_wait(p.remote) &&
      lane.offloads_atomic(p.remote, p.op, p.type)) {
    // Nothing queued before it and the device does it: straight into the
    // FIFO, the callback listed directly, as a PUT's is.
    if (device::Descriptor* d = lane.fifo().try_reserve()) {
      d->kind = device::DescriptorKind::atomic;
      describe(d->atomic, p);
      lane.fifo().commit(p.done);
      peer.state->last_get = lane.fifo().injected();  // (a fence waits for it as for a GET)
      ring(lane);
      return Status::success();
    }
  }
  Request* r = acquire();
  if (r == nullptr) {
    --stats_.atomics;
    return {StatusCode::no_resource, "atomic: every request (AMI_MAX_REQUESTS) is in use"};
  }
  r->kind = Request::Kind::atomic;
  describe(r->atomic, p);
  r->local_done = p.done;
  enqueue(peer, *r);
  return Status::success();
}

// In the call, where the lane's device reaches the word itself and nothing
// is outstanding to the peer (so it overtakes nothing of this context's);
// else as atomic() would, and its callback reports it. Only a CPU-domain
// word can be done in the call (by this CPU, on a mapping): a NIC-domain
// one goes to the NIC at once, without asking the lane first.
Status AmEngine::atomic_now(const AtomicParams& p) {
  Peer* peer = peer_for(p.dest);
  if (peer == nullptr) return kOutOfRange;
  if (p.remote.atomics == AtomicDomain::cpu && peer->failure.ok() && lane_for(*peer) != nullptr &&
      peer->state->head == nullptr) {
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
  const Status s = post_atomic(*peer, p);
  return s.ok() ? Status{StatusCode::in_progress, "atomic_now: posted; done reports it"} : s;
}

// As a descriptor (the device does it) or as a packet (the target's engine).
bool AmEngine::inject_atomic(Peer& peer, Request& r) {
  device::Lane& lane = *peer.lane;
  device::Descriptor* d = lane.fifo().try_reserve();
  if (d == nullptr) return false;
  if (lane.offloads_atomic(r.atomic.remote, r.atomic.op, r.atomic.type)) {
    if (peer.state->offloaded_must_wait(r.atomic.remote)) return false;  // (the reserved slot stays free)
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
    const RemoteKey key{.job = regions_->job(), .task = regions_->task(), .region = args.region,
                        .generation = args.generation};
    if (const RemoteKey* home = regions_->nic_home(key)) {
      // The region's atomics are its NIC's: done through it, answered
      // when it is done. The NIC works on the 64-bit word that holds the
      // target, which must lie in the region too.
      if (!regions_->check(key, address & ~std::uint64_t{7}, 8, word).ok()) {
        reply.refusal = wire::AtomicRefusal::out_of_bounds;
      } else {
        start_nic_atomic(peer, v.header.message_id, op, type, address, args, *home);
        return;
      }
    } else {
      reply.old = device::cpu_atomic(op, type, word, args.operand, args.compare);
      ++stats_.atomics_executed;
    }
  }
  push_control(peer, reply);
}

// What op makes of the value w (in the target's width: mask), with operand
// v and compare c.
namespace {
std::uint64_t apply(AtomicOp op, std::uint64_t w, std::uint64_t v, std::uint64_t c, std::uint64_t mask) {
  switch (op) {
    case AtomicOp::fetch_add:
    case AtomicOp::add: return (w + v) & mask;
    case AtomicOp::swap: return v & mask;
    case AtomicOp::compare_swap: return w == (c & mask) ? v & mask : w;
    case AtomicOp::fetch_and: return w & v & mask;
    case AtomicOp::fetch_or: return (w | v) & mask;
    case AtomicOp::fetch_xor: return (w ^ v) & mask;
  }
  return w;
}
}  // namespace

device::Lane* AmEngine::nic_loopback() {
  if (nic_lane_ != nullptr) return nic_lane_;
  for (device::Device* d : devices_)
    if (device::Lane* lane = d->atomic_loopback()) {
      nic_lane_ = lane;
      lanes_.push_back(lane);  // advance() runs its callbacks
      find_polled();
      break;
    }
  return nic_lane_;
}

// Target: a NIC-domain atomic that came as a packet, done by this task's
// NIC through the atomic loopback, so that it is atomic against the ones
// initiators' NICs do natively: 64-bit fetch_add, add and compare_swap as
// they are; the rest (swap, and, or, xor, and every 32-bit op, on the
// 64-bit word that holds it) by compare-and-swap from a guess until the
// word held what was guessed. The reply goes when that is done.
void AmEngine::start_nic_atomic(Peer& origin, std::uint64_t request_id, AtomicOp op, AtomicType type,
                                std::uint64_t address, const wire::AtomicArgs& args, const RemoteKey& home) {
  if (nic_loopback() == nullptr) {
    push_control(origin, AtomicReplyItem{.request_id = request_id, .refusal = wire::AtomicRefusal::nic_failed});
    return;
  }
  NicAtomic* j = nic_free_;
  if (j != nullptr) {
    nic_free_ = j->next_free;
  } else {
    nic_all_.push_back(std::make_unique<NicAtomic>());
    j = nic_all_.back().get();
  }
  *j = NicAtomic{.engine = this, .origin = &origin, .request_id = request_id, .op = op, .type = type,
                 .operand = args.operand, .compare = args.compare, .word = address & ~std::uint64_t{7},
                 .shift = static_cast<unsigned>((address & 4) * 8), .home = home};
  nic_waiting_.push_back(j);
  (void)post_nic_waiting();
}

// In the order they came: native ops follow each other on the loopback's
// queue pair (an RC queue pair executes atomics in order), a loop waits
// until everything before it is done and holds back what follows it, so
// that the owner's NIC does them in the order the lanes brought them.
bool AmEngine::nic_turn(const NicAtomic& j) const {
  return nic_in_flight_ == 0 || (nic_native(j.op, j.type) && !nic_loop_in_flight_);
}

// One step on the loopback; false when its FIFO is full.
bool AmEngine::post_nic_step(NicAtomic& j) {
  device::Lane& lane = *nic_lane_;
  device::Descriptor* d = lane.fifo().try_reserve();
  if (d == nullptr) return false;
  device::AtomicDescriptor a{.type = AtomicType::u64, .result = &j.old, .remote_address = j.word, .remote = j.home};
  if (nic_native(j.op, j.type)) {
    a.op = j.op == AtomicOp::compare_swap ? AtomicOp::compare_swap : AtomicOp::fetch_add;
    a.operand = j.operand;
    a.compare = j.compare;
  } else {
    const std::uint64_t mask = width_of(j.type) == 4 ? 0xFFFFFFFFu : ~std::uint64_t{0};
    const std::uint64_t now = (j.guess >> j.shift) & mask;
    const std::uint64_t next = apply(j.op, now, j.operand, j.compare, mask);
    a.op = AtomicOp::compare_swap;
    a.compare = j.guess;
    a.operand = (j.guess & ~(mask << j.shift)) | (next << j.shift);
  }
  d->kind = device::DescriptorKind::atomic;
  d->atomic = a;
  lane.fifo().commit(Callback{&AmEngine::on_nic_step, &j});
  ring(lane);
  return true;
}

// Posts the waiting jobs whose turn it is, in order.
std::size_t AmEngine::post_nic_waiting() {
  std::size_t posted = 0;
  while (!nic_waiting_.empty() && nic_turn(*nic_waiting_.front()) && post_nic_step(*nic_waiting_.front())) {
    NicAtomic& j = *nic_waiting_.front();
    nic_waiting_.pop_front();
    ++nic_in_flight_;
    nic_loop_in_flight_ = nic_loop_in_flight_ || !nic_native(j.op, j.type);
    ++posted;
  }
  return posted;
}

void AmEngine::on_nic_step(void* cookie, Status s) {
  NicAtomic& j = *static_cast<NicAtomic*>(cookie);
  AmEngine& e = *j.engine;
  if (!s.ok()) return e.finish_nic_atomic(j, wire::AtomicRefusal::nic_failed, 0);
  if (nic_native(j.op, j.type)) return e.finish_nic_atomic(j, wire::AtomicRefusal::none, j.old);
  const std::uint64_t mask = width_of(j.type) == 4 ? 0xFFFFFFFFu : ~std::uint64_t{0};
  const std::uint64_t found = (j.old >> j.shift) & mask;
  // Done when the word held the guess (the swap took), or when a 32-bit
  // compare_swap's half does not match: the NIC read it atomically and
  // nothing is to be written.
  if (j.old == j.guess || (j.op == AtomicOp::compare_swap && found != (j.compare & mask)))
    return e.finish_nic_atomic(j, wire::AtomicRefusal::none, found);
  j.guess = j.old;
  if (!e.post_nic_step(j)) {  // (the loopback's FIFO is full: its turn stays, first in line)
    --e.nic_in_flight_;
    e.nic_loop_in_flight_ = false;
    e.nic_waiting_.push_front(&j);
  }
}

void AmEngine::finish_nic_atomic(NicAtomic& j, wire::AtomicRefusal refusal, std::uint64_t old) {
  --nic_in_flight_;
  if (!nic_native(j.op, j.type)) nic_loop_in_flight_ = false;
  if (refusal == wire::AtomicRefusal::none) ++stats_.atomics_executed;
  // (An origin that failed meanwhile hears nothing more.)
  if (j.origin->failure.ok())
    push_control(*j.origin, AtomicReplyItem{.request_id = j.request_id, .old = old, .refusal = refusal});
  j.next_free = nic_free_;
  nic_free_ = &j;
  if (!nic_waiting_.empty()) (void)post_nic_waiting();
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
    case wire::AtomicRefusal::nic_failed:
      r->failure = {StatusCode::device_error, "atomic: the target's NIC failed it (its atomic loopback broke)"};
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
