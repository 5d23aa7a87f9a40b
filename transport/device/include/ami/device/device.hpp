// ami/device/device.hpp — the contract between protocol engines and backends.
//
// A Device is one backend's share of one context: it reaches some peers,
// owns one Lane per peer it talks to, and makes progress when asked. A Lane
// is an ordered path to one peer context whose injection FIFO the protocol
// fills; the device consumes the descriptors in order, advances the FIFO's
// transfer counter, and delivers arriving packets to the PacketSink. The
// device never interprets packet bytes, and the protocol never touches a
// queue pair or a shared segment. Not thread-safe: the context's advancing
// thread drives both sides.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "ami/callback.hpp"
#include "ami/device/descriptor.hpp"
#include "ami/device/injection_fifo.hpp"

namespace ami::device {

// Receives every packet the device takes off the wire; bytes are valid only
// during the call and are untrusted.
class PacketSink {
 public:
  virtual void on_packet(Endpoint origin, std::span<const std::byte> bytes) = 0;
  // A packet sent in its compact form (PacketDescriptor::compact_prefix):
  // rest is what followed the prefix, immediate stands for the prefix.
  virtual void on_compact_packet(Endpoint origin, std::uint32_t immediate, std::span<const std::byte> rest) = 0;
  // The lane to peer broke for good (its process died, its QP went into
  // error): called once, inside progress(), after the device completed
  // every descriptor still in the lane's FIFO with an error. why names it.
  virtual void on_lane_failed(Endpoint peer, Status why) = 0;
  // The device dropped an arrival of its own traffic (shm: a ring-copy PUT
  // or GET cell) from an origin it has no lane back to, so it can neither
  // serve nor answer it. (Packets from such an origin still go to
  // on_packet(): another device may reach it.) For the sink to count.
  virtual void on_unknown_origin(Endpoint origin) { (void)origin; }

 protected:
  ~PacketSink() = default;
};

class Lane {
 public:
  using Fifo = InjectionFifo<Descriptor>;

  Lane(Endpoint peer, std::uint32_t fifo_depth) : peer_(peer), fifo_(fifo_depth) {}
  virtual ~Lane() = default;
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  Endpoint peer() const { return peer_; }
  Fifo& fifo() { return fifo_; }

  // Largest packet (inline bytes plus referenced payload) the lane carries.
  virtual std::size_t max_packet() const = 0;
  // Delivers in injection order (a single RC QP or ring does).
  virtual bool ordered() const { return true; }
  // Longest PUT or GET one descriptor may carry (the port's largest message
  // on verbs); the protocol cuts longer rendezvous transfers into pieces.
  virtual std::uint64_t max_rdma() const { return ~std::uint64_t{0}; }
  // The backend's estimate of the message size above which moving the rest
  // of a message by GET or PUT beats more eager packets through the bounce
  // path on this lane. An input of the receiver's stop policy.
  virtual std::uint64_t rdma_crossover() const { return std::uint64_t{64} << 10; }
  // A GET by the receiver brings a message's rest sooner than a PUT by its
  // sender: where a PUT must wait for the target's word that it is placed
  // before the fin may follow (an unordered lane), a GET is done when its
  // data is in. The receiver's stop policy then prefers a GET (AMI_RNDV_MODE
  // auto).
  virtual bool get_beats_put() const { return false; }
  // A GET brings a stopped message's rest for less than the eager packets
  // still on their way: each of those is copied through bounce buffers at
  // both ends, a GET is one copy (rxm over tcp). The receiver's stop policy
  // then drops the late packets and GETs the whole rest (AMI_RNDV_MODE auto).
  virtual bool get_beats_eager() const { return false; }
  // The peer competes with others for this host's CPUs (more tasks here
  // than CPUs online): work that needs the peer's CPU, as its PUT of a
  // stopped message's rest, waits until the scheduler runs it. The
  // receiver's stop policy then has it GET the rest alone (AMI_RNDV_MODE
  // auto).
  virtual bool oversubscribed() const { return false; }
  // Where packets leave at once (shm: into the peer's ring), a packet is
  // done before the peer has read it, so completions cannot pace a message
  // the receiver is expected to stop: true while the peer has not yet
  // taken much of what this lane's device put in its way. The engine then
  // holds such a message's later eager packets until it has (or the stop
  // came). False where completions pace (the default).
  virtual bool backlogged() const { return false; }
  // Whether an atomic (op, type) on key's region may go as a
  // DescriptorKind::atomic on this lane (the device carries it out itself,
  // in the region's atomic domain: docs/DESIGN.md, "Remote atomics");
  // false: the engine sends it as a message the target executes. A device
  // says yes only where it works in the key's domain (CPU: self, shm on a
  // mapping; NIC: verbs), so that every path to a word ends in the same
  // hardware; within the NIC domain the answer may depend on the operation
  // (a NIC does some natively, the owner's engine the rest through its
  // NIC). A device that answers false never sees the kind, and fails a
  // slot of it with not_supported. (Not const: a device may map the region
  // to decide.)
  virtual bool offloads_atomic(const RemoteKey& key, AtomicOp op, AtomicType type) {
    (void)key;
    (void)op;
    (void)type;
    return false;
  }
  // The same atomic done in the call, for Context::atomic_now(): asked only
  // when nothing is outstanding on the lane, so it overtakes nothing.
  // Returns not_supported exactly where offloads_atomic(a.remote) says no
  // (the engine then sends it as a message); otherwise the verdict: ok,
  // with the old value in a.result, or why the word was refused (as the
  // descriptor would have failed).
  virtual Status atomic_in_place(const AtomicRef& a) {
    (void)a;
    return {StatusCode::not_supported, "atomic: this lane does no atomic itself"};
  }
  // Doorbell: descriptors up to fifo().injected() are committed. A device
  // may hold back all but the first since its last progress() or flush(),
  // to post them in one batch; flush() posts them.
  virtual void ring() = 0;
  // A whole packet in its compact form (PacketDescriptor::compact_prefix),
  // given as the bytes after the prefix (head, then payload) and the
  // immediate: a device may send it at once, without a descriptor of it,
  // when nothing waits before it on the lane. It then takes the packet's
  // FIFO slot itself (with no callback: the transfer counter passes it as
  // any other), rings, and returns true; both spans are free on return.
  // false: nothing was done, the caller injects a descriptor. Worth a try
  // only where sends_compact() says so.
  virtual bool send_compact(std::uint32_t immediate, std::span<const std::byte> head,
                            std::span<const std::byte> payload) {
    (void)immediate;
    (void)head;
    (void)payload;
    return false;
  }
  bool sends_compact() const { return sends_compact_; }

