// shm_backend/shm_config.hpp — the shm backend's tunables (config_table.hpp):
// its rings, CMA, and how long a dead peer's reserved cell may block a ring.
#pragma once

#include <cstdint>

#include "ami/config.hpp"
#include "ami/device/reception_queue.hpp"

namespace ami::shm {

inline constexpr ParamSpec kParams[] = {
    {"AMI_SHM_RING_DEPTH", "256", ParamType::power_of_two, 4, 65536,
     "Cells in each context's shared-memory ring (a power of two, at most 65536; every peer on the host "
     "writes into it)."},
    {"AMI_SHM_CELL_SIZE", "256", ParamType::power_of_two, 128, 4u << 20,
     "Bytes per shared-memory ring cell (a power of two, at most 4 MiB), so the largest packet between "
     "processes; small cells keep the ring in cache (message rate), large ones cut fewer packets "
     "(eager bandwidth)."},
    {"AMI_SHM_CMA", "on", ParamType::boolean, 0, 1,
     "PUT/GET between processes with one copy by process_vm_writev/readv; off copies through the rings."},
    {"AMI_SHM_STALL_TIMEOUT", "1000", ParamType::unsigned_int, 1, 3600000,
     "Milliseconds, once a peer on the host failed, that the next cell of a context's ring may stay "
     "reserved but unwritten before it is skipped: a process that died holding it blocks the rest."},
};
static_assert(rows_are_sound(kParams), "shm_config.hpp: a row has a bad name, range or default");

using Param = ParamIn<kParams>;

static_assert(Param("AMI_SHM_CELL_SIZE").spec().min >= 2 * device::kCacheLine,
              "a reception queue's cells are at least two cache lines");

// The shm backend's settings, typed, with the rows' defaults (the domain's
// options, shm_domain.hpp).
struct Options {
  std::uint32_t queue_depth = Param("AMI_SHM_RING_DEPTH").default_as<std::uint32_t>();
  std::uint32_t cell_bytes = Param("AMI_SHM_CELL_SIZE").default_as<std::uint32_t>();
  bool cma = Param("AMI_SHM_CMA").default_as<bool>();  // false forces the pipelined copy through the rings
  // After a peer failed: how long the next cell of a context's ring may stay
  // reserved and uncommitted before the context skips it (its producer most
  // likely died holding it).
  std::uint32_t stall_timeout_ms = Param("AMI_SHM_STALL_TIMEOUT").default_as<std::uint32_t>();

  static Options from(const Config& c) {
    auto u32 = [&c](Param p) { return static_cast<std::uint32_t>(c.number(p)); };
    return {u32("AMI_SHM_RING_DEPTH"), u32("AMI_SHM_CELL_SIZE"), c.flag(Param("AMI_SHM_CMA")),
            u32("AMI_SHM_STALL_TIMEOUT")};
  }
  bool operator==(const Options&) const = default;
};

}  // namespace ami::shm
