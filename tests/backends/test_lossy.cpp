// One rank of a job of two over verbs across a lossy link: the rxe_lossy test
// (tests/rxe/ami-vm-pair) runs rank 0 and rank 1 in two VMs whose rxe0 sit on
// NICs joined by one link, with tc netem loss, delay and reordering on both
// egresses. Both ranks run the same script at once, so every step goes both
// ways: active messages of 1 B to 1 MiB (odd sizes, unaligned buffers, taken
// whole, into a buffer, by zero copy, deferred and accepted, in pieces), so
// that both the eager path and every rendezvous ending is taken; GETs of
// every size from the peer's region; PUT streams followed by a fence, checked
// by the target when the fence arrives and by the origin with a GET of all
// of it when the fence is done. Rank 0 receives with split_get, rank 1 with
// the default rendezvous modes. Every byte is checked against a
// deterministic pattern where it lands, and every callback must have run
// exactly once, successfully. Last, the soft-RoCE counters show the link
// really lost and reordered packets (retransmissions, NAKs, duplicates).
//
// Started once per rank, not by the unit suite:
//   AMI_RANK=r AMI_SIZE=2 AMI_BOOTSTRAP=host:port AMI_BACKENDS=self,verbs test_lossy
// Prints SKIPPED and exits 77 where there is no active RDMA port (main:
// verbs_main.cpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "ami/ami.hpp"
#include "core_config.hpp"
#include "protocol_config.hpp"

using namespace ami;

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint16_t kHello = 30, kData = 31, kKey = 32, kBye = 33, kFin = 34;
constexpr auto kStepTimeout = std::chrono::seconds(120);
// Callbacks of operations in flight at once: a few messages of up to 1 MiB.
// More only lengthens the bursts a loss makes the transport resend.
constexpr std::size_t kWindow = 24;
// Idle advances after which the rank naps: in the VM an idle rank that
// spins takes a host core from the peer's VM, which then answers late.
constexpr int kIdleSpins = 64;
constexpr auto kNap = std::chrono::microseconds(50);
constexpr int kAmRounds = 3;
constexpr int kSmallPerRound = 400;          // small messages after the sized ones
constexpr int kPutRounds = 3;
constexpr int kGetPasses = 2;
constexpr std::size_t kHalf = 1536 * 1024;   // the region: [0, kHalf) to GET, [kHalf, 2 kHalf) to PUT into
constexpr std::size_t kMaxSlack = 16;        // room for unaligned starts
constexpr std::size_t kLandingSlack = 4096;  // GET chunk i lands i bytes further along
constexpr std::size_t kReadBackPiece = 128 * 1024;

// Sizes around every boundary the protocols have: inline, one packet (the
// verbs bounce size), the rendezvous crossover, the MTU, and far beyond.
constexpr std::size_t kSizes[] = {1,     2,     3,     5,      8,      13,     31,     64,     127,
                                  255,   256,   257,   511,    1000,   1023,   1024,   1025,   2047,
                                  2049,  4000,  4095,  4096,   4097,   6000,   8191,   8192,   8193,
                                  12287, 16383, 16384, 16385,  24577,  32767,  32768,  32769,  49151,
                                  65535, 65536, 65537, 100003, 131071, 196613, 262143, 524287, 1048576};
constexpr std::size_t kSizeCount = std::size(kSizes);
// GET and PUT chunks walk the list with these strides: every size is used.
constexpr std::size_t kGetStride = 7, kPutStride = 11;
static_assert(std::gcd(kSizeCount, kGetStride) == 1 && std::gcd(kSizeCount, kPutStride) == 1);

std::uint8_t pattern_byte(std::uint32_t seed, std::uint64_t i) {
  std::uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (std::uint64_t{seed} << 32 | seed);
  x ^= x >> 29;
  return static_cast<std::uint8_t>(x ^ (x >> 17) ^ (i >> 12));
}

void fill(std::uint8_t* p, std::size_t n, std::uint32_t seed, std::uint64_t base = 0) {
  for (std::size_t i = 0; i < n; ++i) p[i] = pattern_byte(seed, base + i);
}

