// tools/harness/session.cpp — the two sides of a measurement and how they
// are started. The server is passive: it answers (send latency: a message
// of the same size from its own buffer) or writes back (write latency),
// absorbs (bandwidth), hands out a registered buffer's key (PUT/GET) and
// answers syncs; the client drives and prints.
#include <sched.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "ami/ami.hpp"
#include "ami/wait.hpp"
#include "harness.hpp"
#include "report.hpp"

namespace ami::tools {

namespace {

// A test buffer on whole pages, as perftest's: where a message starts in a
// page is then the same in every run, and a copy of it touches as few pages
// as its length needs.
class PageBytes {
 public:
  explicit PageBytes(std::size_t size) : size_(size) {
    const long page = ::sysconf(_SC_PAGESIZE);
    const std::size_t p = page > 0 ? static_cast<std::size_t>(page) : 4096;
    const std::size_t bytes = (size + p - 1) / p * p;
    bytes_.reset(static_cast<std::byte*>(std::aligned_alloc(p, bytes)));
    if (!bytes_) throw std::bad_alloc();
    std::memset(bytes_.get(), 0, bytes);
  }
  std::byte* data() { return bytes_.get(); }
  std::size_t size() const { return size_; }
  std::byte& operator[](std::size_t i) { return bytes_[i]; }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::size_t size_;
  std::unique_ptr<std::byte[], Free> bytes_;
};

using Clock = std::chrono::steady_clock;

constexpr std::uint16_t kData = 1, kControl = 2;
// kPrepare: send me your buffer's key (kKey); kPeerKey: here is mine (write
// latency: the server writes back into it); kSync(size): get ready for
// size, answered by kSyncAck once the server is. kRemoteDone: the client
// runs with --remote_done (the server's echoes ask for remote_done too);
// kAckStats: send me the acks you sent (kAckReport, an AckFigures), once
// every remote_done you asked for has run. kHello: the first word, answered
// by kSyncAck: the lane is connected both ways (its banner has both ends).
enum Op : std::uint32_t {
  kPrepare = 1, kKey = 2, kSync = 3, kSyncAck = 4, kQuit = 5, kPeerKey = 6,
  kRemoteDone = 7, kAckStats = 8, kAckReport = 9, kHello = 10
};
struct Control {
  std::uint32_t op = 0;
  std::uint32_t reserved = 0;
  std::uint64_t arg = 0;
};

#if defined(__x86_64__)
std::uint64_t cycles() { return __rdtsc(); }
#else
std::uint64_t cycles() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        Clock::now().time_since_epoch()).count());
}
#endif

// The cycle counter's rate against the steady clock, measured once over 50 ms.
double microseconds_per_cycle() {
  static const double rate = [] {
    const auto t0 = Clock::now();
    const std::uint64_t c0 = cycles();
    while (Clock::now() - t0 < std::chrono::milliseconds(50)) {
    }
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    return us / static_cast<double>(cycles() - c0);
  }();
  return rate;
}

std::size_t max_size(const Options& o) { return *std::max_element(o.sizes.begin(), o.sizes.end()); }

// Write latency as perftest measures it: each side RDMA-writes the other's
// buffer and polls the last byte of its own for the round's tag (1..255,
// never 0, so a zeroed buffer holds no tag). The registration is two
// halves: [0, max) is written by the peer, [max, 2 max) is the source.
std::uint8_t tag(std::size_t round) { return static_cast<std::uint8_t>(round % 255 + 1); }

std::uint8_t last_byte(const Memory& m, std::size_t size) {
  auto* p = static_cast<std::uint8_t*>(m.address()) + size - 1;
  return std::atomic_ref<std::uint8_t>(*p).load(std::memory_order_acquire);
}

void set_source_tag(const Memory& m, std::size_t max, std::size_t size, std::uint8_t t) {
  static_cast<std::uint8_t*>(m.address())[max + size - 1] = t;
}

// Posts a control message, advancing while the FIFO is full.
void control(Context& c, Endpoint to, Control m, std::span<const std::byte> payload = {}) {
  for (;;) {
    Status s = c.send_immediate({.dest = to, .dispatch = kControl, .header = std::as_bytes(std::span(&m, 1)),
                                 .payload = payload});
    if (s.ok()) return;
    if (s != StatusCode::no_resource) throw Error("control message: " + to_string(s));
    (void)c.advance();
  }
}

