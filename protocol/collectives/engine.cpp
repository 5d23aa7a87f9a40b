// protocol/collectives/engine.cpp — the Engine: construction, geometries,
// the dispatch handler, sends, kept arrivals and completions; and the
// public Collectives and Geometry in front of it.
#include "engine.hpp"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "ami/client.hpp"
#include "ami/collectives_config.hpp"
#include "ami/error.hpp"

namespace ami::coll {

namespace {

// Ring steps are numbered in 16 bits: 2 * (n - 1) of them.
constexpr std::uint32_t kMaxGeometry = 32768;

}  // namespace

Engine::Engine(Context& context, std::uint16_t dispatch)
    : context(context),
      dispatch(dispatch),
      task(context.client().task()),
      job_size(context.client().size()),
      eager_max(coll::Options::from(context.client().config()).eager_max),
      ring_min(coll::Options::from(context.client().config()).ring_min) {
  if (job_size > kMaxGeometry) throw Error("Collectives: more than 32768 tasks in the job");
  immediate_.assign(job_size, 0);
  if (Status s = context.set_dispatch(dispatch, {&Engine::on_message, this}); !s.ok())
    throw Error("Collectives: " + to_string(s));
  geometries_.push_back(std::unique_ptr<Geometry>(
      new Geometry(std::make_unique<GeometryImpl>(*this, 0, Members::first(job_size)))));
  context.watch_peer_failures({&Engine::on_peer_failed, this});
}

Engine::~Engine() {
  context.unwatch_peer_failures({&Engine::on_peer_failed, this});
  (void)context.set_dispatch(dispatch, {});
  for (auto& g : geometries_) g->impl_->discard_early();
  for (Arrival* a = orphans_.head; a != nullptr;) {
    Arrival* next = a->next;
    discard(a);
    a = next;
  }
}

GeometryImpl* Engine::find(std::uint32_t id) {
  if (id == 0) return geometries_.front()->impl_.get();  // the world, most often
  for (auto& g : geometries_)
    if (g->impl_->id == id) return g->impl_.get();
  return nullptr;
}

Status Engine::create_geometry(std::uint32_t id, std::span<const std::uint32_t> tasks, Geometry*& out) {
  out = nullptr;
  if (find(id) != nullptr)
    return {StatusCode::invalid_argument, "create_geometry: the id is taken (0 is the world's)"};
  if (tasks.empty()) return {StatusCode::invalid_argument, "create_geometry: the task list is empty"};
  if (tasks.size() > kMaxGeometry)
    return {StatusCode::invalid_argument, "create_geometry: more than 32768 tasks"};
  std::unordered_set<std::uint32_t> seen;  // (sized by the list, not by the job)
  seen.reserve(tasks.size());
  for (std::uint32_t t : tasks) {
    if (t >= job_size) return {StatusCode::invalid_argument, "create_geometry: a task is out of the job's range"};
    if (!seen.insert(t).second) return {StatusCode::invalid_argument, "create_geometry: a task is listed twice"};
  }
  if (!seen.contains(task)) return {StatusCode::invalid_argument, "create_geometry: this task is not in the list"};
  geometries_.push_back(std::unique_ptr<Geometry>(new Geometry(
      std::make_unique<GeometryImpl>(*this, id, Members(std::vector<std::uint32_t>(tasks.begin(), tasks.end()))))));
  GeometryImpl& g = *geometries_.back()->impl_;
  // What its members sent before it existed here.
  ArrivalList mine;
  orphans_.take([id](const Arrival& a) { return a.header.geometry == id; }, mine);
  for (Arrival* a = mine.head; a != nullptr;) {
    Arrival* next = a->next;
    g.adopt(a);
    a = next;
  }
  out = geometries_.back().get();
  return Status::success();
}

// The dispatch handler: every collective message of this Collectives.
void Engine::on_message(void* cookie, const Incoming& in, Receive* recv) {
  auto& e = *static_cast<Engine*>(cookie);
  ++e.stats.messages_received;
  Header h;
  if (decode(in.header, h) != HeaderError::none || in.origin.context != e.context.index() ||
      in.origin.task >= e.job_size) {
    ++e.stats.malformed;
    return;  // (a message of several packets is discarded: recv's buffer stays null)
  }
  GeometryImpl* g = e.find(h.geometry);
  if (g == nullptr) {  // a member that created it before this task did
    if (Arrival* a = e.keep(h, in.origin.task, in, recv, true)) {
      e.orphans_.push(a);
      ++e.stats.early_arrivals;
    }
    return;
  }
  const std::uint32_t origin = g->members.rank(in.origin.task);
  if (origin == GeometryImpl::kNotMember) {
    ++e.stats.malformed;
    return;
  }
  g->on_arrival(h, origin, in, recv);
}

Status Engine::send(std::uint32_t to_task, const Header& h, std::span<const std::byte> payload, Tag* tag) {
  const Endpoint dest{to_task, context.index()};
  const HeaderBytes header = encode(h);  // (send copies it at once)
  ++stats.messages_sent;
  std::uint16_t& limit = immediate_[to_task];
  if (limit == 0)  // fixed by the lane: asked once
    limit = static_cast<std::uint16_t>(std::min<std::size_t>(context.immediate_limit(dest), 0xFFFF));
  if (sizeof(Header) + payload.size() <= limit) {
    // Copied into the packet now: no local completion to wait for.
    Status s = context.send_immediate({.dest = dest, .dispatch = dispatch, .header = header, .payload = payload});
    if (s != StatusCode::no_resource) return s;
  }
  Status s = context.send({.dest = dest, .dispatch = dispatch, .header = header, .payload = payload,
                           .local_done = tag != nullptr ? sent_callback(tag) : Callback{}});
  if (s.ok() && tag != nullptr) ++tag->op->sends_pending;
  return s;
}

Arrival* Engine::keep(const Header& h, std::uint32_t origin_task, const Incoming& in, Receive* recv,
                      bool may_defer) {
  Arrival* a = arrivals.acquire();
  a->engine = this;
  a->header = h;
  a->origin_task = origin_task;
  if (recv == nullptr) {
    a->bytes = in.payload.size();
    a->state = Arrival::State::ready;
    if (a->bytes == 0) return a;
    a->buffer = buffers.acquire(a->bytes);
    if (!a->buffer) {
      arrivals.release(a);
      return nullptr;
    }
    std::memcpy(a->buffer.data, in.payload.data(), a->bytes);
    return a;
  }
  a->bytes = in.total_bytes;
  if (may_defer && in.can_defer && in.total_bytes > eager_max) {
    // Large: it waits at its sender, holding nothing here, until the call
    // names its place; then it comes by the rendezvous straight into it.
    a->state = Arrival::State::deferred;
    recv->defer = &a->deferred;
    ++stats.early_deferred;
    return a;
  }
  a->buffer = buffers.acquire(a->bytes);
  if (!a->buffer) {
    arrivals.release(a);
    return nullptr;
  }
  a->state = Arrival::State::receiving;
  recv->buffer = a->buffer.data;
  recv->done = kept_callback(a);
  return a;
}

void Engine::discard(Arrival* a) {
  switch (a->state) {
    case Arrival::State::deferred:
      if (a->deferred.id != 0) (void)context.accept(a->deferred, nullptr, {});  // dropped at its sender
      release(a);
      break;
    case Arrival::State::receiving:
      a->discard = true;  // the engine still writes into its buffer
      a->owner = nullptr;
      break;
    case Arrival::State::ready: release(a); break;
  }
}

void Engine::release(Arrival* a) {
  buffers.release(a->buffer);
  arrivals.release(a);
}

void Engine::finish(Operation& op) {
  op.active = false;
  ++op.seq;
  ++stats.completed[static_cast<std::size_t>(op.kind)];
  if (calls > 0) {
    op.done_posted = true;
    (void)context.post({&Engine::run_done, &op});
    return;
  }
  const Callback done = op.done;
  const Status result = op.result;
  op.done = {};
  if (done) done(result);
}

// A task failed (its endpoint on this context is the one collectives use):
// every geometry it is a member of fails.
void Engine::on_peer_failed(void* cookie, Endpoint peer, Status why) {
  auto& e = *static_cast<Engine*>(cookie);
  if (peer.context != e.context.index() || peer.task >= e.job_size) return;
  for (auto& g : e.geometries_) g->impl_->member_failed(peer.task, why);
}

void Engine::run_done(void* cookie, Status) {
  auto& op = *static_cast<Operation*>(cookie);
  op.done_posted = false;
  const Callback done = op.done;
  op.done = {};
  if (done) done(op.result);
}

Callback Engine::sent_callback(Tag* tag) { return {&Engine::on_sent, tag}; }
Callback Engine::received_callback(Tag* tag) { return {&Engine::on_received, tag}; }
Callback Engine::kept_callback(Arrival* a) { return {&Engine::on_kept, a}; }

void Engine::on_sent(void* cookie, Status s) {
  const Tag& t = *static_cast<Tag*>(cookie);
  Operation& op = *t.op;
  --op.sends_pending;
  if (!s.ok()) op.fail(s);
  op.geometry->on_sent(op, t.index);
}

void Engine::on_received(void* cookie, Status s) {
  const Tag& t = *static_cast<Tag*>(cookie);
  t.op->geometry->on_received(*t.op, t.index, s);
}

void Engine::on_kept(void* cookie, Status s) {
  auto* a = static_cast<Arrival*>(cookie);
  a->state = Arrival::State::ready;
  a->status = s;
  if (a->discard) {
    a->engine->release(a);
    return;
  }
  if (a->owner != nullptr) a->owner->geometry->on_kept_ready(*a);
}

void Engine::on_piece(void* combiner, std::uint64_t offset, std::span<const std::byte> bytes) {
  static_cast<PieceCombiner*>(combiner)->piece(offset, bytes);
}

}  // namespace ami::coll

