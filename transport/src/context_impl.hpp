// context_impl.hpp — what a Context is made of: its devices (one per
// backend that reaches some task) and the protocol engine over them. Internal.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "ami/context.hpp"
#include "ami/device/device.hpp"
#include "backend_set.hpp"
#include "connection_watch.hpp"
#include "eager/am_engine.hpp"
#include "registration_cache.hpp"
#include "wake_set.hpp"

namespace ami::detail {

struct ContextImpl {
  // One device from each backend in use, in the registry's order (the
  // engine's priority order). When every address was learnt at start, a
  // backend that reaches no task gets none: its progress would only ever
  // find nothing. With addresses on demand (directory set) any backend may
  // come to reach a task, and the engine asks the directory about a task
  // no device reaches yet.
  ContextImpl(Client& client, std::uint16_t index, const BackendSet& backends, std::uint32_t fifo_depth,
              protocol::AmEngine::Shape shape, std::unique_ptr<RegistrationCache> cache,
              ConnectionWatch* connections, device::PeerDirectory* directory,
              const device::RegionTable* regions)
      : client(client), index(index), connections(connections), backends(backends),
        devices(make_devices(backends, index, fifo_depth, directory != nullptr)), cache(std::move(cache)),
        engine(shape, stats) {
    engine.set_registrar(this->cache.get());
    engine.set_directory(directory);
    engine.set_regions(regions);  // atomics that arrive as messages are checked against them
    for (const auto& d : devices) engine.add_device(*d);
  }
  ~ContextImpl() {
    if (connections != nullptr && wake.is_open()) connections->remove_waker(wake.signal_fd());
  }

  static std::vector<std::unique_ptr<device::Device>> make_devices(const BackendSet& backends,
                                                                   std::uint16_t index, std::uint32_t fifo_depth,
                                                                   bool on_demand) {
    std::vector<std::unique_ptr<device::Device>> out;
    for (device::Backend* b : backends.in_use())
      if (on_demand || b->tasks_reached() > 0) out.push_back(b->make_device(index, fifo_depth));
    return out;
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
  // The two halves of it: ends the watch recorded become suspects; a
  // suspect past its grace with nothing more from it fails.
  void take_ends();
  void judge_suspects();

  // Sleeping (context_sleep.cpp; docs/DESIGN.md, "Event-driven progress").
  Status open_wake();
  Status arm();
  WakeSet wake;
  // Set by a successful arm(), cleared by advance(): post() then wakes it.
  std::atomic<bool> sleeping{false};

  static constexpr std::int64_t kGrace = 50'000'000;  // ns a task is known gone before it fails

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
  const BackendSet& backends;  // the client's: outlives every context
  // Devices before the engine: the engine holds their lanes and goes first.
  std::vector<std::unique_ptr<device::Device>> devices;
  // Registrations the engine makes for rendezvous buffers; released by the
  // engine before it goes, deregistered (if idle) before the devices go.
  std::unique_ptr<RegistrationCache> cache;
  protocol::AmEngine engine;
};

}  // namespace ami::detail