// PUTs, advancing while the context has no request to queue it in.
void put(Context& c, const RdmaParams& p) {
  for (;;) {
    Status s = c.put(p);
    if (s.ok()) return;
    if (s != StatusCode::no_resource) throw Error("put: " + to_string(s));
    (void)c.advance();
  }
}

// send_immediate() of a payload within immediate_limit, copied before it
// returns; no_resource: nothing was sent (larger, or the FIFO is full).
// immediate_limit: c.immediate_limit(to), asked once per run (not per message).
Status try_send_immediate(Context& c, Endpoint to, std::size_t immediate_limit, std::span<const std::byte> payload) {
  if (payload.size() > immediate_limit) return StatusCode::no_resource;
  return c.send_immediate({.dest = to, .dispatch = kData, .payload = payload});
}

// Sends len bytes from buf: immediately when it fits and no callback is
// asked for, else with send(). memory: buf's registration, so a message the
// receiver stops needs none of its own (perftest registers its buffers
// once, too).
Status send_data(Context& c, Endpoint to, std::size_t immediate_limit, const std::byte* buf, std::size_t len,
                 const Memory* memory, Callback done = {}, Callback remote_done = {}) {
  if (!done && !remote_done) {
    Status s = try_send_immediate(c, to, immediate_limit, {buf, len});
    if (s != StatusCode::no_resource) return s;
  }
  return c.send({.dest = to, .dispatch = kData, .payload = {buf, len}, .local_done = done,
                 .remote_done = remote_done, .memory = memory});
}

// The acks a context sent to peer, and its ack dispatcher's configuration.
AckFigures ack_figures(Client& client, Context& c, Endpoint peer) {
  const AckPeerStats a = c.ack_stats(peer);
  // (The protocol's rows are its own: the tools see the public API, and
  // name them at run time.)
  const Config& config = client.config();
  return {.messages_acked = a.messages_acked,
          .acks_sent = a.acks_sent,
          .remote_done_sent = c.stats().remote_done_sent,
          .idle_threshold = static_cast<unsigned>(config.number(ParamName::lookup("AMI_ACK_IDLE_THRESHOLD"))),
          .window = static_cast<unsigned>(config.number(ParamName::lookup("AMI_ACK_MAX_UNACKED")))};
}

// Advances until done() holds; throws when nothing moved it for 30 s
// (progress() returns a count that changes while work is being done).
template <typename Done, typename Progress>
void wait_for(Context& c, Done done, Progress progress, const char* what) {
  constexpr auto kStall = std::chrono::seconds(30);
  auto seen = progress();
  auto since = Clock::now();
  while (!done()) {
    (void)c.advance();
    if (progress() != seen) {
      seen = progress();
      since = Clock::now();
    } else if (Clock::now() - since > kStall) {
      throw Error(std::string(what) + ": nothing for 30 s");
    }
  }
}

Control read_control(const Incoming& in) {
  Control m;
  if (in.header.size() == sizeof m) std::memcpy(&m, in.header.data(), sizeof m);
  return m;
}

class Server {
 public:
  Server(Client& client, Context& c, Endpoint peer, const Options& o)
      : client_(client), c_(c), peer_(peer), immediate_(c.immediate_limit(peer)), o_(o), buffer_(max_size(o) + 64) {
    check(client_.register_memory(buffer_.data(), buffer_.size(), buffer_memory_));
    check(c_.set_dispatch(kData, {&Server::on_data, this}));
    check(c_.set_dispatch(kControl, {&Server::on_control, this}));
  }
  void serve() {
    // -e: asleep until a message (or the end of a remote_done) gives it work.
    const auto work = [&] { return quit_ || (ack_report_wanted_ && remote_pending_ == 0); };
    while (!quit_) {
      if (o_.events)
        check(wait_until(c_, work, {.spin = std::chrono::microseconds(o_.spin_us)}));
      else if (nic_does_atomics())
        check(wait_until(c_, work, {.spin = std::chrono::microseconds(0)}));
      else
        (void)c_.advance();
      if (writing_ && last_byte(memory_, size_) == expect_) write_back();
      if (ack_report_wanted_ && remote_pending_ == 0) report_acks();
    }
  }

  // An atomic test on a region whose atomics are its NIC's
  // (AMI_ATOMIC_MODE=nic): the client's NIC does them with this host's NIC,
  // and this process has nothing to do until the next message, as
  // perftest's passive side: it sleeps rather than take a CPU from the
  // NIC's work (soft-RoCE's is a CPU's).
  bool nic_does_atomics() const {
    return (o_.test == Test::atomic_lat || o_.test == Test::atomic_bw) && memory_.valid() &&
           memory_.remote_key().atomics == AtomicDomain::nic;
  }

