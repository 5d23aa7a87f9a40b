// ami/device/pending_callback_list.hpp — one callback slot per injection FIFO
// slot, and the count of slots holding one (docs/DESIGN.md, method 1).
//
// An instruction without a callback lists nothing: its slot stays null and
// the completion step passes over it. No sequence numbers, no completion
// descriptors. Owned by its InjectionFifo; not thread-safe (one advancing
// thread per context).
#pragma once

#include <cstdint>
#include <memory>

#include "ami/callback.hpp"

namespace ami::device {

class PendingCallbackList {
 public:
  explicit PendingCallbackList(std::uint32_t slots)
      : slots_(std::make_unique<Callback[]>(slots)) {}

  bool empty_at(std::uint32_t slot) const { return !slots_[slot]; }
  std::uint32_t pending() const { return pending_; }

  void list(std::uint32_t slot, Callback cb) {
    slots_[slot] = cb;
    ++pending_;
  }

  // Empties the slot before returning its callback, so a callback that
  // re-enters the FIFO sees a consistent list.
  Callback take(std::uint32_t slot) {
    Callback cb = slots_[slot];
    if (cb) {
      slots_[slot] = {};
      --pending_;
    }
    return cb;
  }

 private:
  std::unique_ptr<Callback[]> slots_;
  std::uint32_t pending_ = 0;
};

}  // namespace ami::device
