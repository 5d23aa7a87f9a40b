// Batched, coalesced acknowledgements (docs/DESIGN.md, method 4): the ack
// dispatcher's counter logic on its own, step by step, then two engines
// over the self backend, advanced one step at a time so each case can say
// exactly in which advance an ack goes out.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "ami/device/region_table.hpp"
#include "ami/device/reception_queue.hpp"
#include "ack/ack_dispatcher.hpp"
#include "eager/am_engine.hpp"
#include "self_device.hpp"

using namespace ami;
using protocol::AckDispatcher;

namespace {

struct Sent {
  std::uint32_t peer;
  AckDispatcher::Range range;
};

struct Recorder {
  std::vector<Sent> sent;
  void operator()(std::uint32_t peer, const AckDispatcher::Range& r) { sent.push_back({peer, r}); }
};

}  // namespace

TEST_CASE("ack dispatcher: an arrival resets the idle count; acks go only at the threshold") {
  AckDispatcher d(3, 64);
  AckDispatcher::Origin one(1);
  Recorder out;
  d.complete(one, 1, 0, out);
  CHECK(out.sent.empty());
  std::uint64_t arrivals = 1;
  CHECK_FALSE(d.advance(arrivals, out));  // something arrived since the last look: idle 0
  CHECK(d.idle() == 0);
  CHECK_FALSE(d.advance(arrivals, out));  // idle 1
  CHECK_FALSE(d.advance(arrivals, out));  // idle 2
  arrivals = 2;                           // a new arrival
  CHECK_FALSE(d.advance(arrivals, out));
  CHECK(d.idle() == 0);
  CHECK_FALSE(d.advance(arrivals, out));
  CHECK_FALSE(d.advance(arrivals, out));
  CHECK(out.sent.empty());
  CHECK(d.unacked() == 1);
  CHECK(d.advance(arrivals, out));  // the third idle advance: the lull
  REQUIRE(out.sent.size() == 1);
  CHECK(out.sent[0].peer == 1);
  CHECK(out.sent[0].range.first == 1);
  CHECK(out.sent[0].range.count == 1);
  CHECK(d.unacked() == 0);
  // Still in the lull: a message done now (no arrival, e.g. by a GET's
  // completion) goes at the next advance.
  d.complete(one, 2, 0, out);
  CHECK(out.sent.size() == 1);
  CHECK(d.advance(arrivals, out));
  CHECK(out.sent.size() == 2);
  CHECK(one.stats().messages_acked == 2);
  CHECK(one.stats().acks_sent == 2);
}

TEST_CASE("ack dispatcher: one ack per destination for messages done in order") {
  AckDispatcher d(1, 1000);
  AckDispatcher::Origin zero(0), one(1), two(2);
  Recorder out;
  for (std::uint64_t s = 1; s <= 100; ++s) d.complete(zero, s, 0, out);
  for (std::uint64_t s = 5; s <= 7; ++s) d.complete(two, s, 0, out);
  CHECK(zero.unacked() == 100);
  CHECK(two.unacked() == 3);
  CHECK(d.advance(0, out));
  REQUIRE(out.sent.size() == 2);
  CHECK(out.sent[0].peer == 0);
  CHECK(out.sent[0].range.first == 1);
  CHECK(out.sent[0].range.count == 100);
  CHECK(out.sent[1].peer == 2);
  CHECK(out.sent[1].range.first == 5);
  CHECK(out.sent[1].range.count == 3);
  CHECK(zero.stats().acks_sent == 1);
  CHECK(zero.stats().messages_acked == 100);
  CHECK(one.stats().acks_sent == 0);
}

TEST_CASE("ack dispatcher: out of order, gaps and outcomes make ranges") {
  AckDispatcher d(1, 1000);
  AckDispatcher::Origin zero(0);
  Recorder out;
  // 3, 1, 2 done in that order; 4 failed; 6 done, 5 not (a gap).
  d.complete(zero, 3, 0, out);
  d.complete(zero, 1, 0, out);
  d.complete(zero, 2, 0, out);
  d.complete(zero, 4, wire::kFailed, out);
  d.complete(zero, 6, 0, out);
  CHECK(d.advance(0, out));
  REQUIRE(out.sent.size() == 3);
  CHECK(out.sent[0].range.first == 1);
  CHECK(out.sent[0].range.count == 3);
  CHECK(out.sent[0].range.flags == 0);
  CHECK(out.sent[1].range.first == 4);
  CHECK(out.sent[1].range.count == 1);
  CHECK(out.sent[1].range.flags == wire::kFailed);
  CHECK(out.sent[2].range.first == 6);
  CHECK(out.sent[2].range.count == 1);
  CHECK(zero.stats().messages_acked == 5);
}

