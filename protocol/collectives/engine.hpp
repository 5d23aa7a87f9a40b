// protocol/collectives/engine.hpp — collectives on active messages
// (docs/DESIGN.md, method 5): the Engine behind ami::Collectives (the dispatch
// handler, the geometries, the pools, sends and completions) and the
// per-geometry control structure the handler updates.
//
// A GeometryImpl holds one operation of each kind, which is either in flight
// (active, with the sequence number of every message it takes) or waiting
// for its next call (seq is then the next one's). An arrival for the active
// operation is acted on in the handler: combined straight from the packet,
// placed into the caller's buffer, forwarded at once. An arrival for a
// later operation (a peer already in it) is kept: small ones in an
// early-arrival buffer from the pool, large ones deferred at their sender
// (Receive::defer) until the call names their place (Context::accept). An
// arrival for an earlier operation is an error: counted (stale) and
// dropped. Barriers keep no records at all: a bit vector for the current
// barrier and one for the next, since no peer can be further ahead.
//
// The algorithms, one file each: barrier.cpp (pairwise exchange or
// dissemination), broadcast.cpp and reduce.cpp (binomial trees),
// allreduce.cpp (recursive doubling for small data) and allreduce_ring.cpp
// (reduce-scatter then allgather for large: recursive halving or a ring),
// allgather.cpp (ring). Each moves data straight between the callers'
// buffers; scratch from the pool holds only partial results that have no
// caller's buffer (an inner node of a reduce, the steps of recursive
// doubling, a halving step's large data before it joins recv).
//
// Every event of an operation goes to its kind's Algorithm row, a table
// indexed by Kind that the geometry's constructor ties to each operation:
// the geometry names no kind when it routes, and a kind without a full row
// does not compile (docs/DESIGN.md, Dispatch).
#pragma once

#include <array>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ami/collectives.hpp"
#include "ami/context.hpp"
#include "combine.hpp"
#include "members.hpp"
#include "pools.hpp"
#include "topology.hpp"
#include "wire.hpp"

namespace ami::coll {

class Engine;
class GeometryImpl;

struct Operation;

// A kind's algorithm: what the geometry calls for each event of one of its
// operations. One row per kind in GeometryImpl::kAlgorithms, in Kind order.
struct Algorithm {
  Kind kind = Kind::barrier;
  Operation& (*state)(GeometryImpl& g) = nullptr;  // the geometry's operation of this kind
  // Any arrival of this kind from a member (origin: its rank), whichever
  // operation it is for.
  void (GeometryImpl::*arrival)(const Header& h, std::uint32_t origin, const Incoming& in, Receive* recv) = nullptr;
  // A send of the operation (index: which, numbered by the kind) is complete.
  void (GeometryImpl::*sent)(std::uint32_t index) = nullptr;
  // A receive of the operation is complete.
  void (GeometryImpl::*received)(std::uint32_t index, Status s) = nullptr;
  // A record the operation took while it was receiving is ready.
  void (GeometryImpl::*kept)(Arrival& a) = nullptr;
  // The member of rank dead failed: the operation ends with reason if it
  // needs that member.
  void (GeometryImpl::*member_failed)(std::uint32_t dead, Status reason) = nullptr;
};

// The cookie of a send's local completion or of a receive's done: which
// operation, and which of its sends or receives (each kind numbers them).
struct Tag {
  Operation* op = nullptr;
  std::uint32_t index = 0;
};

// What every kind's operation has.
struct Operation {
  Kind kind = Kind::barrier;
  GeometryImpl* geometry = nullptr;
  const Algorithm* algorithm = nullptr;  // the kind's row, set with the geometry
  bool active = false;
  bool done_posted = false;  // finished; done runs in the next advance()
  std::uint32_t seq = 0;     // the active operation's, else the next call's
  Callback done;
  Status result;             // the first failure
  std::uint32_t sends_pending = 0;
  Header proto;  // every message's header but the step
  std::vector<Tag> tags;
  std::uint32_t min_tags = 0;  // what every call of the kind needs (begin() makes them)

