// bootstrap_impl.hpp — what one TcpBootstrap is made of: its io_context, its
// sockets and the state of its running operations, and the steps that work
// on them. Three files define the steps: bootstrap_listener.cpp listening
// (rank 0's, and a parent's for its children: accepting, the connections that
// owe their hello, claims, the refusal logs, the failure notice),
// bootstrap_tree.cpp the tree (where parents listen, the links to them, the
// table's way down), bootstrap.cpp the rest (running and failing, the
// connecting side, the gather, the public face). Internal.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>  // before Asio: 1.74 uses std::exchange without it
#include <vector>

#include <boost/asio.hpp>

#include "bootstrap.hpp"
#include "bootstrap_wire.hpp"

namespace ami::bootstrap {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;

// "address:port", a v6 address in brackets.
inline std::string endpoint_text(const tcp::endpoint& e) {
  const auto a = e.address();
  return (a.is_v6() ? "[" + a.to_string() + "]" : a.to_string()) + ":" + std::to_string(e.port());
}

// A peer's text, fit to print: control characters become '?'.
inline std::string printable(std::string text) {
  for (char& c : text)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  return text;
}

struct TcpBootstrap::Impl {
  static constexpr std::size_t kMaxListed = 8;  // peers named in one message before "and N more"

  // Items for one message: the first few by name, then how many more, so that
  // a job of a million ranks or a flood of strangers makes a line, not a book.
  class Listing {
   public:
    void add(std::string item) {
      if (named_.size() < kMaxListed) named_.push_back(std::move(item));
      ++count_;
    }
    void add_unnamed(std::size_t n) { count_ += n; }
    bool empty() const { return count_ == 0; }
    bool full() const { return named_.size() == kMaxListed; }
    std::string text() const {
      std::string text;
      for (std::size_t i = 0; i < named_.size(); ++i) text += (i ? ", " : "") + named_[i];
      if (count_ > named_.size()) text += " and " + std::to_string(count_ - named_.size()) + " more";
      return text.empty() ? "none" : text;
    }

   private:
    std::vector<std::string> named_;
    std::size_t count_ = 0;
  };

  // A listening rank's log of what it refuses: the first few a line each, then only a
  // count, said at most once a second and when listening ends.
  class RefusalLog {
   public:
    using Sink = std::function<void(const std::string&)>;
    RefusalLog(Sink sink, std::string prefix, std::string noun)
        : sink_(std::move(sink)), prefix_(std::move(prefix)), noun_(std::move(noun)) {}
    void note(const std::string& what);  // one refusal, as "peer A: why"
    void flush();

   private:
    Sink sink_;
    std::string prefix_, noun_;
    std::size_t one_by_one_ = 0;
    std::size_t unlogged_ = 0;
    std::string last_;
    Clock::time_point since_;
  };

  // A connection a listening rank has accepted and not taken as a rank: it
  // owes its hello, or it was refused and the listener waits for it to close. Handlers hold
  // it by shared_ptr, so dropping it from `pending` never leaves them a
  // dangling reference.
  struct Joiner {
    explicit Joiner(asio::io_context& io) : socket(io) {}
    tcp::socket socket;
    std::string address;  // empty until accepted
    Clock::time_point hello_deadline;
    wire::HelloFrame frame{};
    wire::Word key_length{};
    Blob key;
    wire::Word port{};      // after the key, from a rank with children (to rank 0 only)
    bool answered = false;  // a verdict went back: no other word is owed
    bool counted = false;   // its refusal is logged and counted already
    bool listed = false;    // in `pending`, at `place`
    std::list<std::shared_ptr<Joiner>>::iterator place;
  };
  using JoinerPtr = std::shared_ptr<Joiner>;

  // A link of the star or the tree: rank 0's connection to a rank that
  // joined, a rank's to rank 0, a child's to its parent, a parent's to a child.
  struct Member {
    tcp::socket socket;
    std::uint32_t rank;    // the rank at the other end
    std::string name;      // "rank r at address"
    std::uint16_t children_port = 0;  // rank 0: where this rank listens for its children
    bool sending = false;  // a frame is on its way: nothing may cut into it
  };

