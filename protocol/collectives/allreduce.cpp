// protocol/collectives/allreduce.cpp — allreduce: the call, what its
// algorithms share (arrivals, kept records, completion), and recursive
// doubling, used below AMI_COLL_RING_MIN bytes (allreduce_ring.cpp has the
// reduce-scatter and allgather used above it: recursive halving for a
// power of two of members, a ring otherwise).
//
// Recursive doubling: at step k every rank sends its value so far to its
// partner (rank xor 2^(k-1), among a power of two of ranks) and combines
// the partner's into the next value: value(k) = value(k-1) op data, out of
// place, so a value being sent is never written. value(0) is the caller's
// send, value(steps) the caller's recv, the ones between scratch. With a
// size that is not a power of two the first 2 * rem ranks pair up: the even
// one sends its data to the odd one (step 0) and gets the result back from
// it (step steps + 1).
//
// A step's data is combined as it arrives when the value it joins is
// ready (straight from the packet, or piece by piece); otherwise it is
// placed where its value goes and combined there in place once the value
// before it is ready. Nothing is copied on the way but an early arrival.
#include <cstring>

#include "engine.hpp"

namespace ami::coll {

Status check_reduction(bool all, const void* send, const void* recv, std::size_t count, DataType type, ReduceOp op,
                       bool needs_recv);

namespace {
enum StepState : std::uint8_t {
  kNone,     // nothing came for the step yet
  kRaw,      // streaming into its place, to be combined there
  kPiece,    // streaming, combined piece by piece
  kKept,     // kept in a record until its place can take it
  kPlaced,   // in its place, not combined yet
  kDone,     // combined (or, for data that is final, in place)
};
}  // namespace

Status GeometryImpl::allreduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                               Callback done) {
  CallScope scope(engine);
  if (Status s = check_reduction(true, send, recv, count, type, op, true); !s.ok()) return s;
  AllreduceState& a = allreduce_;
  if (Status s = begin(a, done, "allreduce: an allreduce is in flight on this geometry already"); !s.ok())
    return s;
  a.send = static_cast<const std::byte*>(send);
  a.recv = static_cast<std::byte*>(recv);
  a.count = count;
  a.type = type;
  a.op = op;
  a.bytes = count * size_of(type);
  a.ring = size > 1 && a.bytes >= engine.ring_min && count >= size;
  a.halving = a.ring && std::has_single_bit(size);
  a.proto.type = type;
  a.proto.op = op;
  a.proto.ring = a.ring;  // members must agree on the algorithm
  // Tags by step for sends, then receives: 2 (n - 1) steps on a ring (2 log n
  // halving), where doubling has a few (made by begin()).
  if (a.ring) a.need_tags(4 * std::size_t{size});
  allreduce_start();
  return Status::success();
}

void GeometryImpl::allreduce_start() {
  AllreduceState& a = allreduce_;
  const std::uint32_t K = a.steps;
  a.streaming = 0;
  a.sent = 0;
  a.ring_sent = 0;
  a.arrived.assign(a.ring ? ring_steps() : K + 2, kNone);
  a.kept.assign(a.arrived.size(), nullptr);
  if (a.send == a.recv && a.bytes != 0) {  // in place: this task's data is read while recv fills
    a.own = engine.buffers.acquire(a.bytes);
    if (!a.own) a.fail({StatusCode::no_resource, "allreduce: no memory for a copy of the data"});
    if (a.own) std::memcpy(a.own.data, a.send, a.bytes);
    a.send = a.own.data;
  }
  if (a.ring) {
    a.busy.assign(a.halving ? topology::Halving{size}.steps() : size, 0);
    // Halving: the largest step that joins recv by the rendezvous lands in scratch first.
    const std::size_t scratch = a.halving && size > 2 ? ring_span(1, false).bytes : 0;
    if (scratch > 0) {
      a.stages = engine.buffers.acquire(scratch);
      if (!a.stages) a.fail({StatusCode::no_resource, "allreduce: no memory for a step's data"});
    }
  } else {
    a.level = (a.extra || a.folds) ? -1 : 0;
    if (K > 1 || a.folds) {
      a.stages = engine.buffers.acquire(std::size_t{K} * a.bytes);
      if (!a.stages) a.fail({StatusCode::no_resource, "allreduce: no memory for the partial results"});
    }
  }
  if (size == 1 && a.result.ok() && a.bytes != 0) std::memcpy(a.recv, a.send, a.bytes);
  ArrivalList early = take_early(a);
  for (Arrival* r = early.head; r != nullptr;) {
    Arrival* next = r->next;
    allreduce_take(r);
    r = next;
  }
  allreduce_progress();
}

