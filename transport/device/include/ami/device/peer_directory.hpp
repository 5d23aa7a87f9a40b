// ami/device/peer_directory.hpp — how a device or the engine asks the
// Client about a task whose address this task has not learnt yet.
#pragma once

#include <cstdint>
#include <string>

namespace ami::device {

// Where a device asks about a task it has not heard of: one of the job,
// whose address this task has not learnt yet because nothing asked for it
// (addresses on demand). learn() fetches the task's address and joins it
// through the backend that joins the two (connect()), once for the whole
// task, and returns "" when some backend now reaches it, or why none does.
// Thread-safe; it blocks while the address is fetched (the bootstrap's
// timeout at most), so a device calls it only for a message it cannot
// otherwise take (a connection request from an unknown task). Where every
// address was learnt at setup it answers at once.
class PeerDirectory {
 public:
  virtual std::string learn(std::uint32_t task) = 0;

 protected:
  ~PeerDirectory() = default;
};

}  // namespace ami::device
