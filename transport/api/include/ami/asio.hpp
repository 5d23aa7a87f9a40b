// ami/asio.hpp — a context driven by a Boost.Asio io_context, sleeping when
// it has nothing to do (docs/DESIGN.md, "Event-driven progress").
//
//   boost::asio::io_context io;
//   ami::AsioDriver driver(io, client.context(0));
//   driver.start();
//   io.run();                       // from one thread, or from several
//
// The driver repeats: advance() until idle, arm(), and on ok an async_wait
// for readability on a duplicate of event_fd(); on busy it drains again.
// Every step runs on one strand, so with any number of threads running the
// io_context one thread at a time advances the context; it also holds the
// context's lock() while it advances or arms, so other threads may use the
// context under lock() too (then call signal(), or post() to it, so that the
// sleeping driver drains what they started). Callbacks run inside
// advance(), on the strand.
//
// Correct under Asio's edge-triggered epoll reactor: arm() leaves every
// source behind event_fd() quiet, so any later event is a fresh edge; an
// edge that comes between arm() and the wait being queued (another thread
// in the reactor may take it while no wait is queued) is caught by a look
// at the descriptor once the wait is queued, which then cancels the wait
// and drains again.
//
// A context that cannot sleep (arm() says not_supported: over libfabric
// without AMI_OFI_WAIT or on its shm provider, or
// a shm peer that could not take its eventfd) is advanced by a handler that
// posts itself again: it spins an io_context thread, as advance() would.
//
// Header-only; needs Boost.Asio (Debian: libboost-dev) in the include path.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/strand.hpp>
#include <cerrno>
#include <cstddef>
#include <functional>
#include <mutex>
#include <utility>

#include "ami/context.hpp"
#include "ami/status.hpp"

namespace ami {

class AsioDriver {
 public:
  using Executor = boost::asio::strand<boost::asio::io_context::executor_type>;

  // batch: advance() loops per call; rounds: calls before the driver yields
  // to the io_context's other handlers (it goes on in a posted handler).
  explicit AsioDriver(boost::asio::io_context& io, Context& context, std::size_t batch = 16,
                      std::size_t rounds = 64)
      : context_(context), strand_(boost::asio::make_strand(io)), descriptor_(strand_), batch_(batch),
        rounds_(rounds) {}
  AsioDriver(const AsioDriver&) = delete;
  AsioDriver& operator=(const AsioDriver&) = delete;
  // Destroy it once the io_context has stopped, or after stop() and the
  // io_context ran out of work: handlers in flight refer to it.
  ~AsioDriver() = default;

  // Starts driving the context; returns at once. invalid_argument when
  // batch or rounds is 0, or when it is started twice; the error arm()
  // gives when the context's event_fd() cannot be made.
  Status start() {
    if (batch_ == 0 || rounds_ == 0)
      return {StatusCode::invalid_argument, "AsioDriver: batch and rounds must be at least 1"};
    if (started_) return {StatusCode::invalid_argument, "AsioDriver::start: already started"};
    const int fd = context_.event_fd();
    if (fd < 0) {
      const Status s = context_.arm();  // says why
      return s.ok() || s == StatusCode::busy ? Status{StatusCode::device_error, "AsioDriver: no event_fd()"} : s;
    }
    const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) return {StatusCode::no_resource, "AsioDriver: dup of event_fd() failed"};
    boost::system::error_code ec;
    descriptor_.assign(copy, ec);  // (an epoll set: epoll takes it)
    if (ec) {
      ::close(copy);
      return {StatusCode::device_error, "AsioDriver: the io_context's reactor refused event_fd()"};
    }
    started_ = true;
    boost::asio::post(strand_, [this] { drain(); });
    return Status::success();
  }

  // Stops driving: the wait is cancelled, no handler is queued again, and
  // the io_context runs out of this driver's work. Thread-safe.
  void stop() {
    boost::asio::post(strand_, [this] {
      stopping_ = true;
      boost::system::error_code ignored;
      descriptor_.cancel(ignored);
    });
  }

  // Runs work(context) on the strand, under the context's lock, then lets
  // the driver drain what it started. Thread-safe: for sends from threads
  // other than the io_context's.
  template <typename Work>
  void post(Work work) {
    boost::asio::post(strand_, [this, work = std::move(work)]() mutable {
      {
        std::lock_guard lock(context_);
        work(context_);
      }
      context_.signal();
    });
  }

  // The strand every step runs on.
  const Executor& executor() const { return strand_; }
  // ok while driving; the error that stopped it otherwise (an arm() that
  // failed other than not_supported).
  Status status() const {
    std::lock_guard lock(status_lock_);
    return status_;
  }
  // Wake-ups (waits that completed) and times arm() said busy, for tests
  // and benchmarks. Read on the strand, or once the io_context stopped.
  std::size_t wakeups() const { return wakeups_; }
  std::size_t busy_arms() const { return busy_arms_; }

 private:
  // Advances until idle (at most rounds_ calls), then arms and sleeps.
  void drain() {
    if (stopping_) return;
    std::unique_lock lock(context_);
    for (std::size_t i = 0; i < rounds_; ++i) {
      if (context_.advance(batch_) != 0) continue;
      const Status s = context_.arm();
      if (s == StatusCode::busy) {
        ++busy_arms_;
        continue;
      }
      lock.unlock();
      if (s.ok()) return sleep();
      if (s == StatusCode::not_supported) return again();
      fail(s);
      return;
    }
    lock.unlock();
    again();  // still busy: let the io_context's other handlers run first
  }
  void again() {
    boost::asio::post(strand_, [this] { drain(); });
  }
  void sleep() {
    descriptor_.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                           boost::asio::bind_executor(strand_, [this](const boost::system::error_code& ec) {
                             if (!ec) ++wakeups_;
                             // (operation_aborted: cancelled by the look below, or by stop())
                             drain();
                           }));
    // An edge that came after arm() but before the wait was queued may have
    // been taken by a reactor with no wait to complete: look once more.
    pollfd p{descriptor_.native_handle(), POLLIN, 0};
    if (::poll(&p, 1, 0) > 0) {
      boost::system::error_code ignored;
      descriptor_.cancel(ignored);
    }
  }
  void fail(Status s) {
    std::lock_guard lock(status_lock_);
    status_ = s;
  }

  Context& context_;
  Executor strand_;
  boost::asio::posix::stream_descriptor descriptor_;
  std::size_t batch_;
  std::size_t rounds_;
  bool started_ = false;
  bool stopping_ = false;  // on the strand
  std::size_t wakeups_ = 0, busy_arms_ = 0;
  mutable std::mutex status_lock_;
  Status status_;
};

}  // namespace ami
