// ami/device/wake.hpp — what wakes a sleeping context: an eventfd owned by
// whoever sleeps on it and written by whoever brings it work
// (docs/DESIGN.md, "Event-driven progress").
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <utility>

#include "ami/error.hpp"

namespace ami::device {

// Wakes whoever sleeps on fd (an eventfd). Safe from any thread or process
// holding a descriptor of it; a counter already at its maximum is as good
// as written.
inline void notify(int fd) {
  const std::uint64_t one = 1;
  if (fd >= 0) (void)!::write(fd, &one, sizeof one);
}

// Reads an eventfd back to zero; true when it had been written.
inline bool drain(int fd) {
  std::uint64_t n = 0;
  return fd >= 0 && ::read(fd, &n, sizeof n) == static_cast<ssize_t>(sizeof n) && n != 0;
}

// A non-blocking eventfd, owned. Move-only. Throws ami::Error naming the call.
class EventFd {
 public:
  EventFd() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (fd_ < 0) throw Error("eventfd", errno);
  }
  EventFd(EventFd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  EventFd& operator=(EventFd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  EventFd(const EventFd&) = delete;
  EventFd& operator=(const EventFd&) = delete;
  ~EventFd() {
    if (fd_ >= 0) ::close(fd_);
  }

  int fd() const { return fd_; }
  void notify() const { device::notify(fd_); }
  bool drain() const { return device::drain(fd_); }

 private:
  int fd_;
};

}  // namespace ami::device
