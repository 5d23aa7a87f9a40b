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
#include "ami/error.hpp"
#include "backend_set.hpp"
#include "core_config.hpp"
#include "eager/request_pool.hpp"
#include "protocol_config.hpp"

namespace ami {

namespace {

constexpr std::uint64_t kMost = std::numeric_limits<std::uint64_t>::max();

constexpr auto times = MemoryDemand::times;

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

// A request, and the engine's record of a stopped message, of which it
// keeps AMI_MAX_REQUESTS each (protocol/am/eager/am_engine.hpp), each with a
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

  const std::uint64_t requests = protocol::Options::from(c).max_requests;
  out.push_back({"requests: AMI_MAX_REQUESTS x contexts x bytes per request",
                 std::to_string(requests) + " x " + n + " x " + std::to_string(kRequestBytes),
                 times(times(requests, contexts), kRequestBytes)});

  // Lanes are made on first use, so what every job pays is the lanes to
  // one peer task (every context to each of its contexts); each further
  // peer talked to costs as much again, which a job of a million tasks
  // that talks to a few neighbours never pays.
  const std::uint64_t fifo = core::Options::from(c).fifo_depth;
  const std::uint64_t lanes = times(tasks > 1 ? 1 : 0, times(contexts, contexts));
  out.push_back({"injection FIFOs: AMI_FIFO_DEPTH x lanes to one peer (contexts x contexts) x bytes per slot",
                 std::to_string(fifo) + " x " + std::to_string(lanes) + " x " + std::to_string(kFifoSlotBytes),
                 times(times(fifo, lanes), kFifoSlotBytes)});

  for (const detail::RegisteredBackend* b : detail::BackendSet::asked_for(c)) {
    if (b->info.memory == nullptr) continue;
    std::vector<MemoryDemand> more = b->info.memory(c, contexts);
    out.insert(out.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
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
