// protocol/am/eager/am_engine.hpp — active messages, PUT and GET over the device
// contract, for one context; with the receiver-stopped rendezvous (docs/DESIGN.md,
// method 2) for messages longer than one packet.
//
// The engine owns the per-peer state, the dispatch table, the request pool
// and the pool of stopped messages being received. Every endpoint of the
// job has a small record (its lane, its failure, a pointer to the rest);
// the rest (work queue of requests, control packets waiting for a FIFO
// slot, the message whose eager packets are arriving from that peer, the
// answers owed to it and awaited from it) is made with the peer's lane, the
// first time the two talk, so a job of tens of thousands of tasks costs a
// context a few dozen bytes for each peer it never talks to. Eager packets
// of one message go out back to back on the peer's lane, so a receiver
// reassembles at most one eager stream per origin at a time; a stopped
// message leaves that stream and completes by GET or PUT while the next one
// streams. Nothing here knows what device is underneath. Not thread-safe
// (see context.hpp).
//
// The rendezvous, as it runs here:
//  sender    send(): registers the buffer (or uses SendParams::memory) and
//            streams eager packets from offset 0 (of growing size when the
//            receiver is expected to stop it), the first carrying the
//            buffer's key. The request lives until the
//            receiver's ack (or, after a stop_put, until its fin went out).
//  receiver  runs rndv::decide() at each eager packet. Not stopped: when the
//            last byte is in, done runs and an ack goes back. Stopped:
//             discard_get — GETs [0, total), drops later eager packets, acks;
//             split_get   — GETs the bottom half of what is missing at once,
//                           keeps eager packets, and on the sender's cts
//                           (eager bytes E) GETs [E, bottom), then acks;
//             stop_put    — sends its buffer's key; the sender PUTs [E, total)
//                           and, once the PUT completed, sends fin. A rest
//                           of rndv::kSplitMin or more is shared: the stop
//                           says where the PUT ends (P, about half-way), the
//                           receiver GETs [P, total) at once, and acks once
//                           both are in.
//  Every stop is answered by a cts or fin, which follows the message's last
//  eager packet on the lane, so the receiver knows when no more will come.
//
// What the engine owes a peer (acks, stops, cts, fin with its PUT, GETs,
// keepalives) is a Control: a variant of one item per kind, visited
// without a fallback, so a new item that some step does not handle does
// not compile; header_of() alone maps items onto the fixed wire header.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <variant>
#include <vector>

#include "ami/device/device.hpp"
#include "ami/device/peer_directory.hpp"
#include "ami/device/region_table.hpp"
#include "ami/device/registrar.hpp"
#include "ami/dispatch.hpp"
#include "ami/params.hpp"
#include "ami/stats.hpp"
#include "ack/ack_dispatcher.hpp"
#include "packet_build.hpp"
#include "protocol_config.hpp"
#include "request_pool.hpp"
#include "rndv/policy.hpp"
#include "wire/packet.hpp"

namespace ami::protocol {

// Lambdas as one visitor for std::visit: an alternative that none of them
// takes does not compile.
template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
// (Spelt out for compilers without C++20's deduction for aggregates.)
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

class AmEngine final : public device::PacketSink {
 public:
  struct Shape {
    std::uint32_t tasks = 1;
    std::uint16_t contexts = 1;  // per task
    Options options;             // the protocol's settings (protocol_config.hpp)
  };

  AmEngine(Shape shape, ContextStats& stats);
  const Shape& shape() const { return shape_; }

  // Devices in priority order; the first that can reach a peer carries it.
  void add_device(device::Device& device) {
    devices_.push_back(&device);
    find_polled();
  }
  // Without a registrar only buffers given with their Memory can be stopped.
  void set_registrar(device::Registrar* registrar) { registrar_ = registrar; }
  // Where a task no device reaches yet is looked up (addresses learnt on
  // first use); null when every address was learnt at start.
  void set_directory(device::PeerDirectory* directory) { directory_ = directory; }
  // The task's registrations, against which an atomic that arrives as a
  // message is checked; without them every such atomic is refused.
  void set_regions(const device::RegionTable* regions) { regions_ = regions; }

