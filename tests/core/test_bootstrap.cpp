// The TCP bootstrap on loopback: jobs whose ranks are threads and jobs whose
// ranks are processes; a rank 0 that starts late, never, or fails; fake
// peers, raw Asio sockets speaking the wire format by hand, that break each
// rule of the handshake and the framing; and what strangers can cost rank 0:
// floods, silent connections, second claims of a rank, a descriptor limit.
// Then the tree the tables go down: the table at sizes that are not powers
// of two, the bytes each rank sends, a parent's checks of its children's
// hellos (children played by hand), a parent that never answers, a bad
// parent address, and a rank killed during an allgather.
// Ranks run off the main thread; only the main thread asserts (a forked rank
// 0 reports in words through a pipe).
#include <doctest/doctest.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <utility>  // before Asio: 1.74 uses std::exchange without it

#include <boost/asio.hpp>

#include "ami/error.hpp"
#include "bootstrap.hpp"
#include "ports.hpp"

using namespace std::chrono_literals;
using ami::bootstrap::Blob;
using ami::bootstrap::kMaxBlobBytes;
using ami::bootstrap::kMaxPendingConnections;
using ami::bootstrap::kSpareDescriptors;
using ami::bootstrap::Options;
using ami::bootstrap::Table;
using ami::bootstrap::TcpBootstrap;
using ami::bootstrap::kTreeFanOut;
namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

// The wire format, written out independently of the implementation so that
// a change to it shows here.
constexpr std::uint32_t kMagic = 0x42494d41;
constexpr std::uint32_t kVersion = 4;
constexpr std::uint32_t kFailureMark = 0xffffffff;
enum Verdict : std::uint32_t {
  accepted, bad_magic, bad_version, size_mismatch, rank_out_of_range, duplicate_rank, wrong_key, listener_failed, busy
};
const std::string kKey = "test job key";

using test::free_port;

Options options(std::uint32_t rank, std::uint32_t size, std::uint16_t port,
                std::chrono::milliseconds timeout = 5000ms) {
  return {.rank = rank, .size = size, .host = "127.0.0.1", .port = port, .timeout = timeout, .key = kKey,
          .log = [](const std::string&) {}};
}

// Rank 0's log lines, gathered from whichever thread runs it.
struct Log {
  std::mutex mutex;
  std::vector<std::string> lines;
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& line) {
      std::lock_guard lock(mutex);
      lines.push_back(line);
    };
  }
  std::string all() {
    std::lock_guard lock(mutex);
    std::string text;
    for (const auto& l : lines) text += l + "\n";
    return text;
  }
  std::size_t count() {
    std::lock_guard lock(mutex);
    return lines.size();
  }
  // The connections the log says were refused: one per "refused peer" line,
  // N per "refused N more connection(s)" line.
  std::size_t refused() {
    std::lock_guard lock(mutex);
    std::size_t n = 0;
    for (const auto& l : lines) {
      const std::size_t more = l.find(": refused ");
      if (l.find("refused peer ") != std::string::npos) ++n;
      else if (more != std::string::npos && l.find(" more connection(s)") != std::string::npos)
        n += std::stoul(l.substr(more + 10));
    }
    return n;
  }
};

std::size_t open_fds() {
  std::size_t n = 0;
  for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

Blob pattern(std::size_t n, std::uint32_t seed) {
  Blob b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>(seed * 31 + i * 7 + (i >> 8));
  return b;
}

// Blob sizes that differ by rank and by round: empty, 60 KiB, one byte, odd, the limit.
std::size_t mixed(std::uint32_t rank, int round) {
  constexpr std::size_t kSizes[] = {0, 60 * 1024, 1, 777, kMaxBlobBytes};
  return kSizes[(rank + static_cast<std::uint32_t>(round)) % 5] + (rank % 2);
}

Blob blob_of(std::uint32_t rank, int round) {
  return pattern(std::min(mixed(rank, round), kMaxBlobBytes), rank * 100 + static_cast<std::uint32_t>(round));
}

// "" when body returns, else the text of what it threw.
std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const ami::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not an ami::Error: ") + e.what();
  }
  return "";
}

std::future<std::string> in_thread(std::function<void()> body) {
  return std::async(std::launch::async, [body = std::move(body)] { return error_of(body); });
}

bool nodelay(int fd) {
  int on = 0;
  socklen_t length = sizeof on;
  return ::getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, &length) == 0 && on != 0;
}

// What one rank saw: every allgather's table, its sockets, or its error.
struct Outcome {
  std::vector<std::vector<Blob>> rounds;
  std::size_t sockets = 0;
  bool all_nodelay = true;
  std::string error;
};

Outcome run_rank(const Options& o, int rounds) {
  Outcome out;
  out.error = error_of([&] {
    TcpBootstrap boot(o);
    for (int fd : boot.sockets()) out.all_nodelay = out.all_nodelay && nodelay(fd);
    out.sockets = boot.sockets().size();
    for (int i = 0; i < rounds; ++i) {
      out.rounds.push_back(boot.allgather(blob_of(o.rank, i)));
      if (i == 0) boot.barrier();
    }
    boot.barrier();
  });
  return out;
}

// One job of threads; rank 0 starts `late` after the others.
std::vector<Outcome> run_job(std::uint32_t size, int rounds, std::chrono::milliseconds late = 0ms) {
  const std::uint16_t port = free_port();
  std::vector<std::future<Outcome>> ranks(size);
  for (std::uint32_t r = size; r-- > 1;)
    ranks[r] = std::async(std::launch::async, run_rank, options(r, size, port), rounds);
  std::this_thread::sleep_for(late);
  ranks[0] = std::async(std::launch::async, run_rank, options(0, size, port), rounds);
  std::vector<Outcome> outcomes;
  for (auto& f : ranks) outcomes.push_back(f.get());
  return outcomes;
}

void check_job(const std::vector<Outcome>& outcomes, int rounds) {
  const auto size = static_cast<std::uint32_t>(outcomes.size());
  for (std::uint32_t r = 0; r < size; ++r) {
    CAPTURE(r);
    const Outcome& o = outcomes[r];
    REQUIRE(o.error == "");
    CHECK(o.sockets == (r == 0 ? size - 1 : 1));
    CHECK(o.all_nodelay);
    REQUIRE(o.rounds.size() == static_cast<std::size_t>(rounds));
    for (int i = 0; i < rounds; ++i) {
      REQUIRE(o.rounds[i].size() == size);
      for (std::uint32_t from = 0; from < size; ++from) CHECK(o.rounds[i][from] == blob_of(from, i));
    }
  }
}

void put_words(tcp::socket& s, std::initializer_list<std::uint32_t> words) {
  std::vector<std::uint8_t> bytes;
  for (std::uint32_t w : words)
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<std::uint8_t>(w >> (8 * i)));
  asio::write(s, asio::buffer(bytes));
}

std::vector<std::uint32_t> get_words(tcp::socket& s, std::size_t n) {
  std::vector<std::uint8_t> bytes(4 * n);
  asio::read(s, asio::buffer(bytes));
  std::vector<std::uint32_t> words(n);
  for (std::size_t w = 0; w < n; ++w)
    for (int i = 0; i < 4; ++i) words[w] |= std::uint32_t{bytes[4 * w + i]} << (8 * i);
  return words;
}

