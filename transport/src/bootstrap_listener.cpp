// bootstrap_listener.cpp — the listening side of the TCP bootstrap, rank 0's
// for the job and a parent's for its children in the tree, one code for
// both: accepting connections, the ones still owing their hello and their
// deadlines, surviving accept()'s shortage of descriptors or memory, checking
// hellos and claims, logging refusals without letting a flood write a book,
// and the failure notice a listening rank leaves the ranks that joined it and
// its joiners when it fails. What differs is only which ranks may join: rank
// 0 takes ranks 1..N-1, a parent its children.
//
// It is built for strangers too: what one connection that never says hello
// can cost (a descriptor, a Joiner, a log line) is bounded per connection and
// in total (see bootstrap.hpp).
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>

#include "ami/error.hpp"
#include "bootstrap_impl.hpp"

namespace ami::bootstrap {

using namespace wire;

namespace {

// When accept() is out of descriptors and no connection can be dropped for
// one, the next try waits this long rather than spin.
constexpr auto kAcceptBackoff = std::chrono::milliseconds(20);
constexpr std::size_t kLoggedOneByOne = 5;  // refusals logged a line each before they are only counted
constexpr auto kSummaryInterval = std::chrono::seconds(1);
constexpr std::size_t kMaxDiscardBytes = 1 << 20;  // read and dropped before a last close, at most

// {length, reason}, the tail of both ways a listening rank says it failed.
void append_reason(Blob& b, std::string_view reason) {
  reason = reason.substr(0, kMaxReasonBytes);
  append_u32(b, static_cast<std::uint32_t>(reason.size()));
  for (char c : reason) b.push_back(static_cast<std::byte>(c));
}

Blob failure_answer(std::uint32_t size) {
  const HelloFrame head = answer_frame(Verdict::listener_failed, size);
  Blob b(head.begin(), head.end());
  append_reason(b, "");  // its hello was not checked: it may be no member of the job
  return b;
}

Blob failure_notice(std::string_view reason) {
  Blob b;
  append_u32(b, kFailureMark);
  append_reason(b, reason);
  return b;
}

// Compares the whole of both keys whatever the first difference, so the time
// taken says nothing about how much of a guess was right.
bool same_key(std::span<const std::byte> a, std::string_view b) {
  unsigned difference = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i)
    difference |= std::to_integer<unsigned>(a[i]) ^ static_cast<unsigned char>(i < b.size() ? b[i] : 0);
  return difference == 0;
}

// accept() failing for want of a descriptor or of memory is the listener's
// own shortage, not a fault of the job: it frees one and goes on.
bool is_shortage(const error_code& ec) {
  namespace errc = boost::system::errc;
  return ec == errc::too_many_files_open || ec == errc::too_many_files_open_in_system ||
         ec == errc::no_buffer_space || ec == errc::not_enough_memory;
}

}  // namespace

// ---- writing without waiting ---------------------------------------------

// Writes a short frame without waiting: on a connection that has been sent
// little or nothing it always fits in the socket's buffer. False if it did
// not go whole.
bool TcpBootstrap::Impl::send_now(tcp::socket& s, std::span<const std::byte> bytes) {
  if (!s.is_open()) return false;
  const ssize_t n = ::send(s.native_handle(), bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n > 0) bytes_sent += static_cast<std::uint64_t>(n);
  return n == static_cast<ssize_t>(bytes.size());
}

// The last word on a connection about to close: the frame, its end of the
// stream, and what the peer had sent read and dropped, so that the close
// sends a FIN behind the frame and not a reset, which could discard the
// frame on its way.
void TcpBootstrap::Impl::last_word(tcp::socket& s, std::span<const std::byte> bytes) {
  if (!send_now(s, bytes)) return;
  const int fd = s.native_handle();
  ::shutdown(fd, SHUT_WR);
  std::array<std::byte, 4096> dropped;
  for (std::size_t total = 0; total < kMaxDiscardBytes;) {
    const ssize_t n = ::recv(fd, dropped.data(), dropped.size(), MSG_DONTWAIT);
    if (n <= 0) break;
    total += static_cast<std::size_t>(n);
  }
}

// ---- the refusal logs ---------------------------------------------------

