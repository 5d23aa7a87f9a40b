// ami/device/region_table.hpp — the registered regions of one task, and the
// check every remote key goes through before a byte is read or written.
//
// Registration and deregistration are control-path calls serialised by the
// owning Client; check() is the data-path lookup and takes no lock: a slot's
// generation is published with release after its range is written. A
// generation is odd while the slot is live, even while it is free, so a key
// kept after deregistration (or after the slot is reused) is refused.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "ami/memory.hpp"
#include "ami/status.hpp"

namespace ami::device {

class RegionTable {
 public:
  RegionTable(std::uint64_t job, std::uint32_t task, std::uint32_t capacity)
      : job_(job), task_(task), capacity_(capacity), slots_(std::make_unique<Slot[]>(capacity)) {}

  std::uint64_t job() const { return job_; }
  // Setup only, before the first registration: the job id agreed at bootstrap.
  void set_job(std::uint64_t job) { job_ = job; }
  std::uint32_t task() const { return task_; }

  Status add(const void* address, std::uint64_t length, RemoteKey& key) {
    for (std::uint32_t i = 0; i < capacity_; ++i) {
      Slot& s = slots_[i];
      const std::uint32_t gen = s.generation.load(std::memory_order_relaxed);
      if (gen & 1u) continue;
      s.address = reinterpret_cast<std::uintptr_t>(address);
      s.length = length;
      s.generation.store(gen + 1, std::memory_order_release);
      key = RemoteKey{.job = job_, .task = task_, .region = i, .generation = gen + 1,
                      .backend_key = 0, .address = s.address, .length = length};
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
    Slot& s = slots_[region];
    const std::uint32_t gen = s.generation.load(std::memory_order_relaxed);
    if (!(gen & 1u)) return;
    if (on_remove_) on_remove_(region);
    s.generation.store(gen + 1, std::memory_order_release);
  }

  // May [address, address + bytes) of the key's region be accessed? Returns
  // the local address through out on success.
  Status check(const RemoteKey& key, std::uint64_t address, std::uint64_t bytes,
               std::byte*& out) const {
    if (key.job != job_) return {StatusCode::remote_access, "remote key belongs to another job"};
    if (key.task != task_) return {StatusCode::remote_access, "remote key names another task"};
    if (key.region >= capacity_) return {StatusCode::remote_access, "remote key names no region"};
    const Slot& s = slots_[key.region];
    const std::uint32_t gen = s.generation.load(std::memory_order_acquire);
    if (!(gen & 1u) || gen != key.generation)
      return {StatusCode::remote_access, "remote key is stale (region deregistered)"};
    if (address < s.address || address - s.address > s.length ||
        bytes > s.length - (address - s.address))
      return {StatusCode::remote_access, "access lies outside the registered region"};
    out = reinterpret_cast<std::byte*>(address);
    return Status::success();
  }

 private:
  struct Slot {
    std::atomic<std::uint32_t> generation{0};
    std::uintptr_t address = 0;
    std::uint64_t length = 0;
  };

  std::uint64_t job_;
  const std::uint32_t task_;
  const std::uint32_t capacity_;
  std::unique_ptr<Slot[]> slots_;
  std::function<void(std::uint32_t)> on_remove_;
};

}  // namespace ami::device
