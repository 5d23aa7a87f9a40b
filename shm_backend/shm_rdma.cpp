// shm_backend/shm_rdma.cpp — PUT and GET between processes: one copy with
// CMA, or a pipelined copy through the rings where CMA is refused.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "ami/device/cpu_atomic.hpp"
#include "shared_region.hpp"
#include "shm_device.hpp"

namespace ami::shm {

namespace {

// Moves all of [local, local + bytes) to or from the peer; returns 0 or errno.
int cma_copy(pid_t pid, bool put, std::byte* local, std::uint64_t remote, std::uint64_t bytes) {
  while (bytes != 0) {
    iovec l{local, bytes};
    iovec r{reinterpret_cast<void*>(remote), bytes};
    const ssize_t n = put ? ::process_vm_writev(pid, &l, 1, &r, 1, 0)
                          : ::process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EFAULT;
    local += n;
    remote += static_cast<std::uint64_t>(n);
    bytes -= static_cast<std::uint64_t>(n);
  }
  return 0;
}

Status cma_error(int err, bool put) {
  if (err == ESRCH) return {StatusCode::peer_failed, put ? "put: the peer process is gone" : "get: the peer process is gone"};
  return {StatusCode::remote_access, put ? "put: the peer refused the address range" : "get: the peer refused the address range"};
}

}  // namespace

// Maps the peer's shared region once; later operations find it in
// shared_views_ (map_shared()).
ShmDevice::SharedView* ShmDevice::map_new(const ShmLane& lane, std::uint32_t task, std::uint32_t shared_fd) {
  const std::string path = "/proc/" + std::to_string(lane.pid_) + "/fd/" + std::to_string(shared_fd - 1);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st {};
  void* p = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && st.st_size >= static_cast<off_t>(SharedRegionHeader::kBytes))
    p = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return nullptr;
  if (shared_views_.size() == kMaxSharedViews) shared_views_.erase(shared_views_.begin());
  shared_views_.push_back(SharedView{task, shared_fd, Mapping(p, static_cast<std::size_t>(st.st_size))});
  return &shared_views_.back();
}

// Where [remote_address, + length) of a shared region lies in this process,
// after checking that the region behind the key is still the one it names.
inline Status ShmDevice::shared_target(const ShmLane& lane, const RemoteKey& k, std::uint64_t remote_address,
                                       std::uint64_t length, std::uint32_t shared_fd, std::byte*& out) {
  SharedView* v = map_shared(lane, k.task, shared_fd);
  if (v == nullptr) return {StatusCode::unreachable, "the peer's shared region cannot be mapped"};
  const auto* h = reinterpret_cast<const SharedRegionHeader*>(v->mapping.data());
  const std::uint32_t generation =
      std::atomic_ref<const std::uint32_t>(h->generation).load(std::memory_order_acquire);
  // (map_shared() saw at least a header's bytes; the header is the peer's
  // to write, so its length is checked without adding to it.)
  if (h->magic != SharedRegionHeader::kMagic || h->job != k.job || h->task != k.task ||
      h->region != k.region || generation != k.generation || h->length != k.length ||
      h->length > v->mapping.size() - SharedRegionHeader::kBytes) {
    shared_views_.erase(shared_views_.begin() + (v - shared_views_.data()));  // remap next time
    return {StatusCode::remote_access, "remote key is stale (region freed)"};
  }
  const std::uint64_t offset = remote_address - k.address;
  if (remote_address < k.address || offset > k.length || length > k.length - offset)
    return {StatusCode::remote_access, "access lies outside the remote key's region"};
  out = v->mapping.data() + SharedRegionHeader::kBytes + offset;
  return Status::success();
}

