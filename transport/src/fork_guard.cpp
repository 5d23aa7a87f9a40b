// fork_guard.cpp — the fork generation and the child handler that moves it.
#include "fork_guard.hpp"

#include <pthread.h>

#include <mutex>

#include "ami/error.hpp"
#include "ami/memory.hpp"

namespace ami::detail {

std::atomic<std::uint32_t> fork_generation_now{0};

namespace {

// Runs in the child, in its only thread, before fork() returns there: an
// atomic add is all it does (async-signal-safe).
void on_fork_child() { fork_generation_now.fetch_add(1, std::memory_order_relaxed); }

std::once_flag armed;

}  // namespace

std::uint32_t arm_fork_guard() {
  // A throw leaves the flag unset: the next Client tries again.
  std::call_once(armed, [] {
    if (int rc = ::pthread_atfork(nullptr, nullptr, &on_fork_child); rc != 0)
      throw Error("Client: pthread_atfork (the fork guard)", rc);
  });
  return fork_generation_now.load(std::memory_order_relaxed);
}

std::uint32_t current_fork_generation() noexcept { return fork_generation_now.load(std::memory_order_relaxed); }

}  // namespace ami::detail
