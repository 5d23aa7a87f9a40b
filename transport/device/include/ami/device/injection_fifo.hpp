// ami/device/injection_fifo.hpp — the software side of a device queue: a ring
// of descriptor slots, its parallel pending callback list, and the transfer
// counter the device advances (docs/DESIGN.md, method 1).
//
// Software reserves a slot, fills the descriptor, commits it (optionally
// listing a callback) and rings the device. The device works through slots
// [counter, injected) in order and advances the counter. complete() is the
// advance step: it snapshots the counter and, only when a callback is pending
// and the snapshot moved, calls the listed callbacks of the slots now passed,
// in order, nulling each.
//
// A slot is available only when the device is past its previous occupant and
// its callback slot is null. "Past" is judged against the counter as the
// completion step last saw it, refreshed at reservation when no callback is
// pending: a slot the device passed but whose callback has not been called
// yet is not free, and a reused slot's new callback can never be mistaken
// for the old occupant's.
//
// Not thread-safe: one thread advances a context at a time. The counter may
// be advanced concurrently by a device thread.
#pragma once

#include <cstdint>
#include <memory>

#include "ami/device/pending_callback_list.hpp"
#include "ami/device/transfer_counter.hpp"

namespace ami::device {

template <typename Slot>
class InjectionFifo {
 public:
  // depth must be a power of two.
  explicit InjectionFifo(std::uint32_t depth)
      : depth_(depth), mask_(depth - 1), slots_(std::make_unique<Slot[]>(depth)),
        callbacks_(depth) {}

  InjectionFifo(const InjectionFifo&) = delete;
  InjectionFifo& operator=(const InjectionFifo&) = delete;

  std::uint32_t depth() const { return depth_; }
  std::uint64_t injected() const { return injected_; }
  std::uint32_t pending_callbacks() const { return callbacks_.pending(); }
  // The counter passed a descriptor whose callback complete() has yet to run.
  bool completions_due() const { return callbacks_.pending() > 0 && scanned_ < counter_.snapshot(); }
  TransferCounter& counter() { return counter_; }
  const TransferCounter& counter() const { return counter_; }

  // The slot the next commit() publishes, or nullptr when it is not free.
  [[gnu::always_inline]] Slot* try_reserve() {
    if (callbacks_.pending() == 0) scanned_ = counter_.snapshot();
    const std::uint64_t next = injected_;
    if (next - scanned_ >= depth_) return nullptr;
    if (!callbacks_.empty_at(index(next))) return nullptr;
    return &slots_[index(next)];
  }

  // Publishes the reserved slot; lists cb when it is set.
  void commit(Callback cb = {}) {
    if (cb) callbacks_.list(index(injected_), cb);
    ++injected_;
  }

  // Device side: the descriptor of injection number n (counter <= n < injected).
  Slot& at(std::uint64_t n) { return slots_[index(n)]; }
  // Device side: does a callback wait for descriptor n? A device that
  // reports completions selectively asks for one only then.
  bool has_callback(std::uint64_t n) const { return !callbacks_.empty_at(index(n)); }

  // The advance step. Returns the number of callbacks called.
  std::uint32_t complete() {
    if (callbacks_.pending() == 0) return 0;
    const std::uint64_t snap = counter_.snapshot();
    if (snap == scanned_) return 0;
    std::uint32_t called = 0;
    // scanned_ is the loop variable so that a callback re-entering
    // try_reserve() (which may move it forward) ends the loop safely.
    while (scanned_ < snap && callbacks_.pending() > 0) {
      const std::uint64_t n = scanned_++;
      if (Callback cb = callbacks_.take(index(n))) {
        ++called;
        cb(Status::success());
      }
    }
    return called;
  }

  // The device refused descriptor n (counter <= n < injected): its listed
  // callback runs now with status; the counter still passes n as usual.
  void fail_one(std::uint64_t n, Status status) {
    if (Callback cb = callbacks_.take(index(n))) cb(status);
  }

  // The lane is gone: every listed callback runs once with status, and the
  // counter is moved past everything injected so the slots become free.
  std::uint32_t fail_pending(Status status) {
    std::uint32_t called = 0;
    const std::uint64_t end = injected_;
    counter_.advance_to(end);
    while (scanned_ < end) {
      const std::uint64_t n = scanned_++;
      if (Callback cb = callbacks_.take(index(n))) {
        ++called;
        cb(status);
      }
    }
    return called;
  }

 private:
  std::uint32_t index(std::uint64_t n) const { return static_cast<std::uint32_t>(n & mask_); }

  const std::uint32_t depth_;
  const std::uint64_t mask_;
  std::unique_ptr<Slot[]> slots_;
  PendingCallbackList callbacks_;
  TransferCounter counter_;
  std::uint64_t injected_ = 0;  // software: descriptors committed
  std::uint64_t scanned_ = 0;   // completion step: last snapshot processed
};

}  // namespace ami::device
