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
  std::uint64_t atomics = 0;           // posted by this context
  std::uint64_t atomics_executed = 0;  // done here for peers, from atomic packets
  std::uint64_t queued = 0;          // instructions that waited in the work queue
  std::uint64_t remote_done_sent = 0;
  std::uint64_t remote_done_received = 0;
  std::uint64_t unknown_dispatch = 0;   // arrivals for an unregistered id, dropped
  std::uint64_t discarded_bytes = 0;    // payload a handler gave no buffer for
  std::uint64_t malformed_packets = 0;  // dropped; by reason below
  static constexpr std::size_t kMalformedReasons = 10;
  std::array<std::uint64_t, kMalformedReasons> malformed_by_reason{};

  // The rendezvous (eager SEND, receiver STOP, GET or PUT). Sender side:
  std::uint64_t rndv_sent = 0;          // messages a receiver could stop (more than one packet)
  std::uint64_t rndv_unregistered = 0;  // sent eagerly only: the buffer could not be registered
  std::uint64_t rndv_stopped = 0;       // of rndv_sent, stopped by their receiver
  std::uint64_t rndv_put_bytes = 0;     // moved by stop_put
  // Receiver side: every decision of the stop policy (protocol/am/rndv/policy.hpp)
  // and the inputs that made it stop.
  std::uint64_t rndv_decisions = 0;
  static constexpr std::size_t kStopReasons = 5;  // no_buffer, zero_copy, reception_low, large, deferred
  std::array<std::uint64_t, kStopReasons> rndv_stops_by_reason{};
  // By the path the rest of the message took: the three AMI_RNDV_MODE modes,
  // then the two a message without a buffer takes whatever that mode says
  // (drops what still comes eagerly, as discard_get does) — discard (no
  // buffer: nothing is fetched) and deferred_get (Receive::defer: accept()
  // GETs the whole message, or drops it given no buffer).
  static constexpr std::size_t kStopModes = 5;  // discard_get, split_get, stop_put, discard, deferred_get
  std::array<std::uint64_t, kStopModes> rndv_stops_by_mode{};
  unsigned reception_load_max = 0;        // highest reception load (percent) a decision saw
  std::uint64_t rndv_eager_complete = 0;  // stoppable messages that arrived whole, eagerly
  std::uint64_t rndv_get_bytes = 0;       // fetched by discard_get and split_get
  std::uint64_t rndv_late_bytes = 0;      // eager bytes that arrived after a stop
  // Acknowledgements (docs/DESIGN.md, method 4): one ack answers a run of
  // messages (remote-dones, rendezvous verdicts, fence answers) from one
  // origin, sent when the context is idle or the origin's window is full.
  std::uint64_t acks_sent = 0;
  std::uint64_t acks_received = 0;
  std::uint64_t messages_acked = 0;       // messages the acks sent answered
  std::uint64_t messages_ack_received = 0;  // messages the acks received answered
  std::uint64_t credit_returns = 0;       // lulls in which reception credit went back to the devices
  // Fences: by a message behind the operations (ordered lanes), or by
  // flushing a lane that may reorder; answered as a target.
  std::uint64_t fences_by_message = 0;
  std::uint64_t fences_by_flush = 0;
  std::uint64_t fences_answered = 0;
  // Peer failure (a lane lost for good) and the keepalives that find it.
  std::uint64_t peers_failed = 0;
  std::uint64_t keepalives_sent = 0;
  std::uint64_t keepalives_received = 0;
  std::uint64_t packets_from_failed = 0;  // arrived from a peer already failed; dropped
  // Arrived from an endpoint of the job this context has no lane to on the
  // backend they came by, so it cannot answer them: dropped, and when no
  // backend here reaches the endpoint at all, the endpoint fails here (its
  // sender cannot be told). An origin outside the job is malformed instead
  // (bad_origin).
  std::uint64_t packets_from_unknown_peers = 0;
  // The context's registration cache.
  std::uint64_t rcache_hits = 0;
  std::uint64_t rcache_misses = 0;
  std::uint64_t rcache_evictions = 0;
};

// Acknowledgements a context sent to one peer (Context::ack_stats).
struct AckPeerStats {
  std::uint64_t messages_acked = 0;
  std::uint64_t acks_sent = 0;
};

// Names of rndv_stops_by_reason[i] and rndv_stops_by_mode[i].
std::string_view stop_reason_name(std::size_t i);
std::string_view stop_mode_name(std::size_t i);

// Name of malformed_by_reason[i]: "truncated", "bad_magic", ..., "out_of_sequence".
std::string_view malformed_reason_name(std::size_t i);

}  // namespace ami
