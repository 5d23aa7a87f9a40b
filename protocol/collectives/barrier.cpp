// protocol/collectives/barrier.cpp — the barrier: in round k each rank
// tells one rank and waits to hear from one, and after ceil(log2 n) rounds
// every rank has heard, directly or not, from all. Which ranks (fixed with
// the geometry, in to and from): for a power of two, pairwise exchange
// (rank xor 2^k both ways), whose first rounds stay inside a node when
// tasks are placed on nodes in blocks, so a barrier across nodes crosses
// once, not in every round; for other sizes, dissemination (tell rank +
// 2^k, hear from rank - 2^k), which needs no extra rounds to fold the
// ranks beyond a power of two.
//
// The control structure is two bit vectors, one bit per round: what came
// for the current barrier and what came for the next one. A peer can be at
// most one barrier ahead (it cannot finish the next before this task has
// entered it), so these two hold every early arrival; a message for an
// older barrier is stale, and one beyond the next or a round heard twice is
// malformed: both are counted and dropped.
//
// A member that fails: a barrier still waiting for a round from it fails,
// and sends all its remaining rounds at once marked failed (root =
// kBarrierFailed); a member receiving such a round fails its barrier too and
// does the same, so within the rounds every living member hears of it and
// none waits for a round a failed barrier will never send. A barrier that
// has all it needs from the dead member (it finished the barrier and then
// exited, the way a job ends) completes as usual.
#include "engine.hpp"

namespace ami::coll {

Status GeometryImpl::barrier(Callback done) {
  CallScope scope(engine);
  if (Status s = begin(barrier_, done, "barrier: a barrier is in flight on this geometry already"); !s.ok())
    return s;
  barrier_.sent = 0;
  barrier_progress();
  return Status::success();
}

// A round carries nothing; barriers keep no records, so every round, for
// whichever barrier, goes to barrier_arrival().
void GeometryImpl::barrier_message(const Header& h, std::uint32_t origin, const Incoming& in, Receive* recv) {
  if (recv != nullptr || !in.payload.empty()) {
    malformed(recv);
    return;
  }
  barrier_arrival(h, origin);
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
  if (h.root == kBarrierFailed) {
    // A later call on the geometry is refused; the barrier this one is for
    // fails (the one before it, here still running, is whole).
    if (failure_.ok()) failure_ = {StatusCode::peer_failed, "collective: a task of the geometry failed"};
    if (bits == &b.current) b.fail(failure_);
  }
  if (b.active && bits == &b.current) barrier_progress();
}

void GeometryImpl::barrier_member_failed(std::uint32_t dead, Status reason) {
  BarrierState& b = barrier_;
  if (!b.active || !b.result.ok() || !barrier_waits_on(dead)) return;
  b.fail(reason);
  barrier_progress();
}

bool GeometryImpl::barrier_waits_on(std::uint32_t dead) const {
  const BarrierState& b = barrier_;
  for (std::uint32_t k = 0; k < b.rounds; ++k)
    if (b.from[k] == dead && ((b.current >> k) & 1) == 0) return true;
  return false;
}

// Sends every round whose predecessor has been heard; done once every
// round has been heard.
void GeometryImpl::barrier_progress() {
  BarrierState& b = barrier_;
  while (b.sent < b.rounds && (!b.result.ok() || b.sent == 0 || ((b.current >> (b.sent - 1)) & 1) != 0)) {
    if (!b.result.ok()) b.proto.root = kBarrierFailed;  // the rest, at once, marked
    const std::uint32_t k = b.sent++;
    (void)send(b, b.to[k], static_cast<std::uint16_t>(k), {}, 0);  // a refusal fails b
  }
  const std::uint64_t all = (std::uint64_t{1} << b.rounds) - 1;
  if (b.result.ok() && !(b.sent == b.rounds && b.current == all)) return;
  b.current = b.next;  // the next barrier's early arrivals become the current ones
  b.next = 0;
  b.sent = 0;
  engine.finish(b);
}

}  // namespace ami::coll
