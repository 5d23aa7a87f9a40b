// verbs_backend/verbs_connect.cpp — queue pair transitions, the address a
// task publishes, and learning a peer from its address.
#include <rdma/rdma_cma.h>

#include <algorithm>
#include <cstring>

#include "ami/device/descriptor.hpp"
#include "ami/error.hpp"
#include "verbs_cm.hpp"
#include "verbs_domain.hpp"
#include "verbs_qp.hpp"

namespace ami::verbs {

int qp_to_init(ibv_qp* qp, std::uint8_t port, int access) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = port;
  a.qp_access_flags = static_cast<unsigned>(access);
  return errno_of_rc(
      ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
}

int qp_to_rtr(ibv_qp* qp, const PortInfo& port, const VerbsOptions& options, const PeerInfo& peer,
              std::uint32_t remote_qpn, std::uint32_t remote_psn) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = std::min(port.active_mtu, static_cast<ibv_mtu>(peer.mtu));
  a.dest_qp_num = remote_qpn;
  a.rq_psn = remote_psn;
  a.max_dest_rd_atomic = port.responder_rd_atomic;
  a.min_rnr_timer = options.min_rnr_timer;
  a.ah_attr.port_num = port.port;
  if (port.link_layer == IBV_LINK_LAYER_ETHERNET) {
    a.ah_attr.is_global = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, peer.gid.data(), peer.gid.size());
    a.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(port.gid_index);
    a.ah_attr.grh.hop_limit = 64;
  } else {
    a.ah_attr.dlid = peer.lid;
  }
  return errno_of_rc(ibv_modify_qp(qp, &a,
                                   IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER));
}

int qp_to_rts(ibv_qp* qp, const VerbsOptions& options, std::uint32_t psn, std::uint8_t rd_atomic) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = options.timeout;
  a.retry_cnt = options.retry_count;
  a.rnr_retry = options.rnr_retry;
  a.sq_psn = psn;
  a.max_rd_atomic = rd_atomic;
  return errno_of_rc(ibv_modify_qp(qp, &a,
                                   IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                       IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC));
}

int qp_to_state_from_cm(ibv_qp* qp, rdma_cm_id* id, ibv_qp_state state, const PortInfo& port,
                        const VerbsOptions& options) {
  ibv_qp_attr a{};
  int mask = 0;
  a.qp_state = state;
  if (rdma_init_qp_attr(id, &a, &mask) != 0) return errno_of_rc(-1);
  // The queue pair keeps the access it was given at INIT.
  mask &= ~IBV_QP_ACCESS_FLAGS;
  // READ depths as negotiated, but never beyond what this device takes.
  if (state == IBV_QPS_RTR) {
    a.min_rnr_timer = options.min_rnr_timer;
    a.max_dest_rd_atomic = std::min(a.max_dest_rd_atomic, port.responder_rd_atomic);
    a.path_mtu = std::min(a.path_mtu, port.active_mtu);  // the route's, within this task's cap
    mask |= IBV_QP_MIN_RNR_TIMER;
  } else if (state == IBV_QPS_RTS) {
    a.timeout = options.timeout;
    a.max_rd_atomic = std::min(a.max_rd_atomic, port.initiator_rd_atomic);
    mask |= IBV_QP_TIMEOUT;
  }
  return errno_of_rc(ibv_modify_qp(qp, &a, mask));
}

std::vector<std::byte> VerbsDomain::local_address() const {
  DomainAddress a;
  a.method = method_;
  a.link_layer = port_.link_layer;
  a.mtu = static_cast<std::uint8_t>(port_.active_mtu);
  a.rd_atomic = port_.responder_rd_atomic;
  a.lid = port_.lid;
  a.contexts = contexts_;
  a.task = task_;
  a.tasks = tasks_;
  a.bounce_bytes = options_.bounce_bytes;
  std::memcpy(a.gid.data(), port_.gid.raw, a.gid.size());
  a.nonce = nonce_;
  if (method_ == ConnectMethod::rdma_cm) {
    a.ip_family = cm_->ip_family();
    a.ip = cm_->ip();
    for (const auto& q : queues_) a.rendezvous.push_back(q->cm_port);
  } else {
    for (const auto& q : queues_) a.rendezvous.push_back(q->ud->qp_num);
  }
  return a.encode();
}

// Does the peer's address fit this task's job and port?
Status VerbsDomain::check_peer(std::uint32_t peer_task, const DomainAddress& a) const {
  if (peer_task >= tasks_ || peer_task == task_)
    return {StatusCode::invalid_argument, "verbs: connect names no other task of the job"};
  if (a.task != peer_task)
    return {StatusCode::invalid_argument, "verbs: the address belongs to another task"};
  if (a.tasks != tasks_)
    return {StatusCode::invalid_argument, "verbs: the peer counts another number of tasks"};
  if (a.contexts != contexts_)
    return {StatusCode::invalid_argument, "verbs: the peer has another number of contexts"};
  if (a.method != method_)
    return {StatusCode::invalid_argument, "verbs: the peer connects by another method (rdma_cm vs handshake)"};
  if (a.link_layer != port_.link_layer)
    return {StatusCode::unreachable, "verbs: the peer's port has another link layer"};
  if (a.bounce_bytes < device::kPacketInlineBytes)
    return {StatusCode::invalid_argument, "verbs: the peer's receive buffers are too small"};
  if (a.link_layer == IBV_LINK_LAYER_INFINIBAND && a.lid == 0)
    return {StatusCode::invalid_argument, "verbs: the peer's InfiniBand port has no LID"};
  if (knows(peer_task))
    return {StatusCode::invalid_argument, "verbs: the peer is known already"};
  return Status::success();
}

// Either method needs nothing but the peer's address until a context first
// talks to it.
Status VerbsDomain::connect(std::uint32_t peer_task, std::span<const std::byte> peer_address) {
  DomainAddress a;
  Status s = DomainAddress::decode(peer_address, a);
  if (!s.ok()) return s;
  s = check_peer(peer_task, a);
  if (!s.ok()) return s;
  learn(peer_task, a);
  return Status::success();
}

void VerbsDomain::learn(std::uint32_t peer_task, const DomainAddress& a) {
  PeerInfo& p = peers_[peer_task];
  p.gid = a.gid;
  p.nonce = a.nonce;
  p.bounce_bytes = a.bounce_bytes;
  p.lid = a.lid;
  p.mtu = a.mtu;
  p.rd_atomic = a.rd_atomic;
  for (std::uint16_t d = 0; d < a.rendezvous.size() && d < contexts_; ++d)
    peer_rendezvous_[lane_index(Endpoint{peer_task, d})] = a.rendezvous[d];
  p.known.store(true, std::memory_order_release);  // last: a context may be reading
}

}  // namespace ami::verbs
