// ami/device/backend.hpp — how a backend plugs into a Client: its setup,
// once per task, beside the per-context Device of device.hpp.
//
// A Backend is a backend's share of one task (a domain: a segment, an RDMA
// port and its queues, a process's queues). The Client opens the backends
// AMI_BACKENDS names, in the registry's order (transport/src/backends.cpp,
// the only place that names them), publishes each one's address bytes as
// one entry of the task's address blob, and joins every peer task through
// the first backend that joins the pair. Each context then gets one Device
// from every backend that reaches some task (make_device), in the same
// order, and the first device that reaches a peer carries it.
//
// Which backend joins a pair is decided by both tasks alike, from what both
// published: joins() must give the same answer on either side. Only the
// first backend whose joins() says yes is asked to connect(); one that
// fails leaves the peer unreachable (its reason goes into the job's
// reachability check), and no later backend is tried, since the peer would
// not try it either.
//
// Setup calls (everything but make_device's Device) are made by the Client
// under its own serialisation. When the job's addresses are fetched on first
// use (docs/DESIGN.md, "Addresses on demand"), connect() is one of them too,
// but it may come at any time after the contexts exist, from any context's
// thread, while the data path runs: a backend that allows that says so by
// connects_alone(), and publishes what connect() learnt to its devices with
// release/acquire.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ami/callback.hpp"
#include "ami/config.hpp"
#include "ami/device/device.hpp"
#include "ami/device/peer_directory.hpp"
#include "ami/device/reception_queue.hpp"
#include "ami/device/region_table.hpp"
#include "ami/status.hpp"

namespace ami::device {

// What a backend is opened with.
struct BackendSetup {
  std::uint32_t task = 0;
  std::uint32_t tasks = 0;
  std::uint16_t contexts = 0;
  const Config& config;
  // Every registration of the task; remote keys are checked against it.
  RegionTable& regions;
  // Slots in each lane's injection FIFO (the core's AMI_FIFO_DEPTH): the
  // most descriptors a lane has in flight.
  std::uint32_t fifo_depth = 0;
  // The registry's id of the backend opened: its entry in a RemoteKey and
  // its index in LocalKeys (memory.hpp).
  std::uint8_t id = 0;
  // The Client's, for a device hearing from a task not learnt yet; never
  // null once the Client has opened its backends.
  PeerDirectory* directory = nullptr;
};

// What every task publishes besides its backends' entries.
struct TaskFacts {
  std::uint32_t task = 0;
  std::uint32_t pid = 0;
  std::uint16_t contexts = 0;
  std::string_view boot_id;  // "" when unknown: then no two tasks count as one host
  std::string_view hostname;
};

// allocate_memory() reserves this many bytes of its memfd in front of the
// region, for a backend that shares the mapping with peers (its header).
inline constexpr std::size_t kSharedRegionPrefix = 4096;

// A registration as one backend sees it, and where it writes its keys: its
// entry of the RemoteKey (bytes for the peers) and its LocalKeys word.
class RegionKeys {
 public:
  RegionKeys(RemoteKey& remote, LocalKeys& local, int shared_fd = -1)
      : remote_(remote), local_(local), shared_fd_(shared_fd) {}

  // The backend being asked (BackendSet sets it before each call).
  void set_backend(std::uint8_t id) { backend_ = id; }
  // What names the region: job, task, region, generation, range.
  const RemoteKey& key() const { return remote_; }
  // allocate_memory(): the memfd holding the region, which starts
  // kSharedRegionPrefix bytes into it; -1 for memory only registered.
  int shared_fd() const { return shared_fd_; }

  // The backend's bytes for the peers (at most KeyEntry::kRoom), once.
  Status set_remote(std::span<const std::byte> bytes) { return remote_.add_entry(backend_, bytes); }
  void set_local(std::uint64_t word) { local_[backend_] = word; }
  // The backend's NIC can do atomics on the region itself (verbs: the
  // region is registered for remote atomics on a device whose atomic_cap is
  // not NONE, and the backend has a lane to its own context to do the
  // owner's share): the Client may then make the region's atomic domain
  // nic (AMI_ATOMIC_MODE).
  void offer_nic_atomics() { nic_atomics_ = true; }
  bool nic_atomics_offered() const { return nic_atomics_; }

 private:
  RemoteKey& remote_;
  LocalKeys& local_;
  int shared_fd_;
  std::uint8_t backend_ = 0;
  bool nic_atomics_ = false;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;

  // The bytes of this task's entry in its address blob.
  virtual std::vector<std::byte> local_address() const { return {}; }

  // Does this backend join this task (mine) and the peer? peer_entry is the
  // peer's entry for this backend, nullptr when the peer does not use it.
  // Judged only from what both tasks published, so that the peer, asking
  // its own backend the same, answers alike. When not, why says why in a
  // few words ("it is on another host"), or stays empty when there is
  // nothing worth saying (a backend that only ever reaches its own task).
  virtual bool joins(const TaskFacts& mine, const TaskFacts& peer, const std::vector<std::byte>* peer_entry,
                     std::string& why) const = 0;

