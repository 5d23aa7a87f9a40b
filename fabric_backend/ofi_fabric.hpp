// fabric_backend/ofi_fabric.hpp — one task's share of the libfabric backend:
// the provider chosen, its fabric and domain, one endpoint per context (made
// at open, so that its name can be published), the address vectors the
// peers' names go into, and memory registrations (docs/DESIGN.md, "The
// libfabric backend").
//
// A context's endpoint is reliable-datagram (FI_EP_RDM) with its own CQ
// (FI_CQ_FORMAT_DATA, bound with FI_SELECTIVE_COMPLETION: an operation asks
// for an entry only when someone waits for it), its own counter (every
// completion, entry or not) and its own AV, where connect() puts the name of
// every context of each peer task. Nothing grows with the job in the
// published address: the provider's name and one endpoint name per context.
//
// Setup only; the data path is OfiDevice (ofi_device.hpp). Not thread-safe:
// the Client serialises setup calls.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "ami/config.hpp"
#include "ami/status.hpp"
#include "ofi_wire.hpp"

namespace ami::ofi {

// The libfabric API version ami asks for: the one Debian 12 ships.
inline constexpr std::uint32_t kApiVersion = FI_VERSION(1, 17);

// Closes any libfabric object (fi_close on its fid) and logs a failure.
struct FiClose {
  void operator()(fid* f) const;
  template <typename T>
  void operator()(T* object) const {
    (*this)(&object->fid);
  }
};
template <typename T>
using FiOwner = std::unique_ptr<T, FiClose>;

struct FreeInfo {
  void operator()(fi_info* info) const { fi_freeinfo(info); }
};
using InfoOwner = std::unique_ptr<fi_info, FreeInfo>;

// "ami: ofi: <text>" on stderr, one line.
void log(const char* format, ...) __attribute__((format(printf, 1, 2)));

// What a provider's entry lacks of ami's needs ("capabilities [FI_MULTI_RECV],
// send-after-send order (FI_ORDER_SAS)"), for the error that refuses it.
std::string missing_needs(const fi_info& offered);

struct OfiOptions {
  std::string provider;  // "" chooses
  std::optional<std::uint32_t> packet_bytes;  // nullopt: as the provider suits
  std::uint32_t recv_buffers = 4;
  std::optional<std::uint64_t> recv_buffer_bytes;  // nullopt: as the provider suits
  std::optional<bool> mr_local;  // nullopt: as the provider asks
  bool ordered = true;           // false: every lane unordered, whatever the provider says
  std::uint32_t staging = 256;
  std::uint32_t bundle = 16;  // packets a bundle may hold; 1: none
  std::optional<std::uint32_t> cq_size;  // nullopt: the provider's default
  std::uint32_t timeout_ms = 30000;
  std::optional<bool> wait = false;  // a CQ to sleep on; nullopt: where the provider has one (AMI_OFI_WAIT)

  static OfiOptions from(const Config& config);
};

// What the provider chosen offers, read once at open.
struct ProviderFacts {
  std::string name;    // fi_info's prov_name: "tcp;ofi_rxm"
  std::string fabric;  // fabric_attr->name
  std::uint64_t max_msg = 0;
  std::size_t inject = 0;
  std::size_t iov_limit = 0;
  std::size_t cq_data = 0;  // bytes of CQ data a send may carry
  int mr_mode = 0;
  std::uint64_t msg_order = 0;
  bool mr_local = false;  // ami sends only from registered memory
  // Packets after a PUT (and PUTs after packets) arrive in the order sent:
  // the lane is ordered() and a fence is one message.
  bool ordered = false;
  // The provider completes receives in the order their sends were posted
  // (rx comp_order FI_ORDER_STRICT, and AMI_OFI_ORDERED not off): packets
  // need no sequence header (ofi_wire.hpp).
  bool receives_in_order = false;
  bool on_verbs = false;  // the core provider is verbs: a GET is the NIC's RDMA READ
  bool over_rxm = false;  // reached through rxm (eager packets go through its bounce buffers)
  bool on_shm = false;    // the provider is shm: a PUT is one copy by its target, placed when complete
};

// One context's endpoint and the objects bound to it. Members in creation
// order: the endpoint closes first.
struct ContextEndpoint {
  FiOwner<fid_av> av;
  FiOwner<fid_cq> cq;
  FiOwner<fid_cntr> cntr;
  FiOwner<fid_ep> ep;
  // The CQ's wait descriptor (FI_WAIT_FD, fi_control FI_GETWAIT), readable
  // when the CQ may have work; -1 when it has none (the provider offers no
  // wait object, or AMI_OFI_WAIT is off). Owned by the CQ.
  int wait_fd = -1;
  std::vector<std::byte> name;  // fi_getname
  // By peer task: the fi_addr of each of its contexts, empty while the task
  // is not connected.
  std::vector<std::vector<fi_addr_t>> peers;
};

class OfiFabric {
 public:
  // Throws ami::Error naming what failed (no provider meets ami's needs, one
  // named lacks something, a call failed).
  OfiFabric(std::uint32_t task, std::uint32_t tasks, std::uint16_t contexts, const OfiOptions& options,
            std::uint8_t key_id);
  ~OfiFabric();
  OfiFabric(const OfiFabric&) = delete;
  OfiFabric& operator=(const OfiFabric&) = delete;

