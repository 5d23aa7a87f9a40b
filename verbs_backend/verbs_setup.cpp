// verbs_backend/verbs_setup.cpp — building the domain: port, protection
// domain, each context's CQ, SRQ, receive buffers and queue pairs; memory
// registration.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>

#include "ami/device/descriptor.hpp"
#include "ami/error.hpp"
#include "verbs_cm.hpp"
#include "verbs_domain.hpp"
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

}  // namespace

AlignedBuffer allocate_pages(std::size_t bytes) {
  constexpr std::size_t kPage = 4096;
  bytes = (bytes + kPage - 1) / kPage * kPage;
  void* p = std::aligned_alloc(kPage, bytes);
  if (p == nullptr) throw std::bad_alloc();
  return AlignedBuffer(static_cast<std::byte*>(p));
}

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
  method_ = options_.use_rdma_cm.value_or(port_.link_layer == IBV_LINK_LAYER_ETHERNET)
                ? ConnectMethod::rdma_cm
                : ConnectMethod::exchange;
  pd_.reset(require(ibv_alloc_pd(device_.get()), "ibv_alloc_pd"));
  for (std::uint16_t c = 0; c < contexts_; ++c) queues_.push_back(make_queues(c));
  if (method_ == ConnectMethod::rdma_cm) cm_ = std::make_unique<CmConnector>(*this);
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
  if (!inline_known_) port_.max_inline = a.cap.max_inline_data;
  inline_known_ = true;
  if (int err = qp_to_init(qp.get(), port_.port)) {
    log_qp(qp.get(), "ibv_modify_qp to INIT", err);
    throw_call("ibv_modify_qp to INIT", err);
  }
  return qp;
}

std::unique_ptr<ContextQueues> VerbsDomain::make_queues(std::uint16_t context) {
  auto q = std::make_unique<ContextQueues>();
  ibv_context* ctx = device_.get();
  const std::uint32_t n_qps = (tasks_ - 1) * std::uint32_t{contexts_};

  // Every receive buffer, plus every send WR of every QP (errors complete
  // unsignalled WRs too, as flushes), must fit the CQ at once.
  const std::uint64_t need = options_.srq_depth + std::uint64_t{n_qps} * options_.sq_depth;
  const std::uint64_t cqe = std::min<std::uint64_t>(std::max<std::uint64_t>(need, options_.cq_depth),
                                                    static_cast<std::uint64_t>(port_.max_cqe));
  if (cqe < need && context == 0)
    log("%s's max_cqe %d is below the %llu completions the queues may produce at once; a flush of every "
        "queue pair together could overrun the CQ",
        port_.device.c_str(), port_.max_cqe, static_cast<unsigned long long>(need));
  q->channel.reset(require(ibv_create_comp_channel(ctx), "ibv_create_comp_channel"));
  q->cq.reset(
      require(ibv_create_cq(ctx, static_cast<int>(cqe), nullptr, q->channel.get(), 0), "ibv_create_cq"));

  ibv_srq_init_attr sa{};
  sa.attr.max_wr = options_.srq_depth;
  sa.attr.max_sge = 1;
  q->srq.reset(require(ibv_create_srq(pd_.get(), &sa), "ibv_create_srq"));

  const std::size_t bytes = std::size_t{options_.srq_depth} * options_.bounce_bytes;
  q->receive_memory = allocate_pages(bytes);
  q->receive_mr =
      register_memory(pd_.get(), q->receive_memory.get(), bytes, IBV_ACCESS_LOCAL_WRITE, "receive buffers");

  q->qps.resize(std::size_t{tasks_} * contexts_);
  q->psns.resize(q->qps.size());
  for (std::uint32_t t = 0; t < tasks_; ++t) {
    if (t == task_) continue;  // the self backend reaches the own task
    for (std::uint16_t d = 0; d < contexts_; ++d) {
      const std::size_t i = lane_index({t, d});
      q->qps[i] = make_qp(*q);
      q->psns[i] = random_psn();
      q->routes.push_back({q->qps[i]->qp_num, Endpoint{t, d}});
    }
  }
  std::sort(q->routes.begin(), q->routes.end(),
            [](const ContextQueues::Route& a, const ContextQueues::Route& b) { return a.qpn < b.qpn; });

  // Pre-linked receive WRs; every buffer is posted now, before any peer
  // knows the QP numbers.
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
  return q;
}

ibv_qp* VerbsDomain::qp(std::uint16_t context, Endpoint peer) const {
  if (context >= contexts_ || peer.task >= tasks_ || peer.context >= contexts_) return nullptr;
  return queues_[context]->qps[lane_index(peer)].get();
}

std::uint32_t VerbsDomain::max_packet(std::uint32_t peer) const {
  return std::min(options_.bounce_bytes, peers_[peer].bounce_bytes);
}

Status VerbsDomain::register_region(std::uint32_t region, void* addr, std::size_t len, std::uint32_t& lkey,
                                   std::uint32_t& rkey) {
  if (addr == nullptr || len == 0)
    return {StatusCode::invalid_argument, "verbs: register_region: null address or zero length"};
  ibv_mr* mr = ibv_reg_mr(pd_.get(), addr, len, kQpAccess);
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
                  ", connection by " +
                  (method_ == ConnectMethod::rdma_cm ? "rdma_cm" : "address exchange");
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
  field("Data ex. method", method_ == ConnectMethod::rdma_cm ? "rdma_cm" : "Ethernet (ami bootstrap)");
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
