// ami/collectives.hpp — collectives straight on active messages (docs/DESIGN.md,
// method 5): barrier, broadcast, reduce, allreduce and allgather over a
// Geometry (the world, or a subset of its tasks), non-blocking, each with a
// done callback. There is no point-to-point layer underneath: each geometry
// keeps a control structure (bit vectors for the current and the next
// barrier, sequence numbers per kind of collective, early-arrival buffers)
// that the dispatch handler updates itself, combining data in place and
// forwarding it as it arrives.
//
// A Collectives claims one dispatch id of one context for all collective
// traffic. Every task of the job builds one on the same context index with
// the same id; messages of a geometry go to endpoints {task, that index}.
//
// Rules:
//  - Every member calls a geometry's collectives of one kind in the same
//    order, with matching arguments (root, bytes, count, type, op); calls of
//    different kinds need not be ordered. One collective of each kind is in
//    flight per geometry at a time, from the call until its done has run:
//    another call of that kind returns no_resource. Collectives on
//    different geometries run side by side.
//  - Buffers are the caller's and stay untouched until done runs. done runs
//    inside Context::advance(), never inside the call; its status is ok or
//    the error that ended the collective (a send refused, a peer whose
//    arguments did not match, a member that failed).
//  - When a member fails (Context::set_error_handler tells of it), a
//    collective with data in flight on a geometry it belongs to ends with
//    peer_failed once what it had in flight with the living is over; a
//    barrier does if it still waits for a round from the member, and its
//    remaining rounds tell the others; later calls on the geometry return
//    peer_failed at once. A barrier the member finished before it exited
//    completes; geometries without it go on.
//  - Roots are ranks in the geometry (indices into its task list).
//  - done at one task says its own part is over; a peer may still wait for
//    this task's acknowledgement of a large message it sent, and a task
//    that exits fails what is pending to it. Before a task exits, a
//    barrier (whose messages want no answer) lets every peer finish.
//  - Tunables: AMI_COLL_EAGER_MAX, AMI_COLL_RING_MIN (ami_info -c).
//  - Not thread-safe: it is driven by the thread that advances the context.
//    Destroy it when none of its collectives is in flight.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "ami/callback.hpp"
#include "ami/status.hpp"

namespace ami {

class Context;

// Element types of reduce and allreduce.
enum class DataType : std::uint8_t { int32, int64, uint64, float32, float64 };
// Reduction operators; band and bor are for the integer types only.
enum class ReduceOp : std::uint8_t { sum, prod, min, max, band, bor };

std::size_t size_of(DataType type);
std::string_view to_string(DataType type);
std::string_view to_string(ReduceOp op);

// Counters of one Collectives (plain data, read on the advancing thread).
struct CollectiveStats {
  static constexpr std::size_t kKinds = 5;  // barrier, broadcast, reduce, allreduce, allgather
  std::array<std::uint64_t, kKinds> started{};
  std::array<std::uint64_t, kKinds> completed{};
  std::uint64_t messages_sent = 0;
  std::uint64_t messages_received = 0;
  std::uint64_t early_arrivals = 0;       // came before the local call (or geometry) said where they go
  std::uint64_t early_deferred = 0;       // of those, large ones left at their sender until the call
  std::uint64_t early_merged = 0;         // reduce contributions combined into an earlier early arrival
  std::uint64_t combined_in_handler = 0;  // contributions combined straight from the packets
  std::uint64_t stale = 0;                // from an older sequence than the geometry's: an error, dropped
  std::uint64_t malformed = 0;            // bad header, not a member, wrong step, length or arguments: dropped
  std::uint64_t buffers_allocated = 0;    // early-arrival and scratch buffers the pool had to allocate
};

// Name of CollectiveStats::started[i] / completed[i]: "barrier", ...
std::string_view collective_kind_name(std::size_t i);

namespace coll {
class Engine;
class GeometryImpl;
}  // namespace coll

// A set of tasks that runs collectives together. Owned by its Collectives.
class Geometry {
 public:
  ~Geometry();
  Geometry(const Geometry&) = delete;
  Geometry& operator=(const Geometry&) = delete;

  std::uint32_t id() const;
  std::uint32_t size() const;
  std::uint32_t rank() const;                    // this task's rank in the geometry
  std::uint32_t task(std::uint32_t rank) const;  // the task of a rank

  // done runs once every member has entered the barrier.
  Status barrier(Callback done);
  // bytes from root's buffer into every member's buffer.
  Status broadcast(std::uint32_t root, void* buffer, std::size_t bytes, Callback done);
  // count elements of every member's send combined by op into root's recv
  // (recv is not used elsewhere and may be null there). send and recv are
  // the same buffer or do not overlap.
  Status reduce(std::uint32_t root, const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                Callback done);
  // The same, with the result in every member's recv.
  Status allreduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, Callback done);
  // bytes from every member's send into recv at rank * bytes (recv holds
  // size() * bytes); send may be recv's own block.
  Status allgather(const void* send, std::size_t bytes, void* recv, Callback done);

 private:
  friend class coll::Engine;
  explicit Geometry(std::unique_ptr<coll::GeometryImpl> impl);
  std::unique_ptr<coll::GeometryImpl> impl_;
};

class Collectives {
 public:
  // Claims dispatch of context (throws ami::Error when it cannot be set).
  // Every task of the job does the same with the same id and context index.
  Collectives(Context& context, std::uint16_t dispatch);
  ~Collectives();
  Collectives(const Collectives&) = delete;
  Collectives& operator=(const Collectives&) = delete;

  // Every task of the job, ranked as the job ranks them; its id is 0.
  Geometry& world();
  // A geometry of tasks (ranked in the order given). Every member calls it
  // with the same id and list; ids are unique per Collectives and 0 is the
  // world's. invalid_argument, naming the problem, for a taken id, a task
  // out of range or twice, or a list without this task.
  Status create_geometry(std::uint32_t id, std::span<const std::uint32_t> tasks, Geometry*& out);

  const CollectiveStats& stats() const;

 private:
  std::unique_ptr<coll::Engine> engine_;
};

}  // namespace ami
