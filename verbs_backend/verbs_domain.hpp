// verbs_backend/verbs_domain.hpp — what the contexts of one task share for
// InfiniBand/RoCE: the device and port, the protection domain, the memory
// registrations, each context's queues, and what the task knows of its
// peers (their ports and published addresses, a few dozen bytes each).
//
// Owned by the task's verbs backend (verbs_backend.cpp), built before the
// contexts and destroyed after them. No queue pair of any lane exists when
// the task publishes its address (local_address(), the same size in a job
// of 2 tasks or 20,000): connect() only learns the peer, and a context's
// queue pair to a peer context is made the first time the context talks to
// it, or is asked to by it (docs/DESIGN.md, "Wire-up on first use"). Two
// methods connect it:
//  - the handshake (default): a request, a reply and a ready message over
//    each context's UD queue pair (verbs_handshake.cpp), driven by the
//    context's own progress(); works on InfiniBand without IP and on RoCE;
//  - rdma_cm (AMI_VERBS_CM=on, RoCE only): the same on first use through
//    librdmacm, each context with its own event channel and listening port
//    (verbs_cm.cpp), for fabrics where IP routing must find the path.
// Either way connect() only learns the peer.
// Control-path calls (constructor, local_address, connect, register and
// deregister) are serialised by the Client; a context's queues (its
// connections included) are touched only by that context's device.
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ami/callback.hpp"
#include "ami/device/peer_directory.hpp"
#include "ami/device/region_table.hpp"
#include "ami/memory.hpp"
#include "ami/status.hpp"
#include "verbs_address.hpp"
#include "verbs_config.hpp"
#include "verbs_resources.hpp"

namespace ami::verbs {

// The settings with a row in verbs_config.hpp take their defaults from it
// (auto is 0, -1 or unset below); from() reads them from a Config.
struct VerbsOptions {
  std::string net_devices;        // "rxe0:1" or "mlx5_0:1,mlx5_1" (AMI_NET_DEVICES); "" = first active port
  int gid_index = -1;             // -1: automatic (RoCE: the RoCE v2 IPv4-mapped GID; IB: LID routing)
  // Send WRs per QP: at least the injection FIFO depth + 1 (the retire probe).
  std::uint32_t sq_depth = Param("AMI_VERBS_SQ_DEPTH").default_as<std::uint32_t>();
  std::uint32_t srq_depth = 0;    // receive buffers per context; 0: by the device's kind (see receive_shape())
  std::uint32_t cq_depth = 2048;  // lower bound; raised to what the queues need, up to the device's max_cqe
  // One signalled send WR in this many.
  std::uint32_t signal_interval = Param("AMI_VERBS_SIGNAL_INTERVAL").default_as<std::uint32_t>();
  // ring(): after a lane's first post since progress(), post this many at once.
  std::uint32_t doorbell_batch = Param("AMI_VERBS_DOORBELL_BATCH").default_as<std::uint32_t>();
  std::uint32_t bounce_bytes = 0;            // receive buffer size = largest packet; 0: by the device's kind
  std::optional<std::uint32_t> max_inline;   // unset: the most the device takes (probed at the first QP); 0: never inline
  ibv_mtu mtu_cap = IBV_MTU_4096;            // path MTU at most this (and the port's active MTU)
  std::optional<std::uint64_t> max_rdma;     // largest RDMA WRITE or READ per work request; unset: the port's max_msg_sz
  std::optional<bool> use_rdma_cm;           // true: rdma_cm; false: the handshake; unset: rdma_cm on RoCE
  bool immediate = Param("AMI_VERBS_IMMEDIATE").default_as<bool>();  // packets with a compact form go as SEND with immediate
  std::uint32_t staging_bytes = 64 * 1024;   // per lane: registered ring packet payloads are copied into (at least 2 x bounce_bytes)
  // rdma_cm: for all lanes to one peer; handshake: for one lane, from its
  // first request (retried with back-off) to the peer's answer.
  std::uint32_t connect_timeout_ms = Param("AMI_VERBS_CONNECT_TIMEOUT").default_as<std::uint32_t>();
  // Transport retries before IBV_WC_RETRY_EXC_ERR. 6 by default: soft-RoCE
  // takes 7 as "retry forever" (as the spec has it for rnr_retry only), so
  // a dead peer would never fail its lane there; 6 x 67 ms finds one in
  // about 0.5 s.
  std::uint8_t retry_count = Param("AMI_VERBS_RETRY_COUNT").default_as<std::uint8_t>();
  std::uint8_t rnr_retry = 7;                // 7: retry forever while the peer's SRQ is empty
  // Local ACK timeout, 4.096 us * 2^timeout.
  std::uint8_t timeout = Param("AMI_VERBS_TIMEOUT").default_as<std::uint8_t>();
  std::uint8_t min_rnr_timer = 12;           // 12: 0.64 ms between RNR retries
  std::uint8_t key_id = 2;                   // the registry's id of verbs (BackendSetup::id): its entry in keys