  // Is there a provider that meets ami's needs (the one AMI_OFI_PROVIDER
  // names)? why says what is missing.
  static bool available(const OfiOptions& options, std::string* why);
  // Tells libfabric the job's size (FI_UNIVERSE_SIZE, unless the user set
  // it): verbs;ofi_rxm sizes its queues by it (libfabric#10692), and
  // libfabric reads it once, at the process's first fi_getinfo. Turns
  // libfabric's registration cache off too (FI_MR_CACHE_MAX_COUNT=0).
  static void set_universe(std::uint32_t tasks);
  // The providers of this host that meet ami's needs, one line each.
  static std::string inventory();

  const ProviderFacts& facts() const { return facts_; }
  const OfiOptions& options() const { return options_; }
  std::uint8_t key_id() const { return key_id_; }
  std::uint32_t task() const { return task_; }
  std::uint32_t tasks() const { return tasks_; }
  // The largest packet a lane sends: AMI_OFI_PACKET_SIZE and room for the
  // protocol's headers (kHeadroom); a sequence header may come on top.
  std::uint32_t max_packet() const { return packet_bytes_ + kHeadroom; }
  // Bytes per multi-receive buffer: AMI_OFI_RECV_BUFFER_SIZE, or as the
  // provider suits (default_recv_buffer_bytes()).
  std::uint64_t recv_buffer_bytes() const { return recv_buffer_bytes_; }
  // AMI_OFI_PACKET_SIZE before a provider is chosen: the size set, or the
  // largest auto gives on any provider (a bound for the memory demand).
  static std::uint32_t packet_bytes_bound(const OfiOptions& options);
  // AMI_OFI_RECV_BUFFER_SIZE before a provider is chosen: the size set, or
  // the largest auto gives on any provider.
  static std::uint64_t recv_buffer_bytes_bound(const OfiOptions& options);

  // This task's entry in its address blob: the provider's name and one
  // endpoint name per context.
  std::vector<std::byte> local_address() const;
  // The provider a published entry names, "" when it is malformed.
  static std::string provider_of(std::span<const std::byte> entry);
  // Puts the names of the peer's contexts into every context's AV.
  Status connect(std::uint32_t peer, std::span<const std::byte> entry);
  bool connected(std::uint32_t peer) const;
  std::uint32_t peers_connected() const { return peers_connected_; }
  // How many contexts the peer has (0: not connected).
  std::uint16_t peer_contexts(std::uint32_t peer) const;

  Status register_region(std::uint32_t region, void* address, std::size_t length, std::uint64_t& key,
                         void*& desc);
  void deregister_region(std::uint32_t region);
  // Memory the device registers for itself (receive buffers, staging).
  Status register_own(void* address, std::size_t length, FiOwner<fid_mr>& out);

  ContextEndpoint& endpoint(std::uint16_t context) { return *endpoints_[context]; }
  // fi_trywait on the context's CQ: 0 when it may sleep on its wait_fd,
  // -FI_EAGAIN when the CQ must be read first, another -FI_ error.
  int trywait(std::uint16_t context);
  // The device of the context is gone: its endpoint closes now, before the
  // lanes whose operation contexts the provider held.
  void close_endpoint(std::uint16_t context);

  std::string describe() const;

 private:
  void open_endpoint(std::uint16_t context);
  Status bind_to_endpoints(fid_mr* mr);

  std::uint32_t task_;
  std::uint32_t tasks_;
  std::uint16_t contexts_;
  OfiOptions options_;
  std::uint8_t key_id_;
  InfoOwner info_;
  ProviderFacts facts_;
  std::uint32_t packet_bytes_ = 0;
  std::uint64_t recv_buffer_bytes_ = 0;
  // Creation order: endpoints and registrations close before the domain,
  // the domain before the fabric.
  FiOwner<fid_fabric> fabric_;
  FiOwner<fid_domain> domain_;
  std::vector<std::unique_ptr<ContextEndpoint>> endpoints_;
  std::unordered_map<std::uint32_t, FiOwner<fid_mr>> regions_;
  std::uint64_t next_key_ = 1;  // for a provider without FI_MR_PROV_KEY
  std::vector<std::uint16_t> peer_contexts_;  // by task
  std::uint32_t peers_connected_ = 0;
};

}  // namespace ami::ofi
