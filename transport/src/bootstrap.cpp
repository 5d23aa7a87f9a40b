// bootstrap.cpp — the TCP bootstrap on Boost.Asio: the public TcpBootstrap,
// what every rank does to run and fail its operations, the connecting side
// (a rank to rank 0, a child to its parent), and rank 0's gather. Listening
// is in bootstrap_listener.cpp, the tree and the table's way down it in
// bootstrap_tree.cpp.
//
// Every socket operation is asynchronous and runs on the bootstrap's own
// io_context under a deadline, so no peer, silent or absent, can hold a rank
// past its timeout; on any failure every socket is closed before the error
// is thrown, the rank first telling the ranks that joined it why.
#include "bootstrap.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <thread>

#include "ami/error.hpp"
#include "bootstrap_impl.hpp"

namespace ami::bootstrap {

using namespace wire;

namespace {

constexpr auto kRetryInterval = std::chrono::milliseconds(50);

}  // namespace

// ---- every rank: running and failing ------------------------------------

void TcpBootstrap::Impl::say(const std::string& line) const {
  if (options.log) options.log(line);
  else std::fprintf(stderr, "ami: %s\n", line.c_str());
}

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

// The rank first tells the ranks that joined it why; then every socket is
// closed, the cancelled handlers finish (they hold references into the
// callers' frames), and the recorded failure is thrown.
void TcpBootstrap::Impl::abort() {
  const std::string message = failure.value_or(prefix() + "failed");
  tell_failure(message);
  close_everything();
  drain();
  pending.clear();
  strangers.flush();
  claims.flush();
  broken = true;
  throw Error(message);
}

void TcpBootstrap::Impl::close_everything() {
  error_code ignored;
  if (acceptor) acceptor->close(ignored);
  if (hello_timer) hello_timer->cancel();
  if (accept_timer) accept_timer->cancel();
  for (auto& [rank, m] : members) m.socket.close(ignored);
  if (parent) parent->socket.close(ignored);
  for (auto& [rank, m] : children) m.socket.close(ignored);
  for (const JoinerPtr& j : pending) j->socket.close(ignored);
}

void TcpBootstrap::Impl::drain() noexcept {
  io.restart();
  try {
    io.run();
  } catch (...) {  // a handler that throws while everything is being torn down changes nothing
  }
}

// ---- rank 0: the exchanges ----------------------------------------------

std::string TcpBootstrap::Impl::ranks_missing(const std::vector<bool>& have, const std::string& step) const {
  Listing missing;
  for (const auto& [rank, m] : members)
    if (!have[rank]) missing.add(m.name);
  return missing.text() + ", " + step;
}

// Reads every peer's frame at once: {length, bytes}.
Table TcpBootstrap::Impl::gather(std::span<const std::byte> mine, Clock::time_point deadline) {
  const std::uint32_t size = options.size;
  std::vector<Blob> all(size);
  all[0].assign(mine.begin(), mine.end());
  std::vector<Word> heads(size);
  std::vector<bool> have(size, false);
  std::uint32_t missing = size - 1;
  const std::string step = "sending its blob";
  auto got = [&](std::uint32_t r) { have[r] = true, --missing; };
  for (auto& [rank, member] : members) {
    const std::uint32_t r = rank;
    Member& m = member;
    asio::async_read(m.socket, asio::buffer(heads[r]), [&, r](const error_code& ec, std::size_t) {
      if (!completed(ec, m.name, step)) return;
      const std::uint32_t length = get_u32(heads[r].data());
      if (length > kMaxBlobBytes)
        return fail("malformed frame: a blob length of " + std::to_string(length) + " bytes exceeds the limit of " +
                        std::to_string(kMaxBlobBytes),
                    m.name, step);
      if (length == 0) return got(r);
      all[r].resize(length);
      asio::async_read(m.socket, asio::buffer(all[r]), [&, r](const error_code& e, std::size_t) {
        if (completed(e, m.name, step)) got(r);
      });
    });
  }
  run(deadline, [&] { return missing == 0; }, [&] { return ranks_missing(have, step); });
  return pack(all);
}

// ---- the other ranks ----------------------------------------------------

// Connects to rank 0 and says hello; then makes this rank's links in the tree.
void TcpBootstrap::Impl::connect(Clock::time_point deadline) {
  members.emplace(0, Member{tcp::socket(io), 0, "rank 0 at " + options.host + ":" + std::to_string(options.port)});
  tcp::resolver resolver(io);
  error_code ec;
  const auto endpoints =
      resolver.resolve(options.host, std::to_string(options.port), tcp::resolver::numeric_service, ec);
  if (ec) throw Error(prefix() + "cannot resolve the address of " + root().name + ": " + ec.message());
  join(root(), {endpoints.begin(), endpoints.end()}, deadline);
  join_tree(deadline);
}

// Connects to a listening rank and says hello, again and again until the
// deadline while it is not there yet (refused) or answers busy (it dropped
// the connection under load).
void TcpBootstrap::Impl::join(Member& peer, const std::vector<tcp::endpoint>& endpoints,
                              Clock::time_point deadline) {
  std::string last;  // why the last attempt did not join
  while (!join_once(peer, endpoints, deadline, last)) {
    error_code ignored;
    peer.socket.close(ignored);
    std::this_thread::sleep_for(std::min<Clock::duration>(kRetryInterval, deadline - Clock::now()));
  }
}

// One attempt; false, with why in `last`, when it is worth another. The
// connect itself is bounded too, for a host that drops SYNs.
bool TcpBootstrap::Impl::join_once(Member& peer, const std::vector<tcp::endpoint>& endpoints,
                                   Clock::time_point deadline, std::string& last) {
  std::optional<error_code> result;
  start_connect(peer, endpoints, result);
  run(deadline, [&] { return result.has_value(); }, [&] {
    return "connecting to " + peer.name + ", retrying every " + std::to_string(kRetryInterval.count()) + " ms" +
           (last.empty() ? "" : "; last error: " + last);
  });
  if (*result) {
    last = result->message();
    return false;
  }
  error_code ignored;
  peer.socket.set_option(tcp::no_delay(true), ignored);
  if (peer.rank == 0 && has_children(options.rank, options.size) && !acceptor) open_children_acceptor();
  return greet(peer, deadline, last);
}

// From the rank's own address, if it has one, to the first of the peer's
// endpoints in that address's family; otherwise to each in turn.
void TcpBootstrap::Impl::start_connect(Member& peer, const std::vector<tcp::endpoint>& endpoints,
                                       std::optional<error_code>& result) {
  if (!local) {
    asio::async_connect(peer.socket, endpoints, [&](const error_code& e, const tcp::endpoint&) { result = e; });
    return;
  }
  const std::string step = "connecting from " + local->to_string();
  const auto to =
      std::ranges::find_if(endpoints, [&](const tcp::endpoint& e) { return e.address().is_v4() == local->is_v4(); });
  if (to == endpoints.end()) fail_now("no address of the peer in the family of this rank's own", peer.name, step);
  error_code ec;
  peer.socket.open(to->protocol(), ec);
  if (!ec) peer.socket.bind({*local, 0}, ec);
  if (ec) fail_now("cannot bind to this rank's address: " + ec.message(), peer.name, step);
  peer.socket.async_connect(*to, [&](const error_code& e) { result = e; });
}

// To rank 0, a rank with children says where they will find it: the port
// after the key.
bool TcpBootstrap::Impl::greet(Member& peer, Clock::time_point deadline, std::string& last) {
  HelloFrame frame = encode({kMagic, kVersion, options.rank, options.size});
  Word key_length, port;
  put_u32(key_length.data(), static_cast<std::uint32_t>(options.key.size()));
  put_u32(port.data(), bound_port);
  const bool with_port = peer.rank == 0 && has_children(options.rank, options.size);
  const std::array<asio::const_buffer, 4> hello{asio::buffer(frame), asio::buffer(key_length),
                                                asio::buffer(options.key), asio::buffer(port, with_port ? 4 : 0)};
  const std::string step = "waiting for the answer to its hello";
  // A hello cut short by the listener closing may fail to send; it may have
  // said why first, so the answer is read all the same.
  const error_code sent = wait_one(peer, deadline, "sending its hello", [&](auto done) {
    asio::async_write(peer.socket, hello, [this, done](const error_code& ec, std::size_t n) {
      bytes_sent += n;
      done(ec, n);
    });
  });
  if (sent && !is_closed(sent)) fail_now(sent.message(), peer.name, "sending its hello");
  read_exact(peer, asio::buffer(frame), deadline, step);
  const Hello answer = decode(frame);
  const bool busy = answer.magic == kMagic && answer.version == kVersion &&
                    answer.word == static_cast<std::uint32_t>(Verdict::busy);
  if (busy) {
    last = to_text(Verdict::busy) + " (busy)";
    return false;
  }
  check_answer(peer, frame, deadline, step);
  return true;
}

void TcpBootstrap::Impl::check_answer(Member& peer, const HelloFrame& frame, Clock::time_point deadline,
                                      const std::string& step) {
  const Hello answer = decode(frame);
  const std::string listener = "rank " + std::to_string(peer.rank);
  if (answer.magic != kMagic || answer.version != kVersion)
    fail_now("bad magic or version in the answer: " + hex(answer.magic) + " version " + std::to_string(answer.version),
             peer.name, step);
  const auto verdict = static_cast<Verdict>(answer.word);
  if (verdict == Verdict::listener_failed) {
    const std::string reason = read_reason(peer, deadline, step);
    fail_now(listener + " failed before it answered this rank's hello" + (reason.empty() ? "" : ": " + reason),
             peer.name, step);
  }
  if (verdict != Verdict::accepted)
    fail_now("refused by " + listener + ": " + to_text(verdict) + " (this rank says rank " +
                 std::to_string(options.rank) + " of " + std::to_string(options.size) + ")",
             peer.name, step);
  if (answer.size != options.size)
    fail_now("size mismatch: " + listener + " says the job has " + std::to_string(answer.size) +
                 " ranks, this rank says " + std::to_string(options.size),
             peer.name, step);
}

std::string TcpBootstrap::Impl::read_reason(Member& peer, Clock::time_point deadline, const std::string& step) {
  const std::uint32_t length =
      read_length(peer, kMaxReasonBytes, "malformed failure notice: a reason of", deadline, step);
  std::string reason(length, '\0');
  if (length != 0) read_exact(peer, asio::buffer(reason), deadline, step);
  return printable(std::move(reason));
}

// The peer sent a failure notice where a frame was due: its reason follows.
void TcpBootstrap::Impl::sender_failed(Member& peer, Clock::time_point deadline, const std::string& step) {
  const std::string reason = read_reason(peer, deadline, step);
  fail_now("rank " + std::to_string(peer.rank) + " failed: " + reason, peer.name, step);
}

// A length word from the peer, refused above `limit`; `what` names the frame
// and the field in the error ("malformed table: a blob length of").
std::uint32_t TcpBootstrap::Impl::read_length(Member& peer, std::size_t limit, const std::string& what,
                                              Clock::time_point deadline, const std::string& step) {
  const std::uint32_t length = read_word(peer, deadline, step);
  if (length > limit)
    fail_now(what + " " + std::to_string(length) + " bytes exceeds the limit of " + std::to_string(limit), peer.name,
             step);
  return length;
}

std::uint32_t TcpBootstrap::Impl::read_word(Member& peer, Clock::time_point deadline, const std::string& step) {
  Word word;
  read_exact(peer, asio::buffer(word), deadline, step);
  return get_u32(word.data());
}

void TcpBootstrap::Impl::read_exact(Member& peer, asio::mutable_buffer buffer, Clock::time_point deadline,
                                    const std::string& step) {
  const error_code ec =
      wait_one(peer, deadline, step, [&](auto done) { asio::async_read(peer.socket, buffer, done); });
  if (ec) fail_now(is_closed(ec) ? "peer closed the connection" : ec.message(), peer.name, step);
}

// A connection rank 0 has closed is not reported here: rank 0 may have said
// why before it closed, and reading the table tells that.
void TcpBootstrap::Impl::send_blob(std::span<const std::byte> mine, Clock::time_point deadline) {
  Word word;
  put_u32(word.data(), static_cast<std::uint32_t>(mine.size()));
  const std::array<asio::const_buffer, 2> frame{asio::buffer(word), asio::buffer(mine.data(), mine.size())};
  const std::string step = "sending this rank's blob";
  const error_code ec = wait_one(root(), deadline, step, [&](auto done) {
    asio::async_write(root().socket, frame, [this, done](const error_code& e, std::size_t n) {
      bytes_sent += n;
      done(e, n);
    });
  });
  if (ec && !is_closed(ec)) fail_now(ec.message(), root().name, step);
}

// ---- the public face ----------------------------------------------------

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
  if (options.rank != 0 && !options.local_host.empty()) {
    error_code ec;
    m.local = asio::ip::make_address(options.local_host, ec);
    if (ec) throw Error(m.prefix() + "cannot use '" + options.local_host + "' as this rank's address: " + ec.message());
  }
  const Clock::time_point deadline = Clock::now() + options.timeout;
  if (options.rank == 0) m.listen(deadline);
  else m.connect(deadline);
}

