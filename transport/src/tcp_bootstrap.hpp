// tcp_bootstrap.hpp — the job's first exchange: every task learns every
// other task's address blob over TCP (Boost.Asio), star-shaped through rank 0.
//
// Rank 0 listens and accepts size-1 peers; each sends a hello (magic,
// version, rank, size) that rank 0 checks. allgather() then sends each
// task's blob to rank 0, which answers everyone with the whole table. Every
// wait has a deadline; every failure throws ami::Error naming the peer and
// the problem. Construction and the exchanges are setup-path only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ami::boot {

struct Options {
  std::uint32_t rank = 0;
  std::uint32_t size = 1;
  std::string host;        // rank 0 binds here ("" = any), the others connect here
  std::uint16_t port = 0;  // rank 0 may pass 0 and read port()
  std::chrono::milliseconds timeout{30000};
};

using Blob = std::vector<std::byte>;
inline constexpr std::size_t kMaxBlobBytes = 64 * 1024;

class TcpBootstrap {
 public:
  explicit TcpBootstrap(const Options& options);
  ~TcpBootstrap();
  TcpBootstrap(const TcpBootstrap&) = delete;
  TcpBootstrap& operator=(const TcpBootstrap&) = delete;

  std::uint32_t rank() const;
  std::uint32_t size() const;
  std::uint16_t port() const;

  // Every task passes its blob; every task gets all of them, by rank.
  std::vector<Blob> allgather(std::span<const std::byte> mine);
  void barrier() { (void)allgather({}); }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// "host:port" or "[v6]:port"; false on anything malformed.
bool parse_address(std::string_view text, std::string& host, std::uint16_t& port);

}  // namespace ami::boot
