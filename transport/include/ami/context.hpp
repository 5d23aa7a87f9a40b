// ami/context.hpp — a context: a partition of the client's resources with
// its own work queue, advanced by one thread at a time.
//
// Owned by its Client; references stay valid for the Client's life. A
// reference kept past it still names an object: every call on it then
// returns invalid_argument ("context used after its client was destroyed"),
// 0 or nothing (advance, immediate_limit, stats, describe_lane), and
// client() throws ami::Error. post
// calls (send, send_immediate, put, get) and advance() are not thread-safe:
// one thread drives a context at a time, which lock()/try_lock() arrange
// when threads share one. Two contexts share no queue, so two threads on two
// contexts never contend. Callbacks run only inside advance().
//
// When an injection FIFO is full:
//  - send(), put() and get() queue the instruction in the context's work
//    queue (a request from a pool sized by AMI_MAX_REQUESTS) and return ok;
//    queued instructions go out in order, before later ones to the same
//    endpoint, as advance() frees slots. Only an exhausted pool makes them
//    return no_resource.
//  - send_immediate() never queues: it returns no_resource, and the caller
//    advances and retries.
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
  // done runs when every byte is in place. A null buffer discards it.
  // invalid_argument when id names no message waiting here.
  Status accept(const Deferred& deferred, void* buffer, Callback done, const Memory* memory = nullptr);

  Status put(const RdmaParams& params);
  Status get(const RdmaParams& params);

  // Deterministic fence (DESIGN.md, method 3): done runs once every send,
  // PUT and GET this context posted to dest before the call is complete at
  // dest (sends dispatched, PUT data placed, GET data here). On a lane that
  // delivers in order the fence is a message behind those operations
  // (after the transfer counter passed every earlier GET), answered by the
  // target when it handles it; on one that may reorder, the lane is
  // flushed instead. No count of outstanding operations is kept.
  Status fence(Endpoint dest, Callback done);
  // The same to every endpoint this context has talked to; one done.
  Status fence_all(Callback done);
  // Called at this context when a fence from a peer arrives.
  void set_fence_handler(FenceHandler handler);
  // Called (inside advance) when a peer fails: its process died (shm sees
  // it; so does the TCP bootstrap's connection, rank 0 for every task and
  // every task for rank 0), its lane broke, or it could not be reached by a
  // keepalive (AMI_KEEPALIVE_INTERVAL).
  // Every operation to it that was pending has by then completed with an
  // error; later ones return peer_failed. Other peers are not affected.
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
  Status post(Callback work);

  // Makes progress: device work, completions, queued instructions, arrivals.
  // Returns the number of events handled (0 when idle).
  std::size_t advance(std::size_t max_loops = 1);

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
};

}  // namespace ami
