// protocol/am/ack/ack_dispatcher.hpp — batched, coalesced acknowledgements
// (docs/DESIGN.md, method 4), for one context.
//
// A message that wants an answer (a remote-done, a rendezvous the sender
// holds its buffer for, a fence) carries its origin's ack sequence number:
// the origin numbers, per lane, only the messages that want one. When such
// a message is done here the engine hands it to the dispatcher (complete())
// instead of answering it at once; it joins its origin's active queue.
//
// Every advance() the dispatcher looks at the context's arrival count: a
// count that moved since the last look is a new arrival and resets the idle
// count; one that did not adds an idle advance. When the idle count reaches
// the threshold (or, while a stream arrives over a slow lane, twice its
// usual gap between arrivals: learn()), every active queue is acknowledged — one ack per run of
// consecutive sequence numbers with one outcome, so one ack per origin when
// its messages completed in order — and its entries count as processed.
// Under load acks wait for a lull; at idle they go after `threshold` idle
// advances. An origin whose queue reaches the window (max_unacked) is
// acknowledged at once, so no sender starves under sustained load; a
// threshold of 0 acknowledges every message at once.
//
// What it keeps for one origin (its queue and counts) is an Origin the
// caller holds with the rest of its state for that peer, made when the
// peer is first heard from: the dispatcher itself keeps nothing per peer of
// the job, so the many peers a context never hears from cost it nothing.
//
// Pure bookkeeping: what an ack looks like on the wire and who sends it is
// the caller's (the emit function). Not thread-safe, like its context.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ami::protocol {

class AckDispatcher {
 public:
  // Acknowledges count messages of one origin, sequence numbers
  // [first, first + count), all with the same outcome.
  struct Range {
    std::uint64_t first = 0;
    std::uint32_t count = 0;
    std::uint16_t flags = 0;
  };
  struct PeerStats {
    std::uint64_t messages_acked = 0;
    std::uint64_t acks_sent = 0;
  };


 private:
  struct Entry {
    std::uint64_t seq;
    std::uint16_t flags;
  };

 public:
  // One origin's messages done and not yet acknowledged, and its counts.
  // The caller keeps it (the engine, in its state for the peer) for as
  // long as the dispatcher: a listed origin is reached through it.
  class Origin {
   public:
    explicit Origin(std::uint32_t peer) : peer_(peer) {}
    Origin(const Origin&) = delete;
    Origin& operator=(const Origin&) = delete;

    std::uint32_t peer() const { return peer_; }  // what emit() is told
    std::size_t unacked() const { return active_.size(); }
    const PeerStats& stats() const { return stats_; }

   private:
    friend class AckDispatcher;
    std::vector<Entry> active_;  // done, not yet acknowledged
    PeerStats stats_;
    std::uint32_t peer_;
    bool listed_ = false;        // in waiting_
  };

  AckDispatcher(unsigned idle_threshold, unsigned max_unacked)
      : threshold_(idle_threshold), window_(std::max(1u, max_unacked)) {}

  unsigned idle_threshold() const { return threshold_; }
  unsigned max_unacked() const { return window_; }

  // Message seq from o's peer is done here with outcome flags.
  // Acknowledged at once when the threshold is 0, the peer's window is
  // full, or the message is urgent (a fence: its sender waits on the
  // answer, and a peer sending without a pause would otherwise hold it back
  // until the window fills), together with what o's queue holds before it.
  // emit(peer, Range) sends an ack.
  template <typename Emit>
  void complete(Origin& o, std::uint64_t seq, std::uint16_t flags, Emit&& emit, bool urgent = false) {
    if (!o.listed_) {
      o.listed_ = true;
      waiting_.push_back(&o);
    }
    o.active_.push_back(Entry{seq, flags});
    ++unacked_;
    if (threshold_ == 0 || urgent || o.active_.size() >= window_) flush(o, emit);
  }