void TcpBootstrap::Impl::RefusalLog::note(const std::string& what) {
  if (one_by_one_ < kLoggedOneByOne) {
    ++one_by_one_;
    return sink_(prefix_ + "refused " + what);
  }
  if (unlogged_ == 0) since_ = Clock::now();
  ++unlogged_;
  last_ = what;
  if (Clock::now() - since_ >= kSummaryInterval) flush();
}

void TcpBootstrap::Impl::RefusalLog::flush() {
  if (unlogged_ == 0) return;
  sink_(prefix_ + "refused " + std::to_string(unlogged_) + " more " + noun_ + " (the last: " + last_ + ")");
  unlogged_ = 0;
}

// ---- listening and accepting --------------------------------------------

// Rank 0 keeps a socket per rank for the job's life: a job its descriptor
// limit cannot hold would fail half-way, once its ranks had come, so it is
// refused before anything is allocated for it.
void TcpBootstrap::Impl::check_descriptor_limit() const {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return;
  const std::uint64_t needed = std::uint64_t{options.size} - 1 + kSpareDescriptors;
  if (needed <= limit.rlim_cur) return;
  const std::string hard =
      limit.rlim_max == RLIM_INFINITY ? "" : " (the hard limit is " + std::to_string(limit.rlim_max) + ")";
  throw Error(prefix() + "cannot serve a job of " + std::to_string(options.size) +
              " ranks (AMI_SIZE): rank 0 needs a socket per other rank (" + std::to_string(options.size - 1) +
              ") and " + std::to_string(kSpareDescriptors) + " descriptors besides, " + std::to_string(needed) +
              " in all, but its limit of open files (RLIMIT_NOFILE) is " + std::to_string(limit.rlim_cur) +
              ": raise it with ulimit -n " + std::to_string(needed) + hard + ", or run a smaller job");
}

// The ranks that may join this one: rank 0 takes every other, a parent its
// children.
std::uint32_t TcpBootstrap::Impl::first_expected() const {
  return options.rank == 0 ? 1 : static_cast<std::uint32_t>(first_child(options.rank));
}

std::uint32_t TcpBootstrap::Impl::end_expected() const {
  return options.rank == 0 ? options.size : static_cast<std::uint32_t>(end_of_children(options.rank, options.size));
}

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

void TcpBootstrap::Impl::open_acceptor(const tcp::endpoint& local) {
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
}

// Rank 0: the job forms, and then every rank whose parent is not rank 0
// learns where its parent listens.
void TcpBootstrap::Impl::listen(Clock::time_point deadline) {
  check_descriptor_limit();
  open_acceptor(bind_endpoint());
  serve(deadline);
  tell_parents();
}

// Takes the ranks expected here, each once, until all have joined.
void TcpBootstrap::Impl::serve(Clock::time_point deadline) {
  hello_timer.emplace(io);
  accept_timer.emplace(io);
  listen_deadline = deadline;
  accept_next();
  const std::size_t expected = end_expected() - first_expected();
  run(deadline, [&] { return joined().size() == expected; }, [&] { return joins_missing(); });
  stop_listening(options.rank == 0 ? "still no hello when the job formed" : "still no hello when the children joined");
}

// Nobody else is expected: a late connect is refused, not left hanging, and
// a stray connection still owing its hello is dropped and counted.
void TcpBootstrap::Impl::stop_listening(const std::string& why) {
  error_code ignored;
  acceptor->close(ignored);
  hello_timer->cancel();
  accept_timer->cancel();
  while (!pending.empty()) {
    const JoinerPtr oldest = pending.front();
    drop(*oldest, why);
  }
  drain();
  strangers.flush();
  claims.flush();
}

// Keeps one accept pending; every accepted connection reads its hello at
// once, so a silent peer delays nobody else.
void TcpBootstrap::Impl::accept_next() {
  auto j = std::make_shared<Joiner>(io);
  acceptor->async_accept(j->socket, [this, j](const error_code& ec) {
    if (ec == asio::error::operation_aborted) return;
    if (ec) return on_accept_error(ec);
    on_accepted(j);
    accept_next();
  });
}