// Does h from origin belong to this allreduce? Members that disagree on
// the arguments (or on the algorithm) fail it; anything else is malformed.
bool GeometryImpl::allreduce_expects(const Header& h, std::uint32_t origin, std::size_t bytes) {
  AllreduceState& a = allreduce_;
  const bool step_known = h.step < a.arrived.size();
  if (h.type != a.type || h.op != a.op || h.ring != a.ring ||
      (step_known && bytes != allreduce_step_bytes(h.step))) {
    ++engine.stats.malformed;
    a.fail({StatusCode::invalid_argument,
            "allreduce: the members' count, type, op or algorithm (AMI_COLL_RING_MIN) do not match"});
    return false;
  }
  bool ok = step_known && a.arrived[h.step] == kNone;
  if (ok && a.ring) {
    ok = origin == ring_peer(h.step, false);
  } else if (ok) {
    const std::uint32_t K = a.steps;
    if (h.step == 0)
      ok = a.folds && origin == rank - 1;
    else if (h.step == K + 1)
      ok = a.extra && origin == rank + 1;
    else
      ok = !a.extra && origin == a.partner[h.step];
  }
  if (!ok) ++engine.stats.malformed;
  return ok;
}

std::size_t GeometryImpl::allreduce_step_bytes(std::uint16_t step) const {
  return allreduce_.ring ? ring_span(step, false).bytes : allreduce_.bytes;
}

void GeometryImpl::allreduce_take(Arrival* r) {
  AllreduceState& a = allreduce_;
  if (!a.result.ok() || !allreduce_expects(r->header, r->origin, r->bytes)) {
    engine.discard(r);
    return;
  }
  const std::uint16_t s = r->header.step;
  r->owner = &a;
  a.kept[s] = r;
  a.arrived[s] = kKept;
  if (r->state == Arrival::State::receiving) ++a.streaming;
}

void GeometryImpl::allreduce_data(const Header& h, std::uint32_t origin, const Incoming& in, Receive* recv) {
  AllreduceState& a = allreduce_;
  if (!a.result.ok() || !allreduce_expects(h, origin, in.total_bytes)) {
    allreduce_check();
    return;
  }
  if (a.ring)
    ring_data(h, in, recv);
  else
    doubling_data(h, in, recv);
}

void GeometryImpl::allreduce_received(std::uint32_t index, Status s) {
  AllreduceState& a = allreduce_;
  const auto step = static_cast<std::uint16_t>(index - a.tags.size() / 2);
  --a.streaming;
  if (!s.ok()) {
    a.fail(s);
  } else if (a.arrived[step] == kPiece) {
    a.arrived[step] = kDone;
    ++engine.stats.combined_in_handler;
  } else if (a.ring) {
    ring_received(step);
  } else {  // the extra rank's result is final; a doubling step's data is combined when its turn comes
    a.arrived[step] = step == a.steps + 1 ? kDone : kPlaced;
  }
  allreduce_progress();
}

void GeometryImpl::allreduce_kept(Arrival&) {
  --allreduce_.streaming;
  allreduce_progress();
}

void GeometryImpl::allreduce_sent(std::uint32_t index) {
  if (allreduce_.ring) ring_sent(index);
  allreduce_progress();
}

// Kept records whose place can take them now go there; then the algorithm
// moves on as far as its data allows.
void GeometryImpl::allreduce_progress() {
  AllreduceState& a = allreduce_;
  for (std::uint16_t s = 0; s < a.arrived.size() && a.result.ok(); ++s)
    if (a.arrived[s] == kKept) allreduce_place_kept(s);
  if (a.result.ok() && size > 1) {
    if (a.ring)
      ring_progress();
    else
      doubling_progress();
  }
  allreduce_check();
}

void GeometryImpl::allreduce_place_kept(std::uint16_t s) {
  AllreduceState& a = allreduce_;
  Arrival* r = a.kept[s];
  if (r->state == Arrival::State::receiving) return;
  if (a.ring && !ring_may_place(s)) return;
  a.kept[s] = nullptr;
  a.arrived[s] = kNone;
  if (r->state == Arrival::State::ready) {
    if (!r->status.ok())
      a.fail(r->status);
    else if (a.ring)
      ring_place(s, r->buffer.data);
    else
      doubling_place(s, r->buffer.data);
    engine.release(r);
    return;
  }
  // Deferred at its sender: fetched straight into its place.
  std::byte* place = a.ring ? ring_landing(s) : doubling_target(s);
  Status st = engine.context.accept(r->deferred, place,
                                    Engine::received_callback(a.tag(static_cast<std::uint32_t>(a.tags.size() / 2 + s))));
  engine.release(r);
  if (!st.ok()) {
    a.fail(st);
    return;
  }
  a.arrived[s] = kRaw;
  ++a.streaming;
}

void GeometryImpl::allreduce_check() {
  AllreduceState& a = allreduce_;
  if (a.result.ok() && !allreduce_complete()) return;
  if (a.sends_pending != 0 || a.streaming != 0) return;
  for (std::size_t s = 0; s < a.kept.size(); ++s)
    if (a.kept[s] != nullptr) {
      engine.discard(a.kept[s]);
      a.kept[s] = nullptr;
    }
  engine.buffers.release(a.stages);
  engine.buffers.release(a.own);
  engine.finish(a);
}

