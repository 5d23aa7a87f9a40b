// protocol/collectives/allreduce_ring.cpp — allreduce of large data as a
// reduce-scatter and then an allgather over n blocks of the data, by one of
// two schedules of steps that share everything else here:
//
//  a ring (any n): steps 0..n-2 reduce, n-1..2n-3 gather. At step s a rank
//    sends block rank - s to rank + 1 and takes block rank - s - 1 from
//    rank - 1; after the reduce-scatter it holds block rank + 1 complete,
//    and the allgather passes the complete blocks on;
//  recursive halving and doubling (n a power of two, 2^L): steps 0..L-1
//    reduce, L..2L-1 gather, each with one partner (rank xor 2^k, the
//    topology's Halving) and half of what the step before held. It moves
//    the same bytes as the ring in 2 log n steps instead of 2 (n - 1), and
//    with tasks placed on nodes in blocks its big first exchanges stay
//    inside a node: only the last reduce and first gather steps, the
//    smallest, cross.
//
// Every step's data arrives straight into its place in the caller's recv:
// in the reduce-scatter it is combined there (from the packet or piece by
// piece when small, in place once the rendezvous has put it there when
// large), in the allgather it is final. A ring block is combined with this
// task's own block; a halving step joins what the steps before combined in
// recv, so it waits for the step before, and its large data lands in
// scratch (stages) first. One hazard is guarded: a range this rank is still
// sending from recv (the reduce-scatter forwards what it combined) is not
// overwritten by the allgather's copy of it until that send is complete;
// the arrival waits in a record (or at its sender) meanwhile.
#include <cstring>

#include "engine.hpp"

