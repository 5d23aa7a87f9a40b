// bootstrap.hpp — how the N processes of a job find each other and exchange
// their address blobs before any backend is up: the Bootstrap contract, and
// its TCP implementation. (The PMIx one, for jobs a launcher started, is in
// pmix_bootstrap.hpp; job_bootstrap.hpp chooses between them.)
//
// The job is a star around rank 0, and a binary tree over the same ranks
// carries the tables. Rank 0 listens; every other rank connects (retrying,
// since rank 0 may start later) and introduces itself with a hello {magic,
// version, rank, size}, which rank 0 checks and answers. allgather() sends
// each rank's blob to rank 0, which sends the whole table to its children in
// the tree, each of which forwards it to its own: rank r's children are
// kTreeFanOut r + 1 .. kTreeFanOut r + kTreeFanOut. So no rank sends more
// than kTreeFanOut tables and its blob, O(N) bytes for a job of N (answering
// every rank itself, rank 0 sent N - 1 tables, O(N^2)), and a table reaches
// every rank within floor(log2 N) hops. Every wait is bounded by Options::timeout,
// and every failure throws ami::Error naming the peer (rank and/or address)
// and the problem. This is the setup path only: it is bounded, not fast.
//
// Rank 0 reaches its children over the star. Every other link of the tree is
// a connection of its own, made by the child: a rank with children listens
// (on the address it reaches rank 0 from, at a port the kernel picks) and
// tells rank 0 the port with its hello; once the job has formed, rank 0 tells
// every rank whose parent is not rank 0 where its parent listens; the child
// connects and says its hello there. The constructor returns once the rank's
// own links are up. A rank other than 0 holds at most kTreeFanOut + 2 sockets
// (rank 0, its parent, its children), and its listening socket only until its
// children have joined; rank 0 one per rank, the star, which stays for the
// job's life: it is how a rank's end is seen (peer_sockets()).
//
// Only peers presenting the job's key join. A listening rank (rank 0, or a
// rank with children) refuses any other connection — another program,
// another job, a peer of another version — with a log line, and goes on
// waiting for its ranks; if it then times out, its error names the peers it
// refused and why. A parent takes only its own children, each once, as rank
// 0 takes only ranks 1..N-1. The key is a shared secret compared in constant
// time, sent as is: it keeps jobs and strays apart, it does not hide from
// someone who can read the network.
//
// A listening port is open to whoever reaches it, so what a stranger can cost
// is bounded. At most kMaxPendingConnections connections wait for their
// hello, each for at most Options::hello_timeout; the oldest is dropped to
// make room, and also when accept() runs out of descriptors or memory
// (EMFILE, ENFILE, ENOBUFS, ENOMEM), which the listening rank survives.
// Refusals are logged a few lines one by one, then as a count ("refused N
// more connection(s)") at most once a second and when listening ends. A
// second claim of a rank already taken is refused (duplicate rank) and logged
// with both claimants; the first keeps the rank. A connection dropped for
// want of room or time is answered busy, in case it is a rank: a rank so
// answered connects again. A job that rank 0's descriptor limit cannot hold
// (one socket per rank, plus kSpareDescriptors) is refused at once.
//
// When a rank fails it tells every rank that joined it (rank 0: all of them;
// a parent: its children) why before closing, so they fail at once with its
// reason instead of waiting out their timeout. A rank waiting for the table
// from a parent other than rank 0 also reads rank 0's notices meanwhile: a
// rank that dies before sending its blob fails rank 0's gather, and rank 0's
// notice, naming it, reaches every rank at once.
//
// Wire format, all integers little-endian u32:
//   hello    rank -> listener  magic, version, rank, size, then key length, key;
//                              to rank 0, a rank with children adds the port
//                              it listens on
//   answer   listener -> rank  magic, version, verdict (0 = accepted), size;
//                              verdict 7 (the listener failed) is followed by
//                              length, reason
//   parent   0 -> rank         once the job has formed, to a rank whose parent
//                              is not rank 0: host length, host (text), port
//   blob     rank -> 0         length, bytes
//   table    parent -> child   count, count x length, then the count blobs
//                              back to back
//   failure  -> rank           instead of a parent or a table: 0xffffffff,
//                              then length, reason (the sender's error, at
//                              most kMaxReasonBytes); then the sender closes
//                              the connection
// Verdicts: 0 accepted, 1 bad magic, 2 bad version, 3 size mismatch, 4 rank
// out of range, 5 duplicate rank, 6 wrong key, 7 the listener failed (the
// reason is empty for a peer whose hello it had not checked), 8 busy (dropped
// before its hello was read: connect again). Only verdict 7 has a tail.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
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
  // A rank other than 0: the address it connects from and its children
  // connect to (a numeric address of this host); "" lets routing choose, the
  // address it reaches rank 0 from. For a host with several networks.
  std::string local_host;
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
// Children per rank in the tree that carries the tables: each rank sends
// this many tables at most, and a table takes about log2(N) hops.
inline constexpr std::uint32_t kTreeFanOut = 2;
// A listening rank: connections accepted and still owing their hello, at most.
inline constexpr std::size_t kMaxPendingConnections = 128;
// Rank 0 needs size - 1 sockets plus these below RLIMIT_NOFILE: its own
// reactor, the listening socket, and room for the rest of the process.
inline constexpr std::size_t kSpareDescriptors = 64;
// The longest reason a rank sends with a failure.
inline constexpr std::size_t kMaxReasonBytes = 1024;

