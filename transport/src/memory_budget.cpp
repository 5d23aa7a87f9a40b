// memory_budget.cpp — what the settings make a client allocate, per group,
// and the check against the host's memory.
#include "memory_budget.hpp"

#include <sys/resource.h>
#include <sys/sysinfo.h>

#include <algorithm>
#include <cstdio>
#include <limits>

#include "ami/callback.hpp"
#include "ami/device/descriptor.hpp"
#include "ami/device/reception_queue.hpp"
#include "ami/error.hpp"
#include "protocol/eager/request_pool.hpp"

namespace ami {

namespace {

constexpr std::uint64_t kMost = std::numeric_limits<std::uint64_t>::max();

// Saturating: a product past 2^64 is "too much", never a small wrapped number.
std::uint64_t times(std::uint64_t a, std::uint64_t b) {
  std::uint64_t out = 0;
  return __builtin_mul_overflow(a, b, &out) ? kMost : out;
}

std::uint64_t plus(std::uint64_t a, std::uint64_t b) { return a > kMost - b ? kMost : a + b; }

// "274877906944 bytes (256.0 GiB)"
std::string bytes_text(std::uint64_t bytes) {
  if (bytes == kMost) return "more than 2^64 bytes";
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  std::string out = std::to_string(bytes) + " bytes";
  if (bytes < 1024) return out;
  double v = static_cast<double>(bytes) / 1024;
  std::size_t unit = 0;
  while (v >= 1024 && unit + 1 < std::size(kUnits)) {
    v /= 1024;
    ++unit;
  }
  char figure[32];
  std::snprintf(figure, sizeof figure, " (%.1f %s)", v, kUnits[unit]);
  return out + figure;
}

bool lists_verbs(const std::string& backends) {
  for (std::size_t start = 0; start <= backends.size();) {
    std::size_t end = backends.find(',', start);
    if (end == std::string::npos) end = backends.size();
    if (std::string_view(backends).substr(start, end - start) == "verbs") return true;
    start = end + 1;
  }
  return false;
}

// A request, and the engine's record of a stopped message, of which it
// keeps AMI_MAX_REQUESTS each (protocol/eager/am_engine.hpp), each with a
// free-list index. The record is private to the engine and smaller than a
// request: counted as one.
constexpr std::uint64_t kRequestBytes = 2 * (sizeof(protocol::Request) + sizeof(std::uint32_t));
// An injection FIFO slot: its descriptor and its pending callback.
constexpr std::uint64_t kFifoSlotBytes = sizeof(device::Descriptor) + sizeof(Callback);

void check(const Config& c, std::uint16_t contexts, std::uint32_t tasks, std::uint64_t limit,
           std::string_view limit_source) {
  const std::vector<MemoryDemand> demands = memory_demands(c, contexts, tasks);
  std::uint64_t total = 0;
  for (const MemoryDemand& d : demands) total = plus(total, d.bytes);
  if (total <= limit) return;
  std::vector<const MemoryDemand*> largest;
  for (const MemoryDemand& d : demands) largest.push_back(&d);
  std::stable_sort(largest.begin(), largest.end(),
                   [](const MemoryDemand* a, const MemoryDemand* b) { return a->bytes > b->bytes; });
  std::string text = "Client: the configuration needs " + bytes_text(total) + " for " + std::to_string(contexts) +
                     " context(s) in a job of " + std::to_string(tasks) + " task(s), more than the " +
                     bytes_text(limit) + " a client may take (" + std::string(limit_source) + "); lower the first of: ";
  for (std::size_t i = 0; i < largest.size(); ++i) {
    const MemoryDemand& d = *largest[i];
    text += (i == 0 ? "" : "; ") + d.what + " = " + d.figures + " = " + bytes_text(d.bytes);
  }
  throw Error(text);
}

}  // namespace

std::vector<MemoryDemand> memory_demands(const Config& c, std::uint16_t contexts, std::uint32_t tasks) {
  const std::string n = std::to_string(contexts);
  std::vector<MemoryDemand> out;

  const std::uint64_t self_depth = c.number("AMI_SELF_QUEUE_DEPTH"), self_cell = c.number("AMI_SELF_CELL_SIZE");
  out.push_back({"self queues: AMI_SELF_QUEUE_DEPTH x AMI_SELF_CELL_SIZE x contexts",
                 std::to_string(self_depth) + " x " + std::to_string(self_cell) + " x " + n,
                 times(device::ReceptionQueue::bytes_needed(static_cast<std::uint32_t>(self_depth),
                                                            static_cast<std::uint32_t>(self_cell)),
                       contexts)});

  // The own segment's rings (the peers' segments are mapped, not allocated).
  const std::uint64_t shm_depth = c.number("AMI_SHM_RING_DEPTH"), shm_cell = c.number("AMI_SHM_CELL_SIZE");
  out.push_back({"shared-memory rings: AMI_SHM_RING_DEPTH x AMI_SHM_CELL_SIZE x contexts",
                 std::to_string(shm_depth) + " x " + std::to_string(shm_cell) + " x " + n,
                 times(device::ReceptionQueue::bytes_needed(static_cast<std::uint32_t>(shm_depth),
                                                            static_cast<std::uint32_t>(shm_cell)),
                       contexts)});

  const std::uint64_t requests = c.number("AMI_MAX_REQUESTS");
  out.push_back({"requests: AMI_MAX_REQUESTS x contexts x bytes per request",
                 std::to_string(requests) + " x " + n + " x " + std::to_string(kRequestBytes),
                 times(times(requests, contexts), kRequestBytes)});

  // Lanes are made on first use, so what every job pays is the lanes to
  // one peer task (every context to each of its contexts); each further
  // peer talked to costs as much again, which a job of a million tasks
  // that talks to a few neighbours never pays.
  const std::uint64_t fifo = c.number("AMI_FIFO_DEPTH");
  const std::uint64_t lanes = times(tasks > 1 ? 1 : 0, times(contexts, contexts));
  out.push_back({"injection FIFOs: AMI_FIFO_DEPTH x lanes to one peer (contexts x contexts) x bytes per slot",
                 std::to_string(fifo) + " x " + std::to_string(lanes) + " x " + std::to_string(kFifoSlotBytes),
                 times(times(fifo, lanes), kFifoSlotBytes)});

  if (lists_verbs(c.text("AMI_BACKENDS"))) {
    // auto is the device's choice, (512, 8 KiB) on a NIC or (128, 128 KiB)
    // on a software device: the larger of what each could be.
    const auto depth = c.number_or_auto("AMI_VERBS_SRQ_DEPTH");
    const auto bounce = c.number_or_auto("AMI_VERBS_BOUNCE_SIZE");
    const std::uint64_t per_context =
        !depth && !bounce ? std::uint64_t{128} * (128 << 10) : times(depth.value_or(512), bounce.value_or(128 << 10));
    out.push_back({"verbs receive buffers: AMI_VERBS_SRQ_DEPTH x AMI_VERBS_BOUNCE_SIZE x contexts",
                   c.text("AMI_VERBS_SRQ_DEPTH") + " x " + c.text("AMI_VERBS_BOUNCE_SIZE") + " x " + n,
                   times(per_context, contexts)});
  }
  return out;
}

std::uint64_t memory_budget_limit() {
  std::uint64_t host = kMost;
  struct sysinfo si {};
  if (::sysinfo(&si) == 0) host = times(si.totalram, si.mem_unit);
  rlimit as{};
  if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) host = std::min<std::uint64_t>(host, as.rlim_cur);
  return host == kMost ? kMost : host / 2;
}

void check_memory_budget(const Config& c, std::uint16_t contexts, std::uint32_t tasks) {
  check(c, contexts, tasks, memory_budget_limit(), "half of this host's memory, or of RLIMIT_AS when lower");
}

void check_memory_budget(const Config& c, std::uint16_t contexts, std::uint32_t tasks, std::uint64_t limit_bytes) {
  check(c, contexts, tasks, limit_bytes, "the limit given");
}

}  // namespace ami
