// ami/context.hpp — a context: a partition of the client's resources with
// its own work queue, advanced by one thread at a time.
//
// Owned by its Client; references stay valid for the Client's life. A
// reference kept past it still names an object: every call on it then
// returns invalid_argument ("context used after its client was destroyed"),
// 0 or nothing (advance, immediate_limit, stats, describe_lane), and
// client() throws ami::Error. post
// calls (send, send_immediate, put, get, atomic) and advance() are not thread-safe:
// one thread drives a context at a time, which lock()/try_lock() arrange
// when threads share one. Two contexts share no queue, so two threads on two
// contexts never contend. Callbacks run only inside advance().
//
// When an injection FIFO is full:
//  - send(), put(), get() and atomic() queue the instruction in the context's work
//    queue (a request from a pool sized by AMI_MAX_REQUESTS) and return ok;
//    queued instructions go out in order, before later ones to the same
//    endpoint, as advance() frees slots. Only an exhausted pool makes them
//    return no_resource.
//  - send_immediate() never queues: it returns no_resource, and the caller
//    advances and retries.
//
// After fork() a context belongs to the process that made its client. In a
// child every call on it that returns a Status returns not_supported
// ("send: this process was forked from the one that made the Client ..."),
// advance() returns 0 without looking at any ring or queue (the parent
// handles what arrives), immediate_limit() returns 0, backend_for() and
// describe_lane() nothing, and the setters do nothing; stats() and
// ack_stats() read the child's copy, and lock()/try_lock()/unlock() work on
// it. The parent goes on untouched; a Client made in the child works.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "ami/callback.hpp"
#include "ami/dispatch.hpp"
#include "ami/memory.hpp"
#include "ami/params.hpp"
#include "ami/stats.hpp"
#include "ami/status.hpp"

namespace ami {

class Client;

namespace detail {
struct ContextImpl;
}

class Context {
 public:
  static constexpr std::size_t kMaxHeaderBytes = 128;

  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  std::uint16_t index() const;
  Client& client() const;

  // Registers (or with a null fn, removes) the handler for id.
  Status set_dispatch(std::uint16_t id, Dispatch dispatch);

  Status send(const SendParams& params);
  Status send_immediate(const SendImmediateParams& params);
  // Largest header + payload send_immediate() takes to dest (0: unreachable).
  std::size_t immediate_limit(Endpoint dest);

  // Names the buffer of a message its handler deferred (Receive::defer);
  // done runs when every byte is in place (one GET of the whole message). A
  // null buffer discards it (done runs in a later advance()). Returns
  //  - ok: the message is on its way (or dropped, given no buffer);
  //  - no_resource: the buffer cannot be registered now, as the
  //    registrations in use fill the context's registration cache
  //    (AMI_RCACHE_MAX_ENTRIES, AMI_RCACHE_MAX_MB), the region table
  //    (AMI_MAX_REGIONS) or what the NIC may pin; under load, with many
  //    transfers in flight, this happens. Nothing was done: the message
  //    stays deferred under the same id, its sender waiting. Advance (a
  //    transfer that completes releases its registration) and call accept()
  //    again, or pass memory, a registration covering the buffer, which
  //    needs none. No request (AMI_MAX_REQUESTS) is taken here: the message
  //    took its record when it was deferred (with none free,
  //    Incoming::can_defer is false and it cannot be);
  //  - another error from registering the buffer (device_error): the
  //    message stays deferred too; accept it into another buffer, or none;
  //  - peer_failed: its sender failed first; the message is gone;
  //  - invalid_argument when id names no message waiting here (never
  //    deferred, or accepted already).
  Status accept(const Deferred& deferred, void* buffer, Callback done, const Memory* memory = nullptr);

  Status put(const RdmaParams& params);
  Status get(const RdmaParams& params);