  Status set_dispatch(std::uint16_t id, Dispatch dispatch);
  Status send(const SendParams& p);
  // (Inline, below: a small message's whole path from the caller to the
  // device's ring().)
  Status send_immediate(const SendImmediateParams& p);
  Status accept(std::uint64_t id, std::byte* buffer, Callback done, const Memory* memory);
  Status fence(Endpoint dest, Callback done);
  Status fence_all(Callback done);
  // work runs (with ok) in a later advance(), in the order posted.
  Status post(Callback work);
  void set_fence_handler(FenceHandler handler) { fence_handler_ = handler; }
  void set_error_handler(PeerErrorHandler handler) { error_handler_ = handler; }
  void watch_peer_failures(PeerErrorHandler watcher);
  void unwatch_peer_failures(PeerErrorHandler watcher);
  Status peer_status(Endpoint dest) const;
  // The peer at e is known to have ended by other means (its bootstrap
  // connection closed): its device breaks the lane and reports it in order,
  // or, with no lane, the peer fails now.
  void abandon_peer(Endpoint e, Status why);
  // Packets that came from e so far (0 for an endpoint out of range).
  std::uint64_t heard(Endpoint e) const;
  // peer_failed (naming the call) when dest's peer has failed, else ok.
  Status check_alive(Endpoint dest, const char* failed) const;
  // local/local_keys: the checked local range of p.local, and its keys.
  Status rdma(device::DescriptorKind kind, const RdmaParams& p, std::byte* local,
              const LocalKeys& local_keys);
  // p is checked (Context::atomic); am_atomic.cpp.
  Status atomic(const AtomicParams& p);
  // ok: done in the call; in_progress: posted as atomic() posts it.
  Status atomic_now(const AtomicParams& p);

  std::size_t immediate_limit(Endpoint dest);
  // Acks this context sent to dest's origin, and messages they covered.
  AckPeerStats ack_stats(Endpoint dest) const;
  std::string_view backend_for(Endpoint dest);
  std::size_t advance();
  // Before the context sleeps (docs/DESIGN.md, "Event-driven progress"),
  // since a sleeping context makes no idle advances: what waits for a lull
  // goes now (acks, reception credit, doorbell batches), and a keepalive
  // round if one is due. Returns how much went.
  std::size_t prepare_sleep();
  // Whether advance() has work of its own before the context may sleep:
  // posted work, requests to settle, control packets to send, callbacks due.
  bool has_pending_work();
  // When advance() must run again even if nothing arrives (the next
  // keepalive round, coarse clock ns); 0: never.
  std::int64_t next_deadline_ns() const;

  // What the engine keeps for each endpoint of the job, talked to or not,
  // and what one it has talked to costs (before its queues grow). In a
  // large job a context pays the first for nearly every peer.
  static constexpr std::size_t idle_peer_bytes() { return sizeof(Peer); }
  static constexpr std::size_t active_peer_bytes() { return sizeof(Peer) + sizeof(PeerState); }

  void on_packet(Endpoint origin, std::span<const std::byte> bytes) override;
  void on_compact_packet(Endpoint origin, std::uint32_t immediate, std::span<const std::byte> rest) override;
  void on_lane_failed(Endpoint peer, Status why) override;
  void on_unknown_origin(Endpoint origin) override;