  Tag* tag(std::uint32_t i) {
    assert(i < tags.size());
    return &tags[i];
  }
  // At least n tags, made when a call first needs them rather than with the
  // geometry: a world of many tasks would otherwise hold tags by step for
  // every kind it never calls. Only between operations (none is in use).
  void need_tags(std::size_t n) {
    if (tags.size() >= n) return;
    tags.resize(n);
    for (std::size_t i = 0; i < n; ++i) tags[i] = Tag{this, static_cast<std::uint32_t>(i)};
  }
  void fail(Status s) {
    if (result.ok()) result = s;
  }
};

// A barrier round's root field: the sender's barrier failed.
inline constexpr std::uint32_t kBarrierFailed = 1;

struct BarrierState : Operation {
  std::uint32_t rounds = 0;
  std::vector<std::uint32_t> to, from;  // by round: the ranks it tells and hears from
  std::uint32_t sent = 0;     // rounds of the current barrier sent
  std::uint64_t current = 0;  // bit k: round k of barrier seq came
  std::uint64_t next = 0;     // the same for barrier seq + 1 (a peer is in it already)
};

struct BroadcastState : Operation {
  topology::Tree tree;
  std::byte* buffer = nullptr;
  std::size_t bytes = 0;
  bool receiving = false;  // the data is streaming or being fetched into buffer
  bool have_data = false;
  bool forwarded = false;
  Arrival* early = nullptr;  // an early arrival still streaming into its own buffer
};

struct ReduceState : Operation {
  static constexpr std::uint32_t kMaxChildren = 32;
  enum class Acc : std::uint8_t { empty, filling, full };
  topology::Tree tree;
  const std::byte* send = nullptr;
  std::byte* recv = nullptr;
  std::size_t count = 0;
  std::size_t bytes = 0;
  DataType type = DataType::int32;
  ReduceOp op = ReduceOp::sum;
  std::byte* acc = nullptr;  // the root's recv, an inner node's scratch
  Block scratch;
  Acc acc_state = Acc::empty;
  int filler = -1;            // the child whose data is streaming into an empty acc
  std::uint64_t piecewise = 0;  // children combined piece by piece as their data streams in
  bool own_in = false;        // this task's send is combined into acc
  std::uint32_t children = 0;
  std::uint64_t heard = 0;    // children whose data came or is coming (bit per child index)
  std::uint64_t combined = 0; // children combined into acc
  std::uint32_t streaming = 0;  // contributions being received or fetched
  ArrivalList waiting;        // contributions in buffers until acc can take them
  bool sent_up = false;
  PieceCombiner pieces[kMaxChildren];
};

struct AllreduceState : Operation {
  const std::byte* send = nullptr;
  std::byte* recv = nullptr;
  std::size_t count = 0;
  std::size_t bytes = 0;
  DataType type = DataType::int32;
  ReduceOp op = ReduceOp::sum;
  Block own;  // a copy of send when it is recv
  bool ring = false;     // large data: a reduce-scatter then an allgather over size blocks
  bool halving = false;  // ... by recursive halving and doubling (a power of two of members), not a ring
  std::uint32_t streaming = 0;  // receives not complete
  std::vector<std::uint8_t> arrived;  // by step: its data is in place (or kept)
  std::vector<Arrival*> kept;         // by step: data that could not go to its place yet
  PieceCombiner pieces;               // one stream from one origin at a time
  // recursive doubling: value(k) after step k; value(steps) is recv
  std::uint32_t steps = 0;
  bool extra = false;  // folds its data into rank + 1 and takes no part in the doubling
  bool folds = false;  // takes the fold of rank - 1 and gives it the result
  std::vector<std::uint32_t> partner;  // by step 1..steps
  int level = -1;          // the highest k whose value is ready
  Block stages;            // value(k) for 0 < k < steps (and value(0) when folding);
                           // halving: where a large step's data lands before it joins recv
  std::uint64_t sent = 0;  // bit per step
  // ring: reduce-scatter steps 0..n-2, then allgather steps n-1..2n-3;
  // halving: reduce-scatter steps 0..L-1, then allgather steps L..2L-1 (n = 2^L)
  std::uint32_t ring_sent = 0;     // steps sent, in order
  std::vector<std::uint8_t> busy;  // by guard (ring_guard()): a send of it from recv is not complete
};

struct AllgatherState : Operation {
  const std::byte* send = nullptr;
  std::byte* recv = nullptr;
  std::size_t bytes = 0;
  std::uint32_t sent = 0;              // steps sent, in order
  std::uint32_t streaming = 0;         // receives not complete
  std::vector<std::uint8_t> arrived;   // by step
  std::vector<Arrival*> kept;          // by step: early arrivals still streaming into their buffers
};

class GeometryImpl {
 public:
  static constexpr std::uint32_t kNotMember = Members::kNotMember;

  GeometryImpl(Engine& engine, std::uint32_t id, Members members);

  Engine& engine;
  const std::uint32_t id;
  const Members members;  // task of each rank, rank of each task
  const std::uint32_t size;
  const std::uint32_t rank;

  // The public calls (arguments checked here).
  Status barrier(Callback done);
  Status broadcast(std::uint32_t root, void* buffer, std::size_t bytes, Callback done);
  Status reduce(std::uint32_t root, const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                Callback done);
  Status allreduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, Callback done);
  Status allgather(const void* send, std::size_t bytes, void* recv, Callback done);

