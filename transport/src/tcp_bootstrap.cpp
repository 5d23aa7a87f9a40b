// tcp_bootstrap.cpp — the TCP bootstrap on Boost.Asio, every wait bounded.
#include "tcp_bootstrap.hpp"

#include <charconv>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>  // before Asio: 1.74 uses std::exchange without it

#include <boost/asio.hpp>

#include "ami/error.hpp"

namespace ami::boot {

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using boost::system::error_code;

namespace {

constexpr std::uint32_t kMagic = 0x544F4241;  // "ABOT"
constexpr std::uint32_t kVersion = 1;

struct Hello {
  std::uint32_t magic;
  std::uint32_t version;
  std::uint32_t rank;
  std::uint32_t size;
};

constexpr auto kRetry = std::chrono::milliseconds(50);

std::string peer_name(const tcp::socket& s) {
  error_code ec;
  const auto ep = s.remote_endpoint(ec);
  return ec ? std::string("a peer") : ep.address().to_string() + ":" + std::to_string(ep.port());
}

}  // namespace

struct TcpBootstrap::Impl {
  Options options;
  asio::io_context io;
  std::optional<tcp::acceptor> acceptor;
  // rank 0: the socket of every other rank, by rank; others: [0] is rank 0.
  std::vector<std::optional<tcp::socket>> peers;
  std::vector<std::string> names;  // by rank, for messages
  Clock::time_point deadline;

  // Runs the asynchronous operation start() begins on io_object until it
  // completes or the deadline passes; throws naming what and who.
  template <typename IoObject, typename Start>
  void wait(IoObject& io_object, Start start, const std::string& what) {
    std::optional<error_code> result;
    start([&](error_code ec, auto&&...) { result = ec; });
    io.restart();
    while (!result && Clock::now() < deadline) io.run_one_until(deadline);
    if (!result) {
      error_code ignored;
      io_object.cancel(ignored);
      io.restart();
      io.run();  // the cancelled handler runs before its state goes away
      throw Error("bootstrap: " + what + ": timed out after " + std::to_string(options.timeout.count()) + " ms");
    }
    if (*result) throw Error("bootstrap: " + what + ": " + result->message());
  }

  void read(tcp::socket& s, void* p, std::size_t n, const std::string& what) {
    wait(s, [&](auto h) { asio::async_read(s, asio::buffer(p, n), h); }, what);
  }
  void write(tcp::socket& s, const void* p, std::size_t n, const std::string& what) {
    wait(s, [&](auto h) { asio::async_write(s, asio::buffer(p, n), h); }, what);
  }

