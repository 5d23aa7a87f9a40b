// verbs_backend/verbs_port.hpp — finding the device and port to use
// (AMI_NET_DEVICES style "dev:port" list, or the first active port) and the
// GID to address it by. Setup only.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "verbs_domain.hpp"

namespace ami::verbs {

struct PortChoice {
  std::string device;
  int port = 0;  // 0: any active port of the device
};

// "rxe0:1,mlx5_0" -> {rxe0, 1}, {mlx5_0, any}; "" -> {}. False on a bad entry.
bool parse_net_devices(std::string_view spec, std::vector<PortChoice>& out, std::string* why);

// Opens the first active port the options allow and fills everything in
// PortInfo but max_inline; throws ami::Error saying what is missing.
PortInfo open_port(const VerbsOptions& options, DeviceOwner& device);

// "::ffff:10.55.0.1" style text of a GID.
std::string gid_text(const ibv_gid& gid);
// Is gid an IPv4-mapped IPv6 address (::ffff:a.b.c.d)?
bool gid_is_ipv4(const ibv_gid& gid);
// An IPv6 link-local GID (fe80::/10): no address rdma_cm can route to.
bool gid_is_link_local(const ibv_gid& gid);

const char* mtu_text(ibv_mtu mtu);

}  // namespace ami::verbs