// A raw connection to a rank 0 that may still be starting.
struct FakePeer {
  explicit FakePeer(std::uint16_t port) {
    const tcp::endpoint root(asio::ip::make_address("127.0.0.1"), port);
    const auto give_up = Clock::now() + 3s;
    boost::system::error_code ec;
    while (socket.connect(root, ec), ec && Clock::now() < give_up) {
      socket.close(ec);
      std::this_thread::sleep_for(10ms);
    }
    REQUIRE_FALSE(ec);
  }
  void hello(std::uint32_t rank, std::uint32_t size, std::uint32_t magic = kMagic, std::uint32_t version = kVersion,
             const std::string& key = kKey) {
    std::vector<std::uint8_t> bytes;
    for (std::uint32_t w : {magic, version, rank, size, static_cast<std::uint32_t>(key.size())})
      for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<std::uint8_t>(w >> (8 * i)));
    bytes.insert(bytes.end(), key.begin(), key.end());
    asio::write(socket, asio::buffer(bytes));  // one write: rank 0 may refuse after 16 bytes
  }
  std::uint32_t verdict() {
    const auto answer = get_words(socket, 4);
    CHECK(answer[0] == kMagic);
    return answer[2];
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(socket.local_endpoint().port()); }

  asio::io_context io;
  tcp::socket socket{io};
};

// A rank 0 of size 2 in a thread, and a fake rank that says `hello` to it.
// Returns rank 0's error.
std::string refused(std::uint32_t rank, std::uint32_t size, std::uint32_t magic, std::uint32_t version,
                    std::uint32_t expected_verdict, std::string& fake_address) {
  const std::uint16_t port = free_port();
  auto root = in_thread([&] { TcpBootstrap boot(options(0, 2, port, 500ms)); });
  FakePeer fake(port);
  fake_address = fake.address();
  fake.hello(rank, size, magic, version);
  CHECK(fake.verdict() == expected_verdict);
  return root.get();
}

// True when `s` has something to read (or is closed) within `limit`; the
// limit only keeps a regression from hanging the test.
bool readable_within(tcp::socket& s, std::chrono::milliseconds limit) {
  pollfd p{s.native_handle(), POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(limit.count())) == 1;
}

// True when the peer closes `s` (end of stream or reset) within `limit`,
// whatever it sends first.
bool closed_within(tcp::socket& s, std::chrono::milliseconds limit) {
  for (const auto give_up = Clock::now() + limit; Clock::now() < give_up;) {
    if (!readable_within(s, std::chrono::duration_cast<std::chrono::milliseconds>(give_up - Clock::now()))) break;
    std::array<char, 256> bytes;
    const ssize_t n = ::recv(s.native_handle(), bytes.data(), bytes.size(), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
  }
  return false;
}

// Heap bytes in use, every arena.
std::size_t heap_in_use() {
  const struct mallinfo2 m = ::mallinfo2();
  return m.uordblks + m.hblkhd;
}

// The port of the one listening socket of this process, once it exists.
std::uint16_t listening_port() {
  for (const auto give_up = Clock::now() + 3s; Clock::now() < give_up; std::this_thread::sleep_for(10ms)) {
    for (auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
      const int fd = std::stoi(e.path().filename().string());
      int listening = 0;
      socklen_t length = sizeof listening;
      sockaddr_in address{};
      socklen_t address_length = sizeof address;
      if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &length) == 0 && listening &&
          ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &address_length) == 0)
        return ntohs(address.sin_port);
    }
  }
  return 0;
}

}  // namespace

TEST_CASE("parse_address") {
  std::string host = "unchanged";
  std::uint16_t port = 7;
  CHECK(ami::bootstrap::parse_address("127.0.0.1:7000", host, port));
  CHECK((host == "127.0.0.1" && port == 7000));
  CHECK(ami::bootstrap::parse_address("node-12.cluster:65535", host, port));
  CHECK((host == "node-12.cluster" && port == 65535));
  CHECK(ami::bootstrap::parse_address("[::1]:1", host, port));
  CHECK((host == "::1" && port == 1));
  CHECK(ami::bootstrap::parse_address("[fe80::1%eth0]:80", host, port));
  CHECK(host == "fe80::1%eth0");
  for (const char* bad : {"", "host", "host:", ":80", "host:0", "host:65536", "host:99999999999", "host:-1",
                          "host:+80", "host:80x", "host:8 0", "::1:80", "[::1]", "[::1]80", "[]:80", "[::1:80",
                          "a:b:80", " host:80", "host :80"}) {
    CAPTURE(bad);
    host = "unchanged";
    port = 7;
    CHECK_FALSE(ami::bootstrap::parse_address(bad, host, port));
    CHECK((host == "unchanged" && port == 7));
  }
}

TEST_CASE("a job of one opens no socket") {
  const std::size_t fds = open_fds();
  {
    TcpBootstrap boot({.rank = 0, .size = 1, .port = 4321});
    CHECK(open_fds() == fds);
    CHECK(boot.rank() == 0);
    CHECK(boot.size() == 1);
    CHECK(boot.port() == 4321);
    CHECK(boot.sockets().empty());
    const Blob mine = pattern(100, 1);
    const auto all = boot.allgather(mine);
    REQUIRE(all.size() == 1);
    CHECK(all[0] == mine);
    CHECK(boot.allgather({}) == std::vector<Blob>{Blob{}});
    boot.barrier();
    CHECK(contains(error_of([&] { (void)boot.allgather(pattern(kMaxBlobBytes + 1, 0)); }), "exceeds the limit"));
  }
  CHECK(open_fds() == fds);
}

TEST_CASE("impossible options are refused") {
  CHECK(contains(error_of([] { TcpBootstrap b({.rank = 0, .size = 0}); }), "size must be at least 1"));
  CHECK(contains(error_of([] { TcpBootstrap b({.rank = 3, .size = 3}); }), "rank 3: the rank is not below"));
  CHECK(contains(error_of([] { TcpBootstrap b({.rank = 1, .size = 2, .host = "", .port = 9}); }),
                 "no address to reach rank 0"));
  CHECK(contains(error_of([] { TcpBootstrap b({.rank = 1, .size = 2, .host = "127.0.0.1", .port = 0}); }),
                 "no address to reach rank 0"));
}

TEST_CASE("jobs of threads exchange blobs of every size, round after round") {
  for (std::uint32_t size : {2u, 4u, 5u}) {
    CAPTURE(size);
    check_job(run_job(size, 3), 3);
  }
}

TEST_CASE("the others wait for a rank 0 that starts late") { check_job(run_job(4, 1, 300ms), 1); }

TEST_CASE("a rank 0 that never appears times out, naming its address") {
  const std::uint16_t port = free_port();
  const auto start = Clock::now();
  const std::string error = error_of([&] { TcpBootstrap b(options(2, 4, port, 300ms)); });
  const auto elapsed = Clock::now() - start;
  CHECK(elapsed >= 300ms);
  CHECK(elapsed < 2s);
  CHECK(contains(error, "bootstrap: rank 2: timed out after 300 ms"));
  CHECK(contains(error, "rank 0 at 127.0.0.1:" + std::to_string(port)));
  CHECK(contains(error, "Connection refused"));
}

TEST_CASE("rank 0 on port 0 reports the port it chose") {
  std::uint16_t reported = 0;
  auto root = in_thread([&] {
    TcpBootstrap boot({.rank = 0, .size = 2, .host = "127.0.0.1", .port = 0, .timeout = 5000ms, .key = kKey});
    reported = boot.port();
    boot.barrier();
  });
  const std::uint16_t port = listening_port();
  REQUIRE(port != 0);
  CHECK(error_of([&] {
          TcpBootstrap boot(options(1, 2, port));
          boot.barrier();
        }) == "");
  CHECK(root.get() == "");
  CHECK(reported == port);
}

