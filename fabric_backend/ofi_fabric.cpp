// fabric_backend/ofi_fabric.cpp — choosing the provider, opening the fabric,
// the domain and each context's endpoint, publishing and inserting
// addresses, registering memory.
#include "ofi_fabric.hpp"

#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>

#include <algorithm>
#include <bit>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ami/device/log.hpp"
#include "ami/error.hpp"
#include "ofi_config.hpp"
#include "ofi_wire.hpp"

namespace ami::ofi {

void FiClose::operator()(fid* f) const {
  if (int rc = fi_close(f)) log("fi_close: %s", fi_strerror(-rc));
}

void log(const char* format, ...) {
  va_list args;
  va_start(args, format);
  device::vlog("ofi", format, args);
  va_end(args);
}

OfiOptions OfiOptions::from(const Config& c) {
  OfiOptions o;
  o.provider = c.text(Param("AMI_OFI_PROVIDER"));
  if (auto bytes = c.number_or_auto(Param("AMI_OFI_PACKET_SIZE"))) o.packet_bytes = static_cast<std::uint32_t>(*bytes);
  o.recv_buffers = static_cast<std::uint32_t>(c.number(Param("AMI_OFI_RECV_BUFFERS")));
  o.recv_buffer_bytes = c.number_or_auto(Param("AMI_OFI_RECV_BUFFER_SIZE"));
  if (auto local = c.number_or_auto(Param("AMI_OFI_MR_LOCAL"))) o.mr_local = *local != 0;
  if (auto ordered = c.number_or_auto(Param("AMI_OFI_ORDERED"))) o.ordered = *ordered != 0;
  o.staging = static_cast<std::uint32_t>(c.number(Param("AMI_OFI_STAGING")));
  o.bundle = static_cast<std::uint32_t>(c.number(Param("AMI_OFI_BUNDLE")));
  if (auto n = c.number_or_auto(Param("AMI_OFI_CQ_SIZE"))) o.cq_size = static_cast<std::uint32_t>(*n);
  o.timeout_ms = static_cast<std::uint32_t>(c.number(Param("AMI_OFI_TIMEOUT")));
  const auto wait = c.number_or_auto(Param("AMI_OFI_WAIT"));  // (nullopt: auto)
  o.wait = wait ? std::optional<bool>(*wait != 0) : std::nullopt;
  return o;
}

namespace {

// What ami needs of an endpoint (docs/DESIGN.md, "The libfabric backend").
constexpr std::uint64_t kCaps = FI_MSG | FI_RMA | FI_MULTI_RECV | FI_SEND | FI_RECV | FI_READ | FI_WRITE |
                                FI_REMOTE_READ | FI_REMOTE_WRITE;
// The modes ami can give: every operation's context is a fi_context2.
constexpr std::uint64_t kModes = FI_CONTEXT | FI_CONTEXT2;
// The registration modes ami handles.
constexpr int kMrModes = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;

// Providers the default skips: shm (ami's own shm backend is the host's),
// sockets (deprecated), net (experimental), rxd (crashes in loopback atomics, slow), and the
// multi-rail wrapper.
bool skipped_by_default(const std::string& name) {
  return name == "shm" || name == "sockets" || name.rfind("net", 0) == 0 || name.find("ofi_rxd") != std::string::npos ||
         name.find("ofi_mrail") != std::string::npos;
}

InfoOwner make_hints(const std::string& provider) {
  InfoOwner h(fi_allocinfo());
  if (!h) throw Error("ofi: fi_allocinfo failed");
  h->ep_attr->type = FI_EP_RDM;
  h->caps = kCaps;
  h->mode = kModes;
  h->domain_attr->mr_mode = kMrModes;
  h->domain_attr->threading = FI_THREAD_COMPLETION;
  h->domain_attr->data_progress = FI_PROGRESS_MANUAL;
  h->domain_attr->control_progress = FI_PROGRESS_MANUAL;
  h->tx_attr->msg_order = FI_ORDER_SAS;
  h->rx_attr->msg_order = FI_ORDER_SAS;
  if (!provider.empty()) h->fabric_attr->prov_name = strdup(provider.c_str());  // fi_freeinfo frees it
  return h;
}

// rxm's eager size, FI_OFI_RXM_BUFFER_SIZE, unless the user set it: 16 KiB
// of message and ami's headers (kHeadroom, kHeaderBytes), where rxm's
// default, 16 KiB in all, left packets 16316 bytes of message. A 64 KiB
// message is then 4 packets instead of 5 (ping-pongs over tcp;ofi_rxm
// took 0.90x as long). rxm reads it when libfabric first looks its
// providers up in the process, so it is set before every lookup; a process
// whose libfabric another library started first keeps rxm's 16 KiB, and
// ami's packets, 72 bytes over, go by rxm's rendezvous: slower, not wrong.
void set_rxm_eager() {
  setenv("FI_OFI_RXM_BUFFER_SIZE", std::to_string(kRxmPacketBytes + kHeadroom + kHeaderBytes).c_str(), 0);
}

// Every provider entry that meets ami's needs (the named provider's only).
InfoOwner query(const std::string& provider, int* rc_out = nullptr) {
  set_rxm_eager();
  InfoOwner hints = make_hints(provider);
  fi_info* list = nullptr;
  const int rc = fi_getinfo(kApiVersion, nullptr, nullptr, 0, hints.get(), &list);
  if (rc_out != nullptr) *rc_out = rc;
  return InfoOwner(rc == 0 ? list : nullptr);
}

}  // namespace

std::string missing_needs(const fi_info& offered) {
  std::string missing;
  auto lack = [&missing](const std::string& what) { missing += (missing.empty() ? "" : ", ") + what; };
  const std::uint64_t caps_missing = kCaps & ~offered.caps;
  if (caps_missing != 0) lack("capabilities " + std::string(fi_tostr(&caps_missing, FI_TYPE_CAPS)));
  const std::uint64_t modes_needed = offered.mode & ~kModes;
  if (modes_needed != 0) lack("modes ami does not give: " + std::string(fi_tostr(&modes_needed, FI_TYPE_MODE)));
  if (offered.tx_attr == nullptr || (offered.tx_attr->msg_order & FI_ORDER_SAS) == 0)
    lack("send-after-send order (FI_ORDER_SAS)");
  if (offered.domain_attr != nullptr) {
    const int mr_needed = offered.domain_attr->mr_mode & ~kMrModes & ~(FI_MR_BASIC | FI_MR_SCALABLE);
    if (mr_needed != 0)
      lack("registration modes ami does not handle: " + std::string(fi_tostr(&mr_needed, FI_TYPE_MR_MODE)));
    if (offered.domain_attr->cq_data_size < 4) lack("4 bytes of CQ data (the origin)");
    if (offered.domain_attr->mr_key_size > 8) lack("remote keys of at most 8 bytes");
  }
  return missing.empty() ? "something fi_getinfo does not say" : missing;
}

namespace {

// Why the named provider does not meet ami's needs: what it lacks, read
// from what it offers without ami's hints.
std::string what_lacks(const std::string& provider) {
  InfoOwner h(fi_allocinfo());
  h->ep_attr->type = FI_EP_RDM;
  h->fabric_attr->prov_name = strdup(provider.c_str());
  h->domain_attr->mr_mode = ~0 & ~(FI_MR_BASIC | FI_MR_SCALABLE);
  h->mode = ~std::uint64_t{0};
  fi_info* list = nullptr;
  if (fi_getinfo(kApiVersion, nullptr, nullptr, 0, h.get(), &list) != 0 || list == nullptr)
    return "provider '" + provider + "' is not on this host or has no reliable-datagram endpoint (fi_info -l lists "
           "the providers there are)";
  InfoOwner owner(list);
  return "provider '" + provider + "' lacks what ami needs: " + missing_needs(*list);
}

bool ordered(const fi_info* i);

// The first entry ami can use, or nullptr; why says why not. Of one
// provider's entries (shm lists one without its full order), an ordered
// one first.
fi_info* choose(fi_info* list, const OfiOptions& o, std::string* why) {
  fi_info* first = nullptr;
  fi_info* fallback = nullptr;
  for (fi_info* i = list; i != nullptr && first == nullptr; i = i->next) {
    if (i->domain_attr->cq_data_size < 4) {
      if (why) *why = std::string(i->fabric_attr->prov_name) + " carries no 4 bytes of CQ data (the origin)";
      continue;
    }
    if (i->domain_attr->mr_key_size > 8) {
      if (why) *why = std::string(i->fabric_attr->prov_name) + " has remote keys of more than 8 bytes";
      continue;
    }
    if (!o.provider.empty() || !skipped_by_default(i->fabric_attr->prov_name))
      first = i;
    else if (fallback == nullptr)
      fallback = i;
  }
  if (first == nullptr) first = fallback;
  if (first == nullptr || ordered(first)) return first;
  for (fi_info* i = list; i != nullptr; i = i->next)
    if (std::strcmp(i->fabric_attr->prov_name, first->fabric_attr->prov_name) == 0 && ordered(i) &&
        i->domain_attr->cq_data_size >= 4 && i->domain_attr->mr_key_size <= 8)
      return i;
  return first;
}

// Packets after a PUT, and PUTs after packets, arrive in the order sent.
bool ordered(const fi_info* i) {
  constexpr std::uint64_t kOrdered = FI_ORDER_SAS | FI_ORDER_SAW | FI_ORDER_WAS | FI_ORDER_WAW | FI_ORDER_RAW;
  return (i->tx_attr->msg_order & kOrdered) == kOrdered && (i->rx_attr->msg_order & kOrdered) == kOrdered;
}

// AMI_OFI_PACKET_SIZE=auto. shm: 64 KiB (one CMA copy carries a packet of
// any size; 64 KiB streams moved 1.9x as much as with 32 KiB packets). rxm: as
// much as its eager protocol carries, FI_OFI_RXM_BUFFER_SIZE (16 KiB and
// ami's headers as set_rxm_eager() sets it), headers included: one byte
// more and rxm moves each packet by its own rendezvous (a 16 KiB message
// over tcp;ofi_rxm took 7 us as one packet within it, 22 us as three
// packets of 8 KiB, and 64 KiB packets just above it 3x as long again).
// Elsewhere 8 KiB.
std::uint32_t default_packet_bytes(const std::string& provider) {
  if (provider == "shm") return 65536;
  if (provider.find("ofi_rxm") == std::string::npos) return 8192;
  std::uint64_t eager = 16384;  // (rxm's own default)
  if (const char* v = std::getenv("FI_OFI_RXM_BUFFER_SIZE")) {
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v, &end, 10);
    if (end != v && *end == '\0' && n >= 2048 && n <= (1u << 20)) eager = n;
  }
  return static_cast<std::uint32_t>(eager - kHeadroom - kHeaderBytes);
}

// AMI_OFI_RECV_BUFFER_SIZE=auto: on shm 2 packets (the least allowed). The
// provider copies each packet into the next free bytes of the buffer it
// fills and hands the buffer back once less than a packet is free, so a
// buffer takes about its size less a packet, and every arrival writes
// lines last written when the buffers came round before. With 4 buffers
// of 512 KiB those lines had left the receiver's 512 KiB L2 long before
// (about 1.8 MiB of arrivals between two visits): a 4096-byte ping-pong
// over shm took 1.2-1.5x as long as fi_pingpong's, whose receive buffer
// is the same every time. Buffers of 128 KiB are visited every 256 KiB:
// 4096-byte ping-pongs then took 0.66x as long as with 512 KiB (0.78
// against 1.18 us, medians of 5 interleaved rounds; fi_pingpong 0.90), 64
// KiB ones no longer beyond the noise, and streams of 8 B to 1 MiB moved as
// much or more (64 KiB: 1.06-1.12x). Elsewhere 1 MiB (8 packets where that is
// more): smaller buffers were not measured there.
std::uint64_t default_recv_buffer_bytes(const std::string& provider, std::uint32_t packet_bytes) {
  if (provider == "shm") return std::max<std::uint64_t>(65536, std::bit_ceil(std::uint64_t{2} * packet_bytes));
  return std::max(std::uint64_t{1} << 20, std::bit_ceil(std::uint64_t{8} * packet_bytes));
}

// The largest default_packet_bytes() gives, whatever the provider.
std::uint32_t largest_default_packet_bytes() {
  return std::max(default_packet_bytes("shm"), default_packet_bytes("ofi_rxm"));
}

std::string order_text(std::uint64_t order) { return fi_tostr(&order, FI_TYPE_MSG_ORDER); }

}  // namespace

