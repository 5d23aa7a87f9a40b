// client.cpp — a job's view from one task: configuration, bootstrap,
// registrations, the backends (through backend_set.hpp) and the contexts.
#include "ami/client.hpp"

#include <sys/mman.h>
#include <sys/random.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <unordered_map>

#include "address_blob.hpp"
#include "backend_set.hpp"
#include "ami/device/region_table.hpp"
#include "ami/error.hpp"
#include "bootstrap.hpp"
#include "core_config.hpp"
#include "job_bootstrap.hpp"
#include "memory_budget.hpp"
#include "reachability.hpp"
#include "context_impl.hpp"
#include "fork_guard.hpp"

namespace ami {

namespace {

std::uint64_t random_job_id() {
  std::random_device rd;
  return (std::uint64_t{rd()} << 32) ^ rd() ^ 1;  // never 0
}

std::string hostname() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

}  // namespace

// The Client is also its devices' PeerDirectory (ami/device/peer_directory.hpp):
// where a context asks about a task whose address it has not learnt.
struct Client::Impl final : device::PeerDirectory {
  explicit Impl(ClientOptions& o, std::unique_ptr<bootstrap::Bootstrap> b)
      : boot(std::move(b)), name(std::move(o.name)), config(std::move(o.config)), options(core::Options::from(config)),
        task(boot->rank()), size(boot->size()), regions(0, task, options.max_regions),
        backends(device::BackendSetup{task, size, o.contexts, config, regions, options.fifo_depth, 0, this}),
        joined(size, kUnknown) {
    regions.on_remove([this](std::uint32_t region) {
      std::lock_guard lock(registration_mutex);
      backends.deregister_region(region);
    });
  }

  void exchange_addresses(std::uint16_t contexts);
  bool choose_on_demand() const;
  std::string learn(std::uint32_t peer) override;
  void record(std::uint32_t peer, std::string why);
  Status register_region(RemoteKey& key, void* address, std::size_t length, LocalKeys& local, int shared_fd = -1);
  Status choose_atomic_domain(RemoteKey& key, const device::RegionKeys& keys);
  std::unique_ptr<detail::RegistrationCache> make_cache();

  // The process this Client belongs to (fork_guard.hpp).
  const std::uint32_t fork_generation = detail::arm_fork_guard();
  // First, so it goes last: a PMIx bootstrap keeps the launcher's session
  // open for the client's life.
  std::unique_ptr<bootstrap::Bootstrap> boot;
  std::string name;
  Config config;
  core::Options options;  // the core's settings, from config
  std::uint32_t task;
  std::uint32_t size;
  std::uint64_t job = 0;
  std::mutex registration_mutex;
  device::RegionTable regions;
  detail::BackendSet backends;  // after the regions: their registrations go first

  // What this task knows of each task's address: one byte each, so that a
  // job of a million tasks costs a megabyte here; the reasons only for the
  // tasks no backend reaches.
  enum : std::uint8_t { kUnknown, kReached, kApart };
  bool on_demand = false;  // addresses on first use (learn())
  bool spans_hosts = false;  // some task is on another host (the exchange at start, or the launcher)
  AddressBlob mine;        // this task's own, published
  std::mutex join_mutex;   // learn(): one task's address fetched and joined once
  std::vector<std::uint8_t> joined;
  std::unordered_map<std::uint32_t, std::string> apart;
  std::atomic<std::uint32_t> peers_joined{0};