// PUT and GET into a peer's allocate_memory() region: one memcpy.
ShmDevice::Step ShmDevice::rdma_mapped(ShmLane& lane, std::uint64_t n, std::uint32_t shared_fd) {
  const device::Descriptor& d = lane.fifo().at(n);
  std::byte* remote = nullptr;
  const Status s = shared_target(lane, d.rdma.remote, d.rdma.remote_address, d.rdma.length, shared_fd, remote);
  if (s == StatusCode::unreachable) return domain_.cma() ? rdma_cma(lane, n)
      : d.kind == device::DescriptorKind::put ? put_through_ring(lane, n) : get_through_ring(lane, n);
  if (!s.ok()) {
    lane.fifo().fail_one(n, s);
    return Step::done;
  }
  if (d.kind == device::DescriptorKind::put)
    std::memcpy(remote, d.rdma.local, d.rdma.length);
  else
    std::memcpy(d.rdma.local, remote, d.rdma.length);
  return Step::done;
}

// Only a CPU-domain region: a NIC-domain one's atomics go to its owner,
// which does them through its NIC (docs/DESIGN.md, "Remote atomics").
bool ShmLane::offloads_atomic(const RemoteKey& key, AtomicOp, AtomicType) {
  return key.atomics == AtomicDomain::cpu && device_.maps_region(*this, key);
}

bool ShmDevice::maps_region(const ShmLane& lane, const RemoteKey& key) {
  std::uint32_t shared_fd = 0;
  return lane.failure_.ok() && decode_entry(key.entry(domain_.key_id()), shared_fd) && shared_fd != 0 &&
         map_shared(lane, key.task, shared_fd) != nullptr;
}

// The op on the word, where this process maps it (atomic_mapped() and
// atomic_in_place() below).
inline Status ShmDevice::atomic_on_mapping(ShmLane& lane, const device::AtomicRef& a, std::uint32_t shared_fd) {
  const std::size_t width = width_of(a.type);
  std::byte* word = nullptr;
  Status s = shared_target(lane, a.remote, a.remote_address, width, shared_fd, word);
  // (A view dropped since offloads_atomic() said yes, and not mappable
  // again: the op cannot go another way now without mixing paths.)
  if (s.ok() && !aligned_for(reinterpret_cast<std::uintptr_t>(word), a.type))
    s = {StatusCode::invalid_argument, "atomic: the remote address is misaligned for its width"};
  if (!s.ok()) return s;
  const std::uint64_t old = device::cpu_atomic(a.op, a.type, word, a.operand, a.compare);
  if (a.result != nullptr) std::memcpy(a.result, &old, width);
  return Status::success();
}

// An atomic on a peer's allocate_memory() region: std::atomic_ref on this
// process's mapping of the same pages, which the owner's engine and every
// other mapping peer use too. Done at once, as a mapped PUT is.
void ShmDevice::atomic_mapped(ShmLane& lane, std::uint64_t n, const device::AtomicDescriptor& a) {
  std::uint32_t shared_fd = 0;
  const Status s = decode_entry(a.remote.entry(domain_.key_id()), shared_fd) && shared_fd != 0
                       ? atomic_on_mapping(lane, device::AtomicRef::of(a), shared_fd)
                       : Status{StatusCode::remote_access, "atomic: the remote key names no shared region"};
  if (!s.ok()) lane.fifo().fail_one(n, s);
}

// One look at the mapping instead of offloads_atomic()'s and then the op's:
// a region this lane does not map is not_supported (the engine then posts
// the atomic as a message, the path offloads_atomic() gives it too).
Status ShmLane::atomic_in_place(const device::AtomicRef& a) {
  static constexpr Status kNotMapped{StatusCode::not_supported, "shm: the region is not mapped here"};
  std::uint32_t shared_fd = 0;
  if (!failure_.ok() || a.remote.atomics != AtomicDomain::cpu ||
      !decode_entry(a.remote.entry(device_.domain_.key_id()), shared_fd) || shared_fd == 0)
    return kNotMapped;
  const Status s = device_.atomic_on_mapping(*this, a, shared_fd);
  return s == StatusCode::unreachable ? kNotMapped : s;
}

