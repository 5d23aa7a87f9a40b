// fabric_backend/ofi_device.hpp — one context's share of the libfabric
// backend: a Lane per peer context (an fi_addr_t of the context's AV), the
// context's endpoint, CQ, counter and multi-receive buffers.
//
// The lane's injection FIFO slots are the operations' contexts: slot n's
// descriptor becomes one fi_sendmsg (a packet), fi_writemsg (a PUT) or
// fi_readmsg (a GET), whose op_context is the slot's OpContext (a
// fi_context2 for the provider, then the lane and n).
//
// Completion is selective (docs/DESIGN.md, method 1): an operation asks for
// a CQ entry (FI_COMPLETION) only when a callback waits for it or a buffer
// is held until it completes — every PUT and GET, every packet larger than
// the provider's inject size. The rest are injected, done when the call
// returns, and only counted by the endpoint's fi_cntr. The provider
// completes out of order, so the lane keeps a reorder window: a slot is
// marked done when its entry comes, and the transfer counter moves over the
// run of done slots at its front, so it stays per lane and in order.
//
// Where the provider may complete receives out of order, packets carry a
// sequence header (ofi_wire.hpp) and the receiver puts each origin's packets
// back in the order sent; elsewhere they carry nothing of the backend's but
// the CQ data. Receives land in FI_MULTI_RECV buffers, each
// re-posted once the provider released it (FI_MULTI_RECV in an entry).
//
// Bundles: a lane's first ring() of a burst (since the last progress() or
// flush()) posts at once, so a lone message leaves now; later rings hold
// their descriptors back until AMI_OFI_BUNDLE are ready, or until flush()
// (the end of the context's advance()) or progress(). Consecutive small packets among them are then copied
// into one staging packet and go as one send (kBundle, ofi_wire.hpp): one
// provider call, and on verbs;ofi_rxm one doorbell (a system call on
// soft-RoCE), for all of them, as the verbs backend chains its work
// requests. A bundle is at most a packet (max_packet_), or the provider's
// inject size where that is 4 KiB or more (shm injects up to 4 KiB and
// takes a slower path, CMA, above); a packet joins one when at least two
// such fit. The bundle's operation context stands for its slots: its
// completion completes them all.
//
// -FI_EAGAIN (rxm connecting, a full queue) leaves the descriptor in the
// FIFO, and progress() posts it again. A CQ error entry breaks its lane:
// its FIFO fails and the sink hears on_lane_failed, as on verbs.
//
// No allocation, system call (beyond the provider's) or lock per message.
// Not thread-safe: the context's advancing thread drives it.
#pragma once

#include <rdma/fi_endpoint.h>
#include <rdma/fi_rma.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <vector>

#include "ami/device/device.hpp"
#include "ami/device/pages.hpp"
#include "ofi_fabric.hpp"
#include "ofi_wire.hpp"

namespace ami::ofi {

class OfiLane;

// An operation's context. fi first: under FI_CONTEXT the provider owns it
// while the operation is in flight.
struct OpContext {
  fi_context2 fi{};
  OfiLane* lane = nullptr;  // nullptr: a receive buffer
  std::uint64_t n = 0;      // the slot's injection number, or the receive buffer's index
  std::uint32_t count = 1;  // slots n, n + 1, ... the operation completes (a bundle's packets)
};

class OfiDevice;

class OfiLane final : public device::Lane {
 public:
  OfiLane(OfiDevice& device, Endpoint peer, fi_addr_t address, std::uint32_t fifo_depth);