// A full `pending` makes room by dropping its oldest: a real rank says its
// hello at once, so the oldest is the likeliest to be no rank at all.
void TcpBootstrap::Impl::on_accepted(const JoinerPtr& j) {
  error_code ignored;
  j->address = endpoint_text(j->socket.remote_endpoint(ignored));
  j->socket.set_option(tcp::no_delay(true), ignored);
  j->hello_deadline = Clock::now() + options.hello_timeout;
  if (pending.size() >= kMaxPendingConnections) {
    const JoinerPtr oldest = pending.front();
    shed(*oldest, "dropped: " + std::to_string(kMaxPendingConnections) + " connections were waiting for their hello");
  }
  j->place = pending.insert(pending.end(), j);
  j->listed = true;
  read_hello(j);
  arm_hello_timer();
}

// Out of descriptors or memory: the oldest connection without a hello gives
// its descriptor up and accept() tries again at once; with none to give up,
// after a pause. Anything else is the listener's own failure.
void TcpBootstrap::Impl::on_accept_error(const error_code& ec) {
  if (!is_shortage(ec)) return (void)completed(ec, "listening on " + where, "accepting a connection");
  if (!shortage)
    say(prefix() + "accepting a connection: " + ec.message() +
        "; dropping the oldest connections that have said no hello, and going on");
  shortage = ec;
  if (!pending.empty()) {
    const JoinerPtr oldest = pending.front();
    shed(*oldest, "dropped to free a descriptor (accepting a connection: " + ec.message() + ")");
    return accept_next();
  }
  accept_timer->expires_after(kAcceptBackoff);
  accept_timer->async_wait([this](const error_code& e) {
    if (!e) accept_next();
  });
}

// One timer for every hello deadline: `pending` is in order of arrival and
// every connection gets the same time, so the oldest is always due first.
// Deadlines the job's own timeout reaches first are left to it: its error
// names the silent peers.
void TcpBootstrap::Impl::arm_hello_timer() {
  if (hello_timer_armed || pending.empty()) return;
  const Clock::time_point due = pending.front()->hello_deadline;
  if (due >= listen_deadline) return;
  hello_timer_armed = true;
  hello_timer->expires_at(due);
  hello_timer->async_wait([this](const error_code& ec) {
    hello_timer_armed = false;
    if (!ec) on_hello_deadline();
  });
}

void TcpBootstrap::Impl::on_hello_deadline() {
  const Clock::time_point now = Clock::now();
  while (!pending.empty() && pending.front()->hello_deadline <= now) {
    const JoinerPtr oldest = pending.front();
    shed(*oldest, "no hello within " + std::to_string(options.hello_timeout.count()) + " ms");
  }
  arm_hello_timer();
}

void TcpBootstrap::Impl::drop(Joiner& j, const std::string& why) {
  count_refusal(j, why);
  forget(j);
}

// Dropped for want of room or time, not for what it said: in case it is a
// rank, it is asked to connect again (busy) rather than left to take the
// close for the listener's end.
void TcpBootstrap::Impl::shed(Joiner& j, const std::string& why) {
  if (!j.answered) last_word(j.socket, answer_frame(Verdict::busy, options.size));
  drop(j, why);
}

// Each connection that is no rank of the job is counted once, whatever
// happens to it after.
void TcpBootstrap::Impl::count_refusal(Joiner& j, const std::string& why) {
  if (j.counted) return;
  j.counted = true;
  refusals.add("peer " + j.address + ": " + why);
  strangers.note("peer " + j.address + ": " + why);
}

void TcpBootstrap::Impl::forget(Joiner& j) {
  error_code ignored;
  j.socket.close(ignored);
  if (!j.listed) return;
  pending.erase(j.place);
  j.listed = false;
}

// ---- hellos and claims --------------------------------------------------

void TcpBootstrap::Impl::read_hello(const JoinerPtr& j) {
  asio::async_read(j->socket, asio::buffer(j->frame), [this, j](const error_code& ec, std::size_t) {
    if (ec == asio::error::operation_aborted) return;
    // A stranger that hangs up before its hello is no member of the job.
    if (ec)
      return drop(*j, is_closed(ec) ? "closed the connection before its hello" : ec.message() + " before its hello");
    read_key(j);
  });
}

