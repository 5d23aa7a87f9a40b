// bootstrap.cpp — the TCP bootstrap on Boost.Asio. Every socket operation is
// asynchronous and runs on the bootstrap's own io_context under a deadline,
// so no peer, silent or absent, can hold a rank past its timeout; on any
// failure every socket is closed before the error is thrown.
#include "bootstrap.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <functional>
#include <optional>
#include <thread>
#include <utility>  // before Asio: 1.74 uses std::exchange without it

#include <boost/asio.hpp>

#include "ami/error.hpp"

namespace ami::bootstrap {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::uint32_t kMagic = 0x42494d41;  // "AMIB" on the wire
constexpr std::uint32_t kVersion = 2;  // 2: the hello carries the job's key
constexpr auto kRetryInterval = std::chrono::milliseconds(50);
constexpr std::size_t kMaxListed = 8;  // peers named in one message before "and N more"

// Rank 0's answer to a hello: accepted, or why not. It travels back so that
// a refused rank's error says what rank 0 objected to.
enum class Verdict : std::uint32_t {
  accepted = 0, bad_magic, bad_version, size_mismatch, rank_out_of_range, duplicate_rank, wrong_key,
};

std::string to_text(Verdict v) {
  switch (v) {
    case Verdict::accepted: return "accepted";
    case Verdict::bad_magic: return "bad magic";
    case Verdict::bad_version: return "bad version";
    case Verdict::size_mismatch: return "size mismatch";
    case Verdict::rank_out_of_range: return "rank out of range";
    case Verdict::duplicate_rank: return "duplicate rank";
    case Verdict::wrong_key: return "wrong job key (AMI_JOB_KEY differs)";
  }
  return "unknown verdict " + std::to_string(static_cast<std::uint32_t>(v));
}

using Word = std::array<std::byte, 4>;

void put_u32(std::byte* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}

std::uint32_t get_u32(const std::byte* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::uint32_t{std::to_integer<std::uint8_t>(p[i])} << (8 * i);
  return v;
}

// A hello and its answer share one layout; `word` is the sender's rank in a
// hello and the verdict in an answer.
struct Hello {
  std::uint32_t magic, version, word, size;
};
using HelloFrame = std::array<std::byte, 16>;

HelloFrame encode(const Hello& h) {
  HelloFrame f;
  put_u32(&f[0], h.magic);
  put_u32(&f[4], h.version);
  put_u32(&f[8], h.word);
  put_u32(&f[12], h.size);
  return f;
}

Hello decode(const HelloFrame& f) { return {get_u32(&f[0]), get_u32(&f[4]), get_u32(&f[8]), get_u32(&f[12])}; }

std::string endpoint_text(const tcp::endpoint& e) {
  const auto a = e.address();
  return (a.is_v6() ? "[" + a.to_string() + "]" : a.to_string()) + ":" + std::to_string(e.port());
}

std::string hex(std::uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", v);
  return text;
}

std::string list(const std::vector<std::string>& items) {
  std::string text;
  for (std::size_t i = 0; i < items.size() && i < kMaxListed; ++i) text += (i ? ", " : "") + items[i];
  if (items.size() > kMaxListed) text += " and " + std::to_string(items.size() - kMaxListed) + " more";
  return text.empty() ? "none" : text;
}

// Compares the whole of both keys whatever the first difference, so the time
// taken says nothing about how much of a guess was right.
bool same_key(std::span<const std::byte> a, std::string_view b) {
  unsigned difference = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i)
    difference |= std::to_integer<unsigned>(a[i]) ^ static_cast<unsigned char>(i < b.size() ? b[i] : 0);
  return difference == 0;
}

bool is_closed(const error_code& ec) {
  return ec == asio::error::eof || ec == asio::error::connection_reset || ec == asio::error::broken_pipe;
}

}  // namespace

struct TcpBootstrap::Impl {
  // A connection rank 0 has accepted whose hello it has not yet checked.
  struct Joiner {
    explicit Joiner(asio::io_context& io) : socket(io) {}
    tcp::socket socket;
    std::string address;  // empty until accepted
    HelloFrame frame{};
    Word key_length{};
    Blob key;
    bool checked = false;
  };