  std::size_t max_packet() const override;
  bool ordered() const override;
  // Unordered: a PUT asks for FI_DELIVERY_COMPLETE, a round trip more
  // (1 MiB ping-pongs over tcp;ofi_rxm: 120 us by GET, 138 by PUT). Not on
  // shm, whose PUT above the inject size is one CMA copy by the target and
  // complete only once that is done anyway, while its GET is a copy
  // through the provider's bounce buffers (SAR), during which the provider
  // refuses everything else to that peer (-FI_EAGAIN), split_get's second
  // GET and the acks among them: 1 MiB ping-pongs by split_get took 108-127
  // us, or 450-560 in 2 runs of 3 and of 8, by stop_put 73-90 every time
  // (fi_pingpong 85-113); 4 MiB 325-1745 against 318-632. (Streams of 1 MiB
  // moved 2.5-8.5 GB/s against 11.3-12.2; of 4 MiB 14.2-15.1 against
  // 13.2-13.7.)
  bool get_beats_put() const override;
  // rxm over a core other than verbs (tcp): an eager packet is copied into
  // rxm's bounce buffer, by the kernel through the socket into the peer's,
  // and out of that into a multi-receive buffer; a GET's bytes go from the
  // sender's buffer through the socket straight into the receiver's. With
  // the rest of a stopped message all by GET, late eager packets dropped
  // (tcp;ofi_rxm, interleaved rounds against stop_put, medians): 1 MiB
  // ping-pongs 270-352 against 365-478 us, 256 KiB 117 against 140; streams
  // of 1 MiB 3299 against 2321 MiB/s, of 256 KiB 1518 against 1295. (split_get,
  // which keeps them, streamed 2228.) Not on shm, where the same comparison
  // gave no steady answer, nor on verbs, whose GET is the NIC's.
  bool get_beats_eager() const override;
  // Over verbs (rxm) each packet is a send of its own, and one GET, the
  // NIC's RDMA READ, moves the rest of anything longer than two: 64 KiB
  // streams over verbs;ofi_rxm on rxe moved 2.5x as much stopped (as 8 KiB
  // packets they moved 0.6x what ami's verbs backend does). Elsewhere the
  // default: over tcp a GET is the peer's copy too, and 32-64 KiB
  // ping-pongs took 8-15% longer stopped at two packets.
  std::uint64_t rdma_crossover() const override;
  std::uint64_t max_rdma() const override;
  // Posts every committed descriptor it can; never runs callbacks.
  void ring() override;
  bool send_compact(std::uint32_t immediate, std::span<const std::byte> head,
                    std::span<const std::byte> payload) override;

  bool broken() const { return broken_; }
  std::uint64_t posted() const { return posted_; }

 private:
  friend class OfiDevice;

  OfiDevice& device_;
  fi_addr_t address_;
  std::unique_ptr<OpContext[]> ops_;              // per slot
  std::unique_ptr<std::uint8_t[]> done_;          // per slot: its operation completed
  std::unique_ptr<std::int32_t[]> staging_;       // per slot: the staging packet it holds, or -1
  std::unique_ptr<SequenceHeader[]> headers_;     // per slot: a packet's sequence header is sent from here
  std::unique_ptr<Status[]> refused_status_;      // per slot: why the device refused it
  std::vector<std::uint64_t> refused_;            // slots to fail in their turn, oldest first
  std::uint64_t posted_ = 0;   // descriptors below this went to the provider (or were refused)
  std::uint64_t retired_ = 0;  // the transfer counter: every slot below is done
  std::uint16_t seq_ = 0;      // the next sequenced packet's number
  std::uint64_t rung_epoch_ = 0;  // the device's ring_epoch_ at its last ring() that posted
  std::uint64_t stall_mark_ = 0;    // retired_ when the stall watch last looked
  std::int64_t stall_since_ = 0;    // since when retired_ has stayed there with operations outstanding
  bool broken_ = false;
  bool reported_ = false;  // the sink has heard it broke
  Status failure_;
};

class OfiDevice final : public device::Device {
 public:
  // fifo_depth: a power of two. Throws ami::Error.
  OfiDevice(OfiFabric& fabric, std::uint16_t context, std::uint32_t fifo_depth);
  // Waits a moment for what is in flight (the endpoint's counter), then
  // closes the endpoint before the lanes whose slots the provider held.
  ~OfiDevice() override;