 private:
  static void check(Status s) {
    if (!s.ok()) throw Error("server: " + to_string(s));
  }
  void echo(std::size_t len) {
    if (!echo_remote_done_) {
      check(send_data(c_, peer_, immediate_, buffer_.data(), len, &buffer_memory_));
      return;
    }
    check(send_data(c_, peer_, immediate_, buffer_.data(), len, &buffer_memory_, {}, {&Server::on_remote_done, this}));
    ++remote_pending_;
  }
  // The acks this side sent, printed here and reported to the client: every
  // message of the client's is answered by now (its remote_dones ran), and
  // every echo of ours too.
  void report_acks() {
    ack_report_wanted_ = false;
    const AckFigures a = ack_figures(client_, c_, peer_);
    print_acks(a);
    control(c_, peer_, {kAckReport, 0, 0}, std::as_bytes(std::span(&a, 1)));
  }
  static void on_remote_done(void* self, Status s) {
    auto* srv = static_cast<Server*>(self);
    check(s);
    --srv->remote_pending_;
  }
  void write_back() {
    const std::size_t max = max_size(o_);
    set_source_tag(memory_, max, size_, expect_);
    put(c_, {.dest = peer_, .local = &memory_, .local_offset = max, .remote = peer_key_, .bytes = size_});
    expect_ = static_cast<std::uint8_t>(expect_ % 255 + 1);
  }
  static void on_echo_ready(void* self, Status) {
    auto* s = static_cast<Server*>(self);
    s->echo(s->pending_);
  }
  static void on_data(void* self, const Incoming& in, Receive* recv) {
    auto* s = static_cast<Server*>(self);
    const bool latency = s->o_.test == Test::send_lat;
    if (recv != nullptr) {  // a multi-packet message: into the buffer, echo when whole
      recv->buffer = s->buffer_.data();
      recv->memory = &s->buffer_memory_;
      s->pending_ = in.total_bytes;
      if (latency) recv->done = {&Server::on_echo_ready, s};
      return;
    }
    // The answer is a message of the same size from the server's own
    // registered buffer, as ib_send_lat and fi_pingpong answer: neither
    // copies what came (the arrival is gone when the handler returns, and
    // send() reads its payload until local_done).
    if (latency) s->echo(in.payload.size());
  }
  static void on_control(void* self, const Incoming& in, Receive*) {
    auto* s = static_cast<Server*>(self);
    const Control m = read_control(in);
    switch (m.op) {
      case kPrepare: {
        // Memory ami allocates: peers on this host map it and copy directly.
        if (!s->memory_.valid()) check(s->client_.allocate_memory(2 * max_size(s->o_), s->memory_));
        const auto key = s->memory_.remote_key().to_bytes();
        control(s->c_, s->peer_, {kKey, 0, 0}, key);
        break;
      }
      case kPeerKey:
        check(RemoteKey::from_bytes(in.payload, s->peer_key_));
        break;
      case kSync:
        if (s->o_.test == Test::write_lat) {
          if (!s->memory_.valid() || m.arg == 0 || m.arg > max_size(s->o_))
            check({StatusCode::invalid_argument, "write latency: a sync for a size the buffer does not hold"});
          s->size_ = m.arg;
          std::memset(s->memory_.address(), 0, s->size_);
          s->expect_ = tag(0);
          s->writing_ = true;
        }
        control(s->c_, s->peer_, {kSyncAck, 0, m.arg});
        break;
      case kHello: control(s->c_, s->peer_, {kSyncAck, 0, 0}); break;
      case kRemoteDone: s->echo_remote_done_ = true; break;
      case kAckStats: s->ack_report_wanted_ = true; break;
      case kQuit: s->quit_ = true; break;
      default: break;
    }
  }

  Client& client_;
  Context& c_;
  Endpoint peer_;
  std::size_t immediate_;
  const Options& o_;
  PageBytes buffer_;
  Memory buffer_memory_;
  Memory memory_;
  RemoteKey peer_key_{};
  std::size_t pending_ = 0;
  std::size_t size_ = 0;       // write latency: the size being measured
  std::uint8_t expect_ = 0;    // write latency: the tag the client writes next
  bool writing_ = false;
  bool echo_remote_done_ = false;   // send latency with --remote_done
  std::size_t remote_pending_ = 0;  // echoes whose remote_done has not run
  bool ack_report_wanted_ = false;
  bool quit_ = false;
};

