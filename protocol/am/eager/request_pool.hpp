// protocol/am/eager/request_pool.hpp — the fixed pool of requests for
// instructions that cannot finish inside the call that posted them.
//
// Sized once at setup (AMI_MAX_REQUESTS): the data path never allocates. A
// request's id (index and generation) travels on the wire and comes back in
// an ack or a stop; find() refuses ids that name no live request, so a stale
// or forged id is dropped, never trusted.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ami/callback.hpp"
#include "ami/device/descriptor.hpp"
#include "ami/device/registrar.hpp"
#include "wire/packet.hpp"

namespace ami::protocol {

class AmEngine;

struct Request {
  enum class Kind : std::uint8_t { send, rdma, fence, atomic };

  Kind kind = Kind::send;
  bool live = false;
  std::uint32_t index = 0;
  std::uint32_t generation = 0;
  std::uint32_t peer = 0;
  AmEngine* engine = nullptr;  // the owner, reached from completion callbacks
  Request* next = nullptr;     // in the peer's work queue
  // Waiting for an ack (a remote-done, a rendezvous verdict, a fence's
  // answer): its ack sequence number and its place in the peer's list; an
  // atomic sent as a message waits in the peer's list of atomics instead.
  std::uint64_t ack_seq = 0;
  Request* ack_prev = nullptr;
  Request* ack_next = nullptr;
  bool awaiting_ack = false;

  // send
  std::uint16_t dispatch = 0;
  std::uint16_t flags = 0;
  std::uint16_t header_len = 0;
  std::array<std::byte, 128> header{};
  const std::byte* payload = nullptr;
  std::uint64_t total = 0;
  std::uint64_t sent = 0;
  bool started = false;
  Callback local_done;
  Callback remote_done;
  bool local_pending = false;   // a FIFO slot's callback (or one still to be attached) is owed
  bool remote_pending = false;  // remote_done not yet run
  bool local_fired = false;
  Status failure;               // the first error seen; local_done gets it

  // a send the receiver may stop (more than one packet, buffer registered)
  bool rndv = false;
  bool verdict_pending = false;  // no ack yet
  bool owns_registration = false;
  device::Registration registration{};
  std::uint64_t eager_end = 0;   // eager bytes to send: total, or what was sent at a stop
  std::uint32_t packets = 0;     // eager packets sent (their size grows)
  std::uint64_t eager_mark = 0;  // the lane's FIFO injections before its first packet
  bool paced = false;            // its receiver is expected to stop it: eager packets paced by completions
  std::uint32_t puts_pending = 0;  // stop_put: pieces of the PUT not yet complete
  bool stopped = false;

  // rdma
  device::DescriptorKind rdma_kind = device::DescriptorKind::put;
  device::RdmaDescriptor rdma{};

  // atomic: what it does, and where its old value goes
  device::AtomicDescriptor atomic{};

  // fence_all: the fences to each peer still to answer
  std::uint32_t children = 0;

  std::uint64_t id() const;
};



// A fixed pool of T (Request, or the engine's record of a stopped message),
// each with an index, a generation and a live flag. acquire() hands out a
// fresh T (index kept, generation bumped); id() names it on the wire, and
// find() refuses an id that names no live T.
inline std::uint64_t pool_id(std::uint32_t index, std::uint32_t generation) {
  return (std::uint64_t{1} << 63) | (std::uint64_t{generation} << 32) | index;
}

template <class T>
class IdPool {
 public:
  explicit IdPool(std::uint32_t capacity) : items_(capacity) {
    free_.reserve(capacity);
    for (std::uint32_t i = capacity; i-- > 0;) {
      items_[i].index = i;
      free_.push_back(i);
    }
  }

  std::size_t in_use() const { return items_.size() - free_.size(); }
  // Calls fn(T&) for every live T (fn may release it).
  template <class F>
  void for_each_live(F&& fn) {
    for (T& t : items_)
      if (t.live) fn(t);
  }
  bool exhausted() const { return free_.empty(); }

  T* acquire() {
    if (free_.empty()) return nullptr;
    T& t = items_[free_.back()];
    free_.pop_back();
    const std::uint32_t index = t.index;
    const std::uint32_t generation = (t.generation + 1) & 0x7FFFFFFFu;
    t = T{};
    t.index = index;
    t.generation = generation;
    t.live = true;
    return &t;
  }

  void release(T& t) {
    t.live = false;
    free_.push_back(t.index);
  }

  T* find(std::uint64_t id) {
    if ((id >> 63) == 0) return nullptr;
    const auto index = static_cast<std::uint32_t>(id & 0xFFFFFFFFu);
    const auto generation = static_cast<std::uint32_t>((id >> 32) & 0x7FFFFFFFu);
    if (index >= items_.size()) return nullptr;
    T& t = items_[index];
    return (t.live && t.generation == generation) ? &t : nullptr;
  }

 private:
  std::vector<T> items_;
  std::vector<std::uint32_t> free_;
};

inline std::uint64_t Request::id() const { return pool_id(index, generation); }

using RequestPool = IdPool<Request>;

}  // namespace ami::protocol