TEST_CASE("rank 0 refuses a bad hello, naming the problem and the peer") {
  // A stranger (not ami, another version) is refused and waited past: the
  // timeout names it.
  std::string peer;
  std::string error = refused(1, 2, 0xdeadbeef, kVersion, bad_magic, peer);
  CHECK(contains(error, "timed out after 500 ms"));
  CHECK(contains(error, "refused peer " + peer + ": bad magic 0xdeadbeef"));

  error = refused(1, 2, kMagic, 9, bad_version, peer);
  CHECK(contains(error, "refused peer " + peer + ": bad version 9"));

  // A member of the job (it has the key) that disagrees about the job
  // fails it at once.

  error = refused(1, 7, kMagic, kVersion, size_mismatch, peer);
  CHECK(contains(error, "size mismatch"));
  CHECK(contains(error, "has 7 ranks"));
  CHECK(contains(error, "peer " + peer));

  for (std::uint32_t rank : {0u, 2u, 5u}) {
    error = refused(rank, 2, kMagic, kVersion, rank_out_of_range, peer);
    CHECK(contains(error, "rank out of range: the peer claims rank " + std::to_string(rank)));
    CHECK(contains(error, "peer " + peer));
  }
}

TEST_CASE("a second claim of a taken rank is refused at once; the first keeps it and the job forms") {
  const std::uint16_t port = free_port();
  Log log;
  auto root = in_thread([&] {
    Options o = options(0, 3, port, 20000ms);
    o.log = log.sink();
    TcpBootstrap boot(o);
    (void)boot.allgather(std::as_bytes(std::span("zero", 4)));
  });
  FakePeer first(port);
  first.hello(1, 3);
  CHECK(first.verdict() == accepted);

  // A real rank claiming it next fails at once (well before its own
  // timeout), saying why.
  const auto start = Clock::now();
  const std::string error = error_of([&] { TcpBootstrap boot(options(1, 3, port, 30000ms)); });
  CHECK(Clock::now() - start < 15s);
  CHECK(contains(error, "bootstrap: rank 1: refused by rank 0: duplicate rank: "
                        "another peer has already taken this rank"));
  FakePeer second(port);
  second.hello(1, 3);
  CHECK(second.verdict() == duplicate_rank);

  // The first claimant still holds rank 1: the job forms with it.
  auto rank2 = in_thread([&] {
    TcpBootstrap boot(options(2, 3, port));
    (void)boot.allgather(std::as_bytes(std::span("two!", 4)));
  });
  put_words(first.socket, {4});
  asio::write(first.socket, asio::buffer("one!", 4));
  CHECK(get_words(first.socket, 4) == std::vector<std::uint32_t>{3, 4, 4, 4});
  std::string blobs(12, '\0');
  asio::read(first.socket, asio::buffer(blobs));
  CHECK(blobs == "zeroone!two!");
  CHECK(rank2.get() == "");
  CHECK(root.get() == "");
  const std::string lines = log.all();
  CHECK(contains(lines, "bootstrap: rank 0: refused a second claim of rank 1: peer " + second.address() +
                            " claims it, already taken by rank 1 at " + first.address()));
}

TEST_CASE("only peers presenting the job's key join; others are refused with a log line") {
  const std::uint16_t port = free_port();
  Log log;
  std::vector<Blob> table;
  auto root = in_thread([&] {
    Options o = options(0, 2, port);
    o.log = log.sink();
    TcpBootstrap boot(o);
    table = boot.allgather(std::as_bytes(std::span("zero", 4)));
  });
  std::string stranger, keyless, hangup;
  {
    FakePeer wrong(port);
    stranger = wrong.address();
    wrong.hello(1, 2, kMagic, kVersion, "another job's key");
    CHECK(wrong.verdict() == wrong_key);
  }
  {
    FakePeer none(port);
    keyless = none.address();
    none.hello(1, 2, kMagic, kVersion, "");
    CHECK(none.verdict() == wrong_key);
  }
  {
    FakePeer scanner(port);  // connects and hangs up
    hangup = scanner.address();
  }
  // A real rank with another key is told why.
  Options other = options(1, 2, port);
  other.key = "not " + kKey;
  CHECK(contains(error_of([&] { TcpBootstrap boot(other); }), "refused by rank 0: wrong job key"));
  // The job itself goes on.
  std::vector<Blob> mine;
  CHECK(error_of([&] {
          TcpBootstrap boot(options(1, 2, port));
          mine = boot.allgather(std::as_bytes(std::span("one!", 4)));
        }) == "");
  CHECK(root.get() == "");
  REQUIRE(table.size() == 2);
  CHECK(table == mine);
  const std::string lines = log.all();
  CHECK(contains(lines, "bootstrap: rank 0: refused peer " + stranger + ": wrong job key"));
  CHECK(contains(lines, "refused peer " + keyless + ": wrong job key"));
  CHECK(contains(lines, "refused peer " + hangup + ": closed the connection before its hello"));
  // An oversize key is refused before anything is sent.
  Options huge = options(1, 2, port);
  huge.key.assign(ami::bootstrap::kMaxKeyBytes + 1, 'k');
  CHECK(contains(error_of([&] { TcpBootstrap boot(huge); }), "more than the 256 allowed (AMI_JOB_KEY)"));
}

TEST_CASE("a real rank refused by rank 0 says why") {
  const std::uint16_t port = free_port();
  auto root = in_thread([&] { TcpBootstrap boot(options(0, 2, port)); });
  const std::string error = error_of([&] { TcpBootstrap boot(options(1, 3, port)); });
  CHECK(contains(error, "refused by rank 0: size mismatch"));
  CHECK(contains(error, "rank 0 at 127.0.0.1:" + std::to_string(port)));
  CHECK(contains(root.get(), "size mismatch"));
}

TEST_CASE("a peer that connects and says nothing cannot hold rank 0 past its timeout") {
  const std::uint16_t port = free_port();
  const auto start = Clock::now();
  auto root = in_thread([&] { TcpBootstrap boot(options(0, 3, port, 300ms)); });
  FakePeer silent(port);
  const std::string error = root.get();
  CHECK(Clock::now() - start >= 300ms);
  CHECK(Clock::now() - start < 3s);
  CHECK(contains(error, "bootstrap: rank 0: timed out after 300 ms"));
  CHECK(contains(error, "waiting for rank(s) 1, 2 to join"));
  CHECK(contains(error, "no hello from peer(s) " + silent.address()));
  // It might have been a rank about to say hello: it is told rank 0 failed
  // (without the reason: it had not shown the key).
  CHECK(silent.verdict() == listener_failed);
  CHECK(get_words(silent.socket, 1) == std::vector<std::uint32_t>{0});
}

TEST_CASE("rank 0 names the peer behind a bad frame, a silence or a hang-up") {
  const std::uint16_t port = free_port();
  std::string after;
  auto root = in_thread([&] {
    TcpBootstrap boot(options(0, 2, port, 300ms));
    try {
      boot.barrier();
    } catch (const ami::Error&) {
      after = error_of([&] { boot.barrier(); });
      throw;
    }
  });

  SUBCASE("an oversize length") {
    FakePeer fake(port);
    fake.hello(1, 2);
    CHECK(fake.verdict() == accepted);
    put_words(fake.socket, {kMaxBlobBytes + 1});
    const std::string error = root.get();
    CHECK(contains(error, "malformed frame: a blob length of 65537 bytes exceeds the limit of 65536"));
    CHECK(contains(error, "rank 1 at " + fake.address()));
    CHECK(contains(after, "unusable after an earlier failure"));
  }
  SUBCASE("a silence") {
    FakePeer fake(port);
    fake.hello(1, 2);
    CHECK(fake.verdict() == accepted);
    put_words(fake.socket, {100});  // then not the 100 bytes
    const std::string error = root.get();
    CHECK(contains(error, "timed out after 300 ms (rank 1 at " + fake.address() + ", sending its blob)"));
  }
  SUBCASE("a hang-up") {
    std::string address;
    {
      FakePeer fake(port);
      fake.hello(1, 2);
      CHECK(fake.verdict() == accepted);
      put_words(fake.socket, {100, 0});  // 4 of the 100 bytes
      address = fake.address();
    }
    const std::string error = root.get();
    CHECK(contains(error, "peer closed the connection (rank 1 at " + address + ", sending its blob)"));
  }
}