  // An arrival from origin (a member's rank) for this geometry.
  void on_arrival(const Header& h, std::uint32_t origin, const Incoming& in, Receive* recv);
  // A record kept before this geometry existed here.
  void adopt(Arrival* a);
  // Gives back every early arrival (the large ones are discarded at their
  // senders): the Collectives is going away.
  void discard_early();
  // A send of op (numbered by its kind) is complete.
  void on_sent(Operation& op, std::uint32_t index);
  // A receive of op (numbered by its kind) is complete.
  void on_received(Operation& op, std::uint32_t index, Status s);
  // A record op took while it was receiving is ready.
  void on_kept_ready(Arrival& a);
  // A member failed: every collective in flight here ends with why once
  // what it has in flight is over, and later calls return it at once.
  void member_failed(std::uint32_t task, Status why);

 private:
  Status begin(Operation& op, Callback done, const char* busy);
  // Sends payload to rank `to` as step of op (tag: which of op's sends);
  // false (op failed) when refused.
  bool send(Operation& op, std::uint32_t to, std::uint16_t step, std::span<const std::byte> payload,
            std::uint32_t tag);
  // Early arrivals for op's sequence number, taken off the early list.
  ArrivalList take_early(const Operation& op);
  void keep_early(const Header& h, std::uint32_t origin, const Incoming& in, Receive* recv);
  void malformed(Receive* recv);

  // The rows, by Kind; and the adapters that fit a kind's functions to a
  // row (geometry.cpp).
  static const std::array<Algorithm, kKinds> kAlgorithms;
  template <auto State>
  static Operation& state_of(GeometryImpl& g);
  // An arrival for a kind that keeps records: a stale one is counted, one
  // for a later operation kept early, one for the active operation given
  // to Data.
  template <auto State, void (GeometryImpl::*Data)(const Header&, std::uint32_t, const Incoming&, Receive*)>
  void route(const Header& h, std::uint32_t origin, const Incoming& in, Receive* recv);
  // A send complete, for a kind that then only sees whether it can go on.
  template <void (GeometryImpl::*Check)()>
  void then(std::uint32_t index);
  // A collective with data fails outright when a member fails; Check ends
  // it once nothing of it is in flight.
  template <auto State, void (GeometryImpl::*Check)()>
  void fail_active(std::uint32_t dead, Status reason);
  // An event a kind never has (a barrier sends no payload and receives
  // nothing).
  template <class... Args>
  void never(Args...) {}

  // barrier.cpp
  void barrier_message(const Header& h, std::uint32_t origin, const Incoming& in, Receive* recv);
  void barrier_member_failed(std::uint32_t dead, Status reason);
  void barrier_arrival(const Header& h, std::uint32_t origin);
  void barrier_progress();
  bool barrier_waits_on(std::uint32_t dead_rank) const;  // a round from it not yet heard
  // broadcast.cpp
  void broadcast_start();
  bool broadcast_expects(const Header& h, std::uint32_t origin, std::size_t bytes);
  void broadcast_take(Arrival* a);
  void broadcast_data(const Header& h, std::uint32_t origin, const Incoming& in, Receive* recv);
  void broadcast_received(std::uint32_t index, Status s);
  void broadcast_kept(Arrival& a);
  void broadcast_forward();
  void broadcast_check();
  // reduce.cpp
  void reduce_start();
  bool reduce_matches(const Header& h, std::uint32_t origin, std::size_t bytes, int& child);
  bool reduce_merge(const Header& h, std::uint32_t origin, const Incoming& in, Receive* recv);
  void reduce_take(Arrival* a);
  void reduce_data(const Header& h, std::uint32_t origin, const Incoming& in, Receive* recv);
  void reduce_fill(const std::byte* data);
  void reduce_drain();
  void reduce_received(std::uint32_t index, Status s);
  void reduce_kept(Arrival& a);
  void reduce_check();
  // allreduce.cpp
  void allreduce_start();
  bool allreduce_expects(const Header& h, std::uint32_t origin, std::size_t bytes);
  std::size_t allreduce_step_bytes(std::uint16_t step) const;
  void allreduce_take(Arrival* a);
  void allreduce_data(const Header& h, std::uint32_t origin, const Incoming& in, Receive* recv);
  void allreduce_received(std::uint32_t index, Status s);
  void allreduce_kept(Arrival& a);
  void allreduce_sent(std::uint32_t index);
  void allreduce_progress();
  void allreduce_place_kept(std::uint16_t step);
  void allreduce_check();
  bool allreduce_complete() const;
  std::byte* doubling_value(int k);
  std::byte* doubling_target(std::uint16_t step);
  const std::byte* doubling_operand(std::uint16_t step, bool& ready);
  void doubling_place(std::uint16_t step, const std::byte* data);
  void doubling_data(const Header& h, const Incoming& in, Receive* recv);
  void doubling_progress();
  // allreduce_ring.cpp
  std::size_t ring_offset(std::uint32_t block) const;
  std::size_t ring_bytes(std::uint32_t block) const;
  struct Span {
    std::size_t offset = 0;
    std::size_t bytes = 0;
  };
  std::uint32_t ring_steps() const;
  Span ring_span(std::uint16_t step, bool sending) const;
  std::uint32_t ring_peer(std::uint16_t step, bool sending) const;
  std::uint32_t ring_guard(std::uint16_t step) const;
  const std::byte* ring_operand(std::uint16_t step) const;
  bool ring_reduces(std::uint16_t step) const;
  bool ring_may_place(std::uint16_t step) const;
  std::byte* ring_landing(std::uint16_t step);
  void ring_place(std::uint16_t step, const std::byte* data);
  void ring_data(const Header& h, const Incoming& in, Receive* recv);
  void ring_received(std::uint16_t step);
  void ring_sent(std::uint32_t index);
  void ring_progress();
  // allgather.cpp
  void allgather_start();
  std::byte* allgather_place(std::uint16_t step);
  bool allgather_expects(const Header& h, std::uint32_t origin, std::size_t bytes);
  void allgather_take(Arrival* a);
  void allgather_data(const Header& h, std::uint32_t origin, const Incoming& in, Receive* recv);
  void allgather_received(std::uint32_t index, Status s);
  void allgather_kept(Arrival& a);
  void allgather_progress();