class Driver {
 public:
  Driver(Client& client, Context& c, Endpoint peer, const Options& o)
      : client_(client),
        c_(c),
        peer_(peer),
        immediate_(c.immediate_limit(peer)),
        o_(o),
        send_(max_size(o) + 64),
        recv_(max_size(o) + 64) {
    for (std::size_t i = 0; i < send_.size(); ++i) send_[i] = static_cast<std::byte>(i * 13);
    check(client_.register_memory(send_.data(), send_.size(), send_memory_));
    check(client_.register_memory(recv_.data(), recv_.size(), recv_memory_));
    check(c_.set_dispatch(kData, {&Driver::on_data, this}));
    check(c_.set_dispatch(kControl, {&Driver::on_control, this}));
  }

  void run() {
    // Lanes connect on first use: one round trip first, so that the banner
    // shows the connected lane (perftest prints it after its exchange too).
    synced_ = false;
    control(c_, peer_, {kHello, 0, 0});
    wait(synced_);
    const std::string setup = banner_lines();
    print_banner(o_, setup);
    if (is_latency(o_.test)) print_latency_header();
    else print_bandwidth_header(o_.report_gbits);
    if (o_.test != Test::send_lat && o_.test != Test::send_bw) prepare_rdma();
    if (o_.remote_done) control(c_, peer_, {kRemoteDone, 0, 0});
    std::vector<Row> rows;
    for (std::size_t size : o_.sizes) rows.push_back(measure(size));
    print_footer();
    if (o_.stats) print_stats(c_.stats());
    std::vector<std::pair<std::string, AckFigures>> acks;
    if (o_.remote_done) acks = collect_acks();
    control(c_, peer_, {kQuit, 0, 0});
    for (int i = 0; i < 1000; ++i) (void)c_.advance();  // let the quit leave
    if (!o_.out_json.empty() && !write_json(o_, setup, rows, acks))
      throw Error("client: the JSON report is not written");
  }

 private:
  static void check(Status s) {
    if (!s.ok()) throw Error("client: " + to_string(s));
  }
  void wait(const bool& flag) {
    if (o_.events) {
      check(wait_until(c_, [&] { return flag; }, {.spin = std::chrono::microseconds(o_.spin_us)}));
      return;
    }
    while (!flag) (void)c_.advance();
  }

  // --remote_done: the acks the server sent (it prints them too) and, in
  // send latency, where the client answers the echoes, the client's. The
  // server reports once its echoes' remote_dones ran, so the client's acks
  // have all gone by then.
  std::vector<std::pair<std::string, AckFigures>> collect_acks() {
    std::fflush(stdout);  // the server's line comes after the results
    have_report_ = false;
    control(c_, peer_, {kAckStats, 0, 0});
    wait_for(c_, [&] { return have_report_; }, [&] { return c_.stats().acks_sent; },
             "client: waiting for the server's ack report");
    std::vector<std::pair<std::string, AckFigures>> acks{{"server", server_acks_}};
    if (o_.test == Test::send_lat) {
      const AckFigures own = ack_figures(client_, c_, peer_);
      print_acks(own);
      acks.emplace_back("client", own);
    }
    return acks;
  }

  // Advances until every remote_done asked for has run.
  void drain_remote_dones() {
    wait_for(c_, [&] { return remote_pending_ == 0; }, [&] { return remote_pending_; },
             "client: waiting for remote_dones");
    if (!failure_.ok()) throw Error("client: a send failed: " + to_string(failure_));
  }

  // perftest's banner fields: the lane's for verbs, else the backend's line.
  std::string banner_lines() {
    if (o_.backend == "verbs") return c_.describe_lane(peer_);
    const std::string all = client_.describe_backends();
    const std::string prefix = o_.backend + ": ";
    for (std::size_t at = 0; at < all.size();) {
      const std::size_t end = std::min(all.find('\n', at), all.size());
      if (all.compare(at, prefix.size(), prefix) == 0)
        return " Transport       : " + all.substr(at + prefix.size(), end - at - prefix.size()) + "\n";
      at = end + 1;
    }
    return {};
  }

