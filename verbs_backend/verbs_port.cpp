// verbs_backend/verbs_port.cpp — device, port and GID selection.
#include "verbs_port.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <charconv>
#include <cstring>

#include "ami/error.hpp"

namespace ami::verbs {

namespace {

constexpr std::uint8_t kMaxRdAtomic = 16;

bool wanted(const std::vector<PortChoice>& choices, const char* device, int port) {
  if (choices.empty()) return true;
  return std::any_of(choices.begin(), choices.end(), [&](const PortChoice& c) {
    return c.device == device && (c.port == 0 || c.port == port);
  });
}

// Position of the device in the list the user gave (earlier wins), or 0.
std::size_t rank_of(const std::vector<PortChoice>& choices, const char* device) {
  for (std::size_t i = 0; i < choices.size(); ++i)
    if (choices[i].device == device) return i;
  return 0;
}

// RoCE: the RoCE v2 GID holding an IPv4-mapped address, else any RoCE v2
// GID that is not link-local, else the first valid GID. IB: index 0 (LID
// routing needs none).
int choose_gid(ibv_context* ctx, std::uint8_t port, const ibv_port_attr& attr, bool& roce_v2) {
  roce_v2 = false;
  if (attr.link_layer != IBV_LINK_LAYER_ETHERNET) return 0;
  int any_v2 = -1, any = -1;
  for (int i = 0; i < attr.gid_tbl_len; ++i) {
    ibv_gid_entry e{};
    if (ibv_query_gid_ex(ctx, port, static_cast<std::uint32_t>(i), &e, 0) != 0) continue;
    ibv_gid g;
    std::memcpy(g.raw, e.gid.raw, sizeof g.raw);
    if (e.gid_type == IBV_GID_TYPE_ROCE_V2 && gid_is_ipv4(g)) {
      roce_v2 = true;
      return i;
    }
    if (e.gid_type == IBV_GID_TYPE_ROCE_V2 && !gid_is_link_local(g) && any_v2 < 0) any_v2 = i;
    if (any < 0) any = i;
  }
  if (any_v2 >= 0) {
    roce_v2 = true;
    return any_v2;
  }
  return any;
}

}  // namespace

bool parse_net_devices(std::string_view spec, std::vector<PortChoice>& out, std::string* why) {
  out.clear();
  while (!spec.empty()) {
    const std::size_t comma = spec.find(',');
    std::string_view item = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view{} : spec.substr(comma + 1);
    if (item.empty()) continue;
    PortChoice c;
    const std::size_t colon = item.find(':');
    c.device = std::string(item.substr(0, colon));
    if (colon != std::string_view::npos) {
      const std::string_view p = item.substr(colon + 1);
      auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), c.port);
      if (ec != std::errc{} || end != p.data() + p.size() || c.port < 1 || c.port > 255 || c.device.empty()) {
        if (why != nullptr) *why = "bad entry '" + std::string(item) + "' in the device list (want dev:port)";
        return false;
      }
    }
    out.push_back(std::move(c));
  }
  return true;
}

bool gid_is_ipv4(const ibv_gid& gid) {
  static constexpr std::uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(gid.raw, kPrefix, sizeof kPrefix) == 0;
}

bool gid_is_link_local(const ibv_gid& gid) { return gid.raw[0] == 0xfe && (gid.raw[1] & 0xc0) == 0x80; }

std::string gid_text(const ibv_gid& gid) {
  char text[INET6_ADDRSTRLEN] = {};
  if (::inet_ntop(AF_INET6, gid.raw, text, sizeof text) == nullptr) return "?";
  return text;
}

const char* mtu_text(ibv_mtu mtu) {
  switch (mtu) {
    case IBV_MTU_256:
      return "256";
    case IBV_MTU_512:
      return "512";
    case IBV_MTU_1024:
      return "1024";
    case IBV_MTU_2048:
      return "2048";
    case IBV_MTU_4096:
      return "4096";
  }
  return "?";
}