  explicit Impl(const Options& o) : options(o), where(o.host + ":" + std::to_string(o.port)) {}

  Options options;
  std::string where;  // rank 0's address: as configured, or as bound once listening
  asio::io_context io;  // before the sockets: they must go first
  // Emplaced by listen() only: the first socket brings up the reactor and its
  // descriptors, which a job of one never needs.
  std::optional<tcp::acceptor> acceptor;
  std::uint16_t bound_port = 0;
  std::vector<tcp::socket> peers;                // rank 0: by rank (slot 0 unused); others: [0] is rank 0
  std::vector<std::string> names;                // "rank r at address", indexed as peers
  std::vector<std::unique_ptr<Joiner>> joiners;  // rank 0, while constructing
  std::uint32_t answered = 0;                    // rank 0: hellos accepted and answered
  std::vector<std::string> refusals;             // rank 0: "peer A: why", for a timeout's message
  std::optional<std::string> failure;            // the first error of the running operations
  bool broken = false;                           // a failure closed every socket

  std::string prefix() const { return "bootstrap: rank " + std::to_string(options.rank) + ": "; }
  void fail(const std::string& problem, const std::string& who, const std::string& step);
  [[noreturn]] void fail_now(const std::string& problem, const std::string& who, const std::string& step);
  bool completed(const error_code& ec, const std::string& who, const std::string& step);
  void run(Clock::time_point deadline, const std::function<bool()>& done,
           const std::function<std::string()>& waiting_for);
  [[noreturn]] void abort();
  void drain() noexcept;

  // rank 0
  void listen(Clock::time_point deadline);
  tcp::endpoint bind_endpoint();
  void accept_next();
  void on_hello(Joiner& j);
  void read_key(Joiner& j);
  void refuse(Joiner& j, Verdict verdict, const std::string& problem);
  void discard_until_closed(Joiner& j);
  Verdict check(const Hello& h, std::string& problem) const;
  std::string joins_missing() const;
  std::vector<Blob> gather(std::span<const std::byte> mine, Clock::time_point deadline);
  void scatter(const std::vector<Blob>& all, Clock::time_point deadline);
  std::string ranks_missing(const std::vector<bool>& have, const std::string& step) const;

  // the other ranks
  void connect(Clock::time_point deadline);
  void greet(Clock::time_point deadline);
  template <typename Start>
  void wait_one(Clock::time_point deadline, const std::string& step, Start start);
  void read_exact(asio::mutable_buffer buffer, Clock::time_point deadline, const std::string& step);
  std::vector<Blob> exchange(std::span<const std::byte> mine, Clock::time_point deadline);
};

// Every error reads "bootstrap: rank R: <problem> (<peer>, <step>)". Only the
// first failure of a run is kept: the rest are usually its consequences.
void TcpBootstrap::Impl::fail(const std::string& problem, const std::string& who, const std::string& step) {
  if (!failure) failure = prefix() + problem + " (" + who + ", " + step + ")";
}

void TcpBootstrap::Impl::fail_now(const std::string& problem, const std::string& who, const std::string& step) {
  fail(problem, who, step);
  abort();
}

// The common tail of every completion handler: true on success, otherwise
// records why (a cancellation is the echo of an earlier failure, not news).
bool TcpBootstrap::Impl::completed(const error_code& ec, const std::string& who, const std::string& step) {
  if (!ec) return true;
  if (ec != asio::error::operation_aborted) fail(is_closed(ec) ? "peer closed the connection" : ec.message(), who, step);
  return false;
}

// Runs handlers until done(), a failure or the deadline. A failure or a
// timeout closes everything and throws; a success leaves nothing pending
// that refers to the caller's locals, since done() covers every operation.
void TcpBootstrap::Impl::run(Clock::time_point deadline, const std::function<bool()>& done,
                             const std::function<std::string()>& waiting_for) {
  io.restart();
  while (!failure && !done()) {
    if (Clock::now() >= deadline) {
      failure = prefix() + "timed out after " + std::to_string(options.timeout.count()) + " ms (" + waiting_for() + ")";
      break;
    }
    io.run_one_until(deadline);
    if (io.stopped() && !failure && !done()) failure = prefix() + "nothing left to wait for (" + waiting_for() + ")";
  }
  if (failure) abort();
}

