// protocol/collectives/broadcast.cpp — broadcast down a binomial tree. A
// rank that is not the root takes the data from its parent straight into
// the caller's buffer (from the packet, or by the rendezvous for a large
// message) and forwards it to its children, largest subtree first, the
// moment it is complete, from the handler.
//
// Data that comes before the call waits in an early-arrival buffer when
// small (copied into place at the call) and at its sender when large (the
// handler defers it; the call accepts it into the caller's buffer, so it
// is moved once).
#include <cstring>

#include "engine.hpp"

namespace ami::coll {

namespace {
constexpr std::uint32_t kReceiveTag = ReduceState::kMaxChildren;  // sends to child i use tag i
}

Status GeometryImpl::broadcast(std::uint32_t root, void* buffer, std::size_t bytes, Callback done) {
  CallScope scope(engine);
  if (root >= size) return {StatusCode::invalid_argument, "broadcast: root is not a rank of the geometry"};
  if (buffer == nullptr && bytes != 0)
    return {StatusCode::invalid_argument, "broadcast: buffer is null but bytes is not zero"};
  BroadcastState& b = broadcast_;
  if (Status s = begin(b, done, "broadcast: a broadcast is in flight on this geometry already"); !s.ok())
    return s;
  b.tree = topology::Tree{size, root};
  b.buffer = static_cast<std::byte*>(buffer);
  b.bytes = bytes;
  b.receiving = false;
  b.have_data = rank == root;
  b.forwarded = false;
  b.early = nullptr;
  b.proto.root = root;
  broadcast_start();
  return Status::success();
}

void GeometryImpl::broadcast_start() {
  BroadcastState& b = broadcast_;
  ArrivalList early = take_early(b);
  for (Arrival* a = early.head; a != nullptr;) {
    Arrival* next = a->next;
    broadcast_take(a);
    a = next;
  }
  if (b.have_data && b.result.ok())
    broadcast_forward();
  else
    broadcast_check();
}

// Whether an arrival from origin fits the call; a mismatch of root or
// length fails the broadcast (the members disagree), anything else is
// malformed.
bool GeometryImpl::broadcast_expects(const Header& h, std::uint32_t origin, std::size_t bytes) {
  BroadcastState& b = broadcast_;
  if (rank == b.tree.root || origin != b.tree.parent(rank) || b.have_data || b.receiving) {
    ++engine.stats.malformed;
    return false;
  }
  if (h.root != b.tree.root || bytes != b.bytes) {
    ++engine.stats.malformed;
    b.fail({StatusCode::invalid_argument, "broadcast: the members' root or bytes do not match"});
    return false;
  }
  return true;
}

void GeometryImpl::broadcast_take(Arrival* a) {
  BroadcastState& b = broadcast_;
  if (!broadcast_expects(a->header, a->origin, a->bytes)) {
    engine.discard(a);
    return;
  }
  switch (a->state) {
    case Arrival::State::ready:
      if (b.bytes != 0) std::memcpy(b.buffer, a->buffer.data, b.bytes);
      engine.release(a);
      b.have_data = true;
      break;
    case Arrival::State::receiving:  // still streaming into its early buffer
      a->owner = &b;
      b.early = a;
      b.receiving = true;
      break;
    case Arrival::State::deferred: {
      Status s = engine.context.accept(a->deferred, b.buffer, Engine::received_callback(b.tag(kReceiveTag)));
      engine.release(a);
      if (s.ok())
        b.receiving = true;
      else
        b.fail(s);
      break;
    }
  }
}

void GeometryImpl::broadcast_data(const Header& h, std::uint32_t origin, const Incoming& in, Receive* recv) {
  BroadcastState& b = broadcast_;
  if (!broadcast_expects(h, origin, in.total_bytes)) {
    broadcast_check();
    return;
  }
  if (recv == nullptr) {
    if (b.bytes != 0) std::memcpy(b.buffer, in.payload.data(), b.bytes);
    b.have_data = true;
    broadcast_forward();
    return;
  }
  recv->buffer = b.buffer;
  recv->done = Engine::received_callback(b.tag(kReceiveTag));
  b.receiving = true;
}

void GeometryImpl::broadcast_received(std::uint32_t, Status s) {
  BroadcastState& b = broadcast_;
  b.receiving = false;
  if (!s.ok()) {
    b.fail(s);
    broadcast_check();
    return;
  }
  b.have_data = true;
  broadcast_forward();
}

void GeometryImpl::broadcast_kept(Arrival& a) {
  BroadcastState& b = broadcast_;
  b.early = nullptr;
  b.receiving = false;
  const Status s = a.status;
  if (s.ok() && b.bytes != 0) std::memcpy(b.buffer, a.buffer.data, b.bytes);
  engine.release(&a);
  if (!s.ok()) {
    b.fail(s);
    broadcast_check();
    return;
  }
  b.have_data = true;
  broadcast_forward();
}

void GeometryImpl::broadcast_forward() {
  BroadcastState& b = broadcast_;
  b.forwarded = true;
  const std::uint32_t children = b.tree.child_count(rank);
  for (std::uint32_t i = 0; i < children; ++i)
    if (!send(b, b.tree.child(rank, i), 0, {b.buffer, b.bytes}, i)) break;
  broadcast_check();
}

void GeometryImpl::broadcast_check() {
  BroadcastState& b = broadcast_;
  if (b.sends_pending != 0 || b.receiving) return;
  if (b.result.ok() && !(b.have_data && b.forwarded)) return;
  engine.finish(b);
}

}  // namespace ami::coll
