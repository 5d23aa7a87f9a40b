// The TCP bootstrap and the address blobs it carries: real sockets on
// loopback, ranks as threads; and peers that lie, stall or never come.
#include <doctest/doctest.h>

#include <dirent.h>

#include <chrono>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "ami/error.hpp"
#include "pair.hpp"
#include "transport/src/address_blob.hpp"
#include "transport/src/tcp_bootstrap.hpp"

using namespace std::chrono_literals;
using ami::boot::Blob;
using ami::boot::Options;
using ami::boot::TcpBootstrap;
namespace asio = boost::asio;

namespace {

int open_fds() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n;
}

Options at(std::uint32_t rank, std::uint32_t size, std::uint16_t port,
           std::chrono::milliseconds timeout = 5000ms) {
  return Options{.rank = rank, .size = size, .host = "127.0.0.1", .port = port, .timeout = timeout};
}

Blob blob_of(std::uint32_t rank, std::size_t bytes) {
  Blob b(bytes);
  for (std::size_t i = 0; i < bytes; ++i) b[i] = static_cast<std::byte>(rank * 31 + i);
  return b;
}

// Runs every rank in its own thread; rank r's blob is blob_of(r, sizes[r]).
// Returns what each rank got from two allgathers and a barrier.
std::vector<std::vector<Blob>> run_job(std::uint32_t size, const std::vector<std::size_t>& sizes,
                                       std::chrono::milliseconds root_delay = 0ms) {
  const std::uint16_t port = test::free_port();
  std::vector<std::vector<Blob>> got(size);
  std::vector<std::exception_ptr> errors(size);
  std::vector<std::thread> threads;
  for (std::uint32_t r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        if (r == 0) std::this_thread::sleep_for(root_delay);
        TcpBootstrap b(at(r, size, port));
        got[r] = b.allgather(blob_of(r, sizes[r]));
        const auto again = b.allgather(blob_of(r, sizes[r]));
        if (again != got[r]) throw ami::Error("second allgather differs");
        b.barrier();
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return got;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ami::Error& e) {
    return e.what();
  }
  return "";
}

// A fake peer: connects to rank 0 and sends raw bytes.
struct FakePeer {
  asio::io_context io;
  asio::ip::tcp::socket s{io};
  FakePeer(std::uint16_t port) {
    for (int i = 0; i < 200; ++i) {
      boost::system::error_code ec;
      s.connect({asio::ip::make_address("127.0.0.1"), port}, ec);
      if (!ec) return;
      s.close();
      std::this_thread::sleep_for(10ms);
    }
  }
  void send(const void* p, std::size_t n) { asio::write(s, asio::buffer(p, n)); }
};

struct Hello {
  std::uint32_t magic, version, rank, size;
};
constexpr std::uint32_t kHelloMagic = 0x544F4241;

// Rank 0 of a job of `size` facing one fake peer that sends `hello`.
std::string root_facing(std::uint32_t size, Hello hello, bool send_it = true) {
  const std::uint16_t port = test::free_port();
  std::string error;
  std::thread root([&] { error = error_of([&] { TcpBootstrap b(at(0, size, port, 1500ms)); }); });
  FakePeer peer(port);
  if (send_it) peer.send(&hello, sizeof hello);
  root.join();
  return error;
}

}  // namespace

TEST_CASE("every rank gets every blob, in rank order") {
  for (std::uint32_t size : {1u, 2u, 4u, 5u}) {
    CAPTURE(size);
    std::vector<std::size_t> sizes(size);
    for (std::uint32_t r = 0; r < size; ++r) sizes[r] = r == 1 ? 0 : r == 2 ? 60 * 1024 : 100 + r;
    const auto got = run_job(size, sizes);
    for (std::uint32_t r = 0; r < size; ++r) {
      REQUIRE(got[r].size() == size);
      for (std::uint32_t k = 0; k < size; ++k) CHECK(got[r][k] == blob_of(k, sizes[k]));
    }
  }
}

TEST_CASE("ranks that start before rank 0 wait for it") {
  const auto got = run_job(3, {10, 20, 30}, 400ms);
  CHECK(got[2][0] == blob_of(0, 10));
}

TEST_CASE("a rank 0 that never comes: a timeout naming the address") {
  const std::uint16_t port = test::free_port();
  const auto start = std::chrono::steady_clock::now();
  const std::string e = error_of([&] { TcpBootstrap b(at(1, 2, port, 300ms)); });
  CHECK(std::chrono::steady_clock::now() - start < 3s);
  CHECK(e.find("127.0.0.1:" + std::to_string(port)) != std::string::npos);
  CHECK(e.find("cannot reach rank 0") != std::string::npos);
}