// Closes every socket, lets the cancelled handlers finish (they hold
// references into the callers' frames), and throws the recorded failure.
void TcpBootstrap::Impl::abort() {
  const std::string message = failure.value_or(prefix() + "failed");
  error_code ignored;
  if (acceptor) acceptor->close(ignored);
  for (tcp::socket& s : peers) s.close(ignored);
  for (auto& j : joiners) j->socket.close(ignored);
  drain();
  broken = true;
  throw Error(message);
}

void TcpBootstrap::Impl::drain() noexcept {
  io.restart();
  try {
    io.run();
  } catch (...) {  // a handler that throws while everything is being torn down changes nothing
  }
}

// ---- rank 0 ---------------------------------------------------------------

tcp::endpoint TcpBootstrap::Impl::bind_endpoint() {
  if (options.host.empty()) return {tcp::v4(), options.port};
  error_code ec;
  const asio::ip::address address = asio::ip::make_address(options.host, ec);
  if (!ec) return {address, options.port};
  tcp::resolver resolver(io);
  const auto results = resolver.resolve(options.host, std::to_string(options.port),
                                        tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) throw Error(prefix() + "cannot resolve " + where + " to listen on: " + ec.message());
  return results.begin()->endpoint();
}

void TcpBootstrap::Impl::listen(Clock::time_point deadline) {
  const tcp::endpoint local = bind_endpoint();
  error_code ec;
  acceptor.emplace(io);
  acceptor->open(local.protocol(), ec);
  if (!ec) acceptor->set_option(tcp::acceptor::reuse_address(true), ec);  // restart within TIME_WAIT
  if (!ec) acceptor->bind(local, ec);
  if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw Error(prefix() + "cannot listen on " + where + ": " + ec.message());
  const tcp::endpoint bound = acceptor->local_endpoint(ec);
  bound_port = bound.port();
  where = endpoint_text(bound);

  for (std::uint32_t r = 0; r < options.size; ++r) peers.emplace_back(io);
  names.assign(options.size, "");
  accept_next();
  run(deadline, [&] { return answered == options.size - 1; }, [&] { return joins_missing(); });
  // Nobody else is expected: a late connect is refused, not left hanging, and
  // a stray connection still owing its hello is dropped.
  error_code ignored;
  acceptor->close(ignored);
  for (auto& j : joiners) j->socket.close(ignored);
  drain();
  joiners.clear();
}

// Keeps one accept pending; every accepted connection reads its hello at
// once, so a silent peer delays nobody else.
void TcpBootstrap::Impl::accept_next() {
  Joiner& j = *joiners.emplace_back(std::make_unique<Joiner>(io));
  acceptor->async_accept(j.socket, [this, &j](const error_code& ec) {
    if (!completed(ec, "listening on " + where, "accepting a connection")) return;
    error_code ignored;
    j.address = endpoint_text(j.socket.remote_endpoint(ignored));
    j.socket.set_option(tcp::no_delay(true), ignored);
    asio::async_read(j.socket, asio::buffer(j.frame), [this, &j](const error_code& e, std::size_t) {
      if (!e) return read_key(j);
      // A stranger that hangs up before its hello is no member of the job.
      if (is_closed(e)) return refuse(j, Verdict::bad_magic, "closed the connection before its hello");
      completed(e, "peer " + j.address, "reading its hello");
    });
    accept_next();
  });
}