// Index of the first byte that differs from the pattern, or n.
std::size_t first_wrong(const std::uint8_t* p, std::size_t n, std::uint32_t seed, std::uint64_t base = 0) {
  for (std::size_t i = 0; i < n; ++i)
    if (p[i] != pattern_byte(seed, base + i)) return i;
  return n;
}

std::uint32_t am_seed(std::uint32_t origin, int round, int index) {
  return 0x10000u * (origin + 1) + 0x1000u * static_cast<std::uint32_t>(round) + static_cast<std::uint32_t>(index);
}
std::uint32_t put_seed(std::uint32_t origin, int round) {
  return 0xA0000u + 16 * origin + static_cast<std::uint32_t>(round);
}
std::uint32_t exposed_seed(std::uint32_t owner) { return 0xB0000u + owner; }

// The size of message index of a round: the sized list, then small ones.
std::size_t am_size(int index) {
  if (index < static_cast<int>(kSizeCount)) return kSizes[index];
  return static_cast<std::size_t>((index * 37) % 700 + 1);
}
constexpr int kAmPerRound = static_cast<int>(kSizeCount) + kSmallPerRound;

struct MessageHeader {
  std::uint32_t round;
  std::uint32_t index;
  std::uint64_t bytes;
  std::uint32_t seed;
  std::uint32_t reserved;
};

struct Hello {
  std::uint32_t heard;  // the sender has heard from this rank already
};

class LossyRank;

// One callback that must run exactly once, successfully; then it does `then`.
// Outbound: a callback of an operation this rank posted.
struct Tally {
  LossyRank* owner = nullptr;
  bool outbound = true;
  std::string what;
  int calls = 0;
  Status last;
  std::function<void()> then;
};

// A message from the peer as it arrives here.
struct Arrival {
  MessageHeader header{};
  int handler_calls = 0;
  int mode = 0;  // 0 whole, 1 buffer, 2 zero copy, 3 deferred, 4 pieces
  std::vector<std::uint8_t> storage;
  std::size_t offset = 0;         // the buffer starts here in storage: unaligned
  std::uint64_t next_piece = 0;   // pieces: the next offset expected
  bool pieces_in_order = true;
  std::size_t piece_wrong = 0;    // pieces: bytes beyond the message's end
  Deferred deferred;
  Callback accept_done;
  bool accepted = false;
  bool complete = false;
};

class LossyRank {
 public:
  explicit LossyRank(Client& client)
      : ctx_(client.context(0)), rank_(client.task()), peer_{1 - client.task(), 0} {
    region_.assign(2 * kHalf, 0);
    source_.assign(kHalf + kMaxSlack, 0);
    landing_.assign(kHalf + kLandingSlack, 0);
    fill(region_.data(), kHalf, exposed_seed(rank_));
    REQUIRE(client.register_memory(region_.data(), region_.size(), region_mem_).ok());
    REQUIRE(client.register_memory(source_.data(), source_.size(), source_mem_).ok());
    REQUIRE(client.register_memory(landing_.data(), landing_.size(), landing_mem_).ok());
    REQUIRE(ctx_.set_dispatch(kHello, {&LossyRank::on_hello, this}).ok());
    REQUIRE(ctx_.set_dispatch(kData, {&LossyRank::on_data, this}).ok());
    REQUIRE(ctx_.set_dispatch(kKey, {&LossyRank::on_key, this}).ok());
    REQUIRE(ctx_.set_dispatch(kBye, {&LossyRank::on_count, &byes_}).ok());
    REQUIRE(ctx_.set_dispatch(kFin, {&LossyRank::on_count, &fins_}).ok());
    ctx_.set_fence_handler({&LossyRank::on_fence, this});
    ctx_.set_error_handler({+[](void* c, Endpoint peer, Status why) {
      auto* r = static_cast<LossyRank*>(c);
      if (r->finishing_) return;
      FAIL_CHECK("peer task " << peer.task << " failed: " << to_string(why));
      r->peer_failed_ = true;
    }, this});
  }

