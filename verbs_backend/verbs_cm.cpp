// verbs_backend/verbs_cm.cpp — connecting lanes through librdmacm on first
// use (see header): the domain's share, and the context's side, driven by
// VerbsDevice::progress().
#include "verbs_cm.hpp"

#include <arpa/inet.h>
#include <fcntl.h>

#include <algorithm>
#include <cstring>

#include "ami/device/byte_io.hpp"
#include "ami/device/coarse_clock.hpp"
#include "ami/error.hpp"
#include "verbs_device.hpp"
#include "verbs_port.hpp"
#include "verbs_qp.hpp"

namespace ami::verbs {

using ami::detail::load;
using ami::detail::store;

namespace {

constexpr int kResolveTimeoutMs = 2000;
constexpr int kBacklog = 128;
// An idle context reads its channel at most this often (it is a system
// call); the coarse clock's tick may make it rarer.
constexpr std::int64_t kIdlePollNs = 1'000'000;

constexpr Status kRefused{StatusCode::peer_failed, "verbs: rdma_cm: the peer refused the connection (see the log)"};
constexpr Status kCmFailed{StatusCode::peer_failed, "verbs: rdma_cm: connecting the lane failed (see the log)"};
constexpr Status kTransition{StatusCode::device_error, "verbs: connecting the queue pair failed (see the log)"};

// The reason a connection manager gives for a rejection by rdma_reject()
// (IB_CM_REJ_CONSUMER_DEFINED).
constexpr int kConsumerReject = 28;

// An id's context: the lane index + 1 of its connection; nullptr for a
// listener or a retired id, whose events are only acknowledged.
void* tag_of(std::size_t index) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(index) + 1); }

}  // namespace

// magic u32, task u32, context u16, peer context u16, nonce u64.
void CmHello::encode(std::span<std::byte, kBytes> out) const {
  std::byte* p = out.data();
  store(p, kMagic);
  store(p, task);
  store(p, context);
  store(p, peer_context);
  store(p, nonce);
}

std::optional<CmHello> CmHello::decode(const void* data, std::size_t length) {
  // (The private data of a request arrives padded to the CM's own size.)
  if (data == nullptr || length < kBytes) return std::nullopt;
  const auto* p = static_cast<const std::byte*>(data);
  if (load<std::uint32_t>(p) != kMagic) return std::nullopt;
  CmHello h;
  h.task = load<std::uint32_t>(p);
  h.context = load<std::uint16_t>(p);
  h.peer_context = load<std::uint16_t>(p);
  h.nonce = load<std::uint64_t>(p);
  return h;
}

CmConnector::CmConnector(VerbsDomain& domain) : domain_(domain) {
  const PortInfo& port = domain.port();
  if (port.link_layer != IBV_LINK_LAYER_ETHERNET)
    throw Error("verbs: rdma_cm needs an IP address on the port; on InfiniBand use the address exchange");
  if (gid_is_ipv4(port.gid)) {
    ip_family_ = 4;
    std::memcpy(ip_.data(), port.gid.raw + 12, 4);
  } else if (!gid_is_link_local(port.gid)) {
    ip_family_ = 6;
    std::memcpy(ip_.data(), port.gid.raw, 16);
  } else {
    throw Error("verbs: rdma_cm: GID " + gid_text(port.gid) + " holds no routable IP address");
  }
}

bool CmConnector::fill_sockaddr(sockaddr_storage& out, std::uint8_t family,
                                const std::array<std::uint8_t, 16>& ip, std::uint16_t port) const {
  out = {};
  if (family == 4) {
    auto* in = reinterpret_cast<sockaddr_in*>(&out);
    in->sin_family = AF_INET;
    in->sin_port = htons(port);
    std::memcpy(&in->sin_addr, ip.data(), 4);
    return true;
  }
  if (family == 6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&out);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(port);
    std::memcpy(&in6->sin6_addr, ip.data(), 16);
    return true;
  }
  return false;
}

