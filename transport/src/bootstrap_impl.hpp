// bootstrap_impl.hpp — what one TcpBootstrap is made of: its io_context, its
// sockets and the state of its running operations, and the steps that work
// on them. Two files define the steps: bootstrap_listener.cpp rank 0's
// listening (accepting, the connections that owe their hello, claims, the
// refusal logs, the failure notice), bootstrap.cpp the rest (running and
// failing, the connecting side, the exchanges). Internal.
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

  // Rank 0's log of what it refuses: the first few a line each, then only a
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

  // A connection rank 0 has accepted and not taken as a rank: it owes its
  // hello, or it was refused and rank 0 waits for it to close. Handlers hold
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
    bool answered = false;  // a verdict went back: no other word is owed
    bool counted = false;   // its refusal is logged and counted already
    bool listed = false;    // in `pending`, at `place`
    std::list<std::shared_ptr<Joiner>>::iterator place;
  };
  using JoinerPtr = std::shared_ptr<Joiner>;

  // Rank 0's connection to a rank that joined, or a rank's to rank 0.
  struct Member {
    tcp::socket socket;
    std::string name;      // "rank r at address"
    bool sending = false;  // a frame is on its way: nothing may cut into it
  };

  explicit Impl(const Options& o)
      : options(o),
        where(o.host + ":" + std::to_string(o.port)),
        strangers([this](const std::string& l) { say(l); }, prefix(), "connection(s)"),
        claims([this](const std::string& l) { say(l); }, prefix(), "conflicting claim(s)") {}

  Options options;
  std::string where;  // rank 0's address: as configured, or as bound once listening
  asio::io_context io;  // before the sockets and timers: they must go first
  // Emplaced by listen() only: the first socket brings up the reactor and its
  // descriptors, which a job of one never needs.
  std::optional<tcp::acceptor> acceptor;
  std::optional<asio::steady_timer> hello_timer;   // the oldest pending connection's hello deadline
  std::optional<asio::steady_timer> accept_timer;  // the next accept after a shortage
  bool hello_timer_armed = false;
  std::uint16_t bound_port = 0;
  Clock::time_point listen_deadline;
  // Rank 0: one per rank that joined, filled as they come, never by size;
  // others: rank 0 alone, at 0.
  std::map<std::uint32_t, Member> members;
  std::list<JoinerPtr> pending;         // rank 0, while listening: oldest first
  std::optional<error_code> shortage;   // rank 0: accept()'s last shortage, for a timeout's message
  RefusalLog strangers;                 // rank 0: connections that are no rank of the job
  RefusalLog claims;                    // rank 0: second claims of a taken rank
  Listing refusals;                     // rank 0: "peer A: why", for a timeout's message
  std::optional<std::string> failure;   // the first error of the running operations
  bool broken = false;                  // a failure closed every socket

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

  // rank 0, listening (bootstrap_listener.cpp)
  void check_descriptor_limit() const;
  void listen(Clock::time_point deadline);
  void open_acceptor();
  tcp::endpoint bind_endpoint();
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
  void refuse(const JoinerPtr& j, wire::Verdict verdict, const std::string& problem);
  void refuse_claim(const JoinerPtr& j, std::uint32_t rank);
  void answer_and_linger(const JoinerPtr& j, wire::Verdict verdict);
  void discard_until_closed(const JoinerPtr& j);
  void on_hello(const JoinerPtr& j);
  void take(const JoinerPtr& j, std::uint32_t rank);
  wire::Verdict check(const wire::Hello& h, std::string& problem) const;
  std::string joins_missing() const;
  void tell_failure(const std::string& message);

  // rank 0, the exchanges (bootstrap.cpp)
  std::vector<Blob> gather(std::span<const std::byte> mine, Clock::time_point deadline);
  void scatter(const std::vector<Blob>& all, Clock::time_point deadline);
  std::string ranks_missing(const std::vector<bool>& have, const std::string& step) const;

  // the other ranks (bootstrap.cpp)
  Member& root() { return members.at(0); }
  void connect(Clock::time_point deadline);
  bool join_once(const tcp::resolver::results_type& endpoints, Clock::time_point deadline, std::string& last);
  bool greet(Clock::time_point deadline, std::string& last);
  void check_answer(const wire::HelloFrame& frame, Clock::time_point deadline, const std::string& step);
  std::string read_reason(Clock::time_point deadline, const std::string& step);
  std::uint32_t read_length(std::size_t limit, const std::string& what, Clock::time_point deadline,
                            const std::string& step);
  template <typename Start>
  error_code wait_one(Clock::time_point deadline, const std::string& step, Start start);
  void read_exact(asio::mutable_buffer buffer, Clock::time_point deadline, const std::string& step);
  void send_blob(std::span<const std::byte> mine, Clock::time_point deadline);
  std::vector<Blob> exchange(std::span<const std::byte> mine, Clock::time_point deadline);
};

}  // namespace ami::bootstrap
