// shm_backend/segment.cpp — creating, mapping and checking segments.
#include "segment.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <string_view>
#include <utility>

#include "ami/error.hpp"

namespace ami::shm {

Mapping::Mapping(Mapping&& o) noexcept
    : address_(std::exchange(o.address_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

Mapping& Mapping::operator=(Mapping&& o) noexcept {
  if (this != &o) {
    if (address_ != nullptr) ::munmap(address_, bytes_);
    address_ = std::exchange(o.address_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

Mapping::~Mapping() {
  if (address_ != nullptr) ::munmap(address_, bytes_);
}

namespace {

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

Mapping map_fd(int fd, std::size_t bytes, int& err) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    err = errno;
    return {};
  }
  return Mapping(p, bytes);
}

}  // namespace

OwnSegment::OwnSegment(std::uint32_t task, std::uint16_t contexts, std::uint32_t queue_depth,
                       std::uint32_t cell_bytes, std::uint32_t region_capacity)
    : contexts_(contexts) {
  if (contexts == 0 || contexts > kMaxContexts)
    throw Error("shm: a task may have 1.." + std::to_string(kMaxContexts) + " contexts");
  if (!device::ReceptionQueue::valid_shape(queue_depth, cell_bytes))
    throw Error("shm: ring depth must be a power of two and cells a multiple of 64 bytes");
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t queue_bytes =
      round_up(device::ReceptionQueue::bytes_needed(queue_depth, cell_bytes), device::kCacheLine);
  const std::size_t regions_offset = sizeof(SegmentHeader) + queue_bytes * contexts;
  const std::size_t total =
      round_up(regions_offset + sizeof(device::RegionSlot) * std::size_t{region_capacity}, page);

  fd_ = ::memfd_create("ami-shm", MFD_CLOEXEC);
  if (fd_ < 0) throw Error("shm: memfd_create", errno);
  if (::ftruncate(fd_, static_cast<off_t>(total)) != 0) {
    const int err = errno;
    ::close(fd_);
    throw Error("shm: ftruncate of the segment", err);
  }
  int err = 0;
  mapping_ = map_fd(fd_, total, err);
  if (!mapping_) {
    ::close(fd_);
    throw Error("shm: mmap of the segment", err);
  }
  auto* h = new (mapping_.data()) SegmentHeader{};
  h->magic = SegmentHeader::kMagic;
  h->version = SegmentHeader::kVersion;
  h->header_bytes = sizeof(SegmentHeader);
  h->total_bytes = total;
  h->owner_pid = static_cast<std::uint32_t>(::getpid());
  h->owner_task = task;
  h->contexts = contexts;
  h->queue_bytes = static_cast<std::uint32_t>(queue_bytes);
  for (std::uint16_t c = 0; c < contexts; ++c) {
    h->queue_offset[c] = sizeof(SegmentHeader) + queue_bytes * c;
    queues_[c] = device::ReceptionQueue::create(mapping_.data() + h->queue_offset[c], queue_depth,
                                                cell_bytes);
  }
  h->regions_offset = regions_offset;
  h->region_capacity = region_capacity;
  wakes_.resize(contexts);
  for (std::uint16_t c = 0; c < contexts; ++c) {
    wake_fds_.push_back(wakes_[c].fd());
    h->wake_fd[c] = wakes_[c].fd();
  }
  h->unwakeable.store(0, std::memory_order_relaxed);
  regions_ = new (mapping_.data() + regions_offset) device::RegionSlot[region_capacity];
}

OwnSegment::~OwnSegment() {
  if (fd_ >= 0) ::close(fd_);
}

bool OwnSegment::unwakeable() const {
  return reinterpret_cast<const SegmentHeader*>(mapping_.data())->unwakeable.load(std::memory_order_acquire) != 0;
}

PeerSegment::~PeerSegment() {
  for (int f : wake_fds_)
    if (f >= 0) ::close(f);
}

namespace {

// The peer's descriptor number n, taken into this process; -1 unless it is
// an eventfd (a peer naming another kind of file does not get 8 bytes
// written into it).
int take_eventfd(int pidfd, std::int32_t n) {
  if (pidfd < 0 || n < 0) return -1;
  const int f = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, n, 0));
  if (f < 0) return -1;
  char link[64] = {};
  const std::string self = "/proc/self/fd/" + std::to_string(f);
  const ssize_t len = ::readlink(self.c_str(), link, sizeof link - 1);
  if (len <= 0 || std::string_view(link, static_cast<std::size_t>(len)) != "anon_inode:[eventfd]") {
    ::close(f);
    return -1;
  }
  return f;
}

}  // namespace

Status PeerSegment::open(std::uint32_t pid, int fd, std::uint32_t task, std::uint16_t contexts, int pidfd) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  const int f = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (f < 0) return {StatusCode::unreachable, "shm: the peer's segment cannot be opened"};
  struct stat st {};
  if (::fstat(f, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(SegmentHeader))) {
    ::close(f);
    return {StatusCode::malformed_packet, "shm: the peer's segment is smaller than a header"};
  }
  int err = 0;
  Mapping m = map_fd(f, static_cast<std::size_t>(st.st_size), err);
  ::close(f);  // the mapping keeps the memory
  if (!m) return {StatusCode::unreachable, "shm: the peer's segment cannot be mapped"};

  const auto* h = reinterpret_cast<const SegmentHeader*>(m.data());
  if (h->magic != SegmentHeader::kMagic || h->version != SegmentHeader::kVersion ||
      h->header_bytes != sizeof(SegmentHeader))
    return {StatusCode::malformed_packet, "shm: the peer's segment has a bad magic or version"};
  if (h->total_bytes != m.size() || h->owner_pid != pid || h->owner_task != task ||
      h->contexts != contexts || contexts > kMaxContexts)
    return {StatusCode::malformed_packet, "shm: the peer's segment does not match its address"};
  for (std::uint16_t c = 0; c < contexts; ++c) {
    const std::uint64_t off = h->queue_offset[c];
    if (off < sizeof(SegmentHeader) || off > m.size() || h->queue_bytes > m.size() - off ||
        off % device::kCacheLine != 0)
      return {StatusCode::malformed_packet, "shm: a queue offset lies outside the peer's segment"};
    if (!device::ReceptionQueue::attach(m.data() + off, h->queue_bytes, queues_[c]))
      return {StatusCode::malformed_packet, "shm: a reception queue in the peer's segment is invalid"};
  }
  const std::uint64_t table = h->regions_offset;
  if (table < sizeof(SegmentHeader) || table > m.size() || table % alignof(device::RegionSlot) != 0 ||
      h->region_capacity > (m.size() - table) / sizeof(device::RegionSlot))
    return {StatusCode::malformed_packet, "shm: the region table lies outside the peer's segment"};
  regions_ = reinterpret_cast<const device::RegionSlot*>(m.data() + table);
  region_capacity_ = h->region_capacity;
  auto* header = reinterpret_cast<SegmentHeader*>(m.data());
  for (std::uint16_t c = 0; c < contexts; ++c) {
    wake_fds_[c] = take_eventfd(pidfd, h->wake_fd[c]);
    if (wake_fds_[c] < 0) header->unwakeable.store(1, std::memory_order_release);
  }
  mapping_ = std::move(m);
  return Status::success();
}

}  // namespace ami::shm
