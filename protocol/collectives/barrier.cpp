// protocol/collectives/barrier.cpp — the dissemination barrier: in round k
// each rank tells rank + 2^k and waits to hear from rank - 2^k; after
// ceil(log2 n) rounds every rank has heard, directly or not, from all.
//
// The control structure is two bit vectors, one bit per round: what came
// for the current barrier and what came for the next one. A peer can be at
// most one barrier ahead (it cannot finish the next before this task has
// entered it), so these two hold every early arrival; a message for an
// older barrier is stale, and one beyond the next or a round heard twice is
// malformed: both are counted and dropped.
#include "protocol/collectives/engine.hpp"

namespace ami::coll {

Status GeometryImpl::barrier(Callback done) {
  CallScope scope(engine);
  if (Status s = begin(barrier_, done, "barrier: a barrier is in flight on this geometry already"); !s.ok())
    return s;
  barrier_.sent = 0;
  barrier_progress();
  return Status::success();
}

void GeometryImpl::barrier_arrival(const Header& h, std::uint32_t origin) {
  BarrierState& b = barrier_;
  if (h.step >= b.rounds || origin != b.from[h.step]) {
    ++engine.stats.malformed;
    return;
  }
  if (seq_diff(h.seq, b.seq) < 0) {
    ++engine.stats.stale;
    return;
  }
  const std::uint64_t bit = std::uint64_t{1} << h.step;
  std::uint64_t* bits = h.seq == b.seq ? &b.current : h.seq == b.seq + 1u ? &b.next : nullptr;
  if (bits == nullptr || (*bits & bit) != 0) {
    ++engine.stats.malformed;
    return;
  }
  *bits |= bit;
  if (bits == &b.next || !b.active) ++engine.stats.early_arrivals;
  if (b.active && bits == &b.current) barrier_progress();
}

// Sends every round whose predecessor has been heard; done once every
// round has been heard.
void GeometryImpl::barrier_progress() {
  BarrierState& b = barrier_;
  while (b.result.ok() && b.sent < b.rounds && (b.sent == 0 || ((b.current >> (b.sent - 1)) & 1) != 0)) {
    if (!send(b, b.to[b.sent], static_cast<std::uint16_t>(b.sent), {}, 0)) break;
    ++b.sent;
  }
  const std::uint64_t all = (std::uint64_t{1} << b.rounds) - 1;
  if (b.result.ok() && !(b.sent == b.rounds && b.current == all)) return;
  b.current = b.next;  // the next barrier's early arrivals become the current ones
  b.next = 0;
  b.sent = 0;
  engine.finish(b);
}

}  // namespace ami::coll
