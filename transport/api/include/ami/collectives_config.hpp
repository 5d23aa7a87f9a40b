// ami/collectives_config.hpp — the collectives' tunables (config_table.hpp),
// next to their public API: the collectives are built on the public API
// alone, and the core lists these rows with everyone else's.
#pragma once

#include <cstdint>

#include "ami/config.hpp"

namespace ami::coll {

inline constexpr ParamSpec kParams[] = {
    {"AMI_COLL_EAGER_MAX", "8192", ParamType::unsigned_int, 0, 1u << 30,
     "Bytes up to which a collective's message that comes before its call waits in an early-arrival "
     "buffer, and a contribution to a reduction is combined piece by piece as its packets arrive; a "
     "larger one waits at its sender and comes by the rendezvous straight into place. At most 1 GiB."},
    {"AMI_COLL_RING_MIN", "65536", ParamType::unsigned_int, 0, 1ull << 40,
     "Bytes from which allreduce runs as a ring (reduce-scatter, then allgather, each block straight "
     "into the receive buffer) rather than by recursive doubling; the same on every task."},
};
static_assert(rows_are_sound(kParams), "collectives_config.hpp: a row has a bad name, range or default");

using Param = ParamIn<kParams>;

// The collectives' settings, typed, with the rows' defaults.
struct Options {
  std::uint64_t eager_max = Param("AMI_COLL_EAGER_MAX").default_as();
  std::uint64_t ring_min = Param("AMI_COLL_RING_MIN").default_as();

  static Options from(const Config& c) {
    return {.eager_max = c.number(Param("AMI_COLL_EAGER_MAX")), .ring_min = c.number(Param("AMI_COLL_RING_MIN"))};
  }
  bool operator==(const Options&) const = default;
};

}  // namespace ami::coll
