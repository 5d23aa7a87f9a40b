// registration_cache.hpp — a context's bounded cache of memory
// registrations: the Registrar its protocol engine uses.
//
// A registration covers whole pages, so buffers sharing pages share one. An
// acquisition that lies inside a live registration reuses it (a hit) and
// counts a reference; a release drops one. A registration whose last
// reference goes is either deregistered at once or kept idle, least recently
// used first out, up to Limits::idle entries; when a new registration would
// pass max_entries or max_bytes, idle ones are deregistered first, and if
// the registrations still in use already fill the cache, acquire() returns
// no_resource. Keeping idle registrations is safe only where a registration
// pins nothing (self, shm): a verbs registration kept past the buffer's
// free() would point the NIC at the old pages, so with verbs the client
// keeps none unless told otherwise (AMI_RCACHE_IDLE).
// Not thread-safe: owned and used by one context.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "ami/device/registrar.hpp"
#include "core_config.hpp"

namespace ami::detail {

class RegistrationCache final : public device::Registrar {
 public:
  // Registers [address, address + length) in the client: a region slot, and
  // the backend's registration where there is one.
  using RegisterFn = std::function<Status(void* address, std::size_t length, RemoteKey& key,
                                          LocalKeys& local_keys)>;
  using DeregisterFn = std::function<void(std::uint32_t region)>;

  struct Limits {
    std::uint32_t max_entries = core::Param("AMI_RCACHE_MAX_ENTRIES").default_as<std::uint32_t>();
    std::uint64_t max_bytes = core::Param("AMI_RCACHE_MAX_MB").default_as() << 20;
    std::uint32_t idle = 0;  // idle registrations kept
  };
  struct Counters {
    std::uint64_t hits = 0;
    std::uint64_t misses = 0;
    std::uint64_t evictions = 0;  // idle registrations dropped to make room
    std::uint64_t refused = 0;    // acquisitions refused: the cache was full of used entries
  };

  RegistrationCache(RegisterFn reg, DeregisterFn dereg, Limits limits, std::size_t page_bytes);
  ~RegistrationCache();
  RegistrationCache(const RegistrationCache&) = delete;
  RegistrationCache& operator=(const RegistrationCache&) = delete;

  Status acquire(const void* address, std::uint64_t bytes, device::Registration& out) override;
  void release(const device::Registration& registration) override;

  const Counters& counters() const { return counters_; }
  std::uint32_t in_use() const { return in_use_; }
  std::uint32_t idle() const { return idle_count_; }
  std::uint64_t bytes() const { return bytes_; }

 private:
  static constexpr std::uint32_t kNone = ~std::uint32_t{0};
  struct Entry {
    std::uintptr_t start = 0;
    std::uintptr_t end = 0;
    RemoteKey key{};
    LocalKeys local_keys{};
    std::uint32_t refs = 0;
    bool live = false;
    std::uint32_t older = kNone;  // idle list, most recent at head_
    std::uint32_t newer = kNone;
  };

  void unlink_idle(std::uint32_t i);
  void push_idle(std::uint32_t i);
  void drop(std::uint32_t i);
  bool make_room(std::uint64_t bytes);

  RegisterFn register_;
  DeregisterFn deregister_;
  Limits limits_;
  std::uintptr_t page_mask_;
  std::vector<Entry> entries_;
  std::vector<std::uint32_t> free_;
  std::uint32_t newest_ = kNone;  // idle list ends
  std::uint32_t oldest_ = kNone;
  std::uint32_t in_use_ = 0;
  std::uint32_t idle_count_ = 0;
  std::uint64_t bytes_ = 0;
  Counters counters_;
};

}  // namespace ami::detail