void CmConnector::listen(ContextQueues& q) const {
  q.cm_channel.reset(require(rdma_create_event_channel(), "rdma_create_event_channel"));
  const int flags = ::fcntl(q.cm_channel->fd, F_GETFL);
  if (flags < 0 || ::fcntl(q.cm_channel->fd, F_SETFL, flags | O_NONBLOCK) < 0)
    throw Error("fcntl O_NONBLOCK", errno);
  rdma_cm_id* id = nullptr;
  require(rdma_create_id(q.cm_channel.get(), &id, nullptr, RDMA_PS_TCP), "rdma_create_id");
  q.cm_listener.reset(id);
  sockaddr_storage sa{};
  fill_sockaddr(sa, ip_family_, ip_, 0);
  const PortInfo& port = domain_.port();
  require(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&sa)), "rdma_bind_addr " + gid_text(port.gid));
  if (id->verbs == nullptr || port.device != ibv_get_device_name(id->verbs->device))
    throw Error("verbs: rdma_cm maps " + gid_text(port.gid) + " to another device than " + port.device);
  require(rdma_listen(id, kBacklog), "rdma_listen");
  q.cm_port = ntohs(rdma_get_src_port(id));
}

int CmConnector::start(ContextQueues& q, CmIdOwner& owner, void* tag, const std::array<std::uint8_t, 16>& gid,
                       std::uint16_t port) const {
  ibv_gid g{};
  std::memcpy(g.raw, gid.data(), gid.size());
  std::array<std::uint8_t, 16> ip{};
  std::uint8_t family = 6;
  if (gid_is_ipv4(g)) {
    family = 4;
    std::memcpy(ip.data(), gid.data() + 12, 4);
  } else {
    ip = gid;
  }
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(q.cm_channel.get(), &id, tag, RDMA_PS_TCP) != 0) return errno;
  owner.reset(id);
  sockaddr_storage src{}, dst{};
  fill_sockaddr(src, ip_family_, ip_, 0);
  fill_sockaddr(dst, family, ip, port);
  if (rdma_resolve_addr(id, reinterpret_cast<sockaddr*>(&src), reinterpret_cast<sockaddr*>(&dst),
                        kResolveTimeoutMs) != 0)
    return errno;
  return 0;
}

rdma_conn_param CmConnector::conn_param(ibv_qp* qp) const {
  rdma_conn_param p{};
  p.responder_resources = domain_.port().responder_rd_atomic;
  p.initiator_depth = domain_.port().initiator_rd_atomic;
  p.retry_count = std::min<std::uint8_t>(domain_.options().retry_count, 7);
  p.rnr_retry_count = std::min<std::uint8_t>(domain_.options().rnr_retry, 7);
  p.srq = 1;
  p.qp_num = qp->qp_num;
  return p;
}

// ---- the context's side ---------------------------------------------------

// A fresh queue pair for a lane whose request was refused or crossed, and
// the lane (made with the old one, nothing posted yet) told; false (the
// lane failed) when it cannot be made.
bool VerbsDevice::renew(Connection& c, Endpoint peer) {
  try {
    domain_.renew_queue_pair(c, context_, peer);
  } catch (const std::exception& ex) {
    log("rdma_cm: no new queue pair for the lane to task %u context %u: %s", peer.task, peer.context, ex.what());
    connection_failed(c, peer, kTransition);
    return false;
  }
  if (VerbsLane* lane = lanes_[domain_.lane_index(peer)].get()) lane->qp_ = c.qp.get();
  return true;
}

// The QP to RTR and RTS with what the connection manager negotiated; 0 or
// an errno value.
int VerbsDevice::up_from_cm(ibv_qp* qp, rdma_cm_id* id) const {
  if (int err = qp_to_state_from_cm(qp, id, IBV_QPS_RTR, domain_.port(), domain_.options())) return err;
  return qp_to_state_from_cm(qp, id, IBV_QPS_RTS, domain_.port(), domain_.options());
}

// Active: the id resolves the peer context's address now; its events take
// it on (on_cm_event).
void VerbsDevice::cm_request(Connection& c, Endpoint peer) {
  const std::size_t index = domain_.lane_index(peer);
  if (int err = domain_.cm().start(queues_, c.cm_id, tag_of(index), domain_.peer(peer.task).gid,
                                   domain_.peer_cm_port(peer))) {
    log("rdma_cm: lane from context %u to task %u context %u: rdma_resolve_addr: %s", context_, peer.task,
        peer.context, std::strerror(err));
    return connection_failed(c, peer, kCmFailed);
  }
  ++counters_.handshakes_sent;
}