namespace ami::coll {

namespace {
enum StepState : std::uint8_t { kNone, kRaw, kPiece, kKept, kPlaced, kDone };  // as in allreduce.cpp
}

std::size_t GeometryImpl::ring_offset(std::uint32_t block) const {
  const AllreduceState& a = allreduce_;
  return static_cast<std::size_t>(a.count * std::uint64_t{block} / size) * size_of(a.type);
}

std::size_t GeometryImpl::ring_bytes(std::uint32_t block) const { return ring_offset(block + 1) - ring_offset(block); }

std::uint32_t GeometryImpl::ring_steps() const {
  return allreduce_.halving ? 2 * topology::Halving{size}.steps() : 2 * (size - 1);
}

bool GeometryImpl::ring_reduces(std::uint16_t step) const { return step < ring_steps() / 2; }

// The halving step's exchange level k: the reduce-scatter goes up, the
// allgather back down.
namespace {
std::uint32_t level(std::uint32_t steps, std::uint16_t step) {
  const std::uint32_t half = steps / 2;
  return step < half ? step : steps - 1 - step;
}
}  // namespace

// What step sends (sending) or takes: bytes of recv (of send, for what step 0 sends).
GeometryImpl::Span GeometryImpl::ring_span(std::uint16_t step, bool sending) const {
  if (!allreduce_.halving) {
    const std::uint32_t b = topology::ring_block(rank, size, std::uint64_t{step} + (sending ? 0 : 1));
    return {ring_offset(b), ring_bytes(b)};
  }
  const topology::Halving h{size};
  const std::uint32_t k = level(ring_steps(), step);
  // Reducing, a rank sends what it gives and takes what it keeps; gathering, the reverse.
  const topology::Halving::Blocks b = sending == ring_reduces(step) ? h.given(rank, k) : h.kept(rank, k);
  return {ring_offset(b.lo), ring_offset(b.hi) - ring_offset(b.lo)};
}

std::uint32_t GeometryImpl::ring_peer(std::uint16_t step, bool sending) const {
  if (allreduce_.halving) return topology::Halving::partner(rank, level(ring_steps(), step));
  return sending ? topology::ring_next(rank, size) : topology::ring_prev(rank, size);
}

// Which busy entry guards the range a reduce-scatter step sends from recv
// and an allgather step later writes: the ring's block, the halving's level.
std::uint32_t GeometryImpl::ring_guard(std::uint16_t step) const {
  if (allreduce_.halving) return level(ring_steps(), step);
  return topology::ring_block(rank, size, std::uint64_t{step} + (ring_reduces(step) ? 0 : 1));
}

// What a reduce-scatter step's data is combined with: this task's block
// (ring, and halving's first step), or what recv holds so far.
const std::byte* GeometryImpl::ring_operand(std::uint16_t step) const {
  const AllreduceState& a = allreduce_;
  const Span d = ring_span(step, false);
  return (!a.halving || step == 0 ? a.send : a.recv) + d.offset;
}

// May step's data go to its place now? An allgather step's once no send
// reads that range; a halving step's once the step before is combined.
bool GeometryImpl::ring_may_place(std::uint16_t step) const {
  const AllreduceState& a = allreduce_;
  if (!ring_reduces(step)) return a.busy[ring_guard(step)] == 0;
  return !a.halving || step == 0 || a.arrived[step - 1u] == kDone;
}

// Where a step's data streams to: its place in recv, or, for a halving
// step that joins recv, the scratch it is combined from.
std::byte* GeometryImpl::ring_landing(std::uint16_t step) {
  AllreduceState& a = allreduce_;
  if (a.halving && step > 0 && ring_reduces(step)) return a.stages.data;
  return a.recv + ring_span(step, false).offset;
}

// Whole data of step s into its place: combined in the reduce-scatter,
// copied in the allgather.
void GeometryImpl::ring_place(std::uint16_t s, const std::byte* data) {
  AllreduceState& a = allreduce_;
  const Span d = ring_span(s, false);
  std::byte* dst = a.recv + d.offset;
  if (ring_reduces(s))
    combine(a.type, a.op, dst, ring_operand(s), data, d.bytes / size_of(a.type));
  else if (d.bytes != 0)
    std::memcpy(dst, data, d.bytes);
  a.arrived[s] = kDone;
}

void GeometryImpl::ring_data(const Header& h, const Incoming& in, Receive* recv) {
  AllreduceState& a = allreduce_;
  const std::uint16_t s = h.step;
  if (!ring_may_place(s)) {  // this rank still sends the range from recv, or needs the step before
    const std::uint32_t origin = ring_peer(s, false);
    Arrival* r = engine.keep(h, members.task(origin), in, recv, true);
    if (r == nullptr) {
      a.fail({StatusCode::no_resource, "allreduce: no memory for an early block"});
    } else {
      r->origin = origin;
      r->owner = &a;
      a.kept[s] = r;
      a.arrived[s] = kKept;
      if (r->state == Arrival::State::receiving) ++a.streaming;
    }
    allreduce_progress();
    return;
  }
  if (recv == nullptr) {
    ring_place(s, in.payload.data());
    if (ring_reduces(s)) ++engine.stats.combined_in_handler;
    allreduce_progress();
    return;
  }
  recv->done = Engine::received_callback(a.tag(static_cast<std::uint32_t>(a.tags.size() / 2 + s)));
  ++a.streaming;
  if (ring_reduces(s) && in.total_bytes <= engine.eager_max) {
    a.pieces.start(a.type, a.op, a.recv + ring_span(s, false).offset, ring_operand(s));
    recv->piece = &Engine::on_piece;
    recv->piece_cookie = &a.pieces;
    a.arrived[s] = kPiece;
    return;
  }
  recv->buffer = ring_landing(s);  // large: by the rendezvous straight there
  a.arrived[s] = kRaw;
}

// A step's data is where it landed: a reduce-scatter step's is combined
// into its place.
void GeometryImpl::ring_received(std::uint16_t s) {
  AllreduceState& a = allreduce_;
  if (ring_reduces(s)) {
    const Span d = ring_span(s, false);
    std::byte* dst = a.recv + d.offset;
    combine(a.type, a.op, dst, ring_operand(s), ring_landing(s), d.bytes / size_of(a.type));
  }
  a.arrived[s] = kDone;
}

void GeometryImpl::ring_sent(std::uint32_t index) {
  AllreduceState& a = allreduce_;
  if (index < a.tags.size() / 2 && index >= 1 && ring_reduces(static_cast<std::uint16_t>(index)))
    a.busy[ring_guard(static_cast<std::uint16_t>(index))] = 0;
}

// Sends every step whose data is complete here, in order.
void GeometryImpl::ring_progress() {
  AllreduceState& a = allreduce_;
  const auto steps = static_cast<std::uint32_t>(a.arrived.size());
  while (a.ring_sent < steps) {
    const auto s = static_cast<std::uint16_t>(a.ring_sent);
    if (s > 0 && a.arrived[s - 1] != kDone) return;
    const Span d = ring_span(s, true);
    const std::byte* src = (s == 0 ? a.send : a.recv) + d.offset;
    const std::uint32_t before = a.sends_pending;
    ++a.ring_sent;
    if (!send(a, ring_peer(s, true), s, {src, d.bytes}, s)) return;
    if (s >= 1 && ring_reduces(s) && a.sends_pending != before) a.busy[ring_guard(s)] = 1;
  }
}

}  // namespace ami::coll
