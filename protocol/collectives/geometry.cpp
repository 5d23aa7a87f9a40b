// protocol/collectives/geometry.cpp — what every kind of collective shares
// on a geometry: starting an operation, its messages' headers and sends,
// and routing an arrival to the operation in flight, to the early list, or
// away (stale, malformed).
#include <cstring>

#include "protocol/collectives/engine.hpp"

namespace ami::coll {

namespace {

void init(Operation& op, Kind kind, GeometryImpl* g, std::size_t tags) {
  op.kind = kind;
  op.geometry = g;
  op.tags.resize(tags);
  for (std::size_t i = 0; i < tags; ++i) op.tags[i] = Tag{&op, static_cast<std::uint32_t>(i)};
}

}  // namespace

GeometryImpl::GeometryImpl(Engine& engine, std::uint32_t id, std::vector<std::uint32_t> tasks,
                           std::uint32_t job_size)
    : engine(engine),
      id(id),
      tasks(std::move(tasks)),
      rank_of(job_size, kNotMember),
      size(static_cast<std::uint32_t>(this->tasks.size())),
      rank([&] {
        for (std::uint32_t r = 0; r < this->tasks.size(); ++r)
          if (this->tasks[r] == engine.task) return r;
        return kNotMember;
      }()) {
  for (std::uint32_t r = 0; r < size; ++r) rank_of[this->tasks[r]] = r;
  const std::size_t steps = std::max<std::size_t>(2 * std::size_t{size}, topology::Doubling{size}.steps() + 2);
  init(barrier_, Kind::barrier, this, 0);
  init(broadcast_, Kind::broadcast, this, ReduceState::kMaxChildren + 1);
  init(reduce_, Kind::reduce, this, ReduceState::kMaxChildren + 1);
  init(allreduce_, Kind::allreduce, this, 2 * steps);
  init(allgather_, Kind::allgather, this, 2 * std::size_t{size});
  barrier_.rounds = topology::rounds(size);
  for (std::uint32_t k = 0; k < barrier_.rounds; ++k) {
    barrier_.to.push_back(topology::dissemination_to(rank, size, k));
    barrier_.from.push_back(topology::dissemination_from(rank, size, k));
  }
  const topology::Doubling d{size};
  allreduce_.steps = d.steps();
  allreduce_.extra = d.extra(rank);
  allreduce_.folds = d.folds(rank);
  allreduce_.partner.assign(d.steps() + 1, 0);
  if (!allreduce_.extra)
    for (std::uint32_t k = 1; k <= d.steps(); ++k) allreduce_.partner[k] = d.partner(rank, k);
  allreduce_.arrived.reserve(steps);
  allreduce_.kept.reserve(steps);
  allreduce_.busy.reserve(size);
  allgather_.arrived.reserve(size);
  allgather_.kept.reserve(size);
  for (std::uint32_t t : this->tasks)  // a member that failed before the geometry was made here
    if (Status s = engine.context.peer_status({t, engine.context.index()}); s == StatusCode::peer_failed)
      member_failed(t, s);
}

Operation& GeometryImpl::operation(Kind kind) {
  switch (kind) {
    case Kind::barrier: return barrier_;
    case Kind::broadcast: return broadcast_;
    case Kind::reduce: return reduce_;
    case Kind::allreduce: return allreduce_;
    case Kind::allgather: return allgather_;
  }
  return barrier_;
}

Status GeometryImpl::begin(Operation& op, Callback done, const char* busy) {
  if (!failure_.ok()) return failure_;
  // In a child forked from this Client's process every call on the context
  // is refused; say so here rather than start an operation that never ends.
  if (Status s = engine.context.peer_status({engine.task, engine.context.index()});
      s == StatusCode::not_supported)
    return s;
  if (op.active || op.done_posted) return {StatusCode::no_resource, busy};
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
  Status s = engine.send(tasks[to], h, payload, payload.empty() ? nullptr : op.tag(tag));
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
  if (h.kind == Kind::barrier) {
    if (recv != nullptr || !in.payload.empty()) {
      malformed(recv);
      return;
    }
    barrier_arrival(h, origin);
    return;
  }
  Operation& op = operation(h.kind);
  if (seq_diff(h.seq, op.seq) < 0) {  // an operation that is over here: the sender is wrong
    ++engine.stats.stale;
    return;
  }
  if (!op.active || h.seq != op.seq) {
    keep_early(h, origin, in, recv);
    return;
  }
  switch (h.kind) {
    case Kind::broadcast: broadcast_data(h, origin, in, recv); break;
    case Kind::reduce: reduce_data(h, origin, in, recv); break;
    case Kind::allreduce: allreduce_data(h, origin, in, recv); break;
    case Kind::allgather: allgather_data(h, origin, in, recv); break;
    case Kind::barrier: break;
  }
}

// A peer is in a later operation than this task: keep what it sent until
// the call (small: a buffer from the pool; large: deferred at the sender).
void GeometryImpl::keep_early(const Header& h, std::uint32_t origin, const Incoming& in, Receive* recv) {
  if (h.kind == Kind::reduce && reduce_merge(h, origin, in, recv)) return;
  Arrival* a = engine.keep(h, tasks[origin], in, recv, true);
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
  const std::uint32_t origin = rank_of[a->origin_task];
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

void GeometryImpl::on_sent(Operation& op, std::uint32_t index) {
  switch (op.kind) {
    case Kind::broadcast: broadcast_check(); break;
    case Kind::reduce: reduce_check(); break;
    case Kind::allreduce: allreduce_sent(index); break;
    case Kind::allgather: allgather_progress(); break;
    case Kind::barrier: break;
  }
}

void GeometryImpl::on_received(Operation& op, std::uint32_t index, Status s) {
  switch (op.kind) {
    case Kind::broadcast: broadcast_received(s); break;
    case Kind::reduce: reduce_received(index, s); break;
    case Kind::allreduce: allreduce_received(index, s); break;
    case Kind::allgather: allgather_received(index, s); break;
    case Kind::barrier: break;
  }
}

void GeometryImpl::member_failed(std::uint32_t task, Status why) {
  if (task >= rank_of.size() || rank_of[task] == kNotMember) return;
  const std::uint32_t dead = rank_of[task];
  if (failure_.ok()) failure_ = {StatusCode::peer_failed, "collective: a task of the geometry failed"};
  const Status reason = why.ok() ? failure_ : why;
  // A barrier fails only if it still waits for the dead member (see
  // barrier.cpp); a collective with data fails outright. Each kind's check
  // ends a failed operation once nothing of it is in flight (what was in
  // flight to or from the dead task has failed already).
  if (barrier_.active && barrier_.result.ok() && barrier_waits_on(dead)) {
    barrier_.fail(reason);
    barrier_progress();
  }
  for (Operation* op : {static_cast<Operation*>(&broadcast_), static_cast<Operation*>(&reduce_),
                        static_cast<Operation*>(&allreduce_), static_cast<Operation*>(&allgather_)}) {
    if (!op->active) continue;
    op->fail(reason);
    switch (op->kind) {
      case Kind::broadcast: broadcast_check(); break;
      case Kind::reduce: reduce_check(); break;
      case Kind::allreduce: allreduce_check(); break;
      case Kind::allgather: allgather_progress(); break;
      case Kind::barrier: break;
    }
  }
}

void GeometryImpl::on_kept_ready(Arrival& a) {
  switch (a.owner->kind) {
    case Kind::broadcast: broadcast_kept(a); break;
    case Kind::reduce: reduce_kept(a); break;
    case Kind::allreduce: allreduce_kept(a); break;
    case Kind::allgather: allgather_kept(a); break;
    case Kind::barrier: break;
  }
}

}  // namespace ami::coll
