// ami/device/coarse_clock.hpp — the clock the progress engine's periodic
// checks read (keepalives, watching for peers that ended, stalled cells).
//
// Those checks run from advance(), many times per message, and need
// milliseconds, not nanoseconds. CLOCK_MONOTONIC_COARSE is read from the
// vDSO page without touching the hardware clock, so it never becomes a
// system call — CLOCK_MONOTONIC (std::chrono::steady_clock) does wherever
// the clock source cannot be read from user space (a guest without a
// stable TSC, soft-RoCE's VMs among them). Resolution: one tick (1-4 ms).
#pragma once

#include <time.h>

#include <cstdint>

namespace ami::device {

inline std::int64_t coarse_now_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
  return std::int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
}

// The same clock, read exactly: for the rare places that judge a deadline a
// timer just woke them for (before sleeping), where the coarse reading may
// still lag the timer by a tick or more and make every wake-up early.
inline std::int64_t precise_now_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return std::int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
}

}  // namespace ami::device
