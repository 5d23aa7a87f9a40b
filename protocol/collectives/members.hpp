// protocol/collectives/members.hpp — a geometry's members: the task of each
// rank and the rank of each task.
//
// What a geometry keeps grows with its members, never with the job: the
// world (tasks 0..n-1 in rank order, and any list that is the same) keeps
// nothing, since rank and task are one number; any other list keeps its
// tasks by rank and the same entries sorted by task, which a rank lookup
// searches (a geometry of three tasks in a job of 16,384 keeps six entries,
// not a table of 16,384).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace ami::coll {

class Members {
 public:
  static constexpr std::uint32_t kNotMember = ~std::uint32_t{0};

  // Tasks 0..n-1, rank r being task r: the world.
  static Members first(std::uint32_t n) { return Members(n); }
  // The tasks by rank, each once (the caller checked).
  explicit Members(std::vector<std::uint32_t> tasks) : size_(static_cast<std::uint32_t>(tasks.size())) {
    bool in_order = true;
    for (std::uint32_t r = 0; r < size_ && in_order; ++r) in_order = tasks[r] == r;
    if (in_order) return;  // rank r is task r: nothing to keep
    by_rank_ = std::move(tasks);
    by_task_.reserve(size_);
    for (std::uint32_t r = 0; r < size_; ++r) by_task_.push_back({by_rank_[r], r});
    std::sort(by_task_.begin(), by_task_.end());
  }

  std::uint32_t size() const { return size_; }
  // The task of rank r (r below size()).
  std::uint32_t task(std::uint32_t r) const { return by_rank_.empty() ? r : by_rank_[r]; }
  // The rank of task t, or kNotMember.
  std::uint32_t rank(std::uint32_t t) const {
    if (by_rank_.empty()) return t < size_ ? t : kNotMember;
    const auto it = std::lower_bound(by_task_.begin(), by_task_.end(), std::pair<std::uint32_t, std::uint32_t>{t, 0});
    return it != by_task_.end() && it->first == t ? it->second : kNotMember;
  }
  // What the lists hold, in bytes.
  std::size_t bytes() const {
    return by_rank_.capacity() * sizeof(std::uint32_t) + by_task_.capacity() * sizeof(by_task_[0]);
  }

 private:
  explicit Members(std::uint32_t n) : size_(n) {}

  std::uint32_t size_;
  std::vector<std::uint32_t> by_rank_;                            // empty: rank r is task r
  std::vector<std::pair<std::uint32_t, std::uint32_t>> by_task_;  // (task, rank), by task
};

}  // namespace ami::coll
