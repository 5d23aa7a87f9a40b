// memory_budget.hpp — the memory a client's settings make it allocate,
// checked against the host before anything is allocated.
//
// Each setting has a range a job can use, but in-range settings multiply:
// 65536 self cells of 4 MiB are 256 GiB per context, and AMI_MAX_REQUESTS
// of 1048576 on many contexts is gigabytes of requests. Allocating that
// throws std::bad_alloc half-way or pages for seconds; the Client checks
// first and refuses, naming the settings to lower.
//
// The bound: half of the host's physical memory (sysinfo), or half of
// RLIMIT_AS when that is lower. Half, because the application, the
// registrations it pins and the other tasks on the host need the rest.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ami/config.hpp"
#include "ami/device/backend.hpp"

namespace ami {

// One group of settings whose product is memory the client allocates.
using MemoryDemand = device::MemoryDemand;

// Every group, for a client of `contexts` contexts in a job of `tasks`
// tasks: the engine's, then those of each backend AMI_BACKENDS asks for. The injection FIFOs are counted for every lane a context may open
// (tasks x contexts); lanes are opened on first use, so a job whose tasks
// talk to few peers allocates less.
std::vector<MemoryDemand> memory_demands(const Config& c, std::uint16_t contexts, std::uint32_t tasks);

// Half of the host's physical memory, or of RLIMIT_AS when lower; the
// largest uint64_t when neither can be read.
std::uint64_t memory_budget_limit();

// Throws ami::Error when the groups together need more than the limit,
// naming each group (largest first) with its settings, figures and bytes,
// and the limit in bytes.
void check_memory_budget(const Config& c, std::uint16_t contexts, std::uint32_t tasks);
// The same against a given limit.
void check_memory_budget(const Config& c, std::uint16_t contexts, std::uint32_t tasks, std::uint64_t limit_bytes);

}  // namespace ami
