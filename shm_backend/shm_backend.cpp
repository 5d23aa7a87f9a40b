// shm_backend/shm_backend.cpp — the shm backend's setup: the domain from
// the configuration, the address entry, learning the peers of this host.
// A peer's segment is not touched here: a context maps it the first time
// it needs it (ShmDomain::map). The per-message path is shm_datapath.cpp
// and shm_rdma.cpp.
#include "shm_backend.hpp"

#include <atomic>
#include <cstring>
#include <unordered_map>

#include "shared_region.hpp"
#include "shm_device.hpp"

namespace ami::shm {

namespace {

class ShmBackend final : public device::Backend {
 public:
  explicit ShmBackend(const device::BackendSetup& s)
      : domain_(s.task, s.tasks, s.contexts, Options::from(s.config), s.regions, s.id),
        ring_(s.config.text(Param("AMI_SHM_RING_DEPTH")) + " x " + s.config.text(Param("AMI_SHM_CELL_SIZE")) + " B") {
    domain_.set_directory(s.directory);
  }

  std::string_view name() const override { return "shm"; }

  // The segment's descriptor, a 32-bit integer.
  std::vector<std::byte> local_address() const override {
    const std::int32_t fd = domain_.segment_fd();
    std::vector<std::byte> bytes(sizeof fd);
    std::memcpy(bytes.data(), &fd, sizeof fd);
    return bytes;
  }

  // Both use shm and share a host (a boot id both could read).
  bool joins(const device::TaskFacts& mine, const device::TaskFacts& peer, const std::vector<std::byte>* entry,
             std::string& why) const override {
    if (mine.boot_id.empty() || peer.boot_id != mine.boot_id) {
      why = "it is on another host";
      return false;
    }
    if (entry == nullptr) {
      why = "AMI_BACKENDS at task " + std::to_string(peer.task) + " leaves out shm";
      return false;
    }
    return true;
  }

  // Learns the peer: what can be checked without touching it is checked
  // here, so a malformed address is refused at setup. Its segment is mapped
  // on first use; a segment that cannot be mapped then fails the lanes to
  // the peer, not the job.
  std::string connect(const device::TaskFacts& peer, std::span<const std::byte> entry) override {
    std::int32_t fd = -1;
    if (entry.size() == sizeof fd) std::memcpy(&fd, entry.data(), sizeof fd);
    if (fd < 0 || peer.pid == 0) return "its shared-memory segment cannot be used: its address names no segment";
    Status s = domain_.learn({peer.task, peer.pid, fd, peer.contexts});
    if (!s.ok()) return "its shared-memory segment cannot be used: " + to_string(s);
    return {};
  }

  // Every region gets shm's entry; one from allocate_memory() gets its
  // header too, so that peers can map it and copy without CMA.
  Status register_region(std::uint32_t region, void* address, std::size_t length,
                         device::RegionKeys& keys) override {
    std::uint32_t shared_fd = 0;
    if (keys.shared_fd() >= 0) {
      const RemoteKey& k = keys.key();
      auto* h = reinterpret_cast<SharedRegionHeader*>(static_cast<std::byte*>(address) - SharedRegionHeader::kBytes);
      *h = SharedRegionHeader{SharedRegionHeader::kMagic, k.job, k.task, k.region, k.generation, 0, length};
      headers_[region] = h;
      shared_fd = static_cast<std::uint32_t>(keys.shared_fd()) + 1;
    }
    std::byte entry[kEntryBytes];
    encode_entry(shared_fd, entry);
    return keys.set_remote(entry);
  }

  // Peers check the header's generation before each copy: from here on
  // they refuse.
  void deregister_region(std::uint32_t region) override {
    const auto it = headers_.find(region);
    if (it == headers_.end()) return;
    std::atomic_ref<std::uint32_t>(it->second->generation).store(0, std::memory_order_release);
    headers_.erase(it);
  }

  bool reaches(std::uint32_t task) const override { return domain_.reaches(task); }
  std::uint32_t tasks_reached() const override { return domain_.peers_known(); }

  // "shm: 3 peer task(s) on this host, 1 segment(s) mapped, ring ...": the
  // peers learnt at setup, and those some context has used so far.
  std::string describe() const override {
    return "shm: " + std::to_string(domain_.peers_known()) + " peer task(s) on this host, " +
           std::to_string(domain_.segments_mapped()) + " segment(s) mapped, ring " + ring_ + ", PUT/GET by " +
           std::string(domain_.rdma_mode());
  }

  std::unique_ptr<device::Device> make_device(std::uint16_t context, std::uint32_t fifo_depth) override {
    return std::make_unique<ShmDevice>(domain_, context, fifo_depth);
  }

 private:
  ShmDomain domain_;
  std::string ring_;  // "depth x cell B", for describe()
  std::unordered_map<std::uint32_t, SharedRegionHeader*> headers_;  // allocate_memory()'s regions, by number
};

// The own segment's rings (the peers' segments are mapped, not allocated).
std::vector<device::MemoryDemand> memory(const Config& c, std::uint16_t contexts) {
  return {device::MemoryDemand::queues("shared-memory rings", c, Param("AMI_SHM_RING_DEPTH"),
                                       Param("AMI_SHM_CELL_SIZE"), contexts)};
}

}  // namespace

const device::BackendInfo& backend_info() {
  static const device::BackendInfo info{
      .name = "shm",
      .params = kParams,
      .max_contexts = kMaxContexts,
      .open = [](const device::BackendSetup& s) -> std::unique_ptr<device::Backend> {
        return std::make_unique<ShmBackend>(s);
      },
      .memory = memory,
  };
  return info;
}

}  // namespace ami::shm
