// ami/status.hpp — the result of every non-blocking call and every completion.
//
// A Status is a code plus a static text naming the problem (a string literal
// owned by the library, never freed), so returning one never allocates.
// Thread-safety: a value type; copy it freely.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ami {

enum class StatusCode : std::uint8_t {
  ok,
  in_progress,       // accepted; completion is reported by a callback
  no_resource,       // try again after advance(): a FIFO, pool or ring is full
  invalid_argument,  // the call's arguments are wrong; nothing was done
  not_registered,    // memory is not covered by a registration
  unknown_dispatch,  // no handler is registered for the dispatch id
  unreachable,       // no backend can reach the endpoint
  remote_access,     // a remote key or range was refused
  malformed_packet,  // wire input failed validation
  peer_failed,       // the peer died or its lane broke
  device_error,      // the device reported an error for this operation
  canceled,          // the operation was dropped before it completed
  timeout,
  not_supported,
  busy,              // Context::arm(): work came in; advance() before sleeping
};

class [[nodiscard]] Status {
 public:
  constexpr Status() = default;
  constexpr Status(StatusCode code, const char* what = "") : code_(code), what_(what) {}

  static constexpr Status success() { return {}; }

  constexpr StatusCode code() const { return code_; }
  constexpr const char* what() const { return what_; }
  constexpr bool ok() const { return code_ == StatusCode::ok; }
  // ok or in_progress: the call was accepted.
  constexpr bool accepted() const {
    return code_ == StatusCode::ok || code_ == StatusCode::in_progress;
  }

  friend constexpr bool operator==(Status a, StatusCode c) { return a.code_ == c; }

 private:
  StatusCode code_ = StatusCode::ok;
  const char* what_ = "";
};

std::string_view to_string(StatusCode code);
// "invalid_argument: send: payload is null but its length is 12"
std::string to_string(Status status);

}  // namespace ami
