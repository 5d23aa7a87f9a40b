// registration_cache.cpp — lookup, reference counts and the idle list.
#include "registration_cache.hpp"

namespace ami::detail {

RegistrationCache::RegistrationCache(RegisterFn reg, DeregisterFn dereg, Limits limits,
                                     std::size_t page_bytes)
    : register_(std::move(reg)), deregister_(std::move(dereg)), limits_(limits),
      page_mask_(~(std::uintptr_t{page_bytes} - 1)) {
  entries_.resize(limits.max_entries);
  free_.reserve(limits.max_entries);
  for (std::uint32_t i = limits.max_entries; i-- > 0;) free_.push_back(i);
}

RegistrationCache::~RegistrationCache() {
  for (std::uint32_t i = 0; i < entries_.size(); ++i)
    if (entries_[i].live) deregister_(entries_[i].key.region);
}

Status RegistrationCache::acquire(const void* address, std::uint64_t bytes,
                                  device::Registration& out) {
  if (address == nullptr || bytes == 0)
    return {StatusCode::invalid_argument, "registration: empty or null range"};
  const auto first = reinterpret_cast<std::uintptr_t>(address);
  if (first + bytes < first)
    return {StatusCode::invalid_argument, "registration: range wraps around the address space"};
  const std::uintptr_t start = first & page_mask_;
  const std::uintptr_t end = (first + bytes + ~page_mask_) & page_mask_;
  // A linear look: the cache is small (AMI_RCACHE_MAX_ENTRIES), and a hit
  // saves a system call at least.
  for (std::uint32_t i = 0; i < entries_.size(); ++i) {
    Entry& e = entries_[i];
    if (!e.live || e.start > start || e.end < end) continue;
    if (e.refs++ == 0) {
      unlink_idle(i);
      ++in_use_;
    }
    ++counters_.hits;
    out = device::Registration{e.key, e.local_keys, i};
    return Status::success();
  }
  ++counters_.misses;
  if (!make_room(end - start)) {
    ++counters_.refused;
    return {StatusCode::no_resource,
            "registration cache: every entry is in use (AMI_RCACHE_MAX_ENTRIES, AMI_RCACHE_MAX_MB)"};
  }
  const std::uint32_t i = free_.back();
  Entry& e = entries_[i];
  Status s = register_(reinterpret_cast<void*>(start), end - start, e.key, e.local_keys);
  if (!s.ok()) return s;
  free_.pop_back();
  e.start = start;
  e.end = end;
  e.refs = 1;
  e.live = true;
  ++in_use_;
  bytes_ += end - start;
  out = device::Registration{e.key, e.local_keys, i};
  return Status::success();
}

void RegistrationCache::release(const device::Registration& r) {
  if (r.handle >= entries_.size()) return;
  Entry& e = entries_[r.handle];
  if (!e.live || e.refs == 0 || e.key.generation != r.key.generation) return;
  if (--e.refs != 0) return;
  --in_use_;
  if (limits_.idle == 0) {
    drop(r.handle);
    return;
  }
  push_idle(r.handle);
  if (idle_count_ > limits_.idle) {
    ++counters_.evictions;
    const std::uint32_t victim = oldest_;
    unlink_idle(victim);
    drop(victim);
  }
}

// Deregisters idle entries, oldest first, until bytes more fit; false when
// the entries in use alone leave no room.
bool RegistrationCache::make_room(std::uint64_t bytes) {
  while (free_.empty() || bytes_ + bytes > limits_.max_bytes) {
    if (oldest_ == kNone) return false;
    ++counters_.evictions;
    const std::uint32_t victim = oldest_;
    unlink_idle(victim);
    drop(victim);
  }
  return true;
}

void RegistrationCache::drop(std::uint32_t i) {
  Entry& e = entries_[i];
  deregister_(e.key.region);
  bytes_ -= e.end - e.start;
  e.live = false;
  free_.push_back(i);
}

void RegistrationCache::push_idle(std::uint32_t i) {
  Entry& e = entries_[i];
  e.newer = kNone;
  e.older = newest_;
  if (newest_ != kNone) entries_[newest_].newer = i; else oldest_ = i;
  newest_ = i;
  ++idle_count_;
}

void RegistrationCache::unlink_idle(std::uint32_t i) {
  Entry& e = entries_[i];
  const bool listed = e.older != kNone || e.newer != kNone || newest_ == i;
  if (!listed) return;
  if (e.older != kNone) entries_[e.older].newer = e.newer; else oldest_ = e.newer;
  if (e.newer != kNone) entries_[e.newer].older = e.older; else newest_ = e.older;
  e.older = e.newer = kNone;
  --idle_count_;
}

}  // namespace ami::detail
