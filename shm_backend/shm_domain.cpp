// shm_backend/shm_domain.cpp — setup of the shared-memory domain, the first
// mapping of each peer's segment, and the watch over mapped peers.
#include "shm_domain.hpp"

#include <poll.h>
#include <sys/epoll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "ami/device/coarse_clock.hpp"
#include "ami/error.hpp"

namespace ami::shm {

namespace {

// Is process_vm_readv allowed at all (seccomp filters in containers refuse
// it with EPERM or ENOSYS)? A peer's ptrace policy may still refuse it
// later; the device then switches to the rings.
bool cma_allowed() {
  char from[8] = "probe", to[8] = {};
  iovec local{to, sizeof to}, remote{from, sizeof from};
  return ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) == static_cast<ssize_t>(sizeof to);
}

constexpr Status kExitedUnmapped{StatusCode::peer_failed,
                                 "shm: the peer process exited before its segment was mapped"};

// Has the process exited? By its pidfd where there is one.
bool exited(int pidfd, std::uint32_t pid) {
  if (pidfd >= 0) {
    pollfd f{pidfd, POLLIN, 0};
    return ::poll(&f, 1, 0) == 1 && (f.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
  }
  return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

}  // namespace

ShmDomain::ShmDomain(std::uint32_t task, std::uint32_t tasks, std::uint16_t contexts,
                     const DomainOptions& options, device::RegionTable& regions, std::uint8_t key_id)
    : task_(task), tasks_(tasks), regions_(regions),
      own_(task, contexts, options.queue_depth, options.cell_bytes, regions.capacity()),
      peers_(std::make_unique<Peer[]>(tasks)), cma_(options.cma && cma_allowed()),
      stall_timeout_ms_(options.stall_timeout_ms),
      cpus_(static_cast<std::uint32_t>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)))), key_id_(key_id) {
  regions.publish_to(own_.regions());
  deaths_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (deaths_fd_ < 0) throw Error("shm: epoll_create1", errno);
}

Status ShmDomain::learn(const PeerAddress& peer) {
  if (peer.task >= tasks_ || peer.task == task_)
    return {StatusCode::invalid_argument, "shm: the address names no other task of the job"};
  if (peer.contexts != contexts())
    return {StatusCode::invalid_argument, "shm: the peer has another number of contexts"};
  if (peer.fd < 0 || peer.pid == 0)
    return {StatusCode::invalid_argument, "shm: the address names no segment"};
  Peer& p = peers_[peer.task];
  if (p.pid.load(std::memory_order_relaxed) != 0) return Status::success();  // (learnt once)
  p.fd = peer.fd;
  p.pid.store(peer.pid, std::memory_order_release);  // last: a context may be reading
  peers_known_.fetch_add(1, std::memory_order_relaxed);
  return Status::success();
}

// The slow path of map(): under the lock, so that two contexts asking at
// once map the peer once; the one that comes second finds the first one's
// attachment. (The device asks only for learnt tasks.)
Status ShmDomain::map_first(std::uint32_t task) {
  if (!reaches(task)) return {StatusCode::unreachable, "shm: the task is not a peer on this host"};
  std::lock_guard lock(lock_);
  Peer& p = peers_[task];
  if (const Attachment* a = p.attachment.load(std::memory_order_acquire)) return a->status;
  auto a = std::make_unique<Attachment>();
  a->task = task;
  a->status = open_segment(p, *a);
  if (a->status.ok()) segments_mapped_.fetch_add(1, std::memory_order_relaxed);
  if (a->status.ok() && a->pidfd >= 0) {  // a sleeping context wakes when the peer exits
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u32 = task;
    (void)::epoll_ctl(deaths_fd_, EPOLL_CTL_ADD, a->pidfd, &ev);
  }
  p.attachment.store(a.get(), std::memory_order_release);
  attachments_.push_back(std::move(a));
  return attachments_.back()->status;
}

// The pidfd comes first: it says when the process exits, and cannot name
// another process that reuses its pid later. A peer that exited since setup
// has no segment to open any more (its descriptors went with it).
Status ShmDomain::open_segment(const Peer& p, Attachment& a) {
  a.pidfd = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(p.pid), 0));
  if (a.pidfd < 0 && errno == ESRCH) return kExitedUnmapped;
  const Status s = a.segment.open(p.pid, p.fd, a.task, contexts(), a.pidfd);
  if (s.ok()) return s;
  const bool gone = exited(a.pidfd, p.pid);
  if (a.pidfd >= 0) ::close(a.pidfd);
  a.pidfd = -1;
  return gone ? kExitedUnmapped : Status{StatusCode::peer_failed, s.what()};
}

ShmDomain::~ShmDomain() {
  for (const auto& a : attachments_)
    if (a->pidfd >= 0) ::close(a->pidfd);
  ::close(deaths_fd_);
}

bool ShmDomain::death_pending() const {
  epoll_event ev;
  return ::epoll_wait(deaths_fd_, &ev, 1, 0) > 0;
}

// Only the mapped peers are looked at: the others cost nothing here.
void ShmDomain::watch(bool now_please) {
  std::unique_lock lock(lock_, std::try_to_lock);
  if (!lock.owns_lock()) return;  // another context is looking, or mapping a peer
  const std::int64_t now = device::coarse_now_ns();
  if (now < next_watch_ns_ && !now_please) return;
  next_watch_ns_ = now + 10'000'000;
  for (const auto& a : attachments_) {
    const Peer& p = peers_[a->task];
    if (!a->status.ok() || p.dead.load(std::memory_order_relaxed)) continue;
    if (exited(a->pidfd, p.pid)) mark_dead(a->task);
  }
}

// Rare: only while a ring is held up past AMI_SHM_STALL_TIMEOUT. A pidfd
// opened for the look is closed at once.
bool ShmDomain::look_at_unmapped_peers() {
  std::unique_lock lock(lock_, std::try_to_lock);
  if (lock.owns_lock()) {
    for (std::uint32_t task = 0; task < tasks_; ++task) {
      const Peer& p = peers_[task];
      if (p.pid == 0 || p.attachment.load(std::memory_order_relaxed) != nullptr ||
          p.dead.load(std::memory_order_relaxed))
        continue;
      const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(p.pid), 0));
      const bool gone = pidfd >= 0 ? exited(pidfd, p.pid) : errno == ESRCH || exited(-1, p.pid);
      if (pidfd >= 0) ::close(pidfd);
      if (gone) mark_dead(task);
    }
  }
  return deaths() != 0;
}

// Every context hears of it, asleep or not: the pidfd leaves the set of
// deaths to wake on (it stays readable), and each context's eventfd is
// written, since the context that saw it may not be the one it concerns.
void ShmDomain::mark_dead(std::uint32_t task) {
  peers_[task].dead.store(true, std::memory_order_release);
  dead_list_.push_back(task);
  deaths_.fetch_add(1, std::memory_order_acq_rel);
  if (const Attachment* a = peers_[task].attachment.load(std::memory_order_acquire); a != nullptr && a->pidfd >= 0)
    (void)::epoll_ctl(deaths_fd_, EPOLL_CTL_DEL, a->pidfd, nullptr);
  for (std::uint16_t c = 0; c < contexts(); ++c) device::notify(own_.wake_fd(c));
}

std::vector<std::uint32_t> ShmDomain::dead_tasks() {
  std::lock_guard lock(lock_);
  return dead_list_;
}

}  // namespace ami::shm
