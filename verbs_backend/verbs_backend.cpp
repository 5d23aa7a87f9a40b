// verbs_backend/verbs_backend.cpp — the verbs backend's setup: its options
// from the configuration, the domain, connecting peers, registering memory
// with the NIC. The domain itself is verbs_setup.cpp and verbs_connect.cpp;
// the per-message path is verbs_datapath.cpp.
#include "verbs_backend.hpp"

#include <algorithm>
#include <atomic>
#include <bit>

#include "ami/device/descriptor.hpp"
#include "ami/error.hpp"
#include "verbs_device.hpp"
#include "verbs_domain.hpp"

namespace ami::verbs {

static_assert(Param("AMI_VERBS_BOUNCE_SIZE").spec().min >= device::kPacketInlineBytes,
              "a verbs receive buffer must hold a descriptor's inline bytes");

VerbsOptions VerbsOptions::from(const Config& c) {
  auto u32 = [&c](Param p) { return static_cast<std::uint32_t>(c.number(p)); };
  VerbsOptions v;
  v.net_devices = c.text(Param("AMI_NET_DEVICES"));
  if (auto gid = c.number_or_auto(Param("AMI_VERBS_GID_INDEX"))) v.gid_index = static_cast<int>(*gid);
  if (auto cm = c.number_or_auto(Param("AMI_VERBS_CM"))) v.use_rdma_cm = *cm != 0;
  // IBV_MTU_256 is 1, and each enumerator doubles the bytes: 256 = 2^8.
  if (auto mtu = c.number_or_auto(Param("AMI_VERBS_MTU")))
    v.mtu_cap = static_cast<ibv_mtu>(std::countr_zero(*mtu) - 7);
  v.sq_depth = u32("AMI_VERBS_SQ_DEPTH");
  if (auto depth = c.number_or_auto(Param("AMI_VERBS_SRQ_DEPTH"))) v.srq_depth = static_cast<std::uint32_t>(*depth);
  v.signal_interval = u32("AMI_VERBS_SIGNAL_INTERVAL");
  v.doorbell_batch = u32("AMI_VERBS_DOORBELL_BATCH");
  if (auto max_rdma = c.number_or_auto(Param("AMI_VERBS_MAX_RDMA"))) v.max_rdma = *max_rdma;
  if (auto bounce = c.number_or_auto(Param("AMI_VERBS_BOUNCE_SIZE")))
    v.bounce_bytes = static_cast<std::uint32_t>(*bounce);
  if (auto inline_bytes = c.number_or_auto(Param("AMI_VERBS_MAX_INLINE")))
    v.max_inline = static_cast<std::uint32_t>(*inline_bytes);
  v.immediate = c.flag(Param("AMI_VERBS_IMMEDIATE"));
  if (auto staging = c.number_or_auto(Param("AMI_VERBS_STAGING_SIZE")))
    v.staging_bytes = static_cast<std::uint32_t>(*staging);
  v.connect_timeout_ms = static_cast<std::uint32_t>(c.number(Param("AMI_VERBS_CONNECT_TIMEOUT")));
  v.timeout = static_cast<std::uint8_t>(c.number(Param("AMI_VERBS_TIMEOUT")));
  v.retry_count = static_cast<std::uint8_t>(c.number(Param("AMI_VERBS_RETRY_COUNT")));
  return v;
}

namespace {

// The options for a task's domain: a send queue holds a lane's whole
// injection FIFO and the retire probe; its entry in keys is the registry's.
VerbsOptions domain_options(const device::BackendSetup& s) {
  VerbsOptions v = VerbsOptions::from(s.config);
  v.sq_depth = std::max(v.sq_depth, s.fifo_depth + 1);
  v.key_id = s.id;
  return v;
}

class VerbsBackend final : public device::Backend {
 public:
  explicit VerbsBackend(const device::BackendSetup& s)
      : domain_(s.task, s.tasks, s.contexts, domain_options(s), s.regions) {
    domain_.set_directory(s.directory);
  }

  std::string_view name() const override { return "verbs"; }
  std::vector<std::byte> local_address() const override { return domain_.local_address(); }