TEST_CASE("a rank names rank 0 behind a bad table, a silence or a hang-up") {
  asio::io_context io;
  tcp::acceptor acceptor(io, {asio::ip::make_address("127.0.0.1"), 0});
  const std::uint16_t port = acceptor.local_endpoint().port();
  const std::string root = "rank 0 at 127.0.0.1:" + std::to_string(port);
  auto other = in_thread([&] {
    TcpBootstrap boot(options(1, 2, port, 300ms));
    (void)boot.allgather(pattern(5, 1));
  });
  tcp::socket s = acceptor.accept();
  CHECK(get_words(s, 5) == std::vector<std::uint32_t>{kMagic, kVersion, 1, 2, std::uint32_t(kKey.size())});
  std::string key(kKey.size(), '\0');
  asio::read(s, asio::buffer(key));
  CHECK(key == kKey);
  put_words(s, {kMagic, kVersion, accepted, 2});
  CHECK(get_words(s, 1)[0] == 5);
  std::array<std::byte, 5> blob;
  asio::read(s, asio::buffer(blob));

  SUBCASE("a wrong count") {
    put_words(s, {3});
    CHECK(contains(other.get(), "malformed table: 3 entries for a job of 2 (" + root + ", reading the blob table)"));
  }
  SUBCASE("an oversize entry") {
    put_words(s, {2, 70000});
    CHECK(contains(other.get(), "malformed table: a blob length of 70000 bytes exceeds the limit of 65536"));
  }
  SUBCASE("a silence") {
    put_words(s, {2, 0});
    CHECK(contains(other.get(), "timed out after 300 ms (" + root + ", reading the blob table)"));
  }
  SUBCASE("a truncated table") {
    put_words(s, {2, 0, 10, 0});
    s.close();
    CHECK(contains(other.get(), "peer closed the connection (" + root + ", reading the blob table)"));
  }
  SUBCASE("rank 0's failure, with its reason") {
    put_words(s, {kFailureMark, 5});
    asio::write(s, asio::buffer("oops\n", 5));  // printed, not obeyed: a newline becomes '?'
    s.close();
    CHECK(contains(other.get(), "bootstrap: rank 1: rank 0 failed: oops? (" + root + ", reading the blob table)"));
  }
  SUBCASE("an oversize failure reason") {
    put_words(s, {kFailureMark, 5000});
    CHECK(contains(other.get(), "malformed failure notice: a reason of 5000 bytes exceeds the limit of 1024"));
  }
}

TEST_CASE("a rank answered busy connects again; one whose connection just closes fails at once") {
  asio::io_context io;
  tcp::acceptor acceptor(io, {asio::ip::make_address("127.0.0.1"), 0});
  const std::uint16_t port = acceptor.local_endpoint().port();
  auto take_hello = [&](tcp::socket& s) {
    CHECK(get_words(s, 5) == std::vector<std::uint32_t>{kMagic, kVersion, 1, 2, std::uint32_t(kKey.size())});
    std::string key(kKey.size(), '\0');
    asio::read(s, asio::buffer(key));
  };

  SUBCASE("busy") {
    std::vector<Blob> table;
    auto other = in_thread([&] {
      TcpBootstrap boot(options(1, 2, port, 20000ms));
      table = boot.allgather(pattern(3, 1));
    });
    {
      tcp::socket dropped = acceptor.accept();
      take_hello(dropped);
      put_words(dropped, {kMagic, kVersion, busy, 2});
    }
    tcp::socket s = acceptor.accept();
    take_hello(s);
    put_words(s, {kMagic, kVersion, accepted, 2});
    CHECK(get_words(s, 1)[0] == 3);
    std::array<std::byte, 3> blob;
    asio::read(s, asio::buffer(blob));
    put_words(s, {2, 0, 3});
    asio::write(s, asio::buffer(blob));
    CHECK(other.get() == "");
    REQUIRE(table.size() == 2);
    CHECK(table[1] == pattern(3, 1));
  }
  SUBCASE("closed") {
    auto other = in_thread([&] { TcpBootstrap boot(options(1, 2, port, 20000ms)); });
    {
      tcp::socket s = acceptor.accept();
      take_hello(s);
    }
    const auto start = Clock::now();
    const std::string error = other.get();
    CHECK(Clock::now() - start < 15s);  // not its 20 s
    CHECK(contains(error, "peer closed the connection (rank 0 at 127.0.0.1:" + std::to_string(port) +
                              ", waiting for the answer to its hello)"));
  }
}

TEST_CASE("a job of processes") {
  constexpr std::uint32_t kSize = 5;
  const std::uint16_t port = free_port();
  std::vector<pid_t> children;
  for (std::uint32_t r = 1; r < kSize; ++r) {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {  // never back into doctest
      const Outcome o = run_rank(options(r, kSize, port), 2);
      bool good = o.error.empty() && o.sockets == 1 && o.rounds.size() == 2;
      for (int i = 0; good && i < 2; ++i)
        for (std::uint32_t from = 0; from < kSize; ++from) good = good && o.rounds[i][from] == blob_of(from, i);
      if (!o.error.empty()) std::fprintf(stderr, "rank %u: %s\n", r, o.error.c_str());
      _exit(good ? 0 : 1);
    }
    children.push_back(pid);
  }
  const Outcome root = run_rank(options(0, kSize, port), 2);
  CHECK(root.error == "");
  CHECK(root.sockets == kSize - 1);
  for (int i = 0; i < 2 && root.error.empty(); ++i)
    for (std::uint32_t from = 0; from < kSize; ++from) CHECK(root.rounds[i][from] == blob_of(from, i));

  const auto give_up = Clock::now() + 10s;
  for (pid_t pid : children) {
    int status = 0;
    pid_t done = 0;
    while ((done = waitpid(pid, &status, WNOHANG)) == 0 && Clock::now() < give_up) std::this_thread::sleep_for(5ms);
    if (done == 0) {
      ::kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
    }
    CHECK(done == pid);
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  }
}

TEST_CASE("no descriptor outlives its bootstrap, in success or failure") {
  const std::size_t before = open_fds();
  check_job(run_job(4, 2), 2);
  CHECK(contains(error_of([] { TcpBootstrap b(options(1, 2, free_port(), 100ms)); }), "timed out"));
  std::string peer;
  CHECK(contains(refused(1, 2, 0, kVersion, bad_magic, peer), "bad magic"));
  {
    const std::uint16_t port = free_port();
    auto root = in_thread([&] { TcpBootstrap boot(options(0, 3, port, 200ms)); });
    FakePeer fake(port);
    fake.hello(2, 3);
    CHECK(fake.verdict() == accepted);
    CHECK(contains(root.get(), "waiting for rank(s) 1 to join"));
  }
  CHECK(open_fds() == before);
}

TEST_CASE("ranks connected to a rank 0 that fails learn its reason at once, not at their timeout") {
  const std::uint16_t port = free_port();
  const std::string root_address = "rank 0 at 127.0.0.1:" + std::to_string(port);

  SUBCASE("rank 0 times out waiting for another rank") {
    auto root = in_thread([&] {
      TcpBootstrap boot(options(0, 3, port, 1000ms));
      boot.barrier();
    });
    const auto start = Clock::now();
    const std::string error = error_of([&] {
      TcpBootstrap boot(options(1, 3, port, 30000ms));
      boot.barrier();
    });
    CHECK(Clock::now() - start < 15s);  // not its 30 s
    CHECK(contains(error, "bootstrap: rank 1: rank 0 failed: timed out after 1000 ms (listening on 127.0.0.1:"));
    CHECK(contains(error, "waiting for rank(s) 2 to join"));
    CHECK(contains(error, "(" + root_address + ", reading the blob table)"));
    CHECK(contains(root.get(), "bootstrap: rank 0: timed out after 1000 ms"));
  }
  SUBCASE("rank 0 fails on another rank's bad frame") {
    auto root = in_thread([&] {
      TcpBootstrap boot(options(0, 3, port, 20000ms));
      boot.barrier();
    });
    auto rank1 = in_thread([&] {
      TcpBootstrap boot(options(1, 3, port, 30000ms));
      boot.barrier();
    });
    FakePeer fake(port);
    fake.hello(2, 3);
    CHECK(fake.verdict() == accepted);
    put_words(fake.socket, {kMaxBlobBytes + 1});
    const std::string error = rank1.get();
    CHECK(contains(error, "bootstrap: rank 1: rank 0 failed: malformed frame: a blob length of 65537 bytes"));
    CHECK(contains(error, "(rank 2 at " + fake.address() + ", sending its blob)"));
    CHECK(contains(root.get(), "malformed frame"));
    // The culprit is told too.
    CHECK(get_words(fake.socket, 1)[0] == kFailureMark);
  }
}

