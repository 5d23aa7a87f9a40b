// ami/device/registrar.hpp — how a protocol engine gets memory registered
// for the length of one operation: the rendezvous registers a send buffer so
// its receiver can GET from it, and a receive buffer so it can be the target
// of a GET or a PUT.
//
// acquire() returns a registration covering at least [address, address +
// bytes): its remote key (for the peer) and local key (for the local side of
// a PUT or GET). Every successful acquire() is matched by one release() with
// the same Registration. Implementations may share one registration between
// overlapping acquisitions and keep it for later ones (a registration cache).
#pragma once

#include <cstdint>

#include "ami/memory.hpp"
#include "ami/status.hpp"

namespace ami::device {

struct Registration {
  RemoteKey key{};              // its range covers the acquired one
  LocalKeys local_keys{};       // by backend id
  std::uint32_t handle = 0;     // the registrar's own: pass back to release()
};

class Registrar {
 public:
  virtual Status acquire(const void* address, std::uint64_t bytes, Registration& out) = 0;
  virtual void release(const Registration& registration) = 0;

 protected:
  ~Registrar() = default;
};

}  // namespace ami::device