namespace {

// What the backend needs to know about an active port, its GID included.
PortInfo port_info(ibv_context* ctx, const std::string& name, int p, const ibv_port_attr& pattr,
                   const ibv_device_attr& dattr, const VerbsOptions& options) {
  const std::string where = name + " port " + std::to_string(p);
  PortInfo info;
  info.device = name;
  info.port = static_cast<std::uint8_t>(p);
  info.link_layer =
      pattr.link_layer == IBV_LINK_LAYER_ETHERNET ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
  info.active_mtu = std::min(pattr.active_mtu, options.mtu_cap);
  info.lid = pattr.lid;
  info.max_msg = pattr.max_msg_sz;
  info.responder_rd_atomic =
      static_cast<std::uint8_t>(std::clamp<int>(dattr.max_qp_rd_atom, 1, kMaxRdAtomic));
  info.initiator_rd_atomic =
      static_cast<std::uint8_t>(std::clamp<int>(dattr.max_qp_init_rd_atom, 1, kMaxRdAtomic));
  info.max_cqe = dattr.max_cqe;
  info.max_qp_wr = dattr.max_qp_wr;
  info.max_srq_wr = dattr.max_srq_wr;
  info.atomic_cap = dattr.atomic_cap;
  // The vendor ids the kernel's software devices report: rxe's 0xffffff, siw's "bmt".
  info.software = dattr.vendor_id == 0xffffff || dattr.vendor_id == 0x626d74;
  if (info.link_layer == IBV_LINK_LAYER_INFINIBAND && info.lid == 0)
    throw Error("verbs: " + where + " is active but has no LID");
  if (options.gid_index < 0) {
    info.gid_index = choose_gid(ctx, info.port, pattr, info.roce_v2);
    if (info.gid_index < 0) throw Error("verbs: " + where + " has no usable GID");
  } else {
    if (options.gid_index >= pattr.gid_tbl_len)
      throw Error("verbs: GID index " + std::to_string(options.gid_index) + " is beyond " + where +
                  "'s table of " + std::to_string(pattr.gid_tbl_len));
    info.gid_index = options.gid_index;
    ibv_gid_entry e{};
    if (int rc = ibv_query_gid_ex(ctx, info.port, static_cast<std::uint32_t>(info.gid_index), &e, 0))
      throw Error("ibv_query_gid_ex " + where + " GID index " + std::to_string(info.gid_index),
                  errno_of_rc(rc));
    info.roce_v2 = e.gid_type == IBV_GID_TYPE_ROCE_V2;
  }
  if (int rc = ibv_query_gid(ctx, info.port, info.gid_index, &info.gid))
    throw Error("ibv_query_gid " + where, errno_of_rc(rc));
  return info;
}

}  // namespace

PortInfo open_port(const VerbsOptions& options, DeviceOwner& device) {
  std::vector<PortChoice> choices;
  std::string why;
  if (!parse_net_devices(options.net_devices, choices, &why)) throw Error("verbs: " + why);
  int n = 0;
  DeviceListOwner list(ibv_get_device_list(&n));
  if (!list)
    throw Error(std::string("verbs: no RDMA device (ibv_get_device_list: ") + std::strerror(errno_of_null()) +
                ")");
  if (n == 0) throw Error("verbs: no RDMA device (ibv_get_device_list found none)");

  // Devices in the order the user named them, else in the order found.
  std::vector<ibv_device*> order(list.get(), list.get() + n);
  std::stable_sort(order.begin(), order.end(), [&](ibv_device* a, ibv_device* b) {
    return rank_of(choices, ibv_get_device_name(a)) < rank_of(choices, ibv_get_device_name(b));
  });
  std::string seen;  // what was looked at, for the error
  auto note = [&](const std::string& what) { seen += (seen.empty() ? "" : ", ") + what; };
  for (ibv_device* dev : order) {
    const std::string name = ibv_get_device_name(dev);
    if (!choices.empty() &&
        std::none_of(choices.begin(), choices.end(), [&](const PortChoice& c) { return c.device == name; }))
      continue;
    DeviceOwner ctx(ibv_open_device(dev));
    if (!ctx) {
      note(name + " (ibv_open_device: " + std::strerror(errno_of_null()) + ")");
      continue;
    }
    ibv_device_attr dattr{};
    if (int rc = ibv_query_device(ctx.get(), &dattr))
      throw Error("ibv_query_device " + name, errno_of_rc(rc));
    for (int p = 1; p <= dattr.phys_port_cnt; ++p) {
      if (!wanted(choices, name.c_str(), p)) continue;
      ibv_port_attr pattr{};
      if (int rc = ibv_query_port(ctx.get(), static_cast<std::uint8_t>(p), &pattr))
        throw Error("ibv_query_port " + name, errno_of_rc(rc));
      if (pattr.state != IBV_PORT_ACTIVE) {
        note(name + ":" + std::to_string(p) + " " + ibv_port_state_str(pattr.state));
        continue;
      }
      PortInfo info = port_info(ctx.get(), name, p, pattr, dattr, options);
      device = std::move(ctx);
      return info;
    }
  }
  if (seen.empty()) throw Error("verbs: no RDMA device matches '" + options.net_devices + "'");
  throw Error("verbs: no active port (" + seen + ")");
}

bool VerbsDomain::available(std::string* why, const std::string& net_devices) {
  try {
    DeviceOwner device;
    VerbsOptions o;
    o.net_devices = net_devices;
    (void)open_port(o, device);
    return true;
  } catch (const std::exception& e) {
    if (why != nullptr) *why = e.what();
    return false;
  }
}

}  // namespace ami::verbs
