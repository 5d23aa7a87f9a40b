// ami/device/transfer_counter.hpp — the monotonic count of descriptors a
// device has finished with.
//
// The device (a progress loop, a CQ poller, a peer's ring copy) advances it;
// the completion step only ever reads a snapshot of it. 64 bits never wrap
// in practice (at 10^9 descriptors per second, 584 years), so comparisons are
// plain integer comparisons. One writer at a time; any number of readers.
#pragma once

#include <atomic>
#include <cstdint>

namespace ami::device {

class TransferCounter {
 public:
  std::uint64_t snapshot() const { return value_.load(std::memory_order_acquire); }

  // Device side: n more descriptors are done (their data left the buffer).
  void advance(std::uint64_t n) {
    value_.store(value_.load(std::memory_order_relaxed) + n, std::memory_order_release);
  }
  void advance_to(std::uint64_t value) { value_.store(value, std::memory_order_release); }

 private:
  std::atomic<std::uint64_t> value_{0};
};

}  // namespace ami::device
