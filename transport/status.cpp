// status.cpp — names of status codes, errors and statistics.
#include <cstring>

#include "ami/error.hpp"
#include "ami/stats.hpp"
#include "ami/status.hpp"

namespace ami {

std::string_view to_string(StatusCode code) {
  switch (code) {
    case StatusCode::ok: return "ok";
    case StatusCode::in_progress: return "in_progress";
    case StatusCode::no_resource: return "no_resource";
    case StatusCode::invalid_argument: return "invalid_argument";
    case StatusCode::not_registered: return "not_registered";
    case StatusCode::unknown_dispatch: return "unknown_dispatch";
    case StatusCode::unreachable: return "unreachable";
    case StatusCode::remote_access: return "remote_access";
    case StatusCode::malformed_packet: return "malformed_packet";
    case StatusCode::peer_failed: return "peer_failed";
    case StatusCode::device_error: return "device_error";
    case StatusCode::canceled: return "canceled";
    case StatusCode::timeout: return "timeout";
    case StatusCode::not_supported: return "not_supported";
    case StatusCode::busy: return "busy";
  }
  return "unknown_status";
}

std::string to_string(Status status) {
  std::string s(to_string(status.code()));
  if (status.what() != nullptr && *status.what() != '\0') {
    s += ": ";
    s += status.what();
  }
  return s;
}

Error::Error(const std::string& call, int err) : std::runtime_error(call + ": " + std::strerror(err)) {}

std::string_view malformed_reason_name(std::size_t i) {
  static constexpr std::string_view kNames[ContextStats::kMalformedReasons] = {
      "truncated", "bad_magic", "bad_version", "bad_type", "bad_flags",
      "bad_length", "bad_offset", "out_of_sequence", "bad_origin", "bad_rendezvous"};
  return i < ContextStats::kMalformedReasons ? kNames[i] : "unknown";
}

}  // namespace ami

namespace ami {

std::string_view stop_reason_name(std::size_t i) {
  static constexpr std::string_view kNames[] = {"no_buffer", "zero_copy", "reception_low", "large", "deferred"};
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

std::string_view stop_mode_name(std::size_t i) {
  static constexpr std::string_view kNames[] = {"discard_get", "split_get", "stop_put", "discard", "deferred_get"};
  static_assert(std::size(kNames) == ContextStats::kStopModes);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

}  // namespace ami
