// protocol/collectives/reduce.cpp — reduce up a binomial tree. Each rank
// combines its children's contributions into an accumulator (the root's
// recv; scratch at an inner rank; a leaf sends its own data as it is) and
// sends the result to its parent once every child is in.
//
// Combining happens in the handler, in place, as the data arrives: a
// one-packet contribution straight from the packet; a longer one piece by
// piece as its packets come (up to AMI_COLL_EAGER_MAX), or, when the
// accumulator is still empty, received straight into it (by the
// rendezvous when large). This task's own data joins when the accumulator
// first fills, so nothing is copied to start it. Only a contribution that
// arrives while the accumulator is being filled waits in a buffer.
//
// Before the call: small contributions are kept, and those of several
// children for the same reduce are combined with one another in their
// early-arrival buffer as they come; large ones are deferred at their
// sender and accepted at the call (into the accumulator while it is empty).
#include <cstring>

#include "engine.hpp"

namespace ami::coll {

namespace {
constexpr std::uint32_t kSendTag = 0;  // receives from child i use tag 1 + i

bool overlap(const void* a, const void* b, std::size_t bytes) {
  const auto* x = static_cast<const std::byte*>(a);
  const auto* y = static_cast<const std::byte*>(b);
  return bytes != 0 && x < y + bytes && y < x + bytes;
}
}  // namespace

// The argument checks reduce and allreduce share; names the call.
Status check_reduction(bool all, const void* send, const void* recv, std::size_t count, DataType type, ReduceOp op,
                       bool needs_recv) {
  if (static_cast<std::uint8_t>(type) > static_cast<std::uint8_t>(DataType::float64))
    return {StatusCode::invalid_argument, all ? "allreduce: unknown data type" : "reduce: unknown data type"};
  if (static_cast<std::uint8_t>(op) > static_cast<std::uint8_t>(ReduceOp::bor))
    return {StatusCode::invalid_argument, all ? "allreduce: unknown operator" : "reduce: unknown operator"};
  if (!allowed(type, op))
    return {StatusCode::invalid_argument, all ? "allreduce: band and bor take integer types only, not float32 or float64"
                                              : "reduce: band and bor take integer types only, not float32 or float64"};
  if (count > (std::size_t{1} << 40))
    return {StatusCode::invalid_argument, all ? "allreduce: count is too large" : "reduce: count is too large"};
  const std::size_t bytes = count * size_of(type);
  if (send == nullptr && bytes != 0)
    return {StatusCode::invalid_argument,
            all ? "allreduce: send is null but count is not zero" : "reduce: send is null but count is not zero"};
  if (needs_recv && recv == nullptr && bytes != 0)
    return {StatusCode::invalid_argument,
            all ? "allreduce: recv is null but count is not zero" : "reduce: recv is null at the root"};
  if (needs_recv && send != recv && overlap(send, recv, bytes))
    return {StatusCode::invalid_argument, all ? "allreduce: send and recv overlap without being the same buffer"
                                              : "reduce: send and recv overlap without being the same buffer"};
  return Status::success();
}

Status GeometryImpl::reduce(std::uint32_t root, const void* send, void* recv, std::size_t count, DataType type,
                            ReduceOp op, Callback done) {
  CallScope scope(engine);
  if (root >= size) return {StatusCode::invalid_argument, "reduce: root is not a rank of the geometry"};
  if (Status s = check_reduction(false, send, recv, count, type, op, rank == root); !s.ok()) return s;
  ReduceState& r = reduce_;
  if (Status s = begin(r, done, "reduce: a reduce is in flight on this geometry already"); !s.ok()) return s;
  r.tree = topology::Tree{size, root};
  r.send = static_cast<const std::byte*>(send);
  r.recv = static_cast<std::byte*>(recv);
  r.count = count;
  r.type = type;
  r.op = op;
  r.bytes = count * size_of(type);
  r.proto.root = root;
  r.proto.type = type;
  r.proto.op = op;
  reduce_start();
  return Status::success();
}

void GeometryImpl::reduce_start() {
  ReduceState& r = reduce_;
  r.children = r.tree.child_count(rank);
  r.heard = r.combined = r.piecewise = 0;
  r.streaming = 0;
  r.filler = -1;
  r.sent_up = false;
  r.own_in = false;
  r.acc = nullptr;
  r.acc_state = ReduceState::Acc::empty;
  if (rank == r.tree.root) {
    r.acc = r.recv;
    if (r.recv == r.send) {  // in place: the accumulator starts with this task's data
      r.acc_state = ReduceState::Acc::full;
      r.own_in = true;
    }
  } else if (r.children != 0) {
    r.scratch = engine.buffers.acquire(r.bytes);
    if (!r.scratch) r.fail({StatusCode::no_resource, "reduce: no memory for the partial result"});
    r.acc = r.scratch.data;
  }
  ArrivalList early = take_early(r);
  for (Arrival* a = early.head; a != nullptr;) {
    Arrival* next = a->next;
    reduce_take(a);
    a = next;
  }
  reduce_drain();
  reduce_check();
}

// Is h from origin a contribution this reduce expects? child: its index.
// Members that disagree on the arguments fail the reduce.
bool GeometryImpl::reduce_matches(const Header& h, std::uint32_t origin, std::size_t bytes, int& child) {
  ReduceState& r = reduce_;
  child = r.tree.child_index(rank, origin);
  if (child < 0) {
    ++engine.stats.malformed;
    return false;
  }
  if (h.root != r.tree.root || h.type != r.type || h.op != r.op || bytes != r.bytes) {
    ++engine.stats.malformed;
    r.fail({StatusCode::invalid_argument, "reduce: the members' root, count, type or op do not match"});
    return false;
  }
  return true;
}

// Before the call: a one-packet contribution combined into an earlier one
// for the same reduce, in its early-arrival buffer. False when there is
// none to join.
bool GeometryImpl::reduce_merge(const Header& h, std::uint32_t origin, const Incoming& in, Receive* recv) {
  if (recv != nullptr || h.root >= size) return false;
  const int child = topology::Tree{size, h.root}.child_index(rank, origin);
  const std::size_t element = size_of(h.type);
  const std::size_t bytes = in.payload.size();
  if (child < 0 || element == 0 || bytes % element != 0 || !allowed(h.type, h.op)) return false;
  const std::uint64_t bit = std::uint64_t{1} << child;
  for (Arrival* a = early_.head; a != nullptr; a = a->next) {
    const Header& k = a->header;
    if (k.kind != Kind::reduce || k.seq != h.seq || k.root != h.root || k.type != h.type || k.op != h.op ||
        a->state != Arrival::State::ready || a->bytes != bytes || a->contributors == 0 ||
        (a->contributors & bit) != 0 || (bytes != 0 && !a->buffer))
      continue;
    combine(h.type, h.op, a->buffer.data, a->buffer.data, in.payload.data(), bytes / element);
    a->contributors |= bit;
    ++engine.stats.early_merged;
    ++engine.stats.early_arrivals;
    return true;
  }
  return false;
}

void GeometryImpl::reduce_take(Arrival* a) {
  ReduceState& r = reduce_;
  int child = -1;
  if (!reduce_matches(a->header, a->origin, a->bytes, child) || (r.heard & a->contributors) != 0 ||
      !r.result.ok()) {
    engine.discard(a);
    return;
  }
  r.heard |= a->contributors;
  switch (a->state) {
    case Arrival::State::ready: r.waiting.push(a); break;  // combined by reduce_drain()
    case Arrival::State::receiving:
      a->owner = &r;
      r.waiting.push(a);
      ++r.streaming;
      break;
    case Arrival::State::deferred: {
      Status s;
      if (r.acc_state == ReduceState::Acc::empty) {  // straight into the accumulator
        s = engine.context.accept(a->deferred, r.acc, Engine::received_callback(r.tag(1 + child)));
        if (s.ok()) {
          r.acc_state = ReduceState::Acc::filling;
          r.filler = child;
          ++r.streaming;
        }
        engine.release(a);
      } else {  // into a buffer of its own, combined once in
        a->buffer = engine.buffers.acquire(r.bytes);
        s = a->buffer ? engine.context.accept(a->deferred, a->buffer.data, Engine::kept_callback(a))
                      : Status{StatusCode::no_resource, "reduce: no memory for a child's contribution"};
        if (s.ok()) {
          a->state = Arrival::State::receiving;
          a->owner = &r;
          r.waiting.push(a);
          ++r.streaming;
        } else {
          engine.discard(a);
        }
      }
      if (!s.ok()) r.fail(s);
      break;
    }
  }
}

void GeometryImpl::reduce_data(const Header& h, std::uint32_t origin, const Incoming& in, Receive* recv) {
  ReduceState& r = reduce_;
  int child = -1;
  if (!reduce_matches(h, origin, in.total_bytes, child) || !r.result.ok()) {
    reduce_check();
    return;
  }
  const std::uint64_t mine = std::uint64_t{1} << child;
  if ((r.heard & mine) != 0) {
    malformed(recv);
    return;
  }
  r.heard |= mine;
  if (recv == nullptr) {
    if (r.acc_state == ReduceState::Acc::filling) {  // waits until the accumulator is full
      Arrival* a = engine.keep(h, members.task(origin), in, nullptr, false);
      if (a == nullptr) {
        r.fail({StatusCode::no_resource, "reduce: no memory for a child's contribution"});
      } else {
        a->contributors = mine;
        r.waiting.push(a);
      }
    } else {
      reduce_fill(in.payload.data());
      r.combined |= mine;
      ++engine.stats.combined_in_handler;
    }
    reduce_check();
    return;
  }
  recv->done = Engine::received_callback(r.tag(1 + child));
  if (r.acc_state == ReduceState::Acc::empty) {  // straight into the accumulator
    recv->buffer = r.acc;
    r.acc_state = ReduceState::Acc::filling;
    r.filler = child;
    ++r.streaming;
    return;
  }
  if (r.acc_state == ReduceState::Acc::full && in.total_bytes <= engine.eager_max) {  // combined as it comes
    r.pieces[child].start(r.type, r.op, r.acc, r.acc);
    recv->piece = &Engine::on_piece;
    recv->piece_cookie = &r.pieces[child];
    r.piecewise |= mine;
    ++r.streaming;
    return;
  }
  // Into a buffer of its own, combined once it is in and the accumulator is full.
  recv->done = {};
  Arrival* a = engine.keep(h, members.task(origin), in, recv, false);
  if (a == nullptr) {
    r.fail({StatusCode::no_resource, "reduce: no memory for a child's contribution"});
    return;
  }
  a->origin = origin;
  a->contributors = mine;
  a->owner = &r;
  r.waiting.push(a);
  ++r.streaming;
}

// A contribution into the accumulator: the first fills it (and this task's
// own data joins then), later ones are combined into it.
void GeometryImpl::reduce_fill(const std::byte* data) {
  ReduceState& r = reduce_;
  if (r.acc_state == ReduceState::Acc::empty) {
    if (r.bytes != 0) std::memcpy(r.acc, data, r.bytes);
    r.acc_state = ReduceState::Acc::full;
  } else {
    combine(r.type, r.op, r.acc, r.acc, data, r.count);
  }
  if (!r.own_in) {
    combine(r.type, r.op, r.acc, r.acc, r.send, r.count);
    r.own_in = true;
  }
}

// Combines every kept contribution that is complete, once the accumulator
// can take them.
void GeometryImpl::reduce_drain() {
  ReduceState& r = reduce_;
  if (r.acc_state == ReduceState::Acc::filling) return;
  ArrivalList ready;
  r.waiting.take([](const Arrival& a) { return a.state == Arrival::State::ready; }, ready);
  for (Arrival* a = ready.head; a != nullptr;) {
    Arrival* next = a->next;
    if (a->status.ok() && r.result.ok()) {
      reduce_fill(a->buffer.data);
      r.combined |= a->contributors;
    } else {
      r.fail(a->status);
    }
    engine.release(a);
    a = next;
  }
}

void GeometryImpl::reduce_received(std::uint32_t index, Status s) {
  ReduceState& r = reduce_;
  const int child = static_cast<int>(index) - 1;
  const std::uint64_t mine = std::uint64_t{1} << child;
  --r.streaming;
  if (!s.ok()) {
    r.fail(s);
  } else if (child == r.filler) {  // the accumulator is full: its own data and the waiting ones join
    r.filler = -1;
    r.acc_state = ReduceState::Acc::full;
    r.combined |= mine;
    if (!r.own_in) {
      combine(r.type, r.op, r.acc, r.acc, r.send, r.count);
      r.own_in = true;
    }
  } else if ((r.piecewise & mine) != 0) {
    r.combined |= mine;
    ++engine.stats.combined_in_handler;
  }
  reduce_drain();
  reduce_check();
}

void GeometryImpl::reduce_kept(Arrival&) {
  --reduce_.streaming;
  reduce_drain();
  reduce_check();
}

// Once every child is combined: this task's own data if no child brought
// the accumulator to life, then the result goes up (or stays, at the root).
void GeometryImpl::reduce_check() {
  ReduceState& r = reduce_;
  const std::uint64_t all = (std::uint64_t{1} << r.children) - 1;
  if (r.result.ok() && r.combined != all) return;
  if (r.result.ok() && !r.own_in && r.acc != nullptr) {  // no child brought the accumulator to life
    if (r.bytes != 0) std::memcpy(r.acc, r.send, r.bytes);
    r.acc_state = ReduceState::Acc::full;
    r.own_in = true;
  }
  if (r.result.ok() && rank != r.tree.root && !r.sent_up) {
    r.sent_up = true;
    const std::byte* data = r.children == 0 ? r.send : r.acc;
    (void)send(r, r.tree.parent(rank), 0, {data, r.bytes}, kSendTag);
  }
  if (r.sends_pending != 0 || r.streaming != 0) return;
  for (Arrival* a = r.waiting.head; a != nullptr;) {  // (only after a failure)
    Arrival* next = a->next;
    engine.discard(a);
    a = next;
  }
  r.waiting = ArrivalList{};
  engine.buffers.release(r.scratch);
  engine.finish(r);
}

}  // namespace ami::coll