  explicit Impl(const Options& o)
      : options(o),
        where(o.host + ":" + std::to_string(o.port)),
        strangers([this](const std::string& l) { say(l); }, prefix(), "connection(s)"),
        claims([this](const std::string& l) { say(l); }, prefix(), "conflicting claim(s)") {}

  Options options;
  std::string where;  // where this rank listens (rank 0: as configured until bound)
  asio::io_context io;  // before the sockets and timers: they must go first
  // Emplaced by listen() only: the first socket brings up the reactor and its
  // descriptors, which a job of one never needs.
  std::optional<tcp::acceptor> acceptor;
  std::optional<asio::ip::address> local;  // Options::local_host, parsed
  std::optional<asio::steady_timer> hello_timer;   // the oldest pending connection's hello deadline
  std::optional<asio::steady_timer> accept_timer;  // the next accept after a shortage
  bool hello_timer_armed = false;
  std::uint16_t bound_port = 0;
  Clock::time_point listen_deadline;
  // The star. Rank 0: one per rank that joined, filled as they come, never
  // by size; others: rank 0 alone, at 0.
  std::map<std::uint32_t, Member> members;
  // The tree, besides the star: the link to a parent other than rank 0, and
  // a rank other than 0's links to its children (rank 0's are in `members`).
  std::optional<Member> parent;
  std::map<std::uint32_t, Member> children;
  std::list<JoinerPtr> pending;         // while listening: oldest first
  std::optional<error_code> shortage;   // accept()'s last shortage, for a timeout's message
  RefusalLog strangers;                 // connections that are no rank of the job
  RefusalLog claims;                    // second claims of a taken rank
  Listing refusals;                     // "peer A: why", for a timeout's message
  std::optional<std::string> failure;   // the first error of the running operations
  bool broken = false;                  // a failure closed every socket
  std::uint64_t bytes_sent = 0;         // every byte written to a socket
  // While a rank reads the table from its parent, rank 0's notice, if any.
  bool watching_root = false;
  wire::Word root_word{};
  std::string root_reason;

  static bool is_closed(const error_code& ec) {
    return ec == asio::error::eof || ec == asio::error::connection_reset || ec == asio::error::broken_pipe;
  }

  // every rank (bootstrap.cpp)
  std::string prefix() const { return "bootstrap: rank " + std::to_string(options.rank) + ": "; }
  void say(const std::string& line) const;
  void fail(const std::string& problem, const std::string& who, const std::string& step);
  [[noreturn]] void fail_now(const std::string& problem, const std::string& who, const std::string& step);
  bool completed(const error_code& ec, const std::string& who, const std::string& step);
  void run(Clock::time_point deadline, const std::function<bool()>& done,
           const std::function<std::string()>& waiting_for);
  [[noreturn]] void abort();
  void close_everything();
  void drain() noexcept;

  // listening: rank 0 for the job, a parent for its children (bootstrap_listener.cpp)
  std::map<std::uint32_t, Member>& joined() { return options.rank == 0 ? members : children; }
  const std::map<std::uint32_t, Member>& joined() const { return options.rank == 0 ? members : children; }
  std::uint32_t first_expected() const;
  std::uint32_t end_expected() const;
  void check_descriptor_limit() const;
  void listen(Clock::time_point deadline);
  void serve(Clock::time_point deadline);
  void open_acceptor(const tcp::endpoint& local);
  tcp::endpoint bind_endpoint();
  bool send_now(tcp::socket& s, std::span<const std::byte> bytes);
  void last_word(tcp::socket& s, std::span<const std::byte> bytes);
  void stop_listening(const std::string& why);
  void accept_next();
  void on_accepted(const JoinerPtr& j);
  void on_accept_error(const error_code& ec);
  void arm_hello_timer();
  void on_hello_deadline();
  void drop(Joiner& j, const std::string& why);
  void shed(Joiner& j, const std::string& why);
  void count_refusal(Joiner& j, const std::string& why);
  void forget(Joiner& j);
  void read_hello(const JoinerPtr& j);
  void read_key(const JoinerPtr& j);
  void read_port(const JoinerPtr& j, std::uint32_t rank);
  void refuse(const JoinerPtr& j, wire::Verdict verdict, const std::string& problem);
  void refuse_claim(const JoinerPtr& j, std::uint32_t rank);
  void answer_and_linger(const JoinerPtr& j, wire::Verdict verdict);
  void discard_until_closed(const JoinerPtr& j);
  void on_hello(const JoinerPtr& j);
  void take(const JoinerPtr& j, std::uint32_t rank, std::uint16_t children_port);
  wire::Verdict check(const wire::Hello& h, std::string& problem) const;
  std::string joins_missing() const;
  void tell_failure(const std::string& message);

