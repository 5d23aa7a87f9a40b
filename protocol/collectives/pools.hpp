// protocol/collectives/pools.hpp — the memory collectives keep between
// calls: buffers (early arrivals, scratch for partial results) in
// power-of-two size classes, and arrival records, both taken from free lists
// and given back, so a collective in steady state allocates nothing. A pool
// allocates only when a class runs dry, and counts it.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <vector>

#include "ami/dispatch.hpp"
#include "wire.hpp"

namespace ami::coll {

class Engine;
struct Operation;

// A buffer from a BufferPool: moved around, given back with release().
struct Block {
  std::byte* data = nullptr;
  std::uint8_t size_class = 0;
  explicit operator bool() const { return data != nullptr; }
};

class BufferPool {
 public:
  explicit BufferPool(std::uint64_t& allocated) : allocated_(allocated) {}
  ~BufferPool() {  // every buffer it made, given back or not
    for (std::byte* p : all_) std::free(p);
  }
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // At least bytes (64-byte aligned); null only when memory is exhausted.
  Block acquire(std::size_t bytes) {
    const auto c = static_cast<std::uint8_t>(std::bit_width(std::max<std::size_t>(bytes, kSmallest) - 1));
    if (c >= free_.size()) return {};
    std::vector<std::byte*>& list = free_[c];
    if (!list.empty()) {
      std::byte* p = list.back();
      list.pop_back();
      return {p, c};
    }
    auto* p = static_cast<std::byte*>(std::aligned_alloc(64, std::size_t{1} << c));
    if (p == nullptr) return {};
    all_.push_back(p);
    ++allocated_;
    return {p, c};
  }
  void release(Block& b) {
    if (b.data != nullptr) free_[b.size_class].push_back(b.data);
    b = Block{};
  }

 private:
  static constexpr std::size_t kSmallest = 64;
  std::array<std::vector<std::byte*>, 48> free_;
  std::vector<std::byte*> all_;
  std::uint64_t& allocated_;
};

// A message kept for a collective that could not take it yet: its call has
// not come (or its geometry does not exist yet), or its step is not ready.
struct Arrival {
  enum class State : std::uint8_t {
    receiving,  // a message of several packets streaming into buffer
    ready,      // bytes of data in buffer (or none: a barrier)
    deferred,   // large: left at its sender (Receive::defer) until accepted
  };
  Engine* engine = nullptr;
  Header header;
  std::uint32_t origin_task = 0;
  std::uint32_t origin = 0;     // rank in the geometry, once known
  State state = State::ready;
  Block buffer;
  std::size_t bytes = 0;
  Deferred deferred;            // State::deferred (ami fills in its id)
  std::uint64_t contributors = 0;  // reduce: the children whose data it holds (bit per child)
  Status status;
  Operation* owner = nullptr;   // the operation that took it: told when a receiving one is ready
  bool discard = false;         // nobody wants it: released once a receiving one is complete
  Arrival* next = nullptr;
};

class ArrivalPool {
 public:
  Arrival* acquire() {
    if (free_.empty()) {
      all_.push_back(std::make_unique<Arrival>());
      return all_.back().get();
    }
    Arrival* a = free_.back();
    free_.pop_back();
    return a;
  }
  // The record's buffer must have gone back to its pool.
  void release(Arrival* a) {
    *a = Arrival{};
    free_.push_back(a);
  }

 private:
  std::vector<std::unique_ptr<Arrival>> all_;
  std::vector<Arrival*> free_;
};

// Records in arrival order (singly linked through Arrival::next).
struct ArrivalList {
  Arrival* head = nullptr;
  Arrival* tail = nullptr;

  bool empty() const { return head == nullptr; }
  void push(Arrival* a) {
    a->next = nullptr;
    if (tail != nullptr) tail->next = a; else head = a;
    tail = a;
  }
  // Moves every record that matches pred, in order, to out.
  template <typename Pred>
  void take(Pred pred, ArrivalList& out) {
    Arrival* prev = nullptr;
    for (Arrival* a = head; a != nullptr;) {
      Arrival* next = a->next;
      if (pred(*a)) {
        if (prev != nullptr) prev->next = next; else head = next;
        if (tail == a) tail = prev;
        out.push(a);
      } else {
        prev = a;
      }
      a = next;
    }
  }
};

}  // namespace ami::coll