// Before the key is checked a connection is a stranger: one that is not an
// ami peer of this version with this job's key is refused and logged, and
// the job goes on waiting for its ranks.
void TcpBootstrap::Impl::read_key(Joiner& j) {
  const Hello hello = decode(j.frame);
  if (hello.magic != kMagic)
    return refuse(j, Verdict::bad_magic,
                  "bad magic " + hex(hello.magic) + " in the hello, expected " + hex(kMagic) +
                      " (not an ami bootstrap peer)");
  if (hello.version != kVersion)
    return refuse(j, Verdict::bad_version,
                  "bad version " + std::to_string(hello.version) + " in the hello, rank 0 speaks version " +
                      std::to_string(kVersion));
  asio::async_read(j.socket, asio::buffer(j.key_length), [this, &j](const error_code& e, std::size_t) {
    if (e) return refuse(j, Verdict::wrong_key, "no job key after its hello (" + e.message() + ")");
    const std::uint32_t length = get_u32(j.key_length.data());
    if (length > kMaxKeyBytes)
      return refuse(j, Verdict::wrong_key,
                    "a job key of " + std::to_string(length) + " bytes exceeds the limit of " +
                        std::to_string(kMaxKeyBytes));
    j.key.resize(length);
    asio::async_read(j.socket, asio::buffer(j.key), [this, &j](const error_code& e2, std::size_t) {
      if (e2) return refuse(j, Verdict::wrong_key, "no job key after its hello (" + e2.message() + ")");
      if (!same_key(j.key, options.key))
        return refuse(j, Verdict::wrong_key, "wrong job key: it does not present this job's AMI_JOB_KEY");
      on_hello(j);
    });
  });
}

// Answers a stranger with the verdict (if it still listens), logs it, closes
// it. Nothing fails: the ranks rank 0 waits for may still come.
void TcpBootstrap::Impl::refuse(Joiner& j, Verdict verdict, const std::string& problem) {
  j.checked = true;
  const std::string line = prefix() + "refused peer " + j.address + ": " + problem;
  refusals.push_back("peer " + j.address + ": " + problem);
  if (options.log) options.log(line);
  else std::fprintf(stderr, "ami: %s\n", line.c_str());
  j.frame = encode({kMagic, kVersion, static_cast<std::uint32_t>(verdict), options.size});
  asio::async_write(j.socket, asio::buffer(j.frame), [this, &j](const error_code& ec, std::size_t) {
    error_code ignored;
    if (ec) return (void)j.socket.close(ignored);
    // Closed only once the stranger closes, whatever it still sends read
    // and dropped: closing on unread bytes would reset the connection and
    // could lose the verdict on its way.
    j.socket.shutdown(tcp::socket::shutdown_send, ignored);
    discard_until_closed(j);
  });
}

void TcpBootstrap::Impl::discard_until_closed(Joiner& j) {
  j.socket.async_read_some(asio::buffer(j.frame), [this, &j](const error_code& ec, std::size_t) {
    error_code ignored;
    if (ec) return (void)j.socket.close(ignored);
    discard_until_closed(j);
  });
}

void TcpBootstrap::Impl::on_hello(Joiner& j) {
  j.checked = true;
  const Hello hello = decode(j.frame);
  std::string problem;
  const Verdict verdict = check(hello, problem);
  j.frame = encode({kMagic, kVersion, static_cast<std::uint32_t>(verdict), options.size});
  if (verdict != Verdict::accepted) {
    // A member of the job (it has the key) that disagrees about the job:
    // the job is misconfigured. Tell the peer before failing, then fail
    // whether or not that worked.
    asio::async_write(j.socket, asio::buffer(j.frame), [this, &j, problem](const error_code&, std::size_t) {
      fail(problem, "peer " + j.address, "checking its hello");
    });
    return;
  }
  const std::uint32_t r = hello.word;
  names[r] = "rank " + std::to_string(r) + " at " + j.address;
  peers[r] = std::move(j.socket);
  asio::async_write(peers[r], asio::buffer(j.frame), [this, r](const error_code& ec, std::size_t) {
    if (completed(ec, names[r], "answering its hello")) ++answered;
  });
}

Verdict TcpBootstrap::Impl::check(const Hello& h, std::string& problem) const {
  const std::string size = std::to_string(options.size);
  const std::string rank = std::to_string(h.word);
  if (h.size != options.size) {
    problem = "size mismatch: the peer, as rank " + rank + ", says the job has " + std::to_string(h.size) +
              " ranks, rank 0 says " + size;
    return Verdict::size_mismatch;
  }
  if (h.word == 0 || h.word >= options.size) {
    problem = "rank out of range: the peer claims rank " + rank + ", the ranks that connect are 1.." +
              std::to_string(options.size - 1);
    return Verdict::rank_out_of_range;
  }
  if (!names[h.word].empty()) {
    problem = "duplicate rank: the peer claims rank " + rank + ", already taken by " + names[h.word];
    return Verdict::duplicate_rank;
  }
  return Verdict::accepted;
}