 private:
  // A stopped message at its receiver, until every byte is in place and the
  // sender's cts or fin has come.
  struct Inbound {
    bool live = false;
    std::uint32_t index = 0;
    std::uint32_t generation = 0;
    AmEngine* engine = nullptr;
    std::uint32_t peer = 0;
    std::uint64_t message_id = 0;  // the sender's
    std::uint64_t ack_seq = 0;     // the sender's ack sequence number for it
    std::uint64_t total = 0;
    std::byte* buffer = nullptr;   // null: the data is discarded
    Callback done;
    bool wants_remote_done = false;
    bool answer_soon = false;  // the sender asked for its ack when done (wire::kAnswerSoon)
    std::uint16_t answer_flags = 0;
    wire::StopMode mode = wire::StopMode::discard_get;
    wire::RendezvousInfo source{};  // the sender's buffer
    device::Registration registration{};
    bool owns_registration = false;
    std::uint32_t gets_pending = 0;
    std::uint64_t bottom = 0;       // split_get, a shared stop_put: the first GET covers [bottom, total)
    bool split = false;             // a stop_put shared with a GET of [bottom, total): acked
    bool end_seen = false;          // the cts or fin came
    bool eager_all = false;         // kept eager packets brought every byte (the sender had sent them all)
    bool in_place = false;          // every byte is in place (done ran)
    bool waiting = false;           // deferred by its handler; accept() not called yet
    Status failure;
    std::uint64_t id() const { return pool_id(index, generation); }
  };
  // The message whose eager packets are arriving from one origin.
  struct Reassembly {
    bool active = false;
    std::uint64_t message_id = 0;
    std::uint64_t ack_seq = 0;
    std::uint64_t total = 0;
    std::uint64_t received = 0;
    std::byte* buffer = nullptr;
    Callback done;
    bool wants_remote_done = false;
    bool answer_soon = false;  // the sender asked for its ack when done (wire::kAnswerSoon)
    std::uint16_t answer_flags = 0;  // ack flags owed when it completes
    bool rndv = false;               // the sender waits for an ack, and the message may be stopped
    bool zero_copy = false;
    const Memory* memory = nullptr;
    Deferred* defer = nullptr;       // the handler deferred it
    PieceFn piece = nullptr;         // the handler takes it in pieces
    void* piece_cookie = nullptr;
    wire::RendezvousInfo source{};
    Inbound* stopped = nullptr;      // set once stopped: later eager packets belong to it
    bool stop_refused = false;       // a stop failed: it goes on eagerly (still acked)
  };
  // What the engine owes a peer, sent before the peer's queued instructions:
  // one item per kind, each field meaning what its name says. The fixed
  // wire header's fields carry them differently by packet type: header_of()
  // (am_engine.cpp) is the one place that maps them.
  struct AckItem {  // receiver: the messages [first, first + count) of the ack sequence are done
    std::uint16_t flags = 0;  // their common outcome
    std::uint64_t first = 0;
    std::uint64_t count = 0;
  };
  struct GetItem {  // receiver: not a packet but a GET of [offset, offset + length) of the message
    Inbound* in = nullptr;
    std::uint64_t offset = 0;
    std::uint64_t length = 0;
  };
  struct StopItem {  // receiver: stop sending message_id eagerly
    wire::StopMode mode = wire::StopMode::discard_get;
    std::uint64_t message_id = 0;   // the sender's id
    std::uint64_t receiver_id = 0;  // the receiver's id for it
    std::uint64_t total = 0;        // the message's length; stop_put: where the sender's PUT ends
    wire::RendezvousInfo info{};    // stop_put: the receive buffer
  };
  struct CtsItem {  // sender's answer to a GET stop
    std::uint64_t receiver_id = 0;
    std::uint64_t sent = 0;    // eager bytes sent (all of them are ahead of this packet)
    std::uint64_t total = 0;
    Request* owner = nullptr;  // its local completion rides here when the stop cut it short
  };
  struct FinItem {  // sender's answer to a stop_put: the PUT of [cursor, end), then the packet
    // The PUT still to inject, or injected and not complete.
    enum class Put : std::uint8_t { done, pending, in_flight };
    std::uint64_t receiver_id = 0;
    std::uint64_t sent = 0;  // eager bytes sent
    std::uint64_t total = 0;
    Request* owner = nullptr;  // as a cts's
    std::uint64_t cursor = 0;  // the next byte to PUT
    std::uint64_t end = 0;     // where the PUT ends (the receiver GETs the rest)
    Put put = Put::done;
    std::uint16_t flags = 0;   // kFailed: a piece of the PUT failed
    wire::RendezvousInfo target{};
  };
  struct KeepaliveItem {};
  struct AtomicReplyItem {  // target: the atomic request_id was done (or refused)
    std::uint64_t request_id = 0;  // the origin's
    std::uint64_t old = 0;
    wire::AtomicRefusal refusal = wire::AtomicRefusal::none;
  };
  using Control = std::variant<AckItem, GetItem, StopItem, CtsItem, FinItem, KeepaliveItem, AtomicReplyItem>;
  // Sender side: the requests that wait for an ack from one peer, in the
  // order of their ack sequence numbers (doubly linked through Request).
  struct Unanswered {
    Request* head = nullptr;
    Request* tail = nullptr;
    std::uint64_t next_seq = 1;  // the next message wanting an answer gets this
  };
  // What a peer needs once the two talk: made with its lane (make_lane()),
  // so every path that reaches it through a lane finds it, and kept as long
  // as the engine.
  struct PeerState {
    PeerState(Endpoint e, std::uint32_t index) : endpoint(e), acks(index) {}
    Endpoint endpoint;
    device::Device* device = nullptr;  // the one that carries the lane
    Request* head = nullptr;  // work queue: instructions waiting for FIFO slots
    Request* tail = nullptr;
    std::vector<Control> controls;  // waiting for a FIFO slot, in order
    Reassembly rx;
    Unanswered unanswered;
    Unanswered atomics;             // atomics sent as messages, waiting for their reply (no seq)
    AckDispatcher::Origin acks;     // answers owed to it, for the ack dispatcher
    std::uint64_t heard = 0;        // packets that came from it
    std::uint64_t heard_at_probe = 0;
    std::uint64_t last_get = 0;     // FIFO position after the newest GET injected on the lane
    std::uint32_t immediate = 0;    // immediate_limit() to it
    bool busy = false;
    // An atomic the lane's device does on a NIC-domain word waits while one
    // sent to this peer as a packet is unanswered: the owner's NIC may still
    // be doing that one. (A CPU-domain word takes one path from a lane, and
    // the owner does its packets in lane order.)
    bool offloaded_must_wait(const RemoteKey& key) const {
      return key.atomics == AtomicDomain::nic && atomics.head != nullptr;
    }
  };
  // Every endpoint of the job has one, talked to or not: what a send and an
  // arrival test first (lane, failure), and the rest when there is any.
  // A peer has its state exactly when it has a lane.
  struct Peer {
    device::Lane* lane = nullptr;
    std::unique_ptr<PeerState> state;
    Status failure;  // not ok once the peer failed: nothing more goes to it
  };