  Row measure(std::size_t size) {
    switch (o_.test) {
      case Test::send_lat:
        if (!o_.remote_done) return chained_latency(size);
        return latency(size, [&] { send_round(size); });
      case Test::write_lat:
        sync(size);
        return latency(size, [&] { write_round(size); });
      case Test::read_lat: return latency(size, [&] { read_round(size); });
      case Test::atomic_lat: return latency(size, [&] { atomic_round(); });
      default: return bandwidth(size);
    }
  }

  // Write latency and PUT/GET need a registration on each side. Write
  // latency's is ami-allocated (peers on this host map it) and twice the
  // largest size: the peer writes the first half, the second is the source.
  void prepare_rdma() {
    if (o_.test == Test::write_lat) {
      check(client_.allocate_memory(2 * max_size(o_), local_));
      control(c_, peer_, {kPeerKey, 0, 0}, local_.remote_key().to_bytes());
    } else {
      check(client_.register_memory(send_.data(), send_.size(), local_));
    }
    control(c_, peer_, {kPrepare, 0, max_size(o_)});
    wait(have_key_);
  }

  void sync(std::size_t size) {
    if (o_.test == Test::write_lat) {
      std::memset(local_.address(), 0, size);
      round_ = 0;
    }
    synced_ = false;
    control(c_, peer_, {kSync, 0, size});
    wait(synced_);
  }

  void send_round(std::size_t size) {
    replied_ = false;
    if (o_.remote_done) {
      check(send_data(c_, peer_, immediate_, send_.data(), size, &send_memory_, {}, {&Driver::on_remote_done, this}));
      ++remote_pending_;
    } else {
      check(send_data(c_, peer_, immediate_, send_.data(), size, &send_memory_));
    }
    wait(replied_);
  }

  void write_round(std::size_t size) {
    const std::uint8_t t = tag(round_++);
    set_source_tag(local_, max_size(o_), size, t);
    put(c_, {.dest = peer_, .local = &local_, .local_offset = max_size(o_), .remote = key_, .bytes = size});
    while (last_byte(local_, size) != t) (void)c_.advance();
  }

  void read_round(std::size_t size) {
    replied_ = false;
    check(c_.get({.dest = peer_, .local = &local_, .remote = key_, .bytes = size,
                  .local_done = {&Driver::on_read_done, this}}));
    wait(replied_);
    if (!failure_.ok()) throw Error("client: a read failed: " + to_string(failure_));
  }

  // One atomic on the server's word: fetch_add of 1, or compare_swap of the
  // value the last round read (it always succeeds: nobody else writes it).
  // The parameters are made once, when the key comes (on_control), as
  // perftest makes its work requests once; each round sets its operands.
  const AtomicParams& atomic_params(Callback done) {
    atomic_.operand = o_.compare_swap ? atomic_old_ + 1 : 1;
    atomic_.compare = atomic_old_;
    atomic_.done = done;
    return atomic_;
  }

  // atomic_now(): done in the call where this process reaches the word
  // (shm on the server's allocated region), as UCX completes in place.
  void atomic_round() {
    replied_ = false;
    const Status s = c_.atomic_now(atomic_params({&Driver::on_read_done, this}));
    if (s != StatusCode::in_progress) check(s);
    if (s.ok()) return;
    wait(replied_);
    if (!failure_.ok()) throw Error("client: an atomic failed: " + to_string(failure_));
  }

  // One timestamp per round, as perftest does: each sample runs from the
  // end of the previous round to the end of this one. Timestamps are cycle
  // counts (cheap to read), converted with the rate the steady clock
  // measures. A round trip counts half (send, write: one way); a read is
  // reported whole, as perftest does, and so is an atomic.
  template <typename Round>
  Row latency(std::size_t size, Round round) {
    const std::size_t warmup = std::min<std::size_t>(o_.iterations, 16);
    std::vector<std::uint64_t> ticks(o_.iterations + 1);
    for (std::size_t i = 0; i < warmup + o_.iterations; ++i) {
      if (i == warmup) ticks[0] = cycles();
      round();
      if (i >= warmup) ticks[i - warmup + 1] = cycles();
    }
    if (o_.remote_done) drain_remote_dones();
    return latency_row(size, ticks);
  }