std::size_t VerbsDevice::poll_cm() {
  const std::int64_t now = device::coarse_now_ns();
  if (handshakes_ == 0 && now < next_cm_poll_ns_) return 0;
  next_cm_poll_ns_ = now + kIdlePollNs;
  std::size_t work = 0;
  rdma_cm_event* e = nullptr;
  while (rdma_get_cm_event(queues_.cm_channel.get(), &e) == 0) {
    // An id to destroy goes after the event is acknowledged (rdma_destroy_id
    // waits for that).
    CmIdOwner doomed = on_cm_event(*e);
    rdma_ack_cm_event(e);
    ++work;
  }
  return work;
}

CmIdOwner VerbsDevice::on_cm_event(rdma_cm_event& e) {
  if (e.event == RDMA_CM_EVENT_CONNECT_REQUEST) return on_cm_request(e);
  const auto tag = reinterpret_cast<std::uintptr_t>(e.id->context);
  if (tag == 0) return {};  // the listener's, or a retired id's
  const std::size_t index = tag - 1;
  const Endpoint peer{static_cast<std::uint32_t>(index / domain_.contexts()),
                      static_cast<std::uint16_t>(index % domain_.contexts())};
  Connection* c = connection(index);
  if (c == nullptr || c->cm_id.get() != e.id) return {};
  const bool waiting = c->state == Connection::State::requesting || c->state == Connection::State::accepted;
  switch (e.event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      if (rdma_resolve_route(e.id, kResolveTimeoutMs) != 0) {
        log("rdma_cm: lane to task %u context %u: rdma_resolve_route: %s", peer.task, peer.context,
            std::strerror(errno));
        connection_failed(*c, peer, kCmFailed);
      }
      break;
    case RDMA_CM_EVENT_ROUTE_RESOLVED: {
      std::array<std::byte, CmHello::kBytes> hello;
      CmHello{domain_.task(), context_, peer.context, domain_.nonce()}.encode(hello);
      rdma_conn_param param = domain_.cm().conn_param(c->qp.get());
      param.private_data = hello.data();
      param.private_data_len = static_cast<std::uint8_t>(hello.size());
      if (rdma_connect(e.id, &param) != 0) {
        log("rdma_cm: lane to task %u context %u: rdma_connect: %s", peer.task, peer.context, std::strerror(errno));
        connection_failed(*c, peer, kCmFailed);
      }
      break;
    }
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
      if (!c->active || c->state != Connection::State::requesting) break;
      if (int err = up_from_cm(c->qp.get(), e.id)) {
        log_qp(c->qp.get(), "ibv_modify_qp (rdma_cm reply)", err);
        connection_failed(*c, peer, kTransition);
      } else if (rdma_establish(e.id) != 0) {
        log("rdma_cm: lane to task %u context %u: rdma_establish: %s", peer.task, peer.context, std::strerror(errno));
        connection_failed(*c, peer, kCmFailed);
      } else {
        connection_ready(*c, peer);
      }
      break;
    case RDMA_CM_EVENT_ESTABLISHED:
      if (!c->active && c->state == Connection::State::accepted) connection_ready(*c, peer);
      break;
    case RDMA_CM_EVENT_REJECTED:
      // A lower task refuses our request when it is asking us at the same
      // time: its request stands, and this side waits for it. (Refused by
      // its program, that is: a port nobody listens on any more, a task
      // gone, is refused by the connection manager with another reason.)
      if (c->active && c->state == Connection::State::requesting && peer.task < domain_.task() &&
          e.status == kConsumerReject) {
        c->active = false;
        e.id->context = nullptr;
        CmIdOwner retired = std::move(c->cm_id);
        (void)renew(*c, peer);
        return retired;
      }
      if (waiting) {
        log("rdma_cm: lane from context %u to task %u context %u: the peer rejected the connection (reason %d)",
            context_, peer.task, peer.context, e.status);
        connection_failed(*c, peer, kRefused);
      }
      break;
    case RDMA_CM_EVENT_DISCONNECTED:
    case RDMA_CM_EVENT_TIMEWAIT_EXIT:
      break;  // a lane that breaks says so through its queue pair
    default:
      if (waiting) {
        log("rdma_cm: lane from context %u to task %u context %u: %s (status %d)", context_, peer.task,
            peer.context, rdma_event_str(e.event), e.status);
        connection_failed(*c, peer, kCmFailed);
      }
      break;
  }
  return {};
}