  // The rows' values; the table checked every value (ranges, "auto"), only
  // the types change here.
  static VerbsOptions from(const Config& c);
  bool operator==(const VerbsOptions&) const = default;
};

// verbs' entry of a remote key: the rkey (u32); its LocalKeys word: the lkey.
inline constexpr std::size_t kRkeyEntryBytes = sizeof(std::uint32_t);

inline std::array<std::byte, kRkeyEntryBytes> rkey_entry(std::uint32_t rkey) {
  std::array<std::byte, kRkeyEntryBytes> bytes;
  std::memcpy(bytes.data(), &rkey, sizeof rkey);
  return bytes;
}

// The rkey in key's verbs entry; false when it has none of the right size.
inline bool rkey_of(const RemoteKey& key, std::uint8_t id, std::uint32_t& rkey) {
  const KeyEntry* e = key.entry(id);
  if (e == nullptr || e->length != kRkeyEntryBytes) return false;
  std::memcpy(&rkey, e->bytes.data(), sizeof rkey);
  return true;
}

// What every queue pair and region is opened for (PortInfo::access() adds
// remote atomics where the device does them).
inline constexpr int kQpAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

// The port in use, as found at setup.
struct PortInfo {
  std::string device;
  std::uint8_t port = 0;
  std::uint8_t link_layer = IBV_LINK_LAYER_INFINIBAND;
  ibv_mtu active_mtu = IBV_MTU_1024;
  std::uint16_t lid = 0;
  int gid_index = 0;
  ibv_gid gid{};
  bool roce_v2 = false;
  std::uint32_t max_msg = 0;
  std::uint8_t responder_rd_atomic = 1;  // RDMA READs this task answers at once per QP
  std::uint8_t initiator_rd_atomic = 1;  // RDMA READs one QP issues at once
  std::uint32_t max_inline = 0;          // found at the first QP
  int max_cqe = 0;
  int max_qp_wr = 0;
  int max_srq_wr = 0;
  bool software = false;  // soft-RoCE or siw: the kernel's CPU does the NIC's work
  // The device's atomic_cap: NONE, HCA (atomic among the device's own
  // operations: rxe, most NICs) or GLOB (against the CPUs too).
  ibv_atomic_cap atomic_cap = IBV_ATOMIC_NONE;
  bool atomics() const { return atomic_cap != IBV_ATOMIC_NONE; }
  // What queue pairs and regions are opened for: remote atomics as well
  // where the device does them.
  int access() const { return atomics() ? kQpAccess | IBV_ACCESS_REMOTE_ATOMIC : kQpAccess; }
};

// What a task knows of a peer task from its published address: enough to
// address its port and check its connection messages.
struct PeerInfo {
  std::array<std::uint8_t, 16> gid{};
  std::uint64_t nonce = 0;         // what its connection messages carry
  std::uint32_t bounce_bytes = 0;  // the largest packet it receives
  std::uint16_t lid = 0;
  std::uint8_t mtu = 0;            // enum ibv_mtu: its port's active MTU
  std::uint8_t rd_atomic = 0;      // RDMA READs it answers at once per QP
  // connect() accepted its address: set last, with release, since under
  // addresses on demand a context's thread reads the rest once it sees it.
  std::atomic<bool> known{false};
};

// One lane's queue pair and where its connection stands.
struct Connection {
  enum class State : std::uint8_t {
    requesting,  // active: the QP is at INIT, the request is out
    accepted,    // passive: the QP is at RTS, the reply is out; nothing is
                 // sent until the requester says it is ready (or sends)
    ready,       // both sides at RTS: the lane posts
    failed,      // no answer in time, or a transition failed
  };
  QpOwner qp;
  std::uint32_t psn = 0;         // this side's first send PSN
  std::uint32_t remote_qpn = 0;  // the peer's QP, once known
  State state = State::requesting;
  bool active = true;            // this side asked (the other answered)
  std::uint16_t tries = 0;       // requests (or replies) sent
  std::int64_t next_try_ns = 0;  // when to send it again
  std::int64_t give_up_ns = 0;
  CmIdOwner cm_id;               // rdma_cm: the connection's id (the requester's, or the accepted one)
};

// One context's completion queue, shared receive queue, UD queue pair for
// the handshake (or rdma_cm channel) and the connections made so far.
struct ContextQueues {
  struct Route {
    std::uint32_t qpn;
    Endpoint peer;
  };