  std::unique_ptr<detail::ConnectionWatch> connections;  // the bootstrap's, if it keeps any
  std::vector<std::unique_ptr<Context>> contexts;  // last: destroyed first
};

// On first use only when asked, or by default under a bootstrap that can
// fetch one rank's address alone, and only when every backend in use can
// join one peer while the contexts run.
bool Client::Impl::choose_on_demand() const {
  const bool possible = boot->fetches() && backends.connect_alone();
  switch (options.addresses) {
    case core::Addresses::start: return false;
    case core::Addresses::automatic: return possible;
    case core::Addresses::first_use:
      if (!boot->fetches())
        throw Error("Client: AMI_ADDRESSES=first_use needs a bootstrap that fetches one address alone (pmix); "
                    "this job's is " + std::string(boot->name()));
      if (!backends.connect_alone())
        throw Error("Client: AMI_ADDRESSES=first_use: a backend in use joins its peers only at start (ofi)");
      return true;
  }
  return false;
}

void Client::Impl::record(std::uint32_t peer, std::string why) {
  if (why.empty()) {
    joined[peer] = kReached;
    if (peer != task) peers_joined.fetch_add(1, std::memory_order_relaxed);
  } else {
    joined[peer] = kApart;
    apart[peer] = std::move(why);
  }
}

// Every task publishes its address; on first use, that is all (besides
// reading rank 0's, whose job id is the job's), and each peer is learnt by
// learn() when a context first needs it. Otherwise every task learns every
// other task's address, agrees on the job id (rank 0's), joins each peer
// through the first backend that joins the two, and all check that the job
// is whole.
void Client::Impl::exchange_addresses(std::uint16_t n) {
  mine = AddressBlob{.job = random_job_id(), .task = task, .contexts = n,
                     .pid = static_cast<std::uint32_t>(::getpid()), .boot_id = read_boot_id(),
                     .hostname = hostname()};
  backends.publish(mine);
  joined[task] = kReached;
  if (size == 1) {
    job = mine.job;
    regions.set_job(job);
    return;
  }
  on_demand = choose_on_demand();
  if (on_demand) {
    boot->publish(mine.encode());
    AddressBlob first;
    if (task == 0) first = mine;
    else if (Status s = AddressBlob::decode(boot->fetch(0), first); !s.ok())
      throw Error("bootstrap: task 0 sent a bad address: " + std::string(s.what()));
    job = first.job;
    regions.set_job(job);
    spans_hosts = boot->spans_hosts().value_or(false);
    return;
  }
  const std::vector<bootstrap::Blob> all = boot->allgather(mine.encode());
  std::vector<AddressBlob> table(all.size());
  for (std::uint32_t t = 0; t < all.size(); ++t) {
    Status s = AddressBlob::decode(all[t], table[t]);
    if (!s.ok()) throw Error("bootstrap: task " + std::to_string(t) + " sent a bad address: " + s.what());
    if (table[t].task != t)
      throw Error("bootstrap: task " + std::to_string(t) + " claims to be task " + std::to_string(table[t].task));
    if (table[t].contexts != n)
      throw Error("bootstrap: task " + std::to_string(t) + " has " + std::to_string(table[t].contexts) +
                  " contexts, this task " + std::to_string(n) + "; every task needs the same number");
  }
  job = table[0].job;
  regions.set_job(job);
  const std::vector<std::string> unreachable = backends.join(mine, table);
  // Every task has joined what it will; all learn which pairs are not
  // joined, and fail alike if the job is not whole.
  std::vector<detail::Unreachable> mine_missing;
  for (std::uint32_t t = 0; t < table.size(); ++t)
    if (!unreachable[t].empty()) mine_missing.push_back({t, unreachable[t]});
  std::vector<std::string> hosts;
  for (const AddressBlob& b : table) {
    hosts.push_back(b.hostname);
    spans_hosts = spans_hosts || b.hostname != mine.hostname || b.boot_id != mine.boot_id;
  }
  detail::check_reachability(boot->allgather(detail::encode_unreachable(mine_missing)), hosts,
                             options.reachability == core::Reachability::symmetric);
  for (std::uint32_t t = 0; t < table.size(); ++t)
    if (t != task) record(t, unreachable[t]);
  if (auto sockets = boot->peer_sockets(); !sockets.empty())
    connections = std::make_unique<detail::ConnectionWatch>(std::move(sockets), task, size);
}

// A task first needed: its address fetched, checked as the exchange at
// start checks every one, and joined. Whatever fails makes the task one no
// backend reaches, said once on stderr: the lanes to it then fail with
// unreachable, as at start the check would have failed the job.
std::string Client::Impl::learn(std::uint32_t peer) {
  if (peer >= size) return "task " + std::to_string(peer) + " is not in this job of " + std::to_string(size);
  std::lock_guard lock(join_mutex);
  if (joined[peer] == kReached) return {};
  if (joined[peer] == kApart) return apart[peer];
  std::string why;  // (kUnknown happens only on first use)
  try {
    AddressBlob blob;
    const Status s = AddressBlob::decode(boot->fetch(peer), blob);
    if (!s.ok()) why = "its address is malformed: " + std::string(s.what());
    else if (blob.task != peer) why = "its address claims to be task " + std::to_string(blob.task) + "'s";
    else if (blob.contexts != mine.contexts)
      why = "it has " + std::to_string(blob.contexts) + " contexts, this task " + std::to_string(mine.contexts) +
            "; every task needs the same number";
    else why = backends.join_one(mine, blob);
  } catch (const Error& e) {
    why = "its address cannot be fetched: " + std::string(e.what());
  }
  if (!why.empty())
    std::fprintf(stderr, "ami: task %u: no backend reaches task %u: %s\n", task, peer, why.c_str());
  record(peer, why);
  return why;
}

Client::Client(ClientOptions options) {
  const std::uint16_t most = detail::BackendSet::max_contexts(options.config);
  if (options.contexts == 0 || options.contexts > most)
    throw Error("Client: contexts must be 1.." + std::to_string(most));
  const std::uint16_t n = options.contexts;
  auto boot = bootstrap::open_job(options.job, options.config);
  // Before anything is allocated: settings that would take more memory than
  // the host has fail here, naming the setting, not as std::bad_alloc.
  check_memory_budget(options.config, n, boot->size());
  impl_ = std::make_unique<Impl>(options, std::move(boot));
  impl_->exchange_addresses(n);

  const Config& c = impl_->config;
  const protocol::AmEngine::Shape shape{impl_->size, n, protocol::Options::from(c)};
  const std::uint32_t fifo_depth = impl_->options.fifo_depth;
  for (std::uint16_t i = 0; i < n; ++i)
    impl_->contexts.push_back(std::unique_ptr<Context>(new Context(std::make_unique<detail::ContextImpl>(
        *this, i, impl_->backends, fifo_depth, shape, impl_->make_cache(), impl_->connections.get(),
        impl_->on_demand ? impl_.get() : nullptr, &impl_->regions))));
}

// A context's registration cache, registering through the client. Idle
// registrations are kept only where keeping them pins nothing (no backend
// in use pins them),
// unless AMI_RCACHE_IDLE says otherwise.
std::unique_ptr<detail::RegistrationCache> Client::Impl::make_cache() {
  detail::RegistrationCache::Limits limits;
  limits.max_entries = options.rcache_max_entries;
  limits.max_bytes = options.rcache_max_mb << 20;
  limits.idle = options.rcache_idle.value_or(backends.pins_registrations() ? 0 : 64);
  auto reg = [this](void* address, std::size_t length, RemoteKey& key, LocalKeys& local) {
    return register_region(key, address, length, local);
  };
  auto dereg = [this](std::uint32_t region) { regions.remove(region); };
  return std::make_unique<detail::RegistrationCache>(reg, dereg, limits,
                                                     static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)));
}