  void listen();
  void accept_one(std::uint32_t still_missing);
  void connect_to_root();
  std::vector<Blob> gather_at_root(std::vector<Blob> all);
  void send_blob(tcp::socket& s, std::span<const std::byte> blob, const std::string& what);
  Blob receive_blob(tcp::socket& s, const std::string& what);
};

void TcpBootstrap::Impl::listen() {
  error_code ec;
  const auto address = options.host.empty() ? asio::ip::address(asio::ip::address_v4::any())
                                            : asio::ip::make_address(options.host, ec);
  const std::string where = options.host + ":" + std::to_string(options.port);
  if (ec) throw Error("bootstrap: rank 0 cannot listen on " + where + ": " + ec.message());
  acceptor.emplace(io);
  acceptor->open(address.is_v6() ? tcp::v6() : tcp::v4());
  acceptor->set_option(tcp::acceptor::reuse_address(true));
  acceptor->bind({address, options.port}, ec);
  if (ec) throw Error("bootstrap: rank 0 cannot listen on " + where + ": " + ec.message());
  acceptor->listen();
  peers.resize(options.size);
  names.assign(options.size, "");
  for (std::uint32_t missing = options.size - 1; missing > 0; --missing) accept_one(missing);
}

// Accepts one peer, checks its hello and puts it in its rank's slot.
void TcpBootstrap::Impl::accept_one(std::uint32_t still_missing) {
  tcp::socket s(io);
  wait(*acceptor, [&](auto h) { acceptor->async_accept(s, h); },
       "rank 0 on port " + std::to_string(acceptor->local_endpoint().port()) + " waiting for " +
           std::to_string(still_missing) + " more task(s)");
  s.set_option(tcp::no_delay(true));
  const std::string who = peer_name(s);
  Hello h{};
  read(s, &h, sizeof h, "reading the hello of " + who);
  if (h.magic != kMagic || h.version != kVersion)
    throw Error("bootstrap: " + who + " is not an ami bootstrap peer of this version");
  if (h.size != options.size)
    throw Error("bootstrap: " + who + " says the job has " + std::to_string(h.size) + " tasks, rank 0 says " +
                std::to_string(options.size));
  if (h.rank == 0 || h.rank >= options.size)
    throw Error("bootstrap: " + who + " claims rank " + std::to_string(h.rank) + ", out of range");
  if (peers[h.rank])
    throw Error("bootstrap: " + who + " claims rank " + std::to_string(h.rank) + ", which " +
                names[h.rank] + " already has");
  const Hello ack{kMagic, kVersion, 0, options.size};
  write(s, &ack, sizeof ack, "answering " + who);
  names[h.rank] = "rank " + std::to_string(h.rank) + " at " + who;
  peers[h.rank].emplace(std::move(s));
}

void TcpBootstrap::Impl::connect_to_root() {
  const std::string where = options.host + ":" + std::to_string(options.port);
  names = {"rank 0 at " + where};
  tcp::resolver resolver(io);
  error_code ec;
  const auto endpoints = resolver.resolve(options.host, std::to_string(options.port), ec);
  if (ec) throw Error("bootstrap: cannot resolve rank 0's address " + where + ": " + ec.message());
  tcp::socket s(io);
  for (;;) {  // rank 0 may not be listening yet
    error_code err;
    asio::connect(s, endpoints, err);
    if (!err) break;
    if (Clock::now() + kRetry >= deadline)
      throw Error("bootstrap: rank " + std::to_string(options.rank) + " cannot reach rank 0 at " + where +
                  " within " + std::to_string(options.timeout.count()) + " ms: " + err.message());
    std::this_thread::sleep_for(kRetry);
  }
  s.set_option(tcp::no_delay(true));
  peers.resize(1);
  peers[0].emplace(std::move(s));
  const Hello h{kMagic, kVersion, options.rank, options.size};
  write(*peers[0], &h, sizeof h, "sending the hello to " + names[0]);
  Hello ack{};
  read(*peers[0], &ack, sizeof ack, "waiting for " + names[0] + " to answer");
  if (ack.magic != kMagic || ack.version != kVersion || ack.size != options.size)
    throw Error("bootstrap: " + names[0] + " answered with a bad hello (another job size or version?)");
}

void TcpBootstrap::Impl::send_blob(tcp::socket& s, std::span<const std::byte> blob, const std::string& what) {
  const auto n = static_cast<std::uint32_t>(blob.size());
  write(s, &n, sizeof n, what);
  if (n != 0) write(s, blob.data(), n, what);
}

Blob TcpBootstrap::Impl::receive_blob(tcp::socket& s, const std::string& what) {
  std::uint32_t n = 0;
  read(s, &n, sizeof n, what);
  if (n > kMaxBlobBytes)
    throw Error("bootstrap: " + what + ": a frame of " + std::to_string(n) + " bytes exceeds 64 KiB");
  Blob b(n);
  if (n != 0) read(s, b.data(), n, what);
  return b;
}

std::vector<Blob> TcpBootstrap::Impl::gather_at_root(std::vector<Blob> all) {
  const std::uint32_t size = options.size;
  for (std::uint32_t r = 1; r < size; ++r) all[r] = receive_blob(*peers[r], "reading the address of " + names[r]);
  for (std::uint32_t r = 1; r < size; ++r)
    for (const Blob& b : all) send_blob(*peers[r], b, "sending the address table to " + names[r]);
  return all;
}

TcpBootstrap::TcpBootstrap(const Options& options) : impl_(std::make_unique<Impl>()) {
  if (options.size == 0 || options.rank >= options.size)
    throw Error("bootstrap: rank " + std::to_string(options.rank) + " is not below size " +
                std::to_string(options.size));
  impl_->options = options;
  impl_->deadline = Clock::now() + options.timeout;
  if (options.size == 1) return;
  if (options.rank == 0) impl_->listen();
  else impl_->connect_to_root();
}

TcpBootstrap::~TcpBootstrap() = default;

std::uint32_t TcpBootstrap::rank() const { return impl_->options.rank; }
std::uint32_t TcpBootstrap::size() const { return impl_->options.size; }
std::uint16_t TcpBootstrap::port() const {
  error_code ec;
  return impl_->acceptor ? impl_->acceptor->local_endpoint(ec).port() : impl_->options.port;
}

std::vector<Blob> TcpBootstrap::allgather(std::span<const std::byte> mine) {
  Impl& m = *impl_;
  if (mine.size() > kMaxBlobBytes) throw Error("bootstrap: this task's address exceeds 64 KiB");
  m.deadline = Clock::now() + m.options.timeout;
  std::vector<Blob> all(m.options.size);
  all[m.options.rank].assign(mine.begin(), mine.end());
  if (m.options.size == 1) return all;
  if (m.options.rank == 0) return m.gather_at_root(std::move(all));
  m.send_blob(*m.peers[0], mine, "sending this task's address to " + m.names[0]);
  for (std::uint32_t r = 0; r < m.options.size; ++r)
    all[r] = m.receive_blob(*m.peers[0], "reading the address table from " + m.names[0]);
  return all;
}

bool parse_address(std::string_view text, std::string& host, std::uint16_t& port) {
  std::string_view h, p;
  if (text.starts_with('[')) {
    const auto close = text.find("]:");
    if (close == std::string_view::npos) return false;
    h = text.substr(1, close - 1);
    p = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos || text.find(':') != colon) return false;
    h = text.substr(0, colon);
    p = text.substr(colon + 1);
  }
  unsigned v = 0;
  auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), v);
  if (h.empty() || p.empty() || ec != std::errc{} || end != p.data() + p.size() || v == 0 || v > 65535)
    return false;
  host.assign(h);
  port = static_cast<std::uint16_t>(v);
  return true;
}

}  // namespace ami::boot