  CompChannelOwner channel;  // for blocking waits on the CQ
  CqOwner cq;
  int cqe = 0;  // the CQ's size: it grows with the queue pairs
  SrqOwner srq;
  PageBuffer receive_memory;  // srq_depth bounce buffers of bounce_bytes
  MrOwner receive_mr;
  std::vector<Route> routes;        // by qpn: whom a receive completion came from
  // Receive buffers the protocol is done with, re-posted in batches, and the
  // pre-linked work requests that post them.
  std::vector<std::uint32_t> to_repost;
  std::vector<ibv_recv_wr> recv_wr;
  std::vector<ibv_sge> recv_sge;
  std::uint32_t receives_posted = 0;
  // The handshake's UD queue pair, its buffers (receives, then sends) and
  // an address handle per peer task it has sent to.
  PageBuffer ud_memory;
  MrOwner ud_mr;
  std::unordered_map<std::uint32_t, AhOwner> ahs;
  std::uint32_t ud_sends_out = 0;   // sends not yet completed
  std::uint32_t ud_send_next = 0;   // the next send buffer
  QpOwner ud;
  // rdma_cm instead: the context's event channel, the id listening on its
  // port, and ids given up (a request that crossed the peer's), kept until
  // the domain goes; the connections' ids go before them.
  CmChannelOwner cm_channel;
  CmIdOwner cm_listener;
  std::uint16_t cm_port = 0;
  std::vector<CmIdOwner> cm_retired;
  // Last: their queue pairs go before the CQ and SRQ they use.
  std::unordered_map<std::uint32_t, Connection> connections;  // by peer task * contexts + peer context

  // (Inline for the last one found: a burst comes from one peer.)
  const Route* route(std::uint32_t qpn) const {
    if (recent_route != nullptr && recent_route->qpn == qpn) return recent_route;
    return find_route(qpn);
  }
  const Route* find_route(std::uint32_t qpn) const;
  void add_route(std::uint32_t qpn, Endpoint peer);
  void remove_route(std::uint32_t qpn);
  mutable const Route* recent_route = nullptr;  // into routes; reset when one is added
};

class CmConnector;

class VerbsDomain {
 public:
  // Throws ami::Error naming the failing ibverbs/rdma_cm call and errno's
  // text, or saying that there is no usable device or port.
  VerbsDomain(std::uint32_t task, std::uint32_t tasks, std::uint16_t contexts, const VerbsOptions& options,
              device::RegionTable& regions);
  ~VerbsDomain();
  VerbsDomain(const VerbsDomain&) = delete;
  VerbsDomain& operator=(const VerbsDomain&) = delete;

  // Is there an active port at all (among net_devices when given)? why says
  // what is missing when there is none.
  static bool available(std::string* why, const std::string& net_devices = {});
  // Device, port, link layer, MTU, GID index, inline size, connection method.
  std::string describe() const;

  // The bytes this task publishes through the bootstrap.
  std::vector<std::byte> local_address() const;
  // Learns the peer from its published bytes; its lanes connect on first
  // use, by either method. Malformed or mismatched bytes are a Status.
  Status connect(std::uint32_t peer_task, std::span<const std::byte> peer_address);

  // Registers [addr, addr + len) for local and remote access under the
  // region number of the task's region table; rkey goes into the
  // RemoteKey's verbs entry, lkey into its LocalKeys word.
  Status register_region(std::uint32_t region, void* addr, std::size_t len, std::uint32_t& lkey,
                         std::uint32_t& rkey);
  // Drops the registration of that region (none: nothing happens).
  void deregister_region(std::uint32_t region);
  // perftest's banner for the lane from context to peer, one "name : value"
  // line per field (device, port, link type, path MTU, GID index, inline
  // size, connection method), then LID, QPN, PSN and GID of each end.
  std::string describe_lane(std::uint16_t context, Endpoint peer) const;

