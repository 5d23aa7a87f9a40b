// config.cpp — the table of tunables and its reader.
#include "ami/config.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <unistd.h>

namespace ami {

namespace {

constexpr std::uint64_t kMiB = 1024 * 1024;

constexpr ParamSpec kTable[] = {
    {"AMI_FIFO_DEPTH", "256", ParamType::power_of_two, 4, 65536,
     "Slots in each lane's injection FIFO; also the most descriptors in flight per lane."},
    {"AMI_MAX_REQUESTS", "1024", ParamType::unsigned_int, 1, 1u << 20,
     "Requests per context for instructions that wait in the work queue or for a remote answer."},
    {"AMI_SELF_QUEUE_DEPTH", "256", ParamType::power_of_two, 4, 65536,
     "Cells in each context's reception queue for same-process peers."},
    {"AMI_SELF_CELL_SIZE", "8192", ParamType::power_of_two, 256, 4 * kMiB,
     "Bytes per cell of the self backend's queues, so its largest packet."},
    {"AMI_SHM_RING_DEPTH", "256", ParamType::power_of_two, 4, 65536,
     "Cells in each context's shared-memory ring (every peer on the host writes into it)."},
    {"AMI_SHM_CELL_SIZE", "256", ParamType::power_of_two, 128, 4 * kMiB,
     "Bytes per shared-memory ring cell, so the largest packet between processes; small cells keep "
     "the ring in cache (message rate), large ones cut fewer packets (eager bandwidth)."},
    {"AMI_SHM_CMA", "on", ParamType::boolean, 0, 1,
     "PUT/GET between processes with one copy by process_vm_writev/readv; off copies through the rings."},
    {"AMI_SHM_STALL_TIMEOUT", "1000", ParamType::unsigned_int, 1, 3600000,
     "Milliseconds, once a peer on the host failed, that the next cell of a context's ring may stay "
     "reserved but unwritten before it is skipped: a process that died holding it blocks the rest."},
    {"AMI_RANK", "0", ParamType::unsigned_int, 0, 0xFFFFFFFFu,
     "This process's rank in the job (when not started by a tool or a PMIx launcher)."},
    {"AMI_SIZE", "1", ParamType::unsigned_int, 1, 0xFFFFFFFFu,
     "Processes in the job; 1 needs no bootstrap."},
    {"AMI_BOOTSTRAP", "", ParamType::text, 0, 0,
     "host:port where rank 0 listens and the other ranks connect to exchange addresses."},
    {"AMI_BOOTSTRAP_TIMEOUT", "30000", ParamType::unsigned_int, 1, 3600000,
     "Milliseconds to wait for the bootstrap: connecting to rank 0 and each exchange (PMIx: each "
     "fence and get, in whole seconds)."},
    {"AMI_JOB_KEY", "", ParamType::text, 0, 0,
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
    {"AMI_NET_DEVICES", "", ParamType::text, 0, 0,
     "RDMA device and port for the verbs backend, as device[:port] (rxe0:1, mlx5_0); empty: the "
     "first active port."},
    {"AMI_VERBS_GID_INDEX", "auto", ParamType::unsigned_int, 0, 65535,
     "GID index for RoCE: auto picks the RoCE v2 IPv4-mapped GID; or a number.", true},
    {"AMI_VERBS_CM", "auto", ParamType::boolean, 0, 1,
     "Connect queue pairs with rdma_cm (on), by exchanging their numbers through the bootstrap "
     "(off), or auto: rdma_cm on RoCE, the exchange on InfiniBand.", true},
    {"AMI_VERBS_MTU", "auto", ParamType::power_of_two, 256, 4096,
     "Largest path MTU: auto (the port's active MTU) or 256, 512, 1024, 2048, 4096.", true},
    {"AMI_VERBS_SQ_DEPTH", "256", ParamType::unsigned_int, 2, 65536,
     "Send work requests per queue pair; at least AMI_FIFO_DEPTH + 1 is used."},
    {"AMI_VERBS_SRQ_DEPTH", "auto", ParamType::unsigned_int, 16, 65536,
     "Receive buffers per context in its shared receive queue: auto (512 on a NIC, 128 on a "
     "software device: soft-RoCE, siw) or a number.", true},
    {"AMI_VERBS_SIGNAL_INTERVAL", "16", ParamType::unsigned_int, 1, 65536,
     "One send work request in this many asks for a completion; one completion retires the run "
     "before it."},
    {"AMI_VERBS_DOORBELL_BATCH", "16", ParamType::unsigned_int, 1, 256,
     "Work requests one ibv_post_send carries in a burst: a lane's first send since the last "
     "advance goes at once, later ones wait until this many are ready, and advance posts the "
     "rest (1: every send rings the doorbell)."},
    {"AMI_VERBS_MAX_RDMA", "auto", ParamType::power_of_two, 4096, 1ull << 31,
     "Largest RDMA WRITE or READ one work request carries: auto (the port's largest message) or "
     "a power of two; longer PUTs, GETs and rendezvous transfers go in pieces this long. On a "
     "lossy link shorter pieces each see fewer losses (an RC queue pair counts its retries per "
     "work request).", true},
    {"AMI_VERBS_MAX_INLINE", "auto", ParamType::unsigned_int, 0, 65536,
     "Bytes a send carries inline in its work request: auto (the most the device takes) or a "
     "number, 0 for never.", true},
    {"AMI_VERBS_IMMEDIATE", "on", ParamType::boolean, 0, 1,
     "Send a whole small message as a SEND with immediate: the immediate stands for its short "
     "header, so 4096 bytes fill one 4096-byte MTU frame, not two (off: the header travels in "
     "the packet)."},
    {"AMI_VERBS_TIMEOUT", "14", ParamType::unsigned_int, 1, 31,
     "RC local ACK timeout: 4.096 us x 2^value before a send is retried (14: 67 ms)."},
    {"AMI_VERBS_RETRY_COUNT", "6", ParamType::unsigned_int, 0, 6,
     "RC transport retries before a lane fails (with AMI_VERBS_TIMEOUT: how long a peer may stay "
     "silent). At most 6: soft-RoCE takes 7 as retry forever, and a dead peer would never be found."},
    {"AMI_VERBS_BOUNCE_SIZE", "auto", ParamType::power_of_two, 256, 1 * kMiB,
     "Bytes per receive buffer, so the largest packet over verbs: auto (8 KiB on a NIC; 128 KiB "
     "on a software device, where each work request and completion costs the kernel's CPU as much "
     "as pages of data) or a power of two.", true},
    {"AMI_MAX_REGIONS", "4096", ParamType::unsigned_int, 1, 1u << 20,
     "Memory registrations a client holds at once."},
    {"AMI_RNDV_MODE", "auto", ParamType::choice, 0, 0,
     "What a receiver does when it stops an eager message: discard_get (drop the eager packets, "
     "GET it all), split_get (keep them, GET the rest from both ends), stop_put (the sender PUTs "
     "the rest into the receive buffer), or auto: stop_put when stopping at the first packet, "
     "split_get later.", false, "auto|discard_get|split_get|stop_put"},
    {"AMI_RNDV_CROSSOVER", "auto", ParamType::unsigned_int, 0, 1ull << 40,
     "Eager bytes still to come above which a receiver stops a message and moves the rest by "
     "RDMA: auto (the backend's figure for the lane) or bytes.", true},
    {"AMI_RNDV_LOW_WATER", "75", ParamType::unsigned_int, 1, 100,
     "Percent of a context's reception buffers in use at which it stops every eager message it "
     "can."},
    {"AMI_ACK_IDLE_THRESHOLD", "8", ParamType::unsigned_int, 0, 1u << 20,
     "Idle advances (advances in which nothing arrived) after which a context acknowledges every "
     "message it owes an answer, coalesced per origin; 0 answers each at once."},
    {"AMI_ACK_MAX_UNACKED", "64", ParamType::unsigned_int, 1, 1u << 20,
     "Messages from one origin a context leaves unacknowledged at most: under sustained load it "
     "acknowledges them at once when that many are waiting."},
    {"AMI_KEEPALIVE_INTERVAL", "1000", ParamType::unsigned_int, 0, 3600000,
     "Milliseconds between keepalives to a peer this context waits on (for an answer, or the rest "
     "of a message) that sent nothing meanwhile; a lane that cannot deliver one fails the peer. "
     "0: none."},
    {"AMI_RCACHE_MAX_ENTRIES", "256", ParamType::unsigned_int, 1, 1u << 20,
     "Registrations each context's registration cache holds (in use and idle)."},
    {"AMI_RCACHE_MAX_MB", "4096", ParamType::unsigned_int, 1, 1u << 30,
     "MiB of memory each context's registration cache keeps registered (pinned, on verbs)."},
    {"AMI_RCACHE_IDLE", "auto", ParamType::unsigned_int, 0, 1u << 20,
     "Idle registrations kept for reuse: auto keeps 64 without verbs and none with it (a pinned "
     "registration kept past free() would point at the old pages).", true},
    {"AMI_COLL_EAGER_MAX", "8192", ParamType::unsigned_int, 0, 1ull << 30,
     "Bytes up to which a collective's message that comes before its call waits in an early-arrival "
     "buffer, and a contribution to a reduction is combined piece by piece as its packets arrive; a "
     "larger one waits at its sender and comes by the rendezvous straight into place."},
    {"AMI_COLL_RING_MIN", "65536", ParamType::unsigned_int, 0, 1ull << 40,
     "Bytes from which allreduce runs as a ring (reduce-scatter, then allgather, each block straight "
     "into the receive buffer) rather than by recursive doubling; the same on every task."},
};

constexpr std::uint64_t kAuto = ~std::uint64_t{0};

bool parse(const ParamSpec& spec, std::string_view text, std::uint64_t& out) {
  if (spec.allows_auto && text == "auto") {
    out = kAuto;
    return true;
  }
  switch (spec.type) {
    case ParamType::text: return true;
    case ParamType::choice: {
      std::string_view rest = spec.choices;
      for (std::uint64_t i = 0;; ++i) {
        const std::size_t bar = rest.find('|');
        if (rest.substr(0, bar) == text) {
          out = i;
          return true;
        }
        if (bar == std::string_view::npos) return false;
        rest.remove_prefix(bar + 1);
      }
    }
    case ParamType::boolean:
      if (text == "1" || text == "y" || text == "yes" || text == "true" || text == "on") {
        out = 1;
        return true;
      }
      if (text == "0" || text == "n" || text == "no" || text == "false" || text == "off") {
        out = 0;
        return true;
      }
      return false;
    case ParamType::unsigned_int:
    case ParamType::power_of_two: {
      std::uint64_t v = 0;
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (ec != std::errc{} || end != text.data() + text.size()) return false;
      if (v < spec.min || v > spec.max) return false;
      if (spec.type == ParamType::power_of_two && (v & (v - 1)) != 0) return false;
      out = v;
      return true;
    }
  }
  return false;
}

const ParamSpec* find(std::string_view name) {
  for (const ParamSpec& p : kTable)
    if (p.name == name) return &p;
  return nullptr;
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::span<const ParamSpec> config_table() { return kTable; }

std::string_view closest_param(std::string_view unknown) {
  std::string_view best;
  std::size_t best_distance = unknown.size() / 2 + 1;  // beyond this it is no hint
  for (const ParamSpec& p : kTable) {
    const std::size_t d = edit_distance(unknown, p.name);
    if (d < best_distance) {
      best_distance = d;
      best = p.name;
    }
  }
  return best;
}

Config::Config() {
  for (const ParamSpec& p : kTable) {
    Value v{std::string(p.default_value), 0, "default"};
    parse(p, p.default_value, v.number);
    values_.emplace(std::string(p.name), std::move(v));
  }
}

Status Config::set(std::string_view name, std::string_view value) {
  const ParamSpec* spec = find(name);
  if (spec == nullptr) return {StatusCode::invalid_argument, "config: unknown parameter"};
  std::uint64_t number = 0;
  if (!parse(*spec, value, number))
    return {StatusCode::invalid_argument, "config: value does not parse or is out of range"};
  Value& v = values_.find(name)->second;
  v.text = std::string(value);
  v.number = number;
  v.origin = "set";
  return Status::success();
}

Config Config::from_environment(const char* const* env, std::vector<std::string>& warnings) {
  Config c;
  for (; env != nullptr && *env != nullptr; ++env) {
    const std::string_view entry(*env);
    if (!entry.starts_with("AMI_")) continue;
    const std::size_t eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string_view name = entry.substr(0, eq), value = entry.substr(eq + 1);
    if (find(name) == nullptr) {
      std::string w = "unknown variable " + std::string(name);
      if (std::string_view near = closest_param(name); !near.empty())
        w += " (did you mean " + std::string(near) + "?)";
      warnings.push_back(std::move(w));
      continue;
    }
    if (!c.set(name, value).ok()) {
      warnings.push_back("ignoring " + std::string(name) + "=" + std::string(value) +
                         ": not a valid value; keeping " + c.text(name));
      continue;
    }
    c.values_.find(name)->second.origin = "environment";
  }
  return c;
}

Config Config::from_environment() {
  std::vector<std::string> warnings;
  Config c = from_environment(environ, warnings);
  for (const std::string& w : warnings) std::fprintf(stderr, "ami: warning: %s\n", w.c_str());
  return c;
}

std::uint64_t Config::number(std::string_view name) const {
  auto it = values_.find(name);
  return it == values_.end() ? 0 : it->second.number;
}

std::optional<std::uint64_t> Config::number_or_auto(std::string_view name) const {
  const std::uint64_t v = number(name);
  if (v == kAuto) return std::nullopt;
  return v;
}

bool Config::flag(std::string_view name) const { return number(name) != 0; }

const std::string& Config::text(std::string_view name) const {
  static const std::string kEmpty;
  auto it = values_.find(name);
  return it == values_.end() ? kEmpty : it->second.text;
}

std::string_view Config::origin(std::string_view name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::string_view{} : it->second.origin;
}

}  // namespace ami
