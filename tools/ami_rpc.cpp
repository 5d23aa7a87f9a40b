// ami_rpc — an echo RPC server and its clients over ami, each driven by a
// Boost.Asio io_context through ami/asio.hpp, and asleep when idle
// (docs/DESIGN.md, "Event-driven progress"). The server is rank 0 of a job
// of 1 + --clients tasks; client k is rank k. A request is a header (its
// number) and a payload; the reply echoes both, and the client checks
// every byte. Each side prints the CPU time it used against the time it
// ran: a sleeping side uses little more than its messages cost.
#include <getopt.h>
#include <sys/resource.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ami/ami.hpp"
#include "ami/asio.hpp"
#include "harness/harness.hpp"

namespace {

using namespace ami;
using ami::tools::number;
using Clock = std::chrono::steady_clock;

constexpr std::uint16_t kRequest = 1, kReply = 2, kBye = 3, kByeAck = 4;
constexpr std::size_t kMaxSize = 1u << 20;

struct Options {
  std::string server;  // client mode: the server's host
  std::uint16_t port = 18516;
  std::uint32_t clients = 1;
  std::uint32_t rank = 1;
  std::size_t size = 8;
  std::size_t iterations = 1000;
  std::size_t window = 1;
  unsigned threads = 1;
  unsigned idle_ms = 0;
  std::string backend = "shm";
};

void usage() {
  std::printf(
      "usage: ami_rpc [options]            start the server (rank 0) for --clients clients\n"
      "       ami_rpc [options] <server>   start client --rank against it\n\n"
      "  -p, --port=<port>        bootstrap port (default 18516)\n"
      "  -c, --clients=<n>        clients in the job, 1..64 (default 1; give the same to every side)\n"
      "  -r, --rank=<k>           client: which one, 1..clients (default 1)\n"
      "  -s, --size=<bytes>       request payload, 1..%zu (default 8)\n"
      "  -n, --iters=<n>          requests (default 1000)\n"
      "  -w, --window=<n>         requests in flight (default 1)\n"
      "  -T, --threads=<n>        io_context threads, 1..64 (default 1)\n"
      "      --idle-ms=<ms>       client: pause this long half-way through, asleep (default 0)\n"
      "      --backend=<name>     shm (default), verbs or ofi\n"
      "  -h, --help               this text\n\n"
      "Every AMI_* variable of ami_info --config applies too.\n",
      kMaxSize);
}

// 0: parsed; 1: help printed; 2: a bad command line (after saying why).
int parse(int argc, char** argv, Options& o) {
  enum { kIdle = 1000, kBackend };
  static const option kLong[] = {
      {"port", required_argument, nullptr, 'p'},    {"clients", required_argument, nullptr, 'c'},
      {"rank", required_argument, nullptr, 'r'},    {"size", required_argument, nullptr, 's'},
      {"iters", required_argument, nullptr, 'n'},   {"window", required_argument, nullptr, 'w'},
      {"threads", required_argument, nullptr, 'T'}, {"idle-ms", required_argument, nullptr, kIdle},
      {"backend", required_argument, nullptr, kBackend}, {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0}};
  std::size_t v = 0;
  bool rank_given = false;
  for (int c; (c = getopt_long(argc, argv, "p:c:r:s:n:w:T:h", kLong, nullptr)) != -1;) {
    switch (c) {
      case 'p':
        if (!number(optarg, v, 1, 65535, "--port")) return 2;
        o.port = static_cast<std::uint16_t>(v);
        break;
      case 'c':
        if (!number(optarg, v, 1, 64, "--clients")) return 2;
        o.clients = static_cast<std::uint32_t>(v);
        break;
      case 'r':
        if (!number(optarg, v, 1, 64, "--rank")) return 2;
        o.rank = static_cast<std::uint32_t>(v);
        rank_given = true;
        break;
      case 's':
        if (!number(optarg, o.size, 1, kMaxSize, "--size")) return 2;
        break;
      case 'n':
        if (!number(optarg, o.iterations, 1, 100000000, "--iters")) return 2;
        break;
      case 'w':
        if (!number(optarg, o.window, 1, 4096, "--window")) return 2;
        break;
      case 'T':
        if (!number(optarg, v, 1, 64, "--threads")) return 2;
        o.threads = static_cast<unsigned>(v);
        break;
      case kIdle:
        if (!number(optarg, v, 0, 3600000, "--idle-ms")) return 2;
        o.idle_ms = static_cast<unsigned>(v);
        break;
      case kBackend: {
        o.backend = optarg;
        const auto names = backend_names();
        if (o.backend == "self" || std::find(names.begin(), names.end(), o.backend) == names.end()) {
          std::fprintf(stderr, "error: --backend must be shm, verbs or ofi, not '%s'\n", optarg);
          return 2;
        }
        break;
      }
      case 'h': usage(); return 1;
      default: usage(); return 2;
    }
  }
  if (optind < argc) o.server = argv[optind++];
  if (optind < argc) {
    std::fprintf(stderr, "error: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  if (o.server.empty() && rank_given) {
    std::fprintf(stderr, "error: --rank is a client's: give the server's host too\n");
    return 2;
  }
  if (o.rank > o.clients) {
    std::fprintf(stderr, "error: --rank %u is past --clients %u\n", o.rank, o.clients);
    return 2;
  }
  return 0;
}

double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// What a side used: "# <who> cpu: 12.3 ms over 2005.1 ms (0.6%)".
void print_cpu(const char* who, double cpu0, Clock::time_point t0) {
  const double cpu_ms = (cpu_seconds() - cpu0) * 1e3;
  const double wall_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  std::printf("# %s cpu: %.1f ms over %.1f ms (%.1f%%)\n", who, cpu_ms, wall_ms, 100.0 * cpu_ms / wall_ms);
  std::fflush(stdout);
}

void check(Status s, const char* what) {
  if (!s.ok()) throw Error(std::string(what) + ": " + to_string(s));
}

// Runs io from n threads until it runs out of work.
void run_io(boost::asio::io_context& io, unsigned n) {
  std::vector<std::thread> threads;
  for (unsigned i = 1; i < n; ++i) threads.emplace_back([&] { io.run(); });
  io.run();
  for (auto& t : threads) t.join();
}

Config rpc_config(const Options& o) {
  Config c = Config::from_environment();
  check(c.set("AMI_BACKENDS", "self," + o.backend), "AMI_BACKENDS");
  // Its contexts sleep: libfabric's CQ needs its wait descriptor asked for up front.
  if (c.origin(ParamName::lookup("AMI_OFI_WAIT")) == "default") check(c.set("AMI_OFI_WAIT", "auto"), "AMI_OFI_WAIT");
  return c;
}

ClientOptions job(const Options& o, std::uint32_t rank, const std::string& address) {
  return {.name = "ami_rpc", .contexts = 1, .job = {.rank = rank, .size = o.clients + 1, .bootstrap = address},
          .config = rpc_config(o)};
}

// The server: echoes every request from inside advance() (on the driver's
// strand); a reply too large to send at once keeps its copy until its
// local_done. Ends when every client said goodbye and was answered.
class Server {
 public:
  Server(Context& c, AsioDriver& driver, std::uint32_t clients) : c_(c), driver_(driver), clients_(clients) {
    check(c_.set_dispatch(kRequest, {&Server::on_request, this}), "server");
    check(c_.set_dispatch(kBye, {&Server::on_bye, this}), "server");
  }
  std::uint64_t served() const { return served_; }

 private:
  struct Reply {
    Server* server = nullptr;
    Endpoint to;
    std::uint64_t id = 0;
    std::vector<std::byte> data;
  };
  static void on_request(void* self, const Incoming& in, Receive* recv) {
    auto* s = static_cast<Server*>(self);
    std::uint64_t id = 0;
    if (in.header.size() == sizeof id) std::memcpy(&id, in.header.data(), sizeof id);
    Reply* r = s->take();
    r->to = in.origin;
    r->id = id;
    r->data.resize(in.total_bytes);
    if (recv != nullptr) {  // several packets: reply once it is whole
      recv->buffer = r->data.data();
      recv->done = {&Server::on_whole, r};
      return;
    }
    std::memcpy(r->data.data(), in.payload.data(), in.payload.size());
    s->reply(r);
  }
  static void on_whole(void* reply, Status st) {
    auto* r = static_cast<Reply*>(reply);
    if (!st.ok()) {
      r->server->give_back(r);
      return;
    }
    r->server->reply(r);
  }
  void reply(Reply* r) {
    ++served_;
    const auto header = std::as_bytes(std::span(&r->id, 1));
    if (r->data.size() + header.size() <= c_.immediate_limit(r->to)) {
      check(c_.send_immediate({.dest = r->to, .dispatch = kReply, .header = header, .payload = r->data}), "reply");
      give_back(r);
      return;
    }
    check(c_.send({.dest = r->to, .dispatch = kReply, .header = header, .payload = r->data,
                   .local_done = {&Server::on_sent, r}}),
          "reply");
  }
  static void on_sent(void* reply, Status) {
    auto* r = static_cast<Reply*>(reply);
    r->server->give_back(r);
  }
  // Replies are kept for reuse: their buffers stay where they were, so the
  // registration a long reply needs is found in the context's cache.
  Reply* take() {
    if (spare_.empty()) {
      owned_.push_back(std::make_unique<Reply>());
      owned_.back()->server = this;
      return owned_.back().get();
    }
    Reply* r = spare_.back();
    spare_.pop_back();
    return r;
  }
  void give_back(Reply* r) { spare_.push_back(r); }
  static void on_bye(void* self, const Incoming& in, Receive*) {
    auto* s = static_cast<Server*>(self);
    check(s->c_.send({.dest = in.origin, .dispatch = kByeAck, .local_done = {&Server::on_bye_sent, s}}), "bye");
  }
  static void on_bye_sent(void* self, Status) {
    auto* s = static_cast<Server*>(self);
    if (++s->byes_ == s->clients_) s->driver_.stop();
  }

  Context& c_;
  AsioDriver& driver_;
  std::uint32_t clients_;
  std::uint32_t byes_ = 0;
  std::uint64_t served_ = 0;
  std::vector<std::unique_ptr<Reply>> owned_;
  std::vector<Reply*> spare_;
};

// A client: keeps --window requests in flight from inside the reply
// handler; half-way through, with --idle-ms, it lets its window drain and
// sleeps on a timer before it goes on.
class RpcClient {
 public:
  RpcClient(Context& c, AsioDriver& driver, const Options& o)
      : c_(c), driver_(driver), timer_(driver.executor()), o_(o), immediate_(c.immediate_limit({0, 0})) {
    check(c_.set_dispatch(kReply, {&RpcClient::on_reply, this}), "client");
    check(c_.set_dispatch(kByeAck, {&RpcClient::on_bye_ack, this}), "client");
    const std::size_t slots = std::min(o.window, o.iterations);
    slots_.resize(slots);
    for (Slot& s : slots_) {
      s.out.resize(o.size);
      s.back.resize(o.size);
    }
    latencies_.reserve(o.iterations);
  }
  // On the strand, under the context's lock: fills every free slot.
  void begin() {
    for (std::size_t i = 0; i < slots_.size(); ++i)
      if (!slots_[i].busy) go_on(i);
  }
  void report() const {
    std::vector<double> l = latencies_;
    std::sort(l.begin(), l.end());
    const auto at = [&](double q) {
      return l.empty() ? 0.0 : l[std::min(l.size() - 1, static_cast<std::size_t>(q * static_cast<double>(l.size())))];
    };
    std::printf("# client %u: %zu requests of %zu B, window %zu: round trip median %.2f us, p99 %.2f us, "
                "%zu wrong echoes\n",
                o_.rank, l.size(), o_.size, o_.window, at(0.5), at(0.99), wrong_);
  }
  bool ok() const { return wrong_ == 0 && latencies_.size() == o_.iterations && bye_acked_; }

 private:
  struct Slot {
    std::vector<std::byte> out, back;
    Clock::time_point sent;
    bool busy = false;
  };
  // The next request from a free slot; the pause half-way through (once
  // the window drained); the goodbye after the last reply.
  void go_on(std::size_t slot) {
    if (issued_ == o_.iterations) {
      if (in_flight_ == 0 && !bye_sent_) {
        bye_sent_ = true;
        check(c_.send({.dest = {0, 0}, .dispatch = kBye}), "bye");
      }
      return;
    }
    if (o_.idle_ms != 0 && !idled_ && issued_ == o_.iterations / 2) {
      if (in_flight_ != 0) return;
      idled_ = true;
      timer_.expires_after(std::chrono::milliseconds(o_.idle_ms));
      timer_.async_wait([this](const boost::system::error_code&) {
        {
          std::lock_guard lock(c_);
          begin();
        }
        c_.signal();  // the driver drains what began here
      });
      return;
    }
    Slot& s = slots_[slot];
    const std::uint64_t id = (issued_++ << 16) | slot;
    for (std::size_t i = 0; i < s.out.size(); ++i) s.out[i] = static_cast<std::byte>(id * 31 + i);
    s.sent = Clock::now();
    s.busy = true;
    ++in_flight_;
    const auto header = std::as_bytes(std::span(&id, 1));
    if (s.out.size() + header.size() <= immediate_)
      check(c_.send_immediate({.dest = {0, 0}, .dispatch = kRequest, .header = header, .payload = s.out}), "request");
    else
      check(c_.send({.dest = {0, 0}, .dispatch = kRequest, .header = header, .payload = s.out}), "request");
  }
  void replied(std::uint64_t id) {
    Slot& s = slots_[id & 0xFFFF];
    latencies_.push_back(std::chrono::duration<double, std::micro>(Clock::now() - s.sent).count());
    if (s.back != s.out) ++wrong_;
    s.busy = false;
    --in_flight_;
    go_on(id & 0xFFFF);
  }
  struct Pending {
    RpcClient* d;
    std::uint64_t id;
  };
  static void on_reply(void* self, const Incoming& in, Receive* recv) {
    auto* d = static_cast<RpcClient*>(self);
    std::uint64_t id = 0;
    if (in.header.size() == sizeof id) std::memcpy(&id, in.header.data(), sizeof id);
    if ((id & 0xFFFF) >= d->slots_.size() || in.total_bytes != d->o_.size) {
      ++d->wrong_;
      if (recv != nullptr) recv->buffer = nullptr;  // discarded
      return;
    }
    Slot& s = d->slots_[id & 0xFFFF];
    if (recv != nullptr) {
      recv->buffer = s.back.data();
      recv->done = {&RpcClient::on_reply_whole, new Pending{d, id}};
      return;
    }
    std::memcpy(s.back.data(), in.payload.data(), in.payload.size());
    d->replied(id);
  }
  static void on_reply_whole(void* pending, Status st) {
    std::unique_ptr<Pending> p(static_cast<Pending*>(pending));
    if (!st.ok()) ++p->d->wrong_;
    p->d->replied(p->id);
  }
  static void on_bye_ack(void* self, const Incoming&, Receive*) {
    auto* d = static_cast<RpcClient*>(self);
    d->bye_acked_ = true;
    d->driver_.stop();
  }

  Context& c_;
  AsioDriver& driver_;
  boost::asio::steady_timer timer_;
  const Options& o_;
  std::size_t immediate_;
  std::vector<Slot> slots_;
  std::vector<double> latencies_;
  std::size_t issued_ = 0, in_flight_ = 0, wrong_ = 0;
  bool idled_ = false, bye_sent_ = false, bye_acked_ = false;
};

int run_server(const Options& o) {
  Client client(job(o, 0, "0.0.0.0:" + std::to_string(o.port)));
  const double cpu0 = cpu_seconds();
  const auto t0 = Clock::now();
  boost::asio::io_context io(static_cast<int>(o.threads));
  AsioDriver driver(io, client.context(0));
  Server server(client.context(0), driver, o.clients);
  check(driver.start(), "server");
  run_io(io, o.threads);
  check(driver.status(), "server");
  std::printf("# server: %llu requests from %u clients, %zu wake-ups\n",
              static_cast<unsigned long long>(server.served()), o.clients, driver.wakeups());
  print_cpu("server", cpu0, t0);
  return 0;
}

int run_client(const Options& o) {
  Client client(job(o, o.rank, o.server + ":" + std::to_string(o.port)));
  const double cpu0 = cpu_seconds();
  const auto t0 = Clock::now();
  boost::asio::io_context io(static_cast<int>(o.threads));
  AsioDriver driver(io, client.context(0));
  RpcClient rpc(client.context(0), driver, o);
  check(driver.start(), "client");
  driver.post([&](Context&) { rpc.begin(); });
  run_io(io, o.threads);
  check(driver.status(), "client");
  rpc.report();
  print_cpu("client", cpu0, t0);
  return rpc.ok() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const int rc = parse(argc, argv, o); rc != 0) return rc == 1 ? 0 : 2;
  try {
    return o.server.empty() ? run_server(o) : run_client(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
