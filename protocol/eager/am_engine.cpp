// protocol/eager/am_engine.cpp — setup, the send side and the work queue.
#include "protocol/eager/am_engine.hpp"

#include <algorithm>
#include <cstring>

namespace ami::protocol {

namespace {

constexpr std::size_t kWireHeader = sizeof(wire::PacketHeader);
constexpr std::size_t kShortHeader = wire::kShortHeaderBytes;

// Completes d as a packet whose n header bytes are already inline: the
// payload goes inline too when it fits (so the caller's buffer is free at
// once), and is referenced otherwise.
void finish_packet(device::Descriptor& d, std::size_t n, std::span<const std::byte> payload) {
  d.kind = device::DescriptorKind::packet;
  device::PacketDescriptor& p = d.packet;
  if (n + payload.size() <= device::kPacketInlineBytes) {
    if (!payload.empty()) std::memcpy(p.inline_data + n, payload.data(), payload.size());
    n += payload.size();
    p.payload = nullptr;
    p.payload_len = 0;
  } else {
    p.payload = payload.data();
    p.payload_len = static_cast<std::uint32_t>(payload.size());
  }
  p.inline_len = static_cast<std::uint16_t>(n);
}

void build_packet(device::Descriptor& d, const wire::PacketHeader& h,
                  std::span<const std::byte> user_header, std::span<const std::byte> payload) {
  finish_packet(d, wire::encode(h, user_header, d.packet.inline_data), payload);
}

// A whole message that wants no answer: the short header.
void build_short(device::Descriptor& d, std::uint16_t dispatch, std::span<const std::byte> user_header,
                 std::span<const std::byte> payload) {
  const auto n = static_cast<std::uint32_t>(payload.size());
  finish_packet(d, wire::encode_short(dispatch, n, user_header, d.packet.inline_data), payload);
}

}  // namespace

AmEngine::AmEngine(Shape shape, ContextStats& stats)
    : shape_(shape), stats_(stats), pool_(shape.max_requests) {
  peers_.resize(std::size_t{shape.tasks} * shape.contexts);
  for (std::uint32_t t = 0; t < shape.tasks; ++t)
    for (std::uint16_t c = 0; c < shape.contexts; ++c) {
      Peer& p = peers_[std::size_t{t} * shape.contexts + c];
      p.endpoint = Endpoint{t, c};
      p.answers.reserve(shape.max_requests);
    }
  busy_.reserve(peers_.size());
  lanes_.reserve(peers_.size());
}

Status AmEngine::set_dispatch(std::uint16_t id, Dispatch dispatch) {
  if (id >= kMaxDispatch)
    return {StatusCode::invalid_argument, "set_dispatch: id is not below kMaxDispatch (256)"};
  dispatch_[id] = dispatch;
  return Status::success();
}

AmEngine::Peer* AmEngine::peer_for(Endpoint e) {
  if (e.task >= shape_.tasks || e.context >= shape_.contexts) return nullptr;
  return &peers_[std::size_t{e.task} * shape_.contexts + e.context];
}

device::Lane* AmEngine::lane_for(Peer& peer) {
  if (peer.lane != nullptr) return peer.lane;
  for (device::Device* d : devices_) {
    if (!d->can_reach(peer.endpoint)) continue;
    peer.lane = d->lane(peer.endpoint);
    if (peer.lane == nullptr) return nullptr;
    peer.device = d;
    lanes_.push_back(peer.lane);
    return peer.lane;
  }
  return nullptr;
}

std::size_t AmEngine::immediate_limit(Endpoint dest) {
  Peer* peer = peer_for(dest);
  device::Lane* lane = peer ? lane_for(*peer) : nullptr;
  if (lane == nullptr) return 0;
  return std::min(lane->max_packet(), device::kPacketInlineBytes) - kShortHeader;
}

std::string_view AmEngine::backend_for(Endpoint dest) {
  Peer* peer = peer_for(dest);
  return (peer && lane_for(*peer)) ? peer->device->name() : std::string_view{};
}

Status AmEngine::check_send(const SendParams& p) const {
  if (p.dest.task >= shape_.tasks)
    return {StatusCode::invalid_argument, "send: endpoint task is out of range"};
  if (p.dest.context >= shape_.contexts)
    return {StatusCode::invalid_argument, "send: endpoint context is out of range"};
  if (p.dispatch >= kMaxDispatch)
    return {StatusCode::invalid_argument, "send: dispatch id is not below kMaxDispatch (256)"};
  if (p.header.size() > wire::kMaxUserHeader)
    return {StatusCode::invalid_argument, "send: header is longer than kMaxHeaderBytes (128)"};
  if (p.header.data() == nullptr && !p.header.empty())
    return {StatusCode::invalid_argument, "send: header is null but its length is not zero"};
  if (p.payload.data() == nullptr && !p.payload.empty())
    return {StatusCode::invalid_argument, "send: payload is null but its length is not zero"};
  return Status::success();
}

Status AmEngine::send_immediate(const SendImmediateParams& p) {
  Status s = check_send(SendParams{p.dest, p.dispatch, p.header, p.payload, {}, {}});
  if (!s.ok()) return s;
  Peer& peer = *peer_for(p.dest);
  device::Lane* lane = lane_for(peer);
  if (lane == nullptr) return {StatusCode::unreachable, "send_immediate: no backend reaches the endpoint"};
  if (p.header.size() + p.payload.size() > immediate_limit(p.dest))
    return {StatusCode::invalid_argument, "send_immediate: header + payload exceed immediate_limit()"};
  if (peer.head != nullptr)
    return {StatusCode::no_resource, "send_immediate: earlier instructions to the endpoint are queued"};
  device::Descriptor* d = lane->fifo().try_reserve();
  if (d == nullptr) return {StatusCode::no_resource, "send_immediate: injection FIFO is full"};
  const auto n = static_cast<std::uint32_t>(p.payload.size());
  build_short(*d, p.dispatch, p.header, p.payload);
  lane->fifo().commit();
  lane->ring();
  ++stats_.messages_sent;
  ++stats_.packets_sent;
  stats_.bytes_sent += n;
  return Status::success();
}

Status AmEngine::send(const SendParams& p) {
  Status s = check_send(p);
  if (!s.ok()) return s;
  Peer& peer = *peer_for(p.dest);
  device::Lane* lane = lane_for(peer);
  if (lane == nullptr) return {StatusCode::unreachable, "send: no backend reaches the endpoint"};

  const bool one_packet = kShortHeader + p.header.size() + p.payload.size() <= lane->max_packet();
  if (one_packet && !p.remote_done && peer.head == nullptr) {
    // Fast path: no request at all; the user's callback is listed directly.
    if (device::Descriptor* d = lane->fifo().try_reserve()) {
      const auto n = static_cast<std::uint32_t>(p.payload.size());
      build_short(*d, p.dispatch, p.header, p.payload);
      lane->fifo().commit(p.local_done);
      lane->ring();
      ++stats_.messages_sent;
      ++stats_.packets_sent;
      stats_.bytes_sent += n;
      return Status::success();
    }
  }
  Request* r = acquire();
  if (r == nullptr) return {StatusCode::no_resource, "send: every request (AMI_MAX_REQUESTS) is in use"};
  r->kind = Request::Kind::send;
  r->dispatch = p.dispatch;
  r->header_len = static_cast<std::uint16_t>(p.header.size());
  if (!p.header.empty()) std::memcpy(r->header.data(), p.header.data(), p.header.size());
  r->payload = p.payload.data();
  r->total = p.payload.size();
  r->local_done = p.local_done;
  r->remote_done = p.remote_done;
  r->flags = p.remote_done ? wire::kWantsRemoteDone : 0;
  r->local_pending = true;
  r->remote_pending = static_cast<bool>(p.remote_done);
  enqueue(peer, *r);
  ++stats_.messages_sent;
  return Status::success();
}

Status AmEngine::rdma(device::DescriptorKind kind, const RdmaParams& p, std::byte* local,
                      std::uint32_t local_key) {
  const char* unreachable = kind == device::DescriptorKind::put
                                ? "put: no backend reaches the endpoint"
                                : "get: no backend reaches the endpoint";
  Peer* peer = peer_for(p.dest);
  if (peer == nullptr) return {StatusCode::invalid_argument, "rdma: endpoint is out of range"};
  if (lane_for(*peer) == nullptr) return {StatusCode::unreachable, unreachable};
  Request* r = acquire();
  if (r == nullptr) return {StatusCode::no_resource, "rdma: every request (AMI_MAX_REQUESTS) is in use"};
  r->kind = Request::Kind::rdma;
  r->rdma_kind = kind;
  r->rdma = device::RdmaDescriptor{.local = local, .length = p.bytes, .local_key = local_key,
                                   .remote_address = p.remote.address + p.remote_offset,
                                   .remote = p.remote};
  r->local_done = p.local_done;
  r->local_pending = true;
  enqueue(*peer, *r);
  ++(kind == device::DescriptorKind::put ? stats_.puts : stats_.gets);
  return Status::success();
}

Request* AmEngine::acquire() {
  Request* r = pool_.acquire();
  if (r != nullptr) r->engine = this;
  return r;
}

void AmEngine::mark_busy(Peer& peer) {
  if (peer.busy) return;
  peer.busy = true;
  busy_.push_back(&peer);
}

// Appends r to the peer's work queue and starts it at once when it is first.
void AmEngine::enqueue(Peer& peer, Request& r) {
  r.peer = static_cast<std::uint32_t>(&peer - peers_.data());
  r.next = nullptr;
  const bool first = peer.head == nullptr;
  if (first) peer.head = &r; else peer.tail->next = &r;
  peer.tail = &r;
  if (first) service(peer);
  if (peer.head != nullptr) {
    ++stats_.queued;
    mark_busy(peer);
  }
}

// Injects as many packets of r as the FIFO takes; true when all are out.
bool AmEngine::inject_send(Peer& peer, Request& r) {
  device::Lane& lane = *peer.lane;
  while (!r.started || r.sent < r.total) {
    device::Descriptor* d = lane.fifo().try_reserve();
    if (d == nullptr) return false;
    const std::size_t hdr = r.started ? 0 : r.header_len;
    const std::uint64_t room = lane.max_packet() - kWireHeader - hdr;
    const auto n = static_cast<std::uint32_t>(std::min<std::uint64_t>(room, r.total - r.sent));
    const auto type = r.started ? wire::PacketType::am_more : wire::PacketType::am_first;
    build_packet(*d, wire::make_header(type, r.dispatch, r.id(), r.total, r.sent, n,
                                       static_cast<std::uint16_t>(hdr), r.flags),
                 {r.header.data(), hdr}, {r.payload + r.sent, n});
    r.started = true;
    r.sent += n;
    stats_.bytes_sent += n;
    ++stats_.packets_sent;
    const bool last = r.sent == r.total;
    lane.fifo().commit(last ? Callback{&AmEngine::on_send_local, &r} : Callback{});
  }
  return true;
}

bool AmEngine::inject_rdma(Peer& peer, Request& r) {
  device::Descriptor* d = peer.lane->fifo().try_reserve();
  if (d == nullptr) return false;
  d->kind = r.rdma_kind;
  d->rdma = r.rdma;
  peer.lane->fifo().commit(Callback{&AmEngine::on_send_local, &r});
  return true;
}

bool AmEngine::inject_answer(Peer& peer, const Answer& a) {
  device::Descriptor* d = peer.lane->fifo().try_reserve();
  if (d == nullptr) return false;
  build_packet(*d, wire::make_header(wire::PacketType::remote_done, 0, a.message_id, 0, 0, 0, 0, a.flags),
               {}, {});
  peer.lane->fifo().commit();
  ++stats_.remote_done_sent;
  return true;
}

// Moves the peer's waiting answers and instructions into its FIFO, in order.
std::size_t AmEngine::service(Peer& peer) {
  std::size_t work = 0;
  std::size_t sent_answers = 0;
  while (sent_answers < peer.answers.size() && inject_answer(peer, peer.answers[sent_answers]))
    ++sent_answers;
  peer.answers.erase(peer.answers.begin(), peer.answers.begin() + static_cast<std::ptrdiff_t>(sent_answers));
  work += sent_answers;
  while (Request* r = peer.head) {
    const bool done = r->kind == Request::Kind::send ? inject_send(peer, *r) : inject_rdma(peer, *r);
    if (!done) break;
    peer.head = r->next;
    if (peer.head == nullptr) peer.tail = nullptr;
    ++work;
  }
  if (work != 0) peer.lane->ring();
  return work;
}

void AmEngine::on_send_local(void* cookie, Status s) {
  auto& r = *static_cast<Request*>(cookie);
  r.local_pending = false;
  if (r.local_done) r.local_done(s);
  if (!s.ok() && r.remote_pending) {
    r.remote_pending = false;  // the message may never have arrived
    r.remote_done(s);
  }
  r.engine->finish(r);
}

// Releases r once neither its local nor its remote completion is awaited.
void AmEngine::finish(Request& r) {
  if (!r.local_pending && !r.remote_pending) pool_.release(r);
}

}  // namespace ami::protocol
