// The TCP bootstrap on loopback: jobs whose ranks are threads and jobs whose
// ranks are processes; a rank 0 that starts late or never; and fake peers,
// raw Asio sockets speaking the wire format by hand, that break each rule of
// the handshake and the framing. Ranks run off the main thread; only the main
// thread asserts.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

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
#include "transport/src/bootstrap.hpp"

using namespace std::chrono_literals;
using ami::bootstrap::Blob;
using ami::bootstrap::kMaxBlobBytes;
using ami::bootstrap::Options;
using ami::bootstrap::TcpBootstrap;
namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

// The wire format, written out independently of the implementation so that
// a change to it shows here.
constexpr std::uint32_t kMagic = 0x42494d41;
constexpr std::uint32_t kVersion = 2;
enum Verdict : std::uint32_t {
  accepted, bad_magic, bad_version, size_mismatch, rank_out_of_range, duplicate_rank, wrong_key
};
const std::string kKey = "test job key";

std::uint16_t free_port() {
  asio::io_context io;
  tcp::acceptor acceptor(io, {asio::ip::make_address("127.0.0.1"), 0});
  return acceptor.local_endpoint().port();
}

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

TEST_CASE("a duplicate rank is refused, naming both peers") {
  const std::uint16_t port = free_port();
  auto root = in_thread([&] { TcpBootstrap boot(options(0, 3, port)); });
  FakePeer first(port);
  first.hello(1, 3);
  CHECK(first.verdict() == accepted);
  FakePeer second(port);
  second.hello(1, 3);
  CHECK(second.verdict() == duplicate_rank);
  const std::string error = root.get();
  CHECK(contains(error, "duplicate rank: the peer claims rank 1, already taken by rank 1 at " + first.address()));
  CHECK(contains(error, "(peer " + second.address()));
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