  // A remote atomic (docs/DESIGN.md, "Remote atomics"): op on the word of
  // params.type at remote_offset of the key's region; done runs (inside a
  // later advance()) once the op is done at the target and the word's old
  // value is in *result. Queued like put() when the FIFO is full.
  //
  // Atomicity: every ami atomic on one word is atomic against every other
  // ami atomic on it, from any task, context and backend of the job. Each
  // region has one atomic domain, the CPU of the host that owns it: the
  // owner's engine does the op with std::atomic_ref on its own memory when
  // an atomic arrives as a message (in order with the lane's other
  // packets), and a device that reaches the memory itself does the same
  // atomic_ref on it (self: the same process; shm: a peer's
  // allocate_memory() segment it maps). So the owner's own
  // std::atomic_ref operations on the word are atomic with ami's too.
  // Nothing is atomic against a PUT (or a plain store) that writes the same
  // bytes: the word then holds one or the other, or a mix of both; a GET
  // that reads it may see a mix, unless a fence separates them.
  //
  // Returns invalid_argument for an endpoint out of range, an op or type
  // not named by AtomicOp or AtomicType, a null result for an op that
  // returns one, a key of another task than dest, and a remote address that
  // is not a multiple of the type's width ("atomic: the remote address is
  // misaligned ..."); remote_access for a word outside the key's region
  // ("atomic: the word lies outside the remote key's region"), or, through
  // done, a key the owner refuses (stale, another job); peer_failed as
  // put() does, and done gets peer_failed when the peer fails with the
  // atomic in flight (whether it was done there is then unknown). A fence
  // to dest covers the atomics posted before it: its done runs after theirs
  // and after each was done at the target.
  Status atomic(const AtomicParams& params);
  // The same atomic, done in the call where this context's own CPU reaches
  // the word (self; shm on a peer's allocate_memory() region) and nothing
  // posted to dest is still outstanding, so it overtakes nothing: returns
  // ok, the old value is in *result, and done is not called. Elsewhere it
  // posts the atomic as atomic() does and returns in_progress: done runs
  // later. The same refusals as atomic(), and the same atomicity (it takes
  // the path atomic() would). As UCX's ucp_atomic_op_nbx completes in place.
  Status atomic_now(const AtomicParams& params);

  // Deterministic fence (docs/DESIGN.md, method 3): done runs once every send,
  // PUT, GET and atomic this context posted to dest before the call is
  // complete at dest (sends dispatched, PUT data placed, GET data here,
  // atomics done and their results here). On a lane that
  // delivers in order the fence is a message behind those operations
  // (after the transfer counter passed every earlier GET), answered by the
  // target when it handles it; on one that may reorder, the lane is
  // flushed instead. No count of outstanding operations is kept.
  Status fence(Endpoint dest, Callback done);
  // The same to every endpoint this context has talked to; one done.
  Status fence_all(Callback done);
  // Called at this context when a fence from a peer arrives.
  void set_fence_handler(FenceHandler handler);
  // Called (inside advance) once for each endpoint that fails: a peer is
  // an endpoint, {task, context}, so a task of several contexts fails as
  // several calls. By then every operation to that endpoint that was
  // pending has completed with an error, and what it sent before it ended
  // has been taken; peer_status() says peer_failed and later operations to
  // it return peer_failed. The same on every backend:
  //  - A task known to have ended fails all its endpoints at once: for
  //    every context c of the task, {task, c} fails and the handler runs
  //    for it — in the advance() that learns of the end or the next —
  //    whether or not this context ever talked to it. A task is known to
  //    have ended when its process exits on this host (shm watches every
  //    peer process it maps) or its bootstrap connection closes (rank 0
  //    sees every task's, every task rank 0's, and rank 0 passes each end
  //    on).
  //  - A lane that breaks alone fails only its endpoint: a verbs queue
  //    pair in error (a remote access error on RC, or transport retries
  //    exceeded, which is how a keepalive (AMI_KEEPALIVE_INTERVAL) finds a
  //    peer gone quiet), a shm ring cell the peer gave up. The task's other
  //    endpoints go on until their own lanes break or the task's end is
  //    known as above (a job under PMIx has no bootstrap connections: on
  //    verbs, a task that died is then found lane by lane).
  //  - An endpoint that sends here although no backend of this context
  //    reaches it fails here: it cannot be answered
  //    (ContextStats::packets_from_unknown_peers).
  // Other endpoints are not affected.
  void set_error_handler(PeerErrorHandler handler);
  // For a layer built on this context (ami::Collectives is one): called
  // like the error handler, and before it, for every peer that fails.
  // Removed by the same fn and cookie; several may watch.
  void watch_peer_failures(PeerErrorHandler watcher);
  void unwatch_peer_failures(PeerErrorHandler watcher);
  // peer_failed (naming why) when dest has failed, else ok.
  Status peer_status(Endpoint dest) const;