  std::string_view name() const override { return "ofi"; }
  std::uint8_t key_id() const override { return key_id_; }
  bool can_reach(Endpoint peer) const override;
  device::Lane* lane(Endpoint peer) override;
  bool abandon(Endpoint peer, Status why) override;
  std::size_t progress(device::PacketSink& sink, std::size_t budget) override;
  // Posts what ring() held back for a bundle, and starts a new burst.
  void flush() override;
  // Sleeping (docs/DESIGN.md, "Event-driven progress"): on the CQ's wait
  // descriptor, where the provider gives one (not shm: arm() then says
  // not_supported). Every operation that does not complete at its call
  // asks for a CQ entry, so the CQ's descriptor is all that wakes a sleeper.
  std::span<const int> wake_fds() const override;
  Status arm() override;
  // How far behind the context is: the packets this progress() has taken
  // so far, against kBacklogFull (the provider holds what ami has not
  // read yet, so the backlog is the pressure ami can see), or the
  // multi-receive buffers not posted again, whichever is higher.
  unsigned reception_load() const override;
  static constexpr std::size_t kBacklogFull = 32;

  struct Counters {
    std::uint64_t packets_sent = 0;
    std::uint64_t compact_sent = 0;     // with the short header in the CQ data
    std::uint64_t bundles_sent = 0;     // sends that carried several packets (counted in packets_sent)
    std::uint64_t bundled = 0;          // packets sent in them
    std::uint64_t injected = 0;         // done at the call: no CQ entry asked for
    std::uint64_t rdma_posted = 0;      // PUTs and GETs
    std::uint64_t entries = 0;          // CQ entries read
    std::uint64_t again = 0;            // -FI_EAGAIN from a post: tried again later
    std::uint64_t staging_stalls = 0;   // no staging packet free (FI_MR_LOCAL)
    std::uint64_t refused = 0;          // descriptors refused before the wire
    std::uint64_t timed_out = 0;        // operations failed by the stall watch
    std::uint64_t packets_received = 0;
    std::uint64_t bundles_received = 0;  // (their packets are counted in packets_received)
    std::uint64_t reordered = 0;        // packets held until an earlier one of their origin came
    std::uint64_t dropped = 0;          // from no known origin, malformed, or a sequence already seen
    std::uint64_t receive_errors = 0;
    std::uint64_t receives_posted = 0;  // multi-receive buffers posted, first ones included
    std::uint64_t rescues = 0;          // rescue receives posted (a multi-receive buffer refused: ENOMEM)
  };
  const Counters& counters() const { return counters_; }

 private:
  friend class OfiLane;
  enum class Step { posted, wait, failed };

  struct Held {
    std::uint16_t seq;
    std::uint32_t flags;  // the CQ data's (kFlags)
    std::uint32_t immediate;
    std::vector<std::byte> bytes;  // after the header
  };
  // What a peer context sent: the next sequence number due, and packets
  // that came before it.
  struct Inbound {
    std::uint16_t expected = 0;
    std::vector<Held> held;
  };

  // data path (ofi_datapath.cpp)
  void ring(OfiLane& lane);
  void post(OfiLane& lane);
  void post_held();
  Step post_one(OfiLane& lane, std::uint64_t n);
  Step send_packet(OfiLane& lane, std::uint64_t n, const device::PacketDescriptor& p);
  bool bundleable(const device::Descriptor& d) const;
  std::uint32_t bundle_run(OfiLane& lane, std::uint64_t end) const;
  Step send_bundle(OfiLane& lane, std::uint64_t first, std::uint32_t count);
  void complete(OpContext& op);
  bool send_compact(OfiLane& lane, std::uint32_t immediate, std::span<const std::byte> head,
                    std::span<const std::byte> payload);
  ssize_t inject_data(const iovec* iov, std::size_t count, std::size_t total, fi_addr_t to, std::uint64_t data);
  Step rdma(OfiLane& lane, std::uint64_t n, const device::RdmaDescriptor& x, bool put);
  void refuse(OfiLane& lane, std::uint64_t n, Status why);
  void fail_later(OfiLane& lane, std::uint64_t n, Status why);
  void mark_done(OfiLane& lane, std::uint64_t n);
  void post_failed(OfiLane& lane, const char* call, long rc);
  void break_lane(OfiLane& lane, Status why);
  void on_entry(const fi_cq_data_entry& e, device::PacketSink& sink);
  void on_error();
  void on_packet(std::uint64_t data, const std::byte* bytes, std::size_t length, device::PacketSink& sink);
  void deliver(Endpoint origin, std::uint32_t flags, std::uint32_t immediate, std::span<const std::byte> rest,
               device::PacketSink& sink);
  void deliver_bundle(Endpoint origin, std::span<const std::byte> rest, device::PacketSink& sink);
  Inbound* inbound(Endpoint origin);
  void post_receive(std::uint32_t buffer);
  void post_rescue();
  void repost_receives();
  void release_staging(OfiLane& lane, std::uint64_t n);
  std::size_t tend(device::PacketSink& sink);
  void watch_stalls();

