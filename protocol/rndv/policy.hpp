// protocol/rndv/policy.hpp — when a receiver stops an eager message, and how
// the rest of it travels (DESIGN.md, method 2).
//
// The sender of a message longer than one packet always starts eagerly and
// never decides anything; its receiver runs decide() when the first packet
// arrives and again with every later eager packet, until it stops the
// message or the message is complete. The inputs are data-flow conditions
// at the receiver, each counted in ContextStats when it causes a stop:
//  - deferred: the handler has no buffer yet (Receive::defer): stop, hold no
//    reception buffer, GET it all once Context::accept() names the buffer;
//  - no_buffer: the handler gave no buffer (it discards the data): stop the
//    sender wasting the lane on bytes nobody keeps;
//  - zero_copy: the handler asked for the data by RDMA straight into its buffer;
//  - reception_low: the context's reception buffers (queue cells, posted
//    receive buffers) are in use past AMI_RNDV_LOW_WATER percent;
//  - large: the eager bytes still to come exceed the lane's crossover, the
//    size above which GET or PUT moves data faster than the bounce path
//    (Lane::rdma_crossover(), or AMI_RNDV_CROSSOVER).
// A message its handler takes in pieces (Receive::piece) is never asked:
// with no buffer there is nothing to GET or PUT into.
// The mode is AMI_RNDV_MODE's unless that is auto: stop_put when stopping at
// the first packet (the receive buffer is known, so the sender can PUT the
// rest in one go), split_get later (keep what came, GET the rest from the
// bottom while the eager packets still in flight fill in from the top).
// A message with no buffer cannot follow any of those, whatever
// AMI_RNDV_MODE says: there is nowhere to keep eager packets (split_get) and
// no key to PUT into (stop_put). It is stopped as discard_get is on the wire
// (the receiver drops what still comes, the sender answers with a cts), and
// counted on its own path: `discard` when its data is dropped (nothing is
// fetched), `deferred_get` when it was deferred (accept() GETs the whole
// message into the buffer it names, or drops it given none).
#pragma once

#include <cstdint>

#include "protocol/wire/packet.hpp"

namespace ami::protocol::rndv {

enum class Mode : std::uint8_t { automatic, discard_get, split_get, stop_put };  // AMI_RNDV_MODE order
enum class StopReason : std::uint8_t { no_buffer, zero_copy, reception_low, large, deferred };
// How the rest of a stopped message travels: the index of
// ContextStats::rndv_stops_by_mode (stop_mode_name() names each).
enum class StopPath : std::uint8_t { discard_get, split_get, stop_put, discard, deferred_get };

struct Inputs {
  std::uint64_t total = 0;     // message bytes
  std::uint64_t received = 0;  // eager bytes in place so far
  bool first_packet = false;   // deciding at the first packet
  bool has_buffer = true;
  bool deferred = false;       // the handler put the message aside (no buffer yet)
  bool zero_copy = false;
  unsigned reception_load = 0;     // percent
  unsigned low_water = 75;         // AMI_RNDV_LOW_WATER
  std::uint64_t crossover = 0;     // bytes
  Mode configured = Mode::automatic;
};

struct Decision {
  bool stop = false;
  StopReason reason = StopReason::large;
  wire::StopMode mode = wire::StopMode::discard_get;  // what the stop packet says
  StopPath path = StopPath::discard_get;              // what is counted
};

Decision decide(const Inputs& in);

}  // namespace ami::protocol::rndv
