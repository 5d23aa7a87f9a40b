// context_impl.hpp — what a Context is made of: its devices (one per
// backend that serves it) and the protocol engine over them. Internal.
#pragma once

#include <memory>
#include <mutex>

#include "ami/context.hpp"
#include "protocol/eager/am_engine.hpp"
#include "shm_backend/shm_device.hpp"
#include "transport/self/self_device.hpp"

namespace ami::detail {

struct ContextImpl {
  ContextImpl(Client& client, std::uint16_t index, self::SelfDomain& self_domain,
              shm::ShmDomain& shm_domain, std::uint32_t fifo_depth, protocol::AmEngine::Shape shape)
      : client(client), index(index), self_device(self_domain, index, fifo_depth),
        shm_device(shm_domain, index, fifo_depth), engine(shape, stats) {
    engine.add_device(self_device);  // priority order: self, then shm
    engine.add_device(shm_device);
  }

  Client& client;
  std::uint16_t index;
  ContextStats stats;
  std::mutex mutex;
  // Devices before the engine: the engine holds their lanes and goes first.
  self::SelfDevice self_device;
  shm::ShmDevice shm_device;
  protocol::AmEngine engine;
};

}  // namespace ami::detail