 protected:
  bool sends_compact_ = false;  // set by a device whose send_compact() can take packets

 private:
  Endpoint peer_;
  Fifo fifo_;
};

class Device {
 public:
  virtual ~Device() = default;

  virtual std::string_view name() const = 0;
  // The registry's id of its backend (BackendSetup::id): the entry of a
  // RemoteKey and the word of LocalKeys it reads. The engine hands a peer
  // only that entry of a key (a rendezvous names its buffer with it), since
  // the peer reaches the buffer through the same backend.
  virtual std::uint8_t key_id() const = 0;
  virtual bool can_reach(Endpoint peer) const = 0;
  // The lane to peer, made on first use; nullptr when it cannot be made.
  virtual Lane* lane(Endpoint peer) = 0;
  // Moves descriptors and counters, and hands up to budget arrivals to sink.
  // Returns how much work was done (0: idle).
  virtual std::size_t progress(PacketSink& sink, std::size_t budget) = 0;
  // false while progress() cannot find anything (a device that only hears
  // through lanes of its own, and has none yet): the engine does not poll
  // it, and asks again each time it makes a lane.
  virtual bool wants_progress() const { return true; }
  // How much of the context's reception buffers (queue cells, posted receive
  // buffers) is in use, in percent: an input of the receiver's stop policy.
  virtual unsigned reception_load() const { return 0; }
  // Hands back to the peers every reception resource consumed so far (ring
  // cells, receive buffers) that the device holds back to return in
  // batches. The engine calls it once in a lull that follows an arrival
  // (a packet handed to the sink), and before it sleeps; a device also
  // returns credit by itself once a batch is full, so none waits on it.
  // Returns how much was returned.
  virtual std::size_t return_credit() { return 0; }
  // Posts what ring() held back for a batch. The engine calls it as its
  // advance() ends, when a lane rang since the last call: what a handler or
  // the engine committed inside advance() is posted before it returns, what
  // the user committed between two advances by the next one at the latest.
  virtual void flush() {}
  // The peer is known to have ended by other means (its bootstrap
  // connection closed): the device breaks its lane as if it had found it
  // broken itself — what the FIFO holds fails and the sink hears
  // on_lane_failed from a later progress(), after what the peer sent before
  // it ended. false when the device has no lane to it or cannot: the engine
  // then fails the peer itself.
  virtual bool abandon(Endpoint peer, Status why) {
    (void)peer;
    (void)why;
    return false;
  }
  // A lane from this context to itself through the NIC, on which the
  // owner's engine does the atomics that reach a NIC-domain region of its
  // own as messages (docs/DESIGN.md, "Remote atomics"): its
  // offloads_atomic() takes at least 64-bit compare_swap on such a region.
  // Made on first call; nullptr where the device has no NIC atomics. It
  // carries nothing else, and its breaking is no peer's failure.
  virtual Lane* atomic_loopback() { return nullptr; }

  // Sleeping (docs/DESIGN.md, "Event-driven progress"). Neither has a
  // default: a backend says how its device wakes a sleeping context, or
  // that it cannot, or it does not compile.
  //
  // Descriptors, fixed for the device's life, that become readable when
  // progress() has work after arm() said ok. The context watches them (one
  // epoll set) beside its own. Empty for a device whose arrivals are
  // another's to announce.
  virtual std::span<const int> wake_fds() const = 0;
  // The context is about to sleep: progress() found nothing and what is
  // held back for a lull went out (return_credit(), flush()). The device
  // reads its descriptors back to quiet, asks to be woken, and then looks
  // once more, so that nothing that came in between is slept through.
  //  - ok: armed; one of wake_fds() becomes readable when work comes;
  //  - busy: work is here (or came meanwhile): progress() first;
  //  - not_supported: this device cannot wake a sleeper; the text says why.
  // Never blocks.
  virtual Status arm() = 0;
  // arm() when the context has just seen every descriptor of wake_fds()
  // quiet (its set had nothing to report): a device may skip reading them
  // back, since a read would find nothing. The same answers as arm();
  // by default arm() itself.
  virtual Status arm_quiet() { return arm(); }
};

}  // namespace ami::device
