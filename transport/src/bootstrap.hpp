// bootstrap.hpp — how the N processes of a job find each other and exchange
// their address blobs before any backend is up: the Bootstrap contract, and
// its TCP implementation. (The PMIx one, for jobs a launcher started, is in
// pmix_bootstrap.hpp; job_bootstrap.hpp chooses between them.)
//
// The job is a star around rank 0. Rank 0 listens; every other rank connects
// (retrying, since rank 0 may start later) and introduces itself with a hello
// {magic, version, rank, size}, which rank 0 checks and answers. allgather()
// sends each rank's blob to rank 0, which answers everyone with the whole
// table. Every wait is bounded by Options::timeout, and every failure throws
// ami::Error naming the peer (rank and/or address) and the problem. This is
// the setup path only: nothing here is meant to be fast.
//
// Only peers presenting the job's key (Options::key, AMI_JOB_KEY) join: rank
// 0 refuses any other connection — another program, another job, a peer of
// another version — with a log line, and goes on waiting for its ranks; if
// it then times out, its error names the peers it refused and why. The key
// is a shared secret compared in constant time, sent as is: it keeps jobs and
// strays apart, it does not hide from someone who can read the network.
//
// Wire format, all integers little-endian u32:
//   hello   rank -> 0   magic, version, rank, size, then key length, key
//   answer  0 -> rank   magic, version, verdict (0 = accepted), size
//   blob    rank -> 0   length, bytes
//   table   0 -> rank   count, then count x (length, bytes)
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ami::bootstrap {

struct Options {
  std::uint32_t rank = 0;
  std::uint32_t size = 1;
  std::string host;        // rank 0 binds here ("" or "0.0.0.0" = any), others connect here
  std::uint16_t port = 0;  // rank 0 may pass 0 and learn the chosen port from TcpBootstrap::port()
  std::chrono::milliseconds timeout{30000};  // for connecting (others retry until it), and for each exchange
  std::string key;  // the job's key (at most kMaxKeyBytes); every rank gives the same
  // Rank 0's log of refused connections; by default a line on stderr.
  std::function<void(const std::string&)> log;
};

inline constexpr std::size_t kMaxKeyBytes = 256;

using Blob = std::vector<std::byte>;
inline constexpr std::size_t kMaxBlobBytes = 64 * 1024;

// What a Client needs from its job: its place in it, an allgather of one
// blob per rank and a barrier. Every rank makes the same calls in the same
// order; a failure throws ami::Error naming the rank and the step.
class Bootstrap {
 public:
  virtual ~Bootstrap() = default;  // never throws
  virtual std::uint32_t rank() const = 0;
  virtual std::uint32_t size() const = 0;
  // Every rank passes its blob (at most kMaxBlobBytes); everyone gets all
  // blobs indexed by rank.
  virtual std::vector<Blob> allgather(std::span<const std::byte> mine) = 0;
  virtual void barrier() = 0;
  virtual std::string_view name() const = 0;  // "tcp", "pmix"
  // Connections to peers kept open for the job's life, as (task, socket
  // descriptor), still owned by the bootstrap: one that hangs up says its
  // peer's process ended. None by default.
  virtual std::vector<std::pair<std::uint32_t, int>> peer_sockets() const { return {}; }
};

class TcpBootstrap final : public Bootstrap {
 public:
  // Rank 0 listens and accepts size-1 connections; the others connect,
  // retrying every ~50 ms until the timeout. Size 1 opens no socket at all.
  explicit TcpBootstrap(const Options& options);
  ~TcpBootstrap() override;  // closes every socket; never throws
  TcpBootstrap(const TcpBootstrap&) = delete;
  TcpBootstrap& operator=(const TcpBootstrap&) = delete;

  std::uint32_t rank() const override;
  std::uint32_t size() const override;
  std::uint16_t port() const;  // the port rank 0 listens on (useful with port 0)

  // After a failure the bootstrap has closed its sockets and every later
  // call throws.
  std::vector<Blob> allgather(std::span<const std::byte> mine) override;
  void barrier() override;  // allgather of nothing
  std::string_view name() const override { return "tcp"; }
  std::vector<std::pair<std::uint32_t, int>> peer_sockets() const override;

  // For later failure detection: the native socket fds (rank 0: one per
  // peer, by rank; others: the one to rank 0). Still owned by the bootstrap.
  std::vector<int> sockets() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Parses "host:port" (also "[v6addr]:port"); returns false on anything
// malformed (no port, port 0 or > 65535, empty host).
bool parse_address(std::string_view text, std::string& host, std::uint16_t& port);

}  // namespace ami::bootstrap
