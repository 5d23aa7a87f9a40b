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

  AckDispatcher(std::uint32_t peers, unsigned idle_threshold, unsigned max_unacked)
      : threshold_(idle_threshold), window_(std::max(1u, max_unacked)), origins_(peers) {}

  unsigned idle_threshold() const { return threshold_; }
  unsigned max_unacked() const { return window_; }

  // Message seq from peer is done here with outcome flags. Acknowledged at
  // once when the threshold is 0 or the peer's window is full.
  // emit(peer, Range) sends an ack.
  template <typename Emit>
  void complete(std::uint32_t peer, std::uint64_t seq, std::uint16_t flags, Emit&& emit) {
    Origin& o = origins_[peer];
    if (!o.listed) {
      o.listed = true;
      waiting_.push_back(peer);
    }
    o.active.push_back(Entry{seq, flags});
    ++unacked_;
    if (threshold_ == 0 || o.active.size() >= window_) flush(peer, emit);
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
    for (std::uint32_t peer : waiting_) {
      flush(peer, emit);
      origins_[peer].listed = false;
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
  std::size_t unacked(std::uint32_t peer) const { return origins_[peer].active.size(); }
  const PeerStats& stats(std::uint32_t peer) const { return origins_[peer].stats; }

 private:
  struct Entry {
    std::uint64_t seq;
    std::uint16_t flags;
  };
  struct Origin {
    std::vector<Entry> active;  // done, not yet acknowledged
    bool listed = false;        // in waiting_
    PeerStats stats;
  };

  // Acknowledges everything in peer's active queue, coalesced into ranges.
  // A peer flushed by its window stays listed in waiting_, once.
  template <typename Emit>
  void flush(std::uint32_t peer, Emit& emit) {
    Origin& o = origins_[peer];
    if (o.active.empty()) return;
    auto& a = o.active;
    if (!std::is_sorted(a.begin(), a.end(), by_seq)) std::sort(a.begin(), a.end(), by_seq);
    Range r{a[0].seq, 1, a[0].flags};
    for (std::size_t i = 1; i < a.size(); ++i) {
      if (a[i].seq == r.first + r.count && a[i].flags == r.flags && r.count < kMaxRange) {
        ++r.count;
        continue;
      }
      emit(peer, r);
      ++o.stats.acks_sent;
      r = Range{a[i].seq, 1, a[i].flags};
    }
    emit(peer, r);
    ++o.stats.acks_sent;
    o.stats.messages_acked += a.size();
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
  std::vector<Origin> origins_;
  std::vector<std::uint32_t> waiting_;  // origins with entries since the last flush_all
  std::size_t unacked_ = 0;             // entries in every origin's active queue
  std::uint64_t last_seen_ = 0;
  unsigned idle_ = 0;
  unsigned lull_ = threshold_;
  std::int64_t gap_avg_ = 0;  // 1/16 advance
};

}  // namespace ami::protocol
