// context.cpp — the public Context: argument checks in front of the engine.
#include "ami/context.hpp"

#include "ami/client.hpp"
#include "ami/device/coarse_clock.hpp"
#include "ami/error.hpp"
#include "context_impl.hpp"
#include "fork_guard.hpp"

namespace ami {

namespace detail {

namespace {

std::uint64_t heard_from(const protocol::AmEngine& engine, std::uint16_t contexts, std::uint32_t task) {
  std::uint64_t n = 0;
  for (std::uint16_t c = 0; c < contexts; ++c) n += engine.heard({task, c});
  return n;
}

}  // namespace

void ContextImpl::look_at_connections() {
  if ((checks & 63) == 0) {
    connections->poll();
    take_ends();
  }
  judge_suspects();
}

void ContextImpl::take_ends() {
  for (const std::size_t n = connections->count(); connections_seen < n; ++connections_seen) {
    const std::uint32_t task = connections->gone(connections_seen);
    suspects.push_back({task, device::coarse_now_ns(), heard_from(engine, client.context_count(), task)});
  }
}

void ContextImpl::judge_suspects() {
  if (suspects.empty()) return;
  const std::uint16_t contexts = client.context_count();
  const std::int64_t now = device::coarse_now_ns();
  std::erase_if(suspects, [&](Suspect& s) {
    const std::uint64_t heard = heard_from(engine, contexts, s.task);
    if (heard != s.heard || now - s.since_ns < kGrace) {
      s.heard = heard;  // still taking what it sent
      return false;
    }
    for (std::uint16_t c = 0; c < contexts; ++c)
      engine.abandon_peer({s.task, c}, {StatusCode::peer_failed, "the peer's process ended (its bootstrap "
                                                                 "connection closed, here or at rank 0)"});
    return true;
  });
}

}  // namespace detail

namespace {

// What a context's calls return once its client is gone (Client::~Client
// retires its contexts instead of freeing them, so that a reference kept
// past it is still an object to ask).
const Status kRetired{StatusCode::invalid_argument, "context used after its client was destroyed"};

using detail::in_forked_child;
using detail::kForkedChild;

}  // namespace

// The first context of the first Client arms the fork guard (fork_guard.hpp).
Context::Context(std::unique_ptr<detail::ContextImpl> impl)
    : impl_(std::move(impl)), index_(impl_->index), fork_generation_(detail::arm_fork_guard()) {}

// In a forked child the engine, the devices and the registration cache are
// the parent's: freeing them would write its rings and region table, move
// its verbs queue pairs to error and deregister its memory. They are left.
Context::~Context() {
  if (in_forked_child(fork_generation_)) (void)impl_.release();
}

void Context::retire() {
  if (in_forked_child(fork_generation_)) (void)impl_.release();  // the parent's: left (see above)
  else impl_.reset();
}

std::uint16_t Context::index() const { return index_; }
Client& Context::client() const {
  if (!impl_) throw Error("Context::client: " + std::string(kRetired.what()));
  return impl_->client;
}
const ContextStats& Context::stats() const {
  static const ContextStats nothing{};
  if (!impl_) return nothing;
  const detail::RegistrationCache::Counters& c = impl_->cache->counters();
  impl_->stats.rcache_hits = c.hits;
  impl_->stats.rcache_misses = c.misses;
  impl_->stats.rcache_evictions = c.evictions;
  return impl_->stats;
}

Status Context::set_dispatch(std::uint16_t id, Dispatch dispatch) {
  if (in_forked_child(fork_generation_)) return kForkedChild<"set_dispatch">;
  if (!impl_) return kRetired;
  return impl_->engine.set_dispatch(id, dispatch);
}

Status Context::send(const SendParams& params) {
  if (in_forked_child(fork_generation_)) return kForkedChild<"send">;
  return impl_ ? impl_->engine.send(params) : kRetired;
}

Status Context::send_immediate(const SendImmediateParams& params) {
  if (in_forked_child(fork_generation_)) return kForkedChild<"send_immediate">;
  if (!impl_) return kRetired;
  return impl_->engine.send_immediate(params);
}

Status Context::accept(const Deferred& deferred, void* buffer, Callback done, const Memory* memory) {
  if (in_forked_child(fork_generation_)) return kForkedChild<"accept">;
  if (!impl_) return kRetired;
  return impl_->engine.accept(deferred.id, static_cast<std::byte*>(buffer), done, memory);
}

Status Context::fence(Endpoint dest, Callback done) {
  if (in_forked_child(fork_generation_)) return kForkedChild<"fence">;
  return impl_ ? impl_->engine.fence(dest, done) : kRetired;
}
Status Context::fence_all(Callback done) {
  if (in_forked_child(fork_generation_)) return kForkedChild<"fence_all">;
  return impl_ ? impl_->engine.fence_all(done) : kRetired;
}
void Context::set_fence_handler(FenceHandler handler) {
  if (impl_ && !in_forked_child(fork_generation_)) impl_->engine.set_fence_handler(handler);
}

Status Context::post(Callback work) {
  if (in_forked_child(fork_generation_)) return kForkedChild<"post">;
  if (!impl_) return kRetired;
  const Status s = impl_->engine.post(work);
  if (s.ok() && impl_->sleeping.load(std::memory_order_acquire)) impl_->wake.signal();
  return s;
}

int Context::event_fd() {
  if (in_forked_child(fork_generation_) || !impl_) return -1;
  return impl_->open_wake().ok() ? impl_->wake.fd() : -1;
}

Status Context::arm() {
  if (in_forked_child(fork_generation_)) return kForkedChild<"arm">;
  return impl_ ? impl_->arm() : kRetired;
}

void Context::signal() {
  if (impl_ && !in_forked_child(fork_generation_)) impl_->wake.signal();  // (its eventfd exists from the start)
}

void Context::set_error_handler(PeerErrorHandler handler) {
  if (impl_ && !in_forked_child(fork_generation_)) impl_->engine.set_error_handler(handler);
}
void Context::watch_peer_failures(PeerErrorHandler watcher) {
  if (impl_ && !in_forked_child(fork_generation_)) impl_->engine.watch_peer_failures(watcher);
}
void Context::unwatch_peer_failures(PeerErrorHandler watcher) {
  if (impl_ && !in_forked_child(fork_generation_)) impl_->engine.unwatch_peer_failures(watcher);
}
Status Context::peer_status(Endpoint dest) const {
  if (in_forked_child(fork_generation_)) return kForkedChild<"peer_status">;
  return impl_ ? impl_->engine.peer_status(dest) : kRetired;
}

std::size_t Context::immediate_limit(Endpoint dest) {
  if (in_forked_child(fork_generation_)) return 0;
  return impl_ ? impl_->engine.immediate_limit(dest) : 0;
}

std::string_view Context::backend_for(Endpoint dest) {
  if (in_forked_child(fork_generation_)) return "";
  return impl_ ? impl_->engine.backend_for(dest) : "";
}

AckPeerStats Context::ack_stats(Endpoint dest) const { return impl_ ? impl_->engine.ack_stats(dest) : AckPeerStats{}; }

std::string Context::describe_lane(Endpoint dest) {
  if (!impl_ || in_forked_child(fork_generation_)) return {};
  const device::Backend* backend = impl_->backends.find(backend_for(dest));
  if (backend == nullptr) return " Lane            : unreachable\n";
  return backend->describe_lane(impl_->index, dest);
}

namespace {

// The checks put and get share; names the call in every message.
Status check_rdma(const Client& client, const RdmaParams& p, bool is_put) {
  if (p.dest.task >= client.size() || p.dest.context >= client.context_count())
    return {StatusCode::invalid_argument, is_put ? "put: endpoint is out of range" : "get: endpoint is out of range"};
  if (p.local == nullptr || !p.local->valid())
    return {StatusCode::not_registered, is_put ? "put: local memory is not registered" : "get: local memory is not registered"};
  const RemoteKey& own = p.local->remote_key();
  if (own.job != client.job() || own.task != client.task())
    return {StatusCode::not_registered, is_put ? "put: local memory belongs to another client" : "get: local memory belongs to another client"};
  if (!p.local->covers(p.local_offset, p.bytes))
    return {StatusCode::invalid_argument, is_put ? "put: local range exceeds the registration" : "get: local range exceeds the registration"};
  if (p.remote.task != p.dest.task)
    return {StatusCode::invalid_argument, is_put ? "put: remote key belongs to another task than dest" : "get: remote key belongs to another task than dest"};
  if (p.remote.address + p.remote.length < p.remote.address)  // a key made by hand: from_bytes() refuses it
    return {StatusCode::remote_access, is_put ? "put: the remote key's region wraps around the address space" : "get: the remote key's region wraps around the address space"};
  if (p.remote_offset > p.remote.length || p.bytes > p.remote.length - p.remote_offset)
    return {StatusCode::remote_access, is_put ? "put: range exceeds the remote key's region" : "get: range exceeds the remote key's region"};
  return Status::success();
}

}  // namespace

Status Context::put(const RdmaParams& params) {
  if (in_forked_child(fork_generation_)) return kForkedChild<"put">;
  if (!impl_) return kRetired;
  Status s = check_rdma(client(), params, true);
  if (!s.ok()) return s;
  auto* local = static_cast<std::byte*>(params.local->address()) + params.local_offset;
  return impl_->engine.rdma(device::DescriptorKind::put, params, local, params.local->local_keys());
}

Status Context::get(const RdmaParams& params) {
  if (in_forked_child(fork_generation_)) return kForkedChild<"get">;
  if (!impl_) return kRetired;
  Status s = check_rdma(client(), params, false);
  if (!s.ok()) return s;
  auto* local = static_cast<std::byte*>(params.local->address()) + params.local_offset;
  return impl_->engine.rdma(device::DescriptorKind::get, params, local, params.local->local_keys());
}

namespace {

// (The job's shape from the engine, not the Client: an atomic is a few
// nanoseconds' work on a mapped word, and the Client's answers are calls.)
Status check_atomic(const protocol::AmEngine::Shape& job, const AtomicParams& p) {
  if (p.dest.task >= job.tasks || p.dest.context >= job.contexts)
    return {StatusCode::invalid_argument, "atomic: endpoint is out of range"};
  if (static_cast<std::uint8_t>(p.op) > kLastAtomicOp)
    return {StatusCode::invalid_argument, "atomic: op is not an AtomicOp"};
  if (static_cast<std::uint8_t>(p.type) > kLastAtomicType)
    return {StatusCode::invalid_argument, "atomic: type is not an AtomicType"};
  if (p.result == nullptr && returns_old(p.op))
    return {StatusCode::invalid_argument, "atomic: result is null, but the op returns the old value"};
  if (p.remote.task != p.dest.task)
    return {StatusCode::invalid_argument, "atomic: remote key belongs to another task than dest"};
  if (p.remote.address + p.remote.length < p.remote.address)  // a key made by hand: from_bytes() refuses it
    return {StatusCode::remote_access, "atomic: the remote key's region wraps around the address space"};
  const std::uint64_t width = width_of(p.type);
  if (p.remote_offset > p.remote.length || width > p.remote.length - p.remote_offset)
    return {StatusCode::remote_access, "atomic: the word lies outside the remote key's region (out of bounds)"};
  if (!aligned_for(p.remote.address + p.remote_offset, p.type))
    return {StatusCode::invalid_argument, "atomic: the remote address is misaligned for the type's width"};
  return Status::success();
}

}  // namespace

Status Context::atomic(const AtomicParams& params) {
  if (in_forked_child(fork_generation_)) return kForkedChild<"atomic">;
  if (!impl_) return kRetired;
  Status s = check_atomic(impl_->engine.shape(), params);
  if (!s.ok()) return s;
  return impl_->engine.atomic(params);
}

Status Context::atomic_now(const AtomicParams& params) {
  if (in_forked_child(fork_generation_)) return kForkedChild<"atomic_now">;
  if (!impl_) return kRetired;
  Status s = check_atomic(impl_->engine.shape(), params);
  if (!s.ok()) return s;
  return impl_->engine.atomic_now(params);
}

std::size_t Context::advance(std::size_t max_loops) {
  // In a forked child the rings are the parent's: taking from them here
  // would hand the parent's arrivals to the child as well.
  if (in_forked_child(fork_generation_)) return 0;
  detail::ContextImpl* impl = impl_.get();
  if (impl == nullptr) return 0;
  if (impl->sleeping.load(std::memory_order_relaxed)) [[unlikely]]
    impl->sleeping.store(false, std::memory_order_relaxed);
  std::size_t events = 0;
  for (std::size_t i = 0; i < max_loops; ++i) {
    const std::size_t n = impl->engine.advance();
    events += n;
    if (n == 0) break;
  }
  impl->check_connections();
  return events;
}

void Context::lock() {
  if (impl_) impl_->mutex.lock();
}
bool Context::try_lock() { return impl_ && impl_->mutex.try_lock(); }
void Context::unlock() {
  if (impl_) impl_->mutex.unlock();
}

}  // namespace ami
