// connection_watch.cpp — polling the bootstrap's connections for hang-ups.
#include "connection_watch.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <chrono>

namespace ami::detail {

ConnectionWatch::ConnectionWatch(std::vector<std::pair<std::uint32_t, int>> sockets) {
  for (const auto& [task, fd] : sockets) watched_.push_back({task, fd});
  gone_.reserve(watched_.size());
}

void ConnectionWatch::poll() {
  std::unique_lock lock(lock_, std::try_to_lock);
  if (!lock.owns_lock()) return;  // another context is looking
  const std::int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now().time_since_epoch())
                               .count();
  if (now < next_poll_ns_) return;
  next_poll_ns_ = now + 10'000'000;
  for (Watched& w : watched_) {
    if (w.closed) continue;
    pollfd f{w.fd, POLLIN | POLLRDHUP, 0};
    if (::poll(&f, 1, 0) != 1) continue;
    bool closed = (f.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL)) != 0;
    if (!closed && (f.revents & POLLIN) != 0) {
      // Readable: the end of the stream, or bytes nobody should send now
      // (left unread: they say nothing about the peer's life).
      char byte;
      closed = ::recv(w.fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
    }
    if (!closed) continue;
    w.closed = true;
    gone_.push_back(w.task);
    count_.store(gone_.size(), std::memory_order_release);
  }
}

std::uint32_t ConnectionWatch::gone(std::size_t i) const {
  std::lock_guard lock(lock_);
  return gone_[i];
}

}  // namespace ami::detail