  // setup and lookup
  // (inline: every packet and every send asks both)
  Peer* peer_for(Endpoint e) {
    if (e.task >= shape_.tasks || e.context >= shape_.contexts) return nullptr;
    return &peers_[std::size_t{e.task} * shape_.contexts + e.context];
  }
  std::uint32_t index_of(const Peer& peer) const { return static_cast<std::uint32_t>(&peer - peers_.data()); }
  Endpoint endpoint_of(const Peer& peer) const {
    const std::uint32_t i = index_of(peer);
    return {i / shape_.contexts, static_cast<std::uint16_t>(i % shape_.contexts)};
  }
  device::Lane* lane_for(Peer& peer) { return peer.lane != nullptr ? peer.lane : make_lane(peer); }
  // Makes the peer's lane and, with it, its state.
  device::Lane* make_lane(Peer& peer);
  void find_polled();  // polled_: the devices whose wants_progress() says so
  // Every ring() goes through here: advance() flushes the devices only
  // after one (a device holds work requests back only in ring()).
  void ring(device::Lane& lane) {
    rung_ = true;
    lane.ring();
  }
  Status check_send(const SendParams& p) const;
  Status refuse_immediate(const SendImmediateParams& p);
  Status inject_immediate(device::Lane& lane, const SendImmediateParams& p);
  Request* acquire();
  void mark_busy(Peer& peer);
  void enqueue(Peer& peer, Request& r);