TEST_CASE("ack dispatcher: the window acknowledges at once under sustained load") {
  AckDispatcher d(1000, 16);
  AckDispatcher::Origin one(1);
  Recorder out;
  std::uint64_t arrivals = 0;
  for (std::uint64_t s = 1; s <= 50; ++s) {
    d.complete(one, s, 0, out);
    CHECK_FALSE(d.advance(++arrivals, out));  // always something new: never a lull
  }
  REQUIRE(out.sent.size() == 3);  // at 16, 32 and 48
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(out.sent[i].range.first == 1 + 16 * i);
    CHECK(out.sent[i].range.count == 16);
  }
  CHECK(one.unacked() == 2);
  // The stream stops: the last two go in the lull.
  for (int i = 0; i < 999; ++i) CHECK_FALSE(d.advance(arrivals, out));
  CHECK(d.advance(arrivals, out));
  REQUIRE(out.sent.size() == 4);
  CHECK(out.sent[3].range.first == 49);
  CHECK(out.sent[3].range.count == 2);
  CHECK(one.stats().messages_acked == 50);
}

TEST_CASE("ack dispatcher: a stream with gaps between arrivals is not a series of lulls") {
  AckDispatcher d(4, 64);
  AckDispatcher::Origin zero(0);
  Recorder out;
  std::uint64_t arrivals = 0;
  std::uint64_t seq = 0;
  // A message every 10 advances: at first each gap is a lull (4 idle
  // advances), then the dispatcher learns the stream's rhythm.
  for (int m = 0; m < 40; ++m) {
    d.complete(zero, ++seq, 0, out);
    (void)d.advance(++arrivals, out);
    for (int i = 0; i < 9; ++i) (void)d.advance(arrivals, out);
  }
  CHECK(d.lull() >= 16);  // twice the 9 idle advances between arrivals
  CHECK(d.lull() <= 18);
  const std::size_t early = out.sent.size();
  CHECK(early >= 5);  // the first gaps were taken for lulls
  for (int m = 0; m < 100; ++m) {
    d.complete(zero, ++seq, 0, out);
    (void)d.advance(++arrivals, out);
    for (int i = 0; i < 9; ++i) (void)d.advance(arrivals, out);
  }
  // In rhythm: only full windows are answered.
  CHECK(out.sent.size() > early);
  CHECK(out.sent.size() <= early + 2);
  for (std::size_t i = early; i < out.sent.size(); ++i) CHECK(out.sent[i].range.count == 64);
  // The stream stops: answered after twice its gap, not later.
  int waited = 0;
  while (d.unacked() != 0 && waited < 100) {
    (void)d.advance(arrivals, out);
    ++waited;
  }
  CHECK(d.unacked() == 0);
  CHECK(waited <= 20);
  // A long silence is not learned, and the wait never passes the cap.
  for (int i = 0; i < 1000; ++i) (void)d.advance(arrivals, out);
  (void)d.advance(++arrivals, out);
  CHECK(d.lull() <= 32 * 4);
}

TEST_CASE("ack dispatcher: threshold 0 acknowledges every message at once") {
  AckDispatcher d(0, 64);
  AckDispatcher::Origin zero(0);
  Recorder out;
  for (std::uint64_t s = 1; s <= 5; ++s) d.complete(zero, s, 0, out);
  CHECK(out.sent.size() == 5);
  CHECK(d.advance(1, out));  // always a lull
  CHECK(zero.stats().acks_sent == 5);
}

TEST_CASE("reception queue: credit goes back in batches, or when published") {
  alignas(64) static std::byte memory[sizeof(device::ReceptionQueue::Header) + 8 * 128];
  REQUIRE(sizeof memory == device::ReceptionQueue::bytes_needed(8, 128));
  auto consumer = device::ReceptionQueue::create(memory, 8, 128);
  device::ReceptionQueue producer;
  REQUIRE(device::ReceptionQueue::attach(memory, sizeof memory, producer));
  consumer.set_credit_batch(4);
  CHECK(consumer.credit_batch() == 4);
  auto fill = [&] {
    int n = 0;
    while (auto r = producer.reserve()) {
      CHECK(producer.commit(r, 1, {}));
      ++n;
    }
    return n;
  };
  CHECK(fill() == 8);
  device::ReceptionQueue::Arrival a;
  for (int i = 0; i < 3; ++i) {
    REQUIRE(consumer.peek(a));
    consumer.release();
  }
  CHECK(consumer.occupancy() == 5);  // the consumer's view
  CHECK(fill() == 0);                // the producers' view: three cells held back
  REQUIRE(consumer.peek(a));
  consumer.release();                // the fourth: the batch goes back
  CHECK(fill() == 4);
  REQUIRE(consumer.peek(a));
  consumer.release();
  CHECK(fill() == 0);
  CHECK(consumer.publish() == 1);
  CHECK(consumer.publish() == 0);
  CHECK(fill() == 1);
  consumer.set_credit_batch(1000);
  CHECK(consumer.credit_batch() == 4);  // at most half the ring
}