TEST_CASE("rank 0 refuses peers that lie about themselves, naming them") {
  CHECK(root_facing(2, {0xBAD, 1, 1, 2}).find("not an ami bootstrap peer") != std::string::npos);
  CHECK(root_facing(2, {kHelloMagic, 1, 1, 3}).find("says the job has 3 tasks") != std::string::npos);
  CHECK(root_facing(2, {kHelloMagic, 1, 7, 2}).find("claims rank 7, out of range") != std::string::npos);
  CHECK(root_facing(2, {kHelloMagic, 1, 0, 2}).find("claims rank 0") != std::string::npos);
  const std::string silent = root_facing(2, {}, false);
  CHECK(silent.find("reading the hello of 127.0.0.1:") != std::string::npos);
  CHECK(silent.find("timed out") != std::string::npos);
}

TEST_CASE("two peers claiming one rank") {
  const std::uint16_t port = test::free_port();
  std::string error;
  std::thread root([&] { error = error_of([&] { TcpBootstrap b(at(0, 3, port, 1500ms)); }); });
  FakePeer a(port), b(port);
  const Hello h{kHelloMagic, 1, 1, 3};
  a.send(&h, sizeof h);
  b.send(&h, sizeof h);
  root.join();
  CHECK(error.find("claims rank 1, which rank 1 at") != std::string::npos);
}

TEST_CASE("rank 0 sending an oversize frame is refused") {
  const std::uint16_t port = test::free_port();
  std::string error;
  std::thread rank1([&] {
    error = error_of([&] {
      TcpBootstrap b(at(1, 2, port, 1500ms));
      (void)b.allgather(blob_of(1, 4));
    });
  });
  // A fake rank 0: answers the hello, then claims a 1 GiB address.
  asio::io_context io;
  asio::ip::tcp::acceptor acc(io, {asio::ip::make_address("127.0.0.1"), port});
  asio::ip::tcp::socket s(io);
  acc.accept(s);
  Hello h;
  asio::read(s, asio::buffer(&h, sizeof h));
  const Hello ack{kHelloMagic, 1, 0, 2};
  asio::write(s, asio::buffer(&ack, sizeof ack));
  std::uint32_t len;
  asio::read(s, asio::buffer(&len, sizeof len));
  std::vector<std::byte> theirs(len);
  asio::read(s, asio::buffer(theirs));
  const std::uint32_t huge = 1u << 30;
  asio::write(s, asio::buffer(&huge, sizeof huge));
  rank1.join();
  CHECK(error.find("exceeds 64 KiB") != std::string::npos);
  CHECK(error.find("rank 0 at 127.0.0.1") != std::string::npos);
}

TEST_CASE("no file descriptor outlives a bootstrap, even a failed one") {
  const int before = open_fds();
  (void)run_job(3, {1, 2, 3});
  (void)root_facing(2, {0xBAD, 1, 1, 2});
  (void)error_of([&] { TcpBootstrap b(at(1, 2, test::free_port(), 200ms)); });
  CHECK(open_fds() == before);
}

TEST_CASE("addresses: host:port parsing") {
  std::string host;
  std::uint16_t port = 0;
  CHECK(ami::boot::parse_address("node1:7000", host, port));
  CHECK(host == "node1");
  CHECK(port == 7000);
  CHECK(ami::boot::parse_address("[::1]:80", host, port));
  CHECK(host == "::1");
  for (const char* bad : {"", "node", "node:", ":80", "node:0", "node:65536", "node:8x", "a:b:c", "[::1]80"})
    CHECK_FALSE(ami::boot::parse_address(bad, host, port));
}

TEST_CASE("address blobs: round trip, and every malformed one named") {
  ami::AddressBlob a{.job = 77, .task = 3, .contexts = 2, .backends = ami::AddressBlob::kShm,
                     .pid = 1234, .shm_fd = 9, .boot_id = "0f0e-boot", .hostname = "node7"};
  const auto bytes = a.encode();
  ami::AddressBlob b;
  REQUIRE(ami::AddressBlob::decode(bytes, b).ok());
  CHECK(b.job == 77);
  CHECK(b.task == 3);
  CHECK(b.contexts == 2);
  CHECK(b.pid == 1234);
  CHECK(b.shm_fd == 9);
  CHECK(b.boot_id == "0f0e-boot");
  CHECK(b.hostname == "node7");

  auto broken = [&](std::size_t at, std::byte value) {
    auto copy = bytes;
    copy[at] = value;
    return std::string(ami::AddressBlob::decode(copy, b).what());
  };
  CHECK(std::string(ami::AddressBlob::decode({bytes.data(), 10}, b).what()) == "address blob is truncated");
  CHECK(broken(0, std::byte{0}) == "address blob has a bad magic");
  CHECK(broken(4, std::byte{9}) == "address blob has an unsupported version");
  CHECK(broken(6, std::byte{0x80}) == "address blob offers unknown backends");
  auto longer = bytes;
  longer.push_back(std::byte{'x'});
  CHECK(std::string(ami::AddressBlob::decode(longer, b).what()) ==
        "address blob length does not match its hostname");
  ami::AddressBlob no_segment = a;
  no_segment.shm_fd = -1;
  CHECK(std::string(ami::AddressBlob::decode(no_segment.encode(), b).what()) ==
        "address blob offers shm without a segment");
}
