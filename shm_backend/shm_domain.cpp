// shm_backend/shm_domain.cpp — setup of the shared-memory domain.
#include "shm_backend/shm_domain.hpp"

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>

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
                     const DomainOptions& options, const device::RegionTable& regions)
    : task_(task), regions_(regions),
      own_(task, contexts, options.queue_depth, options.cell_bytes), peers_(tasks),
      cma_(options.cma && cma_allowed()) {}

Status ShmDomain::attach(const PeerAddress& peer) {
  if (peer.task >= peers_.size() || peer.task == task_)
    return {StatusCode::invalid_argument, "shm: attach names no other task of the job"};
  if (peer.contexts != contexts())
    return {StatusCode::invalid_argument, "shm: the peer has another number of contexts"};
  auto segment = std::make_unique<PeerSegment>();
  Status s = segment->open(peer.pid, peer.fd, peer.task, peer.contexts);
  if (!s.ok()) return s;
  peers_[peer.task] = Peer{std::move(segment), peer.pid};
  return Status::success();
}

}  // namespace ami::shm
