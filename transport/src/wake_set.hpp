// wake_set.hpp — what a sleeping context waits on (docs/DESIGN.md,
// "Event-driven progress"): one epoll set, the descriptor Context::event_fd()
// returns, holding the context's own eventfd (signal(), and post() to a
// context asleep), a timerfd for the deadlines advance() keeps (keepalive
// rounds, a peer known gone waiting out its grace), and every descriptor the
// devices and the connection watch name. Level-triggered inside; made on
// first use, so that a context only ever polled pays nothing for it.
// Internal.
#pragma once

#include <cstdint>
#include <span>

#include "ami/device/wake.hpp"
#include "ami/status.hpp"

namespace ami::detail {

class WakeSet {
 public:
  WakeSet() = default;
  WakeSet(const WakeSet&) = delete;
  WakeSet& operator=(const WakeSet&) = delete;
  ~WakeSet();

  // Makes the set with sources in it besides its own two; a status naming
  // the call that failed otherwise (nothing is left open then).
  Status open(std::span<const int> sources);
  bool is_open() const { return epoll_ >= 0; }
  int fd() const { return epoll_; }
  int signal_fd() const { return signal_.fd(); }

  // The descriptors of the set readable now, at most max of them into fds;
  // returns how many (max: perhaps more). Reading back only those costs
  // one system call more than none, not one per source.
  int ready(int* fds, int max) const;
  int timer_fd() const { return timer_; }

  // Thread-safe.
  void signal() const { signal_.notify(); }
  // Reads the eventfd back to zero: true when it had been written.
  bool take_signal() const { return signal_.drain(); }
  // The timer fires at deadline_ns (coarse clock ns); 0 stops it. A
  // deadline already armed costs no system call.
  void set_deadline(std::int64_t deadline_ns);
  // Reads the timerfd back to quiet: true when it had fired.
  bool take_timer();

 private:
  int epoll_ = -1;
  int timer_ = -1;
  device::EventFd signal_;
  std::int64_t deadline_ns_ = 0;
};

}  // namespace ami::detail
