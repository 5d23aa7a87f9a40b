// context_impl.hpp — what a Context is made of: its devices (one per
// backend that serves it) and the protocol engine over them. Internal.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "ami/context.hpp"
#include "connection_watch.hpp"
#include "protocol/eager/am_engine.hpp"
#include "registration_cache.hpp"
#include "shm_backend/shm_device.hpp"
#include "transport/self/self_device.hpp"
#include "verbs_backend/verbs_device.hpp"

namespace ami::detail {

struct ContextImpl {
  // verbs_domain: null when the task has no verbs backend. A backend that
  // reaches no peer task (use_shm, use_verbs false) is not advanced at all:
  // its progress would only ever find nothing.
  ContextImpl(Client& client, std::uint16_t index, self::SelfDomain& self_domain,
              shm::ShmDomain& shm_domain, verbs::VerbsDomain* verbs_domain, std::uint32_t fifo_depth,
              protocol::AmEngine::Shape shape, bool use_shm, bool use_verbs,
              std::unique_ptr<RegistrationCache> cache, ConnectionWatch* connections)
      : client(client), index(index), connections(connections), self_device(self_domain, index, fifo_depth),
        shm_device(shm_domain, index, fifo_depth), verbs_domain(verbs_domain),
        verbs_device(verbs_domain ? std::make_unique<verbs::VerbsDevice>(*verbs_domain, index, fifo_depth)
                                  : nullptr),
        cache(std::move(cache)), engine(shape, stats) {
    engine.set_registrar(this->cache.get());
    engine.add_device(self_device);  // priority order: self, shm, verbs
    if (use_shm) engine.add_device(shm_device);
    if (verbs_device && use_verbs) engine.add_device(*verbs_device);
  }

  // After each advance: a task whose bootstrap connection hung up fails
  // (every one of its endpoints) once it has been gone kGrace and one
  // whole check brought nothing more from it, so the packets it sent
  // before it ended are taken first, as on any other path.
  // Every 64th advance, or while a peer is suspect: the rest cost a test.
  void check_connections() {
    if (connections != nullptr && ((++checks & 63) == 0 || !suspects.empty())) look_at_connections();
  }
  void look_at_connections();

  Client& client;
  std::uint16_t index;
  ConnectionWatch* connections;  // null: nothing to watch (PMIx, a job of one)
  struct Suspect {
    std::uint32_t task;
    std::int64_t since_ns;  // when this context first heard it was gone
    std::uint64_t heard;    // packets from it at the last check
  };
  std::vector<Suspect> suspects;
  std::size_t connections_seen = 0;
  std::uint32_t checks = 0;
  ContextStats stats;
  std::mutex mutex;
  // Devices before the engine: the engine holds their lanes and goes first.
  self::SelfDevice self_device;
  shm::ShmDevice shm_device;
  verbs::VerbsDomain* verbs_domain;
  std::unique_ptr<verbs::VerbsDevice> verbs_device;
  // Registrations the engine makes for rendezvous buffers; released by the
  // engine before it goes, deregistered (if idle) before the devices go.
  std::unique_ptr<RegistrationCache> cache;
  protocol::AmEngine engine;
};

}  // namespace ami::detail