std::string TcpBootstrap::Impl::joins_missing() const {
  std::vector<std::string> ranks, silent;
  for (std::uint32_t r = 1; r < options.size; ++r)
    if (names[r].empty()) ranks.push_back(std::to_string(r));
  for (const auto& j : joiners)
    if (!j->address.empty() && !j->checked) silent.push_back(j->address);
  std::string text = "listening on " + where + ", waiting for rank(s) " + list(ranks) + " to join";
  if (!silent.empty()) text += "; no hello from peer(s) " + list(silent);
  if (!refusals.empty()) text += "; refused " + list(refusals);
  return text;
}

std::string TcpBootstrap::Impl::ranks_missing(const std::vector<bool>& have, const std::string& step) const {
  std::vector<std::string> missing;
  for (std::uint32_t r = 1; r < options.size; ++r)
    if (!have[r]) missing.push_back(names[r]);
  return list(missing) + ", " + step;
}

// Reads every peer's frame at once: {length, bytes}.
std::vector<Blob> TcpBootstrap::Impl::gather(std::span<const std::byte> mine, Clock::time_point deadline) {
  const std::uint32_t size = options.size;
  std::vector<Blob> all(size);
  all[0].assign(mine.begin(), mine.end());
  std::vector<Word> heads(size);
  std::vector<bool> have(size, false);
  std::uint32_t missing = size - 1;
  const std::string step = "sending its blob";
  auto got = [&](std::uint32_t r) { have[r] = true, --missing; };
  for (std::uint32_t r = 1; r < size; ++r) {
    asio::async_read(peers[r], asio::buffer(heads[r]), [&, r](const error_code& ec, std::size_t) {
      if (!completed(ec, names[r], step)) return;
      const std::uint32_t length = get_u32(heads[r].data());
      if (length > kMaxBlobBytes)
        return fail("malformed frame: a blob length of " + std::to_string(length) + " bytes exceeds the limit of " +
                        std::to_string(kMaxBlobBytes),
                    names[r], step);
      if (length == 0) return got(r);
      all[r].resize(length);
      asio::async_read(peers[r], asio::buffer(all[r]), [&, r](const error_code& e, std::size_t) {
        if (completed(e, names[r], step)) got(r);
      });
    });
  }
  run(deadline, [&] { return missing == 0; }, [&] { return ranks_missing(have, step); });
  scatter(all, deadline);
  return all;
}

// Sends every peer the whole table at once: {count, then count x {length, bytes}}.
void TcpBootstrap::Impl::scatter(const std::vector<Blob>& all, Clock::time_point deadline) {
  Blob table(4);
  put_u32(table.data(), static_cast<std::uint32_t>(all.size()));
  for (const Blob& b : all) {
    Word length;
    put_u32(length.data(), static_cast<std::uint32_t>(b.size()));
    table.insert(table.end(), length.begin(), length.end());
    table.insert(table.end(), b.begin(), b.end());
  }
  std::vector<bool> sent(options.size, false);
  std::uint32_t pending = options.size - 1;
  const std::string step = "receiving the blob table";
  for (std::uint32_t r = 1; r < options.size; ++r) {
    asio::async_write(peers[r], asio::buffer(table), [&, r](const error_code& ec, std::size_t) {
      if (completed(ec, names[r], step)) sent[r] = true, --pending;
    });
  }
  run(deadline, [&] { return pending == 0; }, [&] { return ranks_missing(sent, step); });
}

// ---- the other ranks ------------------------------------------------------