  // Runs work (with ok) inside a later advance() of this context, in the
  // order posted: for what must happen on the advancing thread but not
  // inside the call that starts it, as done callbacks never run there.
  // From another thread (under lock()), it wakes the context if it sleeps.
  Status post(Callback work);

  // Makes progress: device work, completions, queued instructions, arrivals.
  // Returns the number of events handled (0 when idle).
  std::size_t advance(std::size_t max_loops = 1);

  // Sleeping until work arrives (docs/DESIGN.md, "Event-driven progress"),
  // for an event loop that must not spin a core per context:
  //
  //   for (;;) {
  //     while (ctx.advance(16) != 0) {}          // drain
  //     if (ctx.arm().ok()) poll(ctx.event_fd()) // armed: sleep
  //   }                                          // busy: drain again
  //
  // event_fd(): one descriptor (an epoll set; do not read it) that becomes
  // readable, after arm() said ok, when the context has work: a packet or
  // completion from any backend, a timer advance() keeps (keepalives), a
  // peer's end, post() or signal(). Made on first use; -1 when it cannot
  // be (arm() then says why), or after fork() or the client's end. A
  // wake-up is a hint: advance and arm again.
  int event_fd();
  // The step between "drained" and "asleep", called by the advancing
  // thread (under lock() where threads share the context). It first sends
  // what the context holds back for an idle moment (batched acks,
  // reception credit, doorbell batches), since a sleeping context makes no
  // idle advances. Returns
  //  - ok: armed; sleep on event_fd();
  //  - busy: something arrived since the last advance() (or is still to
  //    do): advance, then arm again;
  //  - not_supported: a backend in use cannot wake a sleeper (the text
  //    names it: an ofi context, or a shm peer that could not take this
  //    context's eventfd): keep advancing;
  //  - another error when the descriptors cannot be made.
  Status arm();
  // Wakes the context if it sleeps, or makes its next arm() say busy.
  // Thread-safe, and safe from a signal handler.
  void signal();

  void lock();
  bool try_lock();
  void unlock();

  const ContextStats& stats() const;
  // Acks this context sent to dest and the messages they answered (zero for
  // an endpoint out of range).
  AckPeerStats ack_stats(Endpoint dest) const;
  // Name of the backend that reaches dest ("self", "shm", "verbs"), or "".
  std::string_view backend_for(Endpoint dest);
  // The lane to dest, for diagnostics, as perftest's banner lines
  // (" Name : value"): for verbs the device, port, MTU, GID index, inline
  // size and connection method, then LID, QPN, PSN and GID of each end;
  // otherwise the backend's name.
  std::string describe_lane(Endpoint dest);

 private:
  friend class Client;
  explicit Context(std::unique_ptr<detail::ContextImpl> impl);
  void retire();  // the client is going: everything but the object goes
  std::unique_ptr<detail::ContextImpl> impl_;
  std::uint16_t index_;
  std::uint32_t fork_generation_;  // of the process that made it (a forked child's differs)
};

}  // namespace ami
