// protocol/am/rndv/policy.cpp — the receiver's stop policy; see policy.hpp.
#include "policy.hpp"

namespace ami::protocol::rndv {

// A wire mode's path is the mode less one (decide() relies on it).
static_assert(static_cast<unsigned>(StopPath::discard_get) + 1 == static_cast<unsigned>(wire::StopMode::discard_get));
static_assert(static_cast<unsigned>(StopPath::split_get) + 1 == static_cast<unsigned>(wire::StopMode::split_get));
static_assert(static_cast<unsigned>(StopPath::stop_put) + 1 == static_cast<unsigned>(wire::StopMode::stop_put));

Decision decide(const Inputs& in) {
  Decision d;
  if (in.received >= in.total) return d;  // nothing left to stop
  const std::uint64_t remaining = in.total - in.received;
  if (in.deferred || !in.has_buffer) {
    // No buffer to keep eager packets in or to PUT into: the wire's
    // discard_get, whatever the configured mode (see policy.hpp).
    d.stop = true;
    d.reason = in.deferred ? StopReason::deferred : StopReason::no_buffer;
    d.mode = wire::StopMode::discard_get;
    d.path = in.deferred ? StopPath::deferred_get : StopPath::discard;
    return d;
  }
  if (in.zero_copy) {
    d.stop = true;
    d.reason = StopReason::zero_copy;
  } else if (in.reception_load >= in.low_water && remaining >= kPressureMin) {
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
      d.mode = in.oversubscribed || in.get_beats_eager ? wire::StopMode::discard_get
               : in.get_beats_put                      ? wire::StopMode::split_get
                                                       : wire::StopMode::stop_put;
      break;
  }
  d.path = static_cast<StopPath>(static_cast<unsigned>(d.mode) - 1);  // the three wire modes come first
  d.put_end = in.total;
  if (d.mode == wire::StopMode::stop_put && in.split_min != 0 && remaining >= in.split_min) {
    const std::uint64_t half = (in.received + remaining / 2) & ~(kSplitAlign - 1);
    if (half > in.received) d.put_end = half;
  }
  return d;
}

}  // namespace ami::protocol::rndv
