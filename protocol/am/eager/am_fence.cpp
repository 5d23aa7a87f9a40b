// protocol/am/eager/am_fence.cpp — the deterministic fence (docs/DESIGN.md, method 3).
//
// A fence is a request in the peer's work queue, so it goes out behind every
// operation posted to that peer before it. On a lane that delivers in order
// it is a packet: the target handles it after every earlier packet and the
// data of every earlier PUT (an RC send queue and a ring both place in
// order), runs its fence handler and answers with an ack at once (with the
// acks the dispatcher held for that origin: docs/DESIGN.md, method 4). An RDMA READ may
// be overtaken by a later SEND on RC, so the packet waits until the lane's
// transfer counter has passed the newest GET, and until every atomic sent as
// a packet has its reply. A lane that may reorder is
// flushed instead: the fence completes once its transfer counter passed
// everything injected before it, and once every atomic sent to the peer as
// a packet has its reply. No count of outstanding operations per peer is
// kept either way.
#include "am_engine.hpp"
#include "packet_build.hpp"

namespace ami::protocol {

Status AmEngine::fence(Endpoint dest, Callback done) {
  Peer* peer = peer_for(dest);
  if (peer == nullptr) return {StatusCode::invalid_argument, "fence: endpoint is out of range"};
  if (lane_for(*peer) == nullptr) return {StatusCode::unreachable, "fence: no backend reaches the endpoint"};
  if (!peer->failure.ok()) return {StatusCode::peer_failed, "fence: the endpoint's peer failed"};
  Request* r = acquire();
  if (r == nullptr) return {StatusCode::no_resource, "fence: every request (AMI_MAX_REQUESTS) is in use"};
  r->kind = Request::Kind::fence;
  r->local_done = done;
  r->local_pending = true;    // its packet's slot
  r->verdict_pending = true;  // the target's answer
  enqueue(*peer, *r);
  return Status::success();
}

Status AmEngine::fence_all(Callback done) {
  Request* parent = acquire();
  if (parent == nullptr) return {StatusCode::no_resource, "fence_all: every request (AMI_MAX_REQUESTS) is in use"};
  parent->kind = Request::Kind::fence;
  parent->local_done = done;
  parent->local_pending = true;  // until every child has answered
  parent->children = 1;          // held until every child is posted
  for (std::size_t i = 0; i < reached_.size(); ++i) {  // the peers with a lane
    ++parent->children;
    Status s = fence(reached_[i]->state->endpoint, Callback{&AmEngine::on_child_fence, parent});
    if (!s.ok()) {
      --parent->children;
      if (parent->failure.ok()) parent->failure = s;
    }
  }
  on_child_fence(parent, Status::success());  // the hold; runs nothing until advance()
  return Status::success();
}

void AmEngine::on_child_fence(void* cookie, Status s) {
  auto& parent = *static_cast<Request*>(cookie);
  if (!s.ok() && parent.failure.ok()) parent.failure = s;
  if (--parent.children != 0) return;
  parent.local_pending = false;
  parent.engine->ready_.push_back(&parent);  // done runs in advance(), never in the posting call
}

// Injects the fence packet once nothing before it can overtake it; false to
// wait (the fence then holds back the peer's later instructions too).
bool AmEngine::inject_fence(Peer& peer, Request& r) {
  device::Lane& lane = *peer.lane;
  const std::uint64_t passed = lane.fifo().counter().snapshot();
  if (!lane.ordered()) {
    // (An atomic sent as a packet is done when its reply is here.)
    if (passed < lane.fifo().injected() || peer.state->atomics.head != nullptr) return false;
    ++stats_.fences_by_flush;
    r.local_pending = false;
    r.verdict_pending = false;
    ready_.push_back(&r);
    return true;
  }
  if (passed < peer.state->last_get) return false;  // an earlier GET is still on its way back
  // An atomic sent as a packet may be done after later packets are handled
  // (on a NIC-domain region its owner's NIC does it: docs/DESIGN.md,
  // "Remote atomics"): the fence goes once every one has its reply.
  if (peer.state->atomics.head != nullptr) return false;
  device::Descriptor* d = lane.fifo().try_reserve();
  if (d == nullptr) return false;
  const std::uint64_t seq = expect_answer(peer, r);
  build_packet(*d, wire::make_header(wire::PacketType::fence, 0, r.id(), 0, seq, 0, 0, 0), {}, {});
  lane.fifo().commit(Callback{&AmEngine::on_send_local, &r});
  ++stats_.fences_by_message;
  ++stats_.packets_sent;
  return true;
}

// Target: every earlier packet and PUT from peer is handled and placed.
void AmEngine::on_fence(Peer& peer, const wire::PacketView& v) {
  ++stats_.fences_answered;
  if (fence_handler_.fn != nullptr) fence_handler_.fn(fence_handler_.cookie, peer.state->endpoint);
  ack(peer, v.header.offset, 0, false, /*urgent*/ true);
}

}  // namespace ami::protocol
