// verbs_backend/verbs_setup.cpp — building the domain: port, protection
// domain, each context's CQ, SRQ, receive buffers and UD queue pair; the RC
// queue pairs of lanes as they are made; memory registration.
#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "ami/device/descriptor.hpp"
#include "ami/error.hpp"
#include "verbs_cm.hpp"
#include "verbs_domain.hpp"
#include "verbs_handshake.hpp"
#include "verbs_port.hpp"
#include "verbs_qp.hpp"

namespace ami::verbs {

namespace {

constexpr std::uint64_t kMaxLanes = 1u << 22;  // lane bits of a send WR's wr_id
constexpr std::uint32_t kInlineCandidates[] = {512, 256, 128, 64, 0};

void check_options(std::uint32_t task, std::uint32_t tasks, std::uint16_t contexts, const VerbsOptions& o) {
  if (tasks == 0 || task >= tasks) throw Error("verbs: task must be below tasks");
  if (contexts == 0) throw Error("verbs: at least one context");
  if (std::uint64_t{tasks} * contexts > kMaxLanes)
    throw Error("verbs: tasks x contexts exceeds " + std::to_string(kMaxLanes) + " lanes");
  if (o.signal_interval == 0) throw Error("verbs: signal_interval must be at least 1");
  if (o.doorbell_batch == 0) throw Error("verbs: doorbell_batch must be at least 1");
  if (o.max_rdma && *o.max_rdma == 0) throw Error("verbs: max_rdma must be at least 1 byte");
  // Half the send queue may be unsignalled at most: a full queue always
  // holds a signalled WR whose completion frees it (eRPC's kSQDepth >= 2 * kUnsigBatch).
  if (o.sq_depth < 2 * o.signal_interval)
    throw Error("verbs: sq_depth (" + std::to_string(o.sq_depth) +
                ") must be at least 2 x signal_interval (" + std::to_string(o.signal_interval) + ")");
  if (o.bounce_bytes != 0 && o.bounce_bytes < device::kPacketInlineBytes)
    throw Error("verbs: bounce_bytes must hold a descriptor's inline bytes (" +
                std::to_string(device::kPacketInlineBytes) + ")");
  if (o.bounce_bytes > (1u << 30)) throw Error("verbs: bounce_bytes must be at most 1 GiB");
}

// Receive buffers the options leave to the device's kind. A software device
// (soft-RoCE, siw) spends the host's CPU on every work request and receive
// completion, as much as on several pages of data: it gets fewer, larger
// packets, 128 buffers of 128 KiB (16 MiB per context; a 64 KiB message is
// two packets, not ten). A NIC gets 512 of 8 KiB (4 MiB), the size UCX and
// the MPI libraries give their eager buffers. The staging ring holds two of
// the largest packets at least.
void receive_shape(VerbsOptions& o, const PortInfo& port) {
  if (o.bounce_bytes == 0) o.bounce_bytes = port.software ? 128 * 1024 : 8 * 1024;
  if (o.srq_depth == 0) o.srq_depth = port.software ? 128 : 512;
  o.staging_bytes = std::max(o.staging_bytes, 2 * o.bounce_bytes);
}

std::uint32_t random_psn() {
  static thread_local std::mt19937 gen{std::random_device{}()};
  return gen() & 0xFFFFFFu;
}

// A CQ's first size: every receive buffer, the handshake's queue pair, and
// the send queues of a few lanes; it grows as lanes are made (grow_cq).
constexpr std::uint64_t kFirstLanes = 4;

}  // namespace

MrOwner register_memory(ibv_pd* pd, void* address, std::size_t bytes, int access, const char* what) {
  MrOwner mr(ibv_reg_mr(pd, address, bytes, access));
  if (!mr)
    throw_call(std::string("ibv_reg_mr (") + what + ", " + std::to_string(bytes) + " B)", errno_of_null());
  return mr;
}

const ContextQueues::Route* ContextQueues::find_route(std::uint32_t qpn) const {
  auto it = std::lower_bound(routes.begin(), routes.end(), qpn,
                             [](const Route& r, std::uint32_t n) { return r.qpn < n; });
  if (it == routes.end() || it->qpn != qpn) return nullptr;
  recent_route = &*it;
  return recent_route;
}

void ContextQueues::add_route(std::uint32_t qpn, Endpoint peer) {
  auto it = std::lower_bound(routes.begin(), routes.end(), qpn,
                             [](const Route& r, std::uint32_t n) { return r.qpn < n; });
  routes.insert(it, Route{qpn, peer});
  recent_route = nullptr;
}

void ContextQueues::remove_route(std::uint32_t qpn) {
  auto it = std::lower_bound(routes.begin(), routes.end(), qpn,
                             [](const Route& r, std::uint32_t n) { return r.qpn < n; });
  if (it != routes.end() && it->qpn == qpn) routes.erase(it);
  recent_route = nullptr;
}

namespace {

// AMI_VERBS_CM=auto: rdma_cm where the port's GID holds a routable IP
// address (RoCE), the handshake elsewhere (InfiniBand; a link-local GID).
bool rdma_cm_by_default(const PortInfo& port) {
  if (port.link_layer != IBV_LINK_LAYER_ETHERNET) return false;
  return gid_is_ipv4(port.gid) || !gid_is_link_local(port.gid);
}

}  // namespace

VerbsDomain::VerbsDomain(std::uint32_t task, std::uint32_t tasks, std::uint16_t contexts,
                         const VerbsOptions& options, device::RegionTable& regions)
    : task_(task), tasks_(tasks), contexts_(contexts), options_(options), regions_(regions), peers_(tasks) {
  check_options(task, tasks, contexts, options);
  port_ = open_port(options_, device_);
  receive_shape(options_, port_);
  if (options_.sq_depth > static_cast<std::uint32_t>(port_.max_qp_wr))
    throw Error("verbs: sq_depth " + std::to_string(options_.sq_depth) + " exceeds " + port_.device +
                "'s max_qp_wr " + std::to_string(port_.max_qp_wr));
  if (options_.srq_depth > static_cast<std::uint32_t>(port_.max_srq_wr))
    throw Error("verbs: srq_depth " + std::to_string(options_.srq_depth) + " exceeds " + port_.device +
                "'s max_srq_wr " + std::to_string(port_.max_srq_wr));
  method_ = options_.use_rdma_cm.value_or(rdma_cm_by_default(port_)) ? ConnectMethod::rdma_cm
                                                                      : ConnectMethod::handshake;
  nonce_ = (std::uint64_t{std::random_device{}()} << 32) | std::random_device{}() | 1;
  peer_rendezvous_.resize(std::size_t{tasks_} * contexts_);
  pd_.reset(require(ibv_alloc_pd(device_.get()), "ibv_alloc_pd"));
  for (std::uint16_t c = 0; c < contexts_; ++c) queues_.push_back(make_queues());
  // How much inline data the device takes, found now on a queue pair made
  // for that alone: contexts make theirs later, each on its own thread.
  (void)make_qp(*queues_[0]);
  if (method_ == ConnectMethod::rdma_cm) {
    cm_ = std::make_unique<CmConnector>(*this);
    for (auto& q : queues_) cm_->listen(*q);
  }
}

VerbsDomain::~VerbsDomain() = default;

// Creates one RC QP on q's CQ and SRQ, and moves it to INIT. The first one
// finds how much inline data the device takes.
QpOwner VerbsDomain::make_qp(ContextQueues& q) {
  ibv_qp_init_attr a{};
  a.send_cq = q.cq.get();
  a.recv_cq = q.cq.get();
  a.srq = q.srq.get();
  a.qp_type = IBV_QPT_RC;
  a.sq_sig_all = 0;
  a.cap.max_send_wr = options_.sq_depth;
  a.cap.max_send_sge = 2;
  a.cap.max_recv_sge = 1;
  QpOwner qp;
  if (options_.max_inline || inline_known_) {
    a.cap.max_inline_data = options_.max_inline ? *options_.max_inline : port_.max_inline;
    qp.reset(require(ibv_create_qp(pd_.get(), &a), "ibv_create_qp"));
  } else {
    int err = 0;
    for (std::uint32_t inline_bytes : kInlineCandidates) {
      ibv_qp_init_attr t = a;
      t.cap.max_inline_data = inline_bytes;
      qp.reset(ibv_create_qp(pd_.get(), &t));
      if (qp) {
        a = t;
        break;
      }
      err = errno_of_null();
    }
    if (!qp) throw_call("ibv_create_qp", err);
  }
  // Found once, by the probe the constructor makes: later calls come from
  // the contexts' threads and only read it.
  if (!inline_known_) {
    port_.max_inline = a.cap.max_inline_data;
    inline_known_ = true;
  }
  if (int err = qp_to_init(qp.get(), port_.port, port_.access())) {
    log_qp(qp.get(), "ibv_modify_qp to INIT", err);
    throw_call("ibv_modify_qp to INIT", err);
  }
  return qp;
}

std::unique_ptr<ContextQueues> VerbsDomain::make_queues() {
  auto q = std::make_unique<ContextQueues>();
  ibv_context* ctx = device_.get();

  const std::uint64_t need = options_.srq_depth + kUdReceives + kUdSends + kFirstLanes * options_.sq_depth;
  const std::uint64_t cqe = std::min<std::uint64_t>(std::max<std::uint64_t>(need, options_.cq_depth),
                                                    static_cast<std::uint64_t>(port_.max_cqe));
  q->channel.reset(require(ibv_create_comp_channel(ctx), "ibv_create_comp_channel"));
  // Read without blocking: a context about to sleep takes every event it holds.
  if (const int flags = ::fcntl(q->channel->fd, F_GETFL);
      flags < 0 || ::fcntl(q->channel->fd, F_SETFL, flags | O_NONBLOCK) < 0)
    throw Error("verbs: fcntl O_NONBLOCK on the completion channel", errno);
  q->cq.reset(
      require(ibv_create_cq(ctx, static_cast<int>(cqe), nullptr, q->channel.get(), 0), "ibv_create_cq"));
  q->cqe = q->cq->cqe;

  ibv_srq_init_attr sa{};
  sa.attr.max_wr = options_.srq_depth;
  sa.attr.max_sge = 1;
  q->srq.reset(require(ibv_create_srq(pd_.get(), &sa), "ibv_create_srq"));

  const std::size_t bytes = std::size_t{options_.srq_depth} * options_.bounce_bytes;
  q->receive_memory = allocate_pages(bytes);
  q->receive_mr =
      register_memory(pd_.get(), q->receive_memory.get(), bytes, IBV_ACCESS_LOCAL_WRITE, "receive buffers");

  // Pre-linked receive WRs; every buffer is posted now, before any peer
  // can connect.
  q->recv_wr.resize(options_.srq_depth);
  q->recv_sge.resize(options_.srq_depth);
  q->to_repost.reserve(options_.srq_depth);
  for (std::uint32_t i = 0; i < options_.srq_depth; ++i) {
    q->recv_sge[i].lkey = q->receive_mr->lkey;
    q->recv_wr[i].sg_list = &q->recv_sge[i];
    q->recv_wr[i].num_sge = 1;
    q->recv_wr[i].next = i + 1 < options_.srq_depth ? &q->recv_wr[i + 1] : nullptr;
    q->to_repost.push_back(i);
  }
  if (int err = post_receives(*q, options_.bounce_bytes)) throw_call("ibv_post_srq_recv", err);
  if (method_ == ConnectMethod::handshake) make_ud(*q);
  return q;
}

// The handshake's UD queue pair on the context's CQ, at RTS, every receive
// buffer posted. Its completions are told apart by their QP number.
void VerbsDomain::make_ud(ContextQueues& q) {
  const std::size_t bytes = std::size_t{kUdReceives} * kUdReceiveBytes + std::size_t{kUdSends} * kUdSendBytes;
  q.ud_memory = allocate_pages(bytes);
  q.ud_mr = register_memory(pd_.get(), q.ud_memory.get(), bytes, IBV_ACCESS_LOCAL_WRITE, "handshake buffers");
  ibv_qp_init_attr a{};
  a.send_cq = q.cq.get();
  a.recv_cq = q.cq.get();
  a.qp_type = IBV_QPT_UD;
  a.cap.max_send_wr = kUdSends;
  a.cap.max_recv_wr = kUdReceives;
  a.cap.max_send_sge = 1;
  a.cap.max_recv_sge = 1;
  q.ud.reset(require(ibv_create_qp(pd_.get(), &a), "ibv_create_qp (UD)"));
  ibv_qp_attr s{};
  s.qp_state = IBV_QPS_INIT;
  s.pkey_index = 0;
  s.port_num = port_.port;
  s.qkey = kUdQkey;
  if (int rc = ibv_modify_qp(q.ud.get(), &s, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
    throw_call("ibv_modify_qp (UD) to INIT", errno_of_rc(rc));
  s = {};
  s.qp_state = IBV_QPS_RTR;
  if (int rc = ibv_modify_qp(q.ud.get(), &s, IBV_QP_STATE)) throw_call("ibv_modify_qp (UD) to RTR", errno_of_rc(rc));
  s.qp_state = IBV_QPS_RTS;
  s.sq_psn = 0;
  if (int rc = ibv_modify_qp(q.ud.get(), &s, IBV_QP_STATE | IBV_QP_SQ_PSN))
    throw_call("ibv_modify_qp (UD) to RTS", errno_of_rc(rc));
  for (std::uint32_t i = 0; i < kUdReceives; ++i)
    if (int err = post_handshake_receive(q, i)) throw_call("ibv_post_recv (UD)", err);
}

int post_handshake_receive(ContextQueues& q, std::uint32_t buffer) {
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(q.ud_memory.get() + std::size_t{buffer} * kUdReceiveBytes),
              kUdReceiveBytes, q.ud_mr->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = buffer;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  const int rc = ibv_post_recv(q.ud.get(), &wr, &bad);
  return rc == 0 ? 0 : errno_of_rc(rc);
}

// Every receive buffer, the handshake's queue pair and every send WR of
// every lane (errors complete unsignalled WRs too, as flushes) must fit the
// CQ at once: it grows, doubling, as lanes are made, up to the device's
// max_cqe.
void VerbsDomain::grow_cq(ContextQueues& q, std::uint16_t context) {
  const std::uint64_t need = options_.srq_depth + kUdReceives + kUdSends +
                             std::uint64_t{q.connections.size()} * options_.sq_depth;
  if (need <= static_cast<std::uint64_t>(q.cqe) || q.cqe >= port_.max_cqe) return;
  const int want = static_cast<int>(std::min<std::uint64_t>(std::max<std::uint64_t>(need, 2ull * q.cqe),
                                                            static_cast<std::uint64_t>(port_.max_cqe)));
  if (int rc = ibv_resize_cq(q.cq.get(), want)) {
    log("context %u: ibv_resize_cq to %d: %s; a flush of every queue pair together could overrun the CQ", context,
        want, std::strerror(errno_of_rc(rc)));
    return;
  }
  q.cqe = q.cq->cqe;
  if (static_cast<std::uint64_t>(q.cqe) < need)
    log("%s's max_cqe %d is below the %llu completions the queues may produce at once; a flush of every "
        "queue pair together could overrun the CQ",
        port_.device.c_str(), port_.max_cqe, static_cast<unsigned long long>(need));
}

Connection& VerbsDomain::new_connection(std::uint16_t context, Endpoint peer, bool active) {
  ContextQueues& q = *queues_[context];
  Connection c;
  c.qp = make_qp(q);
  c.psn = random_psn();
  c.active = active;
  c.state = active ? Connection::State::requesting : Connection::State::accepted;
  const std::uint32_t qpn = c.qp->qp_num;
  auto [it, fresh] = q.connections.emplace(static_cast<std::uint32_t>(lane_index(peer)), std::move(c));
  if (!fresh) throw Error("verbs: a second queue pair for one lane");
  q.add_route(qpn, peer);
  grow_cq(q, context);
  queue_pairs_made_.fetch_add(1, std::memory_order_relaxed);
  return it->second;
}

// The CQ keeps its room: one queue pair goes for one that comes.
void VerbsDomain::renew_queue_pair(Connection& c, std::uint16_t context, Endpoint peer) {
  ContextQueues& q = *queues_[context];
  QpOwner fresh = make_qp(q);
  q.remove_route(c.qp->qp_num);
  q.add_route(fresh->qp_num, peer);
  c.qp = std::move(fresh);
  c.psn = random_psn();
}

int VerbsDomain::connect_queue_pair(Connection& c, Endpoint peer, std::uint32_t remote_qpn, std::uint32_t remote_psn) {
  const PeerInfo& p = peers_[peer.task];
  if (int err = qp_to_rtr(c.qp.get(), port_, options_, p, remote_qpn, remote_psn)) {
    log_qp(c.qp.get(), "ibv_modify_qp to RTR", err);
    return err;
  }
  const std::uint8_t rd_atomic = std::min(port_.initiator_rd_atomic, std::max<std::uint8_t>(p.rd_atomic, 1));
  if (int err = qp_to_rts(c.qp.get(), options_, c.psn, rd_atomic)) {
    log_qp(c.qp.get(), "ibv_modify_qp to RTS", err);
    return err;
  }
  return 0;
}

int VerbsDomain::connect_loopback(Connection& c) {
  PeerInfo self;
  std::memcpy(self.gid.data(), port_.gid.raw, self.gid.size());
  self.lid = port_.lid;
  self.mtu = static_cast<std::uint8_t>(port_.active_mtu);
  self.rd_atomic = port_.responder_rd_atomic;
  if (int err = qp_to_rtr(c.qp.get(), port_, options_, self, c.qp->qp_num, c.psn)) {
    log_qp(c.qp.get(), "ibv_modify_qp to RTR (loopback)", err);
    return err;
  }
  if (int err = qp_to_rts(c.qp.get(), options_, c.psn, std::min(port_.initiator_rd_atomic, port_.responder_rd_atomic))) {
    log_qp(c.qp.get(), "ibv_modify_qp to RTS (loopback)", err);
    return err;
  }
  c.remote_qpn = c.qp->qp_num;
  return 0;
}

ibv_ah* VerbsDomain::address_handle(std::uint16_t context, std::uint32_t peer_task) {
  ContextQueues& q = *queues_[context];
  if (auto it = q.ahs.find(peer_task); it != q.ahs.end()) return it->second.get();
  const PeerInfo& p = peers_[peer_task];
  ibv_ah_attr a{};
  a.port_num = port_.port;
  if (port_.link_layer == IBV_LINK_LAYER_ETHERNET) {
    a.is_global = 1;
    std::memcpy(a.grh.dgid.raw, p.gid.data(), p.gid.size());
    a.grh.sgid_index = static_cast<std::uint8_t>(port_.gid_index);
    a.grh.hop_limit = 64;
  } else {
    a.dlid = p.lid;
  }
  ibv_ah* ah = ibv_create_ah(pd_.get(), &a);
  if (ah == nullptr) {
    log("ibv_create_ah to task %u: %s", peer_task, std::strerror(errno_of_null()));
    return nullptr;
  }
  q.ahs.emplace(peer_task, AhOwner(ah));
  return ah;
}

ibv_qp* VerbsDomain::qp(std::uint16_t context, Endpoint peer) const {
  if (context >= contexts_ || peer.task >= tasks_ || peer.context >= contexts_) return nullptr;
  const auto& connections = queues_[context]->connections;
  const auto it = connections.find(static_cast<std::uint32_t>(lane_index(peer)));
  return it == connections.end() ? nullptr : it->second.qp.get();
}

std::uint32_t VerbsDomain::max_packet(std::uint32_t peer) const {
  return std::min(options_.bounce_bytes, peers_[peer].bounce_bytes);
}

Status VerbsDomain::register_region(std::uint32_t region, void* addr, std::size_t len, std::uint32_t& lkey,
                                   std::uint32_t& rkey) {
  if (addr == nullptr || len == 0)
    return {StatusCode::invalid_argument, "verbs: register_region: null address or zero length"};
  ibv_mr* mr = ibv_reg_mr(pd_.get(), addr, len, port_.access());
  if (mr == nullptr) {
    const int err = errno_of_null();
    log("ibv_reg_mr (%zu B at %p): %s", len, addr, std::strerror(err));
    if (err == ENOMEM || err == EPERM)
      return {StatusCode::no_resource,
              "verbs: ibv_reg_mr: cannot pin the memory (locked memory limit, ulimit -l)"};
    return {StatusCode::device_error, "verbs: ibv_reg_mr failed (see the log)"};
  }
  region_mrs_.push_back(Region{region, MrOwner(mr)});
  lkey = mr->lkey;
  rkey = mr->rkey;
  return Status::success();
}

void VerbsDomain::deregister_region(std::uint32_t region) {
  for (auto it = region_mrs_.begin(); it != region_mrs_.end(); ++it) {
    if (it->region == region) {
      region_mrs_.erase(it);
      return;
    }
  }
}

std::string VerbsDomain::describe() const {
  std::string s = "verbs: " + port_.device + " port " + std::to_string(port_.port) + ", " +
                  (port_.link_layer == IBV_LINK_LAYER_ETHERNET
                       ? std::string(port_.roce_v2 ? "Ethernet (RoCE v2)" : "Ethernet (RoCE)")
                       : "InfiniBand, LID " + std::to_string(port_.lid)) +
                  ", active MTU " + mtu_text(port_.active_mtu) + ", GID index " +
                  std::to_string(port_.gid_index) + " (" + gid_text(port_.gid) + "), max inline " +
                  std::to_string(port_.max_inline) + " B, " + std::to_string(options_.srq_depth) +
                  " receive buffers of " +
                  (options_.bounce_bytes % 1024 == 0 ? std::to_string(options_.bounce_bytes / 1024) + " KiB"
                                                     : std::to_string(options_.bounce_bytes) + " B") +
                  (method_ == ConnectMethod::rdma_cm ? ", lanes connected by rdma_cm on first use"
                                                     : ", lanes connected on first use by a handshake over UD") +
                  ", atomics " +
                  (port_.atomic_cap == IBV_ATOMIC_GLOB  ? "GLOB"
                   : port_.atomic_cap == IBV_ATOMIC_HCA ? "HCA (64-bit fetch-add and compare-swap on the NIC)"
                                                        : "NONE (done by the target's engine)") +
                  ", " + std::to_string(queue_pairs_made()) + " queue pair(s) made";
  return s;
}

std::string VerbsDomain::describe_lane(std::uint16_t context, Endpoint peer) const {
  ibv_qp* q = qp(context, peer);
  if (q == nullptr) return " Lane            : none to task " + std::to_string(peer.task) + "\n";
  ibv_qp_attr a{};
  ibv_qp_init_attr init{};
  constexpr int kMask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_SQ_PSN;
  if (ibv_query_qp(q, &a, kMask, &init) != 0)
    return " Lane            : ibv_query_qp failed: " + std::string(std::strerror(errno)) + "\n";
  const bool ethernet = port_.link_layer == IBV_LINK_LAYER_ETHERNET;
  char line[192];
  std::string out;
  auto field = [&](const char* name, const std::string& value) {
    std::snprintf(line, sizeof line, " %-16s: %s\n", name, value.c_str());
    out += line;
  };
  field("Device", port_.device);
  field("Port", std::to_string(port_.port));
  field("Transport type", "IB");
  field("Connection type", "RC");
  field("Using SRQ", "ON");
  field("Link type", ethernet ? (port_.roce_v2 ? "Ethernet (RoCE v2)" : "Ethernet (RoCE v1)") : "IB");
  field("Mtu", std::string(mtu_text(a.path_mtu)) + "[B]");
  if (ethernet) field("GID index", std::to_string(port_.gid_index));
  field("Max inline data", std::to_string(init.cap.max_inline_data) + "[B]");
  field("Send queue", std::to_string(init.cap.max_send_wr) + " WRs, one signalled in " +
                          std::to_string(options_.signal_interval));
  field("Receive buffers", std::to_string(options_.srq_depth) + " x " + std::to_string(options_.bounce_bytes) + "[B]");
  field("rdma_cm QPs", method_ == ConnectMethod::rdma_cm ? "ON" : "OFF");
  field("Data ex. method", method_ == ConnectMethod::rdma_cm ? "rdma_cm" : "ami handshake over UD, on first use");
  std::snprintf(line, sizeof line, " local address: LID %#06x QPN %#08x PSN %#08x\n", port_.lid, q->qp_num,
                a.sq_psn);
  out += line;
  if (ethernet) out += " GID: " + gid_text(port_.gid) + "\n";
  std::snprintf(line, sizeof line, " remote address: LID %#06x QPN %#08x PSN %#08x\n", a.ah_attr.dlid,
                a.dest_qp_num, a.rq_psn);
  out += line;
  if (ethernet) out += " GID: " + gid_text(a.ah_attr.grh.dgid) + "\n";
  return out;
}

}  // namespace ami::verbs
