// verbs_backend/verbs_device.hpp — one context's share of the verbs backend:
// a Lane per peer context (one RC queue pair), the context's CQ and SRQ.
//
// The lane's injection FIFO is the send queue: each committed descriptor
// becomes one work request, posted by ring() (a burst in chains: see
// VerbsDevice::ring), or by progress(). A packet is a SEND (inline
// when it fits the device's max_inline; otherwise its header goes from the
// descriptor itself, the FIFO's slots being registered, and its payload is
// copied into the lane's registered staging ring), a PUT an RDMA WRITE
// (inline too when it fits), a GET an RDMA READ.
//
// Completion is selective signalling (docs/DESIGN.md, method 1): only every
// signal_interval-th WR is signalled, plus the one that leaves the FIFO
// without a free slot, every GET (its data is what its callback waits for)
// one after which a quarter of the staging ring waits on unsignalled WRs,
// and a WR posted alone while no signalled one is in flight (ping-pong
// traffic: its completion is what lets the next one be signalled too). An RC send queue completes in order, so the CQE of WR n (wr_id: lane,
// injection number) advances the lane's transfer counter to n + 1 and
// retires every unsignalled WR before it. A run left unsignalled when the lane goes quiet (nothing posted
// between two progress() calls while callbacks wait) is retired by one
// signalled zero-length RDMA WRITE, the retire probe; the send queue keeps
// one slot for it (sq_depth >= FIFO depth + 1).
//
// Errors: the first error completion breaks the lane for good: WRs before it
// completed, so their callbacks run with success; it and everything after
// it, and everything committed later, fail with its status (peer_failed for
// retry and flush errors). Descriptors the device must refuse (a range
// outside the remote key, a packet over max_packet()) become signalled
// zero-length writes whose completion fails just that descriptor.
//
// Connection on first use (verbs_handshake.hpp): lane() makes the lane and
// its queue pair and sends the request; until the peer has answered, ring()
// posts nothing and what the lane is given waits in its FIFO, posted by the
// progress() that completes the handshake. A lane whose connection fails
// breaks as below.
//
// Receives: the context's SRQ holds srq_depth buffers of bounce_bytes; a
// receive completion's bytes go to PacketSink::on_packet with the origin
// found from the QP number, never from the bytes; buffers are re-posted in
// batches. An empty SRQ makes the sender retry (RNR): nothing is lost.
//
// No allocation, system call (beyond ibv_post_send/ibv_poll_cq) or lock per
// message: WRs and SGEs are pre-linked per lane, receive WRs per context.
// Not thread-safe: the context's advancing thread drives it.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "ami/device/device.hpp"
#include "verbs_domain.hpp"
#include "verbs_handshake.hpp"

namespace ami::verbs {

class VerbsDevice;

class VerbsLane final : public device::Lane {
 public:
  VerbsLane(VerbsDevice& device, Endpoint peer, std::uint32_t index, ibv_qp* qp, std::uint32_t fifo_depth,
            std::size_t max_packet);

  std::size_t max_packet() const override { return max_packet_; }
  // An RDMA READ costs a round trip but no copy on either side; every
  // bounce buffer is one copy at each end.
  std::uint64_t rdma_crossover() const override { return std::uint64_t{32} << 10; }
  std::uint64_t max_rdma() const override;
  // Posts every committed descriptor it can (the staging ring may hold some
  // back until completions free it); never runs callbacks.
  void ring() override;
  // A SEND with immediate of inline bytes, posted at once (the first of a
  // burst on a lane with nothing unposted); see device::Lane.
  bool send_compact(std::uint32_t immediate, std::span<const std::byte> head,
                    std::span<const std::byte> payload) override;
  // 64-bit fetch_add, add and compare_swap on a NIC-domain region, as an
  // IBV_WR_ATOMIC_* (docs/DESIGN.md, "Remote atomics"); every other atomic
  // goes to the owner's engine.
  bool offloads_atomic(const RemoteKey& key, AtomicOp op, AtomicType type) override;

  ibv_qp* qp() const { return qp_; }
  bool broken() const { return broken_; }
  bool ready() const { return ready_; }
  std::uint64_t posted() const { return posted_; }

 private:
  friend class VerbsDevice;
  static constexpr std::uint32_t kPostBatch = 32;

  std::byte* stage(std::uint32_t bytes);