// Before the key is checked a connection is a stranger: one that is not an
// ami peer of this version with this job's key is refused and logged, and
// the job goes on waiting for its ranks.
void TcpBootstrap::Impl::read_key(const JoinerPtr& j) {
  const Hello hello = decode(j->frame);
  if (hello.magic != kMagic)
    return refuse(j, Verdict::bad_magic,
                  "bad magic " + hex(hello.magic) + " in the hello, expected " + hex(kMagic) +
                      " (not an ami bootstrap peer)");
  if (hello.version != kVersion)
    return refuse(j, Verdict::bad_version,
                  "bad version " + std::to_string(hello.version) + " in the hello, rank " +
                      std::to_string(options.rank) + " speaks version " + std::to_string(kVersion));
  asio::async_read(j->socket, asio::buffer(j->key_length), [this, j](const error_code& e, std::size_t) {
    if (e == asio::error::operation_aborted) return;
    if (e) return refuse(j, Verdict::wrong_key, "no job key after its hello (" + e.message() + ")");
    const std::uint32_t length = get_u32(j->key_length.data());
    if (length > kMaxKeyBytes)
      return refuse(j, Verdict::wrong_key,
                    "a job key of " + std::to_string(length) + " bytes exceeds the limit of " +
                        std::to_string(kMaxKeyBytes));
    j->key.resize(length);
    asio::async_read(j->socket, asio::buffer(j->key), [this, j](const error_code& e2, std::size_t) {
      if (e2 == asio::error::operation_aborted) return;
      if (e2) return refuse(j, Verdict::wrong_key, "no job key after its hello (" + e2.message() + ")");
      if (!same_key(j->key, options.key))
        return refuse(j, Verdict::wrong_key, "wrong job key: it does not present this job's AMI_JOB_KEY");
      on_hello(j);
    });
  });
}

// Tells a stranger the verdict (if it still listens) and counts it. Nothing
// fails: the ranks the listener waits for may still come.
void TcpBootstrap::Impl::refuse(const JoinerPtr& j, Verdict verdict, const std::string& problem) {
  count_refusal(*j, problem);
  answer_and_linger(j, verdict);
}

// A second claim of a rank: the first claimant keeps it, the second is told
// at once and fails, and the listener says so loudly, naming both, whichever is
// the impostor. Its own log budget: a flood of strangers cannot hide it.
void TcpBootstrap::Impl::refuse_claim(const JoinerPtr& j, std::uint32_t rank) {
  j->counted = true;
  const std::string holder = joined().at(rank).name;
  const std::string what = "a second claim of rank " + std::to_string(rank) + ": peer " + j->address +
                           " claims it, already taken by " + holder;
  refusals.add(what);
  claims.note(what);
  answer_and_linger(j, Verdict::duplicate_rank);
}

// Closed only once the peer closes (or its hello deadline passes), whatever
// it still sends read and dropped: closing on unread bytes would reset the
// connection and could lose the verdict on its way.
void TcpBootstrap::Impl::answer_and_linger(const JoinerPtr& j, Verdict verdict) {
  j->answered = true;
  j->frame = answer_frame(verdict, options.size);
  if (!send_now(j->socket, j->frame)) return forget(*j);
  error_code ignored;
  j->socket.shutdown(tcp::socket::shutdown_send, ignored);
  discard_until_closed(j);
}

void TcpBootstrap::Impl::discard_until_closed(const JoinerPtr& j) {
  j->socket.async_read_some(asio::buffer(j->frame), [this, j](const error_code& ec, std::size_t) {
    if (ec == asio::error::operation_aborted) return;
    if (ec) return forget(*j);
    discard_until_closed(j);
  });
}

void TcpBootstrap::Impl::on_hello(const JoinerPtr& j) {
  const Hello hello = decode(j->frame);
  std::string problem;
  const Verdict verdict = check(hello, problem);
  if (verdict == Verdict::accepted && options.rank == 0 && has_children(hello.word, options.size))
    return read_port(j, hello.word);
  if (verdict == Verdict::accepted) return take(j, hello.word, 0);
  if (verdict == Verdict::duplicate_rank) return refuse_claim(j, hello.word);
  // A member of the job (it has the key) that disagrees about the job: the
  // job is misconfigured. Tell the peer, then fail whether or not that worked.
  j->answered = j->counted = true;
  j->frame = answer_frame(verdict, options.size);
  (void)send_now(j->socket, j->frame);
  fail(problem, "peer " + j->address, "checking its hello");
}