namespace ami {

Geometry::Geometry(std::unique_ptr<coll::GeometryImpl> impl) : impl_(std::move(impl)) {}
Geometry::~Geometry() = default;

std::uint32_t Geometry::id() const { return impl_->id; }
std::uint32_t Geometry::size() const { return impl_->size; }
std::uint32_t Geometry::rank() const { return impl_->rank; }
std::uint32_t Geometry::task(std::uint32_t rank) const {
  return rank < impl_->size ? impl_->members.task(rank) : coll::GeometryImpl::kNotMember;
}

Status Geometry::barrier(Callback done) { return impl_->barrier(done); }
Status Geometry::broadcast(std::uint32_t root, void* buffer, std::size_t bytes, Callback done) {
  return impl_->broadcast(root, buffer, bytes, done);
}
Status Geometry::reduce(std::uint32_t root, const void* send, void* recv, std::size_t count, DataType type,
                        ReduceOp op, Callback done) {
  return impl_->reduce(root, send, recv, count, type, op, done);
}
Status Geometry::allreduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                           Callback done) {
  return impl_->allreduce(send, recv, count, type, op, done);
}
Status Geometry::allgather(const void* send, std::size_t bytes, void* recv, Callback done) {
  return impl_->allgather(send, bytes, recv, done);
}

Collectives::Collectives(Context& context, std::uint16_t dispatch)
    : engine_(std::make_unique<coll::Engine>(context, dispatch)) {}
Collectives::~Collectives() = default;

Geometry& Collectives::world() { return engine_->world(); }
Status Collectives::create_geometry(std::uint32_t id, std::span<const std::uint32_t> tasks, Geometry*& out) {
  return engine_->create_geometry(id, tasks, out);
}
const CollectiveStats& Collectives::stats() const { return engine_->stats; }

}  // namespace ami