  VerbsDevice& device_;
  ibv_qp* qp_;
  std::uint32_t index_;  // peer task * contexts + peer context
  std::size_t max_packet_;
  MrOwner slots_mr_;  // the FIFO's descriptors: packet headers are sent from there
  PageBuffer staging_;
  MrOwner staging_mr_;
  std::uint64_t staging_size_;
  std::uint64_t staging_head_ = 0;                // bytes ever handed out
  std::uint64_t staging_tail_ = 0;                // bytes ever freed (by completions)
  std::uint64_t staging_signalled_ = 0;           // staging_head_ at the newest signalled WR
  std::unique_ptr<std::uint64_t[]> staging_end_;  // per FIFO slot: staging_head_ after its WR
  std::unique_ptr<Status[]> refused_;             // per FIFO slot: why the device refused it
  std::unique_ptr<void*[]> results_;              // per FIFO slot: an atomic's caller's buffer, or nullptr
  std::uint32_t atomics_in_flight_ = 0;           // slots whose results_ entry is set
  bool loopback_ = false;                         // to its own context (atomic_loopback()): no peer's lane
  std::uint64_t posted_ = 0;                      // descriptors below this are on the send queue
  std::uint64_t retire_target_ = 0;               // the counter value the newest signalled WR brings
  std::uint64_t seen_posted_ = 0;                 // posted_ at the previous progress(): equal means quiet
  std::uint32_t unsignalled_ = 0;                 // WRs since the last signalled one
  bool probe_outstanding_ = false;
  std::uint64_t rung_epoch_ = 0;  // the device's ring_epoch_ when ring() last posted
  bool ready_ = false;     // the queue pair is connected: posting may start
  bool broken_ = false;
  bool reported_ = false;  // the sink has heard it broke
  Status failure_;
  std::array<ibv_send_wr, kPostBatch> wr_{};
  std::array<ibv_sge, 2 * kPostBatch> sge_{};
};

class VerbsDevice final : public device::Device {
 public:
  // fifo_depth: a power of two, at most sq_depth - 1. Throws ami::Error.
  VerbsDevice(VerbsDomain& domain, std::uint16_t context, std::uint32_t fifo_depth);
  ~VerbsDevice() override;

  std::string_view name() const override { return "verbs"; }
  std::uint8_t key_id() const override { return key_id_; }
  bool can_reach(Endpoint peer) const override;
  device::Lane* lane(Endpoint peer) override;
  bool abandon(Endpoint peer, Status why) override;
  // A queue pair connected to itself (verbs_device.cpp), where the device
  // does atomics: the owner's share of its NIC-domain regions' atomics.
  device::Lane* atomic_loopback() override;
  std::size_t progress(device::PacketSink& sink, std::size_t budget) override;
  // Receive buffers not posted (being handled or waiting to be re-posted).
  unsigned reception_load() const override;
  // Reposts every consumed receive buffer (not only full batches).
  std::size_t return_credit() override;
  void flush() override;

  // Sleeping (docs/DESIGN.md, "Event-driven progress"): the completion
  // channel (and with rdma_cm its event channel) wake the context. arm()
  // takes the channel's events (acknowledged in batches), asks for the next
  // (ibv_req_notify_cq) and polls the CQ once more: completions found then
  // are kept for the next progress(), and it says busy. Busy too while a
  // handshake, a lane to tend or a broken lane needs progress() anyway.
  std::span<const int> wake_fds() const override { return {wake_fds_.data(), wake_count_}; }
  Status arm() override;
  int completion_fd() const { return queues_.channel->fd; }
  // Takes one event off the completion channel, if there is one.
  void consume_event();
  // Channel events taken and not yet acknowledged (ibv_ack_cq_events).
  unsigned unacked_events() const { return unacked_events_; }

  struct Counters {
    std::uint64_t send_completions = 0;  // send CQEs polled (each retires a run)
    std::uint64_t signalled = 0;         // WRs posted signalled (probes included)
    std::uint64_t probes = 0;            // retire probes posted
    std::uint64_t lone_signalled = 0;    // lone WRs signalled (ping-pong), included in signalled
    std::uint64_t refused = 0;           // descriptors refused before the wire
    std::uint64_t compact_sent = 0;      // packets sent in their compact form (SEND with immediate)
    std::uint64_t compact_direct = 0;    // of those, by send_compact(): no descriptor, posted at once
    std::uint64_t packets_received = 0;
    std::uint64_t receive_errors = 0;
    std::uint64_t dropped = 0;  // receive completions from an unknown QP, or not for a SEND
    std::uint64_t receives_reposted = 0;
    std::uint64_t staging_stalls = 0;  // ring() stopped by a full staging ring
    std::uint64_t handshakes_sent = 0;
    std::uint64_t handshakes_received = 0;
    std::uint64_t handshakes_dropped = 0;  // malformed, or not from a task of the job
    std::uint64_t handshakes_unsent = 0;   // no free send buffer: the timer sends it again
    std::uint64_t connections_ready = 0;
  };
  const Counters& counters() const { return counters_; }
  std::uint32_t receives_posted() const { return queues_.receives_posted; }