namespace {

// Two engines (contexts 0 and 1 of one task) over the self backend.
struct Pair {
  device::RegionTable regions{1, 0, 16};
  self::SelfDomain domain{0, 2, 256, 1024, regions};
  self::SelfDevice da{domain, 0, 256};
  self::SelfDevice db{domain, 1, 256};
  ContextStats sa, sb;
  protocol::AmEngine ea, eb;
  std::vector<int> remote_done;  // per message: how often its remote-done ran
  int failures = 0;
  int fences_done = 0;

  Pair(unsigned threshold, unsigned window)
      : ea({.tasks = 1, .contexts = 2,
            .options = {.max_requests = 256, .ack_idle_threshold = threshold, .ack_max_unacked = window}}, sa),
        eb({.tasks = 1, .contexts = 2,
            .options = {.max_requests = 256, .ack_idle_threshold = threshold, .ack_max_unacked = window}}, sb) {
    ea.add_device(da);
    eb.add_device(db);
    REQUIRE(eb.set_dispatch(1, {+[](void*, const Incoming&, Receive*) {}, nullptr}).ok());
  }
  struct Token {
    Pair* pair;
    std::size_t index;
  };
  std::vector<Token> tokens;
  // n 8-byte sends with remote-done from a to b.
  void stream(std::size_t n) {
    tokens.reserve(4096);
    static const std::uint64_t word = 42;
    for (std::size_t i = 0; i < n; ++i) {
      remote_done.push_back(0);
      tokens.push_back({this, remote_done.size() - 1});
      REQUIRE(ea.send({.dest = {0, 1}, .dispatch = 1, .payload = std::as_bytes(std::span(&word, 1)),
                       .remote_done = {+[](void* c, Status s) {
                         auto* t = static_cast<Token*>(c);
                         ++t->pair->remote_done[t->index];
                         if (!s.ok()) ++t->pair->failures;
                       }, &tokens.back()}}).ok());
    }
  }
};

}  // namespace

// The self backend executes a lane's descriptors in its owner's advance:
// a's advance delivers what a sent, b's what b sent.
TEST_CASE("engines: a burst is answered by one ack in the receiver's lull, each remote-done once") {
  Pair p(4, 1000);
  p.stream(100);
  (void)p.ea.advance();
  // The first message found none of a's awaiting b's answer: it asked to be
  // answered when done (wire::kAnswerSoon), and was, as it arrived. The
  // other 99 wait for the lull.
  while (p.sb.messages_received < 100) (void)p.eb.advance();  // 64 arrivals per advance
  CHECK(p.sb.acks_sent == 1);
  CHECK(p.sb.messages_acked == 1);
  for (int i = 0; i < 3; ++i) (void)p.eb.advance();
  CHECK(p.sb.acks_sent == 1);  // three idle advances: not yet
  (void)p.eb.advance();        // the fourth
  CHECK(p.sb.acks_sent == 2);
  CHECK(p.sb.messages_acked == 100);
  CHECK(p.eb.ack_stats({0, 0}).acks_sent == 2);
  CHECK(p.eb.ack_stats({0, 0}).messages_acked == 100);
  CHECK(p.eb.ack_stats({0, 1}).acks_sent == 0);
  (void)p.eb.advance();
  (void)p.ea.advance();
  CHECK(p.sa.acks_received == 2);
  CHECK(p.sa.messages_ack_received == 100);
  for (int n : p.remote_done) CHECK(n == 1);
  CHECK(p.failures == 0);
}

TEST_CASE("engines: under sustained load the window answers; the tail goes when the stream stops") {
  Pair p(1000, 32);
  for (int round = 0; round < 10; ++round) {
    p.stream(25);
    (void)p.ea.advance();
    (void)p.eb.advance();
  }
  CHECK(p.sb.messages_received == 250);
  CHECK(p.sb.acks_sent == 8);  // the first message's (answered soon), seven full windows, no lull yet
  for (int i = 0; i < 1000; ++i) (void)p.eb.advance();
  CHECK(p.sb.acks_sent == 9);  // the lull: the last 25
  for (int i = 0; i < 2; ++i) {
    (void)p.eb.advance();
    (void)p.ea.advance();
  }
  CHECK(p.sa.messages_ack_received == 250);
  CHECK(p.sa.acks_received == 9);
  for (int n : p.remote_done) CHECK(n == 1);
}