  void run() {
    meet();
    exchange_keys();
    for (int round = 0; round < kAmRounds; ++round) am_round(round);
    for (int pass = 0; pass < kGetPasses; ++pass) get_pass(pass);
    for (int round = 0; round < kPutRounds; ++round) put_round(round);
    finish();
    check_every_callback();
    report();
  }

 private:
  // ---- progress ----------------------------------------------------------

  void advance() {
    if (ctx_.advance() != 0) {
      idle_ = 0;
    } else if (++idle_ >= kIdleSpins) {
      std::this_thread::sleep_for(kNap);
      idle_ = 0;
    }
    for (Arrival* a : to_accept_) {
      if (a->accepted || a->deferred.id == 0) continue;
      if (!a->accept_done) {
        a->accept_done = expect_inbound("accept " + std::to_string(a->header.round) + "." +
                                            std::to_string(a->header.index),
                                        [this, a] { arrived(*a); });
      }
      const Status s = ctx_.accept(a->deferred, a->storage.data() + a->offset, a->accept_done);
      if (s == StatusCode::no_resource) continue;
      CHECK_MESSAGE(s.ok(), "accept: " << to_string(s));
      a->accepted = true;
    }
    std::erase_if(to_accept_, [](Arrival* a) { return a->accepted; });
  }

  void wait_for(const std::string& what, const std::function<bool()>& done) {
    const auto deadline = Clock::now() + kStepTimeout;
    while (!done()) {
      advance();
      if (Clock::now() > deadline) REQUIRE_MESSAGE(false, "rank " << rank_ << ": timed out waiting for " << what);
      REQUIRE_MESSAGE(!peer_failed_, "rank " << rank_ << ": the peer failed while waiting for " << what);
    }
  }

  // Posts until the call takes it: a full request pool only needs progress.
  void post(const std::string& what, const std::function<Status()>& call) {
    wait_for("room for " + what, [&] { return in_flight() < kWindow; });
    const auto deadline = Clock::now() + kStepTimeout;
    for (;;) {
      const Status s = call();
      if (s.ok()) return;
      REQUIRE_MESSAGE(s == StatusCode::no_resource, what << ": " << to_string(s));
      REQUIRE_MESSAGE(Clock::now() < deadline, what << ": still no resource");
      advance();
    }
  }

  // Operations this rank posted whose callbacks have not all run.
  std::size_t in_flight() const { return static_cast<std::size_t>(out_expected_ - out_fired_); }

  Callback expect(std::string what, std::function<void()> then = {}) {
    return tally(true, std::move(what), std::move(then));
  }
  Callback expect_inbound(std::string what, std::function<void()> then) {
    return tally(false, std::move(what), std::move(then));
  }
  Callback tally(bool outbound, std::string what, std::function<void()> then) {
    tallies_.push_back({this, outbound, std::move(what), 0, {}, std::move(then)});
    if (outbound) ++out_expected_;
    return {&LossyRank::on_tally, &tallies_.back()};
  }

  static void on_tally(void* cookie, Status s) {
    auto* t = static_cast<Tally*>(cookie);
    CHECK_MESSAGE(s.ok(), t->what << ": " << to_string(s));
    t->last = s;
    if (++t->calls != 1) {
      FAIL_CHECK(t->what << " ran " << t->calls << " times");
      return;
    }
    if (t->outbound) ++t->owner->out_fired_;
    if (t->then && s.ok()) t->then();
  }

  // ---- meeting the peer ----------------------------------------------------

  // Handlers are set before anything is sent, so a message from the peer
  // proves that its handlers are there: hellos go out until the peer's
  // arrives (earlier ones may find no handler and are dropped), then one that
  // says so; done when the peer has said so too.
  void meet() {
    auto say = [&](bool heard) {
      const Hello h{heard ? 1u : 0u};
      return ctx_.send_immediate({.dest = peer_, .dispatch = kHello, .payload = std::as_bytes(std::span(&h, 1))});
    };
    auto last = Clock::now() - std::chrono::seconds(1);
    bool told = false;
    wait_for("the peer's hello", [&] {
      if (heard_peer_ && !told) told = say(true).ok();
      if (!heard_peer_ && Clock::now() - last > std::chrono::milliseconds(100)) {
        (void)say(false);
        last = Clock::now();
      }
      return heard_peer_ && told && peer_heard_us_;
    });
  }