  OfiFabric& fabric_;
  ContextEndpoint& ep_;
  std::uint16_t context_;
  std::uint32_t fifo_depth_;
  std::uint8_t key_id_;
  std::uint64_t origin_;  // this context's origin word, the low half of every packet's CQ data
  bool compact_;          // 8 bytes of CQ data: the short header may travel there
  bool sequenced_;        // packets carry a SequenceHeader (the provider may complete receives out of order)
  // Packets flagged await_delivery ask for FI_DELIVERY_COMPLETE. Not on
  // shm: libfabric 1.17's shm answers such a send through the sender's
  // region under its lock, and a sender killed while it held that lock
  // left the receiver spinning in fi_cq_read for good (1 in 6 kill -9
  // tests under load; none in 8 without).
  bool delivery_complete_;
  bool mr_local_;
  bool virt_addr_;
  std::size_t inject_;
  std::uint32_t max_packet_;
  std::uint32_t bundle_max_;     // packets a bundle may hold (AMI_OFI_BUNDLE); 1: no bundles
  std::size_t bundle_bytes_;     // bytes a bundle may hold after its sequence header, lengths included
  std::uint64_t ring_epoch_ = 1;  // bursts: + 1 at every progress() and flush()
  bool held_ = false;             // ring() held descriptors back since

  // Receive buffers, page-aligned (see the constructor).
  std::uint64_t recv_bytes_;
  device::PageBuffer recv_memory_;
  FiOwner<fid_mr> recv_mr_;
  void* recv_desc_ = nullptr;
  std::unique_ptr<OpContext[]> recv_ops_;
  std::vector<std::uint32_t> to_repost_;
  // One packet's receive (no FI_MULTI_RECV) after the buffers, posted while
  // the provider refuses a multi-receive buffer for want of receive entries
  // (see post_rescue()).
  std::byte* rescue_memory_ = nullptr;
  OpContext rescue_op_;
  bool rescue_posted_ = false;
  // Staging packets: under FI_MR_LOCAL every packet's (then registered,
  // max_packet_ + kHeaderBytes each), elsewhere the bundles' (bundle_bytes_
  // + kHeaderBytes each).
  std::size_t staging_bytes_ = 0;
  std::unique_ptr<std::byte[]> staging_memory_;
  FiOwner<fid_mr> staging_mr_;
  void* staging_desc_ = nullptr;
  std::vector<std::int32_t> staging_free_;

  std::vector<std::unique_ptr<std::unique_ptr<OfiLane>[]>> lanes_;  // by peer task, then its context
  std::vector<OfiLane*> active_;                                     // lanes made so far
  std::vector<std::unique_ptr<Inbound[]>> inbound_;                  // by peer task, then its context
  std::size_t backlog_ = 0;       // packets taken by the current progress()
  std::uint32_t polls_ = 0;       // progress() calls, for the stall watch's period
  std::uint64_t ops_posted_ = 0;  // operations given to the provider: the counter's target when quiet
  bool tending_ = false;          // some lane has something to post, fail or report
  std::size_t broken_lanes_ = 0;  // not yet reported to the sink
  Counters counters_;
};

}  // namespace ami::ofi