  // rank 0, the gather (bootstrap.cpp); a table from blobs (bootstrap_tree.cpp)
  static Table table_for(std::span<const std::byte> lengths);
  static Table pack(const std::vector<Blob>& all);
  Table gather(std::span<const std::byte> mine, Clock::time_point deadline);
  std::string ranks_missing(const std::vector<bool>& have, const std::string& step) const;

  // the other ranks, connecting to a listener (bootstrap.cpp)
  Member& root() { return members.at(0); }
  void connect(Clock::time_point deadline);
  void join(Member& peer, const std::vector<tcp::endpoint>& endpoints, Clock::time_point deadline);
  bool join_once(Member& peer, const std::vector<tcp::endpoint>& endpoints, Clock::time_point deadline,
                 std::string& last);
  void start_connect(Member& peer, const std::vector<tcp::endpoint>& endpoints, std::optional<error_code>& result);
  bool greet(Member& peer, Clock::time_point deadline, std::string& last);
  void check_answer(Member& peer, const wire::HelloFrame& frame, Clock::time_point deadline, const std::string& step);
  std::string read_reason(Member& peer, Clock::time_point deadline, const std::string& step);
  std::uint32_t read_length(Member& peer, std::size_t limit, const std::string& what, Clock::time_point deadline,
                            const std::string& step);
  std::uint32_t read_word(Member& peer, Clock::time_point deadline, const std::string& step);
  template <typename Start>
  error_code wait_one(Member& peer, Clock::time_point deadline, const std::string& step, Start start);
  void read_exact(Member& peer, asio::mutable_buffer buffer, Clock::time_point deadline, const std::string& step);
  void send_blob(std::span<const std::byte> mine, Clock::time_point deadline);
  [[noreturn]] void sender_failed(Member& peer, Clock::time_point deadline, const std::string& step);

  // the tree (bootstrap_tree.cpp)
  Member& upstream() { return parent ? *parent : root(); }
  std::vector<Member*> downstream();
  void open_children_acceptor();
  void tell_parents();
  void join_tree(Clock::time_point deadline);
  tcp::endpoint read_parent_address(Clock::time_point deadline);
  Table receive_table(std::span<const std::byte> mine, Clock::time_point deadline);
  void read_lengths(Member& from, std::span<std::byte> words, Clock::time_point deadline, const std::string& step);
  void watch_root(const std::string& step);
  void stop_watching_root(Clock::time_point deadline);
  void forward(const Table& table, Clock::time_point deadline);
};

// One operation on the socket to the peer, bounded by the deadline; its
// error, if any, is the caller's to judge.
template <typename Start>
error_code TcpBootstrap::Impl::wait_one(Member& peer, Clock::time_point deadline, const std::string& step,
                                        Start start) {
  std::optional<error_code> result;
  start([&result](const error_code& ec, std::size_t) { result = ec; });
  run(deadline, [&] { return result.has_value(); }, [&] { return peer.name + ", " + step; });
  return *result;
}

}  // namespace ami::bootstrap
