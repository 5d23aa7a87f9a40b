// fork_guard.hpp — telling a process's own ami objects from the copies a
// fork() left in its child. Internal.
//
// A child holds copies of every ami object of its parent, and behind them
// the very same shared state: the shared-memory rings (its own incoming ring
// included), the allocated regions and their headers, the region table
// published to peers, the verbs queue pairs (one uverbs file for both), the
// PMIx session and the bootstrap's connections. Used there, they would send
// as the parent and take the parent's arrivals; destroyed there, they would
// tear down what the parent still uses. rdma-core (ibv_fork_init) and UCX
// take the same view: a child may make its own resources, never use the
// inherited ones.
//
// So every Context and Memory notes the process's fork generation when it is
// made. A pthread_atfork child handler, registered once by the first Client,
// adds one to the generation in every child; an object whose generation is
// not the current one belongs to an ancestor. Its calls return
// kForkedChild<"call">, advance() does nothing, and its destructor leaves
// shared state as it is: it unmaps and closes its own copies, or leaks what
// it cannot free without touching the parent's (verbs objects, the PMIx
// session). A Client made in the child is the child's and works.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ami/status.hpp"

namespace ami::detail {

// Forks between this process and the first one that armed the guard.
// Written only by the child handler, before the child runs anything else.
extern std::atomic<std::uint32_t> fork_generation_now;

// Registers the child handler (once per process, thread-safe) and returns
// the current generation, for an object being made. Throws ami::Error when
// the handler cannot be registered.
std::uint32_t arm_fork_guard();

// On the hot path: one relaxed load. generation: the object's, from
// arm_fork_guard() or current_fork_generation() when it was made.
inline bool in_forked_child(std::uint32_t generation) noexcept {
  return fork_generation_now.load(std::memory_order_relaxed) != generation;
}

// A call's name, as a template argument: kForkedChild<"send">.
template <std::size_t N>
struct CallName {
  consteval CallName(const char (&name)[N]) { std::copy_n(name, N, text); }
  char text[N];
};

inline constexpr std::string_view kForkedChildCause =
    ": this process was forked from the one that made the Client; its ami objects belong to the parent "
    "(make a new Client in the child)";

template <CallName call>
inline constexpr auto kForkedChildText = [] {
  constexpr std::size_t name = sizeof(call.text) - 1;
  std::array<char, name + kForkedChildCause.size() + 1> text{};
  std::copy_n(call.text, name, text.begin());
  std::copy(kForkedChildCause.begin(), kForkedChildCause.end(), text.begin() + name);
  return text;
}();

// What every call on an inherited object returns, naming the call.
template <CallName call>
inline constexpr Status kForkedChild{StatusCode::not_supported, kForkedChildText<call>.data()};

}  // namespace ami::detail
