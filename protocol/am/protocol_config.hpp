// protocol/am/protocol_config.hpp — the protocol's tunables (config_table.hpp):
// requests, the rendezvous, acknowledgements and keepalives.
#pragma once

#include <cstdint>
#include <optional>

#include "ami/config.hpp"
#include "rndv/policy.hpp"

namespace ami::protocol {

inline constexpr ParamSpec kParams[] = {
    {"AMI_MAX_REQUESTS", "1024", ParamType::unsigned_int, 1, 1u << 20,
     "Requests per context (at most 1048576) for instructions that wait in the work queue or for a "
     "remote answer."},
    {"AMI_RNDV_MODE", "auto", ParamType::choice, 0, 0,
     "What a receiver does when it stops an eager message: discard_get (drop the eager packets, "
     "GET it all), split_get (keep them, GET the rest from both ends), stop_put (the sender PUTs "
     "the rest into the receive buffer; a rest of 16 KiB or more is shared with the receiver's GET), "
     "or auto: stop_put, or split_get on a lane where a GET beats a PUT (an unordered ofi lane other than shm).", false, "auto|discard_get|split_get|stop_put"},
    {"AMI_RNDV_CROSSOVER", "auto", ParamType::unsigned_int, 0, 1ull << 40,
     "Eager bytes still to come above which a receiver stops a message and moves the rest by "
     "RDMA: auto (the backend's figure for the lane) or bytes (1 TiB: never).", true},
    {"AMI_RNDV_LOW_WATER", "75", ParamType::unsigned_int, 1, 100,
     "Percent of a context's reception buffers in use at which it stops every eager message it "
     "can."},
    {"AMI_ACK_IDLE_THRESHOLD", "8", ParamType::unsigned_int, 0, 1u << 20,
     "Idle advances (advances in which nothing arrived) after which a context acknowledges every "
     "message it owes an answer, coalesced per origin; 0 answers each at once."},
    {"AMI_ACK_MAX_UNACKED", "64", ParamType::unsigned_int, 1, 1u << 20,
     "Messages from one origin a context leaves unacknowledged at most (at most 1048576): under "
     "sustained load it acknowledges them at once when that many are waiting."},
    {"AMI_KEEPALIVE_INTERVAL", "1000", ParamType::unsigned_int, 0, 3600000,
     "Milliseconds between keepalives to a peer this context waits on (for an answer, or the rest "
     "of a message) that sent nothing meanwhile; a lane that cannot deliver one fails the peer. "
     "0: none."},
};
static_assert(rows_are_sound(kParams), "protocol_config.hpp: a row has a bad name, range or default");

using Param = ParamIn<kParams>;

// The protocol's settings, typed, with the rows' defaults.
struct Options {
  std::uint32_t max_requests = Param("AMI_MAX_REQUESTS").default_as<std::uint32_t>();
  rndv::Mode rndv_mode = Param("AMI_RNDV_MODE").default_as<rndv::Mode>();
  // Unset: the lane's figure (Lane::rdma_crossover()).
  std::optional<std::uint64_t> rndv_crossover = Param("AMI_RNDV_CROSSOVER").default_or_auto();
  unsigned rndv_low_water = Param("AMI_RNDV_LOW_WATER").default_as<unsigned>();
  unsigned ack_idle_threshold = Param("AMI_ACK_IDLE_THRESHOLD").default_as<unsigned>();
  unsigned ack_max_unacked = Param("AMI_ACK_MAX_UNACKED").default_as<unsigned>();
  unsigned keepalive_ms = Param("AMI_KEEPALIVE_INTERVAL").default_as<unsigned>();  // 0: none

  static Options from(const Config& c) {
    auto u32 = [&c](Param p) { return static_cast<std::uint32_t>(c.number(p)); };
    Options o;
    o.max_requests = u32("AMI_MAX_REQUESTS");
    o.rndv_mode = static_cast<rndv::Mode>(c.number(Param("AMI_RNDV_MODE")));
    o.rndv_crossover = c.number_or_auto(Param("AMI_RNDV_CROSSOVER"));
    o.rndv_low_water = u32("AMI_RNDV_LOW_WATER");
    o.ack_idle_threshold = u32("AMI_ACK_IDLE_THRESHOLD");
    o.ack_max_unacked = u32("AMI_ACK_MAX_UNACKED");
    o.keepalive_ms = u32("AMI_KEEPALIVE_INTERVAL");
    return o;
  }
  bool operator==(const Options&) const = default;
};

}  // namespace ami::protocol
