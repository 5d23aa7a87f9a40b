// protocol/eager/request_pool.hpp — the fixed pool of requests for
// instructions that cannot finish inside the call that posted them.
//
// Sized once at setup (AMI_MAX_REQUESTS): the data path never allocates. A
// request's id (index and generation) travels on the wire and comes back in
// a remote_done; find() refuses ids that name no live request, so a stale or
// forged id is dropped, never trusted.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ami/callback.hpp"
#include "ami/device/descriptor.hpp"
#include "ami/device/registrar.hpp"
#include "protocol/wire/packet.hpp"

namespace ami::protocol {

class AmEngine;

struct Request {
  enum class Kind : std::uint8_t { send, rdma, fence };

  Kind kind = Kind::send;
  bool live = false;
  std::uint32_t index = 0;
  std::uint32_t generation = 0;
  std::uint32_t peer = 0;
  AmEngine* engine = nullptr;  // the owner, reached from completion callbacks
  Request* next = nullptr;     // in the peer's work queue

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
  std::uint32_t puts_pending = 0;  // stop_put: pieces of the PUT not yet complete
  bool stopped = false;

  // rdma
  device::DescriptorKind rdma_kind = device::DescriptorKind::put;
  device::RdmaDescriptor rdma{};

  // the receiver's side of a stopped message (its id for it, for cts/fin)
  std::uint64_t stop_record = 0;

  // fence_all: the fences to each peer still to answer
  std::uint32_t children = 0;

  std::uint64_t id() const { return (std::uint64_t{1} << 63) | (std::uint64_t{generation} << 32) | index; }
};

class RequestPool {
 public:
  explicit RequestPool(std::uint32_t capacity) : requests_(capacity) {
    free_.reserve(capacity);
    for (std::uint32_t i = capacity; i-- > 0;) {
      requests_[i].index = i;
      free_.push_back(i);
    }
  }

  std::size_t in_use() const { return requests_.size() - free_.size(); }

  Request* acquire() {
    if (free_.empty()) return nullptr;
    Request& r = requests_[free_.back()];
    free_.pop_back();
    const std::uint32_t index = r.index;
    const std::uint32_t generation = (r.generation + 1) & 0x7FFFFFFFu;
    r = Request{};
    r.index = index;
    r.generation = generation;
    r.live = true;
    return &r;
  }

  void release(Request& r) {
    r.live = false;
    free_.push_back(r.index);
  }

  Request* find(std::uint64_t id) {
    if ((id >> 63) == 0) return nullptr;
    const auto index = static_cast<std::uint32_t>(id & 0xFFFFFFFFu);
    const auto generation = static_cast<std::uint32_t>((id >> 32) & 0x7FFFFFFFu);
    if (index >= requests_.size()) return nullptr;
    Request& r = requests_[index];
    return (r.live && r.generation == generation) ? &r : nullptr;
  }

 private:
  std::vector<Request> requests_;
  std::vector<std::uint32_t> free_;
};

}  // namespace ami::protocol
