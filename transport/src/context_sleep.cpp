// context_sleep.cpp — a context that sleeps until work arrives
// (docs/DESIGN.md, "Event-driven progress"): its wake-up set, and arm(),
// the step between "drained" and "asleep".
#include <algorithm>
#include <vector>

#include "ami/client.hpp"
#include "ami/device/coarse_clock.hpp"
#include "context_impl.hpp"

namespace ami::detail {

namespace {

constexpr Status kSignalled{StatusCode::busy, "arm: signal() or post() since the last advance()"};
constexpr Status kPending{StatusCode::busy, "arm: work to run in advance() (posted work, callbacks due, "
                                            "control packets to send, a peer's end to take in)"};
// A suspect whose packets still came at its grace's end is judged again
// after this long.
constexpr std::int64_t kJudgeAgain = 10'000'000;

}  // namespace

Status ContextImpl::open_wake() {
  if (wake.is_open()) return Status::success();
  std::vector<int> sources;
  for (const auto& d : devices)
    for (int fd : d->wake_fds()) sources.push_back(fd);
  if (connections != nullptr) sources.push_back(connections->wake_fd());
  const Status s = wake.open(sources);
  if (s.ok() && connections != nullptr) connections->add_waker(wake.signal_fd());
  return s;
}

// Order: what is held back for a lull goes out; the context's own
// descriptors are read back to quiet; then each device arms and looks once
// more. Anything that comes after its source was read makes that source
// readable again, so nothing is slept through; anything found is "busy".
// Only the sources the set reports readable are read back: one epoll_wait
// replaces a read per source (a ping-pong arms once a message). A source
// written after that look stays readable, and wakes the sleeper.
Status ContextImpl::arm() {
  if (Status s = open_wake(); !s.ok()) return s;
  sleeping.store(false, std::memory_order_relaxed);
  (void)engine.prepare_sleep();
  constexpr int kMax = 16;
  int ready[kMax];
  const int n = wake.ready(ready, kMax);
  const auto readable = [&](int fd) { return n >= kMax || std::find(ready, ready + n, fd) != ready + n; };
  if (connections != nullptr) {
    if (readable(connections->wake_fd()) && connections->pending()) connections->poll(true);
    take_ends();
    judge_suspects();
  }
  const bool signalled = readable(wake.signal_fd()) && wake.take_signal();
  if (readable(wake.timer_fd())) (void)wake.take_timer();
  if (signalled) return kSignalled;
  if (engine.has_pending_work()) return kPending;
  for (const auto& d : devices) {
    const std::span<const int> fds = d->wake_fds();
    const bool quiet = std::none_of(fds.begin(), fds.end(), readable);
    if (Status s = quiet ? d->arm_quiet() : d->arm(); !s.ok()) return s;
  }
  std::int64_t deadline = engine.next_deadline_ns();
  if (!suspects.empty()) {
    const std::int64_t now = device::coarse_now_ns();
    for (const Suspect& s : suspects) {
      const std::int64_t due = std::max(s.since_ns + kGrace, now + kJudgeAgain);
      deadline = deadline == 0 ? due : std::min(deadline, due);
    }
  }
  wake.set_deadline(deadline);
  sleeping.store(true, std::memory_order_release);
  return Status::success();
}

}  // namespace ami::detail