  // Joins the peer, given its entry (joins() said yes). Returns "" when the
  // peer is reached, or why not ("its shared-memory segment cannot be
  // used: ..."): the reachability check reports it. Throws ami::Error for a
  // failure that must end the Client's creation at once (a peer left
  // waiting in a connection handshake). At setup it is called for the
  // peers in increasing task order, the same on every task; on demand, for
  // one peer when first needed (then a throw fails that peer only).
  virtual std::string connect(const TaskFacts& peer, std::span<const std::byte> peer_entry) = 0;

  // May connect() be called for one peer alone, at any time, while the
  // contexts run (addresses on demand)? No for a backend that joins peers
  // collectively at setup, or whose devices could not take a peer added
  // under them.
  virtual bool connects_alone() const { return true; }

  // Does it reach that task? tasks_reached(): how many it reaches; the own
  // task counts for a backend that serves it. A backend that reaches none
  // gets no device in any context: its progress would only ever find
  // nothing.
  virtual bool reaches(std::uint32_t task) const = 0;
  virtual std::uint32_t tasks_reached() const = 0;

  // Memory the task registers, under its slot in the region table (what
  // the NIC must know of, for one): the backend writes its key bytes into
  // keys, and later reads its own entry of a RemoteKey it is asked to use,
  // refusing one without it. Nothing to do by default. A region that
  // registered with some backends and failed with another is deregistered
  // from all of them; deregister_region() of one it does not hold does
  // nothing.
  virtual Status register_region(std::uint32_t region, void* address, std::size_t length, RegionKeys& keys) {
    (void)region;
    (void)address;
    (void)length;
    (void)keys;
    return Status::success();
  }
  virtual void deregister_region(std::uint32_t region) { (void)region; }
  // Does a registration pin memory (so that one kept idle by a context's
  // registration cache would keep pages the process freed)?
  virtual bool pins_registrations() const { return false; }

  // One line for ami_info: "<name>: what it is and how it is set up".
  virtual std::string describe() const = 0;
  // perftest's banner for the lane from context to peer, one " name : value"
  // line per field.
  virtual std::string describe_lane(std::uint16_t context, Endpoint peer) const {
    (void)context;
    (void)peer;
    return " Lane            : " + std::string(name()) + "\n";
  }

  // Context's share: one Device per context, made after connect() ran for
  // every peer. Throws ami::Error.
  virtual std::unique_ptr<Device> make_device(std::uint16_t context, std::uint32_t fifo_depth) = 0;
};

// One group of settings whose product is memory a backend allocates, for
// the check against the host's memory before anything is allocated
// (transport/src/memory_budget.hpp).
struct MemoryDemand {
  std::string what;     // "self queues: AMI_SELF_QUEUE_DEPTH x AMI_SELF_CELL_SIZE x contexts"
  std::string figures;  // "65536 x 4194304 x 1"
  std::uint64_t bytes;  // saturates at the largest uint64_t

  // Saturating: a product past 2^64 is "too much", never a small wrapped number.
  static std::uint64_t times(std::uint64_t a, std::uint64_t b) {
    std::uint64_t out = 0;
    return __builtin_mul_overflow(a, b, &out) ? ~std::uint64_t{0} : out;
  }

  // One reception queue per context, of the depth and cell size two rows
  // set: "<label>: DEPTH x CELL x contexts".
  static MemoryDemand queues(std::string_view label, const Config& c, ParamName depth, ParamName cell,
                             std::uint16_t contexts) {
    const std::uint64_t d = c.number(depth), b = c.number(cell);
    return {std::string(label) + ": " + std::string(depth.name()) + " x " + std::string(cell.name()) + " x contexts",
            std::to_string(d) + " x " + std::to_string(b) + " x " + std::to_string(contexts),
            times(ReceptionQueue::bytes_needed(static_cast<std::uint32_t>(d), static_cast<std::uint32_t>(b)),
                  contexts)};
  }
};

// A backend as the registry lists it, before it is opened.
struct BackendInfo {
  std::string_view name;
  // Its tunables (config_table.hpp), declared next to its code: part of
  // every Config, printed by ami_info -c under its name.
  std::span<const ParamSpec> params;
  // The most contexts a task may have with this backend in use.
  std::uint16_t max_contexts = 0xFFFF;
  // Can this host have it at all (an active RDMA port)? why says what is
  // missing. Holds no resources. Asked just before open(), with what open()
  // gets (a library that reads the job's size once, at its first call,
  // learns it here). nullptr: always.
  bool (*available)(const BackendSetup& setup, std::string* why) = nullptr;
  // Sets it up for the task. Throws ami::Error naming what failed.
  std::unique_ptr<Backend> (*open)(const BackendSetup& setup) = nullptr;
  // What it finds on this host without opening it, one line each
  // ("verbs device: mlx5_0"); "" or nullptr for nothing to say.
  std::string (*inventory)() = nullptr;
  // The memory its settings make it allocate for a task of that many
  // contexts (what the peers' setup maps is not counted); nullptr: none
  // worth counting.
  std::vector<MemoryDemand> (*memory)(const Config& config, std::uint16_t contexts) = nullptr;
};

}  // namespace ami::device
