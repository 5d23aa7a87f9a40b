// fabric_backend/ofi_backend.cpp — the libfabric backend's setup: options
// from the configuration, the fabric, joining peers, registering memory.
// The fabric itself is ofi_fabric.cpp; the per-message path ofi_datapath.cpp.
#include "fabric_backend.hpp"

#include <rdma/fi_domain.h>

#include <cstring>

#include "ami/device/descriptor.hpp"
#include "ami/error.hpp"
#include "ofi_config.hpp"
#include "ofi_device.hpp"
#include "ofi_fabric.hpp"

namespace ami::ofi {

static_assert(Param("AMI_OFI_PACKET_SIZE").spec().min >= device::kPacketInlineBytes + kHeaderBytes,
              "an ofi packet must hold a descriptor's inline bytes");

namespace {

class OfiBackend final : public device::Backend {
 public:
  explicit OfiBackend(const device::BackendSetup& s)
      : fabric_(s.task, s.tasks, s.contexts, OfiOptions::from(s.config), s.id) {}

  std::string_view name() const override { return "ofi"; }
  std::vector<std::byte> local_address() const override { return fabric_.local_address(); }

  // Both use the same provider; the shm provider joins only tasks of one host.
  bool joins(const device::TaskFacts& mine, const device::TaskFacts& peer, const std::vector<std::byte>* entry,
             std::string& why) const override {
    if (entry == nullptr) {
      why = "ofi is not in use at task " + std::to_string(peer.task);
      return false;
    }
    const std::string provider = OfiFabric::provider_of(*entry);
    if (provider != fabric_.facts().name) {
      why = "task " + std::to_string(peer.task) + " uses libfabric provider '" + provider + "', this one '" +
            fabric_.facts().name + "'";
      return false;
    }
    if (provider == "shm" && (mine.boot_id.empty() || mine.boot_id != peer.boot_id)) {
      why = "the ofi shm provider reaches only this host";
      return false;
    }
    return true;
  }

  std::string connect(const device::TaskFacts& peer, std::span<const std::byte> entry) override {
    Status s = fabric_.connect(peer.task, entry);
    if (!s.ok()) return std::string(s.what());
    return {};
  }
  // connect() inserts the peer into every context's address vector, which
  // under FI_THREAD_COMPLETION only the context's own thread may touch:
  // peers are joined at setup.
  bool connects_alone() const override { return false; }

  bool reaches(std::uint32_t task) const override { return fabric_.connected(task); }
  std::uint32_t tasks_reached() const override { return fabric_.peers_connected(); }

  Status register_region(std::uint32_t region, void* address, std::size_t length,
                         device::RegionKeys& keys) override {
    std::uint64_t key = 0;
    void* desc = nullptr;
    Status s = fabric_.register_region(region, address, length, key, desc);
    if (!s.ok()) return s;
    keys.set_local(reinterpret_cast<std::uint64_t>(desc));
    std::byte bytes[sizeof key];
    std::memcpy(bytes, &key, sizeof key);
    return keys.set_remote(bytes);
  }
  void deregister_region(std::uint32_t region) override { fabric_.deregister_region(region); }
  // A provider may pin what it registers (verbs, efa): a cached registration
  // of freed pages would point it at the old ones.
  bool pins_registrations() const override { return true; }

  std::string describe() const override {
    return fabric_.describe() + ", " + std::to_string(fabric_.peers_connected()) + " peer task(s)";
  }
  std::string describe_lane(std::uint16_t context, Endpoint peer) const override {
    return " Lane            : ofi (" + fabric_.facts().name + "), context " + std::to_string(context) +
           " to task " + std::to_string(peer.task) + " context " + std::to_string(peer.context) + "\n" +
           " Max packet      : " + std::to_string(fabric_.max_packet()) + " B\n" +
           " Inject          : " + std::to_string(fabric_.facts().inject) + " B\n";
  }

  std::unique_ptr<device::Device> make_device(std::uint16_t context, std::uint32_t fifo_depth) override {
    return std::make_unique<OfiDevice>(fabric_, context, fifo_depth);
  }

 private:
  OfiFabric fabric_;
};

// Each context's multi-receive buffers and its rescue receive's packet
// (post_rescue(), registered with them), and its staging packets, a
// packet each, where bundles need them (AMI_OFI_BUNDLE above 1; a provider
// asking for FI_MR_LOCAL needs them too, and alone is left out).
std::vector<device::MemoryDemand> memory(const Config& c, std::uint16_t contexts) {
  using device::MemoryDemand;
  const OfiOptions options = OfiOptions::from(c);
  const std::uint64_t n = options.recv_buffers, b = OfiFabric::recv_buffer_bytes_bound(options);
  const std::uint64_t rescue = std::uint64_t{OfiFabric::packet_bytes_bound(options)} + kHeadroom + kHeaderBytes;
  std::vector<MemoryDemand> out{
      {"ofi receive buffers: AMI_OFI_RECV_BUFFERS x AMI_OFI_RECV_BUFFER_SIZE x contexts",
       std::to_string(n) + " x " + std::to_string(b) + " x " + std::to_string(contexts),
       MemoryDemand::times(MemoryDemand::times(n, b), contexts)},
      {"ofi rescue receive: one packet (AMI_OFI_PACKET_SIZE, headers included) x contexts",
       std::to_string(rescue) + " x " + std::to_string(contexts), MemoryDemand::times(rescue, contexts)}};
  if (c.number(Param("AMI_OFI_BUNDLE")) > 1) {
    const std::uint64_t staging = c.number(Param("AMI_OFI_STAGING")), bundle = rescue;  // (a packet at most)
    out.push_back({"ofi staging packets for bundles: AMI_OFI_STAGING x one packet x contexts",
                   std::to_string(staging) + " x " + std::to_string(bundle) + " x " + std::to_string(contexts),
                   MemoryDemand::times(MemoryDemand::times(staging, bundle), contexts)});
  }
  return out;
}

const device::BackendInfo& module_info() {
  static const device::BackendInfo info{
      .name = "ofi",
      .params = kParams,
      .max_contexts = static_cast<std::uint16_t>(kMaxContexts),
      .available = [](const device::BackendSetup& s, std::string* why) {
        OfiFabric::set_universe(s.tasks);
        return OfiFabric::available(OfiOptions::from(s.config), why);
      },
      .open = [](const device::BackendSetup& s) -> std::unique_ptr<device::Backend> {
        return std::make_unique<OfiBackend>(s);
      },
      .inventory = OfiFabric::inventory,
      .memory = memory,
  };
  return info;
}

}  // namespace

}  // namespace ami::ofi

// The module's one entry point (ofi_module.cpp loads it by this name).
extern "C" [[gnu::visibility("default")]] const ami::device::BackendInfo* ami_ofi_backend_info() {
  return &ami::ofi::module_info();
}
