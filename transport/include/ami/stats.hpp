// ami/stats.hpp — counters a context keeps about itself. Plain data, read
// with Context::stats() on the advancing thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ami {

struct ContextStats {
  std::uint64_t messages_sent = 0;
  std::uint64_t messages_received = 0;
  std::uint64_t packets_sent = 0;
  std::uint64_t packets_received = 0;
  std::uint64_t bytes_sent = 0;      // payload bytes
  std::uint64_t bytes_received = 0;  // payload bytes
  std::uint64_t puts = 0;
  std::uint64_t gets = 0;
  std::uint64_t queued = 0;          // instructions that waited in the work queue
  std::uint64_t remote_done_sent = 0;
  std::uint64_t remote_done_received = 0;
  std::uint64_t unknown_dispatch = 0;   // arrivals for an unregistered id, dropped
  std::uint64_t discarded_bytes = 0;    // payload a handler gave no buffer for
  std::uint64_t malformed_packets = 0;  // dropped; by reason below
  static constexpr std::size_t kMalformedReasons = 9;
  std::array<std::uint64_t, kMalformedReasons> malformed_by_reason{};
};

// Name of malformed_by_reason[i]: "truncated", "bad_magic", ..., "out_of_sequence".
std::string_view malformed_reason_name(std::size_t i);

}  // namespace ami