TEST_CASE("a connection that says no hello is closed after its own deadline, and the job goes on") {
  const std::uint16_t port = free_port();
  Log log;
  auto root = in_thread([&] {
    Options o = options(0, 2, port, 20000ms);
    o.hello_timeout = 200ms;
    o.log = log.sink();
    TcpBootstrap boot(o);
    boot.barrier();
  });
  FakePeer silent(port);
  FakePeer slow(port);
  put_words(slow.socket, {kMagic});  // a slowloris: the hello's first word, then nothing for long
  // Dropped long before the job's 20 s, each asked to connect again in
  // case it is a rank; the bound only keeps a regression from hanging.
  for (FakePeer* peer : {&silent, &slow}) {
    REQUIRE(readable_within(peer->socket, 10s));
    CHECK(peer->verdict() == busy);
    CHECK(closed_within(peer->socket, 10s));
  }
  CHECK(error_of([&] {
          TcpBootstrap boot(options(1, 2, port));
          boot.barrier();
        }) == "");
  CHECK(root.get() == "");
  const std::string lines = log.all();
  CHECK(contains(lines, "refused peer " + silent.address() + ": no hello within 200 ms"));
  CHECK(contains(lines, "refused peer " + slow.address() + ": no hello within 200 ms"));
}

// A connection to a rank 0 that may still be starting; closed if none came.
tcp::socket connect_to(asio::io_context& io, std::uint16_t port) {
  const tcp::endpoint root(asio::ip::make_address("127.0.0.1"), port);
  tcp::socket s(io);
  boost::system::error_code ec;
  for (const auto give_up = Clock::now() + 5s; s.connect(root, ec), ec && Clock::now() < give_up;) {
    s.close(ec);
    std::this_thread::sleep_for(5ms);
  }
  return s;
}

// Strangers of every kind, as fast as one thread can make them: some stay
// silent (more than rank 0 keeps waiting), some hang up, some send garbage,
// some a hello with the wrong key. Returns how many connected.
int flood(asio::io_context& io, std::uint16_t port, int connections, std::vector<tcp::socket>& silent) {
  const std::string garbage = "GET / HTTP/1.0\r\nHost: example\r\n\r\n";
  int connected = 0;
  for (int i = 0; i < connections; ++i) {
    tcp::socket s = connect_to(io, port);
    if (!s.is_open()) continue;
    ++connected;
    boost::system::error_code ec;
    switch (i % 4) {
      case 0: silent.push_back(std::move(s)); break;
      case 1: break;
      case 2: asio::write(s, asio::buffer(garbage), ec); break;
      case 3: {
        const std::array<std::uint32_t, 5> hello{kMagic, kVersion, 1, 4, 5};
        asio::write(s, std::array{asio::buffer(hello), asio::buffer("wrong", 5)}, ec);
        break;
      }
    }
  }
  return connected;
}

TEST_CASE("a flood of strangers costs a few log lines and a count, and the job forms") {
  constexpr std::uint32_t kSize = 4;
  constexpr int kFlood = 1600;  // 400 of them silent: more than rank 0 keeps waiting
  static_assert(kFlood / 4 > static_cast<int>(kMaxPendingConnections));
  const std::uint16_t port = free_port();
  const auto start = Clock::now();
  Log log;
  std::vector<Outcome> outcomes(kSize);
  auto root = std::async(std::launch::async, [&] {
    Options o = options(0, kSize, port, 30000ms);
    o.log = log.sink();
    return run_rank(o, 1);
  });
  asio::io_context io;
  std::vector<tcp::socket> silent;
  auto strangers = std::async(std::launch::async, [&] { return flood(io, port, kFlood, silent); });
  // Two ranks join during the flood; the last once it is over, so that
  // every stranger reached rank 0 before the job could form.
  auto rank1 = std::async(std::launch::async, run_rank, options(1, kSize, port, 30000ms), 1);
  auto rank2 = std::async(std::launch::async, run_rank, options(2, kSize, port, 30000ms), 1);
  CHECK(strangers.get() == kFlood);
  auto rank3 = std::async(std::launch::async, run_rank, options(3, kSize, port, 30000ms), 1);
  outcomes = {root.get(), rank1.get(), rank2.get(), rank3.get()};
  check_job(outcomes, 1);
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start).count();
  CAPTURE(log.all());
  // A few lines one by one, then a count at most once a second and one at the end.
  CHECK(log.count() <= 8 + static_cast<std::size_t>(seconds));
  CHECK(log.refused() == static_cast<std::size_t>(kFlood));
  CHECK(contains(log.all(), "more connection(s) (the last: peer 127.0.0.1:"));
  // Rank 0 let go of the silent ones: the oldest as others came, the rest when the job formed.
  for (tcp::socket& s : silent) CHECK(closed_within(s, 10s));
}

TEST_CASE("many ranks at once, more than rank 0 keeps waiting for their hello, all join") {
  constexpr std::uint32_t kSize = 200;
  static_assert(kSize > kMaxPendingConnections);
  const std::uint16_t port = free_port();
  std::vector<std::future<Outcome>> ranks(kSize);
  for (std::uint32_t r = 1; r < kSize; ++r)
    ranks[r] = std::async(std::launch::async, run_rank, options(r, kSize, port, 60000ms), 1);
  ranks[0] = std::async(std::launch::async, run_rank, options(0, kSize, port, 60000ms), 1);
  std::vector<Outcome> outcomes;
  for (auto& f : ranks) outcomes.push_back(f.get());
  check_job(outcomes, 1);
}

// Rank 0 in a child process whose descriptor limit leaves room for about 70
// connections besides its ranks; returns what happened, in words.
std::string starved_root(std::uint16_t port, std::uint32_t size) {
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = open_fds() + kSpareDescriptors + 8;
  if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) return "setrlimit failed";
  Log log;
  Options o = options(0, size, port, 30000ms);
  o.log = log.sink();
  const Outcome outcome = run_rank(o, 1);
  if (!outcome.error.empty()) return outcome.error;
  return contains(log.all(), "Too many open files") ? "formed, out of descriptors on the way"
                                                    : "formed, but accept never ran out of descriptors";
}