  static void on_hello(void* c, const Incoming& in, Receive*) {
    auto* r = static_cast<LossyRank*>(c);
    Hello h{};
    REQUIRE(in.payload.size() == sizeof h);
    std::memcpy(&h, in.payload.data(), sizeof h);
    r->heard_peer_ = true;
    if (h.heard != 0) r->peer_heard_us_ = true;
  }

  void exchange_keys() {
    const auto bytes = region_mem_.remote_key().to_bytes();
    const Callback sent = expect("key sent"), received = expect("key received");
    post("key", [&] {
      return ctx_.send({.dest = peer_, .dispatch = kKey, .payload = std::span(bytes), .local_done = sent,
                        .remote_done = received});
    });
    wait_for("the peer's key", [&] { return have_peer_key_; });
  }

  static void on_key(void* c, const Incoming& in, Receive* recv) {
    auto* r = static_cast<LossyRank*>(c);
    REQUIRE(recv == nullptr);
    REQUIRE(RemoteKey::from_bytes(in.payload, r->peer_key_).ok());
    CHECK(!r->have_peer_key_);
    r->have_peer_key_ = true;
  }

  // ---- active messages -------------------------------------------------------

  void am_round(int round) {
    const std::string name = "AM round " + std::to_string(round);
    for (int i = 0; i < kAmPerRound; ++i) {
      const std::size_t size = am_size(i);
      const std::size_t offset = static_cast<std::size_t>(i % 7) + 1;
      auto& buf = send_buffers_.emplace_back(size + offset, 0);
      const MessageHeader h{static_cast<std::uint32_t>(round), static_cast<std::uint32_t>(i), size,
                            am_seed(rank_, round, i), 0};
      fill(buf.data() + offset, size, h.seed);
      const auto header = std::as_bytes(std::span(&h, 1));
      const auto payload = std::as_bytes(std::span(buf.data() + offset, size));
      const std::string what = name + " message " + std::to_string(i) + " (" + std::to_string(size) + " B)";
      const Callback local = expect(what + " local_done"), remote = expect(what + " remote_done");
      post(name, [&] {
        return ctx_.send({.dest = peer_, .dispatch = kData, .header = header, .payload = payload,
                          .local_done = local, .remote_done = remote});
      });
      bytes_sent_ += size;
      ++messages_sent_;
    }
    bool fenced = false;
    const Callback fence_done = expect(name + " fence", [&] { fenced = true; });
    post(name + " fence", [&] { return ctx_.fence(peer_, fence_done); });
    wait_for(name, [&] { return fenced && in_flight() == 0; });
    send_buffers_.clear();  // every local_done ran
    wait_for(name + " from the peer", [&] { return complete_[round] == kAmPerRound; });
  }

  static void on_data(void* c, const Incoming& in, Receive* recv) {
    auto* r = static_cast<LossyRank*>(c);
    MessageHeader h{};
    REQUIRE(in.header.size() == sizeof h);
    std::memcpy(&h, in.header.data(), sizeof h);
    REQUIRE(h.round < static_cast<std::uint32_t>(kAmRounds));
    CHECK(in.origin == r->peer_);
    CHECK(in.total_bytes == h.bytes);
    Arrival& a = r->arrivals_[std::uint64_t{h.round} << 32 | h.index];
    a.header = h;
    CHECK_MESSAGE(++a.handler_calls == 1, "message " << h.round << "." << h.index << " handled twice");
    ++r->handled_[h.round];
    if (recv == nullptr) {
      a.mode = 0;
      CHECK(in.payload.size() == h.bytes);
      const auto* p = reinterpret_cast<const std::uint8_t*>(in.payload.data());
      a.storage.assign(p, p + in.payload.size());
      r->arrived(a);
      return;
    }
    a.offset = h.index % 5 + 1;
    a.storage.assign(h.bytes + a.offset, 0);
    a.mode = 1 + static_cast<int>(h.index % 4);
    if (a.mode == 3 && !in.can_defer) a.mode = 1;
    switch (a.mode) {
      case 2: recv->zero_copy = true; [[fallthrough]];
      case 1: recv->buffer = a.storage.data() + a.offset; break;
      case 3: recv->defer = &a.deferred; r->to_accept_.push_back(&a); break;
      case 4:
        recv->piece = &LossyRank::on_piece;
        recv->piece_cookie = &a;
        break;
    }
    if (a.mode != 3)
      recv->done = r->expect_inbound("receive " + std::to_string(h.round) + "." + std::to_string(h.index),
                                     [r, &a] { r->arrived(a); });
  }