  // sending (am_engine.cpp)
  bool inject_send(Peer& peer, Request& r);
  // The pacing of a stoppable message's eager packets (am_engine.cpp): how
  // many of the lane's descriptors injected since its first packet the lane
  // has not passed yet.
  static std::uint64_t eager_in_flight(device::Lane& lane, const Request& r);
  static void on_eager_paced(void*, Status) {}
  bool inject_rdma(Peer& peer, Request& r);
  bool inject_control(Peer& peer, Control& c);
  void inject_get(Peer& peer, device::Descriptor& d, const GetItem& g);
  void inject_put(Peer& peer, device::Descriptor& d, FinItem& f);
  void inject_packet(Peer& peer, device::Descriptor& d, const wire::PacketHeader& h, Request* owner,
                     const wire::RendezvousInfo* info = nullptr);
  // Each control packet's fixed header: which header field carries which
  // of the item's fields.
  static wire::PacketHeader header_of(const AckItem& a);
  static wire::PacketHeader header_of(const StopItem& s);
  static wire::PacketHeader header_of(const CtsItem& c);
  static wire::PacketHeader header_of(const FinItem& f);
  static wire::PacketHeader header_of(const KeepaliveItem& k);
  static wire::PacketHeader header_of(const AtomicReplyItem& a);
  // The owner's share of a NIC-domain region's atomics (am_atomic.cpp):
  // one that arrived as a packet, done through the NIC on the atomic
  // loopback, natively or by a loop of compare-and-swaps on its 64-bit
  // word; the reply goes when the NIC is done.
  struct NicAtomic {
    AmEngine* engine = nullptr;
    Peer* origin = nullptr;
    std::uint64_t request_id = 0;  // the origin's
    AtomicOp op = AtomicOp::fetch_add;
    AtomicType type = AtomicType::u64;
    std::uint64_t operand = 0;
    std::uint64_t compare = 0;
    std::uint64_t word = 0;  // the aligned 64-bit word holding the target
    unsigned shift = 0;      // where a 32-bit target sits in it: 0 or 32
    std::uint64_t guess = 0; // what the loop believes the word holds
    std::uint64_t old = 0;   // what the NIC found there
    RemoteKey home{};        // the region's own key
    NicAtomic* next_free = nullptr;
  };
  void start_nic_atomic(Peer& origin, std::uint64_t request_id, AtomicOp op, AtomicType type,
                        std::uint64_t address, const wire::AtomicArgs& args, const RemoteKey& home);
  bool post_nic_step(NicAtomic& j);
  bool nic_turn(const NicAtomic& j) const;
  static void on_nic_step(void* cookie, Status s);
  void finish_nic_atomic(NicAtomic& j, wire::AtomicRefusal refusal, std::uint64_t old);
  std::size_t post_nic_waiting();
  device::Lane* nic_loopback();
  bool inject_fence(Peer& peer, Request& r);
  static void on_child_fence(void* cookie, Status s);
  void on_fence(Peer& peer, const wire::PacketView& v);
  std::size_t service(Peer& peer);
  std::size_t service_busy();
  std::size_t run_deferred();  // posted work, accepted and ready requests
  void push_control(Peer& peer, const Control& c);
  static void on_send_local(void* cookie, Status s);
  void settle(Request& r);
  void register_send(Request& r, const SendParams& p);