std::uint32_t OfiFabric::packet_bytes_bound(const OfiOptions& options) {
  return options.packet_bytes.value_or(largest_default_packet_bytes());
}

std::uint64_t OfiFabric::recv_buffer_bytes_bound(const OfiOptions& options) {
  return options.recv_buffer_bytes.value_or(default_recv_buffer_bytes("", packet_bytes_bound(options)));
}

void OfiFabric::set_universe(std::uint32_t tasks) {
  setenv("FI_UNIVERSE_SIZE", std::to_string(std::max<std::uint32_t>(tasks, 2)).c_str(), 0);
  // No registration cache inside libfabric: ami has its own (the core's),
  // and one that keeps a registration after fi_close would leave a
  // destroyed Memory's key working (verbs;ofi_rxm does, by default).
  setenv("FI_MR_CACHE_MAX_COUNT", "0", 0);
}

bool OfiFabric::available(const OfiOptions& o, std::string* why) {
  int rc = 0;
  InfoOwner list = query(o.provider, &rc);
  if (!list) {
    if (why != nullptr)
      *why = o.provider.empty() ? "no libfabric provider meets ami's needs (fi_getinfo: " + std::string(fi_strerror(-rc)) + ")"
                                : what_lacks(o.provider);
    return false;
  }
  std::string reason;
  if (choose(list.get(), o, &reason) == nullptr) {
    if (why != nullptr) *why = reason;
    return false;
  }
  return true;
}

