// ami/device/region_table.hpp — the registered regions of one task, and the
// check every remote key goes through before a byte is read or written.
//
// Registration and deregistration are control-path calls serialised by the
// owning Client; check() is the data-path lookup and takes no lock: a slot's
// generation is published with release after its range is written. A
// generation is odd while the slot is live, even while it is free, so a key
// kept after deregistration (or after the slot is reused) is refused.
//
// A backend whose peers reach this task's memory without asking it (shm
// with CMA: the peer writes with process_vm_writev) gets a copy of the
// slots in memory those peers map (publish_to()), and checks a key against
// the owner's copy with check_published() before every access: the same
// refusals as check(), made at the origin.
//
// A region whose atomics are its NIC's (AtomicDomain::nic) also keeps its
// own remote key here (set_nic_home()), not published: the owner's engine
// does the atomics that arrive as messages on it through its NIC, with that
// key (docs/DESIGN.md, "Remote atomics").
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "ami/memory.hpp"
#include "ami/status.hpp"

namespace ami::device {

// One registration as the owner publishes it. Plain atomics only, so it
// can live in memory shared between processes.
struct RegionSlot {
  std::atomic<std::uint32_t> generation{0};
  std::uint32_t reserved = 0;
  std::atomic<std::uint64_t> address{0};
  std::atomic<std::uint64_t> length{0};
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);

// Is [address, address + bytes) of the key's region inside the registration
// slot describes? Reads the slot as a seqlock: the range, then the
// generation again, so a slot being reused is never half-read.
inline Status check_slot(const RegionSlot& s, const RemoteKey& key, std::uint64_t address,
                         std::uint64_t bytes) {
  const std::uint32_t gen = s.generation.load(std::memory_order_acquire);
  if (!(gen & 1u) || gen != key.generation)
    return {StatusCode::remote_access, "remote key is stale (region deregistered)"};
  const std::uint64_t start = s.address.load(std::memory_order_relaxed);
  const std::uint64_t length = s.length.load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (s.generation.load(std::memory_order_relaxed) != gen)
    return {StatusCode::remote_access, "remote key is stale (region deregistered)"};
  if (address < start || address - start > length || bytes > length - (address - start))
    return {StatusCode::remote_access, "access lies outside the registered region"};
  return Status::success();
}

class RegionTable {
 public:
  RegionTable(std::uint64_t job, std::uint32_t task, std::uint32_t capacity)
      : job_(job), task_(task), capacity_(capacity), slots_(std::make_unique<RegionSlot[]>(capacity)) {}

  std::uint64_t job() const { return job_; }
  // Setup only, before the first registration: the job id agreed at bootstrap.
  void set_job(std::uint64_t job) { job_ = job; }
  std::uint32_t task() const { return task_; }
  std::uint32_t capacity() const { return capacity_; }

  // Setup only, before the first registration: every later add() and
  // remove() is written to shared[0, capacity()) too.
  void publish_to(RegionSlot* shared) { published_ = shared; }

  Status add(const void* address, std::uint64_t length, RemoteKey& key) {
    const auto start = reinterpret_cast<std::uintptr_t>(address);
    if (length == 0 || start + length < start)
      return {StatusCode::invalid_argument, "register_memory: the range runs past the end of the address space"};
    for (std::uint32_t i = 0; i < capacity_; ++i) {
      const std::uint32_t gen = slots_[i].generation.load(std::memory_order_relaxed);
      if (gen & 1u) continue;
      fill(slots_[i], start, length, gen + 1);
      if (published_ != nullptr) fill(published_[i], start, length, gen + 1);
      key = RemoteKey{.job = job_, .task = task_, .region = i, .generation = gen + 1,
                      .address = start, .length = length};
      return Status::success();
    }
    return {StatusCode::no_resource, "register_memory: the region table is full (AMI_MAX_REGIONS)"};
  }

  // Setup only: called with the region's number by remove(), before the
  // slot is retired, so a backend can drop its own registration of it while
  // no other thread can take the slot (and have its fresh registration
  // dropped instead).
  void on_remove(std::function<void(std::uint32_t region)> hook) { on_remove_ = std::move(hook); }

  void remove(std::uint32_t region) {
    if (region >= capacity_) return;
    const std::uint32_t gen = slots_[region].generation.load(std::memory_order_relaxed);
    if (!(gen & 1u)) return;
    if (on_remove_) on_remove_(region);
    if (RemoteKey* homes = homes_.load(std::memory_order_relaxed)) homes[region].generation = 0;
    // The published copy first: from here on no peer starts a copy into it.
    if (published_ != nullptr) published_[region].generation.store(gen + 1, std::memory_order_release);
    slots_[region].generation.store(gen + 1, std::memory_order_release);
  }

  // Registration only (serialised as add() is), before the key is handed
  // out: the region's atomics are its NIC's, done with key.
  void set_nic_home(std::uint32_t region, const RemoteKey& key) {
    if (region >= capacity_) return;
    RemoteKey* homes = homes_.load(std::memory_order_relaxed);
    if (homes == nullptr) {  // made on first use: most tasks never need it
      homes_owner_ = std::make_unique<RemoteKey[]>(capacity_);
      homes = homes_owner_.get();
    }
    homes[region] = key;
    homes_.store(homes, std::memory_order_release);
  }
  // The key a NIC-domain region was registered with, if the live region
  // that key names (checked first, by check()) is one; nullptr for a region
  // whose atomics are the CPU's.
  const RemoteKey* nic_home(const RemoteKey& key) const {
    const RemoteKey* homes = homes_.load(std::memory_order_acquire);
    if (homes == nullptr || key.region >= capacity_) return nullptr;
    const RemoteKey& h = homes[key.region];
    return h.generation == key.generation && h.atomics == AtomicDomain::nic ? &h : nullptr;
  }

  // May [address, address + bytes) of the key's region be accessed? Returns
  // the local address through out on success.
  Status check(const RemoteKey& key, std::uint64_t address, std::uint64_t bytes,
               std::byte*& out) const {
    const Status s = check_published(slots_.get(), capacity_, job_, task_, key, address, bytes);
    if (!s.ok()) return s;
    out = reinterpret_cast<std::byte*>(address);
    return Status::success();
  }

  // The same check at a peer, against the slots the owner published
  // (published: capacity slots in memory the owner maps).
  static Status check_published(const RegionSlot* published, std::uint32_t capacity, std::uint64_t job,
                                std::uint32_t task, const RemoteKey& key, std::uint64_t address,
                                std::uint64_t bytes) {
    if (key.job != job) return {StatusCode::remote_access, "remote key belongs to another job"};
    if (key.task != task) return {StatusCode::remote_access, "remote key names another task"};
    if (key.region >= capacity) return {StatusCode::remote_access, "remote key names no region"};
    return check_slot(published[key.region], key, address, bytes);
  }

 private:
  static void fill(RegionSlot& s, std::uint64_t address, std::uint64_t length, std::uint32_t gen) {
    s.address.store(address, std::memory_order_relaxed);
    s.length.store(length, std::memory_order_relaxed);
    s.generation.store(gen, std::memory_order_release);
  }
  std::uint64_t job_;
  const std::uint32_t task_;
  const std::uint32_t capacity_;
  std::unique_ptr<RegionSlot[]> slots_;
  RegionSlot* published_ = nullptr;
  std::unique_ptr<RemoteKey[]> homes_owner_;
  std::atomic<RemoteKey*> homes_{nullptr};
  std::function<void(std::uint32_t)> on_remove_;
};

}  // namespace ami::device
