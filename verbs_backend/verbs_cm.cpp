// verbs_backend/verbs_cm.cpp — lane connection through librdmacm (see header).
#include "verbs_cm.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "ami/error.hpp"
#include "ami/device/byte_io.hpp"
#include "verbs_port.hpp"
#include "verbs_qp.hpp"

namespace ami::verbs {

namespace {

constexpr int kResolveTimeoutMs = 2000;
constexpr int kBacklog = 128;

}  // namespace

const char* CmConnector::name(State s) {
  switch (s) {
    case State::awaiting_request:
      return "awaiting_request";
    case State::resolving_address:
      return "resolving_address";
    case State::resolving_route:
      return "resolving_route";
    case State::connecting:
      return "connecting";
    case State::accepting:
      return "accepting";
    case State::established:
      return "established";
    case State::failed:
      return "failed";
  }
  return "?";
}

CmConnector::CmConnector(VerbsDomain& domain) : domain_(domain) {
  const PortInfo& port = domain.port();
  if (port.link_layer != IBV_LINK_LAYER_ETHERNET)
    throw Error("verbs: rdma_cm needs an IP address on the port; on InfiniBand use the address exchange");
  const bool link_local = port.gid.raw[0] == 0xfe && (port.gid.raw[1] & 0xc0) == 0x80;
  if (gid_is_ipv4(port.gid)) {
    ip_family_ = 4;
    std::memcpy(ip_.data(), port.gid.raw + 12, 4);
  } else if (!link_local) {
    ip_family_ = 6;
    std::memcpy(ip_.data(), port.gid.raw, 16);
  } else {
    throw Error("verbs: rdma_cm: GID " + gid_text(port.gid) + " holds no routable IP address");
  }
  nonce_ = (std::uint64_t{std::random_device{}()} << 32) | std::random_device{}();

  channel_.reset(require(rdma_create_event_channel(), "rdma_create_event_channel"));
  const int flags = ::fcntl(channel_->fd, F_GETFL);
  if (flags < 0 || ::fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK) < 0)
    throw Error("fcntl O_NONBLOCK", errno);
  rdma_cm_id* id = nullptr;
  require(rdma_create_id(channel_.get(), &id, nullptr, RDMA_PS_TCP), "rdma_create_id");
  listener_.reset(id);
  sockaddr_storage sa{};
  fill_sockaddr(sa, ip_family_, ip_, 0);
  require(rdma_bind_addr(listener_.get(), reinterpret_cast<sockaddr*>(&sa)),
          "rdma_bind_addr " + gid_text(port.gid));
  if (listener_->verbs == nullptr || port.device != ibv_get_device_name(listener_->verbs->device))
    throw Error("verbs: rdma_cm maps " + gid_text(port.gid) + " to another device than " + port.device);
  require(rdma_listen(listener_.get(), kBacklog), "rdma_listen");
  port_ = ntohs(rdma_get_src_port(listener_.get()));
}

CmConnector::~CmConnector() = default;

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

ibv_qp* CmConnector::qp_for(std::uint16_t context, std::uint32_t peer, std::uint16_t peer_context) const {
  return domain_.qp(context, Endpoint{peer, peer_context});
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

void CmConnector::fail(Session& s, Connection& c, const char* what, int err) {
  log("rdma_cm: lane %u.%u -> task %u context %u (QP 0x%06x): %s in state %s: %s", domain_.task(), c.context,
      s.peer, c.peer_context, qp_for(c.context, s.peer, c.peer_context)->qp_num, what, name(c.state),
      err != 0 ? std::strerror(err) : "refused");
  c.state = State::failed;
  if (s.failure == nullptr) s.failure = "verbs: rdma_cm: a lane to the peer failed to connect (see the log)";
}

// Active side, one transition per event: resolve the address, the route,
// connect, then bring the QP up when the reply comes and establish.
void CmConnector::start_active(Session& s, Connection& c) {
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(channel_.get(), &id, &c, RDMA_PS_TCP) != 0) return fail(s, c, "rdma_create_id", errno);
  c.id.reset(id);
  sockaddr_storage src{}, dst{};
  fill_sockaddr(src, ip_family_, ip_, 0);
  fill_sockaddr(dst, s.address.ip_family, s.address.ip, s.address.cm_port);
  c.state = State::resolving_address;
  if (rdma_resolve_addr(id, reinterpret_cast<sockaddr*>(&src), reinterpret_cast<sockaddr*>(&dst),
                        kResolveTimeoutMs) != 0)
    fail(s, c, "rdma_resolve_addr", errno);
}