namespace {

// Contexts of destroyed clients: retired, kept so that a reference held
// past its client is still an object that answers with an error (a few
// bytes each, for the process's life).
std::mutex graveyard_mutex;
std::vector<std::unique_ptr<Context>> graveyard;

}  // namespace

Client::~Client() {
  if (!impl_) return;
  // A copy a fork left in a child (fork_guard.hpp): the backends, the
  // bootstrap and the registrations are the parent's, which still uses
  // them. Nothing is freed; the contexts stay objects that refuse.
  if (detail::in_forked_child(impl_->fork_generation)) {
    for (auto& c : impl_->contexts) c->retire();
    (void)impl_.release();
    return;
  }
  // The contexts go first, as they always did; their objects stay.
  std::lock_guard lock(graveyard_mutex);
  for (auto& c : impl_->contexts) {
    c->retire();
    graveyard.push_back(std::move(c));
  }
}

std::string make_job_key() {
  std::array<unsigned char, 16> bytes{};
  std::size_t have = 0;
  while (have < bytes.size()) {
    const ssize_t n = ::getrandom(bytes.data() + have, bytes.size() - have, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error("make_job_key: getrandom", errno);
    }
    have += static_cast<std::size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string key;
  for (unsigned char b : bytes) key += {kHex[b >> 4], kHex[b & 15]};
  return key;
}

std::vector<std::string_view> backend_names() {
  std::vector<std::string_view> out;
  for (const detail::RegisteredBackend& b : detail::registered_backends()) out.push_back(b.info.name);
  return out;
}

std::string describe_hardware() {
  std::string out;
  for (const detail::RegisteredBackend& b : detail::registered_backends())
    if (b.info.inventory != nullptr) out += b.info.inventory();
  return out;
}

const std::string& Client::name() const { return impl_->name; }
std::uint32_t Client::task() const { return impl_->task; }
std::uint32_t Client::size() const { return impl_->size; }
std::uint64_t Client::job() const { return impl_->job; }
std::string_view Client::bootstrap_name() const { return impl_->boot->name(); }
bool Client::addresses_on_demand() const { return impl_->on_demand; }
std::uint32_t Client::peers_joined() const { return impl_->peers_joined.load(std::memory_order_relaxed); }
std::uint16_t Client::context_count() const { return static_cast<std::uint16_t>(impl_->contexts.size()); }
Context& Client::context(std::uint16_t index) { return *impl_->contexts.at(index); }
const Config& Client::config() const { return impl_->config; }

std::string Client::describe_backends() const {
  const protocol::Options o = protocol::Options::from(impl_->config);
  std::string out = impl_->backends.describe();
  const std::string peers = std::to_string(peers_joined()) + " of " + std::to_string(impl_->size - 1) + " peer task(s)";
  out += impl_->on_demand ? "addresses: each fetched from the " + std::string(bootstrap_name()) +
                                " launcher when first needed; " + peers + " learnt so far\n"
                          : "addresses: every task's exchanged at start; " + peers + " joined\n";
  // Every lane above is one ring or one RC queue pair: it delivers in order.
  out += "fence: a message behind the earlier operations (every lane delivers in order; a lane that "
         "may reorder would be flushed instead)\n";
  out += "acks: batched, after " + std::to_string(o.ack_idle_threshold) + " idle advances or " +
         std::to_string(o.ack_max_unacked) + " unacked messages per peer; keepalive every " +
         std::to_string(o.keepalive_ms) + " ms\n";
  return out;
}

// A slot in the region table, and each backend's registration of it.
Status Client::Impl::register_region(RemoteKey& key, void* address, std::size_t length, LocalKeys& local,
                                     int shared_fd) {
  std::unique_lock lock(registration_mutex);
  Status s = regions.add(address, length, key);
  if (!s.ok()) return s;
  local = {};
  device::RegionKeys keys(key, local, shared_fd);
  s = backends.register_region(key.region, address, length, keys);
  if (s.ok()) s = choose_atomic_domain(key, keys);
  if (!s.ok()) {
    lock.unlock();  // remove() takes it again through the hook
    regions.remove(key.region);
    return s;
  }
  return s;
}

// AMI_ATOMIC_MODE (docs/DESIGN.md, "Remote atomics"): the key says which
// hardware the region's atomics go to, and a NIC-domain region keeps its
// key here for the owner's own share of them.
Status Client::Impl::choose_atomic_domain(RemoteKey& key, const device::RegionKeys& keys) {
  bool nic = false;
  switch (options.atomic_mode) {
    case core::AtomicMode::cpu: break;
    case core::AtomicMode::automatic: nic = keys.nic_atomics_offered() && spans_hosts; break;
    case core::AtomicMode::nic:
      if (!keys.nic_atomics_offered())
        return {StatusCode::not_supported,
                "register_memory: AMI_ATOMIC_MODE=nic, but no backend of this task has a NIC that does atomics "
                "(verbs with an atomic_cap other than NONE)"};
      nic = true;
      break;
  }
  if (nic) {
    key.atomics = AtomicDomain::nic;
    regions.set_nic_home(key.region, key);
  }
  return Status::success();
}

namespace {

// The most a shared mapping here can ever hold: this host's memory and swap.
std::uint64_t host_memory_bytes() {
  struct sysinfo si {};
  if (::sysinfo(&si) != 0) return std::numeric_limits<std::uint64_t>::max();
  const std::uint64_t unit = si.mem_unit == 0 ? 1 : si.mem_unit;
  return (std::uint64_t{si.totalram} + si.totalswap) * unit;
}

}  // namespace

Status Client::allocate_memory(std::size_t length, Memory& out) {
  if (detail::in_forked_child(impl_->fork_generation)) return detail::kForkedChild<"allocate_memory">;
  if (length == 0) return {StatusCode::invalid_argument, "allocate_memory: length is zero"};
  // A length near 2^64 would wrap the size below into one page.
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  if (length > std::numeric_limits<std::size_t>::max() - device::kSharedRegionPrefix - page)
    return {StatusCode::invalid_argument, "allocate_memory: length runs past the end of the address space"};
  // Pages come on first touch; a region larger than the host could ever
  // back would only fail there (SIGBUS, or the OOM killer).
  if (length > host_memory_bytes())
    return {StatusCode::no_resource, "allocate_memory: length is more than this host's memory and swap"};
  const std::size_t bytes = device::kSharedRegionPrefix + length;
  const int fd = ::memfd_create("ami-region", MFD_CLOEXEC);
  if (fd < 0) return {StatusCode::no_resource, "allocate_memory: memfd_create failed"};
  void* map = MAP_FAILED;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) == 0)
    map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    ::close(fd);
    return {StatusCode::no_resource, "allocate_memory: the shared mapping cannot be made"};
  }
  auto* data = static_cast<std::byte*>(map) + device::kSharedRegionPrefix;
  RemoteKey key;
  LocalKeys local;
  Status s = impl_->register_region(key, data, length, local, fd);
  if (!s.ok()) {
    ::munmap(map, bytes);
    ::close(fd);
    return s;
  }
  out = Memory(&impl_->regions, key.region, key, data, length, map, bytes, fd, local);
  return Status::success();
}

Status Client::register_memory(void* address, std::size_t length, Memory& out) {
  if (detail::in_forked_child(impl_->fork_generation)) return detail::kForkedChild<"register_memory">;
  if (address == nullptr && length != 0)
    return {StatusCode::invalid_argument, "register_memory: address is null but length is not zero"};
  if (length == 0) return {StatusCode::invalid_argument, "register_memory: length is zero"};
  if (reinterpret_cast<std::uintptr_t>(address) > std::numeric_limits<std::uintptr_t>::max() - length)
    return {StatusCode::invalid_argument, "register_memory: the range runs past the end of the address space"};
  RemoteKey key;
  LocalKeys local;
  Status s = impl_->register_region(key, address, length, local);
  if (!s.ok()) return s;
  out = Memory(&impl_->regions, key.region, key, address, length, local);
  return Status::success();
}

}  // namespace ami