  // receiving (am_receive.cpp)
  // A decoded packet from origin, whatever form it came in.
  void handle(Endpoint origin, const wire::PacketView& v);
  // The peer a packet came from, counted; nullptr: the packet is dropped
  // (counted as malformed, as from a failed peer, or as from one this
  // context has no lane to; see from_unknown_peer()).
  // (Inline for the common case, a live peer with a lane: every packet.)
  Peer* admit(Endpoint origin) {
    Peer* peer = peer_for(origin);
    if (peer == nullptr || peer->lane == nullptr || !peer->failure.ok()) return admit_other(origin);
    ++peer->state->heard;
    ++stats_.packets_received;
    return peer;
  }
  Peer* admit_other(Endpoint origin);
  // Something came from peer by a backend with no lane back to it.
  void from_unknown_peer(Peer& peer);
  // A new message from peer: what it had going ends (see on_first()).
  void begin_message(Peer& peer) {
    const Reassembly& rx = peer.state->rx;
    if (rx.active || rx.stopped != nullptr) end_previous(peer);
  }
  void end_previous(Peer& peer);
  // A message that came whole to its handler, then its answer if it wants
  // one (seq != 0), at once when soon; false when no handler has its
  // dispatch id.
  bool deliver_whole(Peer& peer, std::uint16_t dispatch, std::span<const std::byte> user_header,
                     std::span<const std::byte> payload, std::uint64_t seq, bool wants_answer, bool soon);
  // The handler of a dispatch id; an id beyond the table names none (an
  // unknown one).
  Dispatch handler_for(std::uint16_t id) const { return id < kMaxDispatch ? dispatch_[id] : Dispatch{}; }
  void on_first(Peer& peer, const wire::PacketView& v);
  [[gnu::noinline]] void on_first_long(Peer& peer, const wire::PacketView& v, bool rndv);
  void on_more(Peer& peer, const wire::PacketView& v);
  void on_ack(Peer& peer, const wire::PacketView& v);
  void answer(Request& r, std::uint16_t flags);
  void complete_rx(Peer& peer, Status s);
  // Hands a message that wants an answer to the ack dispatcher.
  // urgent: answered now, with what the peer's queue holds (a fence).
  void ack(Peer& peer, std::uint64_t ack_seq, std::uint16_t flags, bool remote_done, bool urgent = false);
  void emit_ack(std::uint32_t peer, const AckDispatcher::Range& range);
  // Sender: r's first packet (or fence) goes out now and wants an answer.
  std::uint64_t expect_answer(Peer& peer, Request& r);
  void forget_answer(Request& r);
  void count_malformed(std::size_t reason);

  // peer failure (am_failure.cpp)
  void fail_peer(Peer& peer, Status why);
  // Fails what the peer's state holds: its queues, answers and messages.
  void fail_work(Peer& peer, Status why);
  void keepalive();
  void maybe_keepalive(std::int64_t now_ns);  // every 64th advance() (it reads the clock), and before sleeping
  // How far behind the precise clock prepare_sleep() allows the coarse one
  // to be (a tick is 1-4 ms; a loaded machine delays ticks by several).
  static constexpr std::int64_t kCoarseLagNs = 50'000'000;
  // Reception credit back to every polled device (shm ring cells, verbs
  // receives), in a lull or before sleeping; how much went.
  std::size_t return_credit();
  // What ring() held back for a batch goes out (call when rung_).
  void flush_rung();

  // remote atomics (am_atomic.cpp)
  Status post_atomic(Peer& peer, const AtomicParams& p);  // atomic() to a known peer
  bool inject_atomic(Peer& peer, Request& r);
  void on_atomic(Peer& peer, const wire::PacketView& v);
  void on_atomic_reply(Peer& peer, const wire::PacketView& v);
  // Links r into / out of the list of replies it waits for (the peer's
  // acks, or its atomics).
  Unanswered& list_of(const Request& r) {
    PeerState& s = *peers_[r.peer].state;
    return r.kind == Request::Kind::atomic ? s.atomics : s.unanswered;
  }

  // the rendezvous (am_rndv.cpp)
  void consider_stop(Peer& peer);
  bool stop(Peer& peer, const rndv::Decision& d);
  Status take_registration(Inbound& in, const Memory* memory);
  void get(Peer& peer, Inbound& in, std::uint64_t offset, std::uint64_t bytes);
  static void on_get_done(void* cookie, Status s);
  static void on_put_done(void* cookie, Status s);
  void on_stop(Peer& peer, const wire::PacketView& v);
  void on_end(Peer& peer, const wire::PacketView& v);
  void check_inbound(Inbound& in);

  // Does [first, first + bytes) lie inside m (a live registration)?
  static bool inside(const Memory* m, const std::byte* first, std::uint64_t bytes) {
    if (m == nullptr || !m->valid()) return false;
    const auto* base = static_cast<const std::byte*>(m->address());
    return first >= base && m->covers(static_cast<std::uint64_t>(first - base), bytes);
  }
  // Registration::handle of a buffer the user registered (SendParams::memory,
  // Receive::memory): used, never released.
  static constexpr std::uint32_t kBorrowed = ~std::uint32_t{0};