  // Both use verbs (and no earlier backend joins them: the Client asks only then).
  bool joins(const device::TaskFacts&, const device::TaskFacts& peer, const std::vector<std::byte>* entry,
             std::string& why) const override {
    if (entry != nullptr) return true;
    why = "verbs is not in use at task " + std::to_string(peer.task);
    return false;
  }

  // Learns the peer (either method connects its lanes on first use); an
  // address that does not fit leaves it unreachable, and says why.
  std::string connect(const device::TaskFacts& peer, std::span<const std::byte> entry) override {
    Status s = domain_.connect(peer.task, entry);
    if (!s.ok()) return "verbs cannot connect to it: " + to_string(s);
    peers_.fetch_add(1, std::memory_order_relaxed);
    return {};
  }

  bool reaches(std::uint32_t task) const override { return domain_.knows(task); }
  std::uint32_t tasks_reached() const override { return peers_.load(std::memory_order_relaxed); }

  Status register_region(std::uint32_t region, void* address, std::size_t length,
                         device::RegionKeys& keys) override {
    std::uint32_t lkey = 0, rkey = 0;
    Status s = domain_.register_region(region, address, length, lkey, rkey);
    if (!s.ok()) return s;
    keys.set_local(lkey);
    // Registered for remote atomics where the device does them; each
    // context can reach its own regions through its NIC (atomic_loopback()).
    if (domain_.port().atomics()) keys.offer_nic_atomics();
    return keys.set_remote(rkey_entry(rkey));
  }
  void deregister_region(std::uint32_t region) override { domain_.deregister_region(region); }
  // A registration kept past free() would point the NIC at the old pages.
  bool pins_registrations() const override { return true; }

  std::string describe() const override {
    return domain_.describe() + ", " + std::to_string(tasks_reached()) + " peer task(s)";
  }
  std::string describe_lane(std::uint16_t context, Endpoint peer) const override {
    return domain_.describe_lane(context, peer);
  }

  std::unique_ptr<device::Device> make_device(std::uint16_t context, std::uint32_t fifo_depth) override {
    return std::make_unique<VerbsDevice>(domain_, context, fifo_depth);
  }

 private:
  VerbsDomain domain_;
  std::atomic<std::uint32_t> peers_{0};  // (on demand, connect() runs beside describe())
};

// The RDMA devices of this host, active or not.
std::string inventory() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  std::string out;
  if (list == nullptr || n == 0) out = "verbs devices: none found\n";
  for (int i = 0; i < n; ++i) out += "verbs device: " + std::string(ibv_get_device_name(list[i])) + "\n";
  if (list != nullptr) ibv_free_device_list(list);
  return out;
}

// Each context's receive buffers. auto is the device's choice, (512, 8 KiB)
// on a NIC or (128, 128 KiB) on a software device: the larger of what each
// could be.
std::vector<device::MemoryDemand> memory(const Config& c, std::uint16_t contexts) {
  const auto depth = c.number_or_auto(Param("AMI_VERBS_SRQ_DEPTH"));
  const auto bounce = c.number_or_auto(Param("AMI_VERBS_BOUNCE_SIZE"));
  const std::uint64_t per_context = !depth && !bounce
                                        ? std::uint64_t{128} * (128 << 10)
                                        : device::MemoryDemand::times(depth.value_or(512), bounce.value_or(128 << 10));
  return {{"verbs receive buffers: AMI_VERBS_SRQ_DEPTH x AMI_VERBS_BOUNCE_SIZE x contexts",
           c.text(Param("AMI_VERBS_SRQ_DEPTH")) + " x " + c.text(Param("AMI_VERBS_BOUNCE_SIZE")) + " x " +
               std::to_string(contexts),
           device::MemoryDemand::times(per_context, contexts)}};
}

}  // namespace

const device::BackendInfo& backend_info() {
  static const device::BackendInfo info{
      .name = "verbs",
      .params = kParams,
      .available = [](const device::BackendSetup& s, std::string* why) {
        return VerbsDomain::available(why, s.config.text(Param("AMI_NET_DEVICES")));
      },
      .open = [](const device::BackendSetup& s) -> std::unique_ptr<device::Backend> {
        return std::make_unique<VerbsBackend>(s);
      },
      .inventory = inventory,
      .memory = memory,
  };
  return info;
}

}  // namespace ami::verbs