ShmDevice::Step ShmDevice::rdma_cma(ShmLane& lane, std::uint64_t n) {
  const device::Descriptor& d = lane.fifo().at(n);
  const bool put = d.kind == device::DescriptorKind::put;
  const device::RdmaDescriptor& x = d.rdma;
  // CMA writes wherever it is told: the owner's published table decides,
  // as the owner itself would (stale, foreign and out-of-range keys).
  const Status allowed = domain_.check_peer_key(lane.peer().task, x.remote, x.remote_address, x.length);
  if (!allowed.ok()) {
    lane.fifo().fail_one(n, allowed);
    return Step::done;
  }
  const int err = cma_copy(static_cast<pid_t>(lane.pid_), put, x.local, x.remote_address, x.length);
  if (err == EPERM || err == ENOSYS) {
    std::fprintf(stderr, "ami: shm: CMA refused (%s); PUT and GET now copy through the rings\n",
                 std::strerror(err));
    domain_.disable_cma();
    return put ? put_through_ring(lane, n) : get_through_ring(lane, n);
  }
  if (err != 0) lane.fifo().fail_one(n, cma_error(err, put));
  return Step::done;
}

// Streams the PUT's bytes into the peer's ring, a cell at a time; the peer
// checks the key and places them, and answers the last cell. Done when that
// answer came, so a refused PUT fails here as it does on every backend.
ShmDevice::Step ShmDevice::put_through_ring(ShmLane& lane, std::uint64_t n) {
  if (lane.put_waiting_) {
    if (!lane.put_answered_) return Step::waiting;
    lane.put_waiting_ = lane.put_answered_ = false;
    return Step::done;
  }
  const device::RdmaDescriptor& x = lane.fifo().at(n).rdma;
  const std::size_t room = lane.target_->max_data() - sizeof(RdmaChunk);
  do {
    auto r = lane.target_->reserve();
    if (!r) return Step::stalled;
    const std::uint64_t chunk = std::min<std::uint64_t>(room, x.length - lane.put_sent_);
    RdmaChunk c{.key = ChunkKey::of(x.remote), .remote_address = x.remote_address + lane.put_sent_, .tag = n,
                .offset = lane.put_sent_, .bytes = chunk, .total = x.length};
    std::memcpy(r.data(), &c, sizeof c);
    std::memcpy(r.data() + sizeof c, x.local + lane.put_sent_, chunk);
    if (!commit(lane, r, sizeof c + chunk, kPutDataCell)) return Step::stalled;  // the failed lane fails it
    lane.put_sent_ += chunk;
  } while (lane.put_sent_ < x.length);
  lane.put_sent_ = 0;
  lane.put_waiting_ = true;
  return Step::waiting;
}

// Asks the peer for the bytes; done when they have all come back.
ShmDevice::Step ShmDevice::get_through_ring(ShmLane& lane, std::uint64_t n) {
  const device::RdmaDescriptor& x = lane.fifo().at(n).rdma;
  if (!lane.get_waiting_) {
    if (x.length == 0) return Step::done;
    auto r = lane.target_->reserve();
    if (!r) return Step::stalled;
    RdmaChunk c{.key = ChunkKey::of(x.remote), .remote_address = x.remote_address, .tag = n, .bytes = x.length};
    std::memcpy(r.data(), &c, sizeof c);
    if (!commit(lane, r, sizeof c, kGetRequestCell)) return Step::stalled;
    lane.get_waiting_ = true;
    lane.get_received_ = 0;
    return Step::waiting;
  }
  if (lane.get_received_ < x.length) return Step::waiting;
  lane.get_waiting_ = false;
  return Step::done;
}

// The whole PUT's range is checked at its first cell, so a refused PUT
// writes nothing; every cell is checked again (the region may go meanwhile).
void ShmDevice::on_put_data(ShmLane& lane, const RdmaChunk& c, std::span<const std::byte> data) {
  if (c.bytes != data.size() || c.offset > c.total || c.bytes > c.total - c.offset) {
    ++dropped_;  // not a cell an honest peer builds: no answer either
    return;
  }
  std::byte* target = nullptr;
  if (c.offset == 0) {
    lane.incoming_put_tag_ = c.tag;
    lane.incoming_put_status_ = domain_.regions().check(c.key.key(), c.remote_address, c.total, target);
  } else if (c.tag != lane.incoming_put_tag_) {
    ++dropped_;
    return;
  }
  if (lane.incoming_put_status_.ok())
    lane.incoming_put_status_ = domain_.regions().check(c.key.key(), c.remote_address, c.bytes, target);
  if (lane.incoming_put_status_.ok())
    std::memcpy(target, data.data(), data.size());
  else
    ++dropped_;  // refused: outside a registration, stale, or another job's key
  if (c.offset + c.bytes != c.total) return;
  if (responses_.size() == responses_.capacity()) {  // more answers than lanes: not an honest peer
    ++dropped_;
    return;
  }
  responses_.push_back(GetResponse{lane.peer(), nullptr, 0, 0, c.tag,
                                   static_cast<std::uint32_t>(lane.incoming_put_status_.code()),
                                   kPutDoneCell});
}

