// self_config.hpp — the self backend's tunables (config_table.hpp): its
// reception queues.
#pragma once

#include <cstdint>

#include "ami/config.hpp"
#include "ami/device/reception_queue.hpp"

namespace ami::self {

inline constexpr ParamSpec kParams[] = {
    {"AMI_SELF_QUEUE_DEPTH", "256", ParamType::power_of_two, 4, 65536,
     "Cells in each context's reception queue for same-process peers (a power of two, at most 65536)."},
    {"AMI_SELF_CELL_SIZE", "8192", ParamType::power_of_two, 256, 4u << 20,
     "Bytes per cell of the self backend's queues, so its largest packet (a power of two, at most "
     "4 MiB)."},
};
static_assert(rows_are_sound(kParams), "self_config.hpp: a row has a bad name, range or default");

using Param = ParamIn<kParams>;

static_assert(Param("AMI_SELF_CELL_SIZE").spec().min >= 2 * device::kCacheLine,
              "a reception queue's cells are at least two cache lines");

// The self backend's settings, typed, with the rows' defaults.
struct Options {
  std::uint32_t queue_depth = Param("AMI_SELF_QUEUE_DEPTH").default_as<std::uint32_t>();
  std::uint32_t cell_bytes = Param("AMI_SELF_CELL_SIZE").default_as<std::uint32_t>();

  static Options from(const Config& c) {
    return {static_cast<std::uint32_t>(c.number(Param("AMI_SELF_QUEUE_DEPTH"))),
            static_cast<std::uint32_t>(c.number(Param("AMI_SELF_CELL_SIZE")))};
  }
  bool operator==(const Options&) const = default;
};

}  // namespace ami::self
