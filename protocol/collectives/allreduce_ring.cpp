// protocol/collectives/allreduce_ring.cpp — allreduce of large data as a
// ring: a reduce-scatter (steps 0..n-2) and then an allgather (steps
// n-1..2n-3) over n blocks of the data. At step s a rank sends block
// rank - s to rank + 1 and takes block rank - s - 1 from rank - 1; after
// the reduce-scatter it holds block rank + 1 complete, and the allgather
// passes the complete blocks on. Every rank moves 2 (n - 1) / n of the
// data, whatever n is.
//
// Every block arrives straight into its place in the caller's recv: in
// the reduce-scatter it is combined there with this task's own block
// (from the packet or piece by piece when small, in place once the
// rendezvous has put it there when large), in the allgather it is final.
// One hazard is guarded: a block this rank is still sending from recv
// (the reduce-scatter forwards what it combined) is not overwritten by the
// allgather's copy of it until that send is complete; the arrival waits in
// a record (or at its sender) meanwhile.
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

// The block step sends (sending) or takes.
std::uint32_t GeometryImpl::ring_block_of(std::uint16_t step, bool sending) const {
  return topology::ring_block(rank, size, std::uint64_t{step} + (sending ? 0 : 1));
}

bool GeometryImpl::ring_reduces(std::uint16_t step) const { return step + 1u < size; }

// An allgather step's block may be written once no send reads it.
bool GeometryImpl::ring_may_place(std::uint16_t step) const {
  return ring_reduces(step) || allreduce_.busy[ring_block_of(step, false)] == 0;
}

// Whole data of step s into its place: combined with this task's block in
// the reduce-scatter, copied in the allgather.
void GeometryImpl::ring_place(std::uint16_t s, const std::byte* data) {
  AllreduceState& a = allreduce_;
  const std::uint32_t b = ring_block_of(s, false);
  std::byte* dst = a.recv + ring_offset(b);
  if (ring_reduces(s))
    combine(a.type, a.op, dst, a.send + ring_offset(b), data, ring_bytes(b) / size_of(a.type));
  else if (ring_bytes(b) != 0)
    std::memcpy(dst, data, ring_bytes(b));
  a.arrived[s] = kDone;
}

void GeometryImpl::ring_data(const Header& h, const Incoming& in, Receive* recv) {
  AllreduceState& a = allreduce_;
  const std::uint16_t s = h.step;
  const std::uint32_t b = ring_block_of(s, false);
  if (!ring_may_place(s)) {  // this rank still sends the block from recv
    Arrival* r = engine.keep(h, members.task(topology::ring_prev(rank, size)), in, recv, true);
    if (r == nullptr) {
      a.fail({StatusCode::no_resource, "allreduce: no memory for an early block"});
    } else {
      r->origin = topology::ring_prev(rank, size);
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
  std::byte* dst = a.recv + ring_offset(b);
  recv->done = Engine::received_callback(a.tag(static_cast<std::uint32_t>(a.tags.size() / 2 + s)));
  ++a.streaming;
  if (ring_reduces(s) && in.total_bytes <= engine.eager_max) {
    a.pieces.start(a.type, a.op, dst, a.send + ring_offset(b));
    recv->piece = &Engine::on_piece;
    recv->piece_cookie = &a.pieces;
    a.arrived[s] = kPiece;
    return;
  }
  recv->buffer = dst;  // large: by the rendezvous straight into place
  a.arrived[s] = kRaw;
}

// A step's data is in its place: a reduce-scatter block is combined there
// with this task's, in place.
void GeometryImpl::ring_received(std::uint16_t s) {
  AllreduceState& a = allreduce_;
  if (ring_reduces(s)) {
    const std::uint32_t b = ring_block_of(s, false);
    std::byte* dst = a.recv + ring_offset(b);
    combine(a.type, a.op, dst, a.send + ring_offset(b), dst, ring_bytes(b) / size_of(a.type));
  }
  a.arrived[s] = kDone;
}

void GeometryImpl::ring_sent(std::uint32_t index) {
  AllreduceState& a = allreduce_;
  if (index < a.tags.size() / 2 && index >= 1 && ring_reduces(static_cast<std::uint16_t>(index)))
    a.busy[ring_block_of(static_cast<std::uint16_t>(index), true)] = 0;
}

// Sends every step whose block is complete here, in order.
void GeometryImpl::ring_progress() {
  AllreduceState& a = allreduce_;
  const auto steps = static_cast<std::uint32_t>(a.arrived.size());
  while (a.ring_sent < steps) {
    const auto s = static_cast<std::uint16_t>(a.ring_sent);
    if (s > 0 && a.arrived[s - 1] != kDone) return;
    const std::uint32_t b = ring_block_of(s, true);
    const std::byte* src = (s == 0 ? a.send : a.recv) + ring_offset(b);
    const std::uint32_t before = a.sends_pending;
    ++a.ring_sent;
    if (!send(a, topology::ring_next(rank, size), s, {src, ring_bytes(b)}, s)) return;
    if (s >= 1 && ring_reduces(s) && a.sends_pending != before) a.busy[b] = 1;
  }
}

}  // namespace ami::coll