void CmConnector::on_address_resolved(Session& s, Connection& c) {
  c.state = State::resolving_route;
  if (rdma_resolve_route(c.id.get(), kResolveTimeoutMs) != 0) fail(s, c, "rdma_resolve_route", errno);
}

void CmConnector::on_route_resolved(Session& s, Connection& c) {
  std::array<std::byte, Hello::kBytes> hello;
  std::byte* p = hello.data();
  ami::detail::store(p, Hello::kMagic);
  ami::detail::store(p, domain_.task());
  ami::detail::store(p, c.context);
  ami::detail::store(p, c.peer_context);
  ami::detail::store(p, nonce_);
  rdma_conn_param param = conn_param(qp_for(c.context, s.peer, c.peer_context));
  param.private_data = hello.data();
  param.private_data_len = static_cast<std::uint8_t>(hello.size());
  c.state = State::connecting;
  if (rdma_connect(c.id.get(), &param) != 0) fail(s, c, "rdma_connect", errno);
}

void CmConnector::on_connect_response(Session& s, Connection& c) {
  ibv_qp* qp = qp_for(c.context, s.peer, c.peer_context);
  if (int err = qp_to_state_from_cm(qp, c.id.get(), IBV_QPS_RTR, domain_.port(), domain_.options()))
    return fail(s, c, "ibv_modify_qp to RTR", err);
  if (int err = qp_to_state_from_cm(qp, c.id.get(), IBV_QPS_RTS, domain_.port(), domain_.options()))
    return fail(s, c, "ibv_modify_qp to RTS", err);
  if (rdma_establish(c.id.get()) != 0) return fail(s, c, "rdma_establish", errno);
  c.state = State::established;
}

void CmConnector::on_established(Connection& c) { c.state = State::established; }

// Passive side: a request names its lane; it waits until connect() for its
// task has the published nonce to check it against.
CmIdOwner CmConnector::on_request(Session* s, rdma_cm_event& e) {
  CmIdOwner id(e.id);
  const rdma_conn_param& in = e.param.conn;
  Request r{std::move(id), {}, in.initiator_depth, in.responder_resources};
  const auto* p = static_cast<const std::byte*>(in.private_data);
  if (p == nullptr || in.private_data_len < Hello::kBytes ||
      ami::detail::load<std::uint32_t>(p) != Hello::kMagic) {
    log("rdma_cm: refused a connection request that is not from an ami task");
    rdma_reject(r.id.get(), nullptr, 0);
    return std::move(r.id);
  }
  r.hello.task = ami::detail::load<std::uint32_t>(p);
  r.hello.context = ami::detail::load<std::uint16_t>(p);
  r.hello.peer_context = ami::detail::load<std::uint16_t>(p);
  r.hello.nonce = ami::detail::load<std::uint64_t>(p);
  if (r.hello.task >= domain_.tasks() || r.hello.task == domain_.task() || domain_.knows(r.hello.task) ||
      r.hello.context >= domain_.contexts() || r.hello.peer_context >= domain_.contexts()) {
    log("rdma_cm: refused a connection request naming task %u contexts %u -> %u", r.hello.task,
        r.hello.context, r.hello.peer_context);
    rdma_reject(r.id.get(), nullptr, 0);
    return std::move(r.id);
  }
  if (s != nullptr && s->peer == r.hello.task) return accept(*s, std::move(r));
  waiting_.push_back(std::move(r));
  return {};
}