void ShmDevice::on_put_done(ShmLane& lane, const RdmaChunk& c) {
  auto& fifo = lane.fifo();
  const std::uint64_t n = fifo.counter().snapshot();
  if (!lane.put_waiting_ || lane.put_answered_ || c.tag != n || n >= fifo.injected()) {
    ++dropped_;
    return;
  }
  if (c.status != 0) fifo.fail_one(n, {StatusCode::remote_access, "put: the peer refused the remote key or range"});
  lane.put_answered_ = true;
}

void ShmDevice::on_get_request(Endpoint from, const RdmaChunk& c) {
  std::byte* source = nullptr;
  const Status s = domain_.regions().check(c.key.key(), c.remote_address, c.bytes, source);
  if (!s.ok()) ++dropped_;
  if (responses_.size() == responses_.capacity()) {  // more GETs than lanes: not an honest peer
    ++dropped_;
    return;
  }
  responses_.push_back(GetResponse{from, source, s.ok() ? c.bytes : 0, 0, c.tag,
                                   static_cast<std::uint32_t>(s.code()), kGetDataCell});
}

// Sends as much GET data (and as many PUT answers) back as the requesters'
// rings take.
std::size_t ShmDevice::serve_get_responses() {
  std::size_t work = 0, kept = 0;
  for (GetResponse& g : responses_) {
    device::ReceptionQueue& q = domain_.peer_queue(g.to.task, g.to.context);
    const std::size_t room = q.max_data() - sizeof(RdmaChunk);
    bool finished = false;
    while (auto r = q.reserve()) {
      const std::uint64_t chunk = std::min<std::uint64_t>(room, g.bytes - g.sent);
      RdmaChunk c{.tag = g.tag, .offset = g.sent, .bytes = chunk, .status = g.status};
      std::memcpy(r.data(), &c, sizeof c);
      if (chunk != 0) std::memcpy(r.data() + sizeof c, g.source + g.sent, chunk);
      const bool committed = q.commit(r, static_cast<std::uint32_t>(sizeof c + chunk), me(g.kind));
      if (r.wake) device::notify(domain_.peer_wake_fd(g.to.task, g.to.context));
      if (!committed) {
        if (ShmLane* l = made_lane(g.to)) fail_lane(*l, kCellSkipped);  // the answer is lost
        finished = true;
        break;
      }
      g.sent += chunk;
      ++work;
      if (g.sent == g.bytes) {
        finished = true;
        break;
      }
    }
    if (!finished) responses_[kept++] = g;
  }
  responses_.resize(kept);
  return work;
}

void ShmDevice::on_get_data(ShmLane& lane, const RdmaChunk& c, std::span<const std::byte> data) {
  auto& fifo = lane.fifo();
  const std::uint64_t n = fifo.counter().snapshot();
  if (!lane.get_waiting_ || c.tag != n || n >= fifo.injected()) {
    ++dropped_;
    return;
  }
  const device::RdmaDescriptor& x = fifo.at(n).rdma;
  if (c.status != 0) {  // the peer refused the GET
    fifo.fail_one(n, {StatusCode::remote_access, "get: the peer refused the remote key or range"});
    lane.get_received_ = x.length;
    return;
  }
  if (c.offset != lane.get_received_ || c.bytes != data.size() || c.bytes > x.length - c.offset) {
    ++dropped_;
    return;
  }
  std::memcpy(x.local + c.offset, data.data(), data.size());
  lane.get_received_ += c.bytes;
}

}  // namespace ami::shm