std::string OfiFabric::inventory() {
  InfoOwner list = query("");
  std::vector<std::string> names;
  for (fi_info* i = list.get(); i != nullptr; i = i->next)
    if (std::find(names.begin(), names.end(), i->fabric_attr->prov_name) == names.end())
      names.emplace_back(i->fabric_attr->prov_name);
  if (names.empty()) return "ofi providers: none meets ami's needs\n";
  std::string out = "ofi providers:";
  for (const std::string& n : names) out += " " + n;
  return out + "\n";
}

OfiFabric::OfiFabric(std::uint32_t task, std::uint32_t tasks, std::uint16_t contexts, const OfiOptions& options,
                     std::uint8_t key_id)
    : task_(task), tasks_(tasks), contexts_(contexts), options_(options), key_id_(key_id) {
  if (tasks > kMaxTasks) throw Error("ofi: a job of more than 2^21 tasks");
  set_universe(tasks);
  int rc = 0;
  InfoOwner list = query(options.provider, &rc);
  if (!list)
    throw Error("ofi: " + (options.provider.empty() ? "no libfabric provider meets ami's needs (fi_getinfo: " +
                                                           std::string(fi_strerror(-rc)) + ")"
                                                     : what_lacks(options.provider)));
  std::string why;
  fi_info* chosen = choose(list.get(), options, &why);
  if (chosen == nullptr) throw Error("ofi: " + why);
  info_.reset(fi_dupinfo(chosen));
  if (!info_) throw Error("ofi: fi_dupinfo failed");

  facts_.name = info_->fabric_attr->prov_name;
  facts_.fabric = info_->fabric_attr->name != nullptr ? info_->fabric_attr->name : "";
  facts_.max_msg = info_->ep_attr->max_msg_size;
  facts_.inject = info_->tx_attr->inject_size;
  facts_.iov_limit = info_->tx_attr->iov_limit;
  facts_.cq_data = info_->domain_attr->cq_data_size;
  facts_.mr_mode = info_->domain_attr->mr_mode;
  facts_.msg_order = info_->tx_attr->msg_order;
  // A provider that asks for FI_MR_LOCAL, or gathers fewer than three
  // pieces, gets sends from registered memory whatever the option says.
  facts_.mr_local = options.mr_local.value_or(false) || (facts_.mr_mode & FI_MR_LOCAL) != 0 || facts_.iov_limit < 3;
  facts_.ordered = options.ordered && ordered(info_.get());
  // Receives complete in the order sent (shm): packets need no sequence
  // header, and a 4096-byte message over shm is one injected send (a header
  // would make it 4100 bytes, past the inject size: a CMA copy).
  facts_.receives_in_order = options.ordered && (info_->rx_attr->comp_order & FI_ORDER_STRICT) != 0;
  facts_.on_verbs = facts_.name.rfind("verbs", 0) == 0;
  facts_.over_rxm = facts_.name.find("ofi_rxm") != std::string::npos;
  facts_.on_shm = facts_.name == "shm";
  if (facts_.max_msg < 1024) throw Error("ofi: " + facts_.name + " carries messages of at most " +
                                         std::to_string(facts_.max_msg) + " bytes");
  const std::uint32_t wanted = options.packet_bytes.value_or(default_packet_bytes(facts_.name));
  packet_bytes_ = static_cast<std::uint32_t>(std::min<std::uint64_t>(wanted, facts_.max_msg - kHeadroom - kHeaderBytes));
  recv_buffer_bytes_ = options.recv_buffer_bytes.value_or(default_recv_buffer_bytes(facts_.name, packet_bytes_));
  if (recv_buffer_bytes_ < std::uint64_t{2} * packet_bytes_)
    throw Error("ofi: AMI_OFI_RECV_BUFFER_SIZE holds fewer than 2 packets of AMI_OFI_PACKET_SIZE");

  fid_fabric* fabric = nullptr;
  if (int r = fi_fabric(info_->fabric_attr, &fabric, nullptr))
    throw Error("ofi: fi_fabric(" + facts_.name + "): " + fi_strerror(-r));
  fabric_.reset(fabric);
  fid_domain* domain = nullptr;
  if (int r = fi_domain(fabric_.get(), info_.get(), &domain, nullptr))
    throw Error("ofi: fi_domain(" + facts_.name + "): " + fi_strerror(-r));
  domain_.reset(domain);
  peer_contexts_.assign(tasks, 0);
  for (std::uint16_t c = 0; c < contexts; ++c) open_endpoint(c);
}

