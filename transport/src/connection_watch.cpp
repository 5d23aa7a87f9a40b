// connection_watch.cpp — polling the bootstrap's connections for hang-ups
// and rank 0's notices.
#include "connection_watch.hpp"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include <algorithm>

#include "ami/device/coarse_clock.hpp"
#include "ami/device/wake.hpp"

namespace ami::detail {

ConnectionWatch::ConnectionWatch(std::vector<std::pair<std::uint32_t, int>> sockets, std::uint32_t self,
                                 std::uint32_t tasks)
    : self_(self), known_gone_(tasks, false) {
  for (const auto& [task, fd] : sockets) watched_.push_back({task, fd});
  gone_.reserve(tasks);
  epoll_ = ::epoll_create1(EPOLL_CLOEXEC);  // (-1: sleeping contexts learn of ends by their timers only)
  for (const Watched& w : watched_) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = w.fd;
    if (epoll_ >= 0) (void)::epoll_ctl(epoll_, EPOLL_CTL_ADD, w.fd, &ev);
  }
}

ConnectionWatch::~ConnectionWatch() {
  if (epoll_ >= 0) ::close(epoll_);
}

bool ConnectionWatch::pending() const {
  epoll_event ev;
  return epoll_ >= 0 && ::epoll_wait(epoll_, &ev, 1, 0) > 0;
}

void ConnectionWatch::add_waker(int fd) {
  std::lock_guard lock(lock_);
  wakers_.push_back(fd);
}

void ConnectionWatch::remove_waker(int fd) {
  std::lock_guard lock(lock_);
  std::erase(wakers_, fd);
}

// One poll() for every connection still open (rank 0 of a large job has
// one per task); the ends it finds are told to the others in one write each.
void ConnectionWatch::poll(bool now_please) {
  std::unique_lock lock(lock_, std::try_to_lock);
  if (!lock.owns_lock()) return;  // another context is looking
  const std::int64_t now = device::coarse_now_ns();
  if (now < next_poll_ns_ && !now_please) return;
  next_poll_ns_ = now + 10'000'000;
  fds_.clear();
  open_.clear();
  for (Watched& w : watched_) {
    if (w.closed) continue;
    fds_.push_back({w.fd, POLLIN | POLLRDHUP, 0});
    open_.push_back(&w);
  }
  if (fds_.empty() || ::poll(fds_.data(), fds_.size(), 0) <= 0) return;
  ended_.clear();
  for (std::size_t i = 0; i < fds_.size(); ++i) {
    const short revents = fds_[i].revents;
    if (revents == 0) continue;
    Watched& w = *open_[i];
    // Notices first: rank 0 may have sent some just before it ended.
    bool closed = (revents & POLLIN) != 0 && !read_notices(w);
    closed = closed || (revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL)) != 0;
    if (!closed) continue;
    w.closed = true;
    if (epoll_ >= 0) (void)::epoll_ctl(epoll_, EPOLL_CTL_DEL, w.fd, nullptr);  // it stays readable
    record(w.task);
    ended_.push_back(w.task);
  }
  if (self_ == 0 && !ended_.empty()) tell_others();
}

// Reads what the connection holds: whole notices are recorded, a part is
// kept for the next look. Only rank 0 sends any, and only about other tasks.
bool ConnectionWatch::read_notices(Watched& w) {
  for (;;) {
    const ssize_t n = ::recv(w.fd, w.partial.data() + w.have, kNoticeBytes - w.have, MSG_DONTWAIT);
    if (n == 0) return false;
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    w.have += static_cast<std::size_t>(n);
    if (w.have < kNoticeBytes) continue;
    w.have = 0;
    std::uint32_t magic = 0, task = 0;
    std::memcpy(&magic, w.partial.data(), 4);
    std::memcpy(&task, w.partial.data() + 4, 4);
    if (magic != kNoticeMagic || w.task != 0 || task == 0 || task == self_ || task >= known_gone_.size()) {
      bad_notices_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    record(task);
  }
}

void ConnectionWatch::record(std::uint32_t task) {
  if (task >= known_gone_.size() || known_gone_[task]) return;
  known_gone_[task] = true;
  gone_.push_back(task);
  count_.store(gone_.size(), std::memory_order_release);
  for (int fd : wakers_) device::notify(fd);
}

// Rank 0: the notices of ended_ to every task still connected, in one
// write. A few bytes into a socket buffer nothing else fills: should it not
// take them all at once, that task hears of the ends through its own lanes,
// if ever it needs to.
void ConnectionWatch::tell_others() {
  std::vector<unsigned char> notices(ended_.size() * kNoticeBytes);
  for (std::size_t i = 0; i < ended_.size(); ++i) {
    std::memcpy(notices.data() + i * kNoticeBytes, &kNoticeMagic, 4);
    std::memcpy(notices.data() + i * kNoticeBytes + 4, &ended_[i], 4);
  }
  for (const Watched& w : watched_)
    if (!w.closed) (void)::send(w.fd, notices.data(), notices.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

std::uint32_t ConnectionWatch::gone(std::size_t i) const {
  std::lock_guard lock(lock_);
  return gone_[i];
}

}  // namespace ami::detail
