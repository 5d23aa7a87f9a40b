// protocol/rndv/policy.cpp — the receiver's stop policy; see policy.hpp.
#include "protocol/rndv/policy.hpp"

namespace ami::protocol::rndv {

Decision decide(const Inputs& in) {
  Decision d;
  if (in.received >= in.total) return d;  // nothing left to stop
  const std::uint64_t remaining = in.total - in.received;
  if (in.deferred || !in.has_buffer) {
    d.stop = true;
    d.reason = in.deferred ? StopReason::deferred : StopReason::no_buffer;
    d.mode = wire::StopMode::discard_get;  // and nothing to GET
    return d;
  }
  if (in.zero_copy) {
    d.stop = true;
    d.reason = StopReason::zero_copy;
  } else if (in.reception_load >= in.low_water) {
    d.stop = true;
    d.reason = StopReason::reception_low;
  } else if (remaining > in.crossover) {
    d.stop = true;
    d.reason = StopReason::large;
  } else {
    return d;
  }
  switch (in.configured) {
    case Mode::discard_get: d.mode = wire::StopMode::discard_get; break;
    case Mode::split_get: d.mode = wire::StopMode::split_get; break;
    case Mode::stop_put: d.mode = wire::StopMode::stop_put; break;
    case Mode::automatic:
      d.mode = in.first_packet ? wire::StopMode::stop_put : wire::StopMode::split_get;
      break;
  }
  return d;
}

}  // namespace ami::protocol::rndv