  // Send latency the way an active-message program plays ping-pong (and the
  // way the server echoes): the reply's handler (or, for a reply of several
  // packets, its done callback) stamps the round and sends the next message
  // itself, so what lies between a reply's arrival and the next send is the
  // handler, not the rest of advance() and a wait loop. Stamps as latency().
  Row chained_latency(std::size_t size) {
    const std::size_t warmup = std::min<std::size_t>(o_.iterations, 16);
    for (std::size_t i = 0; i < warmup; ++i) send_round(size);
    std::vector<std::uint64_t> ticks(o_.iterations + 1);
    chain_ = {.next = ticks.data() + 1, .left = o_.iterations, .size = size};
    replied_ = false;
    ticks[0] = cycles();
    check(send_data(c_, peer_, immediate_, send_.data(), size, &send_memory_));
    wait(replied_);
    return latency_row(size, ticks);
  }
  // A reply came: the round's stamp, then the next round (or the end).
  void next_round() {
    *chain_.next++ = cycles();
    if (--chain_.left == 0) {
      replied_ = true;
      return;
    }
    check(send_data(c_, peer_, immediate_, send_.data(), chain_.size, &send_memory_));
  }

  Row latency_row(std::size_t size, const std::vector<std::uint64_t>& ticks) {
    const bool round_trip = o_.test == Test::read_lat || o_.test == Test::atomic_lat;
    const double us_per_tick = microseconds_per_cycle() / (round_trip ? 1 : 2);
    std::vector<double> samples(o_.iterations);
    for (std::size_t i = 0; i < o_.iterations; ++i)
      samples[i] = static_cast<double>(ticks[i + 1] - ticks[i]) * us_per_tick;
    return print_latency_row(size, std::move(samples));
  }

  // Streams n operations, tx_depth in flight, then a sync whose answer
  // proves the last one arrived (a lane delivers in order).
  void stream(std::size_t size, std::size_t n) {
    completed_ = 0;
    std::size_t posted = 0;
    while (completed_ < n) {
      while (posted < n && posted - completed_ < o_.tx_depth) {
        Status s = post(size);
        if (s == StatusCode::no_resource) break;
        check(s);
        ++posted;
      }
      if (completed_ >= n) break;  // (atomics done in the call)
      if (o_.events) {  // asleep until a completion frees a slot of the window
        const std::size_t seen = completed_;
        check(wait_until(c_, [&] { return completed_ != seen; }, {.spin = std::chrono::microseconds(o_.spin_us)}));
      } else {
        (void)c_.advance();
      }
    }
    if (!failure_.ok()) throw Error("client: an operation failed: " + to_string(failure_));
    synced_ = false;
    control(c_, peer_, {kSync, 0, size});
    wait(synced_);
  }

  // A warm-up stream first (untimed: it faults the buffers' pages in and
  // fills the queues, as perftest's and ucx_perftest's warm-ups do), then
  // the measured one.
  Row bandwidth(std::size_t size) {
    const std::size_t n = o_.iterations;
    stamps_.assign(n, 0);
    stream(size, std::min(n, std::max<std::size_t>(2 * o_.tx_depth, 16)));
    const auto t0 = Clock::now();
    stream(size, n);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    // Peak: the fastest stretch of a quarter of the run, and at least two
    // windows, so that it spans whole window turnovers (completions arrive
    // in batches, and the first window's all at once: shorter stretches
    // would measure the batching). A run too short for that has no peak
    // apart from its average.
    const std::size_t block = std::max<std::size_t>(n / 4, 2 * o_.tx_depth);
    double peak = seconds;
    std::size_t peak_ops = n;
    for (std::size_t i = 0; i + block < n; i += block) {
      const double stretch = static_cast<double>(stamps_[i + block] - stamps_[i]) * microseconds_per_cycle() / 1e6;
      if (stretch * static_cast<double>(peak_ops) < peak * static_cast<double>(block)) {
        peak = stretch;
        peak_ops = block;
      }
    }
    return print_bandwidth_row(size, n, seconds, peak, peak_ops, o_.report_gbits);
  }

  Status post(std::size_t size) {
    const Callback done{&Driver::on_complete, this};
    switch (o_.test) {
      case Test::send_bw:
        // --remote_done: a send leaves the window when the receiver answered it.
        if (o_.remote_done) return send_data(c_, peer_, immediate_, send_.data(), size, &send_memory_, {}, done);
        return send_data(c_, peer_, immediate_, send_.data(), size, &send_memory_, done);
      case Test::write_bw:
        return c_.put({.dest = peer_, .local = &local_, .remote = key_, .bytes = size, .local_done = done});
      case Test::read_bw:
        return c_.get({.dest = peer_, .local = &local_, .remote = key_, .bytes = size, .local_done = done});
      case Test::atomic_bw: {  // (every result into one word, as perftest)
        const Status s = c_.atomic_now(atomic_params(done));
        if (s.ok()) on_complete(this, s);  // done in the call
        return s == StatusCode::in_progress ? Status::success() : s;
      }
      default: break;
    }
    return {StatusCode::invalid_argument, "not a bandwidth test"};
  }