OfiFabric::~OfiFabric() = default;

void OfiFabric::open_endpoint(std::uint16_t context) {
  auto e = std::make_unique<ContextEndpoint>();
  auto require = [this, context](int rc, const char* call) {
    if (rc != 0)
      throw Error("ofi: context " + std::to_string(context) + ": " + call + "(" + facts_.name +
                  "): " + fi_strerror(-rc));
  };
  fi_av_attr av_attr{};
  av_attr.type = info_->domain_attr->av_type;
  av_attr.count = static_cast<std::size_t>(tasks_) * contexts_;
  fid_av* av = nullptr;
  require(fi_av_open(domain_.get(), &av_attr, &av, nullptr), "fi_av_open");
  e->av.reset(av);
  fi_cq_attr cq_attr{};
  cq_attr.size = options_.cq_size.value_or(0);  // 0: the provider's default
  cq_attr.format = FI_CQ_FORMAT_DATA;
  fid_cq* cq = nullptr;
  // A CQ to sleep on (docs/DESIGN.md, "Event-driven progress"): with a
  // wait descriptor where the provider gives one. shm refuses FI_WAIT_FD
  // (ENOSYS); then the CQ opens without, and arm() declines.
  int rc = -FI_ENOSYS;
  if (options_.wait.value_or(true)) {
    cq_attr.wait_obj = FI_WAIT_FD;
    cq_attr.wait_cond = FI_CQ_COND_NONE;
    rc = fi_cq_open(domain_.get(), &cq_attr, &cq, nullptr);
    if (rc == 0 && fi_control(&cq->fid, FI_GETWAIT, &e->wait_fd) != 0) {
      e->wait_fd = -1;
      fi_close(&cq->fid);
      cq = nullptr;
      rc = -FI_ENOSYS;
    }
    if (rc != 0 && options_.wait.value_or(false))
      require(rc, "fi_cq_open(FI_WAIT_FD, as AMI_OFI_WAIT=on asks)");
  }
  if (rc != 0) {
    cq_attr.wait_obj = FI_WAIT_NONE;
    require(fi_cq_open(domain_.get(), &cq_attr, &cq, nullptr), "fi_cq_open");
  }
  e->cq.reset(cq);
  fi_cntr_attr cntr_attr{};
  cntr_attr.events = FI_CNTR_EVENTS_COMP;
  cntr_attr.wait_obj = FI_WAIT_NONE;
  fid_cntr* cntr = nullptr;
  require(fi_cntr_open(domain_.get(), &cntr_attr, &cntr, nullptr), "fi_cntr_open");
  e->cntr.reset(cntr);
  fid_ep* ep = nullptr;
  require(fi_endpoint(domain_.get(), info_.get(), &ep, nullptr), "fi_endpoint");
  e->ep.reset(ep);
  require(fi_ep_bind(ep, &av->fid, 0), "fi_ep_bind(av)");
  require(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION), "fi_ep_bind(cq)");
  require(fi_ep_bind(ep, &cntr->fid, FI_SEND | FI_WRITE | FI_READ), "fi_ep_bind(cntr)");
  int enabled = fi_enable(ep);
  // libfabric's shm names an endpoint's segment by pid and a count, and
  // refuses (EBUSY) a segment left by a dead process whose pid this one now
  // has — though it removes that segment as it refuses. Once more is then
  // enough; any other refusal stays one.
  if (enabled == -FI_EBUSY && facts_.name == "shm") enabled = fi_enable(ep);
  require(enabled, "fi_enable");
  // After fi_enable: shm's endpoint has nothing to set it on before.
  const std::size_t min_free = std::size_t{max_packet()} + kHeaderBytes;
  require(fi_setopt(&ep->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &min_free, sizeof min_free),
          "fi_setopt(FI_OPT_MIN_MULTI_RECV)");
  std::size_t len = 64;
  e->name.resize(len);
  rc = fi_getname(&ep->fid, e->name.data(), &len);
  if (rc == -FI_ETOOSMALL) {
    e->name.resize(len);
    rc = fi_getname(&ep->fid, e->name.data(), &len);
  }
  require(rc, "fi_getname");
  e->name.resize(len);
  e->peers.resize(tasks_);
  endpoints_.push_back(std::move(e));
}