  static void on_piece(void* c, std::uint64_t offset, std::span<const std::byte> bytes) {
    auto* a = static_cast<Arrival*>(c);
    if (offset != a->next_piece) a->pieces_in_order = false;
    const auto* p = reinterpret_cast<const std::uint8_t*>(bytes.data());
    if (offset + bytes.size() > a->header.bytes) {
      a->piece_wrong += bytes.size();
      return;
    }
    std::memcpy(a->storage.data() + a->offset + offset, p, bytes.size());
    a->next_piece = offset + bytes.size();
  }

  void arrived(Arrival& a) {
    const MessageHeader& h = a.header;
    CHECK_MESSAGE(!a.complete, "message " << h.round << "." << h.index << " completed twice");
    a.complete = true;
    const std::size_t wrong = first_wrong(a.storage.data() + a.offset, h.bytes, h.seed);
    CHECK_MESSAGE(wrong == h.bytes, "message " << h.round << "." << h.index << " of " << h.bytes << " B (mode "
                                                << a.mode << "): byte " << wrong << " is wrong");
    if (a.mode == 4) {
      CHECK(a.pieces_in_order);
      CHECK(a.piece_wrong == 0);
      CHECK(a.next_piece == h.bytes);
    }
    bytes_received_ += h.bytes;
    ++messages_received_;
    ++complete_[h.round];
    a.storage = {};
  }

  // ---- fences as the target ------------------------------------------------------

  // The peer's fences come in the order its script posts them: one per AM
  // round, then one per PUT round. When one arrives, every message and every
  // PUT the peer posted before it must be here.
  static void on_fence(void* c, Endpoint origin) {
    auto* r = static_cast<LossyRank*>(c);
    CHECK(origin == r->peer_);
    const int k = r->fences_from_peer_++;
    if (k < kAmRounds) {
      CHECK_MESSAGE(r->handled_[k] == kAmPerRound,
                    "fence after AM round " << k << ": " << r->handled_[k] << " of " << kAmPerRound << " handled");
      return;
    }
    const int round = k - kAmRounds;
    REQUIRE(round < kPutRounds);
    const std::size_t wrong = first_wrong(r->region_.data() + kHalf, kHalf, put_seed(r->peer_.task, round));
    CHECK_MESSAGE(wrong == kHalf, "fence after PUT round " << round << ": byte " << wrong << " of the region is wrong");
    ++r->put_rounds_checked_;
  }

  // ---- GET and PUT -------------------------------------------------------------

