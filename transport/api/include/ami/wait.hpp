// ami/wait.hpp — waiting that yields the core: advance a context until a
// condition holds, busy-polling for a bounded time and then sleeping on its
// event_fd() (docs/DESIGN.md, "Event-driven progress"). With more tasks
// than cores a spinning waiter takes the core its peer needs to answer.
//
//   ami::wait_until(ctx, [&] { return done; });                 // spin 50 us, then sleep
//   ami::wait_until(ctx, [&] { return done; }, {.spin = {}});   // sleep at once
//
// Called by the thread that advances the context (under lock() where
// threads share it: the lock is held throughout, sleeping included).
#pragma once

#include <poll.h>
#include <sched.h>

#include <cerrno>
#include <chrono>
#include <cstddef>

#include "ami/context.hpp"
#include "ami/status.hpp"

namespace ami {

struct WaitOptions {
  // How long to keep advancing after the last event before sleeping; 0:
  // sleep as soon as an advance() finds nothing. A round trip within it
  // costs no wake-up.
  std::chrono::nanoseconds spin = std::chrono::microseconds(50);
  // How long to wait in all; the largest value: no limit.
  std::chrono::nanoseconds timeout = std::chrono::nanoseconds::max();
  // advance() loops per call.
  std::size_t batch = 16;
  // While spinning, sched_yield() after each advance() that found nothing:
  // with more tasks than cores the task waited for may run meanwhile.
  bool yield = false;
};

// Advances c until done() holds (checked after every advance(), and before
// the first). Returns
//  - ok: done() holds;
//  - timeout: it did not within o.timeout;
//  - invalid_argument: o.batch is 0, or a negative spin or timeout;
//  - the error arm() gave, other than busy and not_supported. A context
//    that cannot sleep (not_supported) is advanced with sched_yield()
//    between idle rounds instead.
template <typename Done>
Status wait_until(Context& c, Done&& done, const WaitOptions& o = {}) {
  using Clock = std::chrono::steady_clock;
  if (o.batch == 0 || o.spin.count() < 0 || o.timeout.count() < 0)
    return {StatusCode::invalid_argument, "wait_until: batch must be at least 1, spin and timeout not negative"};
  if (done()) return Status::success();
  const auto start = Clock::now();
  const bool forever = o.timeout == std::chrono::nanoseconds::max();
  const auto deadline = forever ? Clock::time_point::max() : start + o.timeout;
  auto last_event = start;
  bool can_sleep = true;
  bool woken = false;  // after a wake-up, an idle advance() sleeps again at once
  for (;;) {
    if (c.advance(o.batch) != 0) {
      if (done()) return Status::success();
      last_event = Clock::now();
      woken = false;
      continue;
    }
    if (done()) return Status::success();
    const auto now = Clock::now();
    if (now >= deadline) return {StatusCode::timeout, "wait_until: the condition did not hold in time"};
    if (!woken && now - last_event < o.spin) {
      if (o.yield) (void)sched_yield();
      continue;
    }
    if (!can_sleep) {
      (void)sched_yield();
      continue;
    }
    const Status s = c.arm();
    if (s == StatusCode::busy) continue;
    if (s == StatusCode::not_supported) {
      can_sleep = false;
      continue;
    }
    if (!s.ok()) return s;
    int ms = -1;
    if (!forever)
      ms = static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count());
    pollfd p{c.event_fd(), POLLIN, 0};
    const int n = ::poll(&p, 1, ms);
    if (n < 0 && errno != EINTR) return {StatusCode::device_error, "wait_until: poll on event_fd() failed"};
    woken = true;
  }
}

}  // namespace ami