void OfiFabric::close_endpoint(std::uint16_t context) {
  ContextEndpoint& e = *endpoints_[context];
  e.ep.reset();
  e.cntr.reset();
  e.cq.reset();
  e.av.reset();
}

// The entry: version, provider name, then each context's endpoint name
// (ofi_wire.hpp).
std::vector<std::byte> OfiFabric::local_address() const {
  AddressEntry a;
  a.provider = facts_.name;
  for (const auto& e : endpoints_) a.names.push_back(e->name);
  return a.encode();
}

std::string OfiFabric::provider_of(std::span<const std::byte> entry) {
  AddressEntry a;
  return AddressEntry::decode(entry, a) ? a.provider : std::string();
}

Status OfiFabric::connect(std::uint32_t peer, std::span<const std::byte> entry) {
  AddressEntry a;
  if (peer >= tasks_ || !AddressEntry::decode(entry, a) || a.names.empty() || a.names.size() > kMaxContexts)
    return {StatusCode::malformed_packet, "ofi: the peer's address entry is malformed"};
  if (a.provider != facts_.name) return {StatusCode::unreachable, "ofi: the peer uses another provider"};
  const std::size_t count = a.names.size();
  for (auto& e : endpoints_) {
    if (!e->av) continue;
    std::vector<fi_addr_t> addrs(count, FI_ADDR_NOTAVAIL);
    // One at a time: a provider whose names are strings (shm) reads each
    // up to its end, not by a stride.
    for (std::size_t i = 0; i < count; ++i) {
      const int n = fi_av_insert(e->av.get(), a.names[i].data(), 1, &addrs[i], 0, nullptr);
      if (n != 1) {
        log("fi_av_insert of task %u context %zu: %d (%s)", peer, i, n, n < 0 ? fi_strerror(-n) : "refused");
        return {StatusCode::device_error, "ofi: fi_av_insert refused the peer's endpoint names"};
      }
    }
    e->peers[peer] = std::move(addrs);
  }
  if (peer_contexts_[peer] == 0) ++peers_connected_;
  peer_contexts_[peer] = static_cast<std::uint16_t>(count);
  return Status::success();
}