TEST_CASE("a rank 0 out of descriptors drops the oldest silent connections, and the job forms") {
  constexpr std::uint32_t kSize = 4;
  constexpr int kSilent = 300;
  const std::uint16_t port = free_port();
  int report[2];
  REQUIRE(::pipe(report) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {  // the lowered limit dies with the child; never back into doctest
    ::close(report[0]);
    const std::string text = starved_root(port, kSize);
    (void)!::write(report[1], text.data(), text.size());
    _exit(0);
  }
  ::close(report[1]);
  asio::io_context io;
  std::vector<tcp::socket> silent;
  for (int i = 0; i < kSilent; ++i) silent.push_back(connect_to(io, port));
  CHECK(std::ranges::all_of(silent, [](const tcp::socket& s) { return s.is_open(); }));
  std::vector<std::future<Outcome>> ranks;
  for (std::uint32_t r = 1; r < kSize; ++r)
    ranks.push_back(std::async(std::launch::async, run_rank, options(r, kSize, port, 30000ms), 1));
  for (std::uint32_t r = 1; r < kSize; ++r) {
    const Outcome o = ranks[r - 1].get();
    CAPTURE(r);
    CHECK(o.error == "");
    CHECK(o.sockets == 1);
  }
  std::string text;
  char buffer[4096];
  for (ssize_t n; (n = ::read(report[0], buffer, sizeof buffer)) > 0;) text.append(buffer, static_cast<std::size_t>(n));
  ::close(report[0]);
  CHECK(text == "formed, out of descriptors on the way");
  int status = 0;
  pid_t done = 0;
  for (const auto give_up = Clock::now() + 30s; (done = waitpid(pid, &status, WNOHANG)) == 0 && Clock::now() < give_up;)
    std::this_thread::sleep_for(5ms);
  if (done == 0) ::kill(pid, SIGKILL), waitpid(pid, &status, 0);
  CHECK(done == pid);
}

TEST_CASE("rank 0 refuses a job size its descriptor limit cannot serve, before allocating for it") {
  // Restored however the test ends.
  struct SavedLimit {
    rlimit limit{};
    SavedLimit() { ::getrlimit(RLIMIT_NOFILE, &limit); }
    ~SavedLimit() { ::setrlimit(RLIMIT_NOFILE, &limit); }
  } saved;
  // As high as this process may go, within reason, so that the largest job
  // it can serve is large enough to see what is allocated per rank.
  rlimit raised = saved.limit;
  if (raised.rlim_max != RLIM_INFINITY) raised.rlim_cur = std::min<rlim_t>(raised.rlim_max, 1 << 20);
  else raised.rlim_cur = std::max<rlim_t>(saved.limit.rlim_cur, 1 << 16);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &raised) == 0);
  const auto most = static_cast<std::uint32_t>(raised.rlim_cur - kSpareDescriptors + 1);

  const std::string error = error_of([&] { TcpBootstrap b(options(0, most + 1, free_port(), 300ms)); });
  CHECK(contains(error, "bootstrap: rank 0: cannot serve a job of " + std::to_string(most + 1) + " ranks (AMI_SIZE)"));
  CHECK(contains(error, "limit of open files (RLIMIT_NOFILE) is " + std::to_string(raised.rlim_cur)));
  CHECK(contains(error, "raise it with ulimit -n " + std::to_string(raised.rlim_cur + 1)));
  CHECK(contains(error_of([&] { TcpBootstrap b(options(0, 100000000, free_port(), 300ms)); }),
                 "cannot serve a job of 100000000 ranks (AMI_SIZE)"));
  // Other ranks keep one socket: the limit is rank 0's alone.
  CHECK(contains(error_of([&] { TcpBootstrap b(options(1, 100000000, free_port(), 100ms)); }), "timed out"));

  // The largest job the limit holds is served, and while rank 0 waits for
  // its ranks it holds nothing per rank that has not come.
  const std::size_t before = heap_in_use();
  auto root = in_thread([&] { TcpBootstrap b(options(0, most, 0, 2000ms)); });
  REQUIRE(listening_port() != 0);
  const std::size_t waiting = heap_in_use();
  CHECK(waiting < before + 256 * 1024);
  const std::string timeout = root.get();
  CHECK(contains(timeout,
                 "waiting for rank(s) 1, 2, 3, 4, 5, 6, 7, 8 and " + std::to_string(most - 9) + " more to join"));
}

// ---- the tree the tables go down ----------------------------------------

namespace {

// Within one round every rank's blob has its own size, one of them empty.
Blob distinct_blob(std::uint32_t rank, std::uint32_t size, int round) {
  const std::uint32_t turn = (rank + static_cast<std::uint32_t>(round)) % size;
  return pattern(std::size_t{turn} * 61, rank * 1000 + static_cast<std::uint32_t>(round));
}

// What one rank of a tree job saw: every round's table (round 0 through
// allgather_table, the others through allgather), what it sent, or its error.
struct TreeOutcome {
  std::vector<std::vector<Blob>> rounds;
  std::vector<std::uint64_t> sent_in_round;
  std::uint64_t sent = 0;
  std::string error;
};

TreeOutcome run_tree_rank(const Options& o, int rounds, std::size_t blob_bytes) {
  TreeOutcome out;
  out.error = error_of([&] {
    TcpBootstrap boot(o);
    for (int i = 0; i < rounds; ++i) {
      const Blob mine = blob_bytes ? pattern(blob_bytes, o.rank) : distinct_blob(o.rank, o.size, i);
      const std::uint64_t before = boot.bytes_sent();
      if (i == 0) {
        const Table table = boot.allgather_table(mine);
        out.rounds.push_back(table.blobs());
        if (table.size() != o.size || table[o.rank].size() != mine.size()) out.rounds.back().clear();
      } else {
        out.rounds.push_back(boot.allgather(mine));
      }
      out.sent_in_round.push_back(boot.bytes_sent() - before);
    }
    out.sent = boot.bytes_sent();
  });
  return out;
}

std::vector<TreeOutcome> run_tree_job(std::uint32_t size, int rounds, std::size_t blob_bytes = 0) {
  const std::uint16_t port = free_port();
  std::vector<std::future<TreeOutcome>> ranks(size);
  for (std::uint32_t r = 0; r < size; ++r)
    ranks[r] = std::async(std::launch::async, run_tree_rank, options(r, size, port, 30000ms), rounds, blob_bytes);
  std::vector<TreeOutcome> outcomes;
  for (auto& f : ranks) outcomes.push_back(f.get());
  return outcomes;
}

// Where rank 0 tells a rank its parent listens: {host length, host, port}.
tcp::endpoint read_parent_frame(tcp::socket& s) {
  const std::uint32_t length = get_words(s, 1)[0];
  REQUIRE(length < 64);
  std::string host(length, '\0');
  asio::read(s, asio::buffer(host));
  const std::uint32_t port = get_words(s, 1)[0];
  REQUIRE((port > 0 && port < 65536));
  return {asio::ip::make_address(host), static_cast<std::uint16_t>(port)};
}

// A raw connection to a listening rank whose address is known.
tcp::socket connect_at(asio::io_context& io, const tcp::endpoint& at) {
  tcp::socket s(io);
  s.connect(at);
  return s;
}

std::string local_address(const tcp::socket& s) {
  return "127.0.0.1:" + std::to_string(s.local_endpoint().port());
}

void say_hello(tcp::socket& s, std::uint32_t rank, std::uint32_t size, std::uint32_t magic = kMagic,
               const std::string& key = kKey) {
  put_words(s, {magic, kVersion, rank, size, static_cast<std::uint32_t>(key.size())});
  asio::write(s, asio::buffer(key));
}

// A forked rank's error, or "" for none, written to a pipe in words.
std::string read_all(int fd) {
  std::string text;
  char buffer[4096];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;) text.append(buffer, static_cast<std::size_t>(n));
  ::close(fd);
  return text;
}

// Waits for a child a bounded time, then kills it; true if it ended by itself.
bool reap(pid_t pid, std::chrono::seconds limit) {
  int status = 0;
  pid_t done = 0;
  for (const auto give_up = Clock::now() + limit;
       (done = waitpid(pid, &status, WNOHANG)) == 0 && Clock::now() < give_up;)
    std::this_thread::sleep_for(5ms);
  if (done == 0) ::kill(pid, SIGKILL), waitpid(pid, &status, 0);
  return done == pid;
}

}  // namespace

