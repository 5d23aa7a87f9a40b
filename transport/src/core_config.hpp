// core_config.hpp — the core's tunables (config_table.hpp): the injection
// FIFOs, the job and its bootstrap, which backends a task uses and must
// reach its peers by, the registrations and their cache. Internal.
#pragma once

#include <cstdint>
#include <optional>

#include "ami/config.hpp"

namespace ami::core {

inline constexpr ParamSpec kParams[] = {
    {"AMI_FIFO_DEPTH", "256", ParamType::power_of_two, 4, 65536,
     "Slots in each lane's injection FIFO (a power of two, at most 65536); also the most descriptors "
     "in flight per lane."},
    {"AMI_RANK", "0", ParamType::unsigned_int, 0, (1u << 20) - 1,
     "This process's rank in the job, below AMI_SIZE (when not started by a tool or a PMIx launcher)."},
    {"AMI_SIZE", "1", ParamType::unsigned_int, 1, 1u << 20,
     "Processes in the job, at most 1048576; 1 needs no bootstrap."},
    {"AMI_BOOTSTRAP", "", ParamType::text, 0, 0,
     "host:port where rank 0 listens and the other ranks connect to exchange addresses."},
    {"AMI_BOOTSTRAP_TIMEOUT", "30000", ParamType::unsigned_int, 1, 3600000,
     "Milliseconds to wait for the bootstrap: connecting to rank 0 and each exchange (PMIx: each "
     "fence and get, in whole seconds)."},
    {"AMI_JOB_KEY", "", ParamType::text, 0, 256,
     "Shared secret every rank of a TCP-bootstrapped job presents to rank 0, which refuses (and logs) "
     "connections without it. Set the same value on every rank; ami's tools set a random one for the "
     "processes they start. At most 256 bytes.",
     false, {}, true},
    {"AMI_BOOTSTRAP_MODE", "auto", ParamType::choice, 0, 0,
     "How the job's tasks find each other: pmix (rank, size and the address exchange from the PMIx "
     "launcher that started the process: mpirun, prterun, srun --mpi=pmix; an error without one), "
     "tcp (AMI_RANK, AMI_SIZE, AMI_BOOTSTRAP), or auto: pmix when a PMIx launcher started the "
     "process and neither the program nor AMI_RANK, AMI_SIZE, AMI_BOOTSTRAP gives the job, tcp "
     "otherwise.", false, "auto|pmix|tcp"},
    {"AMI_BACKENDS", "self,shm,verbs", ParamType::text, 0, 0,
     "Backends this process may use, comma-separated from self, shm, verbs. A peer is reached by the "
     "first of self, shm, verbs (in that order) that is listed and reaches it; leave out shm to run "
     "same-host peers over verbs."},
    {"AMI_REACHABILITY", "all", ParamType::choice, 0, 0,
     "all: the Client fails at creation, on every task and naming the pair, when some task cannot "
     "reach another (AMI_BACKENDS, another host without verbs, a segment it cannot map); symmetric: "
     "tasks may be apart, for a job whose tasks only watch each other, but never one way only.",
     false, "all|symmetric"},
    {"AMI_ADDRESSES", "auto", ParamType::choice, 0, 0,
     "When a task learns its peers' addresses: start (every address at the Client's creation, and "
     "the AMI_REACHABILITY check), first_use (a peer's address is fetched from the PMIx launcher "
     "when this task first talks to it or hears from it; a peer no backend reaches then fails at "
     "that first use), or auto: first_use under PMIx when every backend in use can join a peer "
     "alone (not ofi), start otherwise. The TCP bootstrap always "
     "exchanges them at start.", false, "auto|start|first_use"},
    {"AMI_ATOMIC_MODE", "auto", ParamType::choice, 0, 0,
     "Which hardware makes the words of this task's registered memory atomic for Context::atomic: "
     "cpu (this host's CPUs: peers that map the region do the atomics themselves, every other one "
     "is done by this task's engine), nic (the RDMA NIC's own atomics: verbs peers send them to the "
     "NIC, the rest are done by this task's engine through its NIC; registration fails where no "
     "backend's NIC does atomics), or auto: nic when the verbs device does atomics and the job "
     "spans more than one host (as the address exchange at start shows, or on first use the PMIx "
     "launcher's local size), cpu otherwise. The "
     "remote key carries the choice, so tasks may differ.", false, "auto|cpu|nic"},
    {"AMI_MAX_REGIONS", "4096", ParamType::unsigned_int, 1, 1u << 20,
     "Memory registrations a client holds at once, at most 1048576."},
    {"AMI_RCACHE_MAX_ENTRIES", "256", ParamType::unsigned_int, 1, 1u << 20,
     "Registrations each context's registration cache holds (in use and idle), at most 1048576."},
    {"AMI_RCACHE_MAX_MB", "4096", ParamType::unsigned_int, 1, 1u << 24,
     "MiB of memory each context's registration cache keeps registered (pinned, on verbs), at most "
     "16777216 (16 TiB)."},
    {"AMI_RCACHE_IDLE", "auto", ParamType::unsigned_int, 0, 1u << 20,
     "Idle registrations kept for reuse: auto keeps 64 without verbs and none with it (a pinned "
     "registration kept past free() would point at the old pages).", true},
};
static_assert(rows_are_sound(kParams), "core_config.hpp: a row has a bad name, range or default");

using Param = ParamIn<kParams>;

static_assert(Param("AMI_RANK").spec().max == Param("AMI_SIZE").spec().max - 1,
              "every rank of the largest job is a valid AMI_RANK");

enum class Reachability : std::uint8_t { all, symmetric };  // AMI_REACHABILITY's words, in order
enum class Addresses : std::uint8_t { automatic, start, first_use };  // AMI_ADDRESSES's words, in order
enum class AtomicMode : std::uint8_t { automatic, cpu, nic };  // AMI_ATOMIC_MODE's words, in order

// The core's settings, typed, with the rows' defaults. The job (AMI_RANK,
// AMI_SIZE, AMI_BOOTSTRAP, AMI_JOB_KEY, AMI_BOOTSTRAP_MODE) and AMI_BACKENDS
// are read where what set them matters too (job_bootstrap.cpp,
// backend_set.cpp).
struct Options {
  std::uint32_t fifo_depth = Param("AMI_FIFO_DEPTH").default_as<std::uint32_t>();
  std::uint32_t bootstrap_timeout_ms = Param("AMI_BOOTSTRAP_TIMEOUT").default_as<std::uint32_t>();
  Reachability reachability = Param("AMI_REACHABILITY").default_as<Reachability>();
  Addresses addresses = Param("AMI_ADDRESSES").default_as<Addresses>();
  AtomicMode atomic_mode = Param("AMI_ATOMIC_MODE").default_as<AtomicMode>();
  std::uint32_t max_regions = Param("AMI_MAX_REGIONS").default_as<std::uint32_t>();
  std::uint32_t rcache_max_entries = Param("AMI_RCACHE_MAX_ENTRIES").default_as<std::uint32_t>();
  std::uint64_t rcache_max_mb = Param("AMI_RCACHE_MAX_MB").default_as();
  std::optional<std::uint32_t> rcache_idle = Param("AMI_RCACHE_IDLE").default_or_auto<std::uint32_t>();  // unset: by the backends

  static Options from(const Config& c) {
    auto u32 = [&c](Param p) { return static_cast<std::uint32_t>(c.number(p)); };
    Options o;
    o.fifo_depth = u32("AMI_FIFO_DEPTH");
    o.bootstrap_timeout_ms = u32("AMI_BOOTSTRAP_TIMEOUT");
    o.reachability = static_cast<Reachability>(c.number(Param("AMI_REACHABILITY")));
    o.addresses = static_cast<Addresses>(c.number(Param("AMI_ADDRESSES")));
    o.atomic_mode = static_cast<AtomicMode>(c.number(Param("AMI_ATOMIC_MODE")));
    o.max_regions = u32("AMI_MAX_REGIONS");
    o.rcache_max_entries = u32("AMI_RCACHE_MAX_ENTRIES");
    o.rcache_max_mb = c.number(Param("AMI_RCACHE_MAX_MB"));
    if (auto idle = c.number_or_auto(Param("AMI_RCACHE_IDLE"))) o.rcache_idle = static_cast<std::uint32_t>(*idle);
    else o.rcache_idle.reset();
    return o;
  }
  bool operator==(const Options&) const = default;
};

}  // namespace ami::core