  std::uint32_t task() const { return task_; }
  std::uint32_t tasks() const { return tasks_; }
  std::uint16_t contexts() const { return contexts_; }
  const VerbsOptions& options() const { return options_; }
  const PortInfo& port() const { return port_; }
  ConnectMethod method() const { return method_; }
  // rdma_cm's share (method() == rdma_cm only).
  const CmConnector& cm() const { return *cm_; }
  // The token this task's connection messages carry (published).
  std::uint64_t nonce() const { return nonce_; }
  device::RegionTable& regions() { return regions_; }
  ibv_context* device() const { return device_.get(); }
  ibv_pd* pd() const { return pd_.get(); }
  // connect() accepted the peer: lanes to it can be made.
  bool knows(std::uint32_t peer) const {
    return peer < peers_.size() && peers_[peer].known.load(std::memory_order_acquire);
  }
  // Asks the Client about a task not known yet (addresses on demand): true
  // once it is known. Blocks while the address is fetched.
  bool learn_on_demand(std::uint32_t peer) {
    return knows(peer) || (directory_ != nullptr && peer < tasks_ && directory_->learn(peer).empty() && knows(peer));
  }
  void set_directory(device::PeerDirectory* directory) { directory_ = directory; }
  const PeerInfo& peer(std::uint32_t task) const { return peers_[task]; }
  // Where the peer context takes connection requests: its UD queue pair
  // (handshake) or its rdma_cm port.
  std::uint32_t peer_ud_qpn(Endpoint peer) const { return peer_rendezvous_[lane_index(peer)]; }
  std::uint16_t peer_cm_port(Endpoint peer) const {
    return static_cast<std::uint16_t>(peer_rendezvous_[lane_index(peer)]);
  }
  // Largest packet both ends of a lane to peer take.
  std::uint32_t max_packet(std::uint32_t peer) const;
  ContextQueues& queues(std::uint16_t context) { return *queues_[context]; }
  // The QP of context that reaches peer (diagnostics and tests), or nullptr
  // while there is none.
  ibv_qp* qp(std::uint16_t context, Endpoint peer) const;
  std::size_t lane_index(Endpoint peer) const { return std::size_t{peer.task} * contexts_ + peer.context; }

  // A new RC queue pair at INIT for the lane from context to peer, with its
  // route and room on the CQ: called by the context's device. Throws
  // ami::Error naming the failing call.
  Connection& new_connection(std::uint16_t context, Endpoint peer, bool active);
  // A new queue pair at INIT in place of c's, which asked and was never
  // connected (rdma_cm: a request that crossed the peer's; the connection
  // manager would take the old one's number, named in the refused request,
  // for a stale connection). Not counted as one more. Throws ami::Error.
  void renew_queue_pair(Connection& c, std::uint16_t context, Endpoint peer);
  // Brings c's queue pair to RTR towards the peer's QP and then to RTS;
  // 0 or an errno value (logged).
  // The queue pair to RTR and RTS towards itself (a context's atomic
  // loopback: this task's own port as the peer). 0 or the errno.
  int connect_loopback(Connection& c);
  int connect_queue_pair(Connection& c, Endpoint peer, std::uint32_t remote_qpn, std::uint32_t remote_psn);
  // The address handle of the peer task's port for context's UD sends,
  // made on first use; nullptr (logged) when it cannot be made.
  ibv_ah* address_handle(std::uint16_t context, std::uint32_t peer_task);
  // RC queue pairs made since setup, over every context (one renewed in
  // place of another counts once).
  std::uint64_t queue_pairs_made() const { return queue_pairs_made_.load(std::memory_order_relaxed); }

 private:
  friend class CmConnector;
  struct Region {
    std::uint32_t region;
    MrOwner mr;
  };

  // setup (verbs_setup.cpp)
  std::unique_ptr<ContextQueues> make_queues();
  void make_ud(ContextQueues& q);
  QpOwner make_qp(ContextQueues& q);
  void grow_cq(ContextQueues& q, std::uint16_t context);
  // connection (verbs_connect.cpp)
  Status check_peer(std::uint32_t peer_task, const DomainAddress& a) const;
  void learn(std::uint32_t peer_task, const DomainAddress& a);

  std::uint32_t task_;
  std::uint32_t tasks_;
  std::uint16_t contexts_;
  VerbsOptions options_;
  device::RegionTable& regions_;
  PortInfo port_;
  ConnectMethod method_ = ConnectMethod::handshake;
  bool inline_known_ = false;  // port_.max_inline found (by the first QP)
  // Creation order: destruction runs queues (QP, SRQ, CQ) -> MRs -> PD -> device.
  DeviceOwner device_;
  PdOwner pd_;
  std::vector<Region> region_mrs_;
  std::vector<std::unique_ptr<ContextQueues>> queues_;
  std::vector<PeerInfo> peers_;
  device::PeerDirectory* directory_ = nullptr;  // the Client's
  std::vector<std::uint32_t> peer_rendezvous_;  // by lane index: peer_ud_qpn() or peer_cm_port()
  std::uint64_t nonce_ = 0;
  std::atomic<std::uint64_t> queue_pairs_made_{0};
  std::unique_ptr<CmConnector> cm_;
};

// Posts every buffer in q.to_repost to the SRQ in one chain (verbs_datapath.cpp).
int post_receives(ContextQueues& q, std::uint32_t bounce_bytes);
// Posts the handshake's receive buffer to q's UD queue pair (verbs_setup.cpp).
// Both return 0 or an errno value.
int post_handshake_receive(ContextQueues& q, std::uint32_t buffer);

}  // namespace ami::verbs