  // The peer's exposed half in chunks of every size, all in flight at once
  // (within the window), chunk i landing i bytes further than the one
  // before ends, so at every alignment; each checked when its GET is done.
  void get_pass(int pass) {
    const std::string name = "GET pass " + std::to_string(pass);
    std::uint64_t at = static_cast<std::uint64_t>(pass) * 3;
    std::memset(landing_.data(), 0, landing_.size());
    for (std::size_t i = 0; at < kHalf; ++i) {
      const std::uint64_t bytes =
          std::min<std::uint64_t>(kSizes[(i * kGetStride + static_cast<std::size_t>(pass)) % kSizeCount], kHalf - at);
      const std::uint64_t remote = at, local = at + i;
      REQUIRE(local + bytes <= landing_.size());
      const Callback done = expect(name + " " + std::to_string(bytes) + " B at " + std::to_string(remote),
                                   [this, local, remote, bytes] {
        const std::size_t wrong = first_wrong(landing_.data() + local, bytes, exposed_seed(peer_.task), remote);
        CHECK_MESSAGE(wrong == bytes, "GET of " << bytes << " B at " << remote << ": byte " << wrong << " is wrong");
        get_bytes_ += bytes;
      });
      post(name, [&] {
        return ctx_.get({.dest = peer_, .local = &landing_mem_, .local_offset = local, .remote = peer_key_,
                         .remote_offset = remote, .bytes = bytes, .local_done = done});
      });
      ++gets_;
      at += bytes;
    }
    wait_for(name, [&] { return in_flight() == 0; });
  }

  // A stream of PUTs covering the peer's target half with a new pattern,
  // then a fence; when it is done, the whole half comes back by GET.
  void put_round(int round) {
    const std::string name = "PUT round " + std::to_string(round);
    const std::uint32_t seed = put_seed(rank_, round);
    fill(source_.data(), kHalf, seed);
    std::uint64_t at = 0;
    for (std::size_t i = 0; at < kHalf; ++i) {
      const std::uint64_t bytes =
          std::min<std::uint64_t>(kSizes[(i * kPutStride + static_cast<std::size_t>(round)) % kSizeCount], kHalf - at);
      const std::uint64_t offset = at;
      const Callback done = expect(name + " " + std::to_string(bytes) + " B at " + std::to_string(offset));
      post(name, [&] {
        return ctx_.put({.dest = peer_, .local = &source_mem_, .local_offset = offset, .remote = peer_key_,
                         .remote_offset = kHalf + offset, .bytes = bytes, .local_done = done});
      });
      ++puts_;
      put_bytes_ += bytes;
      at += bytes;
    }
    bool fenced = false;
    const Callback fence_done = expect(name + " fence", [&] { fenced = true; });
    post(name + " fence", [&] { return ctx_.fence(peer_, fence_done); });
    wait_for(name + " fence", [&] { return fenced; });
    // The fence is done: every PUT is in place at the peer. Read it all back,
    // in pieces of kReadBackPiece: one RDMA READ of it all would be resent
    // whole, over and over, on this link (see tests/rxe/README.md).
    std::memset(landing_.data(), 0, landing_.size());
    for (std::uint64_t piece = 0; piece < kHalf; piece += kReadBackPiece) {
      const std::uint64_t bytes = std::min<std::uint64_t>(kReadBackPiece, kHalf - piece);
      const Callback read_back = expect(name + " read back at " + std::to_string(piece), [this, piece, bytes, seed,
                                                                                            name] {
        const std::size_t wrong = first_wrong(landing_.data() + piece, bytes, seed, piece);
        CHECK_MESSAGE(wrong == bytes, name << " read back after the fence: byte " << piece + wrong << " is wrong");
        get_bytes_ += bytes;
      });
      post(name + " read back", [&] {
        return ctx_.get({.dest = peer_, .local = &landing_mem_, .local_offset = piece, .remote = peer_key_,
                         .remote_offset = kHalf + piece, .bytes = bytes, .local_done = read_back});
      });
      ++gets_;
    }
    wait_for(name + " read back", [&] { return in_flight() == 0; });
    // In step with the peer: its round's fence has come (and was checked) here.
    wait_for("the peer's " + name, [&] { return put_rounds_checked_ > round; });
  }

  // ---- the end ---------------------------------------------------------------

  static void on_count(void* c, const Incoming&, Receive*) { ++*static_cast<int*>(c); }