TEST_CASE("engines: threshold 0 acks each message as it is done") {
  Pair p(0, 64);
  p.stream(20);
  (void)p.ea.advance();
  (void)p.eb.advance();
  CHECK(p.sb.acks_sent == 20);
  (void)p.eb.advance();
  (void)p.ea.advance();
  for (int n : p.remote_done) CHECK(n == 1);
}

TEST_CASE("engines: a fence's answer goes through the dispatcher, at once, with what it held") {
  Pair p(3, 64);
  p.stream(5);
  REQUIRE(p.ea.fence({0, 1}, {+[](void* c, Status s) {
                        CHECK(s.ok());
                        ++static_cast<Pair*>(c)->fences_done;
                      }, &p}).ok());
  (void)p.ea.advance();
  // The first message's ack goes as it arrives (answered soon); the other
  // four and the fence: one ack answers them all, no lull awaited.
  (void)p.eb.advance();
  CHECK(p.sb.fences_answered == 1);
  CHECK(p.sb.acks_sent == 2);
  CHECK(p.sb.messages_acked == 6);
  (void)p.eb.advance();  // (the ack packet leaves)
  (void)p.ea.advance();
  CHECK(p.fences_done == 1);
  for (int n : p.remote_done) CHECK(n == 1);
}

TEST_CASE("engines: a fence is answered while its target never has a lull") {
  // b keeps receiving (a stream from a that never pauses long enough for a
  // lull, far below the window): the fence between its messages is
  // answered in the advance that handles it all the same.
  Pair p(1000, 4096);
  int fences = 0;
  for (int round = 0; round < 20; ++round) {
    p.stream(3);
    REQUIRE(p.ea.fence({0, 1}, {+[](void* c, Status s) {
                          CHECK(s.ok());
                          ++*static_cast<int*>(c);
                        }, &fences}).ok());
    (void)p.ea.advance();
    (void)p.eb.advance();  // the messages and the fence, answered
    (void)p.eb.advance();  // (the ack packet leaves; far from a lull)
    (void)p.ea.advance();
    CHECK(fences == round + 1);
  }
  CHECK(p.sb.acks_sent == 40);  // per round: the first message's (answered soon), and the fence's with the rest
}

TEST_CASE("engines: a message alone among its sender's unanswered ones is answered when done") {
  // No lull in sight (threshold 1000): the sender waits on its only
  // message (a ping-pong of long messages, a collective's step).
  Pair p(1000, 64);
  for (int round = 0; round < 3; ++round) {
    p.stream(1);
    (void)p.ea.advance();
    (void)p.eb.advance();
    CHECK(p.sb.acks_sent == static_cast<std::uint64_t>(round) + 1);
    (void)p.eb.advance();  // (the ack packet leaves)
    (void)p.ea.advance();
    CHECK(p.remote_done[static_cast<std::size_t>(round)] == 1);
  }
  // Two at once: the second is not alone and waits for a batch.
  p.stream(2);
  (void)p.ea.advance();
  (void)p.eb.advance();
  CHECK(p.sb.acks_sent == 4);
  CHECK(p.sb.messages_acked == 4);
  for (int i = 0; i < 1000; ++i) (void)p.eb.advance();
  CHECK(p.sb.acks_sent == 5);
  CHECK(p.sb.messages_acked == 5);
}

TEST_CASE("engines: a context's idle advances are work while it owes acks") {
  Pair p(2, 64);
  p.stream(2);
  (void)p.ea.advance();
  CHECK(p.eb.advance() != 0);  // the arrivals; the first, answered soon, is acked
  CHECK(p.sb.acks_sent == 1);
  CHECK(p.eb.advance() != 0);  // idle, but an ack is owed (the second's)
  CHECK(p.sb.acks_sent == 1);
  CHECK(p.eb.advance() != 0);  // the lull: the ack goes
  CHECK(p.sb.acks_sent == 2);
  std::size_t work = 1;
  for (int i = 0; i < 10 && work != 0; ++i) work = p.eb.advance() + p.ea.advance();
  CHECK(work == 0);
  CHECK(p.remote_done[0] == 1);
  CHECK(p.remote_done[1] == 1);
}