TEST_CASE("the table reaches every rank whole at sizes that are not powers of two, blobs of distinct sizes") {
  constexpr int kRounds = 3;
  for (std::uint32_t size : {1u, 2u, 3u, 5u, 7u, 16u, 33u}) {
    CAPTURE(size);
    const std::vector<TreeOutcome> outcomes = run_tree_job(size, kRounds);
    for (std::uint32_t r = 0; r < size; ++r) {
      CAPTURE(r);
      REQUIRE(outcomes[r].error == "");
      REQUIRE(outcomes[r].rounds.size() == std::size_t{kRounds});
      for (int i = 0; i < kRounds; ++i) {
        REQUIRE(outcomes[r].rounds[i].size() == size);
        for (std::uint32_t from = 0; from < size; ++from)
          CHECK(outcomes[r].rounds[i][from] == distinct_blob(from, size, i));
      }
    }
  }
}

// Each rank sends its blob to rank 0 and the table, N (4 + blob) + 4 bytes,
// to kTreeFanOut children at most: 2 N (1 KiB + 4) + 1 KiB + 4 per allgather
// with 1 KiB blobs, about 2.01 N KiB. The handshake adds a hello (under
// 300 bytes) and, for rank 0, an answer and a parent's address per rank (16
// and under 32 bytes). So c = 3 bounds every rank with room to spare, while
// rank 0 answering every rank itself sent (N - 1) tables, 31 N KiB here.
TEST_CASE("every rank, rank 0 included, sends O(N) bytes: at most 3 N blob bytes in a job of 32") {
  constexpr std::uint32_t kSize = 32;
  constexpr std::size_t kBlob = 1024;
  constexpr std::uint64_t kTable = 4 + kSize * (4 + kBlob);
  constexpr std::uint64_t kPerAllgather = kTreeFanOut * kTable + 4 + kBlob;
  constexpr std::uint64_t kBound = 3 * kSize * kBlob;
  static_assert(kPerAllgather < kBound);
  const std::vector<TreeOutcome> outcomes = run_tree_job(kSize, 1, kBlob);
  std::uint64_t total = 0;
  for (std::uint32_t r = 0; r < kSize; ++r) {
    CAPTURE(r);
    const TreeOutcome& o = outcomes[r];
    REQUIRE(o.error == "");
    REQUIRE(o.rounds.size() == 1);
    for (std::uint32_t from = 0; from < kSize; ++from) CHECK(o.rounds[0][from] == pattern(kBlob, from));
    CHECK(o.sent_in_round[0] <= kPerAllgather);
    CHECK(o.sent <= kBound);
    total += o.sent_in_round[0];
  }
  // Every rank but 0 received one table and rank 0 every blob: that much was sent.
  CHECK(total >= (kSize - 1) * kTable + (kSize - 1) * (4 + kBlob));
}

TEST_CASE("a parent checks its children's hellos as rank 0 does: strangers, wrong keys and second claims") {
  // Rank 1's children, 3 and 4, are played by hand, so that rank 1 listens
  // until the test lets it have both.
  constexpr std::uint32_t kSize = 7;
  static_assert(kTreeFanOut == 2);
  const std::uint16_t port = free_port();
  Log log;
  std::vector<std::future<TreeOutcome>> ranks(kSize);
  for (std::uint32_t r : {0u, 1u, 2u, 5u, 6u}) {
    Options o = options(r, kSize, port, 20000ms);
    if (r == 1) o.log = log.sink();
    ranks[r] = std::async(std::launch::async, run_tree_rank, o, 1, 8);
  }
  FakePeer three(port), four(port);
  three.hello(3, kSize);
  four.hello(4, kSize);
  REQUIRE(three.verdict() == accepted);
  REQUIRE(four.verdict() == accepted);
  // Once every rank has joined, rank 0 says where rank 1 listens.
  const tcp::endpoint parent = read_parent_frame(three.socket);
  CHECK(read_parent_frame(four.socket) == parent);
  CHECK(parent.address().to_string() == "127.0.0.1");

  asio::io_context io;
  std::string hangup, stranger, wrong, huge, second;
  {
    tcp::socket s = connect_at(io, parent);
    hangup = local_address(s);
  }
  {
    tcp::socket s = connect_at(io, parent);
    stranger = local_address(s);
    say_hello(s, 3, kSize, 0x54544847);
    CHECK(get_words(s, 4)[2] == bad_magic);
  }
  {
    tcp::socket s = connect_at(io, parent);
    wrong = local_address(s);
    say_hello(s, 3, kSize, kMagic, "another job's key");
    CHECK(get_words(s, 4)[2] == wrong_key);
  }
  {
    tcp::socket s = connect_at(io, parent);
    huge = local_address(s);
    put_words(s, {kMagic, kVersion, 3, kSize, 1u << 30});  // a key length no key has
    CHECK(get_words(s, 4)[2] == wrong_key);
  }
  tcp::socket link3 = connect_at(io, parent);
  say_hello(link3, 3, kSize);
  CHECK(get_words(link3, 4)[2] == accepted);
  {
    tcp::socket s = connect_at(io, parent);
    second = local_address(s);
    say_hello(s, 3, kSize);
    CHECK(get_words(s, 4)[2] == duplicate_rank);
  }
  tcp::socket link4 = connect_at(io, parent);
  say_hello(link4, 4, kSize);
  CHECK(get_words(link4, 4)[2] == accepted);

  // Ranks 3 and 4 take part by hand: a blob to rank 0, the table from rank 1.
  for (auto [rank, star] : {std::pair{3u, &three}, std::pair{4u, &four}}) {
    put_words(star->socket, {8});
    asio::write(star->socket, asio::buffer(pattern(8, rank)));
  }
  for (tcp::socket* link : {&link3, &link4}) {
    CHECK(get_words(*link, 1)[0] == kSize);
    CHECK(get_words(*link, kSize) == std::vector<std::uint32_t>(kSize, 8));
    Blob blobs(kSize * 8);
    asio::read(*link, asio::buffer(blobs));
    for (std::uint32_t r = 0; r < kSize; ++r)
      CHECK(Blob(blobs.begin() + r * 8, blobs.begin() + r * 8 + 8) == pattern(8, r));
  }
  for (std::uint32_t r : {0u, 1u, 2u, 5u, 6u}) {
    CAPTURE(r);
    const TreeOutcome o = ranks[r].get();
    CHECK(o.error == "");
    REQUIRE(o.rounds.size() == 1);
    for (std::uint32_t from = 0; from < kSize; ++from) CHECK(o.rounds[0][from] == pattern(8, from));
  }
  const std::string lines = log.all();
  CHECK(contains(lines, "bootstrap: rank 1: refused peer " + hangup + ": closed the connection before its hello"));
  CHECK(contains(lines, "bootstrap: rank 1: refused peer " + stranger + ": bad magic 0x54544847"));
  CHECK(contains(lines, "bootstrap: rank 1: refused peer " + wrong + ": wrong job key"));
  CHECK(contains(lines, "refused peer " + huge + ": a job key of 1073741824 bytes exceeds the limit of 256"));
  CHECK(contains(lines, "bootstrap: rank 1: refused a second claim of rank 3: peer " + second +
                            " claims it, already taken by rank 3 at " + local_address(link3)));
}

