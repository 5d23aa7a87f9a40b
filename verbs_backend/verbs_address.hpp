// verbs_backend/verbs_address.hpp — what one task publishes through the
// bootstrap so that its peers can connect their queue pairs to it.
//
// Little-endian, fixed fields then one (QPN, PSN) per lane, indexed
// [own context][peer task][peer context] (the own task's entries are zero).
// With rdma_cm the lanes are omitted: the connection manager carries QP
// numbers itself and the fixed part names the listening address instead.
// decode() treats the bytes as untrusted and names the first problem;
// whether they fit this task's job is VerbsDomain::connect()'s to judge.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "ami/status.hpp"

namespace ami::verbs {

enum class ConnectMethod : std::uint8_t { exchange = 1, rdma_cm = 2 };

struct LaneAddress {
  std::uint32_t qpn = 0;
  std::uint32_t psn = 0;
};

struct DomainAddress {
  static constexpr std::uint32_t kMagic = 0x31425641;  // "AVB1"
  static constexpr std::uint16_t kVersion = 1;
  static constexpr std::size_t kFixedBytes = 72;
  static constexpr std::size_t kLaneBytes = 8;

  ConnectMethod method = ConnectMethod::exchange;
  std::uint8_t link_layer = 0;  // IBV_LINK_LAYER_INFINIBAND or _ETHERNET
  std::uint8_t mtu = 0;         // enum ibv_mtu: the port's active MTU
  std::uint8_t rd_atomic = 0;   // RDMA READs the task answers at once per QP
  std::uint16_t lid = 0;
  std::uint16_t contexts = 0;
  std::uint32_t task = 0;
  std::uint32_t tasks = 0;
  std::uint32_t bounce_bytes = 0;  // the largest packet it receives
  std::array<std::uint8_t, 16> gid{};
  // rdma_cm: where it listens, and the token its connection requests carry.
  std::uint64_t nonce = 0;
  std::uint8_t ip_family = 0;  // 4 or 6; 0 without rdma_cm
  std::uint16_t cm_port = 0;
  std::array<std::uint8_t, 16> ip{};
  std::vector<LaneAddress> lanes;  // exchange only

  std::size_t lane_index(std::uint16_t context, std::uint32_t peer, std::uint16_t peer_context) const {
    return (std::size_t{context} * tasks + peer) * contexts + peer_context;
  }

  std::vector<std::byte> encode() const;
  static Status decode(std::span<const std::byte> bytes, DomainAddress& out);
};

}  // namespace ami::verbs