bool OfiFabric::connected(std::uint32_t peer) const { return peer < tasks_ && peer_contexts_[peer] != 0; }

std::uint16_t OfiFabric::peer_contexts(std::uint32_t peer) const {
  return peer < tasks_ ? peer_contexts_[peer] : 0;
}

Status OfiFabric::bind_to_endpoints(fid_mr* mr) {
  if ((facts_.mr_mode & FI_MR_ENDPOINT) == 0) return Status::success();
  for (auto& e : endpoints_) {
    if (!e->ep) continue;
    if (int rc = fi_mr_bind(mr, &e->ep->fid, 0)) {
      log("fi_mr_bind: %s", fi_strerror(-rc));
      return {StatusCode::device_error, "ofi: fi_mr_bind failed"};
    }
  }
  if (int rc = fi_mr_enable(mr)) {
    log("fi_mr_enable: %s", fi_strerror(-rc));
    return {StatusCode::device_error, "ofi: fi_mr_enable failed"};
  }
  return Status::success();
}

Status OfiFabric::register_own(void* address, std::size_t length, FiOwner<fid_mr>& out) {
  fid_mr* mr = nullptr;
  constexpr std::uint64_t kAccess = FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
  if (int rc = fi_mr_reg(domain_.get(), address, length, kAccess, 0, next_key_++, 0, &mr, nullptr)) {
    log("fi_mr_reg of %zu bytes: %s", length, fi_strerror(-rc));
    return {StatusCode::device_error, "ofi: fi_mr_reg failed (see the log line before)"};
  }
  out.reset(mr);
  return bind_to_endpoints(mr);
}