  // Bye with remote_done both ways: then each rank knows the other got
  // everything. Fin then tells the peer that its bye was answered; its
  // delivery is the transport's, so the rank lingers, advancing, while the
  // transport may still have to resend it.
  void finish() {
    const Callback bye_sent = expect("bye sent"), bye_received = expect("bye received");
    post("bye", [&] {
      return ctx_.send({.dest = peer_, .dispatch = kBye, .local_done = bye_sent, .remote_done = bye_received});
    });
    wait_for("bye", [&] { return byes_ == 1 && in_flight() == 0; });
    const Callback fin_sent = expect("fin sent");
    post("fin", [&] { return ctx_.send({.dest = peer_, .dispatch = kFin, .local_done = fin_sent}); });
    wait_for("fin", [&] { return fins_ == 1 && in_flight() == 0; });
    finishing_ = true;
    const auto end = Clock::now() + std::chrono::milliseconds(1500);
    while (Clock::now() < end) advance();
  }

  void check_every_callback() {
    std::size_t wrong = 0;
    for (const Tally& t : tallies_)
      if (t.calls != 1 || !t.last.ok()) {
        if (++wrong <= 10) FAIL_CHECK(t.what << ": ran " << t.calls << " times, last status " << to_string(t.last));
      }
    CHECK(wrong == 0);
    CHECK(out_fired_ == out_expected_);
    CHECK(messages_received_ == static_cast<std::uint64_t>(kAmRounds) * kAmPerRound);
    for (const auto& [key, a] : arrivals_) {
      CHECK(a.handler_calls == 1);
      CHECK(a.complete);
    }
    CHECK(fences_from_peer_ == kAmRounds + kPutRounds);
    CHECK(byes_ == 1);
    CHECK(fins_ == 1);
    CHECK(ctx_.stats().malformed_packets == 0);
  }

  void report() {
    const ContextStats& s = ctx_.stats();
    std::printf("lossy: rank %u: %llu messages (%llu B) sent, %llu (%llu B) received and checked; %llu PUTs (%llu B), "
                "%llu GETs (%llu B checked); %zu callbacks counted\n",
                rank_, ull(messages_sent_), ull(bytes_sent_), ull(messages_received_), ull(bytes_received_),
                ull(puts_), ull(put_bytes_), ull(gets_), ull(get_bytes_), tallies_.size());
    std::printf("lossy: rank %u: stats: packets %llu sent %llu received; rendezvous %llu sent, %llu stopped "
                "(discard_get %llu, split_get %llu, stop_put %llu), %llu eager-complete; fences %llu by message, "
                "%llu answered; acks %llu sent; keepalives %llu sent; unknown dispatch %llu\n",
                rank_, ull(s.packets_sent), ull(s.packets_received), ull(s.rndv_sent), ull(s.rndv_stopped),
                ull(s.rndv_stops_by_mode[0]), ull(s.rndv_stops_by_mode[1]), ull(s.rndv_stops_by_mode[2]),
                ull(s.rndv_eager_complete), ull(s.fences_by_message), ull(s.fences_answered), ull(s.acks_sent),
                ull(s.keepalives_sent), ull(s.unknown_dispatch));
    // The rendezvous took more than one way here.
    CHECK(s.rndv_stopped > 0);
    CHECK(s.rndv_eager_complete > 0);

    const auto counters = hw_counters();
    std::string line;
    for (const auto& [name, value] : counters) line += " " + name + "=" + std::to_string(value);
    std::printf("lossy: rank %u: %s hw_counters:%s\n", rank_, device_.c_str(),
                counters.empty() ? " none" : line.c_str());
    // Signs of loss and reordering: the requester's retries (timeouts) and
    // the NAKs it got, the responder's out-of-sequence and duplicate packets.
    std::uint64_t loss = 0;
    bool any = false;
    for (const char* name : {"completer_retry_err", "rcvd_seq_err", "out_of_seq_request", "duplicate_request"})
      if (auto it = counters.find(name); it != counters.end()) {
        loss += it->second;
        any = true;
      }
    if (any)
      CHECK_MESSAGE(loss > 0, "no retry, NAK, out-of-sequence or duplicate packet: was the link lossy?");
    else
      std::printf("lossy: rank %u: %s has no retransmission counter\n", rank_, device_.c_str());
    if (auto it = counters.find("retry_exceeded_err"); it != counters.end()) CHECK(it->second == 0);
    std::fflush(stdout);
  }