// Connects to rank 0, retrying while it is not there yet (refused) until the
// deadline; the attempt itself is bounded too, for a host that drops SYNs.
void TcpBootstrap::Impl::connect(Clock::time_point deadline) {
  names = {"rank 0 at " + where};
  peers.emplace_back(io);
  tcp::resolver resolver(io);
  error_code ec;
  const auto endpoints =
      resolver.resolve(options.host, std::to_string(options.port), tcp::resolver::numeric_service, ec);
  if (ec) throw Error(prefix() + "cannot resolve the address of " + names[0] + ": " + ec.message());
  error_code last;
  for (;;) {
    std::optional<error_code> result;
    asio::async_connect(peers[0], endpoints, [&](const error_code& e, const tcp::endpoint&) { result = e; });
    run(deadline, [&] { return result.has_value(); }, [&] {
      return "connecting to " + names[0] + ", retrying every " + std::to_string(kRetryInterval.count()) +
             " ms" + (last ? "; last error: " + last.message() : "");
    });
    if (!*result) break;
    last = *result;
    std::this_thread::sleep_for(std::min<Clock::duration>(kRetryInterval, deadline - Clock::now()));
  }
  peers[0].set_option(tcp::no_delay(true), ec);
  greet(deadline);
}

void TcpBootstrap::Impl::greet(Clock::time_point deadline) {
  HelloFrame frame = encode({kMagic, kVersion, options.rank, options.size});
  Word key_length;
  put_u32(key_length.data(), static_cast<std::uint32_t>(options.key.size()));
  const std::array<asio::const_buffer, 3> hello{asio::buffer(frame), asio::buffer(key_length),
                                                asio::buffer(options.key)};
  wait_one(deadline, "sending its hello", [&](auto done) { asio::async_write(peers[0], hello, done); });
  const std::string step = "waiting for the answer to its hello";
  read_exact(asio::buffer(frame), deadline, step);
  const Hello answer = decode(frame);
  if (answer.magic != kMagic || answer.version != kVersion)
    fail_now("bad magic or version in the answer: " + hex(answer.magic) + " version " + std::to_string(answer.version),
             names[0], step);
  const auto verdict = static_cast<Verdict>(answer.word);
  if (verdict != Verdict::accepted)
    fail_now("refused by rank 0: " + to_text(verdict) + " (this rank says rank " + std::to_string(options.rank) +
                 " of " + std::to_string(options.size) + ")",
             names[0], step);
  if (answer.size != options.size)
    fail_now("size mismatch: rank 0 says the job has " + std::to_string(answer.size) + " ranks, this rank says " +
                 std::to_string(options.size),
             names[0], step);
}

// One operation on the socket to rank 0, bounded by the deadline.
template <typename Start>
void TcpBootstrap::Impl::wait_one(Clock::time_point deadline, const std::string& step, Start start) {
  bool finished = false;
  start([this, &finished, &step](const error_code& ec, std::size_t) {
    finished = true;
    completed(ec, names[0], step);
  });
  run(deadline, [&] { return finished; }, [&] { return names[0] + ", " + step; });
}

void TcpBootstrap::Impl::read_exact(asio::mutable_buffer buffer, Clock::time_point deadline, const std::string& step) {
  wait_one(deadline, step, [&](auto done) { asio::async_read(peers[0], buffer, done); });
}

std::vector<Blob> TcpBootstrap::Impl::exchange(std::span<const std::byte> mine, Clock::time_point deadline) {
  Word word;
  put_u32(word.data(), static_cast<std::uint32_t>(mine.size()));
  const std::array<asio::const_buffer, 2> frame{asio::buffer(word), asio::buffer(mine.data(), mine.size())};
  wait_one(deadline, "sending this rank's blob", [&](auto done) { asio::async_write(peers[0], frame, done); });

  const std::string step = "reading the blob table";
  read_exact(asio::buffer(word), deadline, step);
  const std::uint32_t count = get_u32(word.data());
  if (count != options.size)
    fail_now("malformed table: " + std::to_string(count) + " entries for a job of " + std::to_string(options.size),
             names[0], step);
  std::vector<Blob> all(count);
  for (Blob& b : all) {
    read_exact(asio::buffer(word), deadline, step);
    const std::uint32_t length = get_u32(word.data());
    if (length > kMaxBlobBytes)
      fail_now("malformed table: a blob length of " + std::to_string(length) + " bytes exceeds the limit of " +
                   std::to_string(kMaxBlobBytes),
               names[0], step);
    b.resize(length);
    if (length != 0) read_exact(asio::buffer(b), deadline, step);
  }
  return all;
}

// ---- the public face ------------------------------------------------------