bool GeometryImpl::allreduce_complete() const {
  const AllreduceState& a = allreduce_;
  if (size == 1) return true;
  if (a.ring) {
    if (a.ring_sent != a.arrived.size()) return false;
    for (std::uint8_t st : a.arrived)
      if (st != kDone) return false;
    return true;
  }
  const std::uint32_t K = a.steps;
  if (a.level != static_cast<int>(K)) return false;
  if (a.extra) return (a.sent & 1) != 0;
  return !a.folds || (a.sent >> (K + 1) & 1) != 0;
}

// ---- recursive doubling ----

std::byte* GeometryImpl::doubling_value(int k) {
  AllreduceState& a = allreduce_;
  if (k == static_cast<int>(a.steps)) return a.recv;
  if (k == 0 && !a.folds) return const_cast<std::byte*>(a.send);
  return a.stages.data + static_cast<std::size_t>(k) * a.bytes;
}

// Where step s's data goes: the value it makes (the extra rank: recv).
std::byte* GeometryImpl::doubling_target(std::uint16_t s) {
  AllreduceState& a = allreduce_;
  if (s == a.steps + 1) return a.recv;
  if (s == 0) return a.stages.data;
  return doubling_value(s);
}

// The value step s's data joins, when it is ready.
const std::byte* GeometryImpl::doubling_operand(std::uint16_t s, bool& ready) {
  AllreduceState& a = allreduce_;
  if (s == 0) {  // the fold joins this task's own data
    ready = true;
    return a.send;
  }
  ready = a.level == static_cast<int>(s) - 1;
  return ready ? doubling_value(s - 1) : nullptr;
}

// Whole data of step s: combined now when it can be, else placed.
void GeometryImpl::doubling_place(std::uint16_t s, const std::byte* data) {
  AllreduceState& a = allreduce_;
  std::byte* dst = doubling_target(s);
  if (s == a.steps + 1) {
    if (a.bytes != 0) std::memcpy(dst, data, a.bytes);
    a.arrived[s] = kDone;
    return;
  }
  bool ready = false;
  const std::byte* operand = doubling_operand(s, ready);
  if (ready) {
    combine(a.type, a.op, dst, operand, data, a.count);
    a.arrived[s] = kDone;
  } else {
    if (a.bytes != 0) std::memcpy(dst, data, a.bytes);
    a.arrived[s] = kPlaced;
  }
}

void GeometryImpl::doubling_data(const Header& h, const Incoming& in, Receive* recv) {
  AllreduceState& a = allreduce_;
  const std::uint16_t s = h.step;
  if (recv == nullptr) {
    doubling_place(s, in.payload.data());
    if (a.arrived[s] == kDone && s != a.steps + 1) ++engine.stats.combined_in_handler;
    allreduce_progress();
    return;
  }
  recv->done = Engine::received_callback(a.tag(static_cast<std::uint32_t>(a.tags.size() / 2 + s)));
  ++a.streaming;
  bool ready = false;
  const std::byte* operand = doubling_operand(s, ready);
  if (ready && s != a.steps + 1 && in.total_bytes <= engine.eager_max) {
    a.pieces.start(a.type, a.op, doubling_target(s), operand);
    recv->piece = &Engine::on_piece;
    recv->piece_cookie = &a.pieces;
    a.arrived[s] = kPiece;
    return;
  }
  recv->buffer = doubling_target(s);
  a.arrived[s] = kRaw;
}

void GeometryImpl::doubling_progress() {
  AllreduceState& a = allreduce_;
  const int K = static_cast<int>(a.steps);
  const auto payload = [&](const std::byte* p) { return std::span<const std::byte>(p, a.bytes); };
  if (a.extra) {
    if ((a.sent & 1) == 0) {
      a.sent |= 1;
      if (!send(a, rank + 1, 0, payload(a.send), 0)) return;
    }
    if (a.arrived[K + 1] == kDone) a.level = K;
    return;
  }
  while (a.level < K) {
    const int s = a.level + 1;
    const std::uint64_t bit = std::uint64_t{1} << s;
    if (s >= 1 && (a.sent & bit) == 0) {
      a.sent |= bit;
      if (!send(a, a.partner[static_cast<std::size_t>(s)], static_cast<std::uint16_t>(s),
                payload(doubling_value(s - 1)), static_cast<std::uint32_t>(s)))
        return;
    }
    if (a.arrived[s] == kPlaced) {  // it came before its turn: combined in place now
      std::byte* dst = doubling_target(static_cast<std::uint16_t>(s));
      combine(a.type, a.op, dst, s == 0 ? a.send : doubling_value(s - 1), dst, a.count);
      a.arrived[s] = kDone;
    }
    if (a.arrived[s] != kDone) return;
    a.level = s;
  }
  const std::uint64_t back = std::uint64_t{1} << (K + 1);
  if (a.folds && (a.sent & back) == 0) {
    a.sent |= back;
    (void)send(a, rank - 1, static_cast<std::uint16_t>(K + 1), payload(a.recv), static_cast<std::uint32_t>(K + 1));
  }
}

}  // namespace ami::coll