  std::map<std::string, std::uint64_t> hw_counters() {
    const char* devices = std::getenv("AMI_NET_DEVICES");
    std::string spec = devices != nullptr && *devices != '\0' ? devices : "rxe0:1";
    spec = spec.substr(0, spec.find(','));
    const std::size_t colon = spec.find(':');
    device_ = spec.substr(0, colon);
    const std::string port = colon == std::string::npos ? "1" : spec.substr(colon + 1);
    std::map<std::string, std::uint64_t> out;
    std::error_code ec;
    const std::filesystem::path dir = "/sys/class/infiniband/" + device_ + "/ports/" + port + "/hw_counters";
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      std::ifstream in(e.path());
      std::uint64_t v = 0;
      if (in >> v) out[e.path().filename().string()] = v;
    }
    return out;
  }

  static unsigned long long ull(std::uint64_t v) { return v; }

  Context& ctx_;
  std::uint32_t rank_;
  Endpoint peer_;
  std::vector<std::uint8_t> region_, source_, landing_;
  Memory region_mem_, source_mem_, landing_mem_;
  RemoteKey peer_key_{};
  bool have_peer_key_ = false;
  bool heard_peer_ = false, peer_heard_us_ = false;
  bool finishing_ = false;
  bool peer_failed_ = false;
  int idle_ = 0;

  std::deque<Tally> tallies_;  // stable addresses: each is a callback's cookie
  std::uint64_t out_expected_ = 0, out_fired_ = 0;
  std::deque<std::vector<std::uint8_t>> send_buffers_;
  std::map<std::uint64_t, Arrival> arrivals_;  // stable addresses: cookies and buffers
  std::vector<Arrival*> to_accept_;
  std::array<int, kAmRounds> handled_{}, complete_{};
  int fences_from_peer_ = 0;
  int put_rounds_checked_ = 0;
  int byes_ = 0, fins_ = 0;

  std::uint64_t messages_sent_ = 0, bytes_sent_ = 0, messages_received_ = 0, bytes_received_ = 0;
  std::uint64_t puts_ = 0, put_bytes_ = 0, gets_ = 0, get_bytes_ = 0;
  std::string device_;
};

}  // namespace

TEST_CASE("across a lossy link every byte arrives intact and every callback runs once") {
  Config config = Config::from_environment();
  REQUIRE_MESSAGE((config.number(ami::core::Param("AMI_SIZE")) == 2 && config.origin(ami::core::Param("AMI_RANK")) != "default" &&
                   !config.text(ami::core::Param("AMI_BOOTSTRAP")).empty()),
                  "one rank of a job of two: set AMI_RANK, AMI_SIZE=2 and AMI_BOOTSTRAP");
  // Both VMs boot at once on a loaded host, and the bootstrap's TCP crosses
  // the same lossy link: wait for the peer far longer than on one host.
  if (config.origin(ami::core::Param("AMI_BOOTSTRAP_TIMEOUT")) == "default") REQUIRE(config.set("AMI_BOOTSTRAP_TIMEOUT", "120000").ok());
  // What a receiver does after a stop is its own choice: rank 0 keeps the
  // eager bytes and GETs the rest (split_get), rank 1 decides as by default
  // (stop_put at the first packet; discard_get for what it deferred).
  if (config.origin(ami::protocol::Param("AMI_RNDV_MODE")) == "default" && config.number(ami::core::Param("AMI_RANK")) == 0)
    REQUIRE(config.set("AMI_RNDV_MODE", "split_get").ok());
  Client client({.name = "lossy", .contexts = 1, .job = {}, .config = config});
  REQUIRE(client.size() == 2);
  REQUIRE(client.context(0).backend_for({1 - client.task(), 0}) == "verbs");
  const auto started = Clock::now();
  {
    LossyRank rank(client);
    rank.run();
  }
  std::printf("lossy: rank %u: done in %.1f s\n", client.task(),
              std::chrono::duration<double>(Clock::now() - started).count());
}