TcpBootstrap::TcpBootstrap(const Options& options) : impl_(std::make_unique<Impl>(options)) {
  Impl& m = *impl_;
  if (options.size == 0) throw Error("bootstrap: the job size must be at least 1");
  if (options.key.size() > kMaxKeyBytes)
    throw Error(m.prefix() + "the job key has " + std::to_string(options.key.size()) + " bytes, more than the " +
                std::to_string(kMaxKeyBytes) + " allowed (AMI_JOB_KEY)");
  if (options.rank >= options.size)
    throw Error(m.prefix() + "the rank is not below the job size " + std::to_string(options.size));
  if (options.size == 1) return;
  if (options.rank != 0 && (options.host.empty() || options.port == 0))
    throw Error(m.prefix() + "no address to reach rank 0 at (host '" + options.host + "', port " +
                std::to_string(options.port) + ")");
  const Clock::time_point deadline = Clock::now() + options.timeout;
  if (options.rank == 0) m.listen(deadline);
  else m.connect(deadline);
}

TcpBootstrap::~TcpBootstrap() = default;  // the sockets' destructors close them and report nothing

std::uint32_t TcpBootstrap::rank() const { return impl_->options.rank; }
std::uint32_t TcpBootstrap::size() const { return impl_->options.size; }
std::uint16_t TcpBootstrap::port() const { return impl_->bound_port ? impl_->bound_port : impl_->options.port; }

std::vector<Blob> TcpBootstrap::allgather(std::span<const std::byte> mine) {
  Impl& m = *impl_;
  if (mine.size() > kMaxBlobBytes)
    throw Error(m.prefix() + "a blob of " + std::to_string(mine.size()) + " bytes exceeds the limit of " +
                std::to_string(kMaxBlobBytes));
  if (m.options.size == 1) return {Blob(mine.begin(), mine.end())};
  if (m.broken) throw Error(m.prefix() + "unusable after an earlier failure, its sockets are closed");
  const Clock::time_point deadline = Clock::now() + m.options.timeout;
  return m.options.rank == 0 ? m.gather(mine, deadline) : m.exchange(mine, deadline);
}

void TcpBootstrap::barrier() { (void)allgather({}); }

std::vector<int> TcpBootstrap::sockets() const {
  std::vector<int> fds;
  const std::size_t first = impl_->options.rank == 0 ? 1 : 0;
  for (std::size_t i = first; i < impl_->peers.size(); ++i)
    if (impl_->peers[i].is_open()) fds.push_back(impl_->peers[i].native_handle());
  return fds;
}

std::vector<std::pair<std::uint32_t, int>> TcpBootstrap::peer_sockets() const {
  std::vector<std::pair<std::uint32_t, int>> out;
  if (impl_->broken) return out;
  if (impl_->options.rank != 0) {
    if (!impl_->peers.empty() && impl_->peers[0].is_open()) out.emplace_back(0, impl_->peers[0].native_handle());
    return out;
  }
  for (std::uint32_t r = 1; r < impl_->peers.size(); ++r)
    if (impl_->peers[r].is_open()) out.emplace_back(r, impl_->peers[r].native_handle());
  return out;
}

bool parse_address(std::string_view text, std::string& host, std::uint16_t& port) {
  std::string_view h, p;
  if (text.starts_with('[')) {
    const std::size_t close = text.find(']');
    if (close == std::string_view::npos || text.substr(close + 1, 1) != ":") return false;
    h = text.substr(1, close - 1);
    p = text.substr(close + 2);
  } else {
    const std::size_t colon = text.find(':');
    if (colon == std::string_view::npos || text.find(':', colon + 1) != std::string_view::npos)
      return false;  // a bare v6 address is ambiguous: it needs its brackets
    h = text.substr(0, colon);
    p = text.substr(colon + 1);
  }
  if (h.empty() || h.find_first_of(" \t[]") != std::string_view::npos) return false;
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), value);
  if (p.empty() || ec != std::errc{} || end != p.data() + p.size() || value == 0 || value > 65535) return false;
  host.assign(h);
  port = static_cast<std::uint16_t>(value);
  return true;
}

}  // namespace ami::bootstrap