  static void on_complete(void* self, Status s) {
    auto* d = static_cast<Driver*>(self);
    if (!s.ok() && d->failure_.ok()) d->failure_ = s;  // reported after the loop
    d->stamps_[d->completed_++] = cycles();  // cheap enough for every completion
  }
  static void on_reply_done(void* self, Status) { static_cast<Driver*>(self)->replied(); }
  void replied() {
    if (chain_.left != 0)
      next_round();
    else
      replied_ = true;
  }
  static void on_remote_done(void* self, Status s) {
    auto* d = static_cast<Driver*>(self);
    if (!s.ok() && d->failure_.ok()) d->failure_ = s;
    --d->remote_pending_;
  }
  static void on_read_done(void* self, Status s) {
    auto* d = static_cast<Driver*>(self);
    if (!s.ok() && d->failure_.ok()) d->failure_ = s;
    d->replied_ = true;
  }
  static void on_data(void* self, const Incoming&, Receive* recv) {
    auto* d = static_cast<Driver*>(self);
    if (recv == nullptr) {
      d->replied();
      return;
    }
    recv->buffer = d->recv_.data();
    recv->memory = &d->recv_memory_;
    recv->done = {&Driver::on_reply_done, d};
  }
  static void on_control(void* self, const Incoming& in, Receive*) {
    auto* d = static_cast<Driver*>(self);
    const Control m = read_control(in);
    if (m.op == kKey) {
      d->have_key_ = RemoteKey::from_bytes(in.payload, d->key_).ok();
      d->atomic_ = {.dest = d->peer_, .op = d->o_.compare_swap ? AtomicOp::compare_swap : AtomicOp::fetch_add,
                    .type = AtomicType::u64, .remote = d->key_, .result = &d->atomic_old_};
    }
    if (m.op == kSyncAck) d->synced_ = true;
    if (m.op == kAckReport && in.payload.size() == sizeof d->server_acks_) {
      std::memcpy(&d->server_acks_, in.payload.data(), sizeof d->server_acks_);
      d->have_report_ = true;
    }
  }

  Client& client_;
  Context& c_;
  Endpoint peer_;
  std::size_t immediate_;
  const Options& o_;
  PageBytes send_, recv_;
  Memory send_memory_, recv_memory_;
  Memory local_;
  RemoteKey key_{};
  bool have_key_ = false, replied_ = false, synced_ = false, have_report_ = false;
  std::size_t completed_ = 0;
  std::size_t remote_pending_ = 0;  // send latency: sends whose remote_done has not run
  AckFigures server_acks_;
  std::size_t round_ = 0;  // write latency: rounds since the last sync
  std::uint64_t atomic_old_ = 0;  // atomic tests: the word's value the last atomic returned
  AtomicParams atomic_{};         // atomic tests: atomic_params()' parameters
  Status failure_;
  std::vector<std::uint64_t> stamps_;  // cycle count at each completion
  struct Chain {
    std::uint64_t* next = nullptr;  // where the next round's stamp goes
    std::size_t left = 0;           // rounds to go (0: no chain running)
    std::size_t size = 0;
  } chain_;
};

void require_backend(Context& c, Endpoint peer, const Options& o) {
  const std::string_view used = c.backend_for(peer);
  if (used != o.backend)
    throw Error("the peer is reached by '" + std::string(used.empty() ? "nothing" : used) + "', not by '" +
                o.backend + "' (a server on another host needs --backend verbs)");
}