  // Once per advance of the context. arrivals: the context's count of
  // packets received so far. Returns true while the context is in a lull
  // (idle count at or past the threshold): the caller returns reception
  // credit to its devices then.
  template <typename Emit>
  bool advance(std::uint64_t arrivals, Emit&& emit) {
    if (arrivals != last_seen_) {
      last_seen_ = arrivals;
      learn(idle_);
      idle_ = 0;
    } else if (idle_ < kLearnCap * threshold_) {
      ++idle_;  // (counted past the lull, to learn the gap)
    }
    if (idle_ < lull_) return false;
    if (!waiting_.empty()) flush_all(emit);
    return true;
  }

  // (Never inlined: advance() is what an idle context spins on, and this
  // is its rare part.)
  template <typename Emit>
  [[gnu::noinline]] void flush_all(Emit&& emit) {
    for (Origin* o : waiting_) {
      flush(*o, emit);
      o->listed_ = false;
    }
    waiting_.clear();
  }

  unsigned idle() const { return idle_; }
  // Idle advances that make a lull now: the threshold, or twice the usual
  // gap between arrivals of a stream when that is longer (see learn()).
  unsigned lull() const { return lull_; }
  // Messages done and not yet acknowledged, over every origin (asked at
  // every advance: kept as a count).
  std::size_t unacked() const { return unacked_; }

 private:
  // Acknowledges everything in o's active queue, coalesced into ranges.
  // An origin flushed by its window stays listed in waiting_, once.
  template <typename Emit>
  void flush(Origin& o, Emit& emit) {
    if (o.active_.empty()) return;
    auto& a = o.active_;
    const std::uint32_t peer = o.peer_;
    if (!std::is_sorted(a.begin(), a.end(), by_seq)) std::sort(a.begin(), a.end(), by_seq);
    Range r{a[0].seq, 1, a[0].flags};
    for (std::size_t i = 1; i < a.size(); ++i) {
      if (a[i].seq == r.first + r.count && a[i].flags == r.flags && r.count < kMaxRange) {
        ++r.count;
        continue;
      }
      emit(peer, r);
      ++o.stats_.acks_sent;
      r = Range{a[i].seq, 1, a[i].flags};
    }
    emit(peer, r);
    ++o.stats_.acks_sent;
    o.stats_.messages_acked += a.size();
    unacked_ -= a.size();
    a.clear();
  }

  // A stream over a slow lane leaves idle advances between its arrivals
  // that are not a lull: the dispatcher keeps an average of those gaps
  // (weight 1/8, in 1/16 advance) and waits for twice it before calling a
  // quiet spell a lull. A gap longer than kLearnCap thresholds is a lull by
  // any measure and is not learned, and the wait never exceeds that cap, so
  // a message after a long silence is answered after `threshold` advances
  // again once the average has come down.
  void learn(unsigned gap) {
    if (threshold_ == 0) return;
    const std::uint64_t cap = std::uint64_t{kLearnCap} * threshold_;
    if (gap >= cap) return;
    gap_avg_ = gap_avg_ + (std::int64_t{gap} * 16 - gap_avg_) / 8;
    const std::uint64_t twice = static_cast<std::uint64_t>(gap_avg_) / 8;
    lull_ = static_cast<unsigned>(std::clamp<std::uint64_t>(twice, threshold_, cap));
  }

  static bool by_seq(const Entry& x, const Entry& y) { return x.seq < y.seq; }
  static constexpr unsigned kLearnCap = 32;
  static constexpr std::uint32_t kMaxRange = 0xFFFFFFFFu;

  unsigned threshold_;
  unsigned window_;
  std::vector<Origin*> waiting_;  // origins with entries since the last flush_all
  std::size_t unacked_ = 0;             // entries in every origin's active queue
  std::uint64_t last_seen_ = 0;
  unsigned idle_ = 0;
  unsigned lull_ = threshold_;
  std::int64_t gap_avg_ = 0;  // 1/16 advance
};

}  // namespace ami::protocol
