// protocol/collectives/allgather.cpp — allgather as a ring: at step t
// (0..n-2) each rank sends block rank - t to rank + 1 and takes block
// rank - 1 - t from rank - 1, straight into its place in the caller's recv
// (from the packet, or by the rendezvous when large), and forwards it at
// the next step the moment it is complete. Every block is moved once per
// hop and never copied on the way; only an early arrival (a peer already
// in the next allgather) waits in a buffer, or at its sender when large.
#include <cstring>

#include "engine.hpp"

namespace ami::coll {

namespace {
enum StepState : std::uint8_t { kNone, kStreaming, kKept, kDone };

bool overlap(const void* a, const void* b, std::size_t bytes_a, std::size_t bytes_b) {
  const auto* x = static_cast<const std::byte*>(a);
  const auto* y = static_cast<const std::byte*>(b);
  return bytes_a != 0 && bytes_b != 0 && x < y + bytes_b && y < x + bytes_a;
}
}  // namespace

Status GeometryImpl::allgather(const void* send, std::size_t bytes, void* recv, Callback done) {
  CallScope scope(engine);
  if (bytes > (std::size_t{1} << 40) / size)
    return {StatusCode::invalid_argument, "allgather: bytes is too large"};
  if ((send == nullptr || recv == nullptr) && bytes != 0)
    return {StatusCode::invalid_argument, "allgather: send or recv is null but bytes is not zero"};
  auto* own_block = static_cast<std::byte*>(recv) + std::size_t{rank} * bytes;
  if (send != own_block && overlap(send, recv, bytes, bytes * size))
    return {StatusCode::invalid_argument, "allgather: send overlaps recv without being this rank's block of it"};
  AllgatherState& g = allgather_;
  if (Status s = begin(g, done, "allgather: an allgather is in flight on this geometry already"); !s.ok())
    return s;
  g.send = static_cast<const std::byte*>(send);
  g.recv = static_cast<std::byte*>(recv);
  g.bytes = bytes;
  if (send != own_block && bytes != 0) std::memcpy(own_block, send, bytes);
  allgather_start();
  return Status::success();
}

void GeometryImpl::allgather_start() {
  AllgatherState& g = allgather_;
  g.sent = 0;
  g.streaming = 0;
  g.arrived.assign(size - 1, kNone);
  g.kept.assign(size - 1, nullptr);
  ArrivalList early = take_early(g);
  for (Arrival* a = early.head; a != nullptr;) {
    Arrival* next = a->next;
    allgather_take(a);
    a = next;
  }
  allgather_progress();
}

std::byte* GeometryImpl::allgather_place(std::uint16_t step) {
  const std::uint32_t block = topology::ring_block(rank, size, std::uint64_t{step} + 1);
  return allgather_.recv + std::size_t{block} * allgather_.bytes;
}

bool GeometryImpl::allgather_expects(const Header& h, std::uint32_t origin, std::size_t bytes) {
  AllgatherState& g = allgather_;
  if (bytes != g.bytes) {
    ++engine.stats.malformed;
    g.fail({StatusCode::invalid_argument, "allgather: the members' bytes do not match"});
    return false;
  }
  if (h.step + 1u >= size || origin != topology::ring_prev(rank, size) || g.arrived[h.step] != kNone) {
    ++engine.stats.malformed;
    return false;
  }
  return true;
}

void GeometryImpl::allgather_take(Arrival* a) {
  AllgatherState& g = allgather_;
  if (!g.result.ok() || !allgather_expects(a->header, a->origin, a->bytes)) {
    engine.discard(a);
    return;
  }
  const std::uint16_t s = a->header.step;
  switch (a->state) {
    case Arrival::State::ready:
      if (g.bytes != 0) std::memcpy(allgather_place(s), a->buffer.data, g.bytes);
      engine.release(a);
      g.arrived[s] = kDone;
      break;
    case Arrival::State::receiving:
      a->owner = &g;
      g.kept[s] = a;
      g.arrived[s] = kKept;
      ++g.streaming;
      break;
    case Arrival::State::deferred: {
      Status st = engine.context.accept(a->deferred, allgather_place(s),
                                        Engine::received_callback(g.tag(size + s)));
      engine.release(a);
      if (!st.ok()) {
        g.fail(st);
        break;
      }
      g.arrived[s] = kStreaming;
      ++g.streaming;
      break;
    }
  }
}

void GeometryImpl::allgather_data(const Header& h, std::uint32_t origin, const Incoming& in, Receive* recv) {
  AllgatherState& g = allgather_;
  if (!g.result.ok() || !allgather_expects(h, origin, in.total_bytes)) {
    allgather_progress();
    return;
  }
  const std::uint16_t s = h.step;
  if (recv == nullptr) {
    if (g.bytes != 0) std::memcpy(allgather_place(s), in.payload.data(), g.bytes);
    g.arrived[s] = kDone;
    allgather_progress();
    return;
  }
  recv->buffer = allgather_place(s);
  recv->done = Engine::received_callback(g.tag(size + s));
  g.arrived[s] = kStreaming;
  ++g.streaming;
}

void GeometryImpl::allgather_received(std::uint32_t index, Status s) {
  AllgatherState& g = allgather_;
  --g.streaming;
  if (s.ok())
    g.arrived[index - size] = kDone;
  else
    g.fail(s);
  allgather_progress();
}

void GeometryImpl::allgather_kept(Arrival& a) {
  AllgatherState& g = allgather_;
  const std::uint16_t s = a.header.step;
  --g.streaming;
  g.kept[s] = nullptr;
  if (a.status.ok()) {
    if (g.bytes != 0) std::memcpy(allgather_place(s), a.buffer.data, g.bytes);
    g.arrived[s] = kDone;
  } else {
    g.fail(a.status);
  }
  engine.release(&a);
  allgather_progress();
}

// Sends each step once the block it forwards is here; done when every
// block is in and every send complete.
void GeometryImpl::allgather_progress() {
  AllgatherState& g = allgather_;
  const std::uint32_t steps = size - 1;
  while (g.result.ok() && g.sent < steps && (g.sent == 0 || g.arrived[g.sent - 1] == kDone)) {
    const auto s = static_cast<std::uint16_t>(g.sent);
    const std::uint32_t block = topology::ring_block(rank, size, s);
    ++g.sent;
    if (!send(g, topology::ring_next(rank, size), s, {g.recv + std::size_t{block} * g.bytes, g.bytes}, s)) break;
  }
  if (g.sends_pending != 0 || g.streaming != 0) return;
  if (g.result.ok()) {
    if (g.sent != steps) return;
    for (std::uint8_t st : g.arrived)
      if (st != kDone) return;
  }
  for (Arrival*& a : g.kept)
    if (a != nullptr) {
      engine.discard(a);
      a = nullptr;
    }
  engine.finish(g);
}

}  // namespace ami::coll