// A rank with children tells rank 0 where it listens for them: the word
// after its key. It has shown the key, so a port no rank could listen on is
// the job's fault, as a size mismatch is.
void TcpBootstrap::Impl::read_port(const JoinerPtr& j, std::uint32_t rank) {
  asio::async_read(j->socket, asio::buffer(j->port), [this, j, rank](const error_code& ec, std::size_t) {
    if (ec == asio::error::operation_aborted) return;
    if (ec) return drop(*j, (is_closed(ec) ? "closed the connection" : ec.message()) + " before its port");
    if (joined().contains(rank)) return refuse_claim(j, rank);  // another took the rank meanwhile
    const std::uint32_t port = get_u32(j->port.data());
    if (port == 0 || port > 65535) {
      j->answered = j->counted = true;
      return fail("malformed hello: a port of " + std::to_string(port) + " for its children", "peer " + j->address,
                  "checking its hello");
    }
    take(j, rank, static_cast<std::uint16_t>(port));
  });
}

// The answer goes at once, so a rank is either answered or not a member:
// the listener never has to cut into a half-sent answer to say it failed.
void TcpBootstrap::Impl::take(const JoinerPtr& j, std::uint32_t rank, std::uint16_t children_port) {
  j->frame = answer_frame(Verdict::accepted, options.size);
  if (!send_now(j->socket, j->frame)) return drop(*j, "its answer could not be sent");
  if (j->listed) {
    pending.erase(j->place);
    j->listed = false;
  }
  joined().emplace(rank, Member{std::move(j->socket), rank, "rank " + std::to_string(rank) + " at " + j->address,
                                children_port});
}

Verdict TcpBootstrap::Impl::check(const Hello& h, std::string& problem) const {
  const std::string size = std::to_string(options.size);
  const std::string rank = std::to_string(h.word);
  if (h.size != options.size) {
    problem = "size mismatch: the peer, as rank " + rank + ", says the job has " + std::to_string(h.size) +
              " ranks, rank " + std::to_string(options.rank) + " says " + size;
    return Verdict::size_mismatch;
  }
  if (h.word < first_expected() || h.word >= end_expected()) {
    problem = "rank out of range: the peer claims rank " + rank + ", the ranks that connect " +
              (options.rank == 0 ? "are " : "to rank " + std::to_string(options.rank) + " are ") +
              std::to_string(first_expected()) + ".." + std::to_string(end_expected() - 1);
    return Verdict::rank_out_of_range;
  }
  if (joined().contains(h.word)) return Verdict::duplicate_rank;
  return Verdict::accepted;
}

// ---- what a timeout or a failure says -----------------------------------

// Names the first missing ranks only: the loop stops there, so a timeout in
// a huge job costs no more than in a small one.
std::string TcpBootstrap::Impl::joins_missing() const {
  Listing ranks;
  const std::size_t missing = end_expected() - first_expected() - joined().size();
  for (std::uint32_t r = first_expected(); r < end_expected() && !ranks.full(); ++r)
    if (!joined().contains(r)) ranks.add(std::to_string(r));
  ranks.add_unnamed(missing - std::min<std::size_t>(missing, kMaxListed));
  Listing silent;
  for (const JoinerPtr& j : pending)
    if (!j->answered) silent.add(j->address);
  std::string text = "listening on " + where + ", waiting for rank(s) " + ranks.text() + " to join";
  if (!silent.empty()) text += "; no hello from peer(s) " + silent.text();
  if (!refusals.empty()) text += "; refused " + refusals.text();
  if (shortage) text += "; accepting a connection: " + shortage->message();
  return text;
}

// A rank's error goes to every rank that joined it (rank 0: the job; a
// parent: its children), in place of the frame they wait for, and, without
// the reason, to every connection whose hello was not checked yet: any of
// them may be a rank, and none should wait out its timeout for a rank that is
// gone. A rank with a table half-sent to it cannot be told; it sees the
// connection close.
void TcpBootstrap::Impl::tell_failure(const std::string& message) {
  const std::string reason = message.starts_with(prefix()) ? message.substr(prefix().size()) : message;
  const Blob notice = failure_notice(reason);
  for (auto& [rank, m] : joined())
    if (!m.sending) last_word(m.socket, notice);
  const Blob answer = failure_answer(options.size);
  for (const JoinerPtr& j : pending)
    if (!j->answered) last_word(j->socket, answer);
}

}  // namespace ami::bootstrap