TcpBootstrap::~TcpBootstrap() = default;  // the sockets' destructors close them and report nothing

std::uint32_t TcpBootstrap::rank() const { return impl_->options.rank; }
std::uint32_t TcpBootstrap::size() const { return impl_->options.size; }
std::uint16_t TcpBootstrap::port() const {
  return impl_->options.rank == 0 && impl_->bound_port ? impl_->bound_port : impl_->options.port;
}

std::vector<Blob> TcpBootstrap::allgather(std::span<const std::byte> mine) { return allgather_table(mine).blobs(); }

// Rank 0 gathers; every rank then forwards the table to its children.
Table TcpBootstrap::allgather_table(std::span<const std::byte> mine) {
  Impl& m = *impl_;
  if (mine.size() > kMaxBlobBytes)
    throw Error(m.prefix() + "a blob of " + std::to_string(mine.size()) + " bytes exceeds the limit of " +
                std::to_string(kMaxBlobBytes));
  if (m.options.size == 1) return Impl::pack({Blob(mine.begin(), mine.end())});
  if (m.broken) throw Error(m.prefix() + "unusable after an earlier failure, its sockets are closed");
  const Clock::time_point deadline = Clock::now() + m.options.timeout;
  if (m.options.rank != 0) m.send_blob(mine, deadline);
  Table table = m.options.rank == 0 ? m.gather(mine, deadline) : m.receive_table(mine, deadline);
  m.forward(table, deadline);
  return table;
}

void TcpBootstrap::barrier() { (void)allgather({}); }

std::uint64_t TcpBootstrap::bytes_sent() const { return impl_->bytes_sent; }

std::vector<int> TcpBootstrap::sockets() const {
  std::vector<int> fds;
  for (auto& [rank, m] : impl_->members)
    if (m.socket.is_open()) fds.push_back(m.socket.native_handle());
  return fds;
}

std::vector<std::pair<std::uint32_t, int>> TcpBootstrap::peer_sockets() const {
  std::vector<std::pair<std::uint32_t, int>> out;
  if (impl_->broken) return out;
  for (auto& [rank, m] : impl_->members)
    if (m.socket.is_open()) out.emplace_back(rank, m.socket.native_handle());
  return out;
}

void Bootstrap::publish(std::span<const std::byte>) {
  throw Error("bootstrap: " + std::string(name()) + " has no store to publish into: it only gathers");
}

Blob Bootstrap::fetch(std::uint32_t) const {
  throw Error("bootstrap: " + std::string(name()) + " has no store to fetch from: it only gathers");
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