CmIdOwner CmConnector::accept(Session& s, Request r) {
  Connection& c = s.lanes[std::size_t{r.hello.peer_context} * domain_.contexts() + r.hello.context];
  if (r.hello.nonce != s.address.nonce || c.state != State::awaiting_request) {
    log("rdma_cm: refused a request from task %u (%s)", s.peer,
        r.hello.nonce != s.address.nonce ? "nonce differs from its published address"
                                         : "lane requested twice");
    rdma_reject(r.id.get(), nullptr, 0);
    return std::move(r.id);
  }
  c.id = std::move(r.id);
  c.id->context = &c;
  ibv_qp* qp = qp_for(c.context, s.peer, c.peer_context);
  if (int err = qp_to_state_from_cm(qp, c.id.get(), IBV_QPS_RTR, domain_.port(), domain_.options())) {
    fail(s, c, "ibv_modify_qp to RTR", err);
  } else if (int err2 = qp_to_state_from_cm(qp, c.id.get(), IBV_QPS_RTS, domain_.port(), domain_.options())) {
    fail(s, c, "ibv_modify_qp to RTS", err2);
  } else {
    rdma_conn_param param = conn_param(qp);
    param.responder_resources = std::min(param.responder_resources, r.initiator_depth);
    param.initiator_depth = std::min(param.initiator_depth, r.responder_resources);
    c.state = State::accepting;
    if (rdma_accept(c.id.get(), &param) != 0) fail(s, c, "rdma_accept", errno);
  }
  if (c.state == State::failed) rdma_reject(c.id.get(), nullptr, 0);
  return {};
}

// One event; returns an id to destroy once the event is acknowledged
// (rdma_destroy_id waits for that).
CmIdOwner CmConnector::handle(Session* s, rdma_cm_event& e) {
  if (e.event == RDMA_CM_EVENT_CONNECT_REQUEST) return on_request(s, e);
  auto* c = static_cast<Connection*>(e.id->context);
  if (s == nullptr || c == nullptr) return {};  // a connection of an earlier connect(): nothing to do
  switch (e.event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      on_address_resolved(*s, *c);
      break;
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
      on_route_resolved(*s, *c);
      break;
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
      on_connect_response(*s, *c);
      break;
    case RDMA_CM_EVENT_ESTABLISHED:
      on_established(*c);
      break;
    case RDMA_CM_EVENT_REJECTED:
      fail(*s, *c, "rejected by the peer", 0);
      break;
    default:
      fail(*s, *c, rdma_event_str(e.event), e.status < 0 ? -e.status : 0);
      break;
  }
  return {};
}

Status CmConnector::pump(Session& s, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    if (s.failure != nullptr) return {StatusCode::unreachable, s.failure};
    if (std::all_of(s.lanes.begin(), s.lanes.end(),
                    [](const Connection& c) { return c.state == State::established; }))
      return Status::success();
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      for (const Connection& c : s.lanes)
        if (c.state != State::established)
          log("rdma_cm: lane %u.%u -> task %u context %u still %s at the deadline", domain_.task(), c.context,
              s.peer, c.peer_context, name(c.state));
      return {StatusCode::timeout, "verbs: rdma_cm: the peer did not complete the connection in time"};
    }
    pollfd p{channel_->fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 100))) < 0 && errno != EINTR)
      return {StatusCode::device_error, "verbs: rdma_cm: poll on the event channel failed"};
    rdma_cm_event* e = nullptr;
    while (rdma_get_cm_event(channel_.get(), &e) == 0) {
      CmIdOwner doomed = handle(&s, *e);
      rdma_ack_cm_event(e);
    }
  }
}

Status CmConnector::connect(std::uint32_t peer, const DomainAddress& address) {
  const std::uint16_t n = domain_.contexts();
  Session s{peer, address, std::vector<Connection>(std::size_t{n} * n)};
  for (std::uint16_t c = 0; c < n; ++c)
    for (std::uint16_t d = 0; d < n; ++d) {
      Connection& x = s.lanes[std::size_t{c} * n + d];
      x.context = c;
      x.peer_context = d;
    }
  if (domain_.task() < peer) {
    for (Connection& c : s.lanes) start_active(s, c);
  } else {
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (it->hello.task != peer) {
        ++it;
        continue;
      }
      CmIdOwner doomed = accept(s, std::move(*it));
      it = waiting_.erase(it);
    }
  }
  const Status st = pump(
      s, std::chrono::steady_clock::now() + std::chrono::milliseconds(domain_.options().connect_timeout_ms));
  for (Connection& c : s.lanes) {
    if (!c.id) continue;
    c.id->context = nullptr;  // later events on it find no session
    if (st.ok()) connections_.push_back(std::move(c.id));
  }
  return st;
}

}  // namespace ami::verbs
