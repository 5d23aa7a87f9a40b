// shm_backend/shm_domain.cpp — setup of the shared-memory domain.
#include "shm_domain.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>

#include "ami/device/coarse_clock.hpp"

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

}  // namespace

ShmDomain::ShmDomain(std::uint32_t task, std::uint32_t tasks, std::uint16_t contexts,
                     const DomainOptions& options, device::RegionTable& regions, std::uint8_t key_id)
    : task_(task), regions_(regions),
      own_(task, contexts, options.queue_depth, options.cell_bytes, regions.capacity()), peers_(tasks),
      cma_(options.cma && cma_allowed()), stall_timeout_ms_(options.stall_timeout_ms),
      key_id_(key_id) {
  regions.publish_to(own_.regions());
}

Status ShmDomain::attach(const PeerAddress& peer) {
  if (peer.task >= peers_.size() || peer.task == task_)
    return {StatusCode::invalid_argument, "shm: attach names no other task of the job"};
  if (peer.contexts != contexts())
    return {StatusCode::invalid_argument, "shm: the peer has another number of contexts"};
  auto segment = std::make_unique<PeerSegment>();
  Status s = segment->open(peer.pid, peer.fd, peer.task, peer.contexts);
  if (!s.ok()) return s;
  Peer& p = peers_[peer.task];
  p.segment = std::move(segment);
  p.pid = peer.pid;
  // A pidfd says when the process exits, and cannot name another process
  // that reuses its pid later.
  p.pidfd = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(peer.pid), 0));
  return Status::success();
}

ShmDomain::~ShmDomain() {
  for (Peer& p : peers_)
    if (p.pidfd >= 0) ::close(p.pidfd);
}

void ShmDomain::watch() {
  std::unique_lock lock(watch_lock_, std::try_to_lock);
  if (!lock.owns_lock()) return;  // another context is looking
  const std::int64_t now = device::coarse_now_ns();
  if (now < next_watch_ns_) return;
  next_watch_ns_ = now + 10'000'000;
  for (Peer& p : peers_) {
    if (p.segment == nullptr || p.dead->load(std::memory_order_relaxed)) continue;
    bool exited = false;
    if (p.pidfd >= 0) {
      pollfd f{p.pidfd, POLLIN, 0};
      exited = ::poll(&f, 1, 0) == 1 && (f.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
    } else {
      exited = ::kill(static_cast<pid_t>(p.pid), 0) != 0 && errno == ESRCH;
    }
    if (!exited) continue;
    p.dead->store(true, std::memory_order_release);
    deaths_.fetch_add(1, std::memory_order_acq_rel);
  }
}

}  // namespace ami::shm