  Status failure_;     // not ok once a member failed: no collective can complete
  ArrivalList early_;  // arrivals for operations not called yet
  BarrierState barrier_;
  BroadcastState broadcast_;
  ReduceState reduce_;
  AllreduceState allreduce_;
  AllgatherState allgather_;
};

class Engine {
 public:
  Engine(Context& context, std::uint16_t dispatch);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  Geometry& world() { return *geometries_.front(); }
  Status create_geometry(std::uint32_t id, std::span<const std::uint32_t> tasks, Geometry*& out);

  Context& context;
  const std::uint16_t dispatch;
  const std::uint32_t task;
  const std::uint32_t job_size;
  const std::size_t eager_max;  // AMI_COLL_EAGER_MAX
  const std::size_t ring_min;   // AMI_COLL_RING_MIN
  CollectiveStats stats;
  BufferPool buffers{stats.buffers_allocated};
  ArrivalPool arrivals;

  // Sends h and payload to task; tag's local completion is counted in its
  // operation when one will come (small messages go at once, with none).
  Status send(std::uint32_t to_task, const Header& h, std::span<const std::byte> payload, Tag* tag);
  // Keeps an arrival for later: in an early-arrival buffer, or deferred at
  // its sender when it is large and may be (may_defer); null when no
  // buffer could be had (the data is then dropped).
  Arrival* keep(const Header& h, std::uint32_t origin_task, const Incoming& in, Receive* recv, bool may_defer);
  // Gives a record back: a deferred one is discarded at its sender, a
  // receiving one once it is complete.
  void discard(Arrival* a);
  void release(Arrival* a);
  // op is over (op.result says how): done runs now, or in the next
  // advance() when a public call is on the stack.
  void finish(Operation& op);

  // Depth of public calls on the stack (CallScope).
  int calls = 0;

  // Callbacks: a send's local completion and a receive's done for the
  // operation and number in tag; a kept record's receive.
  static Callback sent_callback(Tag* tag);
  static Callback received_callback(Tag* tag);
  static Callback kept_callback(Arrival* a);
  // Receive::piece for a PieceCombiner.
  static void on_piece(void* combiner, std::uint64_t offset, std::span<const std::byte> bytes);

 private:
  static void on_message(void* cookie, const Incoming& in, Receive* recv);
  static void on_sent(void* tag, Status s);
  static void on_received(void* tag, Status s);
  static void on_kept(void* arrival, Status s);
  static void run_done(void* op, Status s);
  static void on_peer_failed(void* engine, Endpoint peer, Status why);
  GeometryImpl* find(std::uint32_t id);

  std::vector<std::unique_ptr<Geometry>> geometries_;  // the world first
  // By task: Context::immediate_limit() once asked (0: not yet). Two bytes
  // a task (a limit is a few hundred bytes; one past 65535 would only be
  // taken as that), as every task of the job has one.
  std::vector<std::uint16_t> immediate_;
  ArrivalList orphans_;  // arrivals for geometries not created here yet
};

// Marks a public call on the stack: what completes inside it completes in
// the next advance(), never inside the call.
class CallScope {
 public:
  explicit CallScope(Engine& e) : e_(e) { ++e_.calls; }
  ~CallScope() { --e_.calls; }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  Engine& e_;
};

}  // namespace ami::coll