 private:
  friend class VerbsLane;
  // data path (verbs_datapath.cpp)
  void ring(VerbsLane& lane);
  void post_waiting();
  void post(VerbsLane& lane);
  void post_one(VerbsLane& lane);
  void post_lone(VerbsLane& lane, ibv_send_wr& wr);
  bool prepare(VerbsLane& lane, std::uint64_t n, ibv_send_wr& wr, ibv_sge* sge);
  void choose_signal(VerbsLane& lane, std::uint64_t n, ibv_send_wr& wr, bool signal);
  bool send_compact(VerbsLane& lane, std::uint32_t immediate, std::span<const std::byte> head,
                    std::span<const std::byte> payload);
  void refuse(VerbsLane& lane, std::uint64_t n, ibv_send_wr& wr, Status why);
  void mark_signalled(VerbsLane& lane, ibv_send_wr& wr, std::uint64_t n);
  void post_probe(VerbsLane& lane);
  void post_failed(VerbsLane& lane, const char* call, int rc);  // breaks the lane
  void on_send_completion(const ibv_wc& wc);
  void on_receive_completion(const ibv_wc& wc, device::PacketSink& sink);
  // progress() once its first poll found something, or a lane needs tending.
  std::size_t progress_rest(device::PacketSink& sink, std::size_t budget, ibv_wc* wc, int n);
  void retire(VerbsLane& lane, std::uint64_t counter);
  void land_atomics(VerbsLane& lane, std::uint64_t counter);
  void break_lane(VerbsLane& lane, std::uint64_t first_failed, Status status, const ibv_wc* wc);
  std::size_t tend_lanes();
  void replenish();
  // connection on first use (verbs_handshake.cpp)
  Connection* connection(std::size_t index);
  void start_request(Connection& c, Endpoint peer);
  void send_handshake(Handshake::Type type, Endpoint peer, const Connection& c);
  void on_handshake(const ibv_wc& wc);
  void repost_handshake(std::uint32_t buffer);
  void on_handshake_message(const Handshake& m);
  void accept(Connection& c, Endpoint peer, const Handshake& m);
  void connection_ready(Connection& c, Endpoint peer);
  void connection_failed(Connection& c, Endpoint peer, Status why);
  void fail_unconnected(VerbsLane& lane, Status why);
  void heard_on(Endpoint peer);
  std::size_t tend_handshakes();
  // the same through rdma_cm (verbs_cm.cpp)
  void cm_request(Connection& c, Endpoint peer);
  std::size_t poll_cm();
  CmIdOwner on_cm_event(rdma_cm_event& e);
  CmIdOwner on_cm_request(rdma_cm_event& e);
  int up_from_cm(ibv_qp* qp, rdma_cm_id* id) const;
  bool renew(Connection& c, Endpoint peer);

  VerbsDomain& domain_;
  ContextQueues& queues_;
  std::uint16_t context_;
  std::uint32_t fifo_depth_;
  std::uint32_t repost_batch_;
  std::uint32_t doorbell_batch_;
  // The options and port facts prepare() reads, kept at hand.
  bool immediate_;
  std::uint8_t key_id_;  // the entry of remote keys and the LocalKeys word that are verbs'

  std::uint32_t max_inline_ = 0;
  std::uint32_t signal_interval_;
  std::uint64_t ring_epoch_ = 1;  // + 1 at every progress() and flush(): a new burst
  bool held_ = false;             // ring() held a descriptor back since then
  bool tending_ = false;          // some lane may need tend_lanes() (see there)
  std::vector<std::unique_ptr<VerbsLane>> lanes_;  // by peer task * contexts + peer context
  // Lanes made so far; reserved for all, so a callback that makes a lane
  // while the list is being walked never moves it.
  std::vector<VerbsLane*> active_;
  VerbsLane* loopback_ = nullptr;        // atomic_loopback(), once made (in lanes_, at this context's index)
  bool loopback_failed_ = false;        // it could not be made: not tried again
  std::size_t broken_lanes_ = 0;  // not yet reported to the sink
  std::uint32_t ud_qpn_;          // completions on it are the handshake's (none with rdma_cm: ~0)
  std::uint32_t handshakes_ = 0;  // connections requesting or accepted: progress() tends them
  std::int64_t next_handshake_ns_ = INT64_MAX;
  const bool cm_;                    // connections by rdma_cm: its channel is read in progress()
  std::int64_t next_cm_poll_ns_ = 0;  // when an idle context reads it next
  Counters counters_;
  // Sleeping.
  static constexpr int kPollBatch = 16;
  static constexpr unsigned kAckBatch = 64;  // channel events per ibv_ack_cq_events (it takes a lock)
  std::array<int, 2> wake_fds_{-1, -1};
  std::size_t wake_count_ = 0;
  unsigned unacked_events_ = 0;
  ibv_wc stash_[kPollBatch];  // what arm()'s last look found, for the next progress()
  int stashed_ = 0;
};

}  // namespace ami::verbs