using Blob = std::vector<std::byte>;
inline constexpr std::size_t kMaxBlobBytes = 64 * 1024;

class TcpBootstrap;

// Every rank's blob, in rank order, in one buffer: the table as it travels
// between ranks, so that receiving it allocates once, forwarding it copies
// nothing, and a job of N ranks costs one allocation per table, not N. The
// buffer is not cleared first: its pages are touched as the bytes arrive.
class Table {
 public:
  Table() = default;
  std::uint32_t size() const { return static_cast<std::uint32_t>(starts_.size()); }
  std::span<const std::byte> operator[](std::uint32_t rank) const;  // rank < size()
  std::vector<Blob> blobs() const;  // a copy, one Blob per rank

 private:
  friend class TcpBootstrap;
  std::span<std::byte> frame() const { return {frame_.get(), frame_bytes_}; }
  std::unique_ptr<std::byte[]> frame_;  // the table frame: count, every length, the blobs
  std::size_t frame_bytes_ = 0;
  std::vector<std::size_t> starts_;     // where each rank's blob begins in the frame
};

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
  // Publishing without gathering, for a bootstrap with a store each rank
  // can read alone (PMIx): publish() makes this rank's blob readable by
  // every rank and returns once every rank has published (all call it, as
  // they call allgather); fetch() then reads one rank's last published
  // blob, from any thread, when that rank is first needed. Where
  // fetches() is false only allgather() exists: the others throw.
  virtual bool fetches() const { return false; }
  virtual void publish(std::span<const std::byte> mine);
  virtual Blob fetch(std::uint32_t rank) const;
  virtual std::string_view name() const = 0;  // "tcp", "pmix"
  // Whether the job's tasks are on more than one host, where the launcher
  // says so without an exchange (PMIx: fewer tasks on this node than in the
  // job); nothing where it cannot tell.
  virtual std::optional<bool> spans_hosts() const { return std::nullopt; }
  // Connections to peers kept open for the job's life, as (task, socket
  // descriptor), still owned by the bootstrap: one that hangs up says its
  // peer's process ended. None by default.
  virtual std::vector<std::pair<std::uint32_t, int>> peer_sockets() const { return {}; }
};

class TcpBootstrap final : public Bootstrap {
 public:
  // Rank 0 listens and accepts size-1 connections; the others connect,
  // retrying every ~50 ms until the timeout, and then make their links in
  // the tree, so that every rank but 0 returns once the whole job has
  // joined. Size 1 opens no socket at all. Rank 0 refuses a size its
  // descriptor limit cannot hold.
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
  // The same exchange, the table kept as it came: one buffer, not N.
  Table allgather_table(std::span<const std::byte> mine);
  void barrier() override;  // allgather of nothing
  std::string_view name() const override { return "tcp"; }
  std::vector<std::pair<std::uint32_t, int>> peer_sockets() const override;

  // For later failure detection: the native socket fds of the star (rank 0:
  // one per peer, by rank; others: the one to rank 0), not the tree's links.
  // Still owned by the bootstrap.
  std::vector<int> sockets() const;

  // Bytes this rank has written to its sockets since it was made, every
  // frame counted (hellos, answers, blobs, tables, notices): what the choice
  // of exchange costs each rank.
  std::uint64_t bytes_sent() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Parses "host:port" (also "[v6addr]:port"); returns false on anything
// malformed (no port, port 0 or > 65535, empty host).
bool parse_address(std::string_view text, std::string& host, std::uint16_t& port);

}  // namespace ami::bootstrap
