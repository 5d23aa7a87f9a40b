// connection_watch.hpp — peers whose bootstrap connection closed, and the
// ends rank 0 passes on.
//
// The TCP bootstrap keeps its connections for the client's life: rank 0 one
// to every other rank, the others one to rank 0. A hang-up means the process
// at the other end ended (killed, crashed or done). Rank 0 sees every task
// end this way; the others see only rank 0 end, so rank 0 tells each of them
// of every other end it sees: a notice of 8 bytes, "GONE" and the task,
// written on the same connections. Without it a task that never had a lane
// to the dead one would never learn of it, and would wait for ever in a
// collective whose messages come through a member that failed.
//
// ConnectionWatch polls the connections — whichever context asks, at most
// every 10 ms — and records which tasks ended. It tells a context only that
// a task is gone; when to fail it is the context's call (see
// ContextImpl::check_connections: not before the peer's last packets are
// taken). Under PMIx there are no such connections, and nothing to watch.
//
// A sleeping context (docs/DESIGN.md, "Event-driven progress") has
// wake_fd() in its set: an epoll set of the connections still open, so
// that a hang-up or a notice wakes it; an end, once recorded, is also
// written to every context's eventfd (add_waker()), since the context that
// looked may not be the only one asleep.
#pragma once

#include <poll.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace ami::detail {

class ConnectionWatch {
 public:
  // sockets: (task, descriptor), still owned by the bootstrap; self: this
  // task, of tasks.
  ConnectionWatch(std::vector<std::pair<std::uint32_t, int>> sockets, std::uint32_t self, std::uint32_t tasks);
  ~ConnectionWatch();
  ConnectionWatch(const ConnectionWatch&) = delete;
  ConnectionWatch& operator=(const ConnectionWatch&) = delete;

  // Looks at the connections unless another thread is, or it looked less
  // than 10 ms ago.
  // now_please: without waiting out the 10 ms (a context woken by wake_fd()).
  void poll(bool now_please = false);
  int wake_fd() const { return epoll_; }
  // A connection has something to say (a hang-up or a notice).
  bool pending() const;
  // eventfds written at every end recorded (under the lock).
  void add_waker(int fd);
  void remove_waker(int fd);
  // How many tasks ended so far; gone(i) is the i-th of them.
  std::size_t count() const { return count_.load(std::memory_order_acquire); }
  std::uint32_t gone(std::size_t i) const;
  // Notices that named no task it could (not counted as an end).
  std::uint64_t bad_notices() const { return bad_notices_.load(std::memory_order_relaxed); }

  static constexpr std::uint32_t kNoticeMagic = 0x454E4F47;  // "GONE"
  static constexpr std::size_t kNoticeBytes = 8;

 private:
  struct Watched {
    std::uint32_t task;
    int fd;
    bool closed = false;
    std::array<unsigned char, kNoticeBytes> partial{};  // a notice read in part
    std::size_t have = 0;
  };
  bool read_notices(Watched& w);  // false once the connection ended
  void record(std::uint32_t task);
  void tell_others();  // rank 0: of ended_

  const std::uint32_t self_;
  mutable std::mutex lock_;
  std::vector<Watched> watched_;      // under lock_
  std::vector<bool> known_gone_;      // under lock_, by task
  std::vector<std::uint32_t> gone_;   // under lock_, in the order seen
  std::int64_t next_poll_ns_ = 0;     // under lock_
  std::vector<pollfd> fds_;           // under lock_: poll()'s scratch
  std::vector<Watched*> open_;        // under lock_: the connection of each of fds_
  std::vector<std::uint32_t> ended_;  // under lock_: the ends one poll() found
  std::atomic<std::size_t> count_{0};
  std::atomic<std::uint64_t> bad_notices_{0};
  int epoll_ = -1;             // the connections still open
  std::vector<int> wakers_;    // under lock_
};

}  // namespace ami::detail
