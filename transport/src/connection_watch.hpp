// connection_watch.hpp — peers whose bootstrap connection closed.
//
// The TCP bootstrap keeps its connections for the client's life: rank 0 one
// to every other rank, the others one to rank 0. Nothing travels on them
// after setup, so a hang-up means the process at the other end ended
// (killed, crashed or done). ConnectionWatch polls them — whichever context
// asks, at most every 10 ms — and records which tasks hung up. It tells a
// context only that a task is gone; when to fail it is the context's call
// (see ContextImpl::check_connections: not before the peer's last packets
// are taken). Under PMIx there are no such connections, and nothing to
// watch.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace ami::detail {

class ConnectionWatch {
 public:
  // sockets: (task, descriptor), still owned by the bootstrap.
  explicit ConnectionWatch(std::vector<std::pair<std::uint32_t, int>> sockets);

  // Looks at the connections unless another thread is, or it looked less
  // than 10 ms ago.
  void poll();
  // How many tasks hung up so far; gone(i) is the i-th of them.
  std::size_t count() const { return count_.load(std::memory_order_acquire); }
  std::uint32_t gone(std::size_t i) const;

 private:
  struct Watched {
    std::uint32_t task;
    int fd;
    bool closed = false;
  };
  mutable std::mutex lock_;
  std::vector<Watched> watched_;      // under lock_
  std::vector<std::uint32_t> gone_;   // under lock_, in the order seen
  std::int64_t next_poll_ns_ = 0;     // under lock_
  std::atomic<std::size_t> count_{0};
};

}  // namespace ami::detail
