// wake_set.cpp — the epoll set, eventfd and timerfd of a context that sleeps.
#include "wake_set.hpp"

#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>

namespace ami::detail {

namespace {

// The coarse clock the deadlines are read on may lag the timer's by a tick
// (a few ms): a timer that fired before the deadline is due there would
// only wake the context to find nothing due, again and again.
constexpr std::int64_t kSlack = 5'000'000;
constexpr int kMaxReady = 16;

}  // namespace

WakeSet::~WakeSet() {
  if (timer_ >= 0) ::close(timer_);
  if (epoll_ >= 0) ::close(epoll_);
}

Status WakeSet::open(std::span<const int> sources) {
  if (is_open()) return Status::success();
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) return {StatusCode::no_resource, "arm: epoll_create1 failed (descriptors exhausted?)"};
  const int timer = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (timer < 0) {
    ::close(ep);
    return {StatusCode::no_resource, "arm: timerfd_create failed (descriptors exhausted?)"};
  }
  auto add = [&](int fd) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    return ::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0 || errno == EEXIST;  // (two devices may share one)
  };
  bool ok = add(signal_.fd()) && add(timer);
  for (int fd : sources) ok = ok && (fd < 0 || add(fd));
  if (!ok) {
    ::close(timer);
    ::close(ep);
    return {StatusCode::device_error, "arm: epoll_ctl refused a wake-up descriptor"};
  }
  epoll_ = ep;
  timer_ = timer;
  return Status::success();
}

void WakeSet::set_deadline(std::int64_t deadline_ns) {
  if (timer_ < 0 || deadline_ns == deadline_ns_) return;
  deadline_ns_ = deadline_ns;
  itimerspec t{};
  if (deadline_ns != 0) {
    const std::int64_t at = deadline_ns + kSlack;
    t.it_value.tv_sec = static_cast<time_t>(at / 1'000'000'000);
    t.it_value.tv_nsec = static_cast<long>(at % 1'000'000'000);
  }
  (void)::timerfd_settime(timer_, TFD_TIMER_ABSTIME, &t, nullptr);
}

int WakeSet::ready(int* fds, int max) const {
  epoll_event ev[kMaxReady];
  if (epoll_ < 0) return max;
  const int n = ::epoll_wait(epoll_, ev, std::min(max, kMaxReady), 0);
  if (n < 0) return max;  // (as if all were: each is read back)
  for (int i = 0; i < n; ++i) fds[i] = ev[i].data.fd;
  return n;
}

// A timer that fired is disarmed (it is one-shot): the next set_deadline()
// must set it again, even to the same deadline.
bool WakeSet::take_timer() {
  std::uint64_t expirations = 0;
  const bool fired =
      timer_ >= 0 && ::read(timer_, &expirations, sizeof expirations) == static_cast<ssize_t>(sizeof expirations);
  if (fired) deadline_ns_ = 0;
  return fired;
}

}  // namespace ami::detail