// The configuration: the environment's, overridden by the command line.
Config tool_config(const Options& o) {
  Config c = Config::from_environment();
  auto set = [&](std::string_view name, const std::string& value) {
    Status s = c.set(name, value);
    if (!s.ok()) throw Error(std::string(name) + "=" + value + ": " + to_string(s));
  };
  set("AMI_BACKENDS", o.backend == "self" ? "self" : "self," + o.backend);
  if (!o.device.empty()) set("AMI_NET_DEVICES", o.device + (o.ib_port ? ":" + std::to_string(*o.ib_port) : ""));
  if (o.gid_index) set("AMI_VERBS_GID_INDEX", std::to_string(*o.gid_index));
  if (o.rdma_cm) set("AMI_VERBS_CM", "on");
  if (o.mtu) set("AMI_VERBS_MTU", std::to_string(*o.mtu));
  if (o.tx_depth_given && o.backend == "verbs")
    set("AMI_VERBS_SQ_DEPTH", std::to_string(std::max<std::size_t>(o.tx_depth, 2)));
  if (o.cq_moderation) set("AMI_VERBS_SIGNAL_INTERVAL", std::to_string(*o.cq_moderation));
  if (o.inline_size) set("AMI_VERBS_MAX_INLINE", std::to_string(*o.inline_size));
  if (o.post_list) set("AMI_VERBS_DOORBELL_BATCH", std::to_string(*o.post_list));
  // -e sleeps: libfabric's CQ needs its wait descriptor asked for up front.
  if (o.events && c.origin(ParamName::lookup("AMI_OFI_WAIT")) == "default") set("AMI_OFI_WAIT", "auto");
  return c;
}

int run_self(const Options& o) {
  Client client({.name = "ami_tool", .contexts = 2, .config = tool_config(o)});
  Server server(client, client.context(1), {0, 0}, o);
  std::thread t([&] { server.serve(); });
  try {
    Driver(client, client.context(0), {0, 1}, o).run();
  } catch (...) {
    t.detach();
    throw;
  }
  t.join();
  return 0;
}

ClientOptions job(const Options& o, std::uint32_t rank, const std::string& address) {
  return {.name = "ami_tool",
          .contexts = 1,
          .job = {.rank = rank, .size = 2, .bootstrap = address},
          .config = tool_config(o)};
}

int run_server(const Options& o, const std::string& address) {
  Client client(job(o, 0, address));
  require_backend(client.context(0), {1, 0}, o);
  Server(client, client.context(0), {1, 0}, o).serve();
  return 0;
}

int run_client(const Options& o, const std::string& address) {
  Client client(job(o, 1, address));
  require_backend(client.context(0), {0, 0}, o);
  Driver(client, client.context(0), {0, 0}, o).run();
  return 0;
}

// Pins the calling process to the index-th CPU it may run on, so the two
// sides of a --local run do not share a core (each polls its own ring).
void pin_to(unsigned index) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < 2) return;
  for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed) || seen++ != static_cast<int>(index)) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    (void)sched_setaffinity(0, sizeof one, &one);
    return;
  }
}

// A loopback port nobody uses now: the kernel's choice for a socket bound to
// port 0. Fixed port numbers collide with other jobs and with the ephemeral
// ports of outgoing connections; this leaves only the moment until the
// server listens on it.
std::uint16_t free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw Error("socket", errno);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof a;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &length) == 0;
  const int error = errno;
  ::close(fd);
  if (!ok) throw Error("finding a free loopback port", error);
  return ntohs(a.sin_port);
}

// --local: the server is a child process on loopback, each side on its own core.
int run_local(const Options& o) {
  const std::uint16_t port = o.port_given ? o.port : free_loopback_port();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  // Both sides are ours: unless the user gave one, a fresh key keeps any
  // other process off the bootstrap port.
  if (std::getenv("AMI_JOB_KEY") == nullptr) ::setenv("AMI_JOB_KEY", make_job_key().c_str(), 1);
  const pid_t child = fork();
  if (child < 0) throw Error("fork", errno);
  if (child == 0) {
    pin_to(0);
    int rc = 1;
    try {
      rc = run_server(o, address);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "server: %s\n", e.what());
    }
    std::fflush(nullptr);
    _exit(rc);
  }
  pin_to(1);
  int rc = 1;
  try {
    rc = run_client(o, address);
  } catch (...) {
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    throw;
  }
  int status = 0;
  waitpid(child, &status, 0);
  return rc != 0 ? rc : (WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}

}  // namespace

int run(int argc, char** argv, Test test) {
  Options o;
  bool help = false;
  if (!parse_options(argc, argv, test, o, help)) return help ? 0 : 2;
  try {
    if (o.backend == "self") return run_self(o);
    if (o.local) return run_local(o);
    if (o.server.empty()) return run_server(o, "0.0.0.0:" + std::to_string(o.port));
    return run_client(o, o.server + ":" + std::to_string(o.port));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

}  // namespace ami::tools
