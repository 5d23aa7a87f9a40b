// protocol/am/rndv/policy.hpp — when a receiver stops an eager message, and how
// the rest of it travels (docs/DESIGN.md, method 2).
//
// The sender of a message longer than one packet always starts eagerly and
// never decides anything; its receiver runs decide() when the first packet
// arrives and again with every later eager packet, until it stops the
// message or the message is complete. The inputs are data-flow conditions
// at the receiver, each counted in ContextStats when it causes a stop:
//  - deferred: the handler has no buffer yet (Receive::defer): stop, hold no
//    reception buffer, GET it all once Context::accept() names the buffer;
//  - no_buffer: the handler gave no buffer (it discards the data): stop the
//    sender wasting the lane on bytes nobody keeps;
//  - zero_copy: the handler asked for the data by RDMA straight into its buffer;
//  - reception_low: the context's reception buffers (queue cells, posted
//    receive buffers) are in use past AMI_RNDV_LOW_WATER percent, and at
//    least kPressureMin bytes are still to come;
//  - large: the eager bytes still to come exceed the lane's crossover, the
//    size above which GET or PUT moves data faster than the bounce path
//    (Lane::rdma_crossover(), or AMI_RNDV_CROSSOVER).
// A message its handler takes in pieces (Receive::piece) is never asked:
// with no buffer there is nothing to GET or PUT into.
// The mode is AMI_RNDV_MODE's unless that is auto, which is stop_put: at the
// first packet the receive buffer is known, so the sender can PUT the rest
// in one go; a stop later comes from reception pressure (a stop for size
// comes at the first packet), when the receiver is the end short of time,
// and a PUT is the sender's work. (Measured on shm, bench/rndv_sweep.sh:
// streams of 512 B..8 KiB messages whose receiver stops some mid-message
// for a full ring moved 20-40% more with stop_put there than with
// split_get, which GETs by the receiver.) On a lane where a GET beats a
// PUT (Lane::get_beats_put: an unordered ofi lane other than shm, whose
// PUT must wait to be known placed before its fin) auto is split_get.
// Where the peer competes with other tasks for the host's CPUs
// (Lane::oversubscribed) auto is discard_get: the receiver GETs the whole
// rest by itself, while a PUT (or the cts of a split_get) would wait for
// the scheduler to run the sender.
// (4 and 8 tasks on 2 cores, bench/coll_vs_mpi.sh: the 1 MiB allreduce took
// 0.85x and 0.86x the time it took with stop_put.) Where a GET also beats
// the eager packets still in flight (Lane::get_beats_eager: rxm over tcp,
// whose eager packets are copied through bounce buffers at both ends) auto
// is discard_get too: none of them is worth keeping.
// A stop_put whose rest is at least split_min bytes is shared between the
// two ends: the sender PUTs the lower half of the rest ([what it had sent,
// put_end)) while the receiver GETs the upper half ([put_end, total)) from
// the moment it stops, so both ends move data at once (on shm both copy, in
// parallel, what one would copy alone) and the sender starts later by the
// stop's flight, not by the whole copy. The sender then waits for the
// receiver's ack, as after a GET stop.
// A message with no buffer cannot follow any of those, whatever
// AMI_RNDV_MODE says: there is nowhere to keep eager packets (split_get) and
// no key to PUT into (stop_put). It is stopped as discard_get is on the wire
// (the receiver drops what still comes, the sender answers with a cts), and
// counted on its own path: `discard` when its data is dropped (nothing is
// fetched), `deferred_get` when it was deferred (accept() GETs the whole
// message into the buffer it names, or drops it given none).
#pragma once

#include <cstdint>

#include "wire/packet.hpp"

namespace ami::protocol::rndv {

enum class Mode : std::uint8_t { automatic, discard_get, split_get, stop_put };  // AMI_RNDV_MODE order
enum class StopReason : std::uint8_t { no_buffer, zero_copy, reception_low, large, deferred };
// How the rest of a stopped message travels: the index of
// ContextStats::rndv_stops_by_mode (stop_mode_name() names each).
enum class StopPath : std::uint8_t { discard_get, split_get, stop_put, discard, deferred_get };

struct Inputs {
  std::uint64_t total = 0;     // message bytes
  std::uint64_t received = 0;  // eager bytes in place so far
  bool has_buffer = true;
  bool deferred = false;       // the handler put the message aside (no buffer yet)
  bool zero_copy = false;
  unsigned reception_load = 0;     // percent
  unsigned low_water = 75;         // AMI_RNDV_LOW_WATER
  std::uint64_t crossover = 0;     // bytes
  Mode configured = Mode::automatic;
  std::uint64_t split_min = 0;     // stop_put: the smallest rest shared with a GET (0: never)
  bool get_beats_put = false;      // the lane's (Lane::get_beats_put): automatic is then split_get
  bool oversubscribed = false;     // the lane's (Lane::oversubscribed): automatic is then discard_get
  bool get_beats_eager = false;    // the lane's (Lane::get_beats_eager): automatic is then discard_get
};

struct Decision {
  bool stop = false;
  StopReason reason = StopReason::large;
  wire::StopMode mode = wire::StopMode::discard_get;  // what the stop packet says
  StopPath path = StopPath::discard_get;              // what is counted
  std::uint64_t put_end = 0;  // stop_put: the sender PUTs up to here, the receiver GETs the rest (total: none)
};

// Rests of a stop_put at least this long are shared between the sender's
// PUT and the receiver's GET (Inputs::split_min). On shm a process_vm_writev
// and a process_vm_readv of half each, at once, take well under one call of
// all of it once the halves are a few pages; with the PUT starting a stop's
// flight later, messages of 20000 B moved 17% more in a stream and arrived
// 9% sooner than unshared, of 64 KiB 29% more and 30% sooner (measured as
// bench/rndv_sweep.sh does). Sharing rests of 4-8 KiB gained nothing.
inline constexpr std::uint64_t kSplitMin = 16 * 1024;
// Where the halves meet is a multiple of this, counted from the message's
// start, so the two copies share no page of a page-aligned buffer.
inline constexpr std::uint64_t kSplitAlign = 4096;

// A stop for reception pressure needs at least this much still to come: a
// stop and an RDMA of less take longer than the eager packets (on shm a
// stop's round trip and a CMA call are worth some 6 KiB of them), and
// relieve little. After the first packet that is the only reason left to
// stop a message (a buffer, a deferral, zero_copy and the size are known
// from the first), so a receiver asks no more once less is to come.
inline constexpr std::uint64_t kPressureMin = 4096;
inline bool may_stop_later(std::uint64_t remaining) { return remaining >= kPressureMin; }

Decision decide(const Inputs& in);

}  // namespace ami::protocol::rndv