// Passive: a request names its lane. It is checked against the sender's
// published address (fetched now if this task has not learnt it), and
// answered with a queue pair at RTS.
CmIdOwner VerbsDevice::on_cm_request(rdma_cm_event& e) {
  CmIdOwner id(e.id);
  const std::optional<CmHello> h = CmHello::decode(e.param.conn.private_data, e.param.conn.private_data_len);
  if (!h || h->task >= domain_.tasks() || h->task == domain_.task() || h->context >= domain_.contexts() ||
      h->peer_context != context_ || !domain_.learn_on_demand(h->task) || h->nonce != domain_.peer(h->task).nonce) {
    log("rdma_cm: context %u refused a connection request that is not from a task of this job for it", context_);
    ++counters_.handshakes_dropped;
    rdma_reject(id.get(), nullptr, 0);
    return id;
  }
  ++counters_.handshakes_received;
  const Endpoint peer{h->task, h->context};
  const std::size_t index = domain_.lane_index(peer);
  Connection* c = connection(index);
  if (c == nullptr) {
    try {
      c = &domain_.new_connection(context_, peer, false);
    } catch (const std::exception& ex) {
      log("rdma_cm: no queue pair for a request from task %u context %u: %s", peer.task, peer.context, ex.what());
      rdma_reject(id.get(), nullptr, 0);
      return id;
    }
    ++handshakes_;
    c->give_up_ns = device::coarse_now_ns() + std::int64_t{domain_.options().connect_timeout_ms} * 1'000'000;
    c->next_try_ns = c->give_up_ns;
    next_handshake_ns_ = std::min(next_handshake_ns_, c->give_up_ns);
  } else if (c->state != Connection::State::requesting || (c->active && domain_.task() < peer.task)) {
    // Both asked and this side's request stands, or the lane is connected
    // (or failed) already: refused.
    if (c->state != Connection::State::requesting)
      log("rdma_cm: context %u refused a request from task %u context %u: the lane is %s already", context_,
          peer.task, peer.context, c->state == Connection::State::failed ? "failed" : "connected");
    rdma_reject(id.get(), nullptr, 0);
    return id;
  } else if (c->active) {
    // Both asked and the peer's request stands: this side's own id retires,
    // and so does its queue pair, whose number the peer's connection
    // manager saw in the request it refused.
    c->active = false;
    if (c->cm_id) {
      c->cm_id->context = nullptr;
      queues_.cm_retired.push_back(std::move(c->cm_id));
    }
    if (!renew(*c, peer)) {
      rdma_reject(id.get(), nullptr, 0);
      return id;
    }
  }
  ibv_qp* qp = c->qp.get();
  if (int err = up_from_cm(qp, id.get())) {
    log_qp(qp, "ibv_modify_qp (rdma_cm request)", err);
    rdma_reject(id.get(), nullptr, 0);
    connection_failed(*c, peer, kTransition);
    return id;
  }
  rdma_conn_param param = domain_.cm().conn_param(qp);
  param.responder_resources = std::min(param.responder_resources, e.param.conn.initiator_depth);
  param.initiator_depth = std::min(param.initiator_depth, e.param.conn.responder_resources);
  id->context = tag_of(index);
  if (rdma_accept(id.get(), &param) != 0) {
    log("rdma_cm: accepting task %u context %u: rdma_accept: %s", peer.task, peer.context, std::strerror(errno));
    connection_failed(*c, peer, kCmFailed);
    id->context = nullptr;
    return id;
  }
  c->cm_id = std::move(id);
  c->state = Connection::State::accepted;
  return {};
}

}  // namespace ami::verbs
