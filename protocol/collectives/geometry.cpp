// protocol/collectives/geometry.cpp — what every kind of collective shares
// on a geometry: starting an operation, its messages' headers and sends,
// and routing an arrival to the operation in flight, to the early list, or
// away (stale, malformed). Each event goes to the row of its operation's
// kind in kAlgorithms; the geometry itself names no kind.
#include <cassert>
#include <cstring>

#include "engine.hpp"

namespace ami::coll {

namespace {

void init(Operation& op, Kind kind, GeometryImpl* g, std::size_t tags) {
  op.kind = kind;
  op.geometry = g;
  op.min_tags = static_cast<std::uint32_t>(tags);
}

// Every row is at its kind's index (the array fills a missing row with
// Kind 0, which this refuses too).
consteval bool in_order(const std::array<Algorithm, kKinds>& rows) {
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (static_cast<std::size_t>(rows[i].kind) != i) return false;
  return true;
}

// And names every event's function. (Not a constant expression in every
// build: the sanitizers' cannot compare a function's address with nullptr
// while compiling. Checked with assert() as each geometry is made, so any
// test of a collective finds a row left short.)
[[maybe_unused]] bool complete(const Algorithm& a) {
  return a.state != nullptr && a.arrival != nullptr && a.sent != nullptr && a.received != nullptr &&
         a.kept != nullptr && a.member_failed != nullptr;
}

}  // namespace

template <auto State>
Operation& GeometryImpl::state_of(GeometryImpl& g) {
  return g.*State;
}

template <void (GeometryImpl::*Check)()>
void GeometryImpl::then(std::uint32_t) {
  (this->*Check)();
}

template <auto State, void (GeometryImpl::*Check)()>
void GeometryImpl::fail_active(std::uint32_t, Status reason) {
  Operation& op = this->*State;
  if (!op.active) return;
  op.fail(reason);
  (this->*Check)();
}

// Adding a kind: its state, its functions and a row here, at the kind's
// index (in_order() and complete() refuse a row out of place, missing or
// short).
constexpr std::array<Algorithm, kKinds> GeometryImpl::kAlgorithms{{
    {.kind = Kind::barrier,
     .state = &state_of<&GeometryImpl::barrier_>,
     .arrival = &GeometryImpl::barrier_message,
     .sent = &GeometryImpl::never<std::uint32_t>,
     .received = &GeometryImpl::never<std::uint32_t, Status>,
     .kept = &GeometryImpl::never<Arrival&>,
     .member_failed = &GeometryImpl::barrier_member_failed},
    {.kind = Kind::broadcast,
     .state = &state_of<&GeometryImpl::broadcast_>,
     .arrival = &GeometryImpl::route<&GeometryImpl::broadcast_, &GeometryImpl::broadcast_data>,
     .sent = &GeometryImpl::then<&GeometryImpl::broadcast_check>,
     .received = &GeometryImpl::broadcast_received,
     .kept = &GeometryImpl::broadcast_kept,
     .member_failed = &GeometryImpl::fail_active<&GeometryImpl::broadcast_, &GeometryImpl::broadcast_check>},
    {.kind = Kind::reduce,
     .state = &state_of<&GeometryImpl::reduce_>,
     .arrival = &GeometryImpl::route<&GeometryImpl::reduce_, &GeometryImpl::reduce_data>,
     .sent = &GeometryImpl::then<&GeometryImpl::reduce_check>,
     .received = &GeometryImpl::reduce_received,
     .kept = &GeometryImpl::reduce_kept,
     .member_failed = &GeometryImpl::fail_active<&GeometryImpl::reduce_, &GeometryImpl::reduce_check>},
    {.kind = Kind::allreduce,
     .state = &state_of<&GeometryImpl::allreduce_>,
     .arrival = &GeometryImpl::route<&GeometryImpl::allreduce_, &GeometryImpl::allreduce_data>,
     .sent = &GeometryImpl::allreduce_sent,
     .received = &GeometryImpl::allreduce_received,
     .kept = &GeometryImpl::allreduce_kept,
     .member_failed = &GeometryImpl::fail_active<&GeometryImpl::allreduce_, &GeometryImpl::allreduce_check>},
    {.kind = Kind::allgather,
     .state = &state_of<&GeometryImpl::allgather_>,
     .arrival = &GeometryImpl::route<&GeometryImpl::allgather_, &GeometryImpl::allgather_data>,
     .sent = &GeometryImpl::then<&GeometryImpl::allgather_progress>,
     .received = &GeometryImpl::allgather_received,
     .kept = &GeometryImpl::allgather_kept,
     .member_failed = &GeometryImpl::fail_active<&GeometryImpl::allgather_, &GeometryImpl::allgather_progress>},
}};

GeometryImpl::GeometryImpl(Engine& engine, std::uint32_t id, Members members)
    : engine(engine),
      id(id),
      members(std::move(members)),
      size(this->members.size()),
      rank(this->members.rank(engine.task)) {
  // Nothing here is sized by the members but the barrier's rounds and the
  // doubling's partners (logarithmic): what a collective of many steps
  // keeps by step (tags, arrivals) is made by its first call. An allreduce
  // by doubling needs tags for its steps; a ring, more (allreduce()).
  init(barrier_, Kind::barrier, this, 0);
  init(broadcast_, Kind::broadcast, this, ReduceState::kMaxChildren + 1);
  init(reduce_, Kind::reduce, this, ReduceState::kMaxChildren + 1);
  init(allreduce_, Kind::allreduce, this, 2 * (std::size_t{topology::Doubling{size}.steps()} + 2));
  init(allgather_, Kind::allgather, this, 2 * std::size_t{size});
  static_assert(in_order(kAlgorithms), "every collective kind needs a row in kAlgorithms, in Kind order");
  for (const Algorithm& a : kAlgorithms) {
    assert(complete(a));
    a.state(*this).algorithm = &a;
  }
  barrier_.rounds = topology::rounds(size);
  const bool pairwise = std::has_single_bit(size);  // a power of two: exchanges, not dissemination
  for (std::uint32_t k = 0; k < barrier_.rounds; ++k) {
    barrier_.to.push_back(pairwise ? topology::Halving::partner(rank, k) : topology::dissemination_to(rank, size, k));
    barrier_.from.push_back(pairwise ? barrier_.to.back() : topology::dissemination_from(rank, size, k));
  }
  const topology::Doubling d{size};
  allreduce_.steps = d.steps();
  allreduce_.extra = d.extra(rank);
  allreduce_.folds = d.folds(rank);
  allreduce_.partner.assign(d.steps() + 1, 0);
  if (!allreduce_.extra)
    for (std::uint32_t k = 1; k <= d.steps(); ++k) allreduce_.partner[k] = d.partner(rank, k);
  for (std::uint32_t r = 0; r < size; ++r) {  // a member that failed before the geometry was made here
    const std::uint32_t t = this->members.task(r);
    if (Status s = engine.context.peer_status({t, engine.context.index()}); s == StatusCode::peer_failed)
      member_failed(t, s);
  }
}

Status GeometryImpl::begin(Operation& op, Callback done, const char* busy) {
  if (!failure_.ok()) return failure_;
  // In a child forked from this Client's process every call on the context
  // is refused; say so here rather than start an operation that never ends.
  if (Status s = engine.context.peer_status({engine.task, engine.context.index()});
      s == StatusCode::not_supported)
    return s;
  if (op.active || op.done_posted) return {StatusCode::no_resource, busy};
  op.need_tags(op.min_tags);
  op.active = true;
  op.done = done;
  op.result = Status::success();
  op.sends_pending = 0;
  op.proto = Header{.kind = op.kind, .geometry = id, .seq = op.seq};
  ++engine.stats.started[static_cast<std::size_t>(op.kind)];
  return Status::success();
}

bool GeometryImpl::send(Operation& op, std::uint32_t to, std::uint16_t step, std::span<const std::byte> payload,
                        std::uint32_t tag) {
  Header h = op.proto;
  h.step = step;
  // Without a payload there is nothing whose reuse must wait for the send.
  Status s = engine.send(members.task(to), h, payload, payload.empty() ? nullptr : op.tag(tag));
  if (s.ok()) return true;
  op.fail(s);
  return false;
}

ArrivalList GeometryImpl::take_early(const Operation& op) {
  ArrivalList mine;
  early_.take([&op](const Arrival& a) { return a.header.kind == op.kind && a.header.seq == op.seq; }, mine);
  return mine;
}

void GeometryImpl::malformed(Receive*) {
  // (A message of several packets is discarded by leaving recv's buffer null.)
  ++engine.stats.malformed;
}

void GeometryImpl::on_arrival(const Header& h, std::uint32_t origin, const Incoming& in, Receive* recv) {
  (this->*kAlgorithms[static_cast<std::size_t>(h.kind)].arrival)(h, origin, in, recv);  // (decode() checked kind)
}

template <auto State, void (GeometryImpl::*Data)(const Header&, std::uint32_t, const Incoming&, Receive*)>
void GeometryImpl::route(const Header& h, std::uint32_t origin, const Incoming& in, Receive* recv) {
  const Operation& op = this->*State;
  if (seq_diff(h.seq, op.seq) < 0) {  // an operation that is over here: the sender is wrong
    ++engine.stats.stale;
    return;
  }
  if (!op.active || h.seq != op.seq) {
    keep_early(h, origin, in, recv);
    return;
  }
  (this->*Data)(h, origin, in, recv);
}

// A peer is in a later operation than this task: keep what it sent until
// the call (small: a buffer from the pool; large: deferred at the sender).
void GeometryImpl::keep_early(const Header& h, std::uint32_t origin, const Incoming& in, Receive* recv) {
  if (h.kind == Kind::reduce && reduce_merge(h, origin, in, recv)) return;
  Arrival* a = engine.keep(h, members.task(origin), in, recv, true);
  if (a == nullptr) {
    malformed(recv);
    return;
  }
  a->origin = origin;
  if (h.kind == Kind::reduce) {
    const int child = topology::Tree{size, h.root % size}.child_index(rank, origin);
    if (child >= 0) a->contributors = std::uint64_t{1} << child;
  }
  early_.push(a);
  ++engine.stats.early_arrivals;
}

void GeometryImpl::discard_early() {
  for (Arrival* a = early_.head; a != nullptr;) {
    Arrival* next = a->next;
    engine.discard(a);
    a = next;
  }
  early_ = ArrivalList{};
}

void GeometryImpl::adopt(Arrival* a) {
  const std::uint32_t origin = members.rank(a->origin_task);
  if (origin == kNotMember) {
    ++engine.stats.malformed;
    engine.discard(a);
    return;
  }
  a->origin = origin;
  if (a->header.kind == Kind::barrier) {
    barrier_arrival(a->header, origin);
    engine.discard(a);
    return;
  }
  if (a->header.kind == Kind::reduce) {
    const int child = topology::Tree{size, a->header.root % size}.child_index(rank, origin);
    if (child >= 0) a->contributors = std::uint64_t{1} << child;
  }
  early_.push(a);
}

void GeometryImpl::on_sent(Operation& op, std::uint32_t index) { (this->*op.algorithm->sent)(index); }

void GeometryImpl::on_received(Operation& op, std::uint32_t index, Status s) {
  (this->*op.algorithm->received)(index, s);
}

void GeometryImpl::member_failed(std::uint32_t task, Status why) {
  const std::uint32_t dead = members.rank(task);
  if (dead == kNotMember) return;
  if (failure_.ok()) failure_ = {StatusCode::peer_failed, "collective: a task of the geometry failed"};
  const Status reason = why.ok() ? failure_ : why;
  // A barrier fails only if it still waits for the dead member (see
  // barrier.cpp); a collective with data fails outright. Each kind's check
  // ends a failed operation once nothing of it is in flight (what was in
  // flight to or from the dead task has failed already).
  for (const Algorithm& a : kAlgorithms) (this->*a.member_failed)(dead, reason);
}

void GeometryImpl::on_kept_ready(Arrival& a) { (this->*a.owner->algorithm->kept)(a); }

}  // namespace ami::coll