  Shape shape_;
  ContextStats& stats_;
  device::Registrar* registrar_ = nullptr;
  device::PeerDirectory* directory_ = nullptr;
  const device::RegionTable* regions_ = nullptr;
  std::vector<device::Device*> devices_;
  std::vector<device::Device*> polled_;  // those advance() polls, flushes, asks for credit
  std::vector<Peer> peers_;           // by task * contexts + context; never resized
  std::vector<device::Lane*> lanes_;  // every lane made so far
  std::vector<Peer*> busy_;           // (room for every peer with a lane: mark_busy() never allocates)
  std::array<Dispatch, kMaxDispatch> dispatch_{};
  RequestPool pool_;
  IdPool<Inbound> inbound_;            // AMI_MAX_REQUESTS of them
  AckDispatcher acks_;
  std::vector<Inbound*> accepted_;     // accepted with nothing to fetch: done runs in advance()
  std::vector<Request*> ready_;        // finished inside a post call: settled in advance()
  std::vector<Callback> posted_;       // Context::post(): run in advance()
  std::vector<Callback> running_;      // the posted work advance() is running (more may be posted meanwhile)
  FenceHandler fence_handler_{};
  PeerErrorHandler error_handler_{};
  std::vector<PeerErrorHandler> watchers_;  // layers above, told before the error handler
  std::vector<Peer*> reached_;         // peers with a lane (and state), in the order they got it
  std::vector<std::unique_ptr<NicAtomic>> nic_all_;  // every NicAtomic made (reused)
  NicAtomic* nic_free_ = nullptr;
  std::deque<NicAtomic*> nic_waiting_;  // in arrival order, for their turn (post_nic_waiting())
  std::uint32_t nic_in_flight_ = 0;     // jobs on the loopback
  bool nic_loop_in_flight_ = false;     // one of them is a compare-and-swap loop
  device::Lane* nic_lane_ = nullptr;    // the atomic loopback, once found
  static constexpr std::size_t kKeepaliveBatch = 128;  // peers probed per round at most
  std::size_t keepalive_cursor_ = 0;
  std::uint32_t advances_ = 0;
  bool rung_ = false;  // a lane rang since the devices were last flushed
  bool credit_owed_ = false;  // a packet arrived since the last lull's return_credit()
  // When the next keepalive round is due (coarse clock ns): 0 until the
  // first look sets the schedule; never with keepalives off.
  std::int64_t next_keepalive_ns_ = 0;
};

// The common case costs one test per condition and builds no Status;
// refuse_immediate() names what failed (or makes the peer's first lane).
inline Status AmEngine::send_immediate(const SendImmediateParams& p) {
  Peer* peer = peer_for(p.dest);
  if (peer == nullptr || peer->lane == nullptr || !peer->failure.ok() || peer->state->head != nullptr ||
      p.dispatch >= kMaxDispatch || p.header.size() > wire::kMaxUserHeader ||
      p.header.size() + p.payload.size() > peer->state->immediate ||
      (p.header.data() == nullptr && !p.header.empty()) || (p.payload.data() == nullptr && !p.payload.empty()))
    return refuse_immediate(p);
  return inject_immediate(*peer->lane, p);
}

// A lane that sends the compact form (SEND with immediate) may take the
// message's parts straight to the wire; else it goes as a descriptor.
inline Status AmEngine::inject_immediate(device::Lane& lane, const SendImmediateParams& p) {
  if (!lane.sends_compact() ||
      !lane.send_compact(wire::compact_short(p.dispatch, static_cast<std::uint16_t>(p.header.size())), p.header,
                         p.payload)) {
    device::Descriptor* d = lane.fifo().try_reserve();
    if (d == nullptr) return {StatusCode::no_resource, "send_immediate: injection FIFO is full"};
    build_short(*d, p.dispatch, p.header, p.payload);
    lane.fifo().commit();
    ring(lane);
  }
  ++stats_.messages_sent;
  ++stats_.packets_sent;
  stats_.bytes_sent += p.payload.size();
  return Status::success();
}

}  // namespace ami::protocol
