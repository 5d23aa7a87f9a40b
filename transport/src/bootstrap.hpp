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
// Rank 0's port is open to whoever reaches it, so what a stranger can cost is
// bounded. At most kMaxPendingConnections connections wait for their hello,
// each for at most Options::hello_timeout; the oldest is dropped to make room,
// and also when accept() runs out of descriptors or memory (EMFILE, ENFILE,
// ENOBUFS, ENOMEM), which rank 0 survives. Refusals are logged a few lines
// one by one, then as a count ("refused N more connection(s)") at most once a
// second and when listening ends. A second claim of a rank already taken is
// refused (duplicate rank) and logged with both claimants; the first keeps the
// rank. A connection rank 0 drops for want of room or time is answered busy,
// in case it is a rank: a rank so answered connects again. A job that rank
// 0's descriptor limit cannot hold (one socket per rank, plus
// kSpareDescriptors) is refused at once.
//
// When rank 0 fails it tells every rank connected to it why before closing,
// so they fail at once with its reason instead of waiting out their timeout.
//
// Wire format, all integers little-endian u32:
//   hello    rank -> 0   magic, version, rank, size, then key length, key
//   answer   0 -> rank   magic, version, verdict (0 = accepted), size; verdict
//                        7 (rank 0 failed) is followed by length, reason
//   blob     rank -> 0   length, bytes
//   table    0 -> rank   count, then count x (length, bytes)
//   failure  0 -> rank   instead of a table: 0xffffffff, then length, reason
//                        (rank 0's error, at most kMaxReasonBytes); after it
//                        rank 0 closes the connection
// Verdicts: 0 accepted, 1 bad magic, 2 bad version, 3 size mismatch, 4 rank
// out of range, 5 duplicate rank, 6 wrong key, 7 rank 0 failed (the reason is
// empty for a peer whose hello rank 0 had not checked), 8 busy (dropped
// before its hello was read: connect again). Only verdict 7 has a tail.
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
  // Rank 0: how long an accepted connection may take to say its hello (a
  // real rank says it at once) before it is closed; the job's timeout, if
  // sooner, comes first and names it.
  std::chrono::milliseconds hello_timeout{3000};
  std::string key;  // the job's key (at most kMaxKeyBytes); every rank gives the same
  // Rank 0's log of refused connections; by default a line on stderr.
  std::function<void(const std::string&)> log;
};

inline constexpr std::size_t kMaxKeyBytes = 256;
// Rank 0: connections accepted and still owing their hello, at most.
inline constexpr std::size_t kMaxPendingConnections = 128;
// Rank 0 needs size - 1 sockets plus these below RLIMIT_NOFILE: its own
// reactor, the listening socket, and room for the rest of the process.
inline constexpr std::size_t kSpareDescriptors = 64;
// The longest reason rank 0 sends with a failure.
inline constexpr std::size_t kMaxReasonBytes = 1024;

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
  // Rank 0 refuses a size its descriptor limit cannot hold.
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