TEST_CASE("a rank whose parent does not come times out naming its parent and what it waited for") {
  // Rank 1 (parent of 3 and 4) is played by hand: it joins rank 0 and says a
  // port, then never answers its children.
  constexpr std::uint32_t kSize = 5;
  const std::uint16_t port = free_port();
  asio::io_context io;
  tcp::acceptor dead_end(io, {asio::ip::make_address("127.0.0.1"), 0});  // accepts, never answers
  std::vector<std::future<TreeOutcome>> ranks(kSize);
  for (std::uint32_t r : {0u, 2u, 3u, 4u})
    ranks[r] = std::async(std::launch::async, run_tree_rank, options(r, kSize, port, 1500ms), 1, 8);
  FakePeer one(port);
  put_words(one.socket, {kMagic, kVersion, 1, kSize, static_cast<std::uint32_t>(kKey.size())});
  asio::write(one.socket, asio::buffer(kKey));
  put_words(one.socket, {dead_end.local_endpoint().port()});
  CHECK(one.verdict() == accepted);
  for (std::uint32_t r : {3u, 4u}) {
    CAPTURE(r);
    const std::string error = ranks[r].get().error;
    CHECK(contains(error, "bootstrap: rank " + std::to_string(r) + ": "));
    CHECK(contains(error, "rank 1 at 127.0.0.1:" + std::to_string(dead_end.local_endpoint().port())));
    CHECK(contains(error, "waiting for the answer to its hello"));
  }
  CHECK(ranks[0].get().error != "");  // it waited for ranks 1, 3 and 4
  (void)ranks[2].get();
}

namespace {

// A job of processes, rank 0 in this one, in which rank kVictim is killed:
// before its blob (`after_rounds` 0) or once it has done that many
// allgathers. Returns every other rank's error (rank 0's first) and whether
// each ended by itself well before its timeout.
struct KilledJob {
  std::vector<std::string> errors;
  bool all_ended = true;
};

constexpr std::uint32_t kVictim = 1;  // a parent: ranks 3 and 4 read the table from it

KilledJob kill_mid_allgather(std::uint32_t size, int after_rounds) {
  const std::uint16_t port = free_port();
  const auto timeout = 20000ms;
  std::vector<pid_t> pids(size, 0);
  std::vector<int> reports(size, -1);
  for (std::uint32_t r = 1; r < size; ++r) {
    int report[2];
    REQUIRE(::pipe(report) == 0);
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {  // never back into doctest
      ::close(report[0]);
      const std::string error = error_of([&] {
        TcpBootstrap boot(options(r, size, port, timeout));
        for (int i = 0; i < after_rounds; ++i) (void)boot.allgather(pattern(100, r));
        if (r == kVictim) {
          ::raise(SIGSTOP);  // the test kills it here, its sockets still open
          ::pause();
        }
        for (int i = 0; i < 3; ++i) boot.barrier();
      });
      (void)!::write(report[1], error.data(), error.size());
      _exit(0);
    }
    ::close(report[1]);
    pids[r] = pid;
    reports[r] = report[0];
  }
  KilledJob job;
  const auto start = Clock::now();
  job.errors.push_back(error_of([&] {
    TcpBootstrap boot(options(0, size, port, timeout));
    for (int i = 0; i < after_rounds; ++i) (void)boot.allgather(pattern(100, 0));
    // The victim stops itself where the others wait for it; then it dies.
    int status = 0;
    REQUIRE(waitpid(pids[kVictim], &status, WUNTRACED) == pids[kVictim]);
    CHECK(WIFSTOPPED(status));
    std::this_thread::sleep_for(200ms);  // the others are in the exchange by now
    ::kill(pids[kVictim], SIGKILL);
    for (int i = 0; i < 3; ++i) boot.barrier();
  }));
  for (std::uint32_t r = 1; r < size; ++r) {
    const bool ended = reap(pids[r], 15s);
    if (r == kVictim) {
      ::close(reports[r]);
      continue;
    }
    job.all_ended = job.all_ended && ended;
    job.errors.push_back(read_all(reports[r]));
  }
  job.all_ended = job.all_ended && Clock::now() - start < timeout / 2;
  return job;
}

}  // namespace

TEST_CASE("a rank killed during an allgather fails every other rank at once, naming it") {
  // Killed before it sends its blob: rank 0's gather sees it go, and its
  // notice reaches every rank, those below the victim in the tree included.
  // Killed after an allgather: its children see the link close, rank 0 the star.
  for (int after_rounds : {0, 1}) {
    CAPTURE(after_rounds);
    const KilledJob job = kill_mid_allgather(7, after_rounds);
    CHECK(job.all_ended);
    REQUIRE(job.errors.size() == 6);
    for (std::size_t i = 0; i < job.errors.size(); ++i) {
      const std::uint32_t rank = i == 0 ? 0 : static_cast<std::uint32_t>(i) + 1;
      CAPTURE(rank);
      CAPTURE(job.errors[i]);
      CHECK(contains(job.errors[i], "bootstrap: rank " + std::to_string(rank) + ": "));
      CHECK(contains(job.errors[i], "rank 1 at 127.0.0.1:"));
      CHECK(contains(job.errors[i], "peer closed the connection"));
    }
  }
}

TEST_CASE("a rank names rank 0 behind a bad parent address, or rank 0's failure in its place") {
  // Rank 3 of 4: its parent is rank 1, so rank 0 owes it where rank 1 listens.
  asio::io_context io;
  tcp::acceptor acceptor(io, {asio::ip::make_address("127.0.0.1"), 0});
  const std::uint16_t port = acceptor.local_endpoint().port();
  const std::string root = "rank 0 at 127.0.0.1:" + std::to_string(port);
  auto other = in_thread([&] { TcpBootstrap boot(options(3, 4, port, 2000ms)); });
  tcp::socket s = acceptor.accept();
  CHECK(get_words(s, 5) == std::vector<std::uint32_t>{kMagic, kVersion, 3, 4, std::uint32_t(kKey.size())});
  std::string key(kKey.size(), '\0');
  asio::read(s, asio::buffer(key));
  put_words(s, {kMagic, kVersion, accepted, 4});
  const std::string step = "(" + root + ", waiting to learn where its parent listens)";

  SUBCASE("an oversize host") {
    put_words(s, {1000});
    CHECK(contains(other.get(), "malformed parent address: a host of 1000 bytes exceeds the limit of 255 " + step));
  }
  SUBCASE("no address") {
    put_words(s, {9});
    asio::write(s, asio::buffer("localhost", 9));
    put_words(s, {7000});
    CHECK(contains(other.get(), "malformed parent address: 'localhost' port 7000 " + step));
  }
  SUBCASE("port 0") {
    put_words(s, {9});
    asio::write(s, asio::buffer("127.0.0.1", 9));
    put_words(s, {0});
    CHECK(contains(other.get(), "malformed parent address: '127.0.0.1' port 0 " + step));
  }
  SUBCASE("rank 0's failure") {
    put_words(s, {kFailureMark, 4});
    asio::write(s, asio::buffer("gone", 4));
    s.close();
    CHECK(contains(other.get(), "bootstrap: rank 3: rank 0 failed: gone " + step));
  }
  SUBCASE("a silence") {
    CHECK(contains(other.get(), "timed out after 2000 ms " + step));
  }
}

TEST_CASE("ranks with addresses of their own connect and listen there") {
  constexpr std::uint32_t kSize = 7;
  const std::uint16_t port = free_port();
  std::vector<std::future<TreeOutcome>> ranks(kSize);
  for (std::uint32_t r = 0; r < kSize; ++r) {
    Options o = options(r, kSize, port, 20000ms);
    if (r != 0) o.local_host = "127.0.0." + std::to_string(2 + r % 3);
    ranks[r] = std::async(std::launch::async, run_tree_rank, o, 2, 0);
  }
  for (std::uint32_t r = 0; r < kSize; ++r) {
    CAPTURE(r);
    const TreeOutcome o = ranks[r].get();
    REQUIRE(o.error == "");
    for (int i = 0; i < 2; ++i)
      for (std::uint32_t from = 0; from < kSize; ++from) CHECK(o.rounds[i][from] == distinct_blob(from, kSize, i));
  }
  Options bad = options(1, 2, port);
  bad.local_host = "not an address";
  CHECK(contains(error_of([&] { TcpBootstrap b(bad); }), "bootstrap: rank 1: cannot use 'not an address' as this "
                                                         "rank's address"));
}