Status OfiFabric::register_region(std::uint32_t region, void* address, std::size_t length, std::uint64_t& key,
                                  void*& desc) {
  FiOwner<fid_mr> mr;
  if (Status s = register_own(address, length, mr); !s.ok()) return s;
  key = fi_mr_key(mr.get());
  desc = fi_mr_desc(mr.get());
  regions_[region] = std::move(mr);
  return Status::success();
}

void OfiFabric::deregister_region(std::uint32_t region) { regions_.erase(region); }

int OfiFabric::trywait(std::uint16_t context) {
  fid* cq = &endpoints_[context]->cq->fid;
  return fi_trywait(fabric_.get(), &cq, 1);
}

std::string OfiFabric::describe() const {
  const int mr_mode = facts_.mr_mode;
  const std::string mr_text = fi_tostr(&mr_mode, FI_TYPE_MR_MODE);  // (fi_tostr's buffer is reused)
  const std::string order = order_text(facts_.msg_order);
  std::string out = "ofi: provider " + facts_.name + " (fabric " + facts_.fabric + ", domain " +
                    std::string(info_->domain_attr->name != nullptr ? info_->domain_attr->name : "") +
                    "), packets " + std::to_string(packet_bytes_) + " B, inject " + std::to_string(facts_.inject) +
                    " B, receive buffers " + std::to_string(options_.recv_buffers) + " x " +
                    std::to_string(recv_buffer_bytes_) +
                    " B, largest message " + std::to_string(facts_.max_msg) + " B, iov " +
                    std::to_string(facts_.iov_limit) + ", CQ data " + std::to_string(facts_.cq_data) +
                    " B, mr_mode [" + mr_text + "]" +
                    (facts_.mr_local ? ", sends from registered memory" : "") + ", order [" +
                    order + "] (" + (facts_.ordered ? "fence by message" : "fence by flush") +
                    (facts_.receives_in_order ? ", receives in order" : ", receives reordered by sequence") + ")" +
                    (!endpoints_.empty() && endpoints_[0]->wait_fd >= 0 ? ", contexts sleep on the CQ's wait fd"
                                                                         : ", contexts cannot sleep (no CQ wait fd)");
  return out;
}

}  // namespace ami::ofi
