// self_device.cpp — the self backend's setup and data path (both small).
#include "self_device.hpp"

#include <cstdlib>
#include <cstring>
#include <new>

#include "ami/device/cpu_atomic.hpp"

namespace ami::self {

void SelfDomain::FreeAligned::operator()(void* p) const { std::free(p); }

SelfDomain::SelfDomain(std::uint32_t task, std::uint16_t contexts, std::uint32_t queue_depth,
                       std::uint32_t cell_bytes, const device::RegionTable& regions, std::uint8_t key_id)
    : task_(task), key_id_(key_id), regions_(regions) {
  const std::size_t one = device::ReceptionQueue::bytes_needed(queue_depth, cell_bytes);
  void* mem = std::aligned_alloc(device::kCacheLine, one * contexts);
  if (mem == nullptr) throw std::bad_alloc();
  memory_.reset(mem);
  for (std::uint16_t c = 0; c < contexts; ++c)
    queues_.push_back(device::ReceptionQueue::create(static_cast<std::byte*>(mem) + one * c,
                                                     queue_depth, cell_bytes));
  wakes_.resize(contexts);
  for (const device::EventFd& e : wakes_) wake_fds_.push_back(e.fd());
}

SelfDevice::SelfDevice(SelfDomain& domain, std::uint16_t context, std::uint32_t fifo_depth)
    : domain_(domain), context_(context), fifo_depth_(fifo_depth), lanes_(domain.contexts()),
      allowance_(domain.contexts(), kUnheld) {}

unsigned SelfDevice::reception_load() const {
  const device::ReceptionQueue& q = domain_.queue(context_);
  return static_cast<unsigned>(std::uint64_t{q.occupancy()} * 100 / q.depth());
}

void SelfDevice::hold(std::uint16_t target, bool held) {
  if (target < allowance_.size()) allowance_[target] = held ? 0 : kUnheld;
}

void SelfDevice::release(std::uint16_t target, std::uint64_t n) {
  if (target < allowance_.size() && allowance_[target] != kUnheld) allowance_[target] += n;
}

void SelfDevice::fail_lane(std::uint16_t target, Status why) {
  if (auto* l = static_cast<SelfLane*>(lane(Endpoint{domain_.task(), target})))
    l->failure_ = why.ok() ? Status{StatusCode::peer_failed, "self: the lane was failed on purpose"} : why;
}

bool SelfDevice::can_reach(Endpoint peer) const {
  return peer.task == domain_.task() && peer.context < domain_.contexts();
}

device::Lane* SelfDevice::lane(Endpoint peer) {
  if (!can_reach(peer)) return nullptr;
  auto& l = lanes_[peer.context];
  if (!l)
    l = std::make_unique<SelfLane>(*this, peer, fifo_depth_, domain_.queue(peer.context).max_data());
  return l.get();
}

// Carries out descriptor n; false when the target queue is full and the
// lane must stall (the descriptor stays in the FIFO).
bool SelfDevice::execute(SelfLane& lane, std::uint64_t n) {
  return device::visit(lane.fifo().at(n), device::cases(
      /*packet*/ [&](const device::PacketDescriptor& p) { return deliver(lane, p); },
      /*put*/ [&](const device::RdmaDescriptor& x) { return rdma(lane, n, x, true); },
      /*get*/ [&](const device::RdmaDescriptor& x) { return rdma(lane, n, x, false); },
      /*atomic*/ [&](const device::AtomicDescriptor& a) {
        atomic(lane, n, a);
        return true;
      }));
}

bool SelfDevice::deliver(SelfLane& lane, const device::PacketDescriptor& p) {
  device::ReceptionQueue& q = domain_.queue(lane.peer().context);
  auto r = q.reserve();
  if (!r) return false;
  std::memcpy(r.data(), p.inline_data, p.inline_len);
  if (p.payload_len != 0) std::memcpy(r.data() + p.inline_len, p.payload, p.payload_len);
  // (Only the shm backend's consumers give a cell up; here commit succeeds.)
  (void)q.commit(r, p.inline_len + p.payload_len, {domain_.task(), context_, 0});
  if (r.wake) device::notify(domain_.wake_fd(lane.peer().context));
  return true;
}

// PUT and GET differ only in the direction of the copy.
bool SelfDevice::rdma(SelfLane& lane, std::uint64_t n, const device::RdmaDescriptor& x, bool put) {
  std::byte* remote = nullptr;
  Status s = domain_.regions().check(x.remote, x.remote_address, x.length, remote);
  if (!s.ok()) {
    lane.fifo().fail_one(n, s);
    return true;
  }
  if (x.length != 0) {
    if (put)
      std::memmove(remote, x.local, x.length);
    else
      std::memmove(x.local, remote, x.length);
  }
  return true;
}

void SelfDevice::atomic(SelfLane& lane, std::uint64_t n, const device::AtomicDescriptor& a) {
  const Status s = atomic_on(device::AtomicRef::of(a));
  if (!s.ok()) lane.fifo().fail_one(n, s);
}

Status SelfLane::atomic_in_place(const device::AtomicRef& a) {
  if (a.remote.atomics != AtomicDomain::cpu)
    return {StatusCode::not_supported, "self: the region's atomics are its NIC's"};
  return device_.atomic_on(a);
}

Status SelfDevice::atomic_on(const device::AtomicRef& a) {
  const std::size_t width = width_of(a.type);
  std::byte* word = nullptr;
  Status s = domain_.regions().check(a.remote, a.remote_address, width, word);
  if (s.ok() && !aligned_for(a.remote_address, a.type))
    s = {StatusCode::invalid_argument, "atomic: the remote address is misaligned for its width"};
  if (!s.ok()) return s;
  const std::uint64_t old = device::cpu_atomic(a.op, a.type, word, a.operand, a.compare);
  if (a.result != nullptr) std::memcpy(a.result, &old, width);  // (little-endian: the low bytes)
  return Status::success();
}

std::size_t SelfDevice::drain_lane(SelfLane& lane) {
  auto& fifo = lane.fifo();
  std::uint64_t done = fifo.counter().snapshot();
  const std::uint64_t start = done;
  std::uint64_t& allowance = allowance_[lane.peer().context];
  while (done < fifo.injected() && allowance != 0 && execute(lane, done)) {
    ++done;
    if (allowance != kUnheld) --allowance;
  }
  if (done != start) fifo.counter().advance_to(done);
  return done - start;
}

// A task with one context only ever hears from itself: nothing to poll
// until it sends to itself.
bool SelfDevice::wants_progress() const { return lanes_.size() != 1 || lanes_[0] != nullptr; }

Status SelfDevice::arm() {
  (void)device::drain(domain_.wake_fd(context_));  // a hint only: the queue says
  return arm_quiet();
}

Status SelfDevice::arm_quiet() {
  for (const auto& l : lanes_)
    if (l && (l->fifo().counter().snapshot() < l->fifo().injected() || (!l->failure_.ok() && !l->reported_)))
      return {StatusCode::busy, "self: a lane has descriptors to carry out"};
  if (!domain_.queue(context_).arm()) return {StatusCode::busy, "self: a packet is in the queue"};
  return Status::success();
}

std::size_t SelfDevice::progress(device::PacketSink& sink, std::size_t budget) {
  if (!wants_progress()) return 0;
  std::size_t work = 0;
  for (auto& l : lanes_) {
    if (!l) continue;
    if (l->failure_.ok()) {
      work += drain_lane(*l);
      continue;
    }
    if (l->fifo().counter().snapshot() < l->fifo().injected()) work += l->fifo().fail_pending(l->failure_);
    if (!l->reported_) {
      l->reported_ = true;
      sink.on_lane_failed(l->peer(), l->failure_);
      ++work;
    }
  }
  device::ReceptionQueue& q = domain_.queue(context_);
  device::ReceptionQueue::Arrival a;
  for (std::size_t i = 0; i < budget && q.peek(a); ++i, ++work) {
    sink.on_packet(Endpoint{a.origin.task, a.origin.context}, a.data);
    q.release();
  }
  return work;
}

}  // namespace ami::self
