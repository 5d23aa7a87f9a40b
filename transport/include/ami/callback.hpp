// ami/callback.hpp — completion callbacks and endpoints, the vocabulary every
// layer shares.
//
// A Callback is a plain function pointer and a cookie: no allocation, no
// ownership. The cookie's owner keeps it alive until the callback has run.
// Callbacks run inside Context::advance() on the thread advancing the
// context, never from another thread and never from inside the call that
// posted the operation.
#pragma once

#include <compare>
#include <cstdint>

#include "ami/status.hpp"

namespace ami {

using CallbackFn = void (*)(void* cookie, Status status);

struct Callback {
  CallbackFn fn = nullptr;
  void* cookie = nullptr;

  constexpr explicit operator bool() const { return fn != nullptr; }
  void operator()(Status status) const { fn(cookie, status); }
};

// The address of a message: a task (process rank) and a context index in it.
struct Endpoint {
  std::uint32_t task = 0;
  std::uint16_t context = 0;

  friend constexpr auto operator<=>(const Endpoint&, const Endpoint&) = default;
};

}  // namespace ami
